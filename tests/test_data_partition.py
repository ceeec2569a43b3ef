"""phalanx.data.partition and heterogeneity: coverage, determinism, the α limits, pathological classes, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.data import heterogeneity, partition
from phalanx.errors import ConfigError


def balanced(n_classes: int = 10, per_class: int = 100, seed: int = 0) -> torch.Tensor:
    y = torch.arange(n_classes).repeat_interleave(per_class)
    return y[torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))]


def assert_is_partition(parts: list[torch.Tensor], n: int, n_workers: int, min_size: int = 1) -> None:
    assert len(parts) == n_workers
    for p in parts:
        assert p.dtype == torch.int64 and p.ndim == 1
        assert torch.equal(p, p.sort().values)
        assert len(p) >= min_size
    allidx = torch.cat(parts)
    assert len(allidx) == n  # disjoint and covering:
    assert torch.equal(allidx.sort().values, torch.arange(n))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "pathological"])
def test_disjoint_covering_deterministic(scheme: str) -> None:
    y = balanced()
    parts = partition(y, 7, scheme, alpha=0.5, classes_per_worker=3, seed=4)
    assert_is_partition(parts, len(y), 7)
    again = partition(y, 7, scheme, alpha=0.5, classes_per_worker=3, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    other = partition(y, 7, scheme, alpha=0.5, classes_per_worker=3, seed=5)
    assert any(not torch.equal(a, b) for a, b in zip(parts, other))


def test_iid_sizes_differ_by_at_most_one() -> None:
    parts = partition(balanced(), 7, "iid")
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1000


def test_dirichlet_large_alpha_is_close_to_iid_small_alpha_is_skewed() -> None:
    y = balanced(per_class=500)
    iid = heterogeneity(partition(y, 10, "iid", seed=1), y)
    near = heterogeneity(partition(y, 10, "dirichlet", alpha=1e4, seed=1), y)
    mid = heterogeneity(partition(y, 10, "dirichlet", alpha=1.0, seed=1), y)
    skew = heterogeneity(partition(y, 10, "dirichlet", alpha=0.05, seed=1), y)
    assert near["mean_tv"] < 0.02 and iid["mean_tv"] < 0.1  # α = 10⁴: proportions ≈ 1/n, even closer than a shuffle
    assert near["size_cv"] < 0.05 and near["mean_classes"] == 10
    assert near["mean_tv"] < mid["mean_tv"] < skew["mean_tv"]
    assert skew["mean_tv"] > 0.6 and skew["mean_classes"] < 6 < near["mean_classes"]


def test_dirichlet_min_size_fix_up() -> None:
    # 50 workers, α = 0.01: redrawing alone essentially never gives every worker 5 samples, the fix-up does.
    y = balanced(per_class=60)
    parts = partition(y, 50, "dirichlet", alpha=0.01, seed=0, min_size=5)
    assert_is_partition(parts, len(y), 50, min_size=5)
    h = heterogeneity(parts, y)
    assert h["min_size"] == 5 and h["mean_tv"] > 0.6  # still strongly skewed


def test_pathological_gives_k_distinct_classes() -> None:
    y = balanced(n_classes=10, per_class=60)
    for k in (1, 2, 3, 5):
        parts = partition(y, 20, "pathological", classes_per_worker=k, seed=k)
        assert_is_partition(parts, len(y), 20)
        # 20·k shards of 30/k samples (30, 15, 10, 6) that never straddle two classes (60 per class is a multiple),
        # so every worker holds exactly k classes.
        for p in parts:
            assert len(torch.unique(y[p])) == k
            assert len(p) == 600 // 20


def test_pathological_with_unaligned_shards() -> None:
    y = torch.tensor(np.random.default_rng(0).integers(0, 10, 997))
    parts = partition(y, 13, "pathological", classes_per_worker=2, seed=2)
    assert_is_partition(parts, 997, 13)
    assert all(len(torch.unique(y[p])) <= 4 for p in parts)  # k shards, each spanning at most 2 labels here
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 2


def test_pathological_when_distinct_is_impossible() -> None:
    y = torch.tensor([0] * 90 + [1] * 10)  # 2 workers × 2 shards: shards 0,1 are class 0; 2 is 0; 3 is 1
    parts = partition(y, 2, "pathological", classes_per_worker=2, seed=0)
    assert_is_partition(parts, 100, 2)


@given(
    n=st.integers(1, 300),
    n_classes=st.integers(1, 8),
    workers=st.integers(1, 12),
    scheme=st.sampled_from(["iid", "dirichlet", "pathological"]),
    alpha=st.floats(0.01, 100),
    seed=st.integers(0, 2**32),
)
def test_property_partition(n: int, n_classes: int, workers: int, scheme: str, alpha: float, seed: int) -> None:
    y = torch.tensor(np.random.default_rng(seed).integers(0, n_classes, n))
    present = len(torch.unique(y))
    k = min(2, present)
    if workers > n or (scheme == "pathological" and (workers * k > n or n // (workers * k) * k < 1)):
        with pytest.raises(ConfigError):
            partition(y, workers, scheme, alpha=alpha, classes_per_worker=k, seed=seed)
        return
    parts = partition(y, workers, scheme, alpha=alpha, classes_per_worker=k, seed=seed)
    assert_is_partition(parts, n, workers)
    h = heterogeneity(parts, y)
    assert 0 <= h["mean_tv"] <= h["max_tv"] <= 1 and h["coverage"] == 1.0


def test_heterogeneity_values() -> None:
    y = torch.tensor([0, 0, 1, 1])
    h = heterogeneity([torch.tensor([0, 1]), torch.tensor([2, 3])], y)
    assert h["mean_tv"] == pytest.approx(0.5) and h["max_tv"] == pytest.approx(0.5)
    assert h["mean_classes"] == 1 and h["min_size"] == 2 and h["size_cv"] == 0 and h["coverage"] == 1
    h = heterogeneity([torch.tensor([0, 2]), torch.tensor([1, 3])], y)
    assert h["mean_tv"] == 0 and h["mean_classes"] == 2
    h = heterogeneity([torch.tensor([0]), torch.tensor([], dtype=torch.int64)], y)
    assert h["coverage"] == 0.25 and h["min_size"] == 0 and h["n_workers"] == 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_workers": 0}, "n_workers"),
        ({"n_workers": 101}, "only 100 samples"),
        ({"n_workers": 2.5}, "n_workers"),
        ({"scheme": "dirichlet", "alpha": 0}, "alpha"),
        ({"scheme": "dirichlet", "alpha": -1}, "alpha"),
        ({"scheme": "dirichlet", "alpha": float("inf")}, "alpha"),
        ({"scheme": "dirichlet", "alpha": float("nan")}, "alpha"),
        ({"scheme": "pathological", "classes_per_worker": 0}, "classes_per_worker"),
        ({"scheme": "pathological", "classes_per_worker": 11}, "10 classes"),
        ({"scheme": "pathological", "n_workers": 60, "classes_per_worker": 2}, "classes_per_worker"),
        ({"scheme": "dirichlt"}, "did you mean dirichlet"),
        ({"min_size": 0}, "min_size"),
        ({"min_size": 30}, "min_size"),
        ({"seed": -1}, "seed"),
    ],
)
def test_validation(kwargs: dict, match: str) -> None:
    args = {"n_workers": 4, **kwargs}
    with pytest.raises(ConfigError, match=match):
        partition(balanced(per_class=10), **args)


@pytest.mark.parametrize(
    "labels, match",
    [
        (torch.zeros(0, dtype=torch.int64), "non-empty"),
        (torch.zeros(3, 2, dtype=torch.int64), "1-D"),
        (torch.zeros(5), "integer dtype"),
        (torch.tensor([0, -1, 2]), ">= 0"),
        ([0, 1, 2], "torch.Tensor"),
    ],
)
def test_bad_labels(labels: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        partition(labels, 1)  # type: ignore[arg-type]


def test_numpy_labels_accepted() -> None:
    parts = partition(np.arange(10) % 3, 2, "dirichlet", seed=0)  # type: ignore[arg-type]
    assert_is_partition(parts, 10, 2)


# ---------------------------------------------------------------------------------------------------- natural


def test_natural_is_one_user_per_worker_in_user_order() -> None:
    users = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0, 0])
    y = torch.zeros(9, dtype=torch.int64)
    parts = partition(y, 3, "natural", users=users)
    assert [p.tolist() for p in parts] == [[1, 3, 7, 8], [2, 6], [0, 4, 5]]
    assert_is_partition(parts, 9, 3)
    assert partition(y, 3, "natural", users=users, seed=7)[0].tolist() == [1, 3, 7, 8]  # all users: no draw


def test_natural_samples_users_deterministically_when_fewer_workers() -> None:
    users = torch.arange(500).repeat_interleave(3)  # 500 users of 3 samples
    y = torch.zeros(1500, dtype=torch.int64)
    a = partition(y, 20, "natural", users=users, seed=1)
    b = partition(y, 20, "natural", users=users, seed=1)
    c = partition(y, 20, "natural", users=users, seed=2)
    first = [int(users[p[0]]) for p in a]
    assert [p.tolist() for p in a] == [p.tolist() for p in b] and first != [int(users[p[0]]) for p in c]
    assert first == sorted(first) and len(set(first)) == 20  # distinct users, kept in user order
    assert all(len(p) == 3 and len(set(users[p].tolist())) == 1 for p in a)
    assert heterogeneity(a, y)["coverage"] == 60 / 1500


def test_natural_min_size_and_errors() -> None:
    users = torch.tensor([0, 0, 0, 1, 2, 2])
    y = torch.zeros(6, dtype=torch.int64)
    assert [p.tolist() for p in partition(y, 2, "natural", users=users, min_size=2)] == [[0, 1, 2], [4, 5]]
    with pytest.raises(ConfigError, match=r"n_workers.*<= 2") as info:
        partition(y, 3, "natural", users=users, min_size=2)
    assert "3 users in all" in str(info.value)
    with pytest.raises(ConfigError, match="users"):
        partition(y, 2, "natural")
    with pytest.raises(ConfigError, match="one user id per sample"):
        partition(y, 2, "natural", users=users[:5])
    with pytest.raises(ConfigError, match="users"):
        partition(torch.tensor([0, 1, 0, 1, 0, 1]), 2, "iid", users=users)  # ids are read by 'natural' only


@given(n=st.integers(1, 200), n_users=st.integers(1, 30), seed=st.integers(0, 2**32))
def test_property_natural(n: int, n_users: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    users = torch.tensor(rng.integers(0, n_users, n))
    y = torch.tensor(rng.integers(0, 4, n))
    present = len(torch.unique(users))
    workers = int(rng.integers(1, present + 1))
    parts = partition(y, workers, "natural", users=users, seed=seed)
    assert len(parts) == workers
    owners = [set(users[p].tolist()) for p in parts]
    assert all(len(o) == 1 for o in owners) and len(set().union(*owners)) == workers  # one distinct user each
    for p in parts:  # a worker holds all of its user's samples
        assert p.tolist() == torch.nonzero(users == users[p[0]]).flatten().tolist()
    if workers == present:
        assert_is_partition(parts, n, workers)
