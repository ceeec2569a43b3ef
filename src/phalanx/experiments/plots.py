"""The sweep report's figures — ``accuracy.png`` (per round: test accuracy, aggregation error, Byzantine share) and
``heatmap.png`` (final accuracy, aggregator × attack) — and what every figure of Phalanx shares: a PNG written
atomically, error bars clipped to their scale, one colour per rule.

Drawn to be read by someone who did not make them: a rule has one colour everywhere, and the other keys that vary
(the attack …) have a line style *and* a marker each, with legend handles long enough to show both; a setting whose
runs diverged is labelled so in the legend and marked where it did; a value at the level of rounding (an aggregation
error of 10⁻¹⁶) is drawn at the bottom of its axis, not allowed to stretch it over sixteen decades; the heat map's
numbers take the colour that contrasts with their cell.
"""

from __future__ import annotations

import io
import math
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
"""Marker shapes: one per rule in the trade-off plot, one per setting of the other keys in ``accuracy.png``."""

LINESTYLES = ("-", "--", ":", "-.")
"""Line styles of ``accuracy.png``: one per setting of the keys other than the aggregator (the colour is the
rule's)."""

LOG_DECADES = 6
"""The aggregation-error axis spans at most this many decades below its largest value: smaller values (an exact
rule's 10⁻¹⁶, rounding) are drawn at the bottom edge as ▼ and named in the legend."""


def save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    """Write a matplotlib figure as PNG atomically (a reader never sees half a file) and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
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


def rule_colours(rules: list[str]) -> dict[str, str]:
    """One matplotlib colour per rule (``C0`` … ``C9``, by sorted name, the mean included): the same rule has the
    same colour in every plot of a report."""
    return {r: f"C{i % 10}" for i, r in enumerate(sorted(set(rules)))}


def curve_styles(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, dict[str, str]]:
    """Per setting label of :func:`plot_curves`: its colour, line style and marker — when the aggregator varies, the
    colour is the rule's (:func:`rule_colours`, as in ``tradeoff.png``) and the line style and the marker tell the
    other keys' settings apart (an attack and no attack differ in both, so neither colour-blindness nor a short
    legend handle hides which is which); else matplotlib's colour cycle, one marker."""
    labels = sorted({setting_label(r, keys) for r in rows})
    if "aggregator" not in keys:
        return {label: {"color": f"C{i % 10}", "linestyle": "-", "marker": "o"} for i, label in enumerate(labels)}
    colours = rule_colours([str(r.get("aggregator")) for r in rows])
    rest = [k for k in keys if k != "aggregator"]
    others = sorted({setting_label(r, rest) for r in rows})
    out = {}
    for r in rows:
        i = others.index(setting_label(r, rest))
        out[setting_label(r, keys)] = {"color": colours[str(r.get("aggregator"))],
                                       "linestyle": LINESTYLES[i % len(LINESTYLES)],
                                       "marker": MARKERS[i % len(MARKERS)]}
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


def _error_floor(values: list[float]) -> float | None:
    """The bottom of a log aggregation-error axis: :data:`LOG_DECADES` below the largest value, when some values lie
    further down (else None: the axis fits them all)."""
    positive = [v for v in values if v > 0]
    if not positive:
        return None
    floor = max(positive) * 10.0 ** -LOG_DECADES
    return floor if min(positive) < floor else None


def plot_curves(rows: list[dict[str, Any]], keys: list[str], path: Path) -> Path:
    """Per round, one line per setting (mean over seeds): test accuracy, and below it — in panels of the same
    figure, each only when some run logged it — the aggregation error ``agg_error`` and the Byzantine share
    ``byz_share``. A rule has one colour (its colour in ``tradeoff.png`` too), the other varying keys a line style
    and a marker each. The aggregation error is drawn on a log scale when it is positive throughout and spans more
    than two decades, down to :data:`LOG_DECADES` below its largest value (values under that are drawn on the
    bottom edge, ▼, and their settings named "≈ 0" in the legend). A setting whose runs diverged says so in the
    legend ("diverged k/n at round t") and its curve ends in ✕."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = curve_styles(rows, keys)
    diverged = diverged_settings(rows, keys)
    panels = [(m, y, t, c) for m, y, t in PANELS if (c := panel_values(rows, keys, m))]
    panels = panels or [(*PANELS[0], {})]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.5, 1.2 + 3.2 * len(panels)), dpi=120, sharex=True,
                             squeeze=False)
    for ax, (metric, ylabel, title, curves) in zip(axes[:, 0], panels):
        scale = 100.0 if metric == "test_accuracy" else 1.0
        values = [v for pts in curves.values() for vs in pts.values() for v in vs]
        log = metric == "agg_error" and bool(values) and min(values) > 0 and max(values) > 100 * min(values)
        floor = _error_floor(values) if log else None
        for label, pts in sorted(curves.items()):
            xs = sorted(pts)
            ys = [scale * sum(pts[x]) / len(pts[x]) for x in xs]
            style = dict(styles[label])
            name = label
            if floor is not None and max(ys) < floor:  # rounding-level error: on the edge, said in the legend
                ys, name = [floor] * len(ys), f"{label} (≈ 0: below {floor:.0e})"
                style["marker"] = "v"
            if label in diverged and metric == "test_accuracy":
                k, n, at = diverged[label]
                name = f"{label} — diverged {k}/{n} at round {at}"
                ax.plot([xs[-1]], [ys[-1]], marker="X", markersize=9, color=style["color"], ls="none")
            ax.plot(xs, ys, markersize=3.5, label=name, **style)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if metric == "test_accuracy":
            ax.set_ylim(-2, 102)
            ax.legend(fontsize=7, loc="lower right", handlelength=4.5)
        elif log:
            ax.set_yscale("log")
            if floor is not None:
                ax.set_ylim(bottom=floor / 2)
                ax.legend(fontsize=7, loc="best", handlelength=4.5)
        else:  # both are ≥ 0: a linear axis starts at 0, so that a small change does not look large
            ax.set_ylim(bottom=min(0.0, min(values, default=0.0)))
    axes[-1, 0].set_xlabel("round")
    fig.tight_layout()
    return save_figure(fig, path)


def text_colour(rgba: tuple[float, ...]) -> str:
    """Black or white, whichever contrasts more with a cell of colour ``rgba`` (WCAG relative luminance: black text
    when the background's luminance is above ≈ 0.18, where the two contrast ratios are equal)."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgba[:3])
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "black" if (luminance + 0.05) / 0.05 > 1.05 / (luminance + 0.05) else "white"


def plot_heatmap(summary: list[dict[str, Any]], path: Path) -> Path | None:
    """Final accuracy, aggregator × attack (mean over the other keys); None unless both axes have two values. Each
    cell's number is black or white, whichever contrasts with the cell (:func:`text_colour`)."""
    aggs = sorted({s["aggregator"] for s in summary})
    atts = sorted({s["attack"] for s in summary})
    if len(aggs) < 2 or len(atts) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [[float("nan")] * len(atts) for _ in aggs]
    for i, a in enumerate(aggs):
        for j, t in enumerate(atts):
            vals = [s["final_accuracy"] for s in summary if s["aggregator"] == a and s["attack"] == t]
            if vals:
                grid[i][j] = 100 * sum(vals) / len(vals)
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(atts), 1.2 + 0.45 * len(aggs)), dpi=120)
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(atts)), atts, rotation=30, ha="right")
    ax.set_yticks(range(len(aggs)), aggs)
    for i in range(len(aggs)):
        for j in range(len(atts)):
            if grid[i][j] == grid[i][j]:
                ax.text(j, i, f"{grid[i][j]:.0f}", ha="center", va="center", fontsize=8,
                        color=text_colour(tuple(float(c) for c in im.cmap(grid[i][j] / 100))))  # vmin 0, vmax 100
    fig.colorbar(im, ax=ax, label="final test accuracy (%)")
    ax.set_title("Final accuracy: aggregator × attack")
    fig.tight_layout()
    return save_figure(fig, path)
