"""Small-sample statistics for experiment reports: means with Student-t confidence intervals, per-seed slopes.

Experiments here have few seeds (3–10), so intervals use Student's t with ``k − 1`` degrees of freedom, not the
normal approximation. Comparisons are *paired by seed*: runs with the same seed share the data split, the initial
model and the batch stream (the named random streams of :mod:`phalanx.training.streams`), so a per-seed difference
or slope removes that shared noise before the interval is taken.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from phalanx.errors import ConfigError

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

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def why_no_verdict(self, what: str = "value", magnitude: float | None = None) -> str | None:
        """Why this estimate decides nothing — fewer than :data:`MIN_SEEDS` samples, or an interval of zero width
        (every sample the same ``what``, up to rounding at ``magnitude``, the samples' largest size; default the
        mean's) — else None."""
        if self.k < MIN_SEEDS:
            return f"{self.k} seed{'s' if self.k != 1 else ''}, {MIN_SEEDS} needed"
        size = abs(self.mean) if magnitude is None else magnitude
        if not math.isfinite(self.half_width) or self.half_width <= 8 * sys.float_info.epsilon * max(1.0, size):
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
        return below if self.high < 0 else (above if self.low > 0 else neither)

    def verdict(self, expect: str) -> str:
        """``holds`` if the whole interval has the expected sign (``"negative"`` or ``"positive"``), ``contradicted``
        if the whole interval has the opposite sign, else ``inconclusive``; ``no verdict (why)`` when it decides
        nothing (:meth:`why_no_verdict`)."""
        if expect not in ("negative", "positive"):
            raise ConfigError("expect", expect, "'negative' or 'positive'")
        why = self.why_no_verdict()
        if why is not None:
            return f"no verdict ({why})"
        below, above = self.high < 0, self.low > 0
        if expect == "negative":
            return "holds" if below else ("contradicted" if above else "inconclusive")
        return "holds" if above else ("contradicted" if below else "inconclusive")


def mean_ci(values: Sequence[float]) -> Estimate:
    """Mean and 95 % Student-t interval of ``values`` (at least one finite value)."""
    xs = [float(v) for v in values]
    if not xs:
        raise ConfigError("values", values, "at least one value")
    k = len(xs)
    m = sum(xs) / k
    if k == 1:
        return Estimate(m, -math.inf, math.inf, 1)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (k - 1))
    h = t_quantile_975(k - 1) * sd / math.sqrt(k)
    return Estimate(m, m - h, m + h, k)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Ordinary least-squares slope of ``ys`` on ``xs`` (at least two distinct ``xs``)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ConfigError("xs", list(xs), "two or more points, as many as ys")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ConfigError("xs", list(xs), "at least two distinct values")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function, evaluated by the modified Lentz method
    (for x < (a + 1)/(a + b + 2), where it converges quickly)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function :math:`I_x(a, b)` for a, b > 0 and 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """The two-sided p-value :math:`P(|T_{df}| \\ge |t|)` of Student's t with ``df`` degrees of freedom:
    :math:`I_{df/(df + t^2)}(df/2, 1/2)`."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ConfigError("df", df, "an integer >= 1")
    if math.isnan(t):
        raise ConfigError("t", t, "a number (not NaN)")
    if math.isinf(t):
        return 0.0
    return min(1.0, _betainc(df / 2.0, 0.5, df / (df + t * t)))


def paired_p(differences: Sequence[float]) -> float:
    """The two-sided p-value of the one-sample t-test of mean 0 on paired differences (at least two values): 1 when
    every difference is 0, 0 when they are all the same non-zero value (a zero-width interval)."""
    xs = [float(v) for v in differences]
    if len(xs) < 2 or not all(math.isfinite(v) for v in xs):
        raise ConfigError("differences", differences, "two or more finite values")
    k = len(xs)
    m = sum(xs) / k
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (k - 1))
    if sd <= 8 * sys.float_info.epsilon * max(1.0, max(abs(x) for x in xs)):
        return 1.0 if m == 0 else 0.0
    return t_two_sided_p(m / (sd / math.sqrt(k)), k - 1)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``pvalues`` for the family they form (Holm, "A simple sequentially rejective
    multiple test procedure", Scand. J. Statist. 6, 1979): with :math:`p_{(1)} \\le \\dots \\le p_{(m)}`, the
    adjusted :math:`\\tilde p_{(i)} = \\min\\big(1, \\max_{j \\le i}(m - j + 1)\\,p_{(j)}\\big)`, returned in the
    input's order. Rejecting where :math:`\\tilde p < \\alpha` keeps the family-wise error at most α under any
    dependence between the tests."""
    ps = [float(p) for p in pvalues]
    if not all(0.0 <= p <= 1.0 for p in ps):
        raise ConfigError("pvalues", pvalues, "numbers in [0, 1]")
    m = len(ps)
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: ps[j])):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out
