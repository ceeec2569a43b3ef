"""Row-wise helpers shared by the clipping, filtering and trust-weighting components.

They work from the row norms (one streaming pass over the data) and never scan the ``(n, d)`` input for NaN/Inf
element by element: a row whose norm is finite has only finite entries, so the norm already tells which rows are
bad. Weighted sums skip bad rows by running one matrix product per block of consecutive usable rows (views, no
copy of the input), instead of building a cleaned copy of the whole input.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from phalanx.aggregators._numerics import COLUMN_CHUNK
from phalanx.aggregators._teams import team_threads

try:  # the optional C kernel (setup.py; imported after torch, so that it shares torch's OpenMP runtime)
    from phalanx.aggregators import _normkernel  # type: ignore[attr-defined]

    HAVE_NORM_KERNEL = os.environ.get("PHALANX_NO_KERNEL", "") == ""
except ImportError:  # pragma: no cover - exercised only where the extension could not be built
    _normkernel = None
    HAVE_NORM_KERNEL = False

try:  # the optional C kernel of the column sums (setup.py), imported after torch as the one above
    from phalanx.aggregators import _sumkernel  # type: ignore[attr-defined]

    HAVE_SUM_KERNEL = os.environ.get("PHALANX_NO_KERNEL", "") == ""
except ImportError:  # pragma: no cover - exercised only where the extension could not be built
    _sumkernel = None
    HAVE_SUM_KERNEL = False

__all__ = [
    "clip_scales", "clipped_mean", "column_mean", "cosine_matrix", "float64_gram", "float64_row_norms",
    "kernel_readable", "median_norm", "mix_rows", "new_rows", "row_norms", "row_order_sum", "row_sqnorm_estimates",
    "scale_rows", "scale_rows_", "smallest_norms_keys", "weighted_sum",
]

HUGE_OUTPUT_BYTES = 2 << 20
"""Outputs of at least this many bytes are allocated through numpy (see :func:`new_rows`)."""

_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def kernel_readable(x: Tensor) -> bool:
    """Whether a C kernel may read ``x`` through its data pointer: a plain strided CPU tensor (not a subclass such
    as a FakeTensor, not wrapped by ``torch.func``'s vmap or grad) whose memory holds the values it reads (no
    negative or conjugate bit: ``z.conj().imag`` is a view of negated memory)."""
    if type(x) is not torch.Tensor or x.device.type != "cpu" or x.layout != torch.strided:
        return False
    if x.is_neg() or x.is_conj():
        return False
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return not (wrapped is not None and wrapped(x))


def column_mean(x: Tensor) -> Tensor:
    r"""The mean of the rows of ``x (n, d)``, shape ``(d,)``: :math:`\bar x_j = s_j / n` with
    :math:`s_j = (\dots(((0 + x_{0j}) + x_{1j}) + x_{2j}) + \dots) + x_{n-1,j}`, each addition and the division
    rounded in the dtype of ``x`` (the leading ``0 +`` only turns a sum of ``-0.0`` into ``+0.0``, as a BLAS product
    and ``torch.mean`` give): the rows added in row order, whatever the number of threads or the CPU, provided every
    thread computes in the same floating-point mode (``torch.set_flush_denormal`` sets the calling thread's only).

    On the CPU (float32/float64, no gradient wanted) the C kernel ``_sumkernel.c`` computes it in one streaming pass
    over a row-major copy if ``x`` is not row-major, dividing each block of columns while it is in the cache;
    otherwise torch adds the rows one at a time (the same bits, ``tests/test_column_sums.py``; a gradient flows to
    ``x``). On other devices it is the BLAS product :math:`(1^\top X)/n` of that device, whose order of additions
    is its library's. For row-major inputs, MKL's product on the development machine added the rows in this order
    too (``benchmarks/column_sums.py`` counts the differing bits: none), so the kernel changed no result there;
    a column-major input's product added them in another order. Other dtypes than float32 / float64 use
    ``mean(dim=0)``. NaN and Inf propagate as in any sum.
    """
    if x.dtype not in (torch.float32, torch.float64):
        return x.mean(dim=0)
    n, d = x.shape
    if x.device.type != "cpu":  # the device's BLAS; divided in place, the same bits as ``/ n``
        return (torch.ones(1, n, dtype=x.dtype, device=x.device) @ x).squeeze(0).div_(n)
    wants_grad = x.requires_grad and torch.is_grad_enabled()
    if HAVE_SUM_KERNEL and not wants_grad and n >= 1 and d >= 1 and kernel_readable(x):
        if not ((x.stride(1) == 1 or d == 1) and (x.stride(0) >= d or n == 1)):
            x = x.contiguous()  # the order of the additions is the definition: the same bits from a copy
        out = torch.empty(d, dtype=x.dtype)
        _sumkernel.column_sums(
            x.data_ptr(), n, d, x.stride(0) if n > 1 else d, x.dtype == torch.float64, float(n), out.data_ptr(),
            team_threads(n * d),
        )
        return out
    return row_order_sum(x).div_(n)


def row_order_sum(x: Tensor) -> Tensor:
    """The column sums of ``x (n, d)`` as :func:`column_mean` defines them (``0 +`` the rows in row order), by
    torch one row at a time: the fallback and the tests' reference (n operations on the ``(d,)`` sum; the rows
    taken by ``unbind``, so a gradient costs one pass, not one ``(n, d)`` tensor per row)."""
    total = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    for row in x.unbind(0):
        total = total + row
    return total


def row_norms(x: Tensor) -> tuple[Tensor, Tensor]:
    """Euclidean norm of each row as float64 ``(n,)`` and the mask of bad rows (norm not finite).

    The norm is computed in the dtype of ``x``, so a row whose squared norm overflows that dtype is bad, as
    everywhere in the aggregation core (``_numerics.bad_rows``).
    """
    norms = torch.linalg.vector_norm(x, dim=1).to(torch.float64)
    return norms, ~torch.isfinite(norms)


def float64_row_norms(
    x: Tensor, bad: Tensor, rows: Tensor | None = None, max_squares: Tensor | None = None
) -> Tensor:
    r"""Euclidean norm of each row, its square summed exactly on float64 grids (float64 ``(n,)``), ``+inf`` on the
    ``bad`` rows. The result does not depend on the order of the additions, the number of threads or the path.

    The squares :math:`s_j = x_j^2` are taken in float64 (exact for float16/32 values, so a float32 and a float64
    copy of the same input get the same norms, and a decision taken on norms is the same for both). Their sum is
    the *pre-rounded* sum of Demmel & Nguyen ("Fast reproducible floating-point summation", ARITH 2013): with
    :math:`m = \max_j s_j = f\,2^e` (``frexp``), :math:`d \le 2^L` and :math:`K` folds
    (:func:`exact_sum_folds`), fold :math:`k` rounds what is left of each square onto the grid of
    :math:`M_k = 1.5\cdot 2^{P_k}` — :math:`r = (s + M_k) - M_k`, :math:`s \leftarrow s - r`,
    :math:`A_k \mathrel{+}= r` — with :math:`P_1 = e + L + 1`, :math:`P_{k+1} = P_k + L - 51`, each at least
    :data:`GRID_FLOOR`. *Claim (ours, the argument of that paper):* each :math:`r` of fold ``k`` is a multiple of
    :math:`2^{P_k - 52}` and of magnitude at most :math:`2^{P_k - L - 1}` (a square just under :math:`2^e` may round
    up to it), so every partial sum of :math:`A_k` is a multiple of :math:`2^{P_k-52}` of magnitude at most
    :math:`2^{P_k-1}`, below :math:`2^{P_k+1}`: exact in float64 whatever the order. The squared norm
    is :math:`\mathrm{fl}(\dots(A_1 + A_2) + \dots + A_K)`; it differs from the exact sum of squares by at most
    :math:`2^{2L-51+(K-1)(L-51)}\,S + u_{64} S + d\,2^{G-53}` (the dropped last remainders, the final roundings,
    the grid floor ``G``), which :func:`exact_sum_folds` keeps within :math:`(d + 1)u_{64}S` plus an absolute
    :math:`d\,2^{-960}` (with the entries below :data:`TINY`) — no worse than a float64 sum in one fixed order
    (:math:`\gamma_{d-1}`, Higham §4.2). Float64 entries below :data:`TINY` (``2^-480``) count as 0 (their squares
    are below ``2^-960``; it keeps subnormal arithmetic, 10× slower, out of reach of a Byzantine row). A row whose
    :math:`P_1` exceeds 1023 (a square of at least :math:`2^{1022-L}`, only float64 inputs) or whose
    largest square is ``+inf`` gets ``+inf``; a row holding a NaN gets NaN (``bad`` rows get ``+inf`` anyway).

    On the CPU for float32/float64 rows with contiguous columns the C kernel computes it (``_normkernel.c``: two
    streaming passes per row, one when the estimates' pass gave ``max_squares``; rows shared over threads);
    elsewhere torch does, column chunk by column chunk through one float64 buffer (no float64 copy of ``x``). Both
    give the same bits (``tests/test_exact_norms.py``). ``rows`` (indices, ``(k,)``): the norms of ``x[rows]`` only
    (``bad`` then has ``k`` entries), without an ``(k, d)`` copy. ``max_squares`` (float64, one per row taken): each
    row's largest float64 square as :func:`row_sqnorm_estimates` found it (exact), which saves the pass that finds
    it; a wrong value breaks the exactness, so only that function's output may be passed.
    """
    n, d = x.shape
    headroom, folds = exact_sum_folds(d)
    if rows is not None and (rows.dtype.is_floating_point or rows.dtype == torch.bool or rows.dim() != 1):
        raise TypeError(f"rows must be a 1-d tensor of integer indices, got {rows.dtype} of shape {tuple(rows.shape)}")
    if _kernel_sqnorms_apply(x):
        idx = None if rows is None else rows.to(device="cpu", dtype=torch.int64).contiguous()
        total = torch.empty(n if idx is None else idx.numel(), dtype=torch.float64)
        known = None if max_squares is None else max_squares.to(device="cpu", dtype=torch.float64).contiguous()
        if known is not None and known.shape != total.shape:  # the kernel reads one per row taken
            raise ValueError(f"max_squares has shape {tuple(known.shape)}, expected {tuple(total.shape)}")
        if total.numel():
            _normkernel.exact_sqnorms(
                x.data_ptr(), n, d, max(x.stride(0), d), x.dtype == torch.float64, 0 if idx is None else idx.data_ptr(),
                total.numel(), headroom, folds, total.data_ptr(), team_threads(total.numel() * d),
                0 if known is None else known.data_ptr(),
            )
    else:
        total = _torch_exact_sqnorms(x, rows, headroom, folds, max_squares)
    bad = bad.to(total.device)
    return torch.where(bad, torch.full_like(total, float("inf")), total.sqrt())


GRID_FLOOR = -1000
"""Lowest grid exponent ``P_k`` of :func:`float64_row_norms` (keeps every ``M_k`` a normal float64)."""

TINY = 2.0**-480
"""Float64 entries smaller than this in magnitude count as 0 in :func:`float64_row_norms` and the kernel's estimates:
their squares would be subnormal, and subnormal arithmetic is about 10× slower on x86 (a Byzantine row of 1e-160s
made both passes 10× slower). Without them every square is at least ``2^-960`` and every fold's remainder a multiple
of ``2^-1012``: normal. Float16/32 entries are never that small."""

EXACT_CHUNK_BYTES = 1 << 20
"""Float64 bytes per chunk of the torch path of :func:`float64_row_norms` (a cache's worth)."""


def exact_sum_folds(d: int) -> tuple[int, int]:
    r"""Headroom bits ``L`` (``d ≤ 2^L``, at least 1) and folds ``K`` of :func:`float64_row_norms` for rows of ``d``.

    ``K`` is the least number of folds with :math:`2^{2L-51+(K-1)(L-51)} \le 2^{L-54} \le d\,u_{64}`, i.e.
    :math:`K = 1 + \lceil (L + 3)/(51 - L) \rceil`: 2 folds up to :math:`d = 2^{24}`, 3 up to :math:`2^{33}`.
    Rows longer than :math:`2^{40}` are refused (``ValueError``).
    """
    if d < 1 or d > 2**40:
        raise ValueError(f"row length d={d} out of range [1, 2**40] for float64_row_norms")
    headroom = max(1, (d - 1).bit_length())
    return headroom, 1 + -(-(headroom + 3) // (51 - headroom))


def _grid_constants(m: Tensor, headroom: int, folds: int) -> tuple[list[Tensor], Tensor]:
    """``M_k = 1.5·2^{P_k}`` per row (float64, built from their bits: exact) and the rows whose ``P_1 > 1023``."""
    finite = torch.isfinite(m)
    exponent = torch.frexp(torch.where(finite, m, torch.zeros_like(m)))[1].to(torch.int64)
    p = exponent + headroom + 1
    over = p > 1023
    grids = []
    for _ in range(folds):
        p = p.clamp(GRID_FLOOR, 1023)
        grids.append((((p + 1023) << 52) | (1 << 51)).view(torch.float64))
        p = p + headroom - 51
    return grids, over


def _torch_exact_sqnorms(
    x: Tensor, rows: Tensor | None, headroom: int, folds: int, max_squares: Tensor | None = None
) -> Tensor:
    """:func:`float64_row_norms`'s squared norms with torch ops: one chunked pass for the largest squares (in the
    dtype of ``x``: the largest ``|x|``, squared in float64, is the largest float64 square), one for the folds
    (the same elementwise float64 operations as the C kernel; exact sums, so any reduction order). Chunks of
    about 1 MiB of float64 (:data:`EXACT_CHUNK_BYTES`), so that the fold's few passes over a chunk stay in cache."""
    d = x.shape[1]
    idx = None if rows is None else rows.to(x.device)
    n = x.shape[0] if idx is None else idx.numel()
    width = max(4096, min(COLUMN_CHUNK, EXACT_CHUNK_BYTES // (8 * max(n, 1))))

    def chunks() -> Iterator[Tensor]:
        for s in range(0, d, width):
            chunk = x[:, s : s + width]
            yield chunk if idx is None else chunk.index_select(0, idx)

    if max_squares is not None and not bool(torch.isnan(max_squares).any()):
        m = max_squares.to(device=x.device, dtype=torch.float64)
    else:
        top = torch.zeros(n, dtype=x.dtype, device=x.device)
        with torch.no_grad():
            for chunk in chunks():
                top = torch.maximum(top, chunk.abs().amax(dim=1))
        m = top.to(torch.float64).square()
    grids, over = _grid_constants(m, headroom, folds)
    acc = torch.zeros((folds, n), dtype=torch.float64, device=x.device)
    if torch.is_grad_enabled() and x.requires_grad:  # out of place; d(total)/ds = 1 (each fold is (s + M) - M)
        for chunk in chunks():
            b = chunk.to(torch.float64)
            b = torch.where(b.abs() < TINY, torch.zeros_like(b), b).square()
            for k, grid in enumerate(grids):
                t = (b + grid[:, None]) - grid[:, None]
                acc = acc.index_add(0, torch.tensor([k], device=x.device), t.sum(dim=1)[None])
                b = b - t
    else:
        buf = torch.empty((n, min(d, width)), dtype=torch.float64, device=x.device)
        tmp = torch.empty_like(buf)
        for chunk in chunks():
            b, t = buf[:, : chunk.shape[1]], tmp[:, : chunk.shape[1]]
            b.copy_(chunk)
            if x.dtype == torch.float64:
                b.masked_fill_(b.abs() < TINY, 0.0)
            b.square_()
            for k, grid in enumerate(grids):
                g = grid[:, None]
                torch.add(b, g, out=t)
                t.sub_(g)
                acc[k] += t.sum(dim=1)
                if k + 1 < folds:
                    b.sub_(t)
    total = acc[0]
    for k in range(1, folds):
        total = total + acc[k]
    total = torch.where(over | torch.isinf(m), torch.full_like(total, float("inf")), total)
    return torch.where(torch.isnan(m), m, total)


NORM_BLOCK = 128
"""Columns per float32 partial norm in :func:`row_sqnorm_estimates` (its error bound grows with the block)."""


def row_sqnorm_estimates(x: Tensor, max_squares: Tensor | None = None) -> tuple[Tensor, Tensor, float, float]:
    r"""One streaming pass: estimates of the squared row norms that :func:`float64_row_norms` would square, with a
    rigorous error bound, and the bad rows (as :func:`row_norms` flags them).

    On the CPU, for float32/float64 rows with contiguous columns, the C kernel adds the float64 squares in one pass
    (:func:`_kernel_sqnorms`: δ ≈ 2·2d·u₆₄). Elsewhere (other devices or dtypes, a build without the kernel,
    ``PHALANX_NO_KERNEL=1``, an input that requires grad) the columns are cut into blocks of :data:`NORM_BLOCK`;
    each block's norm is taken in the dtype of ``x`` (no ``(n, d)`` temporary, no float64 copy) and the squares of
    the ``m ≈ d/B`` block norms are summed in float64.
    Summing ``B`` non-negative terms in any order errs by at most :math:`\gamma_{B-1} \le (B-1)u` relatively
    (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §4.2, Eq. 4.4 — it holds for every order,
    hence for whatever torch's kernel does); the squares, the block square root, its float64 square and the float64
    sum of ``m`` terms add a few ``u`` and ``m·u₆₄``; the float64 reference itself errs by ``(d + 1)·u₆₄``. With
    :math:`\delta = 2\big((B + 4)u + (m + d + 8)u_{64}\big)` (factor 2 of slack) and an absolute term ``η`` for
    squares that underflow, the value :math:`S_i` that :func:`float64_row_norms` squares satisfies
    :math:`|\hat S_i - S_i| \le \delta \hat S_i + \eta` (for δ < 0.1). Returns ``(estimates float64 (n,), bad,
    δ, η)``; bad rows have estimate ``+inf``.

    Bad rows: a NaN entry makes the estimate NaN, an Inf entry makes it infinite. A row whose squared norm might
    overflow the dtype (estimate above a quarter of its largest value, infinite ones included) gets its norm from
    :func:`row_norms`, so that ``bad`` is exactly what :func:`row_norms` says (:func:`_finish_estimates`).

    ``max_squares`` (float64 ``(n,)`` on the CPU), if given, receives each row's largest float64 square, exactly,
    for :func:`float64_row_norms`: the kernel finds it in the same pass (on the bits, NaN for a row holding one);
    elsewhere it is ``NaN`` (not known: :func:`float64_row_norms` then finds it itself).
    """
    n, d = x.shape
    if max_squares is not None and not (
        max_squares.dtype == torch.float64 and max_squares.device.type == "cpu" and max_squares.shape == (n,)
        and max_squares.is_contiguous()
    ):  # the kernel writes n doubles there
        raise ValueError(f"max_squares must be a contiguous float64 CPU tensor of shape ({n},), got "
                         f"{max_squares.dtype} {tuple(max_squares.shape)} on {max_squares.device}")
    if _kernel_sqnorms_apply(x):
        est, delta = _kernel_sqnorms(x, max_squares)
        return _finish_estimates(x, est, delta)
    if max_squares is not None:
        max_squares.fill_(float("nan"))
    m = d // NORM_BLOCK
    parts = []
    if m:
        parts.append(torch.linalg.vector_norm(x[:, : m * NORM_BLOCK].reshape(n, m, NORM_BLOCK), dim=-1))
    if d % NORM_BLOCK:
        parts.append(torch.linalg.vector_norm(x[:, m * NORM_BLOCK :], dim=1, keepdim=True))
    blocks = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    est = blocks.to(torch.float64).square().sum(dim=1)
    u, u64 = torch.finfo(x.dtype).eps / 2, torch.finfo(torch.float64).eps / 2
    return _finish_estimates(x, est, 2.0 * ((NORM_BLOCK + 4) * u + (blocks.shape[1] + d + 8) * u64))


def _kernel_sqnorms_apply(x: Tensor) -> bool:
    return (
        HAVE_NORM_KERNEL and kernel_readable(x) and x.dtype in (torch.float32, torch.float64)
        and x.dim() == 2 and x.shape[0] > 0 and x.shape[1] > 0 and x.stride(1) == 1
        and (x.stride(0) >= x.shape[1] or x.shape[0] == 1)  # not an expanded (stride 0) or overlapping layout
        and not (x.requires_grad and torch.is_grad_enabled())
    )


def _kernel_sqnorms(x: Tensor, max_squares: Tensor | None = None) -> tuple[Tensor, float]:
    r"""The squared row norms from the C kernel (``_normkernel.c``), float64 ``(n,)``, and their relative bound δ.

    The kernel adds the exact float64 squares of float32 values (rounded ones for float64, ``u₆₄`` each) in a fixed
    order: a sum of ``d`` non-negative terms in any order errs by at most :math:`\gamma_{d-1} S` (Higham, §4.2,
    Eq. 4.4). :func:`float64_row_norms` (exact sums on grids) is within :math:`(d + 1)u_{64} S` of the exact sum, plus
    an absolute :math:`d\,2^{-960}` that ``η`` covers; so they differ by at most about :math:`2(d + 1)u_{64} S`:
    :math:`\delta = 2\cdot 2 (d + 4) u_{64}` (factor 2 of slack) — about 4.4·10⁻¹⁰ at d = 10⁶, where the blocked
    torch estimate's δ is 1.6·10⁻⁵, so rows are uncertain only when their norms nearly tie.
    """
    n, d = x.shape
    out = torch.empty(n, dtype=torch.float64)
    _normkernel.sqnorms(
        x.data_ptr(), n, d, max(x.stride(0), d), x.dtype == torch.float64, out.data_ptr(),
        team_threads(n * d), 0 if max_squares is None else max_squares.data_ptr(),
    )
    return out, 4.0 * (d + 4) * (torch.finfo(torch.float64).eps / 2)


def _finish_estimates(x: Tensor, est: Tensor, delta: float) -> tuple[Tensor, Tensor, float, float]:
    """Bad rows exactly as :func:`row_norms` flags them (a NaN estimate, or an estimate so large that the squared
    norm may overflow the dtype of ``x``: those rows' norms are taken by :func:`row_norms`), ``+inf`` estimates on
    them, and the absolute term ``η`` for squares that underflow.

    Rows whose :func:`float64_row_norms` is ``+inf`` without being bad (a float64 square of at least
    ``2^(1022 − L)``: its grid would overflow) get a ``+inf`` estimate too, so that the bound holds on them: a row
    whose estimate exceeds ``2^(1021 − L)`` (below any such row's, δ < 0.1) has its largest square looked up."""
    d = x.shape[1]
    info = torch.finfo(x.dtype)
    headroom, _ = exact_sum_folds(d)
    eta = 4.0 * d * (info.smallest_normal + TINY**2)  # squares that underflow, or of entries below TINY
    top = float(est.detach().max()) if est.numel() else 0.0  # NaN if any estimate is NaN
    if top <= min(info.max / 4, 2.0 ** (1021 - headroom)):  # the usual case: no row is bad or huge
        return est, torch.zeros(est.shape, dtype=torch.bool, device=est.device), delta, eta
    bad = torch.isnan(est)
    suspect = (~bad & (est > info.max / 4)).nonzero().flatten()
    if suspect.numel():
        bad[suspect] = row_norms(x.index_select(0, suspect.to(x.device)))[1].to(bad.device)
    est = torch.where(bad, torch.full_like(est, float("inf")), est)
    huge = (~bad & (est > 2.0 ** (1021 - headroom))).nonzero().flatten()
    if huge.numel():
        with torch.no_grad():
            largest = x.index_select(0, huge.to(x.device)).abs().amax(dim=1).to(torch.float64).square().cpu()
        over = _grid_constants(largest, headroom, 1)[1] | torch.isinf(largest)
        est[huge[over.to(huge.device)]] = float("inf")  # (over is on the CPU, huge where est is)
    return est, bad, delta, eta


def smallest_norms_keys(x: Tensor, k: int, exact_cut: bool = True) -> tuple[Tensor, Tensor]:
    """Keys that put the rows of ``x`` in the order of :func:`float64_row_norms` around the ``k``-th smallest, and the
    bad rows: float64 ``(n,)``, the exact float64 norm on the rows that could be the ``k``-th smallest, ``-inf`` on
    rows surely below it, ``+inf`` on rows surely above it and on bad rows.

    So ``cge_weights(keys, n - k)`` (or any rule that compares rows with the ``k``-th smallest norm) decides what it
    would on ``float64_row_norms(x, bad)``, at the cost of one streaming pass (:func:`row_sqnorm_estimates`) and the
    float64 norms of the few rows whose interval ``[Ŝ(1−2δ) − η, Ŝ(1+2δ) + η]`` may contain the ``k``-th smallest
    value: if ``L`` and ``H`` are the ``k``-th smallest lower and upper ends, that value lies in ``[L, H]``; a row
    whose upper end is below ``L`` is below it, one whose lower end is above ``H`` above it (fewer than ``k`` rows
    are surely below and at most ``n − k`` surely above, so the ``k``-th smallest key is the exact value of a row in
    between). An attacker who places rows in the uncertain band pays for their exact norms, at most what computing
    every norm in float64 costs; when bad rows reach the ``k``-th place every norm is computed in float64.

    ``exact_cut=False`` (for a caller that only compares keys, as CGE does): when a single row is uncertain it is the
    ``k``-th smallest (at most ``k − 1`` rows are surely below, at least ``k`` rows are not surely above), and no other
    row can tie with it (a tie would put that row's interval in ``[L, H]`` too), so its key is its estimate — finite,
    between the ``−inf`` and ``+inf`` keys — and no float64 norm is computed. The order of the keys, and so every
    comparison, is that of the exact norms.
    """
    largest = torch.empty(x.shape[0], dtype=torch.float64)
    est, bad, delta, eta = row_sqnorm_estimates(x, largest)
    lo = torch.where(bad, est, est * (1.0 - 2.0 * delta) - eta)
    hi = torch.where(bad, est, est * (1.0 + 2.0 * delta) + eta)
    low_cut = torch.kthvalue(lo, k).values
    high_cut = torch.kthvalue(hi, k).values
    if not bool(torch.isfinite(high_cut)):
        return float64_row_norms(x, bad, max_squares=largest), bad
    below = hi < low_cut
    unsure = ~below & ~(lo > high_cut) & ~bad
    keys = torch.where(below, torch.full_like(est, float("-inf")), torch.full_like(est, float("inf")))
    idx = unsure.nonzero().flatten()
    if not exact_cut and idx.numel() == 1:
        keys[idx] = est[idx].sqrt()
        return keys, bad
    keys[idx] = float64_row_norms(
        x, torch.zeros_like(idx, dtype=torch.bool), rows=idx, max_squares=largest[idx.cpu()]
    ).to(keys.device)
    return keys, bad


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


def new_rows(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised tensor of ``shape`` with the dtype and device of ``like``, for a rule's ``(n, d)`` output.

    A fresh CPU allocation of hundreds of MB is mostly page faults: glibc maps it anew on every call and the kernel
    hands out 4 KiB pages one fault at a time, so writing ``x * s`` into a fresh 200 MB tensor took 250–450 ms where
    the arithmetic takes 20 ms (n = 50, d = 10⁶, float32, measured in docs/benchmarks.md). numpy advises the kernel
    to back large arrays with transparent huge pages (``madvise(MADV_HUGEPAGE)``, numpy's default on Linux), which
    cuts those faults by 512×; torch's CPU allocator does so only when ``THP_MEM_ALLOC_ENABLE=1`` was set before it
    first allocated. So a CPU output of at least :data:`HUGE_OUTPUT_BYTES` in a dtype numpy has is a numpy array
    seen as a tensor (``torch.from_numpy``: same memory, freed with the tensor; only ``resize_`` is refused);
    anything else comes from ``torch.empty``. The values written into it are the same either way.
    """
    n_bytes = like.element_size()
    for s in shape:
        n_bytes *= s
    np_dtype = _NUMPY_DTYPES.get(like.dtype)
    if like.device.type != "cpu" or np_dtype is None or n_bytes < HUGE_OUTPUT_BYTES:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    return torch.from_numpy(np.empty(shape, dtype=np_dtype))


def scale_rows(x: Tensor, scales: Tensor) -> Tensor:
    """``x * scales[:, None]`` as a new tensor (never in place), in the dtype of ``x`` (output from
    :func:`new_rows`: the same values as ``x * scales[:, None]``, without its page faults)."""
    s = scales.to(device=x.device, dtype=x.dtype)[:, None]
    if torch.is_grad_enabled() and (x.requires_grad or s.requires_grad):
        return x * s  # out= is not differentiable
    return torch.mul(x, s, out=new_rows(tuple(x.shape), x))


def scale_rows_(x: Tensor, scales: Tensor) -> Tensor:
    """``x[i] *= scales[i]`` in place; returns ``x``. For a caller that owns ``x`` (``PreAggregator.mix_``).

    The values are those of :func:`scale_rows` (the same elementwise product in the dtype of ``x``; a factor of 1
    leaves a row as ``x * 1`` does, NaN, ±0 and ±Inf included — only a signalling NaN may keep its quiet bit
    unset), written into memory that is already mapped: no fresh ``(n, d)`` tensor, no page faults. On one CPU
    thread only the rows whose factor is not 1 are touched (one read and write of each clipped row); with more
    threads, or off the CPU, one ``mul_`` over every row: a parallel op per row costs a barrier of the thread team
    each, and on the 2-core development machine under load 25 clipped rows took 388 ms that way against 28 ms for
    the one op (docs/benchmarks.md).
    """
    s = scales.to(device=x.device, dtype=x.dtype)
    rows = (scales != 1).nonzero().flatten().tolist()
    if not rows:
        return x
    if x.device.type != "cpu" or torch.get_num_threads() > 1:
        return x.mul_(s[:, None])
    for i in rows:
        x[i].mul_(s[i])
    return x


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
