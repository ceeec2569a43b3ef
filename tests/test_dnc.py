"""Tests of divide-and-conquer (DnC, Shejwalkar & Houmansadr, NDSS 2021)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.aggregators import make
from phalanx.aggregators.dnc import DnC, dnc_scores
from phalanx.errors import ConfigError

# Worked by hand: mean mu = (2, 0); centred rows (-1,0), (-3,0), (-2,1), (-2,-1), (8,0); the centred matrix has
# C^T C = [[82, 0], [0, 2]], so v = (1, 0) and the scores are 1, 9, 4, 4, 64.
HAND = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0], [10.0, 0.0]], dtype=torch.float64)


def _honest(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g, dtype=torch.float64) * 0.2 + 1.0).to(dtype)


def test_scores_by_hand() -> None:
    s = dnc_scores(HAND, torch.zeros(5, dtype=torch.bool))
    torch.testing.assert_close(s / s.max(), torch.tensor([1.0, 9.0, 4.0, 4.0, 64.0], dtype=torch.float64) / 64)


def test_hand_example_removes_the_outlier() -> None:
    out, contrib = DnC(f=1).aggregate(HAND)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(contrib, torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0], dtype=torch.float64))


def test_hand_example_with_filtering_fraction_two() -> None:
    # c = 2, f = 1: remove the two highest scores (64 and 9), keep rows 0, 2, 3.
    out, contrib = DnC(f=1, c=2.0).aggregate(HAND)
    torch.testing.assert_close(out, torch.tensor([1.0 / 3.0, 0.0], dtype=torch.float64))
    assert (contrib > 0).tolist() == [True, False, True, True, False]


def test_scores_match_an_explicit_svd() -> None:
    g = torch.Generator().manual_seed(0)
    sub = torch.randn(12, 30, generator=g, dtype=torch.float64)
    sub[:3] += 2.0
    centred = sub - sub.mean(0)
    v = torch.linalg.svd(centred, full_matrices=False).Vh[0]
    ref = (centred @ v) ** 2
    s = dnc_scores(sub, torch.zeros(12, dtype=torch.bool))
    torch.testing.assert_close(s / s.max(), ref / ref.max())


def test_bad_rows_score_infinity_and_do_not_move_the_mean() -> None:
    g = torch.Generator().manual_seed(1)
    sub = torch.randn(6, 4, generator=g, dtype=torch.float64)
    bad = torch.tensor([False, True, False, False, True, False])
    with_garbage = sub.clone()
    with_garbage[1] = float("nan")
    with_garbage[4] = 1e300
    s = dnc_scores(with_garbage, bad)
    assert torch.isinf(s[bad]).all()
    s_ref = dnc_scores(sub[~bad], torch.zeros(4, dtype=torch.bool))
    torch.testing.assert_close(s[~bad] / s[~bad].max(), s_ref / s_ref.max())


def test_removes_a_planted_direction_with_subsampling() -> None:
    n, d, f = 20, 5000, 4
    x = _honest(n, d, 2)
    g = torch.Generator().manual_seed(3)
    x[:f] += 3.0 * torch.randn(d, generator=g, dtype=torch.float64).sign()
    out, contrib = DnC(f=f, subsample=500, iterations=3).aggregate(x)
    assert contrib[:f].tolist() == [0.0] * f
    torch.testing.assert_close(out, x[f:].mean(0))
    torch.testing.assert_close(contrib[f:], torch.full((n - f,), 1.0 / (n - f), dtype=torch.float64))


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_bad_rows_are_removed_first(garbage: float) -> None:
    n, f = 11, 3
    honest = _honest(n - f, 40, 4, torch.float32)
    x = torch.cat([honest[:2], torch.full((f, 40), garbage), honest[2:]])
    out, contrib = DnC(f=f, subsample=16).aggregate(x)
    assert torch.isfinite(out).all()
    assert contrib[2:5].tolist() == [0.0] * f
    torch.testing.assert_close(out, honest.mean(0))


def test_more_bad_rows_than_f_do_not_crash() -> None:
    x = _honest(7, 5, 5)
    x[:4] = float("nan")
    out = DnC(f=1)(x)
    assert out.shape == (5,)


def test_identical_rows_return_that_row() -> None:
    row = torch.tensor([1.0, -2.0, 3.0, 0.5])
    out, contrib = DnC(f=2).aggregate(row.repeat(7, 1))
    torch.testing.assert_close(out, row)
    assert abs(float(contrib.sum()) - 1.0) < 1e-12


def test_permutation_invariance_with_the_same_seed() -> None:
    x = _honest(13, 300, 6)
    x[:3] *= -2.0
    perm = torch.randperm(13, generator=torch.Generator().manual_seed(1))
    out, contrib = DnC(f=3, subsample=50, seed=7).aggregate(x)
    out_p, contrib_p = DnC(f=3, subsample=50, seed=7).aggregate(x[perm])
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(contrib_p, contrib[perm])


def test_deterministic_sequence_for_a_seed() -> None:
    x = _honest(9, 200, 8)
    a, b = DnC(f=2, subsample=10, iterations=2, seed=3), DnC(f=2, subsample=10, iterations=2, seed=3)
    for _ in range(3):
        assert torch.equal(a.contributions(x), b.contributions(x))


def test_subsample_at_least_d_uses_all_coordinates() -> None:
    x = _honest(8, 6, 9)
    x[0] += 5.0
    torch.testing.assert_close(DnC(f=1, subsample=6, seed=1)(x), DnC(f=1, subsample=10_000, seed=2)(x))


def test_each_iteration_scores_a_random_subset_of_b_coordinates() -> None:
    """Algorithm 3 scores each iteration on b random coordinates. With the attackers out on 5 of 200 coordinates, the
    kept set at b = 20 depends on the seed (a subset may miss those coordinates) and differs from scoring every
    coordinate for some seeds. A review's mutant that ignored ``subsample`` (b = d) passed every other test here:
    it keeps one set whatever the seed."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 200, generator=g, dtype=torch.float64)
    x[:2, :5] += 8.0
    every = DnC(f=2, subsample=200, seed=0).contributions(x)
    kept = [DnC(f=2, subsample=20, seed=seed).contributions(x) for seed in range(20)]
    assert any(not torch.equal(k, every) for k in kept)
    assert any(not torch.equal(k, kept[0]) for k in kept[1:])


def test_input_not_modified() -> None:
    x = _honest(8, 50, 10)
    x[0] = float("nan")
    x0 = x.clone()
    DnC(f=1, subsample=20)(x)
    assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(x0)) and torch.equal(x.isnan(), x0.isnan())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_is_kept(dtype: torch.dtype) -> None:
    x = _honest(7, 12, 11)
    out = DnC(f=1)(x.to(dtype))
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), DnC(f=1)(x), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [({"f": -1}, "f"), ({"iterations": 0}, "iterations"), ({"iterations": 1.5}, "iterations"),
     ({"subsample": 0}, "subsample"), ({"c": 0.0}, "c"), ({"c": -1.0}, "c"), ({"c": float("nan")}, "c"),
     ({"seed": -1}, "seed"), ({"seed": True}, "seed")],
)
def test_invalid_configuration(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        DnC(**kwargs)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


def test_too_few_rows() -> None:
    assert DnC(f=2).min_workers() == 5
    assert DnC(f=2, c=3.0).min_workers() == 7
    assert DnC(f=3, c=0.1).removed() == 1
    assert DnC(f=10, c=0.3).removed() == 3
    with pytest.raises(ConfigError) as info:
        DnC(f=2)(torch.ones(4, 3))
    assert info.value.parameter == "n"


def test_metadata_and_registry() -> None:
    agg = make("dnc(iterations=2, subsample=100, c=1.5, seed=4)", f=1)
    assert isinstance(agg, DnC)
    assert agg.params() == {"f": 1, "iterations": 2, "subsample": 100, "c": 1.5, "seed": 4}
    assert "Algorithm 3" in agg.reference
    assert agg.epsilon(10) is None


@given(st.integers(5, 14), st.integers(0, 2), st.integers(1, 3), st.integers(0, 10**6))
def test_contributions_are_a_selection(n: int, f: int, iterations: int, seed: int) -> None:
    if n <= 2 * f:
        return
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 30, generator=g)
    out, contrib = DnC(f=f, iterations=iterations, subsample=7, seed=seed).aggregate(x)
    support = contrib > 0
    k = int(support.sum())
    assert 1 <= k <= n - f
    torch.testing.assert_close(contrib[support], torch.full((k,), 1.0 / k, dtype=torch.float64))
    torch.testing.assert_close(out, x[support].mean(0))


def test_empty_intersection_falls_back_to_the_rows_kept_most_often(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three rounds keep {0,1,2}, {2,3,4}, {0,1,3}: the intersection is empty; rows 0-3 were kept twice, row 4 once.
    # Only n - f = 3 rows may be averaged: ties broken by the total rank over the rounds — row 0: 0+3+0 = 3,
    # row 2: 2+0+3 = 5, rows 1 and 3: 6 (the earlier index first) — so the good set is {0, 1, 2}.
    rounds = iter([
        torch.tensor([0.0, 0.0, 0.0, 9.0, 9.0]),
        torch.tensor([9.0, 9.0, 0.0, 0.0, 0.0]),
        torch.tensor([0.0, 0.0, 9.0, 0.0, 9.0]),
    ])
    monkeypatch.setattr("phalanx.aggregators.dnc.dnc_scores", lambda sub, bad: next(rounds).double())
    x = torch.arange(10, dtype=torch.float64).reshape(5, 2)
    out, contrib = DnC(f=2, iterations=3).aggregate(x)
    third = 1.0 / 3.0
    torch.testing.assert_close(contrib, torch.tensor([third, third, third, 0.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(out, x[:3].mean(0))


def test_intersection_over_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rounds keep {0,1,2,3} and {1,2,3,4}: the good set is {1,2,3}.
    rounds = iter([torch.tensor([0.0, 0.0, 0.0, 0.0, 9.0]), torch.tensor([9.0, 0.0, 0.0, 0.0, 0.0])])
    monkeypatch.setattr("phalanx.aggregators.dnc.dnc_scores", lambda sub, bad: next(rounds).double())
    x = torch.arange(10, dtype=torch.float64).reshape(5, 2)
    out, contrib = DnC(f=1, iterations=2).aggregate(x)
    assert (contrib > 0).tolist() == [False, True, True, True, False]
    torch.testing.assert_close(out, x[1:4].mean(0))
