"""Small-sample statistics behind the trend verdicts: t quantiles, intervals, slopes."""

from __future__ import annotations

import math

import pytest

from phalanx.analysis.stats import Estimate, mean_ci, slope, t_quantile_975
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
