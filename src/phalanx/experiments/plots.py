"""The sweep report's figures — ``accuracy.png`` (per round: test accuracy, aggregation error, Byzantine share) and
``heatmap.png`` (final accuracy, aggregator × attack, a panel per combination of the other varying keys) — and what
every figure of Phalanx shares: a PNG written atomically, error bars clipped to their scale, one colour per rule.

Drawn to be read by someone who did not make them, and never to misattribute (issue 38): a rule has one colour
everywhere, and each other varying key has a visual channel of its own (the attack the line style, the next key the
marker …), named in the legend's title, with legend handles long enough to show them; legends lie outside the axes,
where they cover no curve; a setting whose runs diverged is labelled so in the legend and marked where it did; a value
at the level of rounding (an aggregation error of 10⁻¹⁶) is drawn at the bottom of its axis, not allowed to stretch it
over sixteen decades; the heat map never averages over a key that varies and is not on its axes, and its numbers take
the colour that contrasts with their cell.
"""

from __future__ import annotations

import io
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from phalanx.experiments import store

PANELS = (
    ("test_accuracy", "test accuracy (%)", "Test accuracy per setting"),
    ("agg_error", "aggregation error", "Aggregation error ‖Agg − honest mean‖² / honest variance"),
    ("byz_share", "Byzantine share", "Share of the aggregate from Byzantine workers"),
)
"""The panels of ``accuracy.png``: metric key, y label, title (a panel whose metric no row has is left out)."""

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
"""Marker shapes: one per rule in the trade-off plot, one per value of the marker's key in ``accuracy.png``."""

LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
"""Line styles of ``accuracy.png``: one per value of the line style's key (the attack's, :func:`channel_keys`)."""

ROUNDING_ERROR = 1e-12
"""An aggregation error ‖Agg − honest mean‖² / honest variance below this is rounding: the rule returned the honest
mean up to the order of float sums (the mean with no attack gives 4.7e-16, and another digit after any change of
summation order). The report's tables show it as ``< 1e-12`` and its plot as ``≈ 0``, so that neither changes with
the order of a sum."""

LOG_DECADES = 6
"""The aggregation-error axis spans at most this many decades below its largest value: smaller values (an exact
rule's 10⁻¹⁶, rounding) are drawn at the bottom edge as ▼ and named in the legend."""


LEGEND_ROWS = 24
"""At most this many entries in a column of an ``accuracy.png`` legend (about a panel's height at 7 pt): more settings
take more columns."""


def save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    """Write a matplotlib figure as PNG atomically (a reader never sees half a file) and close it. The image is the
    figure's tight bounding box: every artist in it, a legend beside or below the axes included — a legend of 55
    settings ran off the right and bottom edges, its entries cut to "cwtm, f…" (issue 38;
    ``tests/test_plot_attribution.py::test_a_long_legend_is_inside_the_image``)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    store.atomic_write_bytes(path, buf.getvalue())  # creates the directory; an OutputError if it cannot
    return path


def clipped_errors(means: list[float], lows: list[float], highs: list[float], lo: float = 0.0,
                   hi: float = 100.0) -> list[list[float]]:
    """Error-bar lengths for matplotlib's ``yerr`` (two rows: below, above the mean) of the intervals
    ``[low, high]`` around ``means``, clipped to ``[lo, hi]``: an accuracy interval is drawn within 0 … 100 %, never
    below 0 or above 100 (an unbounded one, of a single seed, spans the whole range)."""
    below = [max(0.0, m - max(lo, min(hi, low))) for m, low in zip(means, lows)]
    above = [max(0.0, min(hi, max(lo, high)) - m) for m, high in zip(means, highs)]
    return [below, above]


def setting_label(row: dict[str, Any], keys: list[str]) -> str:
    """A setting's name in a legend: the aggregator, then ``key=value`` of the other varying keys."""
    return ", ".join(f"{k}={row.get(k)}" if k != "aggregator" else str(row.get(k)) for k in keys)


def panel_values(rows: list[dict[str, Any]], keys: list[str], metric: str) -> dict[str, dict[int, list[float]]]:
    """Per setting label, per round: the finite values of ``metric`` (seeds pooled); None values are left out."""
    curves: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        v = r.get(metric)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        curves[setting_label(r, keys)][r["round"]].append(float(v))
    return curves


PREFERRED_COLOURS = {"cwtm": 0, "geomed": 1, "cwmed": 2, "mean": 3, "krum": 4, "multikrum": 5, "nnm>cwtm": 6,
                     "mda": 7, "meamed": 8, "cc": 9}
"""The colour (``C<i>``) each common rule takes wherever it is drawn; any other rule prefers ``C<crc32(name) mod
10>``. A newcomer saw orange stand for geomed, cwtm and the mean in three figures, when colours were handed out by
sorted position within each figure."""


def rule_slots(rules: list[str]) -> dict[str, int]:
    """One slot 0 … 9 per rule (the mean included): the same rule has the same slot in every figure — its preferred
    one (:data:`PREFERRED_COLOURS`; any other rule ``crc32(name) mod 10``) — unless two rules of one figure prefer
    the same slot, when the later (the common rules first, then by name) takes the next free one. Distinct within a
    figure of at most 10 rules; beyond 10 they repeat (the legend tells the rules apart)."""
    import zlib

    chosen: dict[str, int] = {}
    used: set[int] = set()
    for rule in sorted(set(rules), key=lambda r: (r not in PREFERRED_COLOURS, r)):
        want = PREFERRED_COLOURS.get(rule, zlib.crc32(rule.encode()) % 10)
        free = next(((want + k) % 10 for k in range(10) if (want + k) % 10 not in used), want)
        used.add(free)
        chosen[rule] = free
    return chosen


def rule_colours(rules: list[str]) -> dict[str, str]:
    """One matplotlib colour per rule, ``C<slot>`` (:func:`rule_slots`): a rule's colour in every figure."""
    return {rule: f"C{slot}" for rule, slot in rule_slots(rules).items()}


def shade(colour: str, t: float) -> tuple[float, float, float]:
    """``colour`` from light (``t`` = 0: 45 % of the way to white) through itself (0.5) to dark (1: 55 % of its
    value): one rule's curves told apart by a parameter (cwtm at f = 1 … 7) while keeping the rule's hue — a
    sequential colour map gave cwtm f = 1 the purple of krum in the next panel (issue 38)."""
    from matplotlib.colors import to_rgb

    base = to_rgb(colour)
    if t <= 0.5:
        w = 0.45 * (1 - 2 * t)  # the share of white
        return (base[0] + w * (1 - base[0]), base[1] + w * (1 - base[1]), base[2] + w * (1 - base[2]))
    k = 1 - 0.45 * (2 * t - 1)
    return (base[0] * k, base[1] * k, base[2] * k)


def rule_markers(rules: list[str]) -> dict[str, str]:
    """One marker per rule, ``MARKERS[slot]`` (:func:`rule_slots`): a rule keeps its marker across figures as it
    keeps its colour (a newcomer saw the mean drawn ◆ in one ``tradeoff.png`` and ■ — geomed's before — in another,
    when markers went by sorted position)."""
    return {rule: MARKERS[slot % len(MARKERS)] for rule, slot in rule_slots(rules).items()}


CHANNELS = ("color", "linestyle", "marker", "fillstyle")
"""The visual channels of ``accuracy.png``'s lines, in the order the varying keys take them (:func:`channel_keys`)."""

CHANNEL_NAMES = {"color": "colour", "linestyle": "line", "marker": "marker", "fillstyle": "fill"}
"""How the legend's title names each channel."""

OPTIONS: dict[str, tuple[Any, ...]] = {
    "linestyle": LINESTYLES,
    "marker": MARKERS,
    "fillstyle": ("full", "none", "left", "bottom"),
}
"""The values of each channel but the colour (``C0`` … ``C9``, or the rule's: :func:`rule_colours`); a key with more
values than its channel has cycles through them (the legend's labels still tell every line apart)."""

UNUSED = {"linestyle": "-", "marker": "o", "fillstyle": "full"}
"""A channel no key takes."""


def channel_keys(keys: list[str]) -> dict[str, list[str]]:
    """Which varying keys each visual channel encodes: the aggregator the colour, the attack the line style, the next
    varying keys (in ``keys``' order) the marker, then the marker's fill; one key per channel, so that a line's colour
    depends on its rule alone, its dash on its attack alone, and so on. When only two keys vary, the marker repeats
    the line style's key (an attack and no attack then differ in both, so that neither colour-blindness nor a short
    legend handle hides which is which). With more than four varying keys the fill encodes the combination of the
    remaining ones (their labels are in the legend)."""
    order = [k for k in ("aggregator", "attack") if k in keys] + [k for k in keys if k not in ("aggregator", "attack")]
    out = {c: [k] for c, k in zip(CHANNELS, order)}
    if len(order) > len(CHANNELS):
        out[CHANNELS[-1]] = order[len(CHANNELS) - 1:]
    if len(order) == 2:
        out["marker"] = [order[1]]
    return out


def legend_title(keys: list[str]) -> str:
    """The legend's key to the channels, e.g. ``colour: aggregator · line: attack · marker: model`` (``line +
    marker: attack`` when two channels encode one key)."""
    named: dict[str, list[str]] = {}
    for c, ks in channel_keys(keys).items():
        named.setdefault(", ".join(ks), []).append(CHANNEL_NAMES[c])
    return " · ".join(f"{' + '.join(cs)}: {ks}" for ks, cs in named.items())


def curve_styles(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, dict[str, Any]]:
    """Per setting label of :func:`plot_curves`: its colour, line style, marker and marker fill, each a function of
    one varying key alone (:func:`channel_keys`): the colour is the rule's (:func:`rule_colours`, as in
    ``tradeoff.png``), the dash the attack's, the marker the next key's — so that "mean, alie, cnn" and "mean,
    signflip, mlp" never share a line style by the accident of a pair's rank (issue 38). A key's values take the
    channel's values in sorted order."""
    channels = channel_keys(keys)
    values = {c: sorted({setting_label(r, ks) for r in rows}) for c, ks in channels.items()}
    colours = (rule_colours([str(r.get("aggregator")) for r in rows]) if channels.get("color") == ["aggregator"]
               else {v: f"C{i % 10}" for i, v in enumerate(values.get("color", []))})
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        style: dict[str, Any] = {"color": "C0", **UNUSED}
        for c, ks in channels.items():
            v = setting_label(r, ks)
            style[c] = colours[v] if c == "color" else OPTIONS[c][values[c].index(v) % len(OPTIONS[c])]
        out[setting_label(r, keys)] = style
    return out


def diverged_settings(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, tuple[int, int, int]]:
    """Per setting label whose runs diverged: (runs diverged, runs, the earliest round a diverged run logged last)."""
    runs: dict[str, dict[str, tuple[bool, int]]] = defaultdict(dict)
    for r in rows:
        label = setting_label(r, keys)
        diverged, last = runs[label].get(r["run"], (False, -1))
        runs[label][r["run"]] = (diverged or bool(r.get("run_diverged")), max(last, int(r["round"])))
    out = {}
    for label, per_run in runs.items():
        stops = [last for diverged, last in per_run.values() if diverged]
        if stops:
            out[label] = (len(stops), len(per_run), min(stops))
    return out


def seeds_phrase(rows: list[dict[str, Any]], keys: list[str]) -> str:
    """`` (mean over 5 seeds)`` — or ``(mean over 3–5 seeds)`` when settings differ — for the accuracy panel's title:
    each curve is a mean over its setting's seeds (a first-hour review missed it); empty without seeds."""
    seeds: dict[tuple[str, ...], set[Any]] = defaultdict(set)
    for r in rows:
        if r.get("seed") is not None:
            seeds[tuple(json.dumps(r.get(k)) for k in keys)].add(r.get("seed"))
    counts = sorted({len(v) for v in seeds.values()})
    if not counts:
        return ""
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    shaded = ", shaded: their range" if counts[-1] > 1 else ""
    return f" (each curve the mean over its {span} seed{'s' if counts[-1] > 1 else ''}{shaded})"


def seed_range(points: dict[int, list[float]], scale: float) -> tuple[list[int], list[float], list[float]] | None:
    """``(rounds, lows, highs)``: per round, the smallest and largest finite value over a setting's seeds (times
    ``scale``), at the rounds where at least two seeds have one; None where no round has two (nothing to shade)."""
    xs, lows, highs = [], [], []
    for x in sorted(points):
        finite = [v for v in points[x] if math.isfinite(v)]
        if len(finite) >= 2:
            xs.append(x)
            lows.append(scale * min(finite))
            highs.append(scale * max(finite))
    return (xs, lows, highs) if xs else None


FLOOR_MARGIN = 1.1
"""A log axis with a floor starts this factor under it: the curves drawn on the floor lie on the bottom edge, as
their legend says, their markers clear of the spine (a first-hour review read 1.4e-4 over a bottom of 7e-5)."""


def error_axis(values: list[float]) -> tuple[bool, float | None]:
    """How to draw the aggregation errors ``values`` (all ≥ 0): (log scale?, the floor — the bottom edge, where the
    values too small for the axis are drawn — or None). The axis is logarithmic when the positive values span more
    than two decades, or when some value is 0 or rounding (below :data:`LOG_DECADES` under the largest), which a log
    axis cannot show and a linear one hides on its bottom spine; its floor is then a decade under the smallest value
    it shows, never more than :data:`LOG_DECADES` below the largest. An axis of zeros alone is linear (floor None)."""
    positive = [v for v in values if v > 0]
    if not positive:
        return False, None
    top = max(positive)
    cut = top * 10.0 ** -LOG_DECADES
    shown = min(v for v in positive if v >= cut)
    if len(positive) == len(values) and min(positive) >= cut:  # nothing to put on an edge
        return top > 100 * shown, None
    return True, max(cut, shown / 10)


def panel_axis(metric: str, values: list[float]) -> tuple[bool, float | None]:
    """(log scale?, floor) of ``accuracy.png``'s panel of ``metric``: the aggregation error's as :func:`error_axis`
    says (it spans decades); accuracy and the Byzantine share linear — a share is a fraction of the aggregate, and on
    a log axis one share of 0 put the bottom edge at 0.017, where it read as 1.7 % (issue 38)."""
    return error_axis(values) if metric == "agg_error" else (False, None)


def _on_floor(label: str, ys: list[float], floor: float | None) -> tuple[list[float], str, bool]:
    """A curve's values as drawn, its legend name and whether it lies wholly on the bottom edge: on a log axis
    (``floor``) values under the floor are drawn on it — a curve wholly there named ``= 0`` (exactly zero) or
    ``≈ 0: < 1e-12, rounding`` (as the report's tables say, :data:`ROUNDING_ERROR`; ``≈ 0: at most …`` above it),
    one partly there ``≈ 0 in k of n rounds``; on a linear axis (floor None) a curve of zeros is named ``= 0``.
    Never a value dropped."""
    below = [y < floor if floor is not None else y == 0 for y in ys]
    if not any(below):
        return ys, label, False
    drawn = [max(y, floor) for y in ys] if floor is not None else ys
    if not all(below):
        return drawn, f"{label} (≈ 0 in {sum(below)} of {len(ys)} rounds: on the bottom edge)", False
    if all(y == 0 for y in ys):
        return drawn, f"{label} (= 0" + (": on the bottom edge)" if floor is not None else ")"), True
    size = f"< {ROUNDING_ERROR:g}, rounding" if max(ys) < ROUNDING_ERROR else f"at most {max(ys):.1e}"
    return drawn, f"{label} (≈ 0: {size}; on the bottom edge)", True


def plot_curves(rows: list[dict[str, Any]], keys: list[str], path: Path) -> Path:
    """Per round, one line per setting (mean over seeds): test accuracy, and below it — in panels of the same
    figure, each only when some run logged it — the aggregation error ``agg_error`` and the Byzantine share
    ``byz_share``. Each varying key has its own visual channel (:func:`channel_keys`: colour the rule's, as in
    ``tradeoff.png``, dash the attack's, marker the next key's), named in the legend's title; the legends lie outside
    the axes, so that none covers a curve; when the attack does not vary, the title names it. The aggregation error
    is drawn as :func:`error_axis` says: values a log axis cannot show (0, rounding) on its bottom edge, ▼, and named
    "= 0" or "≈ 0" in the legend (:func:`_on_floor`), never dropped; the Byzantine share — a fraction — on a linear
    axis from 0. Curves drawn on top of each other are cased and
    named in the legend (:func:`phalanx.experiments.coincide.separate`). A setting whose runs diverged says so in
    the legend ("diverged k/n at round t") and its curve ends in ✕."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from phalanx.experiments.coincide import separate

    styles = curve_styles(rows, keys)
    diverged = diverged_settings(rows, keys)
    panels = [(m, y, t, c) for m, y, t in PANELS if (c := panel_values(rows, keys, m))]
    panels = panels or [(*PANELS[0], {})]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10.5, 1.2 + 3.2 * len(panels)), dpi=120, sharex=True,
                             squeeze=False)
    attacks = sorted({str(r.get("attack")) for r in rows if r.get("attack") is not None})
    fixed = f" — attack: {attacks[0]}" if "attack" not in keys and len(attacks) == 1 else ""
    fixed += seeds_phrase(rows, keys)
    legends: list[tuple[Any, dict[str, Any]]] = []
    for ax, (metric, ylabel, title, curves) in zip(axes[:, 0], panels):
        scale = 100.0 if metric == "test_accuracy" else 1.0
        values = [v for pts in curves.values() for vs in pts.values() for v in vs]
        log, floor = panel_axis(metric, values)
        rounds = sorted({x for pts in curves.values() for x in pts})
        drawn: dict[str, tuple[list[int], list[float], str, bool]] = {}
        for label, pts in sorted(curves.items()):
            xs = sorted(pts)
            ys = [scale * sum(pts[x]) / len(pts[x]) for x in xs]
            drawn[label] = (xs, ys, label, False) if metric == "test_accuracy" else (xs, *_on_floor(label, ys, floor))
        nan = float("nan")
        looks = separate({label: [dict(zip(xs, ys)).get(x, nan) for x in rounds]
                          for label, (xs, ys, _, _) in drawn.items()}, log=log, linewidth=1.5)
        noted = False
        for label, (xs, ys, name, edge) in drawn.items():
            style = {**styles[label], "marker": "v"} if edge else dict(styles[label])
            name = looks[label].label(name)
            if label in diverged and metric == "test_accuracy":
                k, n, at = diverged[label]
                name = f"{name} — diverged {k}/{n} at round {at}"
                ax.plot([xs[-1]], [ys[-1]], marker="X", markersize=9, color=style["color"], ls="none")
            noted = noted or name != label
            ax.plot(xs, ys, markersize=3.5, label=name, lw=looks[label].linewidth, **style)
            if metric == "test_accuracy":  # the spread behind the mean: the seeds' range, where there are two or more
                band = seed_range(curves[label], scale)
                if band is not None:
                    ax.fill_between(*band, color=style["color"], alpha=0.15, lw=0)
        ax.set_ylabel(ylabel)
        ax.set_title(title + fixed if metric == "test_accuracy" else title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))  # no tick at round 2.5
        outside = {"fontsize": 7, "handlelength": 4.5, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0),
                   "title": legend_title(keys), "title_fontsize": 7, "alignment": "left"}
        if metric == "test_accuracy":
            ax.set_ylim(-2, 102)
        elif log:
            ax.set_yscale("log")
            if floor is not None:  # the floor is the bottom edge: a curve drawn there sits on the spine (at
                ax.set_ylim(bottom=floor / FLOOR_MARGIN)  # floor / 2 it floated a third of a decade above it)
        elif max(values, default=0.0) > 0:  # both are ≥ 0: a linear axis starts at 0 (a little below: a line at 0
            top = min(max(values), sys.float_info.max / 2)  # (is not hidden by the spine); 1.08 × 1.7e308 is inf
            ax.set_ylim(-0.04 * top, 1.08 * top)
        else:  # zeros alone: 0 of a possible 1 (a share; an error of 1 is the honest variance)
            ax.set_ylim(-0.04, 1.0)
        if metric == "test_accuracy" or noted:
            # outside the axes: a legend inside covered curves (issue 38); in columns of at most LEGEND_ROWS entries,
            # added after the layout (the axes keep their size; the saved image grows to hold them: save_figure)
            legends.append((ax, {**outside, "ncols": max(1, math.ceil(len(drawn) / LEGEND_ROWS))}))
    axes[-1, 0].set_xlabel("round")
    fig.tight_layout()
    for ax, kwargs in legends:
        ax.legend(**kwargs)
    return save_figure(fig, path)


def text_colour(rgba: tuple[float, ...]) -> str:
    """Black or white, whichever contrasts more with a cell of colour ``rgba`` (WCAG relative luminance: black text
    when the background's luminance is above ≈ 0.18, where the two contrast ratios are equal)."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgba[:3])
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "black" if (luminance + 0.05) / 0.05 > 1.05 / (luminance + 0.05) else "white"


def heatmap_panels(summary: list[dict[str, Any]], keys: list[str]
                   ) -> list[tuple[str, list[str], list[str], list[list[float]]]]:
    """The heat map's panels: (title, aggregators, attacks, final accuracy in % per aggregator × attack), one panel
    per combination of the varying ``keys`` other than the aggregator and the attack (title ``model=cnn``, or "" when
    there is none), so that a cell is one setting's mean over its seeds and never an average over a key that varies
    (issue 38: a folder of CNN and MLP runs showed mean/none = 79, a value neither model has). A cell no setting
    fills is NaN; one that two settings would fill (a key missing from ``keys``) is NaN too — never their mean. []
    unless aggregator and attack both have two values."""
    aggs = sorted({str(s["aggregator"]) for s in summary})
    atts = sorted({str(s["attack"]) for s in summary})
    if len(aggs) < 2 or len(atts) < 2:
        return []
    rest = [k for k in keys if k not in ("aggregator", "attack")]
    groups: dict[str, dict[tuple[str, str], list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in summary:
        groups[setting_label(s, rest)][(str(s["aggregator"]), str(s["attack"]))].append(100 * s["final_accuracy"])
    nan = float("nan")
    return [(title, aggs, atts, [[cells[(a, t)][0] if len(cells.get((a, t), ())) == 1 else nan for t in atts]
                                 for a in aggs])
            for title, cells in sorted(groups.items())]


MAX_HEATMAP_PANELS = 24
"""Panels drawn at most: past that the figure says how many it left out (the report's table has them all)."""


def plot_heatmap(summary: list[dict[str, Any]], path: Path, keys: list[str]) -> Path | None:
    """Final accuracy, aggregator × attack, one panel per combination of the other varying ``keys``
    (:func:`heatmap_panels`, titled with it); None unless both axes have two values. Each cell's number is black or
    white, whichever contrasts with the cell (:func:`text_colour`)."""
    panels = heatmap_panels(summary, keys)
    if not panels:
        return None
    shown = len(panels)
    panels = panels[:MAX_HEATMAP_PANELS]  # a grid of a thousand settings: a figure matplotlib can still draw
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aggs, atts = panels[0][1], panels[0][2]
    cols = min(3, len(panels))
    rows_ = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(1.2 + (1.4 + 1.1 * len(atts)) * cols,
                                                   0.9 + (1.0 + 0.45 * len(aggs)) * rows_), dpi=120, squeeze=False,
                             layout="constrained")
    images = []
    for ax, (title, _, _, grid) in zip(axes.flat, panels):
        im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
        images.append(im)
        ax.set_xticks(range(len(atts)), atts, rotation=30, ha="right")
        ax.set_yticks(range(len(aggs)), aggs)
        for i in range(len(aggs)):
            for j in range(len(atts)):
                if grid[i][j] == grid[i][j]:
                    ax.text(j, i, f"{grid[i][j]:.0f}", ha="center", va="center", fontsize=8,
                            color=text_colour(tuple(float(c) for c in im.cmap(grid[i][j] / 100))))  # vmin 0, vmax 100
        if title:
            ax.set_title(title, fontsize=10)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.colorbar(images[0], ax=axes.ravel().tolist(), label="final test accuracy (%)")
    rest = [k for k in keys if k not in ("aggregator", "attack")]
    more = f" (the first {len(panels)} of {shown}: report.md has every setting)" if shown > len(panels) else ""
    fig.suptitle("Final accuracy (%): aggregator × attack" + (f", one panel per {', '.join(rest)}" if rest else "")
                 + more, fontsize=10)
    return save_figure(fig, path)
