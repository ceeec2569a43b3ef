"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017): select the row(s) closest to their nearest neighbours."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import pairwise_sqdist
from phalanx.aggregators._rowops import weighted_sum
from phalanx.aggregators.base import Aggregator, as_compute_dtype, check_positive
from phalanx.aggregators.registry import register
from phalanx.errors import ConfigError

__all__ = ["Krum", "MultiKrum", "krum_order", "krum_scores"]

_REFERENCE = (
    "P. Blanchard, E. M. El Mhamdi, R. Guerraoui, J. Stainer, 'Machine Learning with Adversaries: Byzantine "
    "Tolerant Gradient Descent', NeurIPS 2017"
)


def krum_scores(sqdist: Tensor, neighbours: int) -> Tensor:
    """Krum scores of the rows behind a squared-distance matrix, an ``(r,)`` float64 tensor on the CPU.

    ``score(i) = Σ_{j ∈ N(i)} ‖xᵢ − xⱼ‖²`` where ``N(i)`` holds the ``neighbours`` rows nearest to row ``i`` (itself
    excluded); Krum uses ``neighbours = r − f − 2`` (Blanchard et al., NeurIPS 2017, Section 4). With
    ``neighbours = 0`` every row scores 0. A *bad row* (infinite diagonal entry, as
    :func:`~phalanx.aggregators._numerics.pairwise_sqdist` marks it) always scores ``+inf``, and so does a row whose
    nearest ``neighbours`` rows include a bad one.

    ``sqdist`` is an ``(r, r)`` matrix of squared distances, typically a sub-matrix of one
    :func:`~phalanx.aggregators._numerics.pairwise_sqdist` result; ``0 <= neighbours <= r − 1``.
    """
    d = sqdist.detach().to(device="cpu", dtype=torch.float64)
    r = d.shape[0]
    if not 0 <= neighbours <= r - 1:
        raise ValueError(f"neighbours must be in [0, {r - 1}], got {neighbours}")
    bad = ~torch.isfinite(d.diagonal())
    if neighbours == 0:
        scores = torch.zeros(r, dtype=torch.float64)
    else:
        off = d.clone()
        off.fill_diagonal_(float("inf"))
        scores = torch.topk(off, neighbours, dim=1, largest=False, sorted=True).values.sum(dim=1)
    scores[bad] = float("inf")
    return scores


def krum_order(scores: Tensor, sqdist: Tensor) -> Tensor:
    """Row indices by increasing Krum score; exact ties broken by the total distance to all rows, then by index.

    Exact ties are not rare: with one neighbour the two rows of the closest pair always tie. Breaking them by
    index would make the choice depend on the order of the workers; the total distance to every row is a
    property of the data, so the order is permutation-invariant except for rows that tie on both keys.
    """
    d = sqdist.detach().to(device="cpu", dtype=torch.float64)
    total = torch.where(torch.isfinite(d), d, torch.zeros((), dtype=torch.float64)).sum(dim=1)
    by_total = torch.sort(total, stable=True).indices
    return by_total[torch.sort(scores[by_total], stable=True).indices]


@register
class Krum(Aggregator):
    r"""Krum: output the input row whose ``n − f − 2`` nearest neighbours are closest to it.

    .. math::
        \mathrm{score}(i) = \sum_{j \in N_i} \lVert x_i - x_j \rVert^2, \qquad
        \mathrm{Krum}(x) = x_{i^\star},\quad i^\star = \arg\min_i \mathrm{score}(i),

    where :math:`N_i` is the set of the :math:`n - f - 2` rows nearest to :math:`x_i` (:math:`x_i` excluded).
    Exact ties go to the row with the smaller total distance to all rows (see :func:`krum_order`).
    Requires :math:`n > 2f + 2` (Blanchard et al., NeurIPS 2017, Section 4, the
    definition of the Krum function and Proposition 1).

    This follows the paper's ``n − f − 2`` neighbours (ByzFL 0.0.11 uses ``n − f − 1``). All pairwise distances
    come from one Gram matrix. A bad row (NaN, ±Inf, or a norm that overflows) has an infinite score and is never
    chosen while at most ``f`` bad rows are present. Contributions: 1 on the chosen row, 0 elsewhere.

    κ = 6(1 + f/(n−2f)) (Allouah et al., AISTATS 2023, "Fixing by Mixing", Table 1). ε (Yang, Shi & Li, ICML 2025)
    is not given for Krum: ``None``.
    """

    subnormals_as_zero = True  # subnormal arithmetic made it tens of times slower on a CPU: flush to zero (_subnormals)
    name: ClassVar[str] = "krum"
    floor = "gemm"
    pairwise_matrices = 5
    reference: ClassVar[str] = _REFERENCE + ", Section 4 (the Krum function, Proposition 1)"
    requirement = "n > 2f + 2"
    kappa_source = "Allouah, Farhadkhani, Guerraoui, Gupta, Pinot & Stephan, Fixing by Mixing, AISTATS 2023, Table 1"

    def min_workers(self) -> int:
        return 2 * self.f + 3

    def kappa(self, n: int) -> float | None:
        """Table 1's κ = 6(1 + f/(n − 2f)), stated for n > 2f; None below :meth:`min_workers` too, where the rule
        itself refuses to run (a coefficient of a rule that cannot be called would mislead a table)."""
        if n < self.min_workers():
            return None
        return 6.0 * (1.0 + self.f / (n - 2 * self.f))

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n = x.shape[0]
        dist = pairwise_sqdist(as_compute_dtype(x))
        scores = krum_scores(dist, n - self.f - 2)
        best = int(krum_order(scores, dist)[0])
        out = x[best].clone()
        contrib = None
        if want_contributions:
            contrib = torch.zeros(n, dtype=torch.float64, device=x.device)
            contrib[best] = 1.0
        return out, contrib


@register
class MultiKrum(Aggregator):
    r"""Multi-Krum: the average of the ``m`` rows with the smallest Krum scores.

    .. math::
        \mathrm{MultiKrum}_m(x) = \frac{1}{m} \sum_{i \in S_m} x_i,

    where :math:`S_m` holds the :math:`m` rows with the smallest scores
    :math:`\mathrm{score}(i) = \sum_{j \in N_i} \lVert x_i - x_j \rVert^2` (:math:`N_i`: the :math:`n - f - 2`
    rows nearest to :math:`x_i`, itself excluded); ties are broken as in :func:`krum_order`. ``m = 1`` is Krum,
    ``m = n`` the mean; the default is ``m = n − f``. Requires :math:`n > 2f + 2` and :math:`1 \le m \le n`
    (Blanchard et al., NeurIPS 2017: the Krum function of Section 4 and its Multi-Krum variant of Section 5).

    A bad row has an infinite score and is never selected: if fewer than ``m`` rows have a finite score (possible
    only with ``m > n − f`` or with more than ``f`` bad rows), the finite-score rows are averaged instead, so at
    most ``f`` bad rows always give a finite output. Contributions: ``1/|S|`` on each selected row.

    ``strict=False`` lifts the requirement to what the score needs, one neighbour (:math:`n \ge f + 3`): Blanchard
    et al.'s guarantee is then void, but the rule still runs — as in ByzFL and in the price-of-robustness
    experiments of Yang, Shi & Li (ICML 2025, Table 3), which configure Multi-Krum for f = 0 … 7 at n = 16.

    κ and ε: not verified for Multi-Krum in Allouah et al. (AISTATS 2023) or Yang, Shi & Li (ICML 2025): ``None``.
    """

    subnormals_as_zero = True  # subnormal arithmetic made it tens of times slower on a CPU: flush to zero (_subnormals)
    name: ClassVar[str] = "multikrum"
    floor = "gemm"
    pairwise_matrices = 5
    reference: ClassVar[str] = _REFERENCE + ", Section 4 (Krum) and Section 5 (the Multi-Krum variant)"

    def __init__(self, f: int = 0, m: int | None = None, strict: bool = True) -> None:
        super().__init__(f=f)
        if m is not None:
            check_positive("m", m, integer=True)
        if not isinstance(strict, bool):
            raise ConfigError("strict", strict, "true or false")
        self.m = m
        self.strict = strict
        self.requirement = (
            "n > 2f + 2 and 1 <= m <= n (default m = n - f)" if strict
            else "n >= f + 3 and 1 <= m <= n (strict=false: no guarantee beyond n > 2f + 2)"
        )

    def min_workers(self) -> int:
        return max(2 * self.f + 3 if self.strict else self.f + 3, self.m or 1)

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n = x.shape[0]
        m = n - self.f if self.m is None else self.m
        if m > n:  # pragma: no cover - min_workers already guarantees n >= m
            raise ConfigError("m", m, f"1 <= m <= n = {n}")
        xc = as_compute_dtype(x)
        dist = pairwise_sqdist(xc)
        scores = krum_scores(dist, n - self.f - 2)
        order = krum_order(scores, dist)[:m]
        finite = order[torch.isfinite(scores[order])]
        chosen = finite if finite.numel() > 0 else order
        weights = torch.zeros(n, dtype=torch.float64)
        weights[chosen] = 1.0 / chosen.numel()
        weights = weights.to(x.device)
        out = weighted_sum(weights, xc, ~torch.isfinite(dist.diagonal()))
        return out.to(x.dtype), (weights if want_contributions else None)
