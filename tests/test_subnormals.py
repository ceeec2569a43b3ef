"""Subnormal inputs count as 0 in the components that multiply rows (``_subnormals``).

A Byzantine row of subnormal float32 values made ``x @ x.T`` 64× and Krum 36× slower on x86
(``benchmarks/subnormal_rules.py``). Tests never time anything: they check the mechanism — no subnormal entry reaches
the arithmetic of a component that sets ``subnormals_as_zero`` — and the scan that decides it, each with a mutant
that fails.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phalanx.aggregators import _rowops, _subnormals, registry
from phalanx.aggregators.base import Aggregator, PreAggregator

KERNEL = _rowops._normkernel is not None

FLAGGED = ["bulyan", "caf", "cc", "clippedclustering", "geomed", "krum", "mda", "multikrum", "nnm"]
"""The components that set the switch: those whose time on four subnormal rows of twenty measured 4-36x their time
on honest rows (docs/aggregators.md, "Subnormal inputs")."""


def _planted(dtype: torch.dtype, n: int = 9, d: int = 1000, seed: int = 0) -> tuple[torch.Tensor, list[int]]:
    """Rows with subnormal entries planted at the start, in the 16-lane body and in the tail, among rows that hold
    only the values next to them: the smallest normal, zeros of both signs, NaN, ±Inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
    info = torch.finfo(dtype)
    sub = info.tiny / 2  # subnormal (for bfloat16 too: same exponent range as float32)
    x[1, 0] = sub
    x[3, d - 1] = -sub  # the tail (d is not a multiple of 16)
    x[5, 17] = info.tiny * (1 - info.eps)  # the largest subnormal
    x[6, 3:10] = 0.0
    x[6, 11] = -0.0
    x[7, 2] = info.tiny  # the smallest normal: not subnormal
    x[7, 5] = -info.tiny
    x[8, 0], x[8, 1], x[8, 2] = float("nan"), float("inf"), float("-inf")
    return x, [1, 3, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("use_kernel", [True, False])
def test_subnormal_rows_finds_exactly_the_rows_holding_one(
    dtype: torch.dtype, use_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if use_kernel and not KERNEL:
        pytest.skip("the C kernel is not built here")
    monkeypatch.setattr(_rowops, "HAVE_NORM_KERNEL", use_kernel)
    x, rows = _planted(dtype)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        want = torch.zeros(x.shape[0], dtype=torch.bool)
        want[rows] = True
        assert torch.equal(_subnormals.subnormal_rows(x), want)
        assert torch.equal(_subnormals.subnormal_rows(x[:, 1:]), want & torch.tensor([r != 1 for r in range(9)]))
        strided = torch.zeros(x.shape[0], 1040, dtype=dtype)
        strided[:, :1000] = x
        assert torch.equal(_subnormals.subnormal_rows(strided[:, :1000]), want)  # rows 1,040 apart
    torch.set_num_threads(1)


def test_subnormal_rows_kernel_agrees_with_torch_on_random_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's scan and its one-pass flushing copy against the torch path, bit for bit (signs of zeros too),
    for every tail length up to 33 and strided rows."""
    if not KERNEL:
        pytest.skip("the C kernel is not built here")
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.float64):
        tiny = torch.finfo(dtype).tiny
        for d in (1, 7, 15, 16, 17, 31, 33, 100):
            x = torch.randn(12, d, generator=g, dtype=dtype) * 10.0 ** torch.randint(-3, 3, (12, d), generator=g)
            hit = torch.rand(12, d, generator=g) < 0.03
            x = torch.where(hit, torch.rand(12, d, generator=g, dtype=dtype) * tiny, x)
            x[torch.rand(12, d, generator=g) < 0.05] = -0.0  # kept as they are, sign included
            for view in (x, x[:, 1:] if d > 1 else x, x[::2]):  # rows further apart than their length, too
                monkeypatch.setattr(_rowops, "HAVE_NORM_KERNEL", True)
                fast, fast_flush = _subnormals.subnormal_rows(view), _subnormals.flush_subnormals(view)
                monkeypatch.setattr(_rowops, "HAVE_NORM_KERNEL", False)
                slow, slow_flush = _subnormals.subnormal_rows(view), _subnormals.flush_subnormals(view)
                assert torch.equal(fast, slow), (dtype, d)
                assert torch.equal(fast_flush, slow_flush) and torch.equal(fast_flush.signbit(), slow_flush.signbit())


def test_mutant_scan_without_the_zero_test_is_caught() -> None:
    """Mutant: "|x| below the smallest normal" without "and not 0" flags every row holding a zero; the exact
    comparison above rejects it."""
    x, rows = _planted(torch.float32)
    mutant = (x.abs() < torch.finfo(x.dtype).tiny).any(dim=1)
    want = torch.zeros(x.shape[0], dtype=torch.bool)
    want[rows] = True
    assert not torch.equal(mutant, want)


def test_float16_is_left_alone() -> None:
    x = torch.ones(2, 8, dtype=torch.float16)
    x[0, 0] = 1e-6  # subnormal in float16, a normal number in the float32 CPUs compute it in
    assert not bool(_subnormals.subnormal_rows(x).any())
    assert _subnormals.flush_subnormals(x) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_flush_zeroes_subnormals_only_and_copies_only_when_needed(dtype: torch.dtype) -> None:
    x, _ = _planted(dtype)
    before = x.clone()
    y = _subnormals.flush_subnormals(x)
    assert y is not x and torch.equal(x.nan_to_num(), before.nan_to_num())  # the caller's x is not touched
    sub = (x.abs() < torch.finfo(dtype).tiny) & (x != 0)
    assert torch.equal(y.nan_to_num(), torch.where(sub, torch.zeros((), dtype=dtype), x).nan_to_num())
    clean = torch.where(sub, torch.zeros((), dtype=dtype), x)
    assert _subnormals.flush_subnormals(clean) is clean


def test_flush_keeps_the_gradient_of_the_other_entries() -> None:
    x, _ = _planted(torch.float64, d=40)
    x = x.nan_to_num(posinf=1.0, neginf=-1.0).requires_grad_()
    y = _subnormals.flush_subnormals(x)
    (y * 3.0).sum().backward()
    assert x.grad is not None
    sub = (x.detach().abs() < torch.finfo(x.dtype).tiny) & (x.detach() != 0)
    assert torch.equal(x.grad, torch.where(sub, 0.0, 3.0).to(torch.float64))


def _component(name: str, f: int) -> Aggregator | PreAggregator:
    cls = registry.get_class(name)
    comp: Any = cls(f=f)
    return comp


def _seen_by_run(name: str, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The inputs a component's own arithmetic (its ``_run``) received when called on ``x``."""
    cls = registry.get_class(name)
    seen: list[torch.Tensor] = []
    real = cls._run

    def recording(self: Any, y: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(y.detach().clone())
        return real(self, y, *args, **kwargs)

    monkeypatch.setattr(cls, "_run", recording)
    comp = _component(name, 2)
    comp.aggregate(x) if isinstance(comp, Aggregator) else comp.mix(x)
    return seen


def _byzantine_subnormal_rows(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(9)
    x = torch.randn(11, 300, generator=g).to(dtype)
    x[:2] = (torch.rand(2, 300, generator=g) * torch.finfo(dtype).tiny).to(dtype)  # two Byzantine rows of them
    return x


@pytest.mark.parametrize("name", FLAGGED)
def test_no_subnormal_reaches_a_flagged_component(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = _byzantine_subnormal_rows()
    seen = _seen_by_run(name, x, monkeypatch)
    assert seen and not any(bool(_subnormals.subnormal_rows(s).any()) for s in seen)


def test_mutant_component_without_the_switch_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: Krum with the switch off. The check above sees the subnormal rows reach its arithmetic."""
    monkeypatch.setattr(registry.get_class("krum"), "subnormals_as_zero", False)
    seen = _seen_by_run("krum", _byzantine_subnormal_rows(), monkeypatch)
    assert any(bool(_subnormals.subnormal_rows(s).any()) for s in seen)


@pytest.mark.parametrize("name", FLAGGED)
def test_a_flagged_component_takes_subnormals_as_zeros(name: str) -> None:
    """The convention: the same output and contributions as on the input with those entries set to 0, bit for
    bit; float32 and float64."""
    for dtype in (torch.float32, torch.float64):
        x = _byzantine_subnormal_rows(dtype)
        zeroed = x.clone()
        zeroed[:2] = 0.0
        a, b = _component(name, 2), _component(name, 2)
        if isinstance(a, Aggregator):
            assert isinstance(b, Aggregator)
            (out, contrib), (ref, ref_contrib) = a.aggregate(x), b.aggregate(zeroed)
        else:
            assert isinstance(b, PreAggregator)
            (out, contrib), (ref, ref_contrib) = a.mix(x), b.mix(zeroed)
        assert torch.equal(out, ref) and torch.equal(contrib, ref_contrib), (name, dtype)


def test_the_flagged_list_is_the_registry_s() -> None:
    flagged = sorted(n for n in registry.names() if registry.get_class(n).subnormals_as_zero)
    assert flagged == sorted(FLAGGED)


def test_a_chain_flushes_through_its_elements() -> None:
    """``nnm>cwtm``: NNM's switch applies inside the chain (its mix), cwtm's arithmetic sees NNM's output."""
    x = _byzantine_subnormal_rows()
    zeroed = x.clone()
    zeroed[:2] = 0.0
    chain, ref = registry.make("nnm>cwtm", 2), registry.make("nnm>cwtm", 2)
    assert torch.equal(chain(x), ref(zeroed))
