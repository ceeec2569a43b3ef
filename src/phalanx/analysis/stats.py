"""Small-sample statistics for experiment reports: means with Student-t confidence intervals, per-seed slopes,
and verdicts corrected for how many were read.

Experiments here have few seeds (3–10), so intervals use Student's t with ``k − 1`` degrees of freedom, not the
normal approximation. Comparisons are *paired by seed*: runs with the same seed share the data split, the initial
model and the batch stream (the named random streams of :mod:`phalanx.training.streams`), so a per-seed difference
or slope removes that shared noise before the interval is taken.

**Many verdicts.** A report that reads K verdicts at level α = 0.05 each would show about 0.05·K false ones by chance.
Every study's table of verdicts is one *family*: :func:`holm` gives each estimate its Holm-adjusted p-value (Holm,
"A simple sequentially rejective multiple test procedure", Scand. J. Statist. 6, 1979: sort the m p-values,
p̃₍ᵢ₎ = maxⱼ≤ᵢ min(1, (m − j + 1)·p₍ⱼ₎), which controls the family-wise error rate at α under any dependence between
the tests), and :meth:`Estimate.side` / :meth:`Estimate.verdict` then decide on p̃ < α instead of on the
per-comparison interval. The p-value is the two-sided one-sample t test of mean 0 (:meth:`Estimate.p_value`, scipy's
Student t): exactly the test whose rejection is "the 95 % interval excludes 0", so an uncorrected verdict is unchanged.
The intervals shown stay the per-comparison 95 % ones (reports say so).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

from phalanx.errors import ConfigError

ALPHA = 0.05
"""The family-wise error rate of a report's verdicts (and the level of every per-comparison interval: 95 %)."""
MIN_SEEDS = 3
"""The fewest seeds an interval is shown and a verdict drawn from (a t-interval from two is 12.7 standard errors
wide: on an accuracy scale it reaches past 0 and 100)."""
# Two-sided 95 % quantiles t_{0.975, df} for df = 1 … 30 (standard tables); the normal 1.960 beyond.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)


def t_quantile_975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (two-sided 95 % intervals)."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ConfigError("df", df, "an integer >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    # Beyond the table: Cornish-Fisher expansion around the normal quantile (error < 1e-3 for df > 30).
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Estimate:
    """A sample mean with its 95 % confidence interval (``low``, ``high``); one sample gives an unbounded interval."""

    mean: float
    low: float
    high: float
    k: int
    p_adjusted: float | None = None
    """The Holm-adjusted p-value of this estimate within its report's family (:func:`holm`); None: not corrected,
    the verdict is the per-comparison interval's."""
    family: int = 1
    """How many comparisons the family held (1: not corrected)."""
    scale: float = math.nan
    """The samples' largest size max|xᵢ| (:func:`mean_ci`; NaN where not known): what "zero width" is relative to."""
    nonfinite: int = 0
    """How many samples were NaN or infinite (:func:`mean_ci`): such an estimate decides nothing."""
    samples: tuple[float, ...] = field(default=(), repr=False)
    """The samples themselves (:func:`mean_ci`; empty where not known), for a check of each beside the mean's."""

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def p_value(self) -> float | None:
        """Two-sided p-value of the one-sample t test of mean 0 with ``k − 1`` degrees of freedom, recovered from the
        interval (standard error = half-width / t₀.₉₇₅,ₖ₋₁); None when the estimate decides nothing
        (:meth:`why_no_verdict`)."""
        if self.why_no_verdict() is not None:
            return None
        from scipy import stats as sstats  # lazy: only reports read p-values

        se = self.half_width / t_quantile_975(self.k - 1)
        return float(2 * sstats.t.sf(abs(self.mean) / se, self.k - 1))

    def holm_text(self) -> str:
        """The Holm-adjusted p-value as a table cell (two significant digits), or — where it was not corrected (not
        in a family, or deciding nothing)."""
        return "—" if self.p_adjusted is None else f"{self.p_adjusted:.2g}"

    def _decided(self) -> tuple[bool, bool]:
        """(below 0, above 0): by the Holm-adjusted p-value when the estimate was corrected, else by the interval."""
        if self.p_adjusted is None:
            return self.high < 0, self.low > 0
        shown = self.p_adjusted < ALPHA
        return shown and self.mean < 0, shown and self.mean > 0

    def why_no_verdict(self, what: str = "value", magnitude: float | None = None) -> str | None:
        """Why this estimate decides nothing — a sample that is NaN or infinite, fewer than :data:`MIN_SEEDS`
        samples, or an interval of zero width (every sample the same ``what`` up to rounding: a half-width of at most
        8·eps times ``magnitude``, the samples' largest size; default :attr:`scale`, else the mean's) — else None.
        The zero width is relative to the samples' own size, so [1e-16, 2e-16, 3e-16, 2e-16] has an interval."""
        if self.nonfinite:
            return (f"{self.nonfinite} seed{'s' if self.nonfinite != 1 else ''} not finite (NaN or ∞): no mean to "
                    "test")
        if self.k < MIN_SEEDS:
            return f"{self.k} seed{'s' if self.k != 1 else ''}, {MIN_SEEDS} needed"
        if not (math.isfinite(self.mean) and math.isfinite(self.half_width)):
            return f"not finite: the mean {what} or its interval is NaN or ∞"
        size = magnitude if magnitude is not None else self.scale if math.isfinite(self.scale) else abs(self.mean)
        if self.half_width <= 8 * sys.float_info.epsilon * size:
            return f"zero width: every seed gives the same {what}"
        return None

    def show(self, scale: float = 1.0, digits: int = 1, sign: str = "") -> str:
        """``mean ± half-width`` (times ``scale``), or the mean alone with why there is no interval (fewer than
        :data:`MIN_SEEDS` seeds: an interval from two is wider than the scale it is on)."""
        mean = f"{scale * self.mean:{sign}.{digits}f}"
        if self.k < MIN_SEEDS:
            return f"{mean} ({self.k} seed{'s' if self.k != 1 else ''}: no interval)"
        return f"{mean} ± {scale * self.half_width:.{digits}f}"

    def interval(self, scale: float = 1.0, digits: int = 2, sign: str = "+") -> str:
        """``[low, high]`` (times ``scale``), or ``—`` with fewer than :data:`MIN_SEEDS` seeds."""
        if self.k < MIN_SEEDS:
            return "—"
        return f"[{scale * self.low:{sign}.{digits}f}, {scale * self.high:{sign}.{digits}f}]"

    def side(self, below: str, above: str, neither: str = "no difference shown") -> str:
        """``below`` if the whole interval is below 0, ``above`` if it is above, else ``neither``: the verdict of a
        paired difference; ``no verdict (why)`` when it decides nothing (:meth:`why_no_verdict`)."""
        why = self.why_no_verdict()
        if why is not None:
            return f"no verdict ({why})"
        is_below, is_above = self._decided()
        return below if is_below else (above if is_above else neither)

    def verdict(self, expect: str) -> str:
        """``holds`` if the whole interval has the expected sign (``"negative"`` or ``"positive"``), ``contradicted``
        if the whole interval has the opposite sign, else ``inconclusive``; ``no verdict (why)`` when it decides
        nothing (:meth:`why_no_verdict`)."""
        if expect not in ("negative", "positive"):
            raise ConfigError("expect", expect, "'negative' or 'positive'")
        why = self.why_no_verdict()
        if why is not None:
            return f"no verdict ({why})"
        below, above = self._decided()
        if expect == "negative":
            return "holds" if below else ("contradicted" if above else "inconclusive")
        return "holds" if above else ("contradicted" if below else "inconclusive")


MaybeEstimate = TypeVar("MaybeEstimate", bound="Estimate | None")


def holm(estimates: Sequence[MaybeEstimate]) -> list[MaybeEstimate]:
    """The estimates of one family of verdicts with their Holm-adjusted p-values (see the module's docstring); an
    estimate that decides nothing (None, fewer than :data:`MIN_SEEDS` seeds, zero width) is not counted in the
    family and comes back unchanged. Order is kept."""
    ps = [(i, e.p_value()) for i, e in enumerate(estimates) if e is not None]
    tested = sorted(((p, i) for i, p in ps if p is not None))
    m = len(tested)
    out = list(estimates)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        e = out[i]
        assert e is not None
        out[i] = cast(MaybeEstimate, replace(e, p_adjusted=running, family=m))
    return out


def mean_ci(values: Sequence[float]) -> Estimate:
    """Mean and 95 % Student-t interval of ``values`` (at least one value). A NaN or infinite value gives an estimate
    that decides nothing and says why (:attr:`Estimate.nonfinite`); the deviations are centred and scaled before
    they are squared, so values near the largest float do not overflow."""
    xs = [float(v) for v in values]
    if not xs:
        raise ConfigError("values", values, "at least one value")
    k = len(xs)
    bad = sum(not math.isfinite(x) for x in xs)
    if bad:
        return Estimate(math.nan, math.nan, math.nan, k, nonfinite=bad, samples=tuple(xs))
    scale = max(abs(x) for x in xs)
    m = sum(xs) / k
    if not math.isfinite(m):  # the sum overflowed: average the shares instead
        m = sum(x / k for x in xs)
    if k == 1:
        return Estimate(m, -math.inf, math.inf, 1, scale=scale, samples=tuple(xs))
    top = max(abs(x - m) for x in xs)
    try:
        squares = sum((x - m) ** 2 for x in xs)
    except OverflowError:
        squares = math.inf
    if top == 0.0:
        sd = 0.0
    elif math.isfinite(squares) and squares > 1e-280:  # the plain sum where it neither overflows nor underflows
        sd = math.sqrt(squares / (k - 1))
    else:
        sd = top * math.sqrt(sum(((x - m) / top) ** 2 for x in xs) / (k - 1))
    h = t_quantile_975(k - 1) * sd / math.sqrt(k)
    return Estimate(m, m - h, m + h, k, scale=scale, samples=tuple(xs))


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Ordinary least-squares slope of ``ys`` on ``xs`` (at least two distinct ``xs``)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ConfigError("xs", list(xs), "two or more points, as many as ys")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ConfigError("xs", list(xs), "at least two distinct values")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
