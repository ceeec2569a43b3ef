"""Empirical ε: the trimmed mean meets f/(n−f) exactly on the worst-case input and never exceeds it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx import aggregators
from phalanx.analysis import aggregation_error, epsilon, lower_bound
from phalanx.errors import ConfigError


@pytest.mark.parametrize("n, f", [(5, 1), (10, 3), (16, 7), (16, 0), (21, 10)])
def test_trimmed_mean_is_tight(n: int, f: int) -> None:
    est = epsilon(aggregators.make("cwtm", f=f), n, trials=40, seed=1)
    assert est.value == pytest.approx(f / (n - f), abs=1e-9)
    assert est.theory == pytest.approx(f / (n - f))
    assert est.lower_bound == pytest.approx(f / (n - f))
    if f:
        assert est.worst_input.startswith(f"{f} rows at")


def test_worst_case_input_by_hand() -> None:
    n, f = 10, 3
    x = torch.zeros(n, 4, dtype=torch.float64)
    x[:f] = 1.0
    out = aggregators.make("cwtm", f=f)(x)
    assert aggregation_error(out, x) == pytest.approx(f / (n - f))


@given(n=st.integers(3, 20), d=st.integers(1, 10), seed=st.integers(0, 10_000), data=st.data())
def test_no_random_input_beats_the_trimmed_mean_bound(n: int, d: int, seed: int, data: st.DataObject) -> None:
    f = data.draw(st.integers(0, (n - 1) // 2))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * torch.rand(n, 1, generator=gen, dtype=torch.float64)
    ratio = aggregation_error(aggregators.make("cwtm", f=f)(x), x)
    assert ratio <= f / (n - f) + 1e-9


def test_median_meets_its_epsilon() -> None:
    for n in (7, 8, 15):
        est = epsilon(aggregators.make("cwmed", f=0), n, trials=20)
        k = (n - 1) // 2
        assert est.value == pytest.approx(k / (n - k))


def test_mean_has_zero_error_and_robust_rules_pay() -> None:
    assert epsilon(aggregators.make("mean", f=0), 10, trials=20).value == pytest.approx(0.0, abs=1e-20)
    for spec in ("cwtm", "meamed", "cwmed"):
        est = epsilon(aggregators.make(spec, f=3), 10, trials=20)
        assert est.value >= lower_bound(10, 3) - 1e-9, spec


def test_validation() -> None:
    with pytest.raises(ConfigError, match="n"):
        epsilon(aggregators.make("cwtm", f=3), 6)
    with pytest.raises(ConfigError, match="trials"):
        epsilon(aggregators.make("cwtm", f=1), 6, trials=-1)
    with pytest.raises(ConfigError, match="f"):
        lower_bound(3, 3)


def test_deterministic() -> None:
    a = epsilon(aggregators.make("geomed", f=1), 9, trials=30, seed=5)
    b = epsilon(aggregators.make("geomed", f=1), 9, trials=30, seed=5)
    assert a.value == b.value and a.worst_input == b.worst_input
