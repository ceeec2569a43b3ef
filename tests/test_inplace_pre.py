"""The in-place path of the pre-aggregators (``PreAggregator.mix_``) and who may use it.

``mix_`` is for a caller that owns its rows: ``clip`` and ``arc`` then scale only the rows they clip, in place, with
the values ``mix`` returns bit for bit. A caller's tensor is never modified unless it asked (``mix_``): ``pre(x)``,
``mix(x)`` and a chain leave it as it was; a chain overwrites only rows that an earlier element made.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.aggregators import chain as chain_module
from phalanx.aggregators import make
from phalanx.aggregators._rowops import scale_rows, scale_rows_
from phalanx.aggregators.base import PreAggregator
from phalanx.aggregators.pre.arc import ARC
from phalanx.aggregators.pre.bucketing import Bucketing
from phalanx.aggregators.pre.clip import Clip
from phalanx.aggregators.pre.nnm import NNM

GARBAGE = [float("nan"), float("inf"), float("-inf"), 1e38]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality, NaN included (and the sign of zero)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(_int(a)),
                                                                     b.reshape(-1).view(_int(b)))


def _int(t: torch.Tensor) -> torch.dtype:
    return {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def _rows(n: int, d: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * (1 + torch.arange(n, dtype=torch.float64))[:, None]
    return x.to(dtype)


PRES: list[tuple[str, Any]] = [("clip", lambda: Clip(threshold=3.0)), ("arc", lambda: ARC(f=2)),
                               ("arc f=0", lambda: ARC(f=0))]


@pytest.mark.parametrize(("name", "make_pre"), PRES, ids=[p[0] for p in PRES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_mix_in_place_equals_mix_bit_for_bit(name: str, make_pre: Any, dtype: torch.dtype) -> None:
    pre = make_pre()
    x = _rows(9, 257, 1, dtype)
    x[3, 5] = float("nan")
    x[6] = 0.0
    y, m = pre.mix(x)
    owned = x.clone()
    y_, m_ = pre.mix_(owned)
    assert _same(y_, y) and torch.equal(m_, m)
    if dtype in (torch.float32, torch.float64):
        assert y_ is owned  # scaled where it lies: no fresh (n, d) tensor


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), d=st.integers(1, 40), seed=st.integers(0, 2**16), tau=st.floats(0.01, 50.0),
       bad=st.lists(st.tuples(st.integers(0, 11), st.sampled_from(GARBAGE)), max_size=3))
def test_clip_in_place_matches_copy(n: int, d: int, seed: int, tau: float, bad: list[tuple[int, float]]) -> None:
    x = _rows(n, d, seed)
    for i, v in bad:
        x[i % n, 0] = v
    y = Clip(threshold=tau)(x)
    assert _same(Clip(threshold=tau).mix_(x.clone())[0], y)


def test_only_the_clipped_rows_change() -> None:
    x = _rows(10, 64, 2)
    norms = torch.linalg.vector_norm(x, dim=1)
    out = ARC(f=2).mix_(x.clone())[0]
    changed = (out != x).any(dim=1)
    assert int(changed.sum()) == 3  # k = ⌊2·(2/10)·8⌋ = 3 longest rows
    assert set(changed.nonzero().flatten().tolist()) == set(norms.argsort(descending=True)[:3].tolist())


@pytest.mark.parametrize(("name", "make_pre"), PRES, ids=[p[0] for p in PRES])
def test_the_callers_tensor_is_never_modified_unless_it_asked(name: str, make_pre: Any) -> None:
    x = _rows(9, 33, 3)
    x0 = x.clone()
    make_pre()(x)
    make_pre().mix(x)
    assert _same(x, x0)
    make_pre().mix_(x)
    if name != "arc f=0":
        assert not _same(x, x0)  # it asked


def test_requires_grad_falls_back_to_a_copy() -> None:
    x = _rows(6, 8, 4).requires_grad_(True)
    y, _ = Clip(threshold=1.0).mix_(x)
    y.sum().backward()
    assert x.grad is not None and y is not x


@pytest.mark.parametrize("threads", [1, 2])
def test_scale_rows_in_place_matches_scale_rows(threads: int) -> None:
    """Both ways of scaling in place (the clipped rows one by one on one thread, one op over every row with more)
    give the copy's values."""
    x = _rows(5, 70_000, 5)  # rows above torch's grain size: a parallel op each
    x[2, 3] = float("nan")
    x[4, 0] = -0.0
    s = torch.tensor([1.0, 0.5, 1.0, 1e-3, 1.0], dtype=torch.float64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = scale_rows_(x.clone(), s)
    finally:
        torch.set_num_threads(before)
    assert _same(out, scale_rows(x, s))
    assert _same(scale_rows_(x.clone(), torch.ones(5, dtype=torch.float64)), x)


SPECS = ["clip(threshold=3.0)>mean", "nnm>clip(threshold=3.0)>cwtm", "bucketing(s=1)>arc>mean", "nnm>arc>arc>mean",
         "arc>clip(threshold=2.0)>mean"]


@pytest.mark.parametrize("spec", SPECS)
def test_a_chain_never_modifies_its_input_and_keeps_its_output(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = _rows(12, 50, 6)
    x0 = x.clone()
    rule = make(spec, f=2)
    out, contrib = rule.aggregate(x)
    assert _same(x, x0)
    monkeypatch.setattr(PreAggregator, "mix_", PreAggregator.mix)  # the copying chain: the reference
    ref, ref_c = make(spec, f=2).aggregate(x)
    assert _same(out, ref) and torch.equal(contrib, ref_c)


class _PassThrough(PreAggregator):
    """A pre-aggregator that hands its input on as it is (a view of the caller's rows)."""

    name = "passthrough_test"
    reference = "test"

    def _run(self, x: torch.Tensor, **context: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:], torch.eye(x.shape[0], dtype=torch.float64)


def test_a_view_of_the_callers_rows_is_not_the_chains_own() -> None:
    x = _rows(8, 20, 7)
    x0 = x.clone()
    rule = chain_module.Chain([_PassThrough(), Clip(threshold=1.0)], make("mean", f=0))
    rule(x)
    assert _same(x, x0)


def test_mutant_chain_that_owns_everything_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above fail for a chain that treats every input as its own."""
    monkeypatch.setattr(chain_module, "_owned", lambda y, x: True)
    x = _rows(8, 20, 7)
    x0 = x.clone()
    make("clip(threshold=1.0)>mean", f=0)(x)
    assert not _same(x, x0)


def test_mutant_chain_that_ignores_views_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain that only asks ``y is x`` overwrites the caller's rows through a view."""
    monkeypatch.setattr(chain_module, "_owned", lambda y, x: y is not x)
    x = _rows(8, 20, 7)
    x0 = x.clone()
    chain_module.Chain([_PassThrough(), Clip(threshold=1.0)], make("mean", f=0))(x)
    assert not _same(x, x0)


def test_other_pre_aggregators_keep_mix() -> None:
    x = _rows(10, 16, 8)
    for make_pre in (lambda: NNM(f=2), lambda: Bucketing(f=2, s=2)):
        owned = x.clone()
        y, m = make_pre().mix_(owned)
        ref, ref_m = make_pre().mix(x)
        assert _same(owned, x) and _same(y, ref) and torch.equal(m, ref_m)


def _one_thread_blocks(monkeypatch: pytest.MonkeyPatch, rows: int, d: int) -> None:
    """``Clip.mix_``'s cache blocks of ``rows`` rows of ``d`` float32 values, on one thread (restored after)."""
    from phalanx.aggregators.pre import clip as clip_module

    monkeypatch.setattr(clip_module, "CACHE_BLOCK_BYTES", rows * d * 4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # the block path, whatever the pytest worker runs on


def _clip_in_place_matches(clip: Clip, x: torch.Tensor) -> bool:
    return _same(clip.mix_(x.clone())[0], Clip(threshold=clip.threshold).mix(x)[0])


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 50])
def test_clip_in_place_by_cache_blocks_matches_copy(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One thread: clip scales a block of rows at a time (its norms, then its clipped rows); the same bits as the
    copy, with NaN, infinite, overflowing and zero rows, whatever the block."""
    x = _rows(11, 3001, 9)
    x[2, 7] = float("nan")
    x[5, 0] = float("inf")
    x[8] = 1e38
    x[9] = 0.0
    _one_thread_blocks(monkeypatch, rows, 3001)
    from phalanx.aggregators.pre import clip as clip_module

    calls: list[int] = []
    real = clip_module.row_norms

    def counted(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(v.shape[0])
        return real(v)

    monkeypatch.setattr(clip_module, "row_norms", counted)
    for tau in (0.5, 30.0, 1e3):
        calls.clear()
        assert _clip_in_place_matches(Clip(threshold=tau), x)
        assert calls[:-1] == [min(rows, 11 - a) for a in range(0, 11, rows)]  # the blocks, then mix's one call


class _FirstBlockScales(Clip):
    """Mutant: every block scaled with the first block's factors."""

    def _run_(self, x: torch.Tensor, **context: Any) -> tuple[torch.Tensor, torch.Tensor]:
        from phalanx.aggregators._rowops import clip_scales, row_norms

        norms, bad = row_norms(x[:2])
        for a in range(0, x.shape[0], 2):
            block = x[a : a + 2]
            scale_rows_(block, clip_scales(norms, bad, self.threshold)[: block.shape[0]])
        return x, torch.eye(x.shape[0], dtype=torch.float64)


def test_mutant_block_path_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _rows(11, 3001, 9)
    _one_thread_blocks(monkeypatch, 2, 3001)
    assert not _clip_in_place_matches(_FirstBlockScales(threshold=30.0), x)
