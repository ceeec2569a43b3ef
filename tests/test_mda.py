"""Tests of minimum-diameter averaging (El Mhamdi, Guerraoui & Rouault, ICML 2018) and its exact fast solver."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.aggregators import make
from phalanx.aggregators._numerics import pairwise_sqdist
from phalanx.aggregators.mda import MDA, min_diameter_subset
from phalanx.errors import ConfigError


def brute_force(sqdist: np.ndarray, size: int) -> tuple[list[int], float]:
    """Enumerate every subset in lexicographic order, keep the first with the strictly smallest diameter."""
    d = np.maximum(sqdist, sqdist.T)
    best: tuple[list[int], float] | None = None
    for subset in itertools.combinations(range(d.shape[0]), size):
        diam = float(d[np.ix_(subset, subset)].max())
        if best is None or diam < best[1]:
            best = (list(subset), diam)
    assert best is not None
    return best


def _data(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)


def test_hand_example() -> None:
    # n = 4, f = 1: subsets of 3. {0, 1, 2} has diameter 2 (squared 4); every subset with 10 has diameter >= 8.
    x = torch.tensor([[0.0], [1.0], [2.0], [10.0]], dtype=torch.float64)
    out, contrib = MDA(f=1).aggregate(x)
    torch.testing.assert_close(out, torch.tensor([1.0], dtype=torch.float64))
    torch.testing.assert_close(contrib, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0], dtype=torch.float64))
    assert min_diameter_subset(pairwise_sqdist(x), 3) == ([0, 1, 2], 4.0)


def test_hand_example_tie_goes_to_smallest_index_set() -> None:
    # Rows 0..3 on a line at 0, 1, 2, 3, f = 2: {0,1}, {1,2}, {2,3} all have diameter 1 -> {0, 1}.
    x = torch.tensor([[3.0], [2.0], [1.0], [0.0], [10.0]], dtype=torch.float64)
    picked, diam = min_diameter_subset(pairwise_sqdist(x), 3)
    assert (picked, diam) == ([0, 1, 2], 4.0)
    picked2, diam2 = min_diameter_subset(pairwise_sqdist(x[:4]), 2)
    assert (picked2, diam2) == ([0, 1], 1.0)


@given(
    st.integers(2, 10), st.integers(0, 4), st.integers(0, 3), st.integers(0, 2**31 - 1),
)
def test_solver_matches_brute_force(n: int, f_raw: int, kind: int, seed: int) -> None:
    f = min(f_raw, (n - 1) // 2)
    rng = np.random.default_rng(seed)
    if kind == 0:
        pts = rng.normal(size=(n, 3))
    elif kind == 1:  # a small integer grid: many ties in distance
        pts = rng.integers(0, 3, size=(n, 2)).astype(float)
    elif kind == 2:  # two clusters
        pts = np.concatenate([rng.normal(size=(n // 2, 2)), 4 + rng.normal(size=(n - n // 2, 2))])
    else:  # duplicates on a line
        pts = rng.integers(0, 2, size=(n, 1)).astype(float)
    d = ((pts[:, None, :] - pts[None, :, :]) ** 2).sum(-1)
    n_bad = int(rng.integers(0, f + 2))  # sometimes more than f
    for i in rng.choice(n, size=min(n_bad, n), replace=False):
        d[i, :] = np.inf
        d[:, i] = np.inf
    got = min_diameter_subset(d, n - f)
    want = brute_force(d, n - f)
    assert got[0] == want[0]
    assert got[1] == want[1] or (np.isinf(got[1]) and np.isinf(want[1]))


@pytest.mark.parametrize("seed", range(5))
def test_aggregator_matches_brute_force_on_tensors(seed: int) -> None:
    x = _data(9, 4, seed)
    x[seed % 9] += 5.0
    f = 3
    want, _ = brute_force(pairwise_sqdist(x).numpy(), 9 - f)
    out, contrib = MDA(f=f).aggregate(x)
    torch.testing.assert_close(out, x[want].mean(dim=0))
    assert sorted(torch.nonzero(contrib).flatten().tolist()) == want


def test_permutation_invariance_when_the_optimum_is_unique() -> None:
    x = _data(10, 5, 0)
    d = pairwise_sqdist(x).numpy()
    diams = [float(d[np.ix_(s, s)].max()) for s in itertools.combinations(range(10), 7)]
    assert sorted(diams)[0] < sorted(diams)[1]  # unique optimum for this seed
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(2))
    out, c = MDA(f=3).aggregate(x)
    out_p, c_p = MDA(f=3).aggregate(x[perm])
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(c_p, c[perm])


def test_identical_rows_return_that_row() -> None:
    row = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(MDA(f=2)(row.repeat(6, 1)), row)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_f_bad_rows_give_the_honest_mean(garbage: float) -> None:
    honest = _data(10, 6, 3, torch.float32)
    x = torch.cat([honest[:4], torch.full((3, 6), garbage), honest[4:7]])
    out, contrib = MDA(f=3).aggregate(x)
    # Exactly f bad rows: the only finite-diameter subset of n - f rows is the honest one.
    torch.testing.assert_close(out, honest[:7].mean(dim=0))
    assert contrib[4:7].sum() == 0


def test_fewer_than_f_bad_rows_finite() -> None:
    x = _data(11, 5, 4)
    x[6] = float("nan")
    out, contrib = MDA(f=3).aggregate(x)
    assert torch.isfinite(out).all() and contrib[6] == 0


def test_more_bad_rows_than_f_does_not_crash() -> None:
    x = _data(7, 3, 5)
    x[:4] = float("nan")
    assert MDA(f=2)(x).shape == (3,)


def test_f_zero_is_the_mean() -> None:
    x = _data(5, 4, 6)
    torch.testing.assert_close(MDA(f=0)(x), x.mean(dim=0))


def test_clustered_and_gaussian_n50_are_solved() -> None:
    """n = 50, f = 10: C(50, 10) ≈ 10¹⁰ subsets, searched by branch and bound (its speed: make bench)."""
    torch.manual_seed(0)
    gauss = torch.randn(50, 2000)
    centers = torch.randn(5, 2000) * 3
    clustered = torch.cat([centers[c] + torch.randn(10, 2000) for c in range(5)])
    for x in (gauss, clustered):
        picked, _ = min_diameter_subset(pairwise_sqdist(x), 40)
        assert len(picked) == 40 and picked == sorted(set(picked))
    # The clustered data: dropping one whole cluster of 10 is optimal.
    picked, _ = min_diameter_subset(pairwise_sqdist(clustered), 40)
    dropped = sorted(set(range(50)) - set(picked))
    assert len({i // 10 for i in dropped}) == 1


def test_input_unchanged_and_output_fresh() -> None:
    x = _data(7, 5, 7)
    before = x.clone()
    out = MDA(f=2)(x)
    out += 1.0
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_kept(dtype: torch.dtype) -> None:
    out = MDA(f=1)(_data(5, 4, 8, dtype))
    assert out.dtype == dtype and torch.isfinite(out).all()


def test_invalid_configuration() -> None:
    for bad in (-1, 2.5, "1", None):
        with pytest.raises(ConfigError) as info:
            MDA(f=bad)  # type: ignore[arg-type]
        assert info.value.parameter == "f"
    assert MDA(f=3).min_workers() == 7
    with pytest.raises(ConfigError) as info2:
        MDA(f=3)(_data(6, 2, 0))
    assert info2.value.parameter == "n"


def test_solver_rejects_bad_size() -> None:
    with pytest.raises(ValueError):
        min_diameter_subset(np.zeros((3, 3)), 4)


def test_registry_and_metadata() -> None:
    agg = make("mda", f=2)
    assert isinstance(agg, MDA)
    info = agg.describe(n=9)
    assert info["requirement"] == "n > 2f" and "El Mhamdi" in info["reference"]
    assert info["kappa"] is None and info["epsilon"] is None
