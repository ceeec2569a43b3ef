"""Small-sample statistics behind the trend verdicts: t quantiles, intervals, slopes, paired p-values and Holm's
adjustment for a family of comparisons."""

from __future__ import annotations

import math

import pytest

from phalanx.analysis.stats import Estimate, holm, mean_ci, slope, t_quantile_975
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


def _with_p(p: float, df: int = 3) -> Estimate:
    """An estimate of mean 1 whose one-sample t p-value (df degrees of freedom) is ``p``."""
    from scipy import stats as sstats

    half = t_quantile_975(df) / float(sstats.t.isf(p / 2, df))
    return Estimate(1.0, 1.0 - half, 1.0 + half, df + 1)


def test_holm_by_hand_and_against_its_mutants() -> None:
    """Holm's step-down: sorted p (0.005, 0.01, 0.03, 0.04) × (4, 3, 2, 1) = (0.02, 0.03, 0.06, 0.04), made
    monotone: the last is 0.06, not 0.04. Bonferroni (× m everywhere) would give (0.02, 0.04, 0.12, 0.16); the
    unadjusted p would reject all four at 0.05, Holm two."""
    p = [0.01, 0.04, 0.03, 0.005]
    adj = [e.p_adjusted for e in holm([_with_p(x) for x in p])]
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-9)
    assert sum(a is not None and a < 0.05 for a in adj) == 2 and sum(x < 0.05 for x in p) == 4
    assert adj != pytest.approx([min(1.0, 4 * x) for x in p])  # not Bonferroni
    assert [e.p_adjusted for e in holm([_with_p(0.5), _with_p(0.9)])] == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_a_paired_difference_p_value_is_the_paired_t_test() -> None:
    """Studies read a paired difference as mean_ci(a − b): its p-value is scipy's paired t-test on (a, b)."""
    from scipy import stats as sstats

    a, b = [0.91, 0.93, 0.90, 0.95], [0.10, 0.12, 0.08, 0.11]
    d = mean_ci([x - y for x, y in zip(a, b)])
    assert d.p_value() == pytest.approx(float(sstats.ttest_rel(a, b).pvalue), rel=1e-3)


def test_p_value_is_scipys_one_sample_t_test_and_agrees_with_the_interval() -> None:
    from scipy import stats as sstats

    for xs in ([1.0, 2.0, 3.0], [0.1, -0.2, 0.05, 0.3], [5.0, 5.1, 4.9, 5.2, 5.05]):
        assert mean_ci(xs).p_value() == pytest.approx(float(sstats.ttest_1samp(xs, 0.0).pvalue), rel=1e-3)
    # the interval excludes 0 exactly when p < 0.05 (the table's t quantile has 3 decimals: away from the edge)
    e = mean_ci([0.70, 0.72, 0.74])
    assert (e.low > 0) == (e.p_value() < 0.05)
    assert mean_ci([1.0, 1.0, 1.0]).p_value() is None and mean_ci([1.0, 2.0]).p_value() is None


def _holm_reference(ps: list[float], alpha: float) -> list[bool]:
    """Holm's procedure as he states it (rejections, not adjusted p-values): with p₍₁₎ ≤ … ≤ p₍ₘ₎, reject H₍₁₎ … H₍ⱼ₎
    while p₍ᵢ₎ ≤ α / (m − i + 1); stop at the first that fails."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [False] * len(ps)
    for rank, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - rank):
            break
        out[i] = True
    return out


def test_holm_rejects_what_holms_procedure_rejects() -> None:
    """The adjusted p-values give the same rejections as the step-down procedure written independently."""
    import random

    from phalanx.analysis.stats import ALPHA, holm

    rng = random.Random(7)
    for _ in range(200):
        m = rng.randint(1, 12)
        es = [mean_ci([rng.gauss(rng.choice([0.0, 0.0, 1.5]), 1.0) for _ in range(rng.randint(3, 6))])
              for _ in range(m)]
        adjusted = holm(es)
        ps = [e.p_value() for e in es]
        assert all(p is not None for p in ps)
        ref = _holm_reference([float(p) for p in ps if p is not None], ALPHA)
        assert [a.p_adjusted is not None and a.p_adjusted < ALPHA for a in adjusted] == ref
        assert all(a.family == m for a in adjusted)


def test_holm_controls_the_family_wise_error_and_its_mutant_does_not() -> None:
    """Twenty true nulls at three seeds each: reading every per-comparison verdict finds at least one false effect in
    most families (1 − 0.95²⁰ ≈ 64 %), Holm's in at most α of them (binomial margin at 400 families); the mutant that
    skips the correction (m = 1) is caught by the same check."""
    import random

    from phalanx.analysis.stats import ALPHA, holm

    rng = random.Random(11)
    families, with_false = 400, {"holm": 0, "uncorrected": 0}
    for _ in range(families):
        es = [mean_ci([rng.gauss(0.0, 1.0) for _ in range(3)]) for _ in range(20)]
        with_false["holm"] += any(e.side("below", "above") != "no difference shown" for e in holm(es))
        with_false["uncorrected"] += any(e.side("below", "above") != "no difference shown" for e in es)
    margin = 3 * math.sqrt(ALPHA * (1 - ALPHA) / families)  # three binomial standard errors
    assert with_false["holm"] / families <= ALPHA + margin
    assert with_false["uncorrected"] / families > ALPHA + margin  # the mutant fails the check


def test_corrected_verdicts_skip_what_decides_nothing_and_keep_direction() -> None:
    from phalanx.analysis.stats import holm

    strong, weak = mean_ci([1.0, 1.1, 1.2, 1.3]), mean_ci([0.70, 0.72, 0.74])
    out = holm([strong, None, mean_ci([1.0, 2.0]), weak, mean_ci([-3.0, -3.1, -2.9])])
    assert out[1] is None and out[2] is not None and out[2].p_adjusted is None  # two seeds: not in the family
    assert out[0] is not None and out[0].family == 3 and out[0].verdict("positive") == "holds"
    assert out[4] is not None and out[4].verdict("positive") == "contradicted"
    assert out[4].side("below", "above") == "below"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_seed_is_named_not_called_zero_width(bad: float) -> None:
    """A NaN or infinite seed was reported as "zero width: every seed gives the same value" — the wrong reason."""
    e = mean_ci([bad, 1.0, 2.0])
    why = e.why_no_verdict()
    assert why is not None and "not finite" in why and "zero width" not in why
    assert e.side("below", "above").startswith("no verdict (1 seed not finite")


def test_zero_width_is_relative_to_the_samples_own_size() -> None:
    """Clearly different tiny samples have an interval (an absolute floor of 8·eps called them zero width); equal
    samples of any size still have none."""
    assert mean_ci([1e-16, 2e-16, 3e-16, 2e-16]).side("below", "above") == "above"
    assert mean_ci([1e-300, 1.1e-300, 1.2e-300]).side("below", "above") == "above"
    for v in (5.0, 1e-300, 0.0):
        assert "zero width" in (mean_ci([v, v, v]).why_no_verdict() or "")


def test_huge_samples_do_not_overflow() -> None:
    """The deviations are centred and scaled before squaring: (1e300)² raised OverflowError."""
    e = mean_ci([1e300, 1.1e300, 1.2e300])
    ref = mean_ci([1.0, 1.1, 1.2])
    assert e.mean == pytest.approx(1.1e300) and e.half_width == pytest.approx(ref.half_width * 1e300, rel=1e-12)
    assert e.side("below", "above") == "above"
