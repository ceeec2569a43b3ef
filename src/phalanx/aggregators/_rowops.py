"""Row-wise helpers shared by the clipping, filtering and trust-weighting components.

They work from the row norms (one streaming pass over the data) and never scan the ``(n, d)`` input for NaN/Inf
element by element: a row whose norm is finite has only finite entries, so the norm already tells which rows are
bad. Weighted sums skip bad rows by running one matrix product per block of consecutive usable rows (views, no
copy of the input), instead of building a cleaned copy of the whole input.
"""

from __future__ import annotations

import torch
from torch import Tensor

from phalanx.aggregators._numerics import COLUMN_CHUNK

__all__ = [
    "clip_scales", "clipped_mean", "column_mean", "cosine_matrix", "float64_gram", "float64_row_norms", "median_norm",
    "mix_rows", "row_norms", "scale_rows", "weighted_sum",
]


def column_mean(x: Tensor) -> Tensor:
    """The mean of the rows of ``x (n, d)``, shape ``(d,)``: ``(1/n)·1ᵀX`` as one BLAS matrix-vector product.

    One streaming pass over X instead of ``x.mean(dim=0)``'s strided column reduction (timings:
    docs/benchmarks.md), the same sum up to rounding and the same NaN / Inf propagation. Other dtypes than
    float32 / float64 use ``mean(dim=0)``.
    """
    if x.dtype not in (torch.float32, torch.float64):
        return x.mean(dim=0)
    n = x.shape[0]
    return (torch.ones(1, n, dtype=x.dtype, device=x.device) @ x).squeeze(0) / n


def row_norms(x: Tensor) -> tuple[Tensor, Tensor]:
    """Euclidean norm of each row as float64 ``(n,)`` and the mask of bad rows (norm not finite).

    The norm is computed in the dtype of ``x``, so a row whose squared norm overflows that dtype is bad, as
    everywhere in the aggregation core (``_numerics.bad_rows``).
    """
    norms = torch.linalg.vector_norm(x, dim=1).to(torch.float64)
    return norms, ~torch.isfinite(norms)


def float64_row_norms(x: Tensor, bad: Tensor) -> Tensor:
    """Euclidean norm of each row summed in float64 (float64 ``(n,)``), ``+inf`` on the ``bad`` rows.

    The squares of float16/32 values are exact in float64, so the same values give the same norms whatever the
    input's dtype: a decision taken on norms (a filter's bound met with equality in exact arithmetic) is then the
    same for a float32 and a float64 copy of the input. Column chunk by column chunk (no float64 copy of ``x``).
    """
    total = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    for s in range(0, x.shape[1], COLUMN_CHUNK):
        total += x[:, s : s + COLUMN_CHUNK].to(torch.float64).square().sum(dim=1)
    return torch.where(bad, torch.full_like(total, float("inf")), total.sqrt())


def float64_gram(x: Tensor, keep: Tensor) -> Tensor:
    """The Gram matrix ``X Xᵀ`` of the rows flagged ``keep`` (the others as zero rows), summed in float64 column
    chunk by column chunk (no float64 copy of ``x``): float64 ``(n, n)`` on the device of ``x``."""
    n = x.shape[0]
    gram = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    keep = keep.to(x.device)[:, None]
    for s in range(0, x.shape[1], COLUMN_CHUNK):
        block = torch.where(keep, x[:, s : s + COLUMN_CHUNK], 0).to(torch.float64)
        gram.addmm_(block, block.T)
    return gram


def cosine_matrix(gram: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Pairwise cosines from a Gram matrix, float64 ``(n, n)`` clamped to [−1, 1], and the mask of rows that have
    one (kept, with a finite non-zero norm); a row without one has cosine 0 with every row."""
    norms = gram.diagonal().clamp_min(0.0).sqrt()
    ok = keep.to(gram.device) & (norms > 0) & torch.isfinite(norms)
    safe = torch.where(ok, norms, torch.ones_like(norms))
    cos = torch.where(ok[:, None] & ok[None, :], gram / (safe[:, None] * safe[None, :]), torch.zeros_like(gram))
    return cos.clamp(-1.0, 1.0), ok


def median_norm(norms: Tensor, bad: Tensor) -> Tensor:
    """Median of the row norms (mean of the two middle values when ``n`` is even), bad rows counted as +inf.

    With fewer bad rows than half of the rows the result is finite. Returns a float64 scalar tensor.
    """
    key = torch.where(bad, torch.full_like(norms, float("inf")), norms)
    s = torch.sort(key).values
    n = s.numel()
    if n % 2 == 1:
        return s[n // 2]
    lo, hi = s[n // 2 - 1], s[n // 2]
    if bool(torch.isinf(hi)):
        return hi
    return 0.5 * (lo + hi)


def clip_scales(norms: Tensor, bad: Tensor, threshold: Tensor | float) -> Tensor:
    """Per-row factors ``min(1, τ/‖xᵢ‖)`` (float64 ``(n,)``); 1 for bad rows and for rows already within ``τ``.

    Bad rows keep factor 1 so that they stay bad after scaling (a NaN row stays NaN, and the rule downstream still
    sees it as bad instead of a harmless-looking zero row).
    """
    tau = torch.as_tensor(threshold, dtype=torch.float64, device=norms.device)
    keep = bad | (norms <= tau)
    safe = torch.where(keep, torch.ones_like(norms), norms)
    return torch.where(keep, torch.ones_like(norms), tau / safe)


def scale_rows(x: Tensor, scales: Tensor) -> Tensor:
    """``x * scales[:, None]`` as a new tensor (never in place), in the dtype of ``x``."""
    return x * scales.to(device=x.device, dtype=x.dtype)[:, None]


def _runs(mask: Tensor) -> list[tuple[int, int]]:
    """Maximal runs ``[a, b)`` of consecutive ``True`` entries of a small boolean vector."""
    m = mask.detach().cpu().to(torch.int8)
    edges = torch.diff(m, prepend=torch.zeros(1, dtype=torch.int8), append=torch.zeros(1, dtype=torch.int8))
    starts = (edges == 1).nonzero().flatten().tolist()
    ends = (edges == -1).nonzero().flatten().tolist()
    return list(zip(starts, ends))


def mix_rows(weights: Tensor, x: Tensor, bad: Tensor) -> Tensor:
    """``weights @ x`` (weights ``(k, n)``) where rows of ``x`` flagged ``bad`` are skipped, not multiplied by 0.

    ``0 · NaN`` is NaN, so a plain matrix product lets one NaN row poison every output. Here the product runs over
    the blocks of consecutive rows that are good and carry a non-zero weight (views of ``x``, no copy). An output
    row that gives a bad input row a non-zero weight really is built from garbage: it is set to NaN, so the rule
    downstream treats it as bad. The result has the dtype of ``x``.
    """
    w = weights.to(device=x.device, dtype=x.dtype)
    k, d = w.shape[0], x.shape[1]
    nonzero = (weights != 0).to(x.device)
    poisoned = (nonzero & bad[None, :]).any(dim=1)
    usable = nonzero.any(dim=0) & ~bad
    runs = [(0, x.shape[0])] if bool(usable.all()) else _runs(usable)
    if not runs:
        out = torch.zeros(k, d, dtype=x.dtype, device=x.device)
    else:
        (a0, b0), *rest = runs
        out = w[:, a0:b0] @ x[a0:b0]
        for a, b in rest:
            out.addmm_(w[:, a:b], x[a:b])
    if bool(poisoned.any()):
        out[poisoned] = float("nan")
    return out


def weighted_sum(coef: Tensor, x: Tensor, bad: Tensor) -> Tensor:
    """``Σᵢ coefᵢ xᵢ`` (``(d,)``) skipping the bad rows; NaN if a bad row has a non-zero coefficient."""
    return mix_rows(coef[None, :], x, bad)[0]


def clipped_mean(
    x: Tensor, kept: Tensor, norms: Tensor, bad: Tensor, threshold: Tensor | float,
) -> tuple[Tensor, Tensor]:
    """Mean of the kept rows, each clipped to ``threshold``; returns ``(out (d,), shares (n,) float64)``.

    The shares are ``1/|kept|`` on the kept rows. With no row kept the output is the zero vector (no step).
    """
    n, d = x.shape
    count = int(kept.sum())
    if count == 0:
        return torch.zeros(d, dtype=x.dtype, device=x.device), torch.zeros(n, dtype=torch.float64, device=x.device)
    share = kept.to(device=norms.device, dtype=torch.float64) / count
    return weighted_sum(share * clip_scales(norms, bad, threshold), x, bad), share.to(x.device)
