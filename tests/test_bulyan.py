"""Tests of Bulyan (El Mhamdi, Guerraoui & Rouault, ICML 2018)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.aggregators import make
from phalanx.aggregators._numerics import pairwise_sqdist
from phalanx.aggregators.bulyan import Bulyan, bulyan_selection
from phalanx.aggregators.krum import krum_scores
from phalanx.errors import ConfigError


def meamed_reference(x: torch.Tensor, beta: int) -> torch.Tensor:
    """Per coordinate, the mean of the ``beta`` values closest to the median (odd row counts only, no ties)."""
    med = x.median(dim=0).values
    idx = (x - med).abs().topk(beta, dim=0, largest=False).indices
    return x.gather(0, idx).mean(dim=0)


def bulyan_reference(x: torch.Tensor, f: int) -> torch.Tensor:
    """Straight from the paper, row by row: iterated Krum on the remaining rows, then meamed.

    Ties: equal scores are compared on the next-nearest distances, then on the index. Distances come from the
    same matrix as the rule's, so that rounding cannot flip a near-tie between the two.
    """
    dist = pairwise_sqdist(x).tolist()
    remaining = list(range(x.shape[0]))
    selected = []
    for _ in range(x.shape[0] - 2 * f):
        r = len(remaining)
        k = min(max(1, r - f - 2), r - 1)
        keys = []
        for i in remaining:
            d = sorted(dist[i][j] for j in remaining if j != i)
            keys.append((sum(d[:k]), *d[k:], i))
        best = min(range(r), key=lambda p: keys[p])
        selected.append(remaining.pop(best))
    theta = len(selected)
    return meamed_reference(x[sorted(selected)], theta - 2 * f)


def _data(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)


# n = 7, f = 1: θ = 5, β = 3. Iterated Krum picks 12 (step 1, 4 neighbours: scores 223, 182, 182, 172, 205, 301,
# 1141), then a 3 (3 neighbours: 123, 101, 101, 204, 292, 916), the other 3 (2 neighbours: 122, 101, 104, 148, 340),
# then 13 (1 neighbour: 121, 4, 4, 144 for 2, 13, 15, 27) and 15 (1 neighbour: 169, 144, 144 for 2, 15, 27); ties go
# to the smaller index, and the other tie-break would select the same set {3, 3, 12, 13, 15}. One Multi-Krum pass
# keeps the five best scores of the full set instead: {2, 3, 3, 12, 13}. Median 12 -> the 3 closest are 12, 13, 15
# -> 40/3; the single-pass selection would give median 3 -> 2, 3, 3 -> 8/3.
ITER_VS_ONEPASS = torch.tensor([[2.0], [3.0], [3.0], [12.0], [13.0], [15.0], [27.0]], dtype=torch.float64)


def test_iterative_selection_differs_from_one_multikrum_pass() -> None:
    d = pairwise_sqdist(ITER_VS_ONEPASS)
    assert bulyan_selection(d, 1, 5) == [3, 1, 2, 4, 5]
    one_pass = sorted(torch.sort(krum_scores(d, 4), stable=True).indices[:5].tolist())
    assert one_pass == [0, 1, 2, 3, 4]
    out, contrib = Bulyan(f=1).aggregate(ITER_VS_ONEPASS)
    torch.testing.assert_close(out, torch.tensor([40.0 / 3], dtype=torch.float64))
    torch.testing.assert_close(contrib, torch.tensor([0, 0, 0, 1 / 3, 1 / 3, 1 / 3, 0], dtype=torch.float64))
    # What the one-pass selection would have produced:
    single_pass = meamed_reference(ITER_VS_ONEPASS[one_pass], 3)
    torch.testing.assert_close(single_pass, torch.tensor([8.0 / 3], dtype=torch.float64))


@given(st.integers(0, 2), st.integers(0, 3), st.integers(0, 10_000))
def test_matches_the_paper_reference(f: int, extra: int, seed: int) -> None:
    n = 4 * f + 3 + 2 * extra  # odd θ = n - 2f: the median is a single value
    x = _data(n, 5, seed)
    out, contrib = Bulyan(f=f).aggregate(x)
    torch.testing.assert_close(out, bulyan_reference(x, f))
    torch.testing.assert_close(contrib.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert (contrib >= 0).all()
    assert int((contrib > 0).sum()) <= n - 2 * f


def test_contributions_are_mapped_back_to_inputs() -> None:
    x = _data(11, 200, 1)
    x[[0, 5]] += 20.0  # two far rows: never selected
    _, contrib = Bulyan(f=2).aggregate(x)
    assert contrib[[0, 5]].sum() == 0
    selected = sorted(bulyan_selection(pairwise_sqdist(x), 2, 7))
    assert set(torch.nonzero(contrib).flatten().tolist()) <= set(selected)
    torch.testing.assert_close(contrib.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_permutation_invariance() -> None:
    x = _data(11, 8, 2)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(3))
    out, c = Bulyan(f=2).aggregate(x)
    out_p, c_p = Bulyan(f=2).aggregate(x[perm])
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(c_p, c[perm])


def test_identical_rows_return_that_row() -> None:
    row = torch.tensor([1.0, -2.0, 0.25], dtype=torch.float64)
    torch.testing.assert_close(Bulyan(f=1)(row.repeat(7, 1)), row)


def test_f_zero_is_the_mean() -> None:
    x = _data(5, 6, 4)
    torch.testing.assert_close(Bulyan(f=0)(x), x.mean(dim=0))


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_bad_rows_never_selected(garbage: float) -> None:
    honest = _data(11, 6, 5, torch.float32) * 0.1 + 1.0
    x = honest.clone()
    x[[1, 8]] = garbage
    out, contrib = Bulyan(f=2).aggregate(x)
    assert torch.isfinite(out).all()
    assert contrib[[1, 8]].sum() == 0
    assert (out - 1.0).abs().max() < 0.3
    # One bad row fewer than f: still finite.
    x1 = honest.clone()
    x1[4] = garbage
    assert torch.isfinite(Bulyan(f=2)(x1)).all()


def test_more_bad_rows_than_f_does_not_crash() -> None:
    x = _data(7, 3, 6)
    x[:4] = float("nan")
    assert Bulyan(f=1)(x).shape == (3,)


def test_input_unchanged() -> None:
    x = _data(7, 5, 7)
    before = x.clone()
    Bulyan(f=1).aggregate(x)
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_kept(dtype: torch.dtype) -> None:
    out = Bulyan(f=1)(_data(7, 4, 8, dtype))
    assert out.dtype == dtype and torch.isfinite(out).all()


def test_invalid_configuration() -> None:
    for bad in (-1, 0.5, "2"):
        with pytest.raises(ConfigError) as info:
            Bulyan(f=bad)  # type: ignore[arg-type]
        assert info.value.parameter == "f"
    assert Bulyan(f=2).min_workers() == 11
    with pytest.raises(ConfigError) as info2:
        Bulyan(f=2)(_data(10, 3, 0))
    assert info2.value.parameter == "n"


def test_registry_and_metadata() -> None:
    agg = make("bulyan", f=1)
    assert isinstance(agg, Bulyan)
    info = agg.describe(n=7)
    assert info["requirement"] == "n >= 4f + 3" and "El Mhamdi" in info["reference"]
