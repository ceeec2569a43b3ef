"""Tests of adaptive robust clipping (ARC, Allouah et al., ICLR 2025)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.aggregators import make
from phalanx.aggregators.pre.arc import ARC, arc_clipped_count
from phalanx.errors import ConfigError


@pytest.mark.parametrize(
    ("n", "f", "k"),
    [(10, 0, 0), (10, 1, 1), (10, 3, 4), (10, 4, 4), (3, 1, 1), (15, 3, 4), (50, 10, 16), (7, 3, 3)],
)
def test_clipped_count(n: int, f: int, k: int) -> None:
    # k = floor(2 (f/n) (n - f)), e.g. 2*3*7/10 = 4.2 -> 4, 2*10*40/50 = 16.
    assert arc_clipped_count(n, f) == k


def test_byzfl_documented_example() -> None:
    # n = 3, f = 1 -> k = 1: the longest row (7, 8, 9) is clipped to |(4, 5, 6)| = sqrt(77).
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
    y, m = ARC(f=1).mix(x)
    scale = (77.0 / 194.0) ** 0.5
    expected = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0 * scale, 8.0 * scale, 9.0 * scale]])
    torch.testing.assert_close(y, expected.double())
    torch.testing.assert_close(y[2], torch.tensor([4.41004009, 5.04004582, 5.67005155], dtype=torch.float64))
    assert torch.equal(m, torch.eye(3, dtype=torch.float64))


def test_f_zero_is_the_identity() -> None:
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ARC(f=0)(x), x)


def test_bad_rows_count_as_longest_and_stay_bad() -> None:
    # n = 7, f = 2 -> k = floor(2*2*5/7) = 2: the two bad rows are "the longest"; the threshold is the longest
    # good norm (5), so no good row is clipped.
    good = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 4.0], [5.0, 0.0]])
    x = torch.cat([torch.tensor([[float("nan"), 0.0], [1e38, 1e38]]), good])
    y = ARC(f=2)(x)
    torch.testing.assert_close(y[2:], good)
    assert torch.isnan(y[0, 0]) and y[1, 0] == 1e38


def test_threshold_is_the_k_plus_first_norm() -> None:
    # n = 7, f = 3 -> k = floor(2*3*4/7) = 3: rows of norm 7, 6, 5 are clipped to 4.
    x = torch.diag(torch.arange(1.0, 8.0))
    y = ARC(f=3)(x)
    torch.testing.assert_close(y.norm(dim=1), torch.tensor([1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0]))


def test_input_not_modified() -> None:
    # ByzFL's ARC and Clipping clip their input in place.
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    x0 = x.clone()
    y = ARC(f=1)(x)
    assert torch.equal(x, x0)
    assert not torch.equal(y, x)


def test_configuration_and_metadata() -> None:
    with pytest.raises(ConfigError) as info:
        ARC(f=-1)
    assert info.value.parameter == "f"
    arc = ARC(f=2)
    assert arc.min_workers() == 5
    with pytest.raises(ConfigError) as info:
        arc(torch.ones(4, 2))
    assert info.value.parameter == "n"
    assert "ICLR 2025" in arc.reference and arc.params() == {"f": 2}
    assert make("arc>mean", f=1).min_workers() == 3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_is_kept(dtype: torch.dtype) -> None:
    x = torch.diag(torch.arange(1.0, 8.0)).to(dtype)
    y = ARC(f=3)(x)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double().norm(dim=1), torch.tensor([1.0, 2, 3, 4, 4, 4, 4], dtype=torch.float64))


@given(st.integers(1, 12), st.data())
def test_exactly_k_rows_shortened_and_order_kept(n: int, data: st.DataObject) -> None:
    f = data.draw(st.integers(0, (n - 1) // 2))
    # distinct norms in 0.1 … 100, at least 1e-4 apart: clipping a norm to one a rounding error below it (two unique
    # floats 1e-14 apart) shortens it by less than any tolerance can see, so "exactly k shortened" needs a gap
    norms = [i * 1e-4 for i in data.draw(st.lists(st.integers(1_000, 1_000_000), min_size=n, max_size=n, unique=True))]
    x = torch.diag(torch.tensor(norms, dtype=torch.float64))
    y = ARC(f=f)(x)
    k = arc_clipped_count(n, f)
    yn = y.norm(dim=1)
    assert int((yn < x.norm(dim=1) - 1e-12).sum()) == k
    threshold = sorted(norms, reverse=True)[k] if k else max(norms)
    assert float(yn.max()) <= threshold + 1e-9
