"""Small-sample statistics behind the trend verdicts: t quantiles, intervals, slopes, paired p-values and Holm's
adjustment for a family of comparisons."""

from __future__ import annotations

import math

import pytest

from phalanx.analysis.stats import Estimate, holm, mean_ci, paired_p, slope, t_quantile_975, t_two_sided_p
from phalanx.errors import ConfigError


def test_t_quantiles_match_tables_and_approach_normal() -> None:
    assert t_quantile_975(1) == pytest.approx(12.706)
    assert t_quantile_975(2) == pytest.approx(4.303)
    assert t_quantile_975(30) == pytest.approx(2.042)
    assert t_quantile_975(40) == pytest.approx(2.021, abs=2e-3)  # table value
    assert t_quantile_975(120) == pytest.approx(1.980, abs=2e-3)
    assert t_quantile_975(10**6) == pytest.approx(1.960, abs=1e-3)
    with pytest.raises(ConfigError, match="df"):
        t_quantile_975(0)


def test_mean_ci_by_hand() -> None:
    e = mean_ci([1.0, 2.0, 3.0])
    # mean 2, sd 1, half-width t(2) / sqrt(3)
    assert e.mean == pytest.approx(2.0)
    assert e.half_width == pytest.approx(4.303 / math.sqrt(3))
    single = mean_ci([5.0])
    assert single.low == -math.inf and single.high == math.inf
    with pytest.raises(ConfigError):
        mean_ci([])


def test_verdicts() -> None:
    assert Estimate(-1.0, -2.0, -0.5, 3).verdict("negative") == "holds"
    assert Estimate(1.0, 0.5, 2.0, 3).verdict("negative") == "contradicted"
    assert Estimate(0.1, -0.5, 0.7, 3).verdict("negative") == "inconclusive"
    assert Estimate(1.0, 0.5, 2.0, 3).verdict("positive") == "holds"
    with pytest.raises(ConfigError, match="expect"):
        Estimate(0, 0, 0, 1).verdict("down")


def test_slope() -> None:
    assert slope([0, 1, 2, 3], [1.0, 0.8, 0.6, 0.4]) == pytest.approx(-0.2)
    assert slope([0, 1, 2], [5.0, 5.0, 5.0]) == 0.0
    with pytest.raises(ConfigError):
        slope([1, 1], [0.0, 1.0])
    with pytest.raises(ConfigError):
        slope([1], [0.0])


def test_no_verdict_and_no_interval_from_fewer_than_three_seeds_or_a_zero_width_interval() -> None:
    """experiment hbn --seeds 2 printed '−2.82 [−2.82, −2.82] GroupNorm better' and '± 283.5' on a 0–100 scale."""
    from phalanx.analysis.stats import MIN_SEEDS

    two = mean_ci([0.70, 0.72])
    assert MIN_SEEDS == 3 and two.why_no_verdict() == "2 seeds, 3 needed"
    assert two.side("worse", "better") == "no verdict (2 seeds, 3 needed)"
    assert two.verdict("positive") == "no verdict (2 seeds, 3 needed)"
    assert two.show(100) == "71.0 (2 seeds: no interval)"
    same = mean_ci([-0.0282, -0.0282, -0.0282])
    says = "no verdict (zero width: every seed gives the same value)"
    assert same.side("GroupNorm better", "BatchNorm better") == says
    three = mean_ci([0.70, 0.72, 0.74])
    assert three.why_no_verdict() is None and three.side("worse", "better") == "better"
    assert three.show(100) == "72.0 ± 5.0" and three.verdict("positive") == "holds"
    assert two.interval(100) == "—" and three.interval(100) == "[+67.03, +76.97]"


@pytest.mark.parametrize("df", [1, 2, 4, 9, 30, 200])
def test_t_p_values_match_scipy(df: int) -> None:
    """The incomplete-beta evaluation against scipy's Student t (a reference, test-only) to 1e-10 relative."""
    stats = pytest.importorskip("scipy.stats")
    for t in (0.0, 0.1, 1.0, 2.0, 2.776, 4.303, 12.706, 50.0, -3.0):
        want = 2 * stats.t.sf(abs(t), df)
        assert t_two_sided_p(t, df) == pytest.approx(want, rel=1e-10, abs=1e-15)
    assert t_two_sided_p(math.inf, df) == 0.0
    # the 95 % quantile table and the p-value agree: p(t_0.975) = 0.05 (the table has 3 decimals)
    assert t_two_sided_p(t_quantile_975(df), df) == pytest.approx(0.05, rel=2e-3 if df < 30 else 2e-2)


def test_paired_p_is_the_one_sample_t_test() -> None:
    stats = pytest.importorskip("scipy.stats")
    xs = [0.8, 0.81, 0.83, 0.79]
    assert paired_p(xs) == pytest.approx(stats.ttest_1samp(xs, 0.0).pvalue, rel=1e-10)
    assert paired_p([0.0, 0.0, 0.0]) == 1.0 and paired_p([0.2, 0.2, 0.2]) == 0.0  # zero width
    for bad in ([1.0], [1.0, math.nan]):
        with pytest.raises(ConfigError, match="differences"):
            paired_p(bad)


def test_holm_by_hand_and_against_its_mutants() -> None:
    """Holm's step-down: sorted p (0.005, 0.01, 0.03, 0.04) × (4, 3, 2, 1) = (0.02, 0.03, 0.06, 0.04), made
    monotone: the last is 0.06, not 0.04. Bonferroni (× m everywhere) would give (0.02, 0.04, 0.12, 0.16); the
    unadjusted p would reject all four at 0.05, Holm two."""
    p = [0.01, 0.04, 0.03, 0.005]
    adj = holm(p)
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert sum(a < 0.05 for a in adj) == 2 and sum(x < 0.05 for x in p) == 4
    assert adj != pytest.approx([min(1.0, 4 * x) for x in p])  # not Bonferroni
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([]) == []
    with pytest.raises(ConfigError, match="pvalues"):
        holm([0.1, 1.5])
