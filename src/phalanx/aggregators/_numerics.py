"""Shared numerical building blocks: bad-row detection and pairwise distances from one Gram matrix.

Weighted sums that skip bad rows are in :mod:`phalanx.aggregators._rowops`.

A *bad row* is one whose squared Euclidean norm is not finite in the compute dtype: it holds NaN or ±Inf, or values
so large that the norm overflows. Distance-based rules treat a bad row as infinitely far from every other row, which
is the limit of the honest formulas, so a Byzantine worker cannot turn NaN into a crash or into garbage output.
"""

from __future__ import annotations

import math

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

    **Cancellation.** The formula subtracts numbers of size ``‖x‖²`` to get one of size ``‖xᵢ − xⱼ‖²``. Its error
    is bounded, to first order, by ``(2γ + 4u)(Gᵢᵢ + Gⱼⱼ)``: the rounding of ``Gᵢⱼ`` is at most ``γ Σₖ|xᵢₖxⱼₖ| ≤
    γ (Gᵢᵢ + Gⱼⱼ)/2`` (Cauchy–Schwarz), that of each diagonal entry ``γ Gᵢᵢ``, plus the three final operations; ``u``
    is the unit roundoff of the dtype (2⁻²⁴ in float32) and ``γ`` the error factor of a length-``d`` dot product.
    We take the probabilistic ``γ = √d·u`` (Higham & Mary, SIAM J. Sci. Comput. 2019: rounding errors of a sum of
    ``d`` terms grow like ``√d·u`` with high probability; blocked GEMM accumulation grows slower still), not the
    worst case ``γ_d = d·u/(1 − d·u)``, which for float32 and ``d = 10⁷`` exceeds 0.5 and would send every honest
    step down the slow path. When every row shares a large offset ``c`` (``‖c‖`` ≫ the honest spread) this error
    swamps the honest distances: float32, ``d = 1000``, honest spread 0.01, ``c = 100`` gave errors of 3.8 on
    distances of 0.2, and Multi-Krum, Bulyan, MDA and NNM put weight on attackers 13× farther from the honest rows
    than those are from each other.

    So the result is checked once, on the ``(n, n)`` matrix only: with ``G̃`` the (lower) median of the good rows'
    squared norms and ``s`` the smallest, over good rows, of the row's median distance to the other good rows, the
    distances stand when ``(2√d·u + 4u)·2G̃ ≤ s/8`` — the error bound of a typical pair is at most an eighth of the
    typical honest distance. Both are robust to fewer than half Byzantine rows: an honest row's median distance
    is one of its honest distances, so attackers cannot raise ``s`` (they can lower it, which only triggers the
    check), and ``G̃`` lies between honest squared norms. Attackers *can* force the slow path, by lowering ``s``: at
    n = 2f + 1, f copies of one honest row make its median distance 0 (a review: MDA 16× slower). That costs time,
    never a wrong selection; reading one distance past the median instead let f far attackers raise ``s`` and switch
    the check off at n = 2f + 1 (a review of that change), so the median stays. A computed distance is at most the
    exact one plus the error, so when the exact honest distances are below 7× the bound, ``s`` is too and the check
    fires. Otherwise (rare on honest updates: float32 fires only when ‖mean‖²/‖spread‖² exceeds about 3,000 at
    ``d = 10⁵`` and 300 at ``d = 10⁷``; never on well-scaled data, whose distances keep the formula's bits) the
    distances are recomputed
    on rows re-centred at the coordinate-wise (lower) median ``m`` of the good rows, robust to fewer than half
    Byzantine rows (the first row is not: it may be an attacker's), ``D = Gᵢᵢ' + Gⱼⱼ' − 2Gᵢⱼ'`` with ``G' = (x −
    m)(x − m)ᵀ`` summed in float64 column chunk by column chunk: its error is relative to the rows' distances from
    ``m``, the honest spread, and it is the same on ``x`` and ``x + c`` up to the rounding of the inputs, so the
    rules' translation equivariance holds for large offsets (tests/test_numerics.py,
    ``test_large_common_offset_does_not_hand_selection_to_attackers``). The lower median is a data value, so
    small-integer inputs stay exact on that path too; bad rows, the zero diagonal, symmetry and the clamp at 0 are
    kept. Rows of which more than half coincide make ``s = 0`` and take that path: coincident rows then lie at
    exactly 0.
    """
    if sqnorms is None:
        sqnorms = row_sqnorms(x)
    bad = bad_rows(sqnorms)
    if bool(bad.any()):
        x = torch.where(bad[:, None], torch.zeros((), dtype=x.dtype, device=x.device), x)
    gram, sq, bad = _gram_parts(x @ x.T, bad)
    dist = _distances(gram, sq, bad)
    if _cancellation_possible(dist, sq, bad, x.shape[1], x.dtype):
        gram, sq, _ = _gram_parts(_centred_gram(x, bad), bad)
        dist = _distances(gram, sq, bad).to(x.dtype)
    return dist


CANCELLATION_FRACTION = 1.0 / 8.0
"""The error bound of a typical pair may be at most this fraction of the typical honest distance before
:func:`pairwise_sqdist` recomputes on re-centred rows."""


def _gram_parts(gram: Tensor, bad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The symmetrised Gram matrix, its diagonal and the bad rows with the non-finite diagonal entries added."""
    gram = 0.5 * (gram + gram.T)  # BLAS need not return an exactly symmetric product; ties must be exact ties
    sq = gram.diagonal().clone()
    return gram, sq, bad | bad_rows(sq)


def _distances(gram: Tensor, sq: Tensor, bad: Tensor) -> Tensor:
    dist = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min_(0.0)
    dist.fill_diagonal_(0.0)
    dist = torch.nan_to_num(dist, nan=float("inf"), posinf=float("inf"))
    if bool(bad.any()):
        dist[bad, :] = float("inf")
        dist[:, bad] = float("inf")
    return dist


def _cancellation_possible(dist: Tensor, sq: Tensor, bad: Tensor, d: int, dtype: torch.dtype) -> bool:
    """Whether the Gram formula's error bound exceeds :data:`CANCELLATION_FRACTION` of the typical honest distance
    (see :func:`pairwise_sqdist`); O(n²), one host synchronisation."""
    n = dist.shape[0]
    good = ~bad
    n_good = n if not bool(bad.any()) else int(good.sum())
    if n_good < 2:
        return False
    u = torch.finfo(dtype).eps / 2.0
    bound = 2.0 * math.sqrt(d) * u + 4.0 * u  # (2γ + 4u), γ = √d·u
    typical_sq = torch.nanmedian(torch.where(good, sq, float("nan")))
    off = dist.clone()
    off.fill_diagonal_(float("inf"))  # bad rows' columns are +inf already
    # the ⌊n_good/2⌋-th smallest distance to another row: always one of an honest row's honest distances, so
    # attackers cannot raise it (one past it, at n = 2f + 1, is a distance to an attacker: far attackers then switched
    # the check off — a review of that change); f = (n − 1)/2 copies of an honest row can lower it and force the slow,
    # exact path (6–16× the distance step): a cost, not a wrong selection
    row_median = off.kthvalue(n_good // 2, dim=1).values
    scale = torch.where(good, row_median, float("inf")).min()
    return bool(bound * 2.0 * typical_sq > CANCELLATION_FRACTION * scale)


def _centred_gram(x: Tensor, bad: Tensor) -> Tensor:
    """``(x − m)(x − m)ᵀ`` in float64, ``m`` the coordinate-wise lower median of the good rows, bad rows as zero
    rows; column chunk by column chunk (no ``(n, d)`` temporary)."""
    n = x.shape[0]
    good = ~bad
    xg = x[good] if bool(bad.any()) else x
    gram = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    keep = good[:, None]
    for s in range(0, x.shape[1], COLUMN_CHUNK):
        e = min(x.shape[1], s + COLUMN_CHUNK)
        centre = xg[:, s:e].median(dim=0).values
        block = torch.where(keep, x[:, s:e] - centre, 0.0).to(torch.float64)
        gram.addmm_(block, block.T)
    return gram


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
