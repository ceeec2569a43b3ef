"""Curves drawn on top of each other, made visible (issue 38): a newcomer saw no cwmed in ``convergence.png`` because
its curve lay under krum's, and one line where the mean and cwtm of ``accuracy.png`` reached the same accuracy.

Two curves *coincide* when, at :data:`SHARE_OF_POINTS` of their common x values or more, they are drawn closer than
:data:`LINE_SHARE` of the axis' height (measured in the axis' own units: decades on a log axis) — within two line
widths, so that the later one hides the earlier. Curves that coincide form a group (transitively); within a group
the first drawn gets the thickest line and each later one a thinner line on top, so that every colour shows (a
"cased" line), and each later one's legend label names the curve it lies on: ``krum f=5 (≈ cwmed, drawn over it)``,
or ``=`` instead of ``≈`` when the two agree to rounding (:func:`equal_to_rounding`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

LINE_SHARE = 0.015
"""Two curves closer than this share of the axis' height read as one line: a 1.6 pt line is ≈ 2.4 px wide at 110 dpi,
and two whose centres lie within two line widths (≈ 4.5 px, 1.5 % of a panel's ≈ 300 px plotting height) merge
into one band (``convergence.png``'s cwmed and krum: 0.1 decade apart at most on a 7-decade axis)."""

SHARE_OF_POINTS = 0.9
"""Curves that coincide at this share of their common points or more hide each other (a curve that differs only in
its first rounds is still hidden for the rest)."""

CASING = 2.2
"""How much wider (points) each curve of a group is drawn than the one drawn over it."""

MOST_CASED = 3
"""Groups of more curves are not cased, only noted in the legend: six accuracy curves that all reach 95 % cased
made the first 12.6 pt wide, a band that hid the panel (the README job's ``accuracy.png``, seen after the change)."""


def axis_units(value: float, log: bool) -> float | None:
    """Where ``value`` lies on the axis: log10 on a log axis (None where it cannot be drawn: ≤ 0, or not finite)."""
    if not math.isfinite(value) or (log and value <= 0):
        return None
    return math.log10(value) if log else value


def axis_span(values: Iterable[float], log: bool) -> float:
    """The height of an axis that shows ``values`` (in :func:`axis_units`); 0 when it shows at most one value."""
    pos = [u for v in values if (u := axis_units(v, log)) is not None]
    return max(pos) - min(pos) if pos else 0.0


def equal_to_rounding(a: Sequence[float], b: Sequence[float], terms: int = 1) -> bool:
    """Whether ``a`` and ``b`` agree point by point to float64 rounding: ``|a − b| ≤ 4 · terms · ε₆₄ · max(|a|,
    |b|)`` — ``terms`` values summed into each (a mean over seeds, say) each bring one rounding of relative size ε₆₄
    (Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, §4.2), with a factor 4 of slack."""
    rtol = 4 * max(1, terms) * sys.float_info.epsilon
    return len(a) == len(b) and all(x == y or abs(x - y) <= rtol * max(abs(x), abs(y)) for x, y in zip(a, b))


def coincide(a: Sequence[float], b: Sequence[float], *, log: bool, span: float) -> bool:
    """Whether curves ``a`` and ``b`` (values at the same x) are drawn within :data:`LINE_SHARE` of an axis of height
    ``span`` (axis units) of each other at :data:`SHARE_OF_POINTS` of the points the longer of them draws, or more,
    and at two points at least — a run that diverged at its first round draws one point, and hides no curve."""
    pairs = [(u, v) for x, y in zip(a, b) if (u := axis_units(x, log)) is not None
             and (v := axis_units(y, log)) is not None]
    drawn = max(sum(axis_units(x, log) is not None for x in a), sum(axis_units(y, log) is not None for y in b))
    close = sum(abs(u - v) <= LINE_SHARE * span for u, v in pairs)
    return close >= 2 and close >= SHARE_OF_POINTS * drawn


@dataclass(frozen=True)
class Separation:
    """How to draw one curve of :func:`separate`: its line width, and the note its legend label takes ("" for none)."""

    linewidth: float
    note: str = ""

    def label(self, label: str) -> str:
        """``label`` with the note, if any (inside its closing parenthesis, when it ends in one)."""
        if not self.note:
            return label
        return f"{label[:-1]}; {self.note})" if label.endswith(")") else f"{label} ({self.note})"


def separate(series: Mapping[str, Sequence[float]], *, log: bool, linewidth: float, span: float | None = None,
             terms: int = 1) -> dict[str, Separation]:
    """Per label of ``series`` (in drawing order; values at the same x): its line width and legend note. Curves that
    coincide (:func:`coincide` on an axis of height ``span``, by default the span of every value of ``series``)
    form groups; in a group of g ≤ :data:`MOST_CASED` the k-th drawn (k = 0 … g − 1) gets ``linewidth + CASING ·
    (g − 1 − k)`` (a larger group keeps ``linewidth``) and, from the second on, the note ``≈ first, drawn over
    it`` (``=`` when equal to rounding over ``terms``
    summed values, :func:`equal_to_rounding`). A curve that coincides with none keeps ``linewidth`` and no note."""
    labels = list(series)
    height = axis_span((v for vs in series.values() for v in vs), log) if span is None else span
    group: dict[str, str] = {}  # label → the first label of its group
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            if b not in group and coincide(series[a], series[b], log=log, span=height):
                group[b] = group.get(a, a)
                group.setdefault(a, a)
    members: dict[str, list[str]] = {}
    for label in labels:
        if label in group:
            members.setdefault(group[label], []).append(label)
    out = {label: Separation(linewidth) for label in labels}
    for first, ms in members.items():
        for k, label in enumerate(ms):
            note = "" if k == 0 else (
                f"{'=' if equal_to_rounding(series[first], series[label], terms) else '≈'} {first}, drawn over it")
            cased = len(ms) <= MOST_CASED
            out[label] = Separation(linewidth + (CASING * (len(ms) - 1 - k) if cased else 0.0), note)
    return out
