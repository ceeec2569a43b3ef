"""Divide-and-conquer (DnC): spectral outlier filtering on random coordinate subsets (Shejwalkar & Houmansadr)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import selection_weights
from phalanx.aggregators._rowops import row_norms, weighted_sum
from phalanx.aggregators.base import Aggregator, as_compute_dtype, check_positive, random_source
from phalanx.aggregators.registry import register

__all__ = ["DnC"]


def dnc_scores(sub: Tensor, bad: Tensor) -> Tensor:
    """DnC outlier scores ``sᵢ = ((xᵢ − μ) · v)²`` of the rows of ``sub`` (``(n, b)``), float64 ``(n,)``.

    ``μ`` is the mean of the good rows and ``v`` the top right singular vector of the centred good rows. It is
    computed from the ``(n, n)`` Gram matrix ``C Cᵀ = U Σ² Uᵀ`` of the centred matrix ``C``: since ``C v = σ₁ u₁``,
    ``sᵢ = λ₁ · u₁ᵢ²`` with ``(λ₁, u₁)`` the top eigenpair of the Gram matrix (float64). ``C`` is first divided by
    its largest absolute entry (scores are only compared, so this changes nothing but avoids overflow); the scores
    are therefore those of the paper up to one common positive factor. Bad rows get ``+inf``.
    """
    c = sub.to(torch.float64)
    good = ~bad
    if bool(bad.any()):
        c = torch.where(good[:, None], c, torch.zeros((), dtype=c.dtype, device=c.device))
    n_good = int(good.sum())
    mu = c.sum(dim=0) / max(n_good, 1)
    c = c - mu
    if bool(bad.any()):
        c = torch.where(good[:, None], c, torch.zeros((), dtype=c.dtype, device=c.device))
    # Only the ranking of the scores matters: normalise so that the Gram matrix cannot overflow.
    scale = c.abs().max()
    if float(scale.detach()) > 0.0:
        c = c / scale
    gram = c @ c.T
    gram = 0.5 * (gram + gram.T)
    evals, evecs = torch.linalg.eigh(gram)
    lam = evals[-1].clamp_min(0.0)
    scores = lam * evecs[:, -1].square()
    return torch.where(bad, torch.full_like(scores, float("inf")), scores)


@register
class DnC(Aggregator):
    r"""Divide-and-conquer (DnC): drop the rows that stick out along the top singular direction, average the rest.

    Shejwalkar & Houmansadr, "Manipulating the Byzantine: optimizing model poisoning attacks and defenses for
    federated learning", NDSS 2021, Algorithm 3. For each of ``iterations`` rounds: draw ``b`` coordinates at
    random (without replacement), take the sub-vectors :math:`x_i^{(r)}`, their mean :math:`\mu`, and the top right
    singular vector :math:`v` of the centred ``(n, b)`` matrix; score each row by

    .. math:: s_i = \big((x_i^{(r)} - \mu) \cdot v\big)^2,

    and keep the :math:`n - \lceil c f\rceil` rows with the lowest scores (the paper writes :math:`n - c\,m`; a
    fractional product is rounded up, i.e. the paper's code keeps ``int(n - c·f)``). The good set is the
    intersection of the kept sets over the rounds; the output is the plain mean of the good rows.

    Parameters: ``iterations`` (the paper's ``niters``, default 1), ``subsample`` (the paper's ``b``, default
    10,000, the default of Blades' ``Dnc``; it is capped at ``d``, and with ``b ≥ d`` all coordinates are used
    and nothing is drawn), ``c`` (filtering fraction, default 1.0) and ``seed`` (a CPU
    ``torch.Generator`` owned by the object draws the coordinates, so a sequence of calls is reproducible from
    the seed; the draws do not depend on the order of the rows). A caller may pass ``generator=`` per call to draw
    from its own stream instead (a training run passes its server's stream, held by its checkpoints).

    Robustness conventions (ours): bad rows (NaN/Inf or an overflowing norm) get score ``+inf`` so they are
    removed first; the mean ``μ`` and the singular vector are computed on the good rows only (the paper uses all
    rows, which a single NaN would destroy). If the intersection over rounds is empty, the good set is the
    ``n − ⌈c f⌉`` rows kept in the most rounds (ties: the lower total score rank over the rounds), so the output
    never averages more rows than one round keeps.

    Contributions: ``1/|good|`` on each row of the good set. ε and κ: not given in Yang, Shi & Li (ICML 2025) or
    Allouah et al. (AISTATS 2023); ``None``.
    """

    name: ClassVar[str] = "dnc"
    pairwise_matrices = 5
    reference: ClassVar[str] = (
        "V. Shejwalkar, A. Houmansadr, 'Manipulating the Byzantine: optimizing model poisoning attacks and "
        "defenses for federated learning', NDSS 2021, Algorithm 3 (DnC)"
    )
    requirement = "n > 2f and n - ceil(c*f) >= 1 (honest majority; keeps n - ceil(c*f) rows)"
    context_keys = frozenset({"generator"})

    def __init__(
        self, f: int = 0, iterations: int = 1, subsample: int = 10_000, c: float = 1.0, seed: int = 0,
    ) -> None:
        super().__init__(f)
        self.iterations = int(check_positive("iterations", iterations, integer=True))
        self.subsample = int(check_positive("subsample", subsample, integer=True))
        self.c = float(check_positive("c", c))
        self.seed = int(check_positive("seed", seed, integer=True, allow_zero=True))
        self._generator = torch.Generator().manual_seed(self.seed)

    def removed(self) -> int:
        """Number of rows removed in each round: ``⌈c · f⌉``."""
        return max(0, math.ceil(self.c * self.f - 1e-9))

    def min_workers(self) -> int:
        return max(2 * self.f + 1, self.removed() + 1)

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n, d = x.shape
        xc = as_compute_dtype(x)
        _, bad = row_norms(xc)
        keep = n - self.removed()
        b = min(self.subsample, d)
        counts = torch.zeros(n, dtype=torch.int64)
        rank_sum = torch.zeros(n, dtype=torch.int64)
        gen = random_source(context, self._generator)
        for _ in range(self.iterations):
            if b < d:
                idx = torch.randperm(d, generator=gen)[:b].sort().values.to(x.device)
                sub = xc.index_select(1, idx)
            else:
                sub = xc
            scores = dnc_scores(sub, bad).cpu()
            order = torch.sort(scores, stable=True).indices
            counts[order[:keep]] += 1
            rank_sum[order] += torch.arange(n)
        if bool((counts == self.iterations).any()):  # the paper's good set: the intersection over the rounds
            good = (counts == self.iterations).nonzero().flatten()
        else:  # empty intersection: the `keep` rows kept most often (ties: lower total rank across rounds)
            by_rank = torch.sort(rank_sum, stable=True).indices
            good = by_rank[torch.sort(-counts[by_rank], stable=True).indices][:keep].sort().values
        good = good.to(x.device)
        weights = selection_weights(good, n, x.device)
        out = weighted_sum(weights, xc, bad)
        return out.to(x.dtype), (weights if want_contributions else None)
