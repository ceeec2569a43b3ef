"""SMEA, smallest maximum eigenvalue averaging (Allouah, Guerraoui, Gupta, Pinot & Stephan, ICML 2023)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import row_norms, weighted_sum
from phalanx.aggregators.base import Aggregator, as_compute_dtype, check_positive
from phalanx.aggregators.caf import gram_bad_rows, row_gram
from phalanx.aggregators.registry import register
from phalanx.errors import ConfigError

__all__ = ["SMEA", "smea_weights"]

_BATCH = 1 << 22
"""Entries of the ``(subsets, m, m)`` batch of centred Gram matrices built at once."""
_TIE_RTOL = 1e-9
_TIE_ATOL = 1e-12


def smea_weights(gram: Tensor, bad: Tensor, f: int) -> Tensor:
    r"""SMEA's output weights, float64 ``(n,)``, from the rows' Gram matrix (float64 ``(n, n)``).

    Every subset :math:`S` of :math:`m = n - f` rows is scored by the largest eigenvalue of its covariance,
    :math:`\lambda_{\max}(\Sigma_S) = \lambda_{\max}(J G_{SS} J) / m` (:math:`J = I - \tfrac1m 11^\top`: the
    covariance's non-zero eigenvalues are those of the centred ``m × m`` Gram matrix), in batches with
    ``torch.linalg.eigvalsh``. A subset with a bad row (``bad``, or a Gram diagonal that is not finite) has an
    infinite eigenvalue: only subsets of good rows are enumerated, :math:`\binom{n - b}{f - b}` of them for
    :math:`b \le f` bad rows. With more than f bad rows no subset is finite and the weights are uniform on the good
    rows (zero if there is none).

    Subsets within rounding of the smallest eigenvalue (relative 1e-9, or 1e-12 of the chosen rows' mean squared
    norm) tie: the weights are the average of their uniform weights, so a tie in exact arithmetic (two subsets
    that mirror each other) does not go to whichever subset rounding favours or comes first.
    """
    n = gram.shape[0]
    m = n - f
    bad = gram_bad_rows(gram, bad).cpu()
    g = gram.cpu()
    good = (~bad).nonzero().flatten()
    drop = f - (n - good.numel())
    if drop < 0 or good.numel() == 0:
        w = (~bad).to(torch.float64)
        return (w / max(float(w.sum()), 1.0)).to(gram.device)
    sub = g[good][:, good]
    ng = good.numel()
    dropped = (torch.combinations(torch.arange(ng), r=drop) if drop > 0
               else torch.zeros(1, 0, dtype=torch.int64))
    lams = torch.empty(dropped.shape[0], dtype=torch.float64)
    step = max(1, _BATCH // (m * m))
    for s in range(0, dropped.shape[0], step):
        keep = _kept(dropped[s : s + step], ng)
        block = sub[keep[:, :, None], keep[:, None, :]]
        block = block - block.mean(dim=1, keepdim=True)
        block = block - block.mean(dim=2, keepdim=True)
        block = 0.5 * (block + block.transpose(1, 2))
        lams[s : s + step] = torch.linalg.eigvalsh(block)[:, -1] / m
    best = int(torch.argmin(lams))
    scale = float(sub.diagonal()[_kept(dropped[best : best + 1], ng)[0]].mean())
    ties = (lams <= lams[best] + _TIE_RTOL * abs(float(lams[best])) + _TIE_ATOL * scale).nonzero().flatten()
    counts = torch.full((ng,), float(ties.numel()), dtype=torch.float64)
    if drop > 0:
        counts -= torch.bincount(dropped[ties].flatten(), minlength=ng).to(torch.float64)
    w = torch.zeros(n, dtype=torch.float64)
    w[good] = counts / (ties.numel() * m)
    return w.to(gram.device)


def _kept(dropped: Tensor, n: int) -> Tensor:
    """The kept indices ``(B, n − r)`` of each row of ``dropped`` ``(B, r)`` (sorted)."""
    mask = torch.ones(dropped.shape[0], n, dtype=torch.bool)
    if dropped.shape[1]:
        mask.scatter_(1, dropped, False)
    return mask.nonzero()[:, 1].view(dropped.shape[0], n - dropped.shape[1])


@register
class SMEA(Aggregator):
    r"""SMEA (smallest maximum eigenvalue averaging): the mean of the n − f rows whose covariance has the smallest
    largest eigenvalue.

    Y. Allouah, R. Guerraoui, N. Gupta, R. Pinot, J. Stephan, "On the privacy-robustness-utility trilemma in
    distributed learning", ICML 2023 (the SMEA aggregation rule):

    .. math::
        S^\star = \arg\min_{|S| = n - f} \lambda_{\max}\Big(\frac{1}{|S|} \sum_{i \in S}
        (x_i - \bar x_S)(x_i - \bar x_S)^\top\Big), \qquad
        \mathrm{SMEA}(x) = \bar x_{S^\star} = \frac{1}{n - f} \sum_{i \in S^\star} x_i.

    Requires :math:`n > 2f`. The search is over all :math:`\binom{n}{f}` subsets, as in the paper: it is done on the
    rows' Gram matrix (one matrix product), each subset an ``(n − f) × (n − f)`` symmetric eigenvalue
    problem, exact (:func:`smea_weights`). ``max_subsets`` (default 10⁶) bounds the search: beyond it the call is a
    :class:`~phalanx.errors.ConfigError` before anything is computed (C(50, 10) ≈ 10¹⁰ subsets is out of reach for
    any exhaustive search). Exact ties between subsets are averaged (see :func:`smea_weights`).

    Where ours is not ByzFL's (0.0.11): ByzFL estimates each subset's eigenvalue by one power-iteration step from a
    random start, :math:`\lambda_{\max} |\cos(v, v_0)|` even for a rank-one covariance, so its choice of subset is
    random where :math:`d > 1`; in :math:`d = 1` that step is exact and the two agree. A bad row (NaN/Inf, or a
    norm that overflows) makes every subset that holds it infinite: it is never chosen while at most f rows are
    bad. Contributions: :math:`1/(n-f)` on the chosen rows. ε and κ: not known; ``None``.
    """

    name: ClassVar[str] = "smea"
    floor = "gemm"
    reference: ClassVar[str] = (
        "Y. Allouah, R. Guerraoui, N. Gupta, R. Pinot, J. Stephan, 'On the privacy-robustness-utility trilemma "
        "in distributed learning', ICML 2023 (SMEA)"
    )
    pairwise_matrices = 3  # the Gram matrix, its sub-matrix of good rows and a batch of centred sub-matrices

    def __init__(self, f: int = 0, max_subsets: int = 10**6) -> None:
        super().__init__(f)
        self.max_subsets = int(check_positive("max_subsets", max_subsets, integer=True))
        self.requirement = f"n > 2f and C(n, f) <= max_subsets = {self.max_subsets}"

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n = x.shape[0]
        subsets = math.comb(n, self.f)
        if subsets > self.max_subsets:
            raise ConfigError("max_subsets", self.max_subsets, f"at least C(n, f) = C({n}, {self.f}) = "
                              f"{subsets:.3g} (SMEA searches every subset of n - f rows; lower f or raise it)")
        xc = as_compute_dtype(x)
        bad = row_norms(xc)[1]
        gram = row_gram(xc.detach(), bad)
        weights = smea_weights(gram, bad, self.f)
        out = weighted_sum(weights, xc, gram_bad_rows(gram, bad) | bad)
        return out.to(x.dtype), (weights if want_contributions else None)
