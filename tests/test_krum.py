"""Tests of Krum and Multi-Krum (Blanchard et al., NeurIPS 2017)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.aggregators import make
from phalanx.aggregators._numerics import pairwise_sqdist
from phalanx.aggregators.krum import Krum, MultiKrum, krum_scores
from phalanx.errors import ConfigError

# 1-D hand example, n = 5, f = 1: each score sums the n - f - 2 = 2 smallest squared distances to the others.
#   x = 0:  others at 1, 4, 100, 121      -> 1 + 4   = 5
#   x = 1:  others at 1, 1, 81, 100       -> 1 + 1   = 2
#   x = 2:  others at 4, 1, 64, 81        -> 1 + 4   = 5
#   x = 10: others at 100, 81, 64, 1      -> 1 + 64  = 65
#   x = 11: others at 121, 100, 81, 1     -> 1 + 81  = 82
# With ByzFL's n - f - 1 = 3 neighbours the scores would be 105, 83, 69, 165, 202 and Krum would pick x = 2.
HAND = torch.tensor([[0.0], [1.0], [2.0], [10.0], [11.0]], dtype=torch.float64)


def _data(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)


def test_hand_scores_follow_the_paper() -> None:
    scores = krum_scores(pairwise_sqdist(HAND), 5 - 1 - 2)
    torch.testing.assert_close(scores, torch.tensor([5.0, 2.0, 5.0, 65.0, 82.0], dtype=torch.float64))


def test_hand_krum_picks_the_paper_winner() -> None:
    out, contrib = Krum(f=1).aggregate(HAND)
    torch.testing.assert_close(out, torch.tensor([1.0], dtype=torch.float64))
    torch.testing.assert_close(contrib, torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64))


def test_hand_multikrum_ties_go_to_the_row_closer_to_all() -> None:
    # Scores 5 (row 0) and 5 (row 2) tie; total distances 226 (row 0) and 150 (row 2): m = 2 keeps rows 1 and 2.
    out, contrib = MultiKrum(f=1, m=2).aggregate(HAND)
    torch.testing.assert_close(out, torch.tensor([1.5], dtype=torch.float64))
    torch.testing.assert_close(contrib, torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0], dtype=torch.float64))
    out3 = MultiKrum(f=1, m=3)(HAND)
    torch.testing.assert_close(out3, torch.tensor([1.0], dtype=torch.float64))


def test_multikrum_default_m_is_n_minus_f() -> None:
    out, contrib = MultiKrum(f=1).aggregate(HAND)  # m = 4: rows 1, 0, 2, 3
    torch.testing.assert_close(out, torch.tensor([13.0 / 4], dtype=torch.float64))
    torch.testing.assert_close(contrib, torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0], dtype=torch.float64))


def test_krum_ties_smallest_index() -> None:
    x = torch.tensor([[0.0], [1.0], [0.0], [1.0], [0.5]], dtype=torch.float64)
    # n=5, f=1: 2 neighbours. Rows 0 and 2 (and 1 and 3) are symmetric; 0.5 has neighbours at 0.25, 0.25 -> 0.5.
    # Row 0: 0 (row 2) + 0.25 (row 4) = 0.25, the same for row 2; rows 1 and 3 likewise 0.25.
    _, contrib = Krum(f=1).aggregate(x)
    assert int(torch.argmax(contrib)) == 0


def test_scores_of_bad_rows_are_infinite() -> None:
    x = HAND.clone()
    x[3] = float("nan")
    scores = krum_scores(pairwise_sqdist(x), 2)
    assert torch.isinf(scores[3])
    assert torch.isfinite(scores[[0, 1, 2, 4]]).all()
    assert torch.isinf(krum_scores(pairwise_sqdist(x), 0)[3])
    with pytest.raises(ValueError):
        krum_scores(pairwise_sqdist(x), 5)


def test_permutation_invariance() -> None:
    x = _data(11, 7, 0)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(1))
    for agg in (Krum(f=3), MultiKrum(f=3), MultiKrum(f=2, m=4)):
        out, c = agg.aggregate(x)
        out_p, c_p = agg.aggregate(x[perm])
        torch.testing.assert_close(out_p, out)
        torch.testing.assert_close(c_p, c[perm])


def test_identical_rows_return_that_row() -> None:
    row = torch.tensor([1.5, -2.0, 3.25], dtype=torch.float64)
    x = row.repeat(7, 1)
    torch.testing.assert_close(Krum(f=2)(x), row)
    torch.testing.assert_close(MultiKrum(f=2)(x), row)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_bad_rows_never_selected(garbage: float) -> None:
    honest = _data(9, 6, 3, torch.float32) * 0.1 + 1.0
    x = honest.clone()
    x[[2, 7]] = garbage
    for agg in (Krum(f=2), MultiKrum(f=2), MultiKrum(f=2, m=9)):
        out, contrib = agg.aggregate(x)
        assert torch.isfinite(out).all(), agg
        assert contrib[[2, 7]].sum() == 0, agg
        assert torch.isclose(contrib.sum(), torch.tensor(1.0, dtype=torch.float64))
        assert (out - 1.0).abs().max() < 0.5


def test_huge_but_finite_norm_row_is_bad_in_float32() -> None:
    x = _data(7, 4, 4, torch.float32)
    x[0] = 3e19  # the squared norm overflows float32
    out, contrib = Krum(f=1).aggregate(x)
    assert torch.isfinite(out).all() and contrib[0] == 0


def test_more_bad_rows_than_f_does_not_crash() -> None:
    x = _data(7, 4, 5)
    x[:5] = float("nan")
    Krum(f=1)(x)
    out = MultiKrum(f=1)(x)  # 2 finite-score rows at most: they are averaged
    assert out.shape == (4,)


def test_multikrum_m1_is_krum_and_m_n_is_mean() -> None:
    x = _data(8, 5, 6)
    torch.testing.assert_close(MultiKrum(f=2, m=1)(x), Krum(f=2)(x))
    torch.testing.assert_close(MultiKrum(f=2, m=8)(x), x.mean(dim=0))


@given(st.integers(0, 3), st.integers(0, 4), st.integers(0, 10_000))
def test_krum_output_is_an_input_row(f: int, extra: int, seed: int) -> None:
    n = 2 * f + 3 + extra
    x = _data(n, 3, seed)
    out, contrib = Krum(f=f).aggregate(x)
    i = int(torch.argmax(contrib))
    assert torch.equal(out, x[i])
    assert contrib.sum() == 1.0
    # The winner's score is minimal.
    scores = krum_scores(pairwise_sqdist(x), n - f - 2)
    assert scores[i] == scores.min()


def test_output_does_not_alias_input_and_input_unchanged() -> None:
    x = _data(7, 5, 7)
    before = x.clone()
    out = Krum(f=1)(x)
    out += 100.0
    MultiKrum(f=1)(x)
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_kept(dtype: torch.dtype) -> None:
    x = _data(7, 5, 8, dtype)
    for agg in (Krum(f=1), MultiKrum(f=1)):
        out = agg(x)
        assert out.dtype == dtype and out.shape == (5,)
        assert torch.isfinite(out).all()


def test_float16_matches_float32() -> None:
    x = _data(9, 16, 9, torch.float16)
    torch.testing.assert_close(MultiKrum(f=2)(x).float(), MultiKrum(f=2)(x.float()), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"f": -1}, "f"), ({"f": 1.5}, "f"), ({"f": True}, "f"), ({"f": 1, "m": 0}, "m"), ({"f": 1, "m": 2.0}, "m"),
    ({"f": 1, "m": True}, "m"), ({"f": 1, "m": -3}, "m"),
])
def test_invalid_configuration(kwargs: dict, param: str) -> None:
    cls = MultiKrum if "m" in kwargs else Krum
    with pytest.raises(ConfigError) as info:
        cls(**kwargs)
    assert info.value.parameter == param


def test_too_few_rows() -> None:
    assert Krum(f=2).min_workers() == 7
    assert MultiKrum(f=2).min_workers() == 7
    assert MultiKrum(f=1, m=9).min_workers() == 9
    with pytest.raises(ConfigError) as info:
        Krum(f=2)(_data(6, 3, 0))
    assert info.value.parameter == "n"
    with pytest.raises(ConfigError):
        MultiKrum(f=1, m=9)(_data(8, 3, 0))
    Krum(f=0)(_data(3, 2, 0))
    with pytest.raises(ConfigError):
        Krum(f=0)(_data(2, 2, 0))


def test_registry_and_metadata() -> None:
    agg = make("multikrum(m=3)", f=1)
    assert isinstance(agg, MultiKrum) and agg.params() == {"f": 1, "m": 3, "strict": True}
    assert isinstance(make("krum", f=2), Krum)
    info = Krum(f=1).describe(n=10)
    assert info["requirement"] == "n > 2f + 2" and "Blanchard" in info["reference"]
    assert info["kappa"] == pytest.approx(6 * (1 + 1 / 8)) and info["epsilon"] is None


def test_multikrum_strict_false_runs_where_blanchards_condition_fails() -> None:
    x = torch.randn(16, 5, dtype=torch.float64)
    with pytest.raises(ConfigError, match="n > 2f \\+ 2"):
        make("multikrum", f=7)(x)
    loose = make("multikrum(strict=false)", f=7)
    assert loose.min_workers() == 10 and "no guarantee" in loose.requirement
    out = loose(x)
    # the same selection rule as the strict rule where both run: at f = 6 they agree
    assert torch.allclose(make("multikrum(strict=false)", f=6)(x), make("multikrum", f=6)(x))
    assert out.shape == (5,) and torch.isfinite(out).all()
    with pytest.raises(ConfigError, match="n >= 10"):
        loose(x[:9])
    with pytest.raises(ConfigError, match="strict"):
        make("multikrum(strict=2)", f=1)


def test_element_with_its_own_f() -> None:
    from phalanx.aggregators.chain import Chain

    chain = make("nnm(f=2)>multikrum(strict=false)", f=7)
    assert isinstance(chain, Chain)
    assert chain.pre[0].f == 2 and chain.rule.f == 7
    with pytest.raises(ConfigError, match="f"):
        make("nnm(f=-1)>cwtm", f=1)
