"""Properties every rule (and every chain) must have, checked with hypothesis over all registered components.

What a rule claims is declared on its class (``tags``, :class:`phalanx.aggregators.RuleTags`): its symmetries,
whether it survives garbage rows, their tolerance and the parameters they are checked with; the smallest n is the
rule's own ``min_workers()`` and the per-call context (FLTrust's reference) follows from its ``context_keys``
(:func:`phalanx.testing.context_for`). Every registered rule is tested here from those declarations (an installed
plug-in's entry points included), so a new rule is one file and its test, with nothing to add to a list here;
tests/test_declared.py checks the declarations themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx import aggregators
from phalanx.aggregators import RuleTags
from phalanx.testing import context_for, one_round

RULES = aggregators.names("rule")


def _build(name: str, f: int) -> tuple[Any, RuleTags]:
    tags = aggregators.get_tags(name)
    return one_round(aggregators.make(name, f=f, **tags.check_params)), tags


def _setup(name: str, draw: Any, seed: int) -> tuple[Any, torch.Tensor, RuleTags, Mapping[str, Any]]:
    f = draw(st.integers(0, 3))
    rule, tags = _build(name, f)
    low = rule.min_workers()
    n = draw(st.integers(low, low + 6))
    d = draw(st.integers(1, 12))
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return rule, x, tags, context_for(rule, x)


def _float32(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in ctx.items()}


@pytest.mark.parametrize("name", RULES)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_shape_dtype_and_input_untouched(name: str, data: st.DataObject, seed: int) -> None:
    rule, x, _tags, ctx = _setup(name, data.draw, seed)
    before = x.clone()
    out, c = rule.aggregate(x, **ctx)
    assert out.shape == (x.shape[1],) and out.dtype == x.dtype
    assert torch.equal(x, before)
    assert c.shape == (x.shape[0],) and c.dtype == torch.float64
    assert (c >= -1e-12).all() and float(c.sum()) <= 1 + 1e-9
    x32 = x.float()
    assert rule(x32, **_float32(ctx)).dtype == torch.float32


@pytest.mark.parametrize("name", RULES)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_symmetries(name: str, data: st.DataObject, seed: int) -> None:
    rule, x, tags, ctx = _setup(name, data.draw, seed)
    out = rule(x, **ctx)
    tol = {"atol": tags.tol, "rtol": tags.tol}
    if tags.permutation:
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
        assert torch.allclose(rule(x[perm], **ctx), out, **tol)
    if tags.translation:
        c = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(seed + 1), dtype=x.dtype)
        assert torch.allclose(rule(x + c, **ctx), out + c, **tol)
    if tags.scale:
        a = data.draw(st.sampled_from([0.5, 3.0, 10.0]))
        assert torch.allclose(rule(a * x, **ctx), a * out, **tol)


@pytest.mark.parametrize("name", RULES)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_identical_rows_return_that_row(name: str, data: st.DataObject, seed: int) -> None:
    if not aggregators.get_tags(name).identical:
        pytest.skip("not claimed")
    rule, x, tags, ctx = _setup(name, data.draw, seed)
    x = x[:1].expand_as(x).clone()
    assert torch.allclose(rule(x, **ctx), x[0], atol=tags.tol, rtol=tags.tol)


GARBAGE = [float("nan"), float("inf"), -float("inf"), 1e38, -1e38, 1e-42]


@pytest.mark.parametrize("name", RULES)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_survives_up_to_f_garbage_rows(name: str, data: st.DataObject, seed: int) -> None:
    if not aggregators.get_tags(name).robust:
        pytest.skip("not claimed")
    f = data.draw(st.integers(1, 3))
    rule, _tags = _build(name, f)
    low = rule.min_workers()
    n = data.draw(st.integers(low, low + 5))
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(seed))
    bad = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=f, unique=True))
    for i in bad:
        kind = data.draw(st.sampled_from(["row", "entry"]))
        value = data.draw(st.sampled_from(GARBAGE))
        if kind == "row":
            x[i] = value
        else:
            x[i, data.draw(st.integers(0, 5))] = value
    out, c = rule.aggregate(x, **context_for(rule, x))
    assert torch.isfinite(out).all(), (name, out)
    assert torch.isfinite(c).all()


@pytest.mark.parametrize("pre", aggregators.names("pre"))
@pytest.mark.parametrize("rule", ["cwtm", "cwmed", "geomed", "krum", "mean"])
def test_chains_compose_and_trace_contributions(pre: str, rule: str) -> None:
    f = 1
    x = torch.randn(12, 5, generator=torch.Generator().manual_seed(0))
    agg = aggregators.make(f"{pre}>{rule}", f=f)
    out, c = agg.aggregate(x)
    assert out.shape == (5,)
    assert c.shape == (12,)
    assert float(c.sum()) == pytest.approx(1.0, abs=1e-9)
