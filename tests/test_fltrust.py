"""Tests of FLTrust (Cao et al., NDSS 2021)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.aggregators import make
from phalanx.aggregators.fltrust import FLTrust
from phalanx.errors import ConfigError

SQ2 = math.sqrt(2.0)


def _honest(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * 0.3 + 1.0


def test_hand_example_two_aligned_one_opposite() -> None:
    # g0 = (1, 1): rows (1, 0) and (0, 2) have cos = 1/sqrt2, row (-1, 0) has cos < 0 -> trust 0.
    # Each trusted row is rescaled to |g0| = sqrt2: (sqrt2, 0) and (0, sqrt2); equal trust -> their mean.
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]], dtype=torch.float64)
    out, contrib = FLTrust(f=1).aggregate(x, reference=torch.tensor([1.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([SQ2 / 2, SQ2 / 2], dtype=torch.float64))
    torch.testing.assert_close(contrib, torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))


def test_hand_example_unequal_trust() -> None:
    # g0 = (2, 0): TS = 1 for (1, 0), 1/sqrt2 for (1, 1); rescaled to |g0| = 2: (2, 0) and (sqrt2, sqrt2).
    # Output = (1 * (2, 0) + (1/sqrt2) * (sqrt2, sqrt2)) / (1 + 1/sqrt2) = (3, 1) / (1 + 1/sqrt2).
    x = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    out, contrib = FLTrust().aggregate(x, reference=torch.tensor([2.0, 0.0], dtype=torch.float64))
    w = 1.0 / SQ2
    expected = torch.tensor([3.0, 1.0]) / (1.0 + w)
    torch.testing.assert_close(out, expected.double())
    torch.testing.assert_close(contrib, torch.tensor([1.0, w], dtype=torch.float64) / (1.0 + w))


def test_single_row_is_rescaled_to_reference_norm() -> None:
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    out = FLTrust()(x, reference=torch.tensor([1.2, 1.6], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([1.2, 1.6], dtype=torch.float64))


def test_identical_rows_equal_to_reference_return_that_row() -> None:
    row = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    out, contrib = FLTrust(f=2).aggregate(row.repeat(5, 1), reference=row.clone())
    torch.testing.assert_close(out, row)
    torch.testing.assert_close(contrib, torch.full((5,), 0.2, dtype=torch.float64))


def test_no_trusted_row_gives_zero_vector_and_zero_contributions() -> None:
    x = torch.tensor([[-1.0, 0.0], [0.0, -1.0], [0.0, 0.0]])
    out, contrib = FLTrust().aggregate(x, reference=torch.tensor([1.0, 1.0]))
    assert torch.equal(out, torch.zeros(2))
    assert torch.equal(contrib, torch.zeros(3, dtype=torch.float64))


def test_zero_reference_gives_zero_vector() -> None:
    out, contrib = FLTrust().aggregate(torch.ones(3, 4), reference=torch.zeros(4))
    assert torch.equal(out, torch.zeros(4))
    assert float(contrib.sum()) == 0.0


def test_zero_row_gets_no_trust() -> None:
    x = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    _, contrib = FLTrust().aggregate(x, reference=torch.tensor([1.0, 1.0]))
    assert contrib.tolist() == [0.0, 1.0]


def test_rescaling_makes_output_independent_of_row_magnitudes() -> None:
    x = _honest(6, 10, 0)
    ref = x.mean(0)
    scaled = x * torch.tensor([1.0, 1e3, 1e-3, 5.0, 0.2, 7.0], dtype=torch.float64)[:, None]
    torch.testing.assert_close(FLTrust()(scaled, reference=ref), FLTrust()(x, reference=ref))


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_bad_rows_get_no_trust_and_output_stays_finite(garbage: float) -> None:
    honest = _honest(7, 20, 1).float()
    ref = honest.mean(0)
    x = torch.cat([torch.full((3, 20), garbage), honest])
    agg = FLTrust(f=3)
    out, contrib = agg.aggregate(x, reference=ref)
    assert torch.isfinite(out).all()
    assert contrib[:3].tolist() == [0.0, 0.0, 0.0]
    torch.testing.assert_close(out, agg(honest, reference=ref))


def test_one_nan_entry_spoils_only_its_row() -> None:
    honest = _honest(5, 8, 2)
    x = honest.clone()
    x[2, 3] = float("nan")
    ref = honest.mean(0)
    out, contrib = FLTrust(f=1).aggregate(x, reference=ref)
    keep = torch.tensor([0, 1, 3, 4])
    torch.testing.assert_close(out, FLTrust()(honest[keep], reference=ref))
    assert contrib[2] == 0.0


def test_missing_reference_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        FLTrust()(torch.ones(3, 2))
    assert info.value.parameter == "reference"


@pytest.mark.parametrize(
    "reference",
    [torch.ones(3), torch.ones(1, 2), torch.tensor([1.0, float("nan")]), torch.tensor([float("inf"), 1.0]),
     [1.0, 1.0], torch.tensor([True, False]), torch.tensor([1e300, 1e300], dtype=torch.float64)],
)
def test_bad_reference_is_a_config_error(reference: object) -> None:
    with pytest.raises(ConfigError) as info:
        FLTrust()(torch.ones(3, 2), reference=reference)
    assert info.value.parameter == "reference"


def test_unknown_context_keyword_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        FLTrust()(torch.ones(3, 2), reference=torch.ones(2), server=torch.ones(2))
    assert info.value.parameter == "context"


def test_negative_f_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        FLTrust(f=-1)
    assert info.value.parameter == "f"


def test_metadata() -> None:
    agg = FLTrust(f=3)
    assert agg.name == "fltrust"
    assert agg.min_workers() == 1
    assert agg.context_keys == frozenset({"reference"})
    assert "NDSS 2021" in agg.reference
    assert agg.params() == {"f": 3}
    assert agg.epsilon(10) is None and agg.kappa(10) is None
    assert isinstance(make("fltrust", f=2), FLTrust)


def test_permutation_invariance() -> None:
    x = _honest(9, 15, 3)
    x[:3] *= -1.0
    ref = _honest(1, 15, 4)[0]
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    out, contrib = FLTrust().aggregate(x, reference=ref)
    out_p, contrib_p = FLTrust().aggregate(x[perm], reference=ref)
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(contrib_p, contrib[perm])


def test_input_and_reference_not_modified() -> None:
    x = _honest(6, 5, 5)
    x[0] = float("nan")
    ref = _honest(1, 5, 6)[0]
    x0, ref0 = x.clone(), ref.clone()
    FLTrust(f=1)(x, reference=ref)
    assert torch.equal(x.isnan(), x0.isnan())
    assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(x0))
    assert torch.equal(ref, ref0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_is_kept(dtype: torch.dtype) -> None:
    x = _honest(5, 6, 7)
    ref = x.mean(0)
    out = FLTrust()(x.to(dtype), reference=ref.to(torch.float32))
    assert out.dtype == dtype
    tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    torch.testing.assert_close(out.double(), FLTrust()(x, reference=ref), atol=tol * 10, rtol=tol * 10)


@given(
    st.lists(st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3), min_size=1, max_size=8),
    st.lists(st.floats(-10, 10), min_size=3, max_size=3),
)
def test_output_norm_never_exceeds_reference_norm(rows: list[list[float]], ref: list[float]) -> None:
    # A convex combination of vectors of norm |g0| has norm <= |g0|.
    x = torch.tensor(rows, dtype=torch.float64)
    g0 = torch.tensor(ref, dtype=torch.float64)
    out, contrib = FLTrust().aggregate(x, reference=g0)
    assert float(out.norm()) <= float(g0.norm()) * (1 + 1e-9) + 1e-12
    total = float(contrib.sum())
    assert total == 0.0 or abs(total - 1.0) < 1e-9
    assert bool((contrib >= 0).all())
