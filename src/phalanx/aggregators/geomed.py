"""Geometric median by the smoothed Weiszfeld algorithm (RFA)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import bad_rows, row_sqnorms
from phalanx.aggregators.base import Aggregator, RuleTags, as_compute_dtype, check_positive
from phalanx.aggregators.coordinatewise import coordinate_window_mean
from phalanx.aggregators.registry import register

# Rows of the test's differences taken at once: at most this many elements or one row, whichever is more (plus a
# float64 vector of length d), never n × d.
KUHN_CHUNK_ELEMENTS = 1 << 20
# Kuhn's test runs only when the iterate is this much nearer one row than the median distance of the rows not at the
# nearest one's distance: Weiszfeld heads for a median at a row, so an iterate as far from every row as the rows' own
# typical distance means none. The median, not the farthest row: one Byzantine row far away would open the gate every
# round (an attacker's review: the test then cost 1.5–3× the rule). Skipping the test never changes a result the test
# would have confirmed; it leaves the iterate where it stopped.
KUHN_GATE = 0.1


def kuhn_margin(rows: int, dtype: torch.dtype) -> float:
    """How far below ``η`` the norm of the summed unit vectors must be for the data-point median to be taken.

    Each unit vector is rounded to a few units of ``dtype``'s roundoff, so the sum of ``rows`` of them is off by at
    most ``rows`` times that: 8·rows·eps leaves a factor of two above it. Closer to ``η`` than that, rounding could
    decide, so the Weiszfeld iterate is kept.
    """
    return 8.0 * rows * torch.finfo(dtype).eps


def _scaled_differences(xr: Tensor, anchor: Tensor, lo: int, step: int) -> tuple[Tensor, Tensor, Tensor]:
    """Rows ``lo:lo + step`` of ``xr`` minus ``anchor``, each divided by its own largest ``|entry|``, the mask of
    the rows equal to ``anchor`` (exact: a largest ``|entry|`` of 0; those stay 0) and those largest entries.
    Scaled rows have norms in ``[1, √d]``, so their squares neither underflow (rows 10⁻³⁰ apart all counted equal
    to row 0) nor overflow (float32 rows near 10¹⁹ dropped from the sum) — both found by an attacker's review. A
    difference that overflows the dtype gives NaN, which fails every comparison: the Weiszfeld iterate stands."""
    diff = xr[lo:lo + step] - anchor
    top = diff.abs().amax(dim=1)
    same = top == 0
    return diff / torch.where(same, torch.ones_like(top), top)[:, None], same, top


def kuhn_data_point(xr: Tensor, k: int) -> tuple[float, int, Tensor, Tensor]:
    """Kuhn's test for row ``k`` of ``xr``: ``(‖Σ unit vectors from x_k to the other rows‖, η_k, coincident, Σ)``
    (``Σ`` in float64: the direction in which the other rows pull).

    ``coincident`` is the boolean mask of the rows equal to row ``k`` (its own included; exact equality of the
    differences). Works through the rows in chunks (:data:`KUHN_CHUNK_ELEMENTS`), on scaled differences
    (:func:`_scaled_differences`): a unit vector does not depend on its row's scale.
    """
    xr = xr.detach()  # a decision, not part of the output's graph
    m, d = xr.shape
    anchor = xr[k]
    total = torch.zeros(d, dtype=torch.float64, device=xr.device)
    coincident = torch.zeros(m, dtype=torch.bool, device=xr.device)
    step = max(1, KUHN_CHUNK_ELEMENTS // max(d, 1))
    for lo in range(0, m, step):
        scaled, same, _ = _scaled_differences(xr, anchor, lo, step)
        coincident[lo:lo + step] = same
        norms = row_sqnorms(scaled).to(torch.float64).sqrt()
        weights = torch.where(same, torch.zeros_like(norms), 1.0 / torch.where(same, torch.ones_like(norms), norms))
        total += (weights.to(scaled.dtype) @ scaled).to(torch.float64)
    return float(torch.linalg.vector_norm(total)), int(coincident.sum()), coincident, total


def curvature_along(xr: Tensor, k: int, direction: Tensor) -> tuple[float, float]:
    r"""``(H, r)``: the objective's second derivative at row ``k`` along the unit ``direction`` (float64),
    :math:`H = \sum_i (1 - \langle u_i, g\rangle^2)/\lVert x_i - x_k\rVert` over the rows not equal to row k
    (:math:`u_i` their unit vectors from it), and ``r`` the distance to the nearest of them; chunked and scaled like
    :func:`kuhn_data_point`. Rows on the line through row k along ``direction`` add 0: collinear rows give H = 0."""
    xr = xr.detach()
    m, d = xr.shape
    anchor = xr[k]
    step = max(1, KUHN_CHUNK_ELEMENTS // max(d, 1))
    curvature, nearest = 0.0, float("inf")
    for lo in range(0, m, step):
        scaled, same, top = _scaled_differences(xr, anchor, lo, step)
        keep = ~same
        if not bool(keep.any()):
            continue
        scaled = scaled.to(torch.float64)[keep]
        norms = torch.linalg.vector_norm(scaled, dim=1)
        cosine = (scaled @ direction) / norms
        distance = norms * top.to(torch.float64)[keep]
        curvature += float(((1.0 - cosine.square()).clamp_min(0.0) / distance).sum())
        nearest = min(nearest, float(distance.min()))
    return curvature, nearest


def kuhn_gate_open(distances: Tensor) -> bool:
    """Whether the iterate, at ``distances`` from the rows, is near enough one row for Kuhn's test
    (:data:`KUHN_GATE`): nearer than that fraction of the median distance of the rows not at the nearest one's
    distance (rows at it — coinciding with the nearest, or placed symmetrically — leave the gate open)."""
    nearest = float(distances.min())
    others = distances[distances > nearest * (1.0 + 1e-6)]
    return others.numel() == 0 or nearest <= KUHN_GATE * float(others.median())


KUHN_NEAR = 1e-3
"""At equality in Kuhn's condition (within the margin), row k is taken only if the median lies within this fraction of
the distance to the nearest other row (:func:`_at_the_row`)."""


def _at_the_row(xr: Tensor, k: int, excess: float, margin: float, towards: Tensor) -> bool:
    """At equality within ``margin`` (``excess`` = pull − η): whether the median is at row k up to rounding. Moving
    from x_k along the pull lowers the objective at rate ``excess`` at most (``excess + margin`` with rounding)
    against curvature ``H`` (:func:`curvature_along`), so the median lies within about ``(excess + margin)/H`` of
    x_k: taken if that is at most :data:`KUHN_NEAR` times the nearest other row's distance. Collinear rows (H = 0, a
    tie: n/2 rows at 0 and n/2 at 1) and near ties (two far rows symmetric about the bisector of two clusters: an
    attacker's review found the output following the worker order) keep the Weiszfeld iterate."""
    size = float(torch.linalg.vector_norm(towards))
    if not size > 0.0:
        return False
    curvature, nearest = curvature_along(xr, k, towards / size)
    return curvature > 0.0 and max(excess, 0.0) + margin <= KUHN_NEAR * curvature * nearest


@register
class GeometricMedian(Aggregator):
    r"""Geometric median, ``geomed``: :math:`\arg\min_z \sum_i \|z - x_i\|`, by smoothed Weiszfeld iterations.

    Each iteration (Pillutla, Kakade & Harchaoui, "Robust aggregation for federated learning", IEEE TSP 2022,
    Algorithm 3, smoothed Weiszfeld; Weiszfeld 1937):

    .. math:: \beta_i = \frac{1}{\max(\nu, \|z - x_i\|)}, \qquad z \leftarrow \frac{\sum_i \beta_i x_i}{\sum_i \beta_i}

    run until the objective :math:`\sum_i \|z - x_i\|` improves by less than ``tol`` (relative) or ``max_iter``
    iterations — not a fixed 3 iterations (ByzFL's default, which is not converged). ``nu`` is the smoothing that
    keeps a point that coincides with an input finite. The start is the coordinate-wise median, which is robust
    (the mean would start from wherever a Byzantine row pulled it).

    **Medians at an input (Phalanx's addition, not in RFA).** Weiszfeld converges only sublinearly to a median that
    sits on an input row — the case of duplicated rows, e.g. f colluders sending one vector — and the stopping rule
    then halts it short of the point (1e-2 off on small integer inputs in float32). After the iterations the input
    row :math:`x_k` nearest the iterate is tested with Kuhn's exact optimality condition (Kuhn, "A note on Fermat's
    problem", Math. Programming 1973; Vardi & Zhang, PNAS 2000, Eq. 2.3): with :math:`\eta_k` the number of rows equal
    to :math:`x_k`,

    .. math:: x_k \text{ is a geometric median} \iff
        \Big\|\sum_{i:\,x_i \ne x_k} \frac{x_i - x_k}{\|x_i - x_k\|}\Big\| \le \eta_k ,

    When it holds with a margin for rounding (:func:`kuhn_margin`) the output is exactly :math:`x_k`, the unique
    median. Within the margin of equality :math:`x_k` is taken only if the objective's curvature along the pull puts
    the median within :data:`KUHN_NEAR` of the nearest other row's distance from :math:`x_k` (:func:`_at_the_row`):
    a median at the row up to rounding. Collinear rows at equality are a tie (curvature 0) — n/2 rows at 0 and n/2 at
    1, where every point between is a median — and the Weiszfeld iterate stands. The test runs when the iterate is
    near a row (:func:`kuhn_gate_open`); it costs a few passes over the rows, in bounded chunks.

    Bad rows (non-finite squared norm) are infinitely far from every z, so their Weiszfeld weight is 0 — the limit
    of the formula; they never enter the weighted sum. Requirement n > 2f (breakdown point 1/2).

    ε = 1 (Yang, Shi & Li, ICML 2025, tight: n/2 points at 0 and n/2 at 1); κ = 4(1 + f/(n−2f))² (Allouah et al.,
    AISTATS 2023, Table 1). Contributions: the final normalised Weiszfeld weights βᵢ/Σβ (the output is exactly
    that convex combination of the inputs).
    """

    subnormals_as_zero = True  # subnormal arithmetic made it tens of times slower on a CPU: flush to zero (_subnormals)
    name: ClassVar[str] = "geomed"
    floor = "passes"
    reference: ClassVar[str] = (
        "Pillutla, Kakade & Harchaoui, Robust aggregation for federated learning, IEEE TSP 2022 (RFA, smoothed "
        "Weiszfeld, Algorithm 3)"
    )
    requirement = "n > 2f"
    # Weiszfeld converges sublinearly when the median sits on an input point: even with a tight stopping tolerance
    # the symmetries hold to 1e-3, not to rounding.
    tags = RuleTags(tol=1e-3, check_params={"tol": 1e-10, "max_iter": 2000})
    epsilon_source = ("Yang, Shi & Li, ICML 2025, Table 2 (Section 3.5: an upper bound for every n, tight at even n "
                      "with n/2 rows at 0 and n/2 at 1, where every point between is a geometric median)")
    kappa_source = "Allouah, Farhadkhani, Guerraoui, Gupta, Pinot & Stephan, Fixing by Mixing, AISTATS 2023, Table 1"

    def __init__(self, f: int = 0, tol: float = 1e-6, max_iter: int = 200, nu: float = 1e-6) -> None:
        super().__init__(f)
        self.tol = float(check_positive("tol", tol))
        self.max_iter = check_positive("max_iter", max_iter, integer=True)
        self.nu = float(check_positive("nu", nu))

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        xc = as_compute_dtype(x)
        n = xc.shape[0]
        sq = row_sqnorms(xc)
        good = ~bad_rows(sq)
        beta = torch.zeros(n, dtype=torch.float64, device=x.device)
        if not bool(good.any()):  # more than f bad rows: no guarantee; return the (NaN-safe) median
            out, _ = coordinate_window_mean(xc, "median", 0, False)
            return out.to(x.dtype), beta
        xg = xc[good] if not bool(good.all()) else xc
        # Work relative to the start (the coordinate-wise median): distances computed from ‖xᵢ − m‖² − 2⟨xᵢ − m, u⟩
        # + ‖u‖² then suffer no cancellation from a large common offset of the inputs.
        start, _ = coordinate_window_mean(xg, "median", 0, False)
        xr = xg - start
        sqr = row_sqnorms(xr).to(torch.float64)
        u = torch.zeros_like(start)
        prev = None
        dist = sqr.sqrt()
        wg = torch.full((xg.shape[0],), 1.0 / xg.shape[0], dtype=torch.float64, device=x.device)
        for _ in range(self.max_iter):
            dots = (xr @ u).to(torch.float64)
            uu = float(torch.dot(u, u).detach())
            dist = (sqr - 2.0 * dots + uu).clamp_min(0.0).sqrt()
            objective = float(dist.detach().sum())
            if prev is not None and prev - objective <= self.tol * max(objective, 1e-30):
                break
            prev = objective
            w = 1.0 / dist.clamp_min(self.nu)
            wg = w / w.sum()
            u = wg.to(xr.dtype) @ xr  # xr holds good rows only
        # dist: the distances of the last iterate tested (the one before u when max_iter ran out)
        last = dist.detach()
        nearest = int(torch.argmin(last))
        if kuhn_gate_open(last):
            pull, eta, coincident, towards = kuhn_data_point(xr, nearest)
            margin = kuhn_margin(xr.shape[0], xr.dtype)
            if pull <= eta - margin or (pull <= eta + margin and _at_the_row(xr, nearest, pull - eta, margin, towards)):
                shares = coincident.to(torch.float64) / eta
                beta[good] = shares
                out = xg[nearest]
                if out.requires_grad:  # x_k + Σ sᵢ(xᵢ − x_k): the same value (those differences are 0), and the
                    # gradient follows the shares, 1/η on each row equal to x_k (not all on the first of them)
                    out = out + (shares.to(xg.dtype)[:, None] * (xg - out)).sum(dim=0)
                return out.to(x.dtype), beta
        z = start + u
        beta[good] = wg
        return z.to(x.dtype), beta

    def epsilon(self, n: int) -> float | None:
        return 1.0 if n >= self.min_workers() else None  # (undefined below it, as κ is)

    def kappa(self, n: int) -> float | None:
        if n <= 2 * self.f:
            return None
        return 4.0 * (1.0 + self.f / (n - 2 * self.f)) ** 2
