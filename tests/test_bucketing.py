"""Tests of bucketing (Karimireddy, He & Jaggi, ICLR 2022)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.aggregators import make
from phalanx.aggregators.pre.bucketing import Bucketing
from phalanx.aggregators.signguard import SignGuard
from phalanx.errors import ConfigError


def _x(n: int, d: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_structure_of_the_provenance_matrix() -> None:
    x = _x(7)
    y, m = Bucketing(s=3, seed=1).mix(x)
    assert y.shape == (3, 3) and m.shape == (3, 7)
    # Each input in exactly one bucket; bucket sizes 3, 3, 1; weights 1/|bucket|.
    assert ((m > 0).sum(dim=0) == 1).all()
    assert (m > 0).sum(dim=1).tolist() == [3, 3, 1]
    torch.testing.assert_close(m.sum(dim=1), torch.ones(3, dtype=torch.float64))
    assert set(m[m > 0].tolist()) == {1 / 3, 1.0}
    torch.testing.assert_close(y, m @ x)


def test_s_one_permutes_and_s_large_averages() -> None:
    x = _x(6)
    y, m = Bucketing(s=1).mix(x)
    assert torch.equal(m.sum(dim=0), torch.ones(6, dtype=torch.float64))
    assert sorted(y[:, 0].tolist()) == sorted(x[:, 0].tolist())
    y, m = Bucketing(s=10).mix(x)
    torch.testing.assert_close(y, x.mean(0, keepdim=True))


def test_bucketing_then_mean_is_the_mean_with_uniform_contributions() -> None:
    x = _x(8)
    agg = make("bucketing(s=2)>mean", f=0)
    out, contrib = agg.aggregate(x)
    torch.testing.assert_close(out, x.mean(0))
    torch.testing.assert_close(contrib, torch.full((8,), 1 / 8, dtype=torch.float64))


def test_a_new_permutation_each_call_reproducible_from_the_seed() -> None:
    x = _x(10)
    a, b = Bucketing(s=2, seed=5), Bucketing(s=2, seed=5)
    ms_a = [a.mix(x)[1] for _ in range(4)]
    ms_b = [b.mix(x)[1] for _ in range(4)]
    assert all(torch.equal(p, q) for p, q in zip(ms_a, ms_b))
    assert any(not torch.equal(ms_a[0], m) for m in ms_a[1:])


def test_generator_keyword_is_used_and_leaves_own_state_alone() -> None:
    x = _x(10)
    fresh = Bucketing(s=2, seed=5).mix(x)[1]
    b = Bucketing(s=2, seed=5)
    m_ext = b.mix(x, generator=torch.Generator().manual_seed(123))[1]
    assert torch.equal(m_ext, Bucketing(s=2, seed=0).mix(x, generator=torch.Generator().manual_seed(123))[1])
    assert torch.equal(b.mix(x)[1], fresh)


def test_generator_must_be_a_generator() -> None:
    with pytest.raises(ConfigError) as info:
        Bucketing().mix(_x(4), generator=3)
    assert info.value.parameter == "generator"


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), 1e38])
def test_a_bad_row_poisons_only_its_bucket(garbage: float) -> None:
    x = _x(9, 4).float()
    x[4] = garbage
    y, m = Bucketing(s=2, seed=3).mix(x)
    poisoned = m[:, 4] > 0
    assert int(poisoned.sum()) == 1
    assert torch.isnan(y[poisoned]).all()
    clean = ~poisoned
    assert torch.isfinite(y[clean]).all()
    torch.testing.assert_close(y[clean], (m[clean].float() @ torch.nan_to_num(x, posinf=0.0)))


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [({"s": 0}, "s"), ({"s": 1.5}, "s"), ({"s": True}, "s"), ({"seed": -1}, "seed"), ({"f": -1}, "f")],
)
def test_invalid_configuration(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        Bucketing(**kwargs)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


def test_metadata() -> None:
    b = Bucketing(f=1, s=3, seed=2)
    assert b.params() == {"f": 1, "s": 3, "seed": 2}
    assert [b.output_rows(n) for n in (1, 3, 4, 7)] == [1, 1, 2, 3]
    assert b.context_keys == frozenset({"generator"})
    assert "ICLR 2022" in b.reference
    # The chain needs ceil(n/2) >= 3 rows for a rule with f = 1 and n > 2f.
    chain = make("bucketing(s=2)>signguard", f=1)
    assert isinstance(chain.rule, SignGuard)  # type: ignore[attr-defined]
    assert chain.min_workers() == 5


def test_input_not_modified() -> None:
    x = _x(6)
    x[0] = float("nan")
    x0 = x.clone()
    Bucketing(s=2)(x)
    assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(x0)) and torch.equal(x.isnan(), x0.isnan())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_is_kept(dtype: torch.dtype) -> None:
    x = _x(6)
    y, m = Bucketing(s=2, seed=4).mix(x.to(dtype))
    assert y.dtype == dtype and m.dtype == torch.float64
    torch.testing.assert_close(y.double(), m @ x, atol=2e-2, rtol=2e-2)


@given(st.integers(1, 20), st.integers(1, 7), st.integers(0, 1000))
def test_provenance_is_an_averaging_partition(n: int, s: int, seed: int) -> None:
    x = _x(n, 2, seed)
    y, m = Bucketing(s=s, seed=seed).mix(x)
    k = -(-n // s)
    assert y.shape == (k, 2)
    assert ((m > 0).sum(dim=0) == 1).all()
    torch.testing.assert_close(m.sum(dim=1), torch.ones(k, dtype=torch.float64))
    torch.testing.assert_close(y, m @ x)
