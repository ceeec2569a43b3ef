"""Shared numerical building blocks: bad-row detection and pairwise distances from one Gram matrix.

Weighted sums that skip bad rows are in :mod:`phalanx.aggregators._rowops`.

A *bad row* is one whose squared Euclidean norm is not finite in the compute dtype: it holds NaN or ±Inf, or values
so large that the norm overflows. Distance-based rules treat a bad row as infinitely far from every other row, which
is the limit of the honest formulas, so a Byzantine worker cannot turn NaN into a crash or into garbage output.
"""

from __future__ import annotations

import torch
from torch import Tensor


def row_sqnorms(x: Tensor) -> Tensor:
    """Squared Euclidean norm of each row, ``(n,)``, in the dtype of ``x``."""
    return torch.linalg.vector_norm(x, dim=1).square()


def bad_rows(sqnorms: Tensor) -> Tensor:
    """Boolean ``(n,)`` mask of rows whose squared norm is not finite."""
    return ~torch.isfinite(sqnorms)


def pairwise_sqdist(x: Tensor, sqnorms: Tensor | None = None) -> Tensor:
    """Pairwise squared Euclidean distances ``D[i, j] = ‖xᵢ − xⱼ‖²`` from one Gram matrix, ``(n, n)``.

    One matrix product (``G = x xᵀ``) instead of ``n²`` passes over the data: ``D = Gᵢᵢ + Gⱼⱼ − 2Gᵢⱼ``. The squared
    norms are the Gram matrix's own diagonal (sums of squares, like its other entries), not squared norms from a
    square root: on inputs whose sums are exact (small integers, in float32 as in float64) every distance is then
    exact, so rows at equal distances in exact arithmetic tie exactly, in every dtype, and the rules' documented
    tie-breaks decide — not rounding. Rounding can make an entry slightly negative: it is clamped at 0; the
    diagonal is exactly 0. Any pair that involves a bad row (``sqnorms``, by default :func:`row_sqnorms`, or the
    Gram diagonal not finite) gets ``+inf`` (also on the diagonal, so a bad row is never anyone's nearest
    neighbour, not even its own); bad rows are zeroed before the product.
    """
    if sqnorms is None:
        sqnorms = row_sqnorms(x)
    bad = bad_rows(sqnorms)
    if bool(bad.any()):
        x = torch.where(bad[:, None], torch.zeros((), dtype=x.dtype, device=x.device), x)
    gram = x @ x.T
    gram = 0.5 * (gram + gram.T)  # BLAS need not return an exactly symmetric product; ties must be exact ties
    sq = gram.diagonal().clone()
    bad = bad | bad_rows(sq)
    dist = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min_(0.0)
    dist.fill_diagonal_(0.0)
    dist = torch.nan_to_num(dist, nan=float("inf"), posinf=float("inf"))
    if bool(bad.any()):
        dist[bad, :] = float("inf")
        dist[:, bad] = float("inf")
    return dist


def selection_weights(index: Tensor, n: int, device: torch.device) -> Tensor:
    """Uniform float64 weights ``1/|index|`` on the selected rows, 0 elsewhere, ``(n,)``."""
    w = torch.zeros(n, dtype=torch.float64, device=device)
    w[index] = 1.0 / index.numel()
    return w


COLUMN_CHUNK = 65_536
"""Columns per chunk for row-wise passes that would otherwise allocate an (n, d) temporary (cache-sized)."""


DISTANCE_CHUNK_BYTES = 1 << 20
"""Bytes of one ``(n, c)`` block of differences in :func:`row_distances` on one thread (it stays in cache and is
reused)."""

DISTANCE_CHUNK_BYTES_THREADED = 1 << 24
"""The same with several intra-op threads: every block is two OpenMP parallel regions, whose barriers cost up to
milliseconds when the cores are oversubscribed — measured at load average 15 on 2 cores, n = 50, d = 10⁶, 2
threads: 16.5 s with 1 MiB blocks, 1.6 s with 16 MiB blocks (one thread: 0.42 s and 0.65 s)."""


def row_distances(x: Tensor, v: Tensor) -> Tensor:
    """Euclidean distance of every row of ``x`` to the vector ``v``, float64 ``(n,)``, without an (n, d) temporary.

    Exact (no Gram-style expansion, so no cancellation when a row is close to ``v``): the differences are formed
    block by block of columns into one reused buffer of about :data:`DISTANCE_CHUNK_BYTES` (at least 4,096 columns;
    :data:`DISTANCE_CHUNK_BYTES_THREADED` with several threads),
    which stays in cache: one streaming pass over ``x`` (the former 65,536-column blocks allocated an ``(n, 65536)``
    temporary per block and ran at 7× one pass for n ≥ 64, docs/benchmarks.md). The squared norms of the blocks
    are summed in float64. A row with NaN/Inf gets a non-finite distance.
    """
    n, d = x.shape
    budget = DISTANCE_CHUNK_BYTES if torch.get_num_threads() == 1 else DISTANCE_CHUNK_BYTES_THREADED
    cols = min(d, max(4096, budget // max(1, n * x.element_size())))
    total = torch.zeros(n, dtype=torch.float64, device=x.device)
    buf = torch.empty(n, cols, dtype=x.dtype, device=x.device)
    grad = torch.is_grad_enabled() and (x.requires_grad or v.requires_grad)
    for s in range(0, d, cols):
        e = min(d, s + cols)
        if grad:  # out= is not differentiable: a fresh block, as before
            block = x[:, s:e] - v[s:e]
        else:
            block = buf[:, : e - s]
            torch.sub(x[:, s:e], v[s:e], out=block)
        total += torch.linalg.vector_norm(block, dim=1).double().square()
    return total.sqrt()
