"""Reports: a summary table per setting, per-round plots (test accuracy, aggregation error, Byzantine share), an
aggregator × attack heat map, Markdown."""

from __future__ import annotations

import io
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError, OutputError
from phalanx.experiments import store

SETTING_KEYS = ("aggregator", "f", "attack", "byzantine", "partition", "alpha", "dataset", "model", "workers",
                "algorithm", "graph", "lr", "momentum", "local_steps", "clients_per_round")
"""What tells settings apart: runs that differ in any of these are not pooled (a key a grid does not vary is left out
of the tables, :func:`varying`)."""


def save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    """Write a matplotlib figure as PNG atomically (a reader never sees half a file) and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    store.atomic_write_bytes(path, buf.getvalue())  # creates the directory; an OutputError if it cannot
    return path


def collect(root: Path) -> list[dict[str, Any]]:
    """Every metric row of every run directory under ``root`` (recursively)."""
    rows: list[dict[str, Any]] = []
    for cfg_path in sorted(root.rglob("config.json")):
        run_dir = cfg_path.parent
        for r in store.read_rows(run_dir):
            acc = r.get("test_accuracy")
            if isinstance(acc, bool) or not isinstance(acc, (int, float)):
                raise store.damaged(run_dir / "metrics.jsonl", f"the row of round {r['round']} has no numeric "
                                    "'test_accuracy'")
            r = dict(r)
            r["run"] = run_dir.name
            r["finished"] = store.is_finished(run_dir)
            r["run_diverged"] = (run_dir / "DIVERGED").exists()
            rows.append(r)
    return rows


def _setting(row: dict[str, Any], keys: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in keys)


def summarize(rows: list[dict[str, Any]], keys: tuple[str, ...] = SETTING_KEYS) -> list[dict[str, Any]]:
    """One line per setting (seeds pooled): final accuracy mean ± std over seeds, best accuracy, mean agg. error."""
    final: dict[str, dict[str, Any]] = {}
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_run[r["run"]].append(r)
    per_setting: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for run, rs in by_run.items():
        rs = sorted(rs, key=lambda r: r["round"])
        last = rs[-1]
        errs = [r["agg_error"] for r in rs if r.get("agg_error") is not None]
        shares = [r["byz_share"] for r in rs if r.get("byz_share") is not None]
        final[run] = {
            "final": last["test_accuracy"], "best": max(r["test_accuracy"] for r in rs), "round": last["round"],
            "agg_error": sum(errs) / len(errs) if errs else None,
            "byz_share": sum(shares) / len(shares) if shares else None, "finished": last.get("finished", False),
            "diverged": bool(last.get("run_diverged", False)),
        }
        per_setting[_setting(last, keys)].append(final[run])
    out = []
    for setting, runs in per_setting.items():
        accs = [r["final"] for r in runs]
        mean = sum(accs) / len(accs)
        std = (sum((a - mean) ** 2 for a in accs) / (len(accs) - 1)) ** 0.5 if len(accs) > 1 else 0.0
        errs = [r["agg_error"] for r in runs if r["agg_error"] is not None]
        shares = [r["byz_share"] for r in runs if r["byz_share"] is not None]
        line = dict(zip(keys, setting))
        line.update({
            "seeds": len(runs), "final_accuracy": mean, "final_accuracy_std": std,
            "best_accuracy": sum(r["best"] for r in runs) / len(runs),
            "agg_error": sum(errs) / len(errs) if errs else None,
            "byz_share": sum(shares) / len(shares) if shares else None,
            "rounds": max(r["round"] for r in runs), "finished": all(r["finished"] for r in runs),
            "diverged": sum(r["diverged"] for r in runs),
        })
        out.append(line)
    return out


def varying(summary: list[dict[str, Any]], keys: tuple[str, ...] = SETTING_KEYS) -> list[str]:
    """The setting keys that take more than one value in a summary."""
    return [k for k in keys if len({json.dumps(s.get(k)) for s in summary}) > 1] or ["aggregator"]


def markdown_table(summary: list[dict[str, Any]], keys: list[str]) -> str:
    """The summary as a Markdown table (accuracy in %; a ``diverged`` column when some run diverged: its final
    accuracy counts as 0)."""
    diverged = any(s.get("diverged") for s in summary)
    head = [*keys, "final acc. (%)", "best acc. (%)", "agg. error", "Byz. share", "seeds"] + (
        ["diverged"] if diverged else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in sorted(summary, key=lambda s: -s["final_accuracy"]):
        acc = f"{100 * s['final_accuracy']:.1f}" + (f" ± {100 * s['final_accuracy_std']:.1f}" if s["seeds"] > 1 else "")
        cells = [str(s.get(k)) for k in keys] + [
            acc, f"{100 * s['best_accuracy']:.1f}",
            "—" if s["agg_error"] is None else f"{s['agg_error']:.3g}",
            "—" if s["byz_share"] is None else f"{s['byz_share']:.2f}", str(s["seeds"]),
        ] + ([f"{s.get('diverged', 0)}/{s['seeds']}"] if diverged else [])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PANELS = (
    ("test_accuracy", "test accuracy (%)", "Test accuracy per setting"),
    ("agg_error", "aggregation error", "Aggregation error ‖Agg − honest mean‖² / honest variance"),
    ("byz_share", "Byzantine share", "Share of the aggregate from Byzantine workers"),
)
"""The panels of ``accuracy.png``: metric key, y label, title (a panel whose metric no row has is left out)."""


def clipped_errors(means: list[float], lows: list[float], highs: list[float], lo: float = 0.0,
                   hi: float = 100.0) -> list[list[float]]:
    """Error-bar lengths for matplotlib's ``yerr`` (two rows: below, above the mean) of the intervals
    ``[low, high]`` around ``means``, clipped to ``[lo, hi]``: an accuracy interval is drawn within 0 … 100 %, never
    below 0 or above 100 (an unbounded one, of a single seed, spans the whole range)."""
    below = [max(0.0, m - max(lo, min(hi, low))) for m, low in zip(means, lows)]
    above = [max(0.0, min(hi, max(lo, high)) - m) for m, high in zip(means, highs)]
    return [below, above]


def _panel_values(rows: list[dict[str, Any]], keys: list[str], metric: str) -> dict[str, dict[int, list[float]]]:
    """Per setting label, per round: the finite values of ``metric`` (seeds pooled); None values are left out."""
    curves: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        v = r.get(metric)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        label = ", ".join(f"{k}={r.get(k)}" if k != "aggregator" else str(r.get(k)) for k in keys)
        curves[label][r["round"]].append(float(v))
    return curves


def plot_curves(rows: list[dict[str, Any]], keys: list[str], path: Path) -> Path:
    """Per round, one line per setting (mean over seeds): test accuracy, and below it — in panels of the same
    figure, each only when some run logged it — the aggregation error ``agg_error`` and the Byzantine share
    ``byz_share``. The aggregation error is drawn on a log scale when it is positive throughout and spans more than
    two decades (under attack the mean's error can be 10⁶ times the robust rules')."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(m, y, t, c) for m, y, t in PANELS if (c := _panel_values(rows, keys, m))]
    panels = panels or [(*PANELS[0], {})]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 1.2 + 3.0 * len(panels)), dpi=120, sharex=True,
                             squeeze=False)
    for ax, (metric, ylabel, title, curves) in zip(axes[:, 0], panels):
        scale = 100.0 if metric == "test_accuracy" else 1.0
        for label, pts in sorted(curves.items()):
            xs = sorted(pts)
            ax.plot(xs, [scale * sum(pts[x]) / len(pts[x]) for x in xs], marker="o", markersize=3, label=label)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if metric == "test_accuracy":
            ax.set_ylim(0, 100)
            ax.legend(fontsize=7, loc="lower right")
        else:  # both are ≥ 0: a linear axis starts at 0, so that a small change does not look large
            values = [v for pts in curves.values() for vs in pts.values() for v in vs]
            if metric == "agg_error" and min(values) > 0 and max(values) > 100 * min(values):
                ax.set_yscale("log")
            else:
                ax.set_ylim(bottom=min(0.0, min(values)))
    axes[-1, 0].set_xlabel("round")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_heatmap(summary: list[dict[str, Any]], path: Path) -> Path | None:
    """Final accuracy, aggregator × attack (mean over the other keys); None unless both axes have two values."""
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
                ax.text(j, i, f"{grid[i][j]:.0f}", ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(im, ax=ax, label="final test accuracy (%)")
    ax.set_title("Final accuracy: aggregator × attack")
    fig.tight_layout()
    return save_figure(fig, path)


def write_report(root: Path, out: Path | None = None) -> dict[str, Any]:
    """Write ``report.md``, ``accuracy.png`` (per round: test accuracy, and the aggregation error and Byzantine
    share where the runs logged them) and (if useful) ``heatmap.png`` for the runs under ``root``; returns the
    summary, the varying keys and the plots written (``plots``), each embedded in ``report.md``.

    A run whose metrics cannot be read is a :class:`ConfigError` naming its file; a directory the report cannot be
    written to an :class:`OutputError` naming the file.
    """
    out = out or root
    try:
        return _write_report(root, out)
    except OutputError as exc:
        if exc.what not in ("permission denied", "read-only file system"):
            raise
        raise OutputError(exc.path, exc.what, f"make {out} writable, or copy it somewhere writable and run phalanx "
                          "report there") from None


def _caption(rows: list[dict[str, Any]]) -> str:
    """What ``accuracy.png`` shows, for its alt text in ``report.md``."""
    return ", ".join(["test accuracy"] + [y for m, y, _ in PANELS[1:] if _panel_values(rows, [], m)]) + " per round"


def _write_report(root: Path, out: Path) -> dict[str, Any]:
    rows = collect(root)
    if not rows:
        raise ConfigError("DIR", str(root), "a directory holding run directories (config.json + metrics.jsonl)")
    summary = summarize(rows)
    keys = varying(summary)
    curves = plot_curves(rows, keys, out / "accuracy.png")
    heat = plot_heatmap(summary, out / "heatmap.png")
    md = ["# Phalanx report", "", f"Runs under `{root}`: {len({r['run'] for r in rows})}.", "",
          markdown_table(summary, keys), "", f"![{_caption(rows)}]({curves.name})"]
    if heat is not None:
        md += ["", f"![heatmap]({heat.name})"]
    store.atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    return {"summary": summary, "keys": keys, "plots": [p for p in (curves, heat) if p is not None]}
