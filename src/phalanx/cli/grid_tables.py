"""What ``phalanx run``, ``sweep``, ``launch`` and ``report`` print of a grid's report: its final accuracy per
setting and the price and rescue of every robust rule against the mean, each a :class:`~phalanx.cli.output.Tabular`
(so that ``--format`` writes them as csv, json or markdown too)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from phalanx.cli.common import _STDERR, _fmt, console
from phalanx.cli.output import Tabular, emit_all


def print_report(out: Path, fmt: str = "table", runs: Collection[str] | None = None) -> None:
    """Write ``out``'s report and plots and print its tables — what ``phalanx run``, ``sweep`` and ``launch`` end
    with: of the grid's runs (``runs``, its run ids) alone, and a line counting the other run folders in ``out``
    (under ``verify_key`` the grid verified its own runs only: a folder planted there is not reported as one)."""
    from phalanx.experiments import report

    say = console if fmt == "table" else _STDERR  # with --format, stdout holds the tables alone
    result = report.write_report(out, runs=runs)
    emit_all(grid_tables(result), fmt, console)
    if result.get("left_out"):
        say.print(f"[yellow]{report.left_out_line(out, result['left_out'])}[/yellow]", soft_wrap=True,
                  highlight=False)
    say.print(f"report: {out / 'report.md'}; plots: " + ", ".join(str(p) for p in result["plots"]))


def grid_tables(result: dict[str, Any]) -> list[Tabular]:
    """What ``run``, ``sweep`` and ``report`` print of a grid's report (:func:`report.write_report`'s result): the
    final accuracies and, when there is a mean to compare with, the price and rescue of every robust rule."""
    from phalanx.experiments import report

    tables = [_summary_table(result)]
    if result.get("setup"):  # what every run shares: the tables show only the keys that vary (a first-hour review)
        tables[0].notes.insert(0, result["setup"])
    if result["tradeoff"]:
        tables.append(_tradeoff_table(result["tradeoff"]))
    elif len(result["summary"]) > 1:  # several settings, no comparison: say why (a first-hour review)
        tables[0].notes.append(report.NO_COMPARISON)
    if result.get("mixed"):
        tables[0].notes.append(report.mixed_line(result["mixed"]).replace("**", ""))
    return tables


def _summary_table(result: dict[str, Any]) -> Tabular:
    """A grid's final accuracy per setting (seeds pooled), best first, from :func:`report.write_report`'s result."""
    from phalanx.experiments.report import format_agg_error  # (not at import: it loads torch)
    from phalanx.experiments.summary_text import summary_order

    several = any(s["seeds"] > 1 for s in result["summary"])
    keys = result["keys"]
    diverged = sum(s.get("diverged", 0) for s in result["summary"])
    cols = [*keys, "final %", "agg. error", "Byz. share", "seeds"] + (["diverged"] if diverged else [])
    title = "Final test accuracy (seeds pooled" + ("; ± the standard deviation over seeds)" if several else ")")
    table = Tabular(title, cols, right=cols[len(keys):], compact=True)
    for s in summary_order(result["summary"], keys):
        acc = f"{100 * s['final_accuracy']:.1f}" + (f" ± {100 * s['final_accuracy_std']:.1f}" if s["seeds"] > 1 else "")
        table.add(*[str(s.get(k)) for k in keys], acc, format_agg_error(s["agg_error"]), _fmt(s["byz_share"], 2),
                  s["seeds"], *([f"{s.get('diverged', 0)}/{s['seeds']}"] if diverged else []),
                  values={**{k: s.get(k) for k in keys}, "final_pct": 100 * s["final_accuracy"],
                          "final_pct_std": 100 * s["final_accuracy_std"] if s["seeds"] > 1 else None,
                          "agg_error": s["agg_error"], "byz_share": s["byz_share"], "seeds": s["seeds"],
                          "diverged": s.get("diverged", 0)})
    if diverged:
        table.notes.append(f"{diverged} run(s) diverged (the model became non-finite; final accuracy counted as 0; "
                           "`phalanx status` says at which round)")
    return table


def _tradeoff_table(tradeoffs: list[Any]) -> Tabular:
    """The price and rescue of every robust rule against the mean (:func:`phalanx.experiments.report.tradeoff`),
    each ± its half-width with its Holm-adjusted p, and the sentence saying what they are."""
    from phalanx.experiments import report

    keys = report.tradeoff_keys(tradeoffs)
    head = ("price (pts)", "p (price)", "rescue (pts)", "p (rescue)", "seeds")
    cols = ["rule", *keys, "attack", *head, "verdict"]
    title = "The price and rescue of robustness (vs mean, paired by seed; ± = 95 % half-width, not the SD; p: Holm)"
    table = Tabular(title, cols, compact=True, right=head, wrap=("verdict",))
    for t in report.sorted_tradeoffs(tradeoffs):
        ctx = dict(t.context)
        table.add(t.rule, *(str(ctx[k]) for k in keys), t.attack, report.points_pm(t.price),
                  t.price.estimate.holm_text(), report.points_pm(t.rescue), t.rescue.estimate.holm_text(),
                  len(t.seeds), t.verdict,
                  values={"rule": t.rule, **{k: ctx[k] for k in keys}, "attack": t.attack,
                          **_paired_values("price", t.price), **_paired_values("rescue", t.rescue),
                          "seeds": len(t.seeds), "baseline": t.baseline, "verdict": t.verdict})
    table.notes.append(report.tradeoff_meaning(tradeoffs).replace("*", "").replace("`", ""))
    return table


def _paired_values(name: str, p: Any) -> dict[str, Any]:
    """A paired difference as numbers, in accuracy points like the table: its mean, its 95 % interval (``None`` where
    the table shows none: fewer than 3 seeds, or seeds that agree exactly) and its Holm-adjusted p."""
    e, none = p.estimate, p.why_no_interval is not None
    return {f"{name}_pts": 100 * e.mean, f"{name}_low_pts": None if none else 100 * e.low,
            f"{name}_high_pts": None if none else 100 * e.high, f"{name}_p_holm": None if none else e.p_adjusted}
