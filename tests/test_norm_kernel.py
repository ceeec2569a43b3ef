"""The C kernel of the one-pass squared row norms (``_normkernel.c``, through ``_rowops.row_sqnorm_estimates``):
its estimates keep the error bound they state against ``float64_row_norms``, flag bad rows as ``row_norms`` does,
and give the same bits whatever the number of threads or the other rows."""

from __future__ import annotations

import pytest
import torch

from phalanx.aggregators import _rowops
from test_cge import count_float64_rows

pytestmark = pytest.mark.skipif(_rowops._normkernel is None, reason="the C norm kernel is not built")


@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel is built: these tests use it even where ``PHALANX_NO_KERNEL=1`` turned it off for the rest."""
    monkeypatch.setattr(_rowops, "HAVE_NORM_KERNEL", True)


def _reference(x: torch.Tensor) -> torch.Tensor:
    """The squared norms the estimates must be close to: ``float64_row_norms`` squared (before its ``+inf``)."""
    return _rowops.float64_row_norms(x, torch.zeros(x.shape[0], dtype=torch.bool)).square()


def _inputs() -> list[torch.Tensor]:
    """Full-precision rows (so the float64 sums round), widths below, across and far past the kernel's column block
    and lane count, scales from 1e-20 to 1e15, and a strided view (a column slice of a wider matrix)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for n, d in [(1, 1), (3, 15), (5, 17), (4, 32768), (6, 32769), (9, 70001), (2, 200000)]:
        scale = 10.0 ** torch.randint(-20, 16, (n, 1), generator=g).double()
        for dtype in (torch.float32, torch.float64):
            out.append((torch.rand(n, d, generator=g, dtype=torch.float64) * scale).to(dtype))
    wide = torch.randn(7, 5000, generator=g)
    out.append(wide[:, 3:4003])
    return out


def test_the_kernel_takes_float32_and_float64_rows_on_the_cpu() -> None:
    x = torch.randn(3, 10)
    assert _rowops._kernel_sqnorms_apply(x) and _rowops._kernel_sqnorms_apply(x.double())
    assert not _rowops._kernel_sqnorms_apply(x.half())
    assert not _rowops._kernel_sqnorms_apply(x.T)  # columns not contiguous
    assert not _rowops._kernel_sqnorms_apply(x[:1].expand(3, 10))  # rows that overlap (stride 0)
    assert _rowops._kernel_sqnorms_apply(x[1:2, 2:])  # one row, a stride of its own
    assert not _rowops._kernel_sqnorms_apply(x.clone().requires_grad_())


def test_kernel_estimates_keep_their_bound() -> None:
    """|Ŝ − S| ≤ δŜ + η for every row, with the δ the kernel states (about 2·2d·u₆₄). Mutant: δ = 0 (the estimates
    taken as exact) — the float64 sums of full-precision squares round, in the kernel's order and in torch's, so
    some row breaks the mutant's bound."""
    mutant_broken = False
    for x in _inputs():
        assert _rowops._kernel_sqnorms_apply(x)
        est, bad, delta, eta = _rowops.row_sqnorm_estimates(x)
        assert not bool(bad.any()) and delta < 1e-8
        err = (est - _reference(x)).abs()
        assert bool((err <= delta * est + eta).all()), (x.dtype, x.shape)
        mutant_broken |= bool((err > 0).any())
    assert mutant_broken


def test_bad_rows_are_those_row_norms_flags() -> None:
    """NaN, ±Inf, a float32 row whose squared norm overflows float32 (finite in float64: ``row_norms`` decides),
    a float32 row just below that, a float64 row whose squares overflow float64."""
    x = torch.randn(6, 40000, dtype=torch.float64)
    x[0, 5], x[1, 39999], x[2, 0] = float("nan"), float("inf"), float("-inf")
    x[3, :2] = 2e19  # squared norm 8e38 > float32's max 3.4e38
    x[4, 0] = 1.5e19  # squared norm 2.25e38 + ~4e4: above a quarter of the max, below the max
    for dtype in (torch.float32, torch.float64):
        y = x.to(dtype)
        est, bad, _, _ = _rowops.row_sqnorm_estimates(y)
        want = _rowops.row_norms(y)[1]
        assert torch.equal(bad, want), dtype
        assert bool(torch.isinf(est[bad]).all()) and bool(torch.isfinite(est[~bad]).all())
    assert _rowops.row_sqnorm_estimates(x.float())[1].tolist() == [True, True, True, True, False, False]
    assert _rowops.row_sqnorm_estimates(x)[1].tolist() == [True, True, True, False, False, False]
    huge = torch.full((2, 3), 1e200, dtype=torch.float64)
    huge[1] = 1.0
    est, bad, _, _ = _rowops.row_sqnorm_estimates(huge)
    assert torch.equal(bad, _rowops.row_norms(huge)[1]) and bad.tolist() == [True, False]


def test_the_same_bits_whatever_the_threads_and_the_other_rows() -> None:
    """Rows are summed in groups of four and blocks are shared between threads; neither changes a row's bits."""
    x = torch.rand(11, 70001, generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _rowops._kernel_sqnorms(x)[0]
        torch.set_num_threads(2)
        two = _rowops._kernel_sqnorms(x)[0]
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(2))
    assert torch.equal(_rowops._kernel_sqnorms(x[perm])[0], one[perm])
    assert torch.equal(_rowops._kernel_sqnorms(x[5:6])[0], one[5:6])
    assert torch.equal(_rowops._kernel_sqnorms(x.double())[0], one)  # float32 squares are exact in float64


def test_the_kernel_refuses_invalid_arguments() -> None:
    out = torch.empty(2, dtype=torch.float64)
    x = torch.ones(2, 3)
    for args in [(0, 3, 3), (2, 0, 3), (2, 3, 2)]:  # no rows, no columns, a row stride shorter than a row
        with pytest.raises(ValueError, match=r"_normkernel\.sqnorms"):
            _rowops._normkernel.sqnorms(x.data_ptr(), *args, False, out.data_ptr(), 1)


def test_the_narrow_band_spares_float64_norms_on_near_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten float32 rows of width 10⁵ whose squared norms are 1e5 + 0.1·k (k = 0 … 9: 10⁻⁶ apart relatively), CGE's
    keys at the 8th norm: the block norms' band (δ ≈ 1.6·10⁻⁵) holds every row, whose float64 norms are then
    computed; the kernel's (δ ≈ 4.4·10⁻¹¹) separates them, and none is (the one row left at the cut is keyed by its
    estimate). Built, not drawn, so that no CPU's rounding moves a row across a band. Mutant: the kernel path given
    the block path's δ — its band holds them again."""
    counted = count_float64_rows(monkeypatch)
    x = torch.ones(10, 100_000)
    x[:, 0] = torch.sqrt(1.0 + 0.1 * torch.arange(10, dtype=torch.float64)).float()

    def rows_paid(kernel: bool) -> int:
        monkeypatch.setattr(_rowops, "HAVE_NORM_KERNEL", kernel)
        counted.clear()
        _rowops.smallest_norms_keys(x, 8, exact_cut=False)
        return sum(counted)

    assert rows_paid(kernel=False) == 10 and rows_paid(kernel=True) == 0
    wide = 2.0 * ((_rowops.NORM_BLOCK + 4) * torch.finfo(torch.float32).eps / 2)
    real_kernel = _rowops._kernel_sqnorms
    monkeypatch.setattr(_rowops, "_kernel_sqnorms", lambda x, largest=None: (real_kernel(x, largest)[0], wide))
    assert rows_paid(kernel=True) == 10
