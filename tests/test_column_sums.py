"""The column sums of ``mean`` and the attacks' honest mean (``_sumkernel.c`` through ``_rowops.column_mean``).

The definition: the rows added in row order, each addition rounded in the input's dtype, then one division by n.
The kernel must give exactly those bits — on 1 and 2 threads, for every block size, on strided rows — and so must
the torch fallback; each comparison is first shown able to fail (another order of the same additions differs on
the same input).
"""

from __future__ import annotations

import pytest
import torch

from phalanx.aggregators import _rowops
from phalanx.aggregators._rowops import column_mean, row_order_sum

needs_kernel = pytest.mark.skipif(_rowops._sumkernel is None, reason="the C kernel could not be built here")

SIZES = [(1, 1), (1, 9), (2, 3), (3, 4097), (7, 64), (8, 100), (9, 4095), (15, 33), (16, 4096), (17, 8193),
         (127, 300), (128, 300), (200, 16385), (513, 70)]


def _rows(n: int, d: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rows whose scales span eight orders of magnitude, so that the order of the additions shows in the bits."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-4, 4, n, dtype=torch.float64)[torch.randperm(n, generator=g)].to(dtype)
    return torch.randn(n, d, generator=g, dtype=dtype) * scales.unsqueeze(1)


def _kernel(x: torch.Tensor, threads: int = 1, divisor: float = 0.0, columns: int = 0) -> torch.Tensor:
    out = torch.empty(x.shape[1], dtype=x.dtype)
    _rowops._sumkernel.column_sums(
        x.data_ptr(), x.shape[0], x.shape[1], x.stride(0) if x.shape[0] > 1 else x.shape[1],
        x.dtype == torch.float64, divisor, out.data_ptr(), threads, columns,
    )
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (``torch.equal`` takes -0.0 for +0.0)."""
    as_int = torch.int64 if a.dtype == torch.float64 else torch.int32
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(as_int), b.view(as_int))


def _pairwise(x: torch.Tensor) -> torch.Tensor:
    """The same additions in another order (halves summed apart): the mutant every comparison must reject."""
    if x.shape[0] == 1:
        return x[0].clone()
    half = x.shape[0] // 2
    return _pairwise(x[:half]) + _pairwise(x[half:])


def test_the_inputs_tell_the_orders_apart() -> None:
    """The check below can fail: on these inputs another order of the same additions gives other bits."""
    for dtype in (torch.float32, torch.float64):
        for n, d in SIZES:
            if n < 3 or d < 64:
                continue
            x = _rows(n, d, dtype)
            assert not _same_bits(_pairwise(x), row_order_sum(x)), (dtype, n, d)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_adds_the_rows_in_row_order_whatever_the_threads_and_blocks(dtype: torch.dtype) -> None:
    for n, d in SIZES:
        x = _rows(n, d, dtype, seed=n + d)
        expected = row_order_sum(x)
        for threads in (1, 2, 3):
            for columns in (0, 64, 4096):
                assert _same_bits(_kernel(x, threads, 0.0, columns), expected), (n, d, threads, columns)
        if n >= 3 and d >= 64:
            assert not _same_bits(_kernel(x), _pairwise(x))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernels_division_is_torchs_division_by_n(dtype: torch.dtype) -> None:
    for n, d in [(3, 1000), (7, 5000), (10, 4097), (49, 100), (1000, 50)]:
        x = _rows(n, d, dtype, seed=n)
        assert _same_bits(_kernel(x, 1, float(n)), row_order_sum(x).div_(n)), (n, d)
        # the mutant: multiplying by the reciprocal differs in some columns
        assert not _same_bits(_kernel(x, 1, float(n)), row_order_sum(x) * (1.0 / n)) or n in (1, 2)


@needs_kernel
def test_the_kernel_reads_strided_rows_and_only_its_columns() -> None:
    """A view of the first columns of wider rows (row stride > d): the sums of those columns only."""
    for dtype in (torch.float32, torch.float64):
        wide = _rows(30, 5000, dtype, seed=5)
        x = wide[:, :4001]
        assert x.stride(0) == 5000
        assert _same_bits(column_mean(x), row_order_sum(x.contiguous()).div_(30))


@needs_kernel
def test_the_kernel_refuses_arguments_it_cannot_read() -> None:
    x = torch.zeros(4, 10)
    out = torch.empty(10)
    kernel = _rowops._sumkernel
    for bad in [
        (x.data_ptr(), 0, 10, 10, False, 0.0, out.data_ptr(), 1),  # no rows
        (x.data_ptr(), 4, 0, 10, False, 0.0, out.data_ptr(), 1),  # no columns
        (x.data_ptr(), 4, 10, 9, False, 0.0, out.data_ptr(), 1),  # rows overlapping
        (x.data_ptr(), 4, 10, 10, False, 0.0, out.data_ptr(), 0),  # no thread
        (0, 4, 10, 10, False, 0.0, out.data_ptr(), 1),  # no input
        (x.data_ptr(), 4, 10, 10, False, 0.0, out.data_ptr(), 1, -1),  # a negative block size
    ]:
        with pytest.raises(ValueError, match=r"_sumkernel\.column_sums"):
            kernel.column_sums(*bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_path_of_the_mean_gives_the_definitions_bits(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel, the torch fallback (no kernel), a gradient-carrying input and a stride-0 (expanded) input: the
    same bits, the rows added in row order and divided by n."""
    x = _rows(37, 3000, dtype, seed=11)
    expected = row_order_sum(x).div_(37)
    assert _same_bits(column_mean(x), expected)
    with torch.no_grad():
        assert _same_bits(column_mean(x.clone().requires_grad_()), expected)
    leaf = x.clone().requires_grad_()
    out = column_mean(leaf)
    assert _same_bits(out.detach(), expected)
    out.sum().backward()
    assert leaf.grad is not None and torch.equal(leaf.grad, torch.full_like(x, 1.0) / 37)
    monkeypatch.setattr(_rowops, "HAVE_SUM_KERNEL", False)
    assert _same_bits(column_mean(x), expected)
    row = _rows(1, 500, dtype, seed=2)
    assert _same_bits(column_mean(row.expand(6, 500)), row_order_sum(row.expand(6, 500).contiguous()).div_(6))


@pytest.mark.parametrize("threads", [1, 2])
def test_the_mean_is_the_same_on_one_and_two_threads(threads: int) -> None:
    x = _rows(50, 20_000, torch.float32, seed=4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = column_mean(x)
    finally:
        torch.set_num_threads(before)
    assert _same_bits(got, row_order_sum(x).div_(50))


def test_nan_and_inf_propagate_as_in_the_sum() -> None:
    x = torch.ones(9, 20)
    x[3, 0] = float("nan")
    x[2, 1], x[5, 1] = float("inf"), float("-inf")
    x[4, 2] = float("inf")
    got = column_mean(x)
    assert torch.isnan(got[0]) and torch.isnan(got[1]) and got[2] == float("inf")
    assert torch.equal(got[3:], torch.ones(17))


def test_the_benchmark_counts_no_differing_coordinate_against_the_definition(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``benchmarks/column_sums.py`` runs, and its bit count can fail: with the product made pairwise (a mutant
    BLAS) it reports differing coordinates."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "column_sums.py"
    spec = importlib.util.spec_from_file_location("bench_column_sums", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr("sys.argv", ["column_sums.py", "--sizes", "40:300", "--reps", "1"])
    bench.main()
    assert "40, 300 | 0, 0 |" in capsys.readouterr().out
    monkeypatch.setattr(bench, "_product", lambda x: _pairwise(x).div_(x.shape[0]))
    bench.main()
    assert "40, 300 | 0, 0 |" not in capsys.readouterr().out


@needs_kernel
def test_the_mean_runs_on_the_kernel_where_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contiguous float32/float64 CPU rows without a gradient go to the kernel (a spy counts its calls); the other
    paths do not."""
    calls = []
    real = _rowops._sumkernel

    class Spy:
        @staticmethod
        def column_sums(*args: object) -> None:
            calls.append(args)
            real.column_sums(*args)

    monkeypatch.setattr(_rowops, "_sumkernel", Spy)
    column_mean(torch.ones(5, 7))
    column_mean(torch.ones(5, 7, dtype=torch.float64))
    assert len(calls) == 2
    column_mean(torch.ones(7, 5).t())  # strided columns: through a row-major copy
    assert len(calls) == 3
    column_mean(torch.ones(5, 7, requires_grad=True))
    column_mean(torch.ones(5, 7, dtype=torch.float16))
    column_mean(torch._neg_view(torch.ones(5, 7)))
    assert len(calls) == 3


def test_a_column_of_negative_zeros_sums_to_positive_zero() -> None:
    """0 + the rows: as a BLAS product and ``torch.mean`` give, on every path (the mutant without the leading 0
    returns -0.0, which ``torch.equal`` would not see)."""
    x = torch.full((6, 4097), -0.0)
    x[:, 5] = 1.0
    for path in (column_mean, lambda t: row_order_sum(t).div_(6), lambda t: torch.mean(t, dim=0)):
        got = path(x)
        assert not torch.signbit(got).any()
    if _rowops._sumkernel is not None:
        assert not torch.signbit(_kernel(x)).any()


def test_a_negative_bit_view_is_read_with_its_sign() -> None:
    """``z.conj().imag`` is a view of negated memory (``is_neg``): the kernel must not read it raw."""
    z = torch.tensor([[1 + 2j], [3 + 4j]], dtype=torch.complex64)
    x = z.conj().imag
    assert x.is_neg()
    assert column_mean(x).tolist() == [-3.0]
    wide = torch._neg_view(torch.ones(3, 5000))
    assert torch.equal(column_mean(wide), torch.full((5000,), -1.0))


def test_a_column_major_input_gives_the_definitions_bits() -> None:
    """The order of the additions is the definition: a transposed input is summed in row order too (through a
    row-major copy), not in the order a BLAS product of its layout would take."""
    for dtype in (torch.float32, torch.float64):
        x = _rows(3000, 40, dtype, seed=9).t().contiguous().t()
        assert x.stride(1) != 1
        assert _same_bits(column_mean(x), row_order_sum(x.contiguous()).div_(3000))


def test_the_gradient_path_takes_rows_by_unbind_not_one_index_each() -> None:
    """``x[i]`` per row made one (n, d) gradient per row in backward (quadratic in n); ``unbind`` stacks once. The
    graph must hold no ``SelectBackward`` node, and the gradient is 1/n everywhere."""
    leaf = torch.randn(40, 300, requires_grad=True)
    out = column_mean(leaf)
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    assert not any(type(node).__name__.startswith("SelectBackward") for node in seen)
    out.sum().backward()
    assert leaf.grad is not None and torch.equal(leaf.grad, torch.full_like(leaf, 1.0) / 40)


def test_tensors_without_readable_memory_take_torchs_path() -> None:
    """Under ``torch.func.vmap`` and with a FakeTensor there is no data pointer to give the kernel."""
    batch = _rows(15, 70, torch.float32, seed=3).reshape(3, 5, 70)
    got = torch.func.vmap(column_mean)(batch)
    assert all(_same_bits(got[i], row_order_sum(batch[i]).div_(5)) for i in range(3))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(5, 7)
        assert column_mean(fake).shape == (7,)


@needs_kernel
def test_a_block_size_beyond_the_row_is_one_block() -> None:
    x = torch.ones(4, 3)
    assert torch.equal(_kernel(x, 1, 4.0, 2**62), torch.ones(3))
