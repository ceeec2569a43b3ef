"""Properties every rule (and every chain) must have, checked with hypothesis over all registered components.

Each registered rule must appear in RULES below (a test fails otherwise), saying which symmetries it has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx import aggregators


@dataclass
class Props:
    min_n: Any = lambda f: 2 * f + 1
    permutation: bool = True  # output invariant to the order of the rows
    translation: bool = True  # Agg(x + c) = Agg(x) + c
    scale: bool = True  # Agg(a x) = a Agg(x), a > 0
    robust: bool = True  # finite output with up to f garbage rows
    identical: bool = True  # identical rows give that row
    params: dict[str, Any] = field(default_factory=dict)
    context: Any = None  # callable(x) -> dict of per-call keywords
    rtol: float = 1e-5  # iterative solvers are exact only up to their stopping tolerance


RULES: dict[str, Props] = {
    "mean": Props(min_n=lambda f: 1, robust=False),
    "cwmed": Props(),
    "cwtm": Props(),
    "meamed": Props(),
    # Weiszfeld converges sublinearly when the median sits on an input point: compare to 1e-3.
    "geomed": Props(params={"tol": 1e-10, "max_iter": 2000}, rtol=1e-3),
    "cc": Props(translation=False, scale=False, params={"tau": 1.0}),
    "signmaj": Props(translation=False, scale=False, identical=False),
    "krum": Props(min_n=lambda f: 2 * f + 3),
    "multikrum": Props(min_n=lambda f: 2 * f + 3),
    # MDA: exact ties between minimum-diameter subsets are generic (removing either end of the longest pair can leave
    # the same second-longest pair); they go to the lexicographically smallest subset, which depends on row order.
    "mda": Props(permutation=False),
    "bulyan": Props(min_n=lambda f: 4 * f + 3),
    "fltrust": Props(
        min_n=lambda f: 1, permutation=True, translation=False, scale=False, identical=False,
        context=lambda x: {"reference": x[-1].clone().nan_to_num(0.0, 0.0, 0.0) + 0.1},
    ),
    "dnc": Props(translation=True, scale=True),
    "signguard": Props(permutation=False, translation=False, scale=False),
    "clippedclustering": Props(translation=False, scale=True),
}

def _rules() -> list[str]:
    return aggregators.names("rule")


def test_every_rule_is_described_here() -> None:
    assert set(_rules()) == set(RULES), "RULES in tests/test_properties.py must list exactly the registered rules"


def _setup(name: str, draw: Any, seed: int) -> tuple[Any, torch.Tensor, Props, dict[str, Any]]:
    props = RULES[name]
    f = draw(st.integers(0, 3))
    n = draw(st.integers(props.min_n(f), props.min_n(f) + 6))
    d = draw(st.integers(1, 12))
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rule = aggregators.make(name, f=f, **props.params)
    return rule, x, props, props.context(x) if props.context else {}


@pytest.mark.parametrize("name", sorted(RULES))
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_shape_dtype_and_input_untouched(name: str, data: st.DataObject, seed: int) -> None:
    rule, x, _props, ctx = _setup(name, data.draw, seed)
    before = x.clone()
    out, c = rule.aggregate(x, **ctx)
    assert out.shape == (x.shape[1],) and out.dtype == x.dtype
    assert torch.equal(x, before)
    assert c.shape == (x.shape[0],) and c.dtype == torch.float64
    assert (c >= -1e-12).all() and float(c.sum()) <= 1 + 1e-9
    x32 = x.float()
    assert rule(x32, **({k: v.float() for k, v in ctx.items()})).dtype == torch.float32


@pytest.mark.parametrize("name", sorted(RULES))
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_symmetries(name: str, data: st.DataObject, seed: int) -> None:
    rule, x, props, ctx = _setup(name, data.draw, seed)
    out = rule(x, **ctx)
    tol = {"atol": props.rtol, "rtol": props.rtol}
    if props.permutation:
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
        assert torch.allclose(rule(x[perm], **ctx), out, **tol)
    if props.translation:
        c = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(seed + 1), dtype=x.dtype)
        assert torch.allclose(rule(x + c, **ctx), out + c, **tol)
    if props.scale:
        a = data.draw(st.sampled_from([0.5, 3.0, 10.0]))
        assert torch.allclose(rule(a * x, **ctx), a * out, **tol)


@pytest.mark.parametrize("name", sorted(RULES))
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_identical_rows_return_that_row(name: str, data: st.DataObject, seed: int) -> None:
    if not RULES[name].identical:
        pytest.skip("not applicable")
    rule, x, props, ctx = _setup(name, data.draw, seed)
    x = x[:1].expand_as(x).clone()
    assert torch.allclose(rule(x, **ctx), x[0], atol=props.rtol, rtol=props.rtol)


GARBAGE = [float("nan"), float("inf"), -float("inf"), 1e38, -1e38, 1e-42]


@pytest.mark.parametrize("name", sorted(RULES))
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_survives_up_to_f_garbage_rows(name: str, data: st.DataObject, seed: int) -> None:
    if not RULES[name].robust:
        pytest.skip("not applicable")
    props = RULES[name]
    f = data.draw(st.integers(1, 3))
    n = data.draw(st.integers(props.min_n(f), props.min_n(f) + 5))
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(seed))
    bad = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=f, unique=True))
    for i in bad:
        kind = data.draw(st.sampled_from(["row", "entry"]))
        value = data.draw(st.sampled_from(GARBAGE))
        if kind == "row":
            x[i] = value
        else:
            x[i, data.draw(st.integers(0, 5))] = value
    rule = aggregators.make(name, f=f, **props.params)
    ctx = props.context(x) if props.context else {}
    out, c = rule.aggregate(x, **ctx)
    assert torch.isfinite(out).all(), (name, out)
    assert torch.isfinite(c).all()


@pytest.mark.parametrize("pre", ["nnm", "bucketing", "clip", "arc"])
@pytest.mark.parametrize("rule", ["cwtm", "cwmed", "geomed", "krum", "mean"])
def test_chains_compose_and_trace_contributions(pre: str, rule: str) -> None:
    f = 1
    x = torch.randn(12, 5, generator=torch.Generator().manual_seed(0))
    agg = aggregators.make(f"{pre}>{rule}", f=f)
    out, c = agg.aggregate(x)
    assert out.shape == (5,)
    assert c.shape == (12,)
    assert float(c.sum()) == pytest.approx(1.0, abs=1e-9)
