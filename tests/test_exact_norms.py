"""The definition of a float64 row norm (``_rowops.float64_row_norms``): squares pre-rounded onto float64 grids and
summed exactly, so that the value depends on neither the order of the additions, nor the thread count, nor the path
(the C kernel or torch). Each property is checked together with a mutant that the check rejects."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from phalanx.aggregators import _rowops

needs_kernel = pytest.mark.skipif(not _rowops.HAVE_NORM_KERNEL, reason="the C norm kernel is not built or is off")


def _torch_path(
    x: torch.Tensor, rows: torch.Tensor | None = None, max_squares: torch.Tensor | None = None
) -> torch.Tensor:
    """The squared norms by the torch path (the C kernel bypassed)."""
    headroom, folds = _rowops.exact_sum_folds(x.shape[1])
    return _rowops._torch_exact_sqnorms(x, rows, headroom, folds, max_squares)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same values, NaN where the other has NaN."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a.masked_fill(nan, 0.0), b.masked_fill(nan, 0.0))


def _norms(x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    k = x.shape[0] if rows is None else rows.numel()
    return _rowops.float64_row_norms(x, torch.zeros(k, dtype=torch.bool), rows)


def _wide_rows(n: int, d: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows whose entries span many binades (the sums then round in every fold)."""
    g = torch.Generator().manual_seed(seed)
    scale = 2.0 ** torch.randint(-40, 40, (n, d), generator=g).double()
    return (torch.randn(n, d, generator=g, dtype=torch.float64) * scale).to(dtype)


def _special_rows(dtype: torch.dtype) -> torch.Tensor:
    big = 1e200 if dtype == torch.float64 else 3e38
    tiny = 1e-310 if dtype == torch.float64 else 1e-45
    rows = [
        [float("nan"), 1.0, 2.0, 3.0], [float("inf"), 1.0, 2.0, 3.0], [float("nan"), float("inf"), 1.0, -1.0],
        [-float("inf"), 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [-0.0, 0.0, -0.0, 0.0], [big, 1.0, -big, 0.5],
        [tiny, -tiny, tiny, 0.0], [1.0, 1e-30, -1e-30, 1e-20],
    ]
    return torch.tensor(rows, dtype=dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_and_torch_give_the_same_bits(dtype: torch.dtype) -> None:
    """Below, at, across and far past a column chunk; a strided (transposed) view; row subsets (empty, repeated,
    unordered); NaN, ±Inf, zero, signed-zero, huge and subnormal rows; 1 and 2 threads; and the largest squares
    handed over by the estimates' pass. Mutant: the torch path without its second fold differs."""
    chunk = _rowops.COLUMN_CHUNK
    cases = [_wide_rows(n, d, dtype, seed) for seed, (n, d) in enumerate(
        [(1, 1), (3, 7), (2, chunk), (3, chunk + 1), (2, 3 * chunk - 5), (5, 17)])]
    cases.append(_wide_rows(2 * chunk + 3, 3, dtype, 9).T)
    cases.append(_special_rows(dtype))
    threads = torch.get_num_threads()
    try:
        for x in cases:
            want = _torch_path(x)
            for t in (1, 2):
                torch.set_num_threads(t)
                assert _same(_rowops.float64_row_norms(x, torch.zeros(x.shape[0], dtype=torch.bool)),
                             want.sqrt()), (tuple(x.shape), t)
            largest = torch.empty(x.shape[0], dtype=torch.float64)
            _rowops.row_sqnorm_estimates(x, largest)
            for pick in ([], [0], [x.shape[0] - 1, 0, x.shape[0] - 1]):
                rows = torch.tensor(pick, dtype=torch.long)
                got = _rowops.float64_row_norms(x, torch.zeros(len(pick), dtype=torch.bool), rows, largest[rows])
                assert _same(got, want[rows].sqrt()), pick
    finally:
        torch.set_num_threads(threads)
    x = _wide_rows(4, 5000, dtype, 11)
    headroom, _ = _rowops.exact_sum_folds(5000)
    assert not torch.equal(_rowops._torch_exact_sqnorms(x, None, headroom, 1), _torch_path(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_any_order_of_the_columns_gives_the_same_bits(dtype: torch.dtype) -> None:
    """Permuting the columns reorders every addition (in torch's reductions and in the kernel's lanes); the norms
    keep their bits. Mutant: the former definition (float64 chunk sums) changes them."""
    g = torch.Generator().manual_seed(4)
    x = _wide_rows(6, 3 * _rowops.COLUMN_CHUNK + 11, dtype, 4)
    want = _norms(x)
    for _ in range(3):
        perm = torch.randperm(x.shape[1], generator=g)
        assert torch.equal(_norms(x[:, perm].contiguous()), want)
        assert torch.equal(_torch_path(x[:, perm]).sqrt(), want)

    def chunk_sums(y: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(y.shape[0], dtype=torch.float64)
        for s in range(0, y.shape[1], _rowops.COLUMN_CHUNK):
            total += y[:, s : s + _rowops.COLUMN_CHUNK].double().square().sum(dim=1)
        return total

    perm = torch.randperm(x.shape[1], generator=g)
    assert not torch.equal(chunk_sums(x), chunk_sums(x[:, perm]))


def _folds_numpy(row: np.ndarray, headroom: int, folds: int) -> list[np.ndarray]:
    """The fold parts r of each fold, computed by numpy (a third implementation of the same definition)."""
    s = row.astype(np.float64) ** 2
    _, e = math.frexp(float(s.max()))
    p = e + headroom + 1
    parts = []
    for _ in range(folds):
        grid = math.ldexp(1.5, max(p, _rowops.GRID_FLOOR))
        r = (s + grid) - grid
        parts.append(r)
        s = s - r
        p += headroom - 51
    return parts


def test_every_fold_sums_exactly() -> None:
    """Each fold's parts sum to the same float64 as their correctly rounded sum (``math.fsum``), forwards,
    backwards and shuffled, and the definition is their float64 sum; with every part at its largest. Mutant: a
    sum of the squares themselves (no grid): on the wide row its orders disagree."""
    rng = np.random.default_rng(0)
    d = 4096
    worst = np.full(d, np.float32(1.9999999))  # every square at the top of the binade: the largest partial sums
    rows = [worst, rng.standard_normal(d).astype(np.float32) * np.float32(2.0) ** rng.integers(-30, 30, d)]
    headroom, folds = _rowops.exact_sum_folds(d)
    for row in rows:
        parts = _folds_numpy(row, headroom, folds)
        for r in parts:
            exact = math.fsum(r.tolist())
            for order in (r, r[::-1], rng.permutation(r)):
                assert float(np.add.accumulate(order)[-1]) == exact
        total = math.fsum(parts[0].tolist())
        for r in parts[1:]:
            total += math.fsum(r.tolist())
        assert _norms(torch.from_numpy(row)[None]).item() == math.sqrt(total)
    raw = rows[1].astype(np.float64) ** 2
    sums = {float(np.add.accumulate(order)[-1]) for order in (raw, raw[::-1], rng.permutation(raw))}
    assert len(sums | {math.fsum(raw.tolist())}) > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_error_is_within_the_stated_bound(dtype: torch.dtype) -> None:
    """Against the exact sum of the squares (fractions): within ``(d + 1)u₆₄·S`` plus ``d·2⁻⁹⁶⁰``, the bound
    ``float64_row_norms`` states (the estimates' δ relies on it). Mutant: one fold only exceeds it."""
    u = 2.0**-53
    d = 3000
    x = _wide_rows(4, d, dtype, 7)
    x[0, :] = x[0, :].abs().max()  # all at the top: the largest partial sums
    headroom, _ = _rowops.exact_sum_folds(d)
    got = _torch_path(x)
    one_fold = _rowops._torch_exact_sqnorms(x, None, headroom, 1)
    worst = 0.0
    for i in range(x.shape[0]):
        exact = sum(Fraction(v) ** 2 for v in x[i].double().tolist())
        bound = (d + 1) * u * exact + d * Fraction(2) ** -960
        assert abs(Fraction(got[i].item()) - exact) <= bound, i
        worst = max(worst, float(abs(Fraction(one_fold[i].item()) - exact) / bound))
    assert worst > 1.0


def test_float32_and_float64_copies_get_the_same_norms() -> None:
    x = _wide_rows(5, 70_001, torch.float32, 3)
    assert torch.equal(_norms(x), _norms(x.double()))
    assert torch.equal(_torch_path(x[:, :999].half().float()), _torch_path(x[:, :999].half()))


def test_squares_too_large_for_the_grid_give_inf_on_both_paths() -> None:
    """A float64 square of at least ``2^(1022 − L)`` puts ``P₁`` above 1023: ``+inf`` (the same on both paths);
    just below, a finite norm. Rows of 4: ``L = 2``, the threshold ``2^1020``."""
    assert _rowops.exact_sum_folds(4)[0] == 2
    below = 1.9 * 2.0**509  # square 3.61·2^1018
    x = torch.tensor([[2.0**510, 1.0, 0.0, 0.0], [below, 1.0, 0.0, 0.0]], dtype=torch.float64)
    for got in (_norms(x), _torch_path(x).sqrt()):
        assert math.isinf(got[0].item()) and math.isfinite(got[1].item()) and got[1].item() >= below


def test_the_folds_follow_the_row_length() -> None:
    assert _rowops.exact_sum_folds(1) == (1, 2)
    assert _rowops.exact_sum_folds(2**24) == (24, 2)
    assert _rowops.exact_sum_folds(2**24 + 1) == (25, 3)
    for bad in (0, 2**40 + 1):
        with pytest.raises(ValueError, match="row length d"):
            _rowops.exact_sum_folds(bad)


@needs_kernel
def test_the_estimates_pass_hands_over_exact_largest_squares() -> None:
    """The largest float64 square of each row from the estimates' pass is torch's ``amax`` of the squares, bit for
    bit (NaN for a row holding a NaN), so ``float64_row_norms`` may skip its own pass."""
    for dtype in (torch.float32, torch.float64):
        x = torch.cat([_wide_rows(6, 40_003, dtype, 5), torch.nn.functional.pad(_special_rows(dtype), (0, 39_999))])
        largest = torch.empty(x.shape[0], dtype=torch.float64)
        _rowops.row_sqnorm_estimates(x, largest)
        assert _same(largest, x.double().square().amax(dim=1))


@needs_kernel
def test_the_kernel_refuses_invalid_arguments() -> None:
    from phalanx.aggregators import _normkernel  # type: ignore[attr-defined]

    x = torch.ones(3, 8)
    out = torch.empty(3, dtype=torch.float64)
    rows = torch.tensor([0, 3])
    ok = (x.data_ptr(), 3, 8, 8, False, 0, 3, 3, 2, out.data_ptr(), 1)
    _normkernel.exact_sqnorms(*ok)
    for i, value in [(1, 0), (2, 0), (3, 7), (7, 2), (7, 41), (8, 1), (8, 9), (10, 0), (9, 0)]:
        args = list(ok)
        args[i] = value
        with pytest.raises(ValueError, match="invalid arguments"):
            _normkernel.exact_sqnorms(*args)
    with pytest.raises(ValueError, match="out of range"):
        _normkernel.exact_sqnorms(x.data_ptr(), 3, 8, 8, False, rows.data_ptr(), 2, 3, 2, out.data_ptr(), 1)
    with pytest.raises(ValueError, match="max_squares has shape"):  # the kernel would read past a short one
        _rowops.float64_row_norms(x, torch.zeros(3, dtype=torch.bool), max_squares=torch.ones(2, dtype=torch.float64))
    for wrong in (torch.empty(3), torch.empty(2, dtype=torch.float64), torch.empty(6, dtype=torch.float64)[::2]):
        with pytest.raises(ValueError, match="max_squares must be"):  # the kernel would write past it
            _rowops.row_sqnorm_estimates(x, wrong)
    with pytest.raises(TypeError, match="rows must be"):  # a mask read as indices 0/1 would take the wrong rows
        _rowops.float64_row_norms(x, torch.zeros(1, dtype=torch.bool), rows=torch.tensor([False, False, True]))


def test_the_gradient_flows_through_the_folds() -> None:
    """With autograd (torch path, out of place) the norms keep their bits, and their gradient is ``x/‖x‖``: each
    fold is ``(s + M) − M``, whose derivative in ``s`` is 1, and the remainders carry none."""
    x = _wide_rows(4, 2 * _rowops.COLUMN_CHUNK + 77, torch.float64, 8).requires_grad_()
    norms = _rowops.float64_row_norms(x, torch.zeros(4, dtype=torch.bool))
    assert torch.equal(norms.detach(), _norms(x.detach()))
    (grad,) = torch.autograd.grad(norms.sum(), x)
    want = x.detach() / norms.detach()[:, None]
    assert torch.allclose(grad, want, rtol=8 * 2.0**-52, atol=0.0)


@pytest.mark.parametrize("kernel", [True, False])
def test_rows_whose_norm_is_inf_by_the_grid_are_inf_in_the_estimates(
    kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finite float64 rows with squares of up to ``2^1018`` (rows of 100: ``L = 7``, ``+inf`` from ``2^1015``) have
    ``+inf`` norms by the definition; their estimates say ``+inf`` too (not bad), so the estimates' bound holds and
    CGE (n = 9, f = 4: the cut among seven such rows, tied) decides as on the definition. Mutant: the estimates left
    finite — CGE then ranks the huge rows apart."""
    monkeypatch.setattr(_rowops, "HAVE_NORM_KERNEL", kernel and _rowops.HAVE_NORM_KERNEL)
    from phalanx import aggregators

    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 100, generator=g, dtype=torch.float64)
    scale = 2.0**509 * torch.linspace(0.4, 1.0, 7, dtype=torch.float64)[:, None]
    x[2:] = x[2:] / x[2:].abs().amax(dim=1, keepdim=True) * scale
    norms = _norms(x)
    assert torch.isinf(norms[2:]).all() and torch.isfinite(norms[:2]).all()
    est, bad, _, _ = _rowops.row_sqnorm_estimates(x)
    assert torch.isinf(est[2:]).all() and not bool(bad.any())
    from phalanx.aggregators.cge import cge_weights

    want = cge_weights(norms, 4)
    assert torch.equal(aggregators.make("cge", f=4).aggregate(x)[1], want)
    real = _rowops._finish_estimates

    def finite(y: torch.Tensor, e: torch.Tensor, delta: float) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        _, b2, d2, eta = real(y.new_zeros(y.shape[0], 1), e, delta)  # a one-column copy: no row is huge there
        return e, b2, d2, eta

    monkeypatch.setattr(_rowops, "_finish_estimates", finite)
    assert not torch.equal(aggregators.make("cge", f=4).aggregate(x)[1], want)


@needs_kernel
def test_float64_entries_below_tiny_count_as_zero_on_both_paths() -> None:
    """Entries below ``2^-480`` (subnormal squares: about 10× slower arithmetic, which a Byzantine row could force)
    count as 0 in the kernel, the torch path and the estimates alike; at ``2^-480`` they count. Mutant: the torch
    path without the flush gives the row of 2^-490s (normal squares, 2^-980) a norm."""
    tiny = _rowops.TINY
    x = torch.tensor([[2.0**-490] * 40 + [1e-160] * 7, [3.0] + [1e-170] * 46, [tiny] * 47, [tiny * 0.999] * 47],
                     dtype=torch.float64)
    want = torch.tensor([0.0, 3.0, math.sqrt(47 * tiny**2), 0.0], dtype=torch.float64)
    assert torch.equal(_norms(x), want) and torch.equal(_torch_path(x).sqrt(), want)
    est, _, delta, eta = _rowops.row_sqnorm_estimates(x)
    assert bool(((est - want.square()).abs() <= delta * est + eta).all())
    headroom, folds = _rowops.exact_sum_folds(x.shape[1])
    real = _rowops.TINY
    try:
        _rowops.TINY = 0.0
        unflushed = _rowops._torch_exact_sqnorms(x, None, headroom, folds)
    finally:
        _rowops.TINY = real
    assert float(unflushed[0]) > 0.0


def test_the_mean_is_one_matrix_vector_product_divided_in_place_with_the_same_bits() -> None:
    """``column_mean``: (1ᵀX)/n from one BLAS product, divided in place (no second fresh (d,) tensor): the bits of
    the product divided out of place, float32 and float64, and a gradient that flows to X as the mean's does."""
    from phalanx.aggregators._rowops import column_mean

    for dtype in (torch.float32, torch.float64):
        x = torch.randn(7, 1000, generator=torch.Generator().manual_seed(3), dtype=dtype)
        expected = (torch.ones(1, 7, dtype=dtype) @ x).squeeze(0) / 7
        assert torch.equal(column_mean(x), expected)
    leaf = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    column_mean(leaf).sum().backward()
    assert leaf.grad is not None and torch.allclose(leaf.grad, torch.full((5, 8), 0.2, dtype=torch.float64))
