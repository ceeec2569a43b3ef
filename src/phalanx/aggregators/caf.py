"""CAF, the covariance-bound agnostic filter (Allouah, Guerraoui & Stephan, ICML 2025, Algorithm 2)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import row_norms, weighted_sum
from phalanx.aggregators.base import Aggregator, as_compute_dtype
from phalanx.aggregators.registry import register

__all__ = ["CAF", "caf_weights", "centred_gram", "gram_bad_rows", "row_gram"]


def row_gram(x: Tensor, bad: Tensor) -> Tensor:
    """The Gram matrix ``X Xᵀ`` of the good rows (bad rows as zero rows), as float64 ``(n, n)``: one matrix product
    in the dtype of ``x`` (float32 for float32 inputs, like the distance-based rules' Gram matrix: sums of small
    integers are exact, so exact ties stay ties in both dtypes), symmetrised."""
    if bool(bad.any()):
        x = torch.where(bad.to(x.device)[:, None], torch.zeros((), dtype=x.dtype, device=x.device), x)
    g = (x @ x.T).to(torch.float64)
    return 0.5 * (g + g.T)


def gram_bad_rows(gram: Tensor, bad: Tensor) -> Tensor:
    """``bad`` and the rows whose squared norm (the Gram diagonal, float64) is so large that a sum of ``n²`` such
    terms could overflow float64: they are as far from everything as a NaN row is."""
    n = gram.shape[0]
    limit = torch.finfo(torch.float64).max / (4.0 * max(n, 1) ** 2)
    diag = gram.diagonal()
    return bad.to(gram.device) | ~torch.isfinite(diag) | (diag > limit)


def centred_gram(gram: Tensor, w: Tensor) -> Tensor:
    r"""``K = (X − 1μᵀ)(X − 1μᵀ)ᵀ`` for the weighted mean :math:`\mu = \sum_i w_i x_i` (``w`` adds up to 1), from
    the Gram matrix ``G = XXᵀ`` alone: :math:`K = G - G w 1^\top - 1 w^\top G + (w^\top G w)\, 1 1^\top`."""
    gw = gram @ w
    k = gram - gw[:, None] - gw[None, :] + (w @ gw)
    return 0.5 * (k + k.T)


SCALE_ABOVE = 2.0 ** 256
"""The filter brings the Gram matrix back by a power of two when the largest diagonal entry of the rows still
weighted lies above this or below its inverse (:func:`_in_range`)."""


def _shift_to_one(value: float) -> int:
    """The power of two k for which value · 2^k lies in [0.5, 1) (exact scaling: both scalings below use it)."""
    return -math.frexp(value)[1]


def _in_range(gram: Tensor, active: Tensor) -> tuple[Tensor, int]:
    """The input's Gram matrix ``gram`` restricted to the ``active`` rows (the others' rows and columns zeroed) and
    scaled by the power of two that brings their largest diagonal entry near 1, when that entry lies outside
    [1/:data:`SCALE_ABOVE`, :data:`SCALE_ABOVE`]; ``gram`` as it is otherwise (and the shift: 0).

    τ squares Gram-sized values: rows of squared norm above about 10¹⁵⁴ made every τ infinite, every weight NaN and
    the loop stop at its first step — the plain mean, with attackers' rows of 10⁸⁰ in float64 moving it by 10⁷⁹ (an
    attacker's review). Scaling once was not enough: once the huge row is zeroed the honest rows' entries lie near
    10⁻¹⁶⁰ of it, their τ underflowed to 0 and the loop stopped with other Byzantine rows still weighted (a review of
    that fix); scaling the scaled matrix again at each step was not either: honest entries already flushed to zero
    stay zero, and the zeroed huge row scaled back up was infinite, so eigh got NaN (a review of the second fix). So
    every step scales the *input's* Gram matrix, from the rows still weighted. The filter's weights do not change
    when every row is scaled by one constant (and rows of weight 0 take no part), a power of two scales every product
    exactly, and inputs whose diagonal stays within the bounds keep their bits."""
    diag = gram.diagonal()[active]
    top = float(diag.max()) if diag.numel() else 0.0
    if not top > 0.0 or 1.0 / SCALE_ABOVE <= top <= SCALE_ABOVE:
        return gram, 0
    shift = _shift_to_one(top)
    kept = torch.where(active[:, None] & active[None, :], gram, torch.zeros((), dtype=gram.dtype, device=gram.device))
    return torch.ldexp(kept, torch.tensor(shift, device=gram.device)), shift


ROWS_IN_RANGE = 2.0 ** 32
"""The rows are scaled by a power of two before their Gram product when the median of the good rows' largest
absolute entries lies outside [1/ROWS_IN_RANGE, ROWS_IN_RANGE] (:func:`_rows_in_range`)."""


def _rows_in_range(x: Tensor, bad: Tensor) -> Tensor:
    """``x`` scaled by the power of two that brings the median, over the good rows, of a row's largest absolute entry
    (set by an honest row: more than half are; no squares, so nothing underflows) near 1, when it lies outside
    [1/:data:`ROWS_IN_RANGE`, :data:`ROWS_IN_RANGE`]; ``x`` itself otherwise (every input of ordinary size keeps its
    bits).

    The Gram product runs in the input's dtype with subnormals flushed to zero: honest rows of 10⁻²¹ and attackers of
    10⁻¹⁹ in float32 made every entry 0, λ = 0 at the first step, and the output the plain mean (a review of the
    scaling below, which cannot rescale a matrix that is already 0). The filter's weights do not change when every
    row is scaled by one constant, and the output is the weighted sum of the rows as given."""
    good = x[~bad] if bool(bad.any()) else x
    if good.numel() == 0:
        return x
    median = float(torch.linalg.vector_norm(good.detach(), ord=math.inf, dim=1).median())  # (no (n, d) temporary)
    if not median > 0.0 or 1.0 / ROWS_IN_RANGE <= median <= ROWS_IN_RANGE:
        return x
    return torch.ldexp(x, torch.tensor(_shift_to_one(median), device=x.device))


def _below(lam: float, shift: int, best: float, best_shift: int) -> bool:
    """Whether the eigenvalue ``lam`` of a Gram matrix scaled by 2^``shift`` is below ``best`` (scaled by
    2^``best_shift``): compared as they are when the scales agree (every input within the bounds: its bits),
    else by their logarithms in the input's own scale."""
    if shift == best_shift:
        return lam < best
    return _log2_unscaled(lam, shift) < _log2_unscaled(best, best_shift)


def _log2_unscaled(value: float, shift: int) -> float:
    """log₂ of ``value`` (an eigenvalue of the Gram matrix scaled by 2^``shift``) in the input's own scale."""
    return math.log2(value) - shift if value > 0.0 else -math.inf


def caf_weights(gram: Tensor, bad: Tensor, f: int) -> Tensor:
    r"""CAF's output weights, float64 ``(n,)`` adding up to 1, from the rows' Gram matrix (float64 ``(n, n)``).

    Every step of the filter runs on ``n × n`` matrices. With :math:`w = c / \sum_i c_i` and
    :math:`K` the Gram matrix of the rows centred at :math:`\mu_c` (:func:`centred_gram`), the weighted covariance
    :math:`\Sigma_c = \sum_i w_i (x_i - \mu_c)(x_i - \mu_c)^\top` has the non-zero eigenvalues of
    :math:`M = W^{1/2} K W^{1/2}`; for the top eigenpair :math:`(\lambda, u)` of :math:`M` the top eigenvector of
    :math:`\Sigma_c` is :math:`v = D^\top W^{1/2} u / \sqrt\lambda` (:math:`D`: the centred rows), so
    :math:`\tau_i = ((x_i - \mu_c)^\top v)^2 = (K W^{1/2} u)_i^2 / \lambda` — exact eigenpairs, no power method.

    A bad row (``bad``, or a Gram diagonal that is not finite) starts with weight 0: it is infinitely far along the
    first top eigenvector, so the first step zeroes it and leaves every finite row's weight as it is, with an
    infinite eigenvalue that is never the smallest. The loop always runs once (so f = 0 gives the mean of the
    good rows); each step zeroes at least the row of largest τ among the rows still weighted, so it ends after at
    most n steps. When the weighted rows are all equal (:math:`\lambda = 0`) their mean is exact and the loop
    stops. With no good row at all the weights are 0.
    """
    n = gram.shape[0]
    bad = gram_bad_rows(gram, bad)
    g = torch.where(bad[:, None] | bad[None, :], torch.zeros((), dtype=gram.dtype, device=gram.device), gram)
    c = (~bad).to(torch.float64)
    best: Tensor | None = None
    best_lam, best_shift = float("inf"), 0
    first = True
    while first or float(c.sum()) > n - 2 * f:
        first = False
        total = float(c.sum())
        if total <= 0.0:
            break
        w = c / total
        scaled, shift = _in_range(g, c > 0)
        k = centred_gram(scaled, w)
        r = w.sqrt()
        evals, evecs = torch.linalg.eigh(r[:, None] * k * r[None, :])
        lam = max(float(evals[-1]), 0.0)
        if best is None or _below(lam, shift, best_lam, best_shift):
            best, best_lam, best_shift = w, lam, shift
        if lam <= 0.0:
            break
        tau = torch.nan_to_num((k @ (r * evecs[:, -1])).square() / lam, nan=float("inf"))
        active = c > 0
        top = float(tau[active].max())
        if not top > 0.0:
            break
        if top == float("inf"):  # (the step's limit: the rows infinitely far along v go to 0, the others stay)
            c = torch.where(tau == top, torch.zeros_like(c), c)
            continue
        c = torch.where(active, c * (1.0 - tau / top), torch.zeros_like(c)).clamp_min(0.0)
    return best if best is not None else torch.zeros(n, dtype=torch.float64, device=gram.device)


@register
class CAF(Aggregator):
    r"""CAF (covariance-bound agnostic filter): a weighted mean whose weights a spectral filter lowers.

    Y. Allouah, R. Guerraoui, J. Stephan, "Towards trustworthy federated learning with untrusted participants",
    ICML 2025, Algorithm 2 (CAF). Starting from :math:`c_i = 1`, while :math:`\sum_i c_i > n - 2f`:

    .. math::
        \mu_c = \frac{\sum_i c_i x_i}{\sum_i c_i}, \quad
        \Sigma_c = \frac{\sum_i c_i (x_i - \mu_c)(x_i - \mu_c)^\top}{\sum_i c_i}, \quad
        (\lambda_{\max}, v) = \text{top eigenpair of } \Sigma_c,

        \tau_i = \big((x_i - \mu_c)^\top v\big)^2, \qquad c_i \leftarrow c_i \Big(1 - \frac{\tau_i}{\tau_{\max}}\Big),

    and the output is the :math:`\mu_c` of the step with the smallest :math:`\lambda_{\max}`. No bound on the
    honest rows' covariance is needed. Requires :math:`n > 2f`.

    Computed on the rows' Gram matrix (one matrix product, :func:`row_gram`), then every
    step on ``n × n`` matrices with the exact top eigenpair (:func:`caf_weights`), and the output as one weighted
    sum: O(n²d + n⁴) against the papers' O(nd) per power-iteration step. Where ours is not ByzFL's (0.0.11):

    * the exact eigenpair; ByzFL runs one power-iteration step from a random start, whose eigenvalue estimate is
      :math:`\lambda_{\max} |\cos(v, v_0)|` even on rank-one data, so its choice of step is random where
      :math:`d > 1`;
    * :math:`\tau_{\max}` is the largest τ among the rows still weighted (:math:`c_i > 0`), as in the weighted
      filters CAF builds on; ByzFL takes it over all rows, so a row already at weight 0 can stay the largest and
      no weight reaches 0 (on a far outlier its loop does not end in practice);
    * at f = 0 the loop runs once and gives the mean; ByzFL's loop does not run and it returns ``None``.

    A bad row (NaN/Inf, or a norm that overflows) gets weight 0 before the first step (the limit of that step on
    a row infinitely far away). Contributions: the weights of the chosen step (they add up to 1). ε and κ: not
    known; ``None``.
    """

    subnormals_as_zero = True  # subnormal arithmetic made it tens of times slower on a CPU: flush to zero (_subnormals)
    name: ClassVar[str] = "caf"
    floor = "gemm"
    reference: ClassVar[str] = (
        "Y. Allouah, R. Guerraoui, J. Stephan, 'Towards trustworthy federated learning with untrusted "
        "participants', ICML 2025, Algorithm 2 (CAF)"
    )
    requirement = "n > 2f"
    pairwise_matrices = 4  # the Gram matrix, the centred one, its weighted copy and the eigenvectors

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        xc = as_compute_dtype(x)
        bad = row_norms(xc)[1]
        xs = _rows_in_range(xc, bad)
        if xs is not xc:
            bad = row_norms(xs)[1]  # (a row that overflows once scaled is as far as a bad one)
        gram = row_gram(xs.detach(), bad)
        weights = caf_weights(gram, bad, self.f)
        out = weighted_sum(weights, xc, gram_bad_rows(gram, bad) | bad)
        return out.to(x.dtype), (weights if want_contributions else None)
