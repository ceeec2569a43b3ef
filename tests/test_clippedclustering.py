"""Tests of ClippedClustering (Li, Ngai & Voigt, IEEE Transactions on Big Data 2023)."""

from __future__ import annotations

import pytest
import torch

from phalanx.aggregators import make
from phalanx.aggregators.clippedclustering import (
    ClippedClustering,
    average_linkage_two_clusters,
    cosine_distances,
)
from phalanx.errors import ConfigError


def _same_partition(a: list[int], b: list[int]) -> bool:
    forward: dict[int, int] = {}
    backward: dict[int, int] = {}
    for u, v in zip(a, b):
        if forward.setdefault(u, v) != v or backward.setdefault(v, u) != u:
            return False
    return True


def test_hand_example() -> None:
    # Group A along e1 (norms 1, 2, 4), group B along e2 (norms 1, 3): cosine distance 0 inside, 1 across.
    # Median norm of (1, 2, 4, 1, 3) = 2; the larger group A clipped to 2: (1,0), (2,0), (2,0) -> mean (5/3, 0).
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [4.0, 0.0], [0.0, 1.0], [0.0, 3.0]], dtype=torch.float64)
    out, contrib = ClippedClustering(f=2).aggregate(x)
    torch.testing.assert_close(out, torch.tensor([5.0 / 3.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(contrib, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0, 0.0], dtype=torch.float64))


def test_cosine_distances_by_hand() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0], [float("nan"), 1.0], [1e38, 1e38]])
    dist, norms, bad = cosine_distances(x)
    assert bad.tolist() == [False, False, False, False, True, True]
    torch.testing.assert_close(norms[:4], torch.tensor([1.0, 2.0, 3.0, 0.0], dtype=torch.float64))
    expected = torch.tensor(
        [[0, 1, 2, 1, 2, 2], [1, 0, 1, 1, 2, 2], [2, 1, 0, 1, 2, 2], [1, 1, 1, 0, 2, 2], [2, 2, 2, 2, 0, 0],
         [2, 2, 2, 2, 0, 0]], dtype=torch.float64,
    )
    torch.testing.assert_close(dist, expected)


def test_zero_rows_are_close_to_each_other() -> None:
    dist, _, _ = cosine_distances(torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]]))
    torch.testing.assert_close(dist, torch.tensor([[0, 0, 1], [0, 0, 1], [1, 1, 0]], dtype=torch.float64))


def test_average_linkage_by_hand() -> None:
    # Points on a line at 0, 1, 3, 10 (distance |a - b|). Merges: {0,1} at 1; then d({0,1},3) = (3+2)/2 = 2.5
    # < 7, so {0,1,3}; two clusters remain: {0,1,3} and {10}.
    pos = torch.tensor([0.0, 1.0, 3.0, 10.0], dtype=torch.float64)
    labels = average_linkage_two_clusters((pos[:, None] - pos[None, :]).abs())
    assert labels.tolist() == [0, 0, 0, 3]


def test_average_linkage_matches_scipy() -> None:
    hierarchy = pytest.importorskip("scipy.cluster.hierarchy")
    distance = pytest.importorskip("scipy.spatial.distance")
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        n = int(torch.randint(3, 30, (1,), generator=g))
        pts = torch.randn(n, 4, generator=g, dtype=torch.float64)
        dist = torch.cdist(pts, pts)
        z = hierarchy.linkage(distance.squareform(dist.numpy(), checks=False), method="average")
        ref = hierarchy.fcluster(z, t=2, criterion="maxclust").tolist()
        assert _same_partition(average_linkage_two_clusters(dist).tolist(), ref)


def test_tie_in_size_goes_to_the_tighter_cluster() -> None:
    # Two pairs; the pair along e2 is identical (spread 0), the other is 0.1 apart in cosine distance.
    x = torch.tensor([[1.0, 0.0], [1.0, 0.5], [0.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    _, contrib = ClippedClustering(f=1).aggregate(x)
    assert (contrib > 0).tolist() == [False, False, True, True]


def test_full_tie_keeps_both_clusters() -> None:
    # Two singletons (or two equally large, equally tight groups): nothing tells them apart, keep all rows.
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]], dtype=torch.float64)
    out, contrib = ClippedClustering().aggregate(x)
    assert contrib.tolist() == [0.5, 0.5]
    torch.testing.assert_close(out, torch.tensor([0.75, 0.5], dtype=torch.float64))  # clipped to median 1.5
    x4 = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 1.0], [0.0, 3.0]], dtype=torch.float64)
    _, contrib4 = ClippedClustering(f=1).aggregate(x4)
    assert contrib4.tolist() == [0.25] * 4


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_bad_rows_are_never_averaged(garbage: float) -> None:
    g = torch.Generator().manual_seed(1)
    direction = torch.rand(32, generator=g) + 0.5
    honest = torch.rand(8, 1, generator=g) * direction + 0.01 * torch.randn(8, 32, generator=g)
    x = torch.cat([torch.full((3, 32), garbage), honest])
    out, contrib = ClippedClustering(f=3).aggregate(x)
    assert torch.isfinite(out).all()
    assert contrib[:3].tolist() == [0.0] * 3
    torch.testing.assert_close(contrib[3:], torch.full((8,), 1 / 8, dtype=torch.float64))
    # Median of the 11 norms with the 3 bad ones counted as +inf: the 6th smallest honest norm.
    norms = honest.norm(dim=1)
    tau = norms.sort().values[5]
    expected = (honest * torch.clamp(tau / norms, max=1.0)[:, None]).mean(0)
    torch.testing.assert_close(out, expected)


def test_more_bad_rows_than_half_give_zero_not_crash() -> None:
    x = torch.ones(5, 3)
    x[:3] = float("nan")
    out, contrib = ClippedClustering(f=2).aggregate(x)
    assert torch.equal(out, torch.zeros(3)) and float(contrib.sum()) == 0.0


def test_opposite_attackers_are_separated() -> None:
    g = torch.Generator().manual_seed(2)
    base = torch.randn(100, generator=g)
    honest = base + 0.3 * torch.randn(9, 100, generator=g)
    x = torch.cat([-5.0 * base.repeat(4, 1), honest])
    out, contrib = ClippedClustering(f=4).aggregate(x)
    assert contrib[:4].tolist() == [0.0] * 4
    assert float(torch.nn.functional.cosine_similarity(out, base, dim=0)) > 0.9


def test_identical_rows_return_that_row() -> None:
    row = torch.tensor([3.0, -1.0, 2.0])
    out, contrib = ClippedClustering(f=2).aggregate(row.repeat(6, 1))
    torch.testing.assert_close(out, row)
    assert abs(float(contrib.sum()) - 1.0) < 1e-12


def test_permutation_invariance() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 50, generator=g, dtype=torch.float64)
    x[:4] += 3.0
    perm = torch.randperm(12, generator=g)
    out, contrib = ClippedClustering(f=3).aggregate(x)
    out_p, contrib_p = ClippedClustering(f=3).aggregate(x[perm])
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(contrib_p, contrib[perm])


def test_input_not_modified() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, 20, generator=g) * 10
    x[1] = float("nan")
    x0 = x.clone()
    ClippedClustering(f=2)(x)
    assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(x0)) and torch.equal(x.isnan(), x0.isnan())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_is_kept(dtype: torch.dtype) -> None:
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [4.0, 0.0], [0.0, 1.0], [0.0, 3.0]], dtype=torch.float64)
    out = ClippedClustering(f=2)(x.to(dtype))
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), torch.tensor([5 / 3, 0.0], dtype=torch.float64), atol=1e-2, rtol=1e-2)


def test_configuration_and_metadata() -> None:
    with pytest.raises(ConfigError) as info:
        ClippedClustering(f=-2)
    assert info.value.parameter == "f"
    agg = ClippedClustering(f=3)
    assert agg.min_workers() == 7
    with pytest.raises(ConfigError) as info:
        agg(torch.ones(6, 2))
    assert info.value.parameter == "n"
    assert agg.params() == {"f": 3}
    assert "Big Data" in agg.reference
    assert isinstance(make("clippedclustering", f=1), ClippedClustering)


def test_tied_distances_do_not_depend_on_row_order() -> None:
    # All rows point the same way (every cosine distance is 0): the split is made in the canonical order (by norm),
    # so the two shortest rows form the kept cluster whatever the input order.
    x = torch.tensor([[0.66], [0.27], [0.06]], dtype=torch.float64)
    expected = torch.tensor([(0.06 + 0.27) / 2], dtype=torch.float64)
    for perm in ([0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]):
        out, contrib = ClippedClustering().aggregate(x[perm])
        torch.testing.assert_close(out, expected)
        assert contrib[torch.tensor(perm) == 0].item() == 0.0
