"""SignGuard: norm filtering and sign-statistics clustering (Xu, Huang, Song & Lan, ICDCS 2022)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from phalanx.aggregators._rowops import clipped_mean, float64_row_norms, median_norm, row_sqnorm_estimates
from phalanx.aggregators.base import (
    Aggregator,
    RuleTags,
    as_compute_dtype,
    check_positive,
    check_probability,
    random_source,
)
from phalanx.aggregators.registry import register
from phalanx.errors import ConfigError

__all__ = ["SignGuard", "mean_shift_labels", "norm_filter", "sign_features"]

MARGIN = 1e-9
"""Relative margin (on squared norms) within which a row's bound comparison is settled by its exact norm: far
above the float64 rounding of ``sqrt`` and of the bound itself (a few ``u₆₄`` ≈ 1e-16)."""


class _Exact:
    """The float64 norms of :func:`~phalanx.aggregators._rowops.float64_row_norms`, computed on demand, row by row
    subset, and remembered (``known`` marks the rows computed so far). The decisions are taken on NumPy copies of
    the ``n`` estimates (a few microseconds each, where a torch op on ``n`` numbers costs several); the norms stay a
    torch tensor, so the gradient through the clipping factors is the float64 norms' one."""

    def __init__(self, x: Tensor, largest: Tensor | None, hi: np.ndarray) -> None:
        self.x = x
        self.largest = largest
        """Each row's largest float64 square from the estimates' pass (saves :func:`float64_row_norms` a pass)."""
        self.norms = torch.zeros(x.shape[0], dtype=torch.float64)
        self.known = np.zeros(x.shape[0], dtype=bool)
        self.hi = hi
        """Upper ends of the squared-norm intervals (set by :func:`norm_filter`)."""

    def need(self, rows: np.ndarray) -> None:
        idx = np.flatnonzero(rows & ~self.known)
        if idx.size:
            taken = torch.from_numpy(idx)
            vals = float64_row_norms(
                self.x, torch.zeros(idx.size, dtype=torch.bool, device=self.x.device), rows=taken,
                max_squares=None if self.largest is None else self.largest[taken],
            ).cpu()
            # out of place: earlier decisions (and autograd) keep the tensors they used
            self.norms = self.norms.index_put((taken,), vals)
            self.known[idx] = True

    def clip_norms(self, kept: Tensor, med: Tensor) -> Tensor:
        """Norms for :func:`~phalanx.aggregators._rowops.clipped_mean`: exact on every kept row that may exceed
        ``med`` (its clipping factor ``med/‖gᵢ‖`` needs it), 0 on rows known to be at most ``med`` or not kept
        (factor 1, or a zero share)."""
        m2 = float(med.detach()) ** 2
        self.need(kept.cpu().numpy() & ~(self.hi < m2 * (1 - MARGIN)))
        return torch.where(torch.from_numpy(self.known), self.norms, torch.zeros_like(self.norms))


def norm_filter(x: Tensor, lower: float, upper: float) -> tuple[Tensor, Tensor, Tensor, _Exact]:
    r"""SignGuard's norm decisions from one streaming pass, exactly as the float64 norms would take them.

    :func:`~phalanx.aggregators._rowops.row_sqnorm_estimates` gives every squared norm :math:`S_i` within
    :math:`[\ell_i, h_i] = [\hat S_i(1-2\delta) - \eta,\ \hat S_i(1+2\delta) + \eta]` (Higham 2002, §4.2). A
    row's exact float64 norm (:func:`~phalanx.aggregators._rowops.float64_row_norms`) is computed only where an
    interval leaves a decision open:

    * the median rank(s) :math:`k`: rows whose interval meets :math:`[L_k, H_k]`, the :math:`k`-th smallest lower
      and upper ends (rows surely below or above keep their place, so the :math:`k`-th smallest of the exact
      values is taken among these rows, as in :func:`~phalanx.aggregators._rowops.smallest_norms_keys`);
    * the bounds :math:`L M` and :math:`R M`: rows whose interval meets :math:`[(cM)^2(1-\epsilon), (cM)^2
      (1+\epsilon)]` (``MARGIN`` = ε);
    * the clipping (:meth:`clip_norms`): kept rows not surely at most :math:`M`.

    Returns ``(median M, bad, S₁, exact)``. When bad rows reach a median rank (:math:`M = +\infty`) every norm is
    taken in float64 in one call, as the float64 path does. An attacker who places rows in the uncertain bands pays
    for their exact norms: at most the cost of computing every norm in float64.
    """
    n = x.shape[0]
    largest = torch.empty(n, dtype=torch.float64)
    est_t, bad_t, delta, eta = row_sqnorm_estimates(x, largest)
    # decisions only: no gradient flows through the estimates
    bad_t = bad_t.cpu()
    est, bad = est_t.detach().cpu().numpy(), bad_t.numpy()
    lo = np.where(bad, est, est * (1.0 - 2.0 * delta) - eta)
    hi = np.where(bad, est, est * (1.0 + 2.0 * delta) + eta)
    exact = _Exact(x, largest, hi)
    ranks = [(n + 1) // 2] if n % 2 else [n // 2, n // 2 + 1]
    cuts = [(k, np.partition(lo, k - 1)[k - 1], np.partition(hi, k - 1)[k - 1]) for k in ranks]
    if not all(np.isfinite(high_cut) for _, _, high_cut in cuts):  # bad rows reach the median: M = +inf
        exact.need(np.ones(n, dtype=bool))
        exact.norms = torch.where(bad_t, torch.full_like(exact.norms, float("inf")), exact.norms)
        med = median_norm(exact.norms, bad_t)
        return med, bad_t, ~bad_t & (exact.norms >= lower * med) & (exact.norms <= upper * med), exact
    exact.need(np.logical_or.reduce([~bad & ~(hi < low) & ~(lo > high) for _, low, high in cuts]))
    known = torch.from_numpy(exact.known)
    values = []
    for k, low_cut, _ in cuts:
        keys = torch.where(known, exact.norms, torch.from_numpy(np.where(~bad & (hi < low_cut), -np.inf, np.inf)))
        values.append(torch.kthvalue(keys, k).values)
    med = values[0] if n % 2 else 0.5 * (values[0] + values[1])
    bounds = [float((c * med).detach()) ** 2 for c in (lower, upper)]
    exact.need(np.logical_or.reduce([~bad & (lo <= b2 * (1 + MARGIN)) & (hi >= b2 * (1 - MARGIN)) for b2 in bounds]))
    surely_in = (lo > bounds[0] * (1 + MARGIN)) & (hi < bounds[1] * (1 - MARGIN))
    norms, m = exact.norms.detach().numpy(), float(med.detach())
    s1 = ~bad & np.where(exact.known, (norms >= lower * m) & (norms <= upper * m), surely_in)
    return med, bad_t, torch.from_numpy(s1), exact


def sign_features(sub: Tensor) -> Tensor:
    """Fractions of positive, zero and negative entries of each row of ``sub`` (``(n, k)``), float64 ``(n, 3)``.

    Computed from ``s = sign(sub)``: ``Σ s`` = #pos − #neg and ``Σ |s|`` = #pos + #neg (two streaming sums, much
    faster on a CPU than counting three boolean masks). A NaN entry counts as zero.
    """
    k = sub.shape[1]
    s = torch.nan_to_num(torch.sign(sub), nan=0.0)
    acc = torch.float32 if k < 2**24 else torch.float64  # integer counts stay exact
    diff = s.sum(dim=1, dtype=acc).to(torch.float64)
    nonzero = s.abs().sum(dim=1, dtype=acc).to(torch.float64)
    pos = 0.5 * (nonzero + diff)
    neg = 0.5 * (nonzero - diff)
    return torch.stack([pos, k - nonzero, neg], dim=1) / k


def mean_shift_labels(points: Tensor, quantile: float = 0.5, max_iter: int = 300) -> Tensor:
    """Flat-kernel mean-shift clustering of a few low-dimensional points; labels ``(n,)``, ``-1`` for outliers.

    A small deterministic re-implementation of the procedure SignGuard's authors run with scikit-learn
    (``estimate_bandwidth(quantile=0.5)`` then ``MeanShift(cluster_all=False)``), in torch on ``(n, k)`` points:

    * bandwidth ``h``: the mean over points of the distance to their ``⌊quantile·n⌋``-th nearest point (the point
      itself counted first);
    * every point is a seed (no binning); all seeds move together to the mean of the points within distance ``h``
      until no seed moves more than ``10⁻³·h`` (at most ``max_iter`` steps);
    * the converged centres are ranked by the number of points within ``h`` (then by their coordinates, larger
      first) and a centre within ``h`` of a better-ranked one is dropped;
    * each point gets the label of its nearest remaining centre (0 = best ranked), or ``-1`` when that centre is
      farther than ``h``.
    """
    p = points.detach().to(device="cpu", dtype=torch.float64)
    n = p.shape[0]
    dist = torch.cdist(p, p)
    kth = max(1, int(n * quantile))
    h = float(dist.sort(dim=1).values[:, kth - 1].mean())
    centres = p.clone()
    for _ in range(max_iter):
        within = (torch.cdist(centres, p) <= h).to(torch.float64)
        count = within.sum(dim=1, keepdim=True)
        moved = torch.where(count > 0, (within @ p) / count.clamp_min(1.0), centres)
        shift = float((moved - centres).norm(dim=1).max())
        centres = moved
        if shift <= 1e-3 * h:
            break
    intensity = (torch.cdist(centres, p) <= h).sum(dim=1)
    order = sorted(range(n), key=lambda i: (int(intensity[i]), tuple(centres[i].tolist())), reverse=True)
    cdist_c = torch.cdist(centres, centres)
    unique = [True] * n
    kept: list[int] = []
    for i in order:
        if not unique[i]:
            continue
        kept.append(i)
        for j in (cdist_c[i] <= h).nonzero().flatten().tolist():
            unique[j] = False
    best = centres[kept]
    to_centre = torch.cdist(p, best)
    nearest = to_centre.min(dim=1)
    return torch.where(nearest.values <= h, nearest.indices, torch.full_like(nearest.indices, -1))


@register
class SignGuard(Aggregator):
    r"""SignGuard: keep the rows that pass a norm filter *and* fall in the main cluster of sign statistics.

    Xu, Huang, Song & Lan, "SignGuard: Byzantine-robust federated learning through collaborative malicious
    gradient filtering", ICDCS 2022 (arXiv 2109.05872), Algorithm 1. With :math:`M = \mathrm{median}_i \lVert
    g_i\rVert`:

    1. norm filter: :math:`S_1 = \{i : L \le \lVert g_i\rVert / M \le R\}` (defaults ``lower`` = L = 0.1,
       ``upper`` = R = 3.0, as in the paper);
    2. sign filter: on a random subset of ``⌊subsample·d⌋`` coordinates (default 10%, as in the paper), the
       features of each row are the fractions of positive, zero and negative entries; the rows are clustered
       and :math:`S_2` is the largest cluster;
    3. output: :math:`\frac{1}{|S|} \sum_{i \in S} g_i \min\big(1, M / \lVert g_i\rVert\big)` with
       :math:`S = S_1 \cap S_2` (each kept gradient clipped to the median norm).

    Clustering: the paper uses MeanShift (scikit-learn). We run a small deterministic, dependency-free flat-kernel
    mean shift (:func:`mean_shift_labels`) that follows the authors' scikit-learn settings (bandwidth from the
    0.5-quantile of nearest-neighbour distances, outliers left unlabelled), with every point as a seed instead of
    binned seeds. Unlike 2-means, it does not split an attack-free population in two. Features are the raw
    fractions (the authors' code divides each feature by its maximum over the rows, which blows up tiny
    differences in the rarely non-zero "zero" fraction; we do not). The coordinates are drawn without replacement
    by a CPU ``torch.Generator`` seeded with ``seed`` (the authors' code takes a contiguous block at a random
    offset), or from the ``generator=`` a caller passes per call (a training run passes its server's stream); with
    ``subsample=1.0`` all coordinates are used and nothing is drawn. The median is the usual one
    (mean of the two middle norms when ``n`` is even).

    The price with no attack: as in the authors' implementation, rows left unlabelled by the mean shift (farther
    than the bandwidth from every cluster centre) are dropped, so on honest, noisy gradients SignGuard typically
    averages only half to two thirds of the rows.

    Ties: every decision is the one the norms summed in float64 from the input values take (exact squares for
    float16/32 inputs), so a float32 and a float64 copy of the same input keep the same rows, also when a norm
    meets a bound with equality in exact arithmetic (such a row is kept or dropped by float64 rounding, the same
    for every input dtype). Cost: one streaming pass bounds every norm (:func:`norm_filter`); the float64 norm is
    taken only on the rows whose interval leaves a decision open and on the kept rows that are clipped, so output,
    contributions and gradient are bit-identical to taking every norm in float64
    (``tests/test_signguard.py::test_one_pass_norm_filter_matches_float64_norms``).

    Robustness conventions (ours): bad rows (NaN/Inf or an overflowing norm) count as +inf in the median and
    never pass the norm filter. If :math:`S_1 \cap S_2` is empty the rule falls back to :math:`S_1` (which
    contains the median-norm row whenever fewer than half of the rows are bad); if that is empty too, the output
    is the zero vector and every contribution is 0. ``f`` is not used by the rule; the requirement ``n > 2f``
    states the honest majority the median and the largest cluster rely on.

    Contributions: ``1/|S|`` on each kept row (the output is an average of the kept rows, each possibly scaled
    down). ε and κ: not given in Yang, Shi & Li (ICML 2025) or Allouah et al. (AISTATS 2023); ``None``.
    """

    name: ClassVar[str] = "signguard"
    pairwise_matrices = 5
    reference: ClassVar[str] = (
        "J. Xu, S.-L. Huang, L. Song, T. Lan, 'SignGuard: Byzantine-robust federated learning through "
        "collaborative malicious gradient filtering', ICDCS 2022 (arXiv 2109.05872), Algorithm 1"
    )
    requirement = "n > 2f (honest majority; f itself is not used by the rule)"
    context_keys = frozenset({"generator"})
    tags = RuleTags(permutation=False, translation=False, scale=False)

    def __init__(
        self, f: int = 0, lower: float = 0.1, upper: float = 3.0, subsample: float = 0.1, seed: int = 0,
    ) -> None:
        super().__init__(f)
        self.lower = check_probability("lower", lower, open_low=False)
        upper = check_positive("upper", upper)
        if upper < 1:
            raise ConfigError("upper", upper, "a finite number >= 1 (the median-norm row must pass the filter)")
        self.upper = float(upper)
        self.subsample = check_probability("subsample", subsample)
        self.seed = int(check_positive("seed", seed, integer=True, allow_zero=True))
        self._generator = torch.Generator().manual_seed(self.seed)

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        d = x.shape[1]
        xc = as_compute_dtype(x)
        med, bad, s1, exact = norm_filter(xc, self.lower, self.upper)
        bad, s1 = bad.to(x.device), s1.to(x.device)
        k = max(1, int(self.subsample * d))
        if k < d:
            idx = torch.randperm(d, generator=random_source(context, self._generator))[:k].sort().values.to(x.device)
            sub = xc.index_select(1, idx)
        else:
            sub = xc
        labels = mean_shift_labels(sign_features(sub)).to(x.device)
        sizes = torch.bincount(labels[labels >= 0], minlength=1)
        s2 = labels == int(torch.argmax(sizes))
        kept = s1 & s2
        if not bool(kept.any()):
            kept = s1
        norms = exact.clip_norms(kept, med).to(x.device)
        out, share = clipped_mean(xc, kept, norms, bad, med)
        return out.to(x.dtype), (share if want_contributions else None)
