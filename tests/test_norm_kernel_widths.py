"""The norm kernel's two vector widths (``_normkernel.c``: sixteen float64 lanes per vector on AVX-512, four
elsewhere, ``_normkernel_narrow.h``) and the order of additions its estimates state.

The estimates are not exact, so their bits are defined by their order: each row cut into blocks of 32,768 columns;
in a block, lane k (k < 16) adds the float64 squares of columns k, k + 16, … in order, the lanes are added in
order, then the tail (the last len mod 16 columns) in order; the blocks' sums are added in order. A NumPy
reference below computes exactly that; both widths must give its bits, and so must the row maxima and the exact
norms. A reference with another lane count is shown to differ (the comparison can fail), and rows on both sides of the
flush boundary 2⁻⁴⁸⁰ pin where the sums start counting an entry.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from phalanx.aggregators import _rowops

pytestmark = pytest.mark.skipif(_rowops._normkernel is None, reason="the C norm kernel is not built")

BLOCK = 32768
TINY = 2.0**-480


def _cpu_has_avx512f() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return sys.platform.startswith("linux") and cpuinfo.exists() and " avx512f" in cpuinfo.read_text()


WIDTHS = [4, 16] if _cpu_has_avx512f() else [4]


@pytest.fixture
def width() -> object:
    """Restores the width the kernel chose at import after a test switched it."""
    before = _rowops._normkernel.vector_width()
    yield before
    _rowops._normkernel.vector_width(before)


def _reference_row(row: np.ndarray, lanes: int = 16) -> float:
    """The estimate of one row in the kernel's stated order (``lanes`` = 16; another value is the mutant)."""
    values = np.where(np.abs(row) < TINY, 0.0, row.astype(np.float64))
    total = 0.0
    for start in range(0, len(values), BLOCK):
        block = values[start:start + BLOCK]
        full = len(block) // lanes * lanes
        s = 0.0
        if full:
            lane_sums = np.cumsum(np.square(block[:full]).reshape(-1, lanes), axis=0)[-1]  # sequential per lane
            for lane_sum in lane_sums:
                s += float(lane_sum)
        for v in block[full:]:
            s += float(v) * float(v)
        total += s
    return total


def _rows() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    out = []
    for n, d in [(1, 1), (2, 15), (3, 16), (5, 17), (4, 1000), (3, 32768), (6, 32769), (2, 70001)]:
        scale = 10.0 ** torch.randint(-20, 16, (n, 1), generator=g).double()
        for dtype in (torch.float32, torch.float64):
            out.append((torch.randn(n, d, generator=g, dtype=torch.float64) * scale).to(dtype))
    tiny = torch.randn(4, 100, generator=g, dtype=torch.float64)
    tiny[0, ::3] = 1e-150  # below 2^-480: read as 0 in the sums
    tiny[1] = TINY  # on the boundary: kept
    tiny[2] = float(np.nextafter(TINY, 0.0))  # just below it, the whole row: sums 0, its maximum as it is
    tiny[3, ::2] = TINY
    tiny[3, 1::2] = float(np.nextafter(TINY, 0.0))  # both sides of the boundary
    out.append(tiny)
    out.append(torch.randn(7, 5000, generator=g)[:, 3:4003])  # strided rows
    return out


def _estimates(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    maxima = torch.empty(x.shape[0], dtype=torch.float64)
    est, _ = _rowops._kernel_sqnorms(x, maxima)
    return est.numpy(), maxima.numpy()


def test_the_reference_tells_lane_counts_apart() -> None:
    """The mutant reference (eight lanes) differs from the stated order on these rows: the check below can fail."""
    differing = 0
    for x in _rows():
        for row in x.numpy():
            differing += _reference_row(row) != _reference_row(row, lanes=8)
    assert differing >= 10


@pytest.mark.parametrize("lanes_per_vector", WIDTHS)
def test_every_width_gives_the_stated_order_and_the_same_maxima_and_exact_norms(
    lanes_per_vector: int, width: object
) -> None:
    _rowops._normkernel.vector_width(lanes_per_vector)
    for x in _rows():
        est, maxima = _estimates(x)
        rows = x.numpy()
        assert [float(e) for e in est] == [_reference_row(r) for r in rows], (x.dtype, tuple(x.shape))
        # the largest square of the row as it is (the flush applies to the sums, not to the maximum)
        assert np.array_equal(maxima, np.abs(rows.astype(np.float64)).max(axis=1) ** 2)
        bad = torch.zeros(x.shape[0], dtype=torch.bool)
        kernel = _rowops.float64_row_norms(x, bad)
        assert torch.equal(kernel, _rowops._torch_exact_sqnorms(x, None, *_rowops.exact_sum_folds(x.shape[1])).sqrt())


def test_a_nan_row_keeps_its_nan_maximum_on_every_width(width: object) -> None:
    x = torch.ones(3, 40)
    x[1, 33] = float("nan")
    x[2, 5] = float("inf")
    for lanes_per_vector in WIDTHS:
        _rowops._normkernel.vector_width(lanes_per_vector)
        _, maxima = _estimates(x)
        assert maxima[0] == 1.0 and np.isnan(maxima[1]) and maxima[2] == np.inf


def test_the_width_follows_the_cpu_and_refuses_what_it_cannot_run(width: object) -> None:
    assert width == (16 if _cpu_has_avx512f() else 4)
    with pytest.raises(ValueError, match="w must be 0"):
        _rowops._normkernel.vector_width(8)
    if not _cpu_has_avx512f():
        with pytest.raises(ValueError, match="AVX-512F"):
            _rowops._normkernel.vector_width(16)
    assert _rowops._normkernel.vector_width(4) == width
    assert _rowops._normkernel.vector_width() == 4
