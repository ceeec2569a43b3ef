"""Tests of SignGuard (Xu, Huang, Song & Lan, ICDCS 2022)."""

from __future__ import annotations

import math

import pytest
import torch

from phalanx.aggregators import make
from phalanx.aggregators.signguard import SignGuard, mean_shift_labels, sign_features
from phalanx.errors import ConfigError

ONES = torch.ones(8, dtype=torch.float64)


def _same_partition(a: list[int], b: list[int]) -> bool:
    """Equal up to renaming the clusters, with the outliers (-1) in the same places."""
    if [u == -1 for u in a] != [v == -1 for v in b]:
        return False
    forward: dict[int, int] = {}
    backward: dict[int, int] = {}
    for u, v in zip(a, b):
        if u == -1:
            continue
        if forward.setdefault(u, v) != v or backward.setdefault(v, u) != u:
            return False
    return True


def test_sign_features_by_hand() -> None:
    sub = torch.tensor([[1.0, -2.0, 0.0, 3.0], [-1.0, -1.0, -1.0, -1.0], [float("nan"), 1.0, 0.0, -0.0]])
    expected = torch.tensor([[0.5, 0.25, 0.25], [0.0, 0.0, 1.0], [0.25, 0.75, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(sign_features(sub), expected)


def test_mean_shift_by_hand() -> None:
    # Five points at 0 and two at (1,1,1): bandwidth = mean distance to the 3rd nearest point (self first)
    # = (5 * 0 + 2 * sqrt3) / 7 < sqrt3, so the groups stay apart; the larger one is labelled 0.
    pts = torch.tensor([[0.0, 0.0, 0.0]] * 5 + [[1.0, 1.0, 1.0]] * 2, dtype=torch.float64)
    assert mean_shift_labels(pts).tolist() == [0, 0, 0, 0, 0, 1, 1]


def test_mean_shift_single_point_and_identical_points() -> None:
    assert mean_shift_labels(torch.zeros(1, 3)).tolist() == [0]
    assert mean_shift_labels(torch.ones(4, 3)).tolist() == [0, 0, 0, 0]


def test_mean_shift_leaves_far_points_unlabelled() -> None:
    pts = torch.tensor([[0.0], [0.01], [0.02], [0.03], [5.0]], dtype=torch.float64)
    labels = mean_shift_labels(pts).tolist()
    assert labels[:4] == [0, 0, 0, 0]
    assert labels[4] != 0


def test_mean_shift_matches_scikit_learn() -> None:
    cluster = pytest.importorskip("sklearn.cluster")
    g = torch.Generator().manual_seed(0)
    for t in range(8):
        n = int(torch.randint(4, 30, (1,), generator=g))
        pts = torch.rand(n, 3, generator=g, dtype=torch.float64)
        if t % 2:
            pts[: n // 3] += 0.6
        bandwidth = cluster.estimate_bandwidth(pts.numpy(), quantile=0.5)
        sk = cluster.MeanShift(bandwidth=bandwidth, cluster_all=False).fit(pts.numpy()).labels_.tolist()
        assert _same_partition(sk, mean_shift_labels(pts).tolist()), (t, sk)


def test_hand_example_sign_flipped_rows_are_removed() -> None:
    # Honest rows c * ones (c = 1..5), attackers -3 * ones. Norms c*sqrt8 and 3*sqrt8; median 3*sqrt8, so every
    # row passes the norm filter [0.3, 9] * median. Signs: honest all positive, attackers all negative -> two
    # clusters, the honest one larger. Output: the honest rows clipped to norm 3*sqrt8, i.e. min(c, 3) * ones,
    # averaged: (1 + 2 + 3 + 3 + 3) / 5 = 2.4.
    c = [1.0, 2.0, 3.0, 4.0, 5.0]
    x = torch.stack([ci * ONES for ci in c] + [-3.0 * ONES, -3.0 * ONES])
    out, contrib = SignGuard(f=2, subsample=1.0).aggregate(x)
    torch.testing.assert_close(out, 2.4 * ONES)
    torch.testing.assert_close(contrib, torch.tensor([0.2] * 5 + [0.0, 0.0], dtype=torch.float64))


def test_hand_example_norm_filter() -> None:
    # Norms (in units of sqrt8): 1, 2, 3, 4, 5, 100, 0.01 -> median 3; [0.3, 9] keeps rows 0-4.
    # Output: min(c, 3) averaged over rows 0-4 = 2.4.
    x = torch.stack([c * ONES for c in [1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 0.01]])
    out, contrib = SignGuard(f=2, subsample=1.0).aggregate(x)
    torch.testing.assert_close(out, 2.4 * ONES)
    assert (contrib > 0).tolist() == [True] * 5 + [False, False]


def test_norm_bounds_are_parameters() -> None:
    x = torch.stack([c * ONES for c in [1.0, 2.0, 3.0, 4.0, 5.0]])
    # upper=1.2: 4/3 and 5/3 are above 1.2 * median; lower=0.5: 1/3 is below.
    _, contrib = SignGuard(f=1, subsample=1.0, lower=0.5, upper=1.2).aggregate(x)
    assert (contrib > 0).tolist() == [False, True, True, False, False]


def test_empty_intersection_falls_back_to_the_norm_filter() -> None:
    # Largest sign cluster: three all-positive rows of norm 100*sqrt8 -- all above 3 x the median (1*sqrt8).
    # The two other sign patterns (all negative; half/half) have norm sqrt8 and are kept by the fallback.
    half = torch.tensor([1.0, -1.0] * 4, dtype=torch.float64)
    x = torch.stack([100.0 * ONES] * 3 + [-ONES, -ONES, half, half])
    out, contrib = SignGuard(f=3, subsample=1.0).aggregate(x)
    assert (contrib > 0).tolist() == [False] * 3 + [True] * 4
    torch.testing.assert_close(out, (-2.0 * ONES + 2.0 * half) / 4)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_bad_rows_never_pass(garbage: float) -> None:
    g = torch.Generator().manual_seed(0)
    honest = torch.rand(8, 64, generator=g) + 0.5
    x = torch.cat([torch.full((3, 64), garbage), honest])
    out, contrib = SignGuard(f=3, seed=1).aggregate(x)
    assert torch.isfinite(out).all()
    assert contrib[:3].tolist() == [0.0, 0.0, 0.0]
    assert abs(float(contrib.sum()) - 1.0) < 1e-12
    assert float((out - honest.mean(0)).norm() / honest.mean(0).norm()) < 0.2


def test_more_bad_rows_than_half_give_zero_not_crash() -> None:
    x = torch.ones(5, 4)
    x[:3] = float("nan")
    out, contrib = SignGuard(f=2).aggregate(x)
    assert torch.equal(out, torch.zeros(4)) and float(contrib.sum()) == 0.0


def test_identical_rows_return_that_row() -> None:
    row = torch.tensor([1.0, -2.0, 0.0, 4.0])
    out, contrib = SignGuard(f=2).aggregate(row.repeat(6, 1))
    torch.testing.assert_close(out, row)
    torch.testing.assert_close(contrib, torch.full((6,), 1 / 6, dtype=torch.float64))


def test_permutation_invariance_with_the_same_seed() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(11, 500, generator=g, dtype=torch.float64) + 0.3
    x[:3] = -x[:3] * 2.0
    perm = torch.randperm(11, generator=g)
    out, contrib = SignGuard(f=3, seed=5).aggregate(x)
    out_p, contrib_p = SignGuard(f=3, seed=5).aggregate(x[perm])
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(contrib_p, contrib[perm])


def test_deterministic_for_a_seed() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 300, generator=g)
    a, b = SignGuard(f=2, seed=9, subsample=0.05), SignGuard(f=2, seed=9, subsample=0.05)
    for _ in range(3):
        assert torch.equal(a(x), b(x))


def test_input_not_modified() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, 40, generator=g)
    x[0] = float("nan")
    x0 = x.clone()
    SignGuard(f=2)(x)
    assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(x0)) and torch.equal(x.isnan(), x0.isnan())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_is_kept(dtype: torch.dtype) -> None:
    x = torch.stack([c * ONES for c in [1.0, 2.0, 3.0, 4.0, 5.0]] + [-3.0 * ONES, -3.0 * ONES])
    out = SignGuard(f=2, subsample=1.0)(x.to(dtype))
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), 2.4 * ONES, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [({"f": -1}, "f"), ({"lower": -0.1}, "lower"), ({"lower": 1.5}, "lower"), ({"upper": 0.5}, "upper"),
     ({"upper": math.inf}, "upper"), ({"subsample": 0.0}, "subsample"), ({"subsample": 1.5}, "subsample"),
     ({"seed": -3}, "seed")],
)
def test_invalid_configuration(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        SignGuard(**kwargs)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


def test_too_few_rows_and_metadata() -> None:
    agg = SignGuard(f=2)
    assert agg.min_workers() == 5
    with pytest.raises(ConfigError) as info:
        agg(torch.ones(4, 3))
    assert info.value.parameter == "n"
    assert agg.params() == {"f": 2, "lower": 0.1, "upper": 3.0, "subsample": 0.1, "seed": 0}
    assert "ICDCS 2022" in agg.reference
    assert isinstance(make("signguard(subsample=0.5)", f=1), SignGuard)


def _reference(rule: SignGuard, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SignGuard with every norm in float64 (the implementation before the one-pass norm filter)."""
    from phalanx.aggregators._rowops import clipped_mean, float64_row_norms, median_norm, row_norms

    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    bad = row_norms(xc)[1]
    norms = float64_row_norms(xc, bad)
    med = median_norm(norms, bad)
    s1 = ~bad & (norms >= rule.lower * med) & (norms <= rule.upper * med)
    k = max(1, int(rule.subsample * x.shape[1]))
    g = torch.Generator().manual_seed(rule.seed)
    sub = xc.index_select(1, torch.randperm(x.shape[1], generator=g)[:k].sort().values) if k < x.shape[1] else xc
    labels = mean_shift_labels(sign_features(sub))
    s2 = labels == int(torch.argmax(torch.bincount(labels[labels >= 0], minlength=1)))
    kept = s1 & s2 if bool((s1 & s2).any()) else s1
    out, share = clipped_mean(xc, kept, norms, bad, med)
    return out.to(x.dtype), share


def _hostile_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    out = []
    for n, d, dtype in [(11, 3000, torch.float32), (12, 70_000, torch.float32), (9, 500, torch.float64),
                        (10, 257, torch.float16)]:
        x = (torch.randn(n, d, generator=g) * 0.1 + 1.0).to(dtype)
        out.append(x)
        ties = x.clone()  # rows whose norms are exactly the median, L·M and R·M (scaled copies of one row)
        base = ties[0].to(torch.float64)
        for i, c in enumerate([1.0, 1.0, 1.0, 0.1, 3.0, 4.0, 0.0, 2.0, 0.5]):
            ties[i] = (base * c).to(dtype)
        out.append(ties)
        bad = x.clone()
        bad[0, 0], bad[1, 1], bad[2] = float("nan"), float("inf"), 0.0
        out.append(bad)
    return out


def _differs(lower: float, upper: float) -> bool:
    for x in _hostile_inputs():
        out, contrib = SignGuard(lower=lower, upper=upper, subsample=0.5).aggregate(x)
        ref_out, ref_contrib = _reference(SignGuard(lower=lower, upper=upper, subsample=0.5), x)
        if not (torch.equal(out.nan_to_num(), ref_out.nan_to_num()) and torch.equal(contrib, ref_contrib)):
            return True
    return False


@pytest.mark.parametrize("lower,upper", [(0.1, 3.0), (0.0, 1.0), (0.9, 1.0), (0.5, 1.5)])
def test_one_pass_norm_filter_matches_float64_norms(lower: float, upper: float) -> None:
    """The one-pass norm filter takes SignGuard's float64-norm decisions bit for bit: same output and
    contributions as every norm in float64, with rows exactly at the median, L·M and R·M, NaN/Inf and zero rows,
    float16/32/64."""
    assert not _differs(lower, upper)


def test_norm_filter_mutant_without_exact_norms_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: decide on the one-pass estimates alone (no exact norm where an interval leaves a decision open).
    The comparison above rejects it."""
    from phalanx.aggregators import signguard

    monkeypatch.setattr(signguard._Exact, "need", lambda self, rows: None)
    assert _differs(0.1, 3.0)


def test_exact_norms_only_where_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """On honest Gaussian rows the float64 norms are taken on fewer rows than n (the median candidates and the
    kept rows above the median), each row at most once; a NaN majority falls back to the float64 path."""
    from phalanx.aggregators import signguard

    rows: list[int] = []
    real = signguard.float64_row_norms

    def counting(
        x: torch.Tensor, bad: torch.Tensor, rows_: torch.Tensor | None = None, largest: torch.Tensor | None = None
    ) -> torch.Tensor:
        rows.append(x.shape[0] if rows_ is None else rows_.numel())
        return real(x, bad, rows_, largest)

    monkeypatch.setattr(signguard, "float64_row_norms",
                        lambda x, bad, rows=None, max_squares=None: counting(x, bad, rows, max_squares))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 20_000, generator=g) * 0.5 + 1.0
    SignGuard().aggregate(x)
    assert 1 <= sum(rows) < 40
    rows.clear()
    x[:21] = float("nan")
    out, contrib = SignGuard().aggregate(x)
    assert rows == [40] and torch.equal(out, torch.zeros(20_000)) and float(contrib.sum()) == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_pass_norm_filter_keeps_the_gradient(dtype: torch.dtype) -> None:
    """The gradient through the clipping factors (exact norms of the clipped rows) is the float64-norm one, bit
    for bit; the estimates that only take decisions carry none."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(9, 300, generator=g, dtype=dtype) + 0.5).requires_grad_()
    out = SignGuard(subsample=1.0)(x)
    out.sum().backward()
    assert x.grad is not None
    grad = x.grad.clone()
    x.grad = None
    ref, _ = _reference(SignGuard(subsample=1.0), x)
    ref.sum().backward()
    assert torch.equal(out, ref) and torch.equal(grad, x.grad)
