"""Reports: a summary table per setting, per-round plots (test accuracy, aggregation error, Byzantine share), an
aggregator × attack heat map (both drawn by :mod:`phalanx.experiments.plots`), the price and rescue of each robust
rule against the mean (a table and a plot, when a grid has runs with and without an attack), Markdown."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from phalanx.analysis.stats import MIN_SEEDS, Estimate, holm, mean_ci
from phalanx.errors import ConfigError, OutputError
from phalanx.experiments import status, store
from phalanx.experiments.plots import (
    PANELS,
    ROUNDING_ERROR,
    panel_values,
    plot_curves,
    plot_heatmap,
    rule_colours,
    rule_markers,
    save_figure,
)
from phalanx.experiments.schema import RESULT_NEUTRAL_KEYS, RunConfig
from phalanx.experiments.summary_text import NO_ATTACKS, setup_line, summary_order
from phalanx.experiments.validrun import check_named
from phalanx.walk import walk

SETTING_KEYS = ("aggregator", "f", "attack", "byzantine", "partition", "alpha", "dataset", "model", "workers",
                "algorithm", "graph", "lr", "momentum", "local_steps", "clients_per_round")
"""What tells settings apart: runs that differ in any of these are not pooled (a key a grid does not vary is left out
of the tables, :func:`varying`)."""


def run_dirs(root: Path, runs: Collection[str] | None = None) -> list[Path]:
    """The run directories under ``root`` (recursively: every folder holding a ``config.json``), in name order; with
    ``runs``, only the folders of ``root`` itself named by them (a grid's run ids: what its report covers)."""
    found = sorted(p.parent for p in walk(root, "DIR") if p.name == "config.json")
    return found if runs is None else [d for d in found if d.parent == Path(root) and d.name in runs]


def _check_run(run_dir: Path, cfg: dict[str, Any], seen: dict[str, Path]) -> None:
    """A :class:`ConfigError` naming the folders when ``run_dir`` holds another run than its name says
    (:func:`~phalanx.experiments.validrun.check_named`: swapped or renamed), or the same run as a folder already read
    (a copy: it would count as another seed)."""
    if not cfg:
        return
    named = check_named(run_dir, cfg)
    key = json.dumps(cfg, sort_keys=True)
    if key in seen:
        raise ConfigError("DIR", str(run_dir), "one folder per run (each run counts as one seed)",
                          f"it holds the same run as {seen[key]} ({named or 'the same config.json'}): a copy would "
                          "count as another seed; delete one, or report them apart")
    seen[key] = run_dir


def collect(root: Path, runs: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Every metric row of every run directory under ``root`` (recursively; with ``runs``, of the folders of
    ``root`` named by them alone: :func:`run_dirs`). When the runs' configs differ in keys the rows do not carry
    (``eval_every``, ``local_steps``, ``attack_params`` …: :func:`other_keys`), each row gets its run's values of
    those keys too, so that runs differing in them are never pooled as seeds of one setting. A folder named as a
    run id that holds another run, and two folders of one run, are a :class:`ConfigError` naming them
    (:func:`_check_run`): each run is one seed."""
    rows: list[dict[str, Any]] = []
    configs: dict[str, dict[str, Any]] = {}
    seen: dict[str, Path] = {}
    for run_dir in run_dirs(root, runs):
        run_rows = []
        diverged = store.is_diverged(run_dir)  # a marker the manifest records, not one planted
        for r in store.read_rows(run_dir):
            acc = r.get("test_accuracy")
            if isinstance(acc, bool) or not isinstance(acc, (int, float)):
                raise store.damaged(run_dir / "metrics.jsonl", f"the row of round {r['round']} has no numeric "
                                    "'test_accuracy'")
            r = dict(r)
            r["run"] = run_dir.name
            r["finished"] = store.is_finished(run_dir)
            r["run_diverged"] = diverged
            run_rows.append(r)
        if run_rows:
            configs[run_dir.name] = status.recorded_config(run_dir)
            _check_run(run_dir, configs[run_dir.name], seen)
            rows += run_rows
    extra = _differing(configs)
    for r in rows:
        for k in extra:
            r.setdefault(k, _cell(configs[r["run"]].get(k)))
    return rows


NOT_A_SETTING = ("seed", "checkpoint_every", *RESULT_NEUTRAL_KEYS)
"""Config keys that never tell two settings apart in a report: the seed (what is pooled) and the keys that change
how a run is kept or fed, never its results."""


def _cell(value: Any) -> Any:
    """A config value as a table cell and a dict key: scalars as they are, tables and lists as compact JSON."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(value, sort_keys=True)


def _differing(configs: dict[str, dict[str, Any]]) -> list[str]:
    """The config keys, beyond those every metric row carries, that take more than one value over the runs."""
    keys = sorted({k for c in configs.values() for k in c} - set(NOT_A_SETTING))
    return [k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs.values()}) > 1]


def other_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The keys beyond :data:`SETTING_KEYS` in which the runs of ``rows`` differ (``rounds``, ``eval_every`` …: a
    grid that varies them, or a directory that holds more than one grid's runs). They tell settings apart like the
    setting keys."""
    carried = ({k for r in rows for k in r} & set(RunConfig.model_fields)) - set(SETTING_KEYS) - set(NOT_A_SETTING)
    by_run: dict[str, dict[str, Any]] = {}
    for r in rows:
        by_run.setdefault(r["run"], r)
    return sorted(k for k in carried if len({json.dumps(r.get(k), sort_keys=True) for r in by_run.values()}) > 1)


def format_agg_error(value: float | None) -> str:
    """An aggregation error for a table: three significant digits, ``< 1e-12`` at rounding level
    (:data:`ROUNDING_ERROR`), ``—`` when none was measured, ``∞``/``nan`` as they are."""
    if value is None:
        return "—"
    if value != value or value == float("inf"):
        return "∞" if value == float("inf") else "nan"
    return f"< {ROUNDING_ERROR:g}" if 0 <= value < ROUNDING_ERROR else f"{value:.3g}"


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
    head = [*keys, "final %", "best %", "agg. error", "Byz. share", "seeds"] + (  # the printed table's, + best
        ["diverged"] if diverged else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary_order(summary, keys):
        acc = f"{100 * s['final_accuracy']:.1f}" + (f" ± {100 * s['final_accuracy_std']:.1f}" if s["seeds"] > 1 else "")
        cells = [str(s.get(k)) for k in keys] + [
            acc, f"{100 * s['best_accuracy']:.1f}",
            format_agg_error(s["agg_error"]),
            "—" if s["byz_share"] is None else f"{s['byz_share']:.2f}", str(s["seeds"]),
        ] + ([f"{s.get('diverged', 0)}/{s['seeds']}"] if diverged else [])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


NO_COMPARISON = ("no paired comparison (price and rescue, with intervals and verdicts): it needs the aggregator "
                 "'mean' and the attack 'none' in the grid beside an attack and a robust rule, run with the same seeds")
"""Said under the summary of a grid of several settings that has no trade-off table (terminal and report.md): the
accuracies ± their standard deviations are not a comparison, and what would make one (a first-hour review)."""

SUMMARY_CAPTION = (
    "*final %*: the test accuracy at a run's last evaluation, mean ± standard deviation over the seeds (not an "
    "interval); *best %*: its best evaluation's, mean over the seeds; *agg. error*: ‖aggregate − honest mean‖² / the "
    "honest vectors' mean squared distance to their mean, averaged over a run's evaluated rounds, then over the "
    "seeds; *Byz. share*: the share of the aggregate that came from Byzantine workers, averaged alike. Each run's "
    "exact configuration is its folder's `config.json`."
)
"""The first table's caption in report.md: what each column and ± mean (a first-hour review found them ambiguous)."""


# --- the price and rescue of robustness ----------------------------------------------------------------------------

MEAN = "mean"
"""The rule every robust rule is compared with in the trade-off: no defence."""
NO_ATTACK = NO_ATTACKS[0]  # the no-attack baseline of the default job
TRADEOFF_KEYS = (*(k for k in SETTING_KEYS if k not in ("aggregator", "attack")), "rounds", "batch_size", "schedule")
"""What else must be equal for two runs to be compared in the trade-off: they differ in aggregator and attack alone
(and are paired by seed)."""


@dataclass(frozen=True)
class Paired:
    """A paired difference over seeds: the per-seed values (accuracy, 0 … 1) and their mean with a 95 % interval."""

    per_seed: dict[int, float]
    estimate: Estimate

    @property
    def why_no_interval(self) -> str | None:
        """Why no interval (and so no verdict) is given — too few seeds, or seeds that agree exactly — else None."""
        return self.estimate.why_no_verdict("difference", max((abs(v) for v in self.per_seed.values()), default=0.0))

    def side(self, below: str, above: str, neither: str) -> str:
        """The verdict of :meth:`Estimate.side`, or ``no interval (why)``."""
        why = self.why_no_interval
        return f"no interval ({why})" if why else self.estimate.side(below, above, neither)


def paired(per_seed: dict[int, float]) -> Paired:
    """The paired difference of the per-seed values."""
    return Paired(dict(sorted(per_seed.items())), mean_ci(list(per_seed.values())))


@dataclass(frozen=True)
class TradeOff:
    """One robust rule against the mean, in one setting of the other keys (``context``), under one attack:

    - ``price`` = acc(mean, no attack) − acc(rule, no attack): the accuracy the rule costs when nobody attacks;
    - ``rescue`` = acc(rule, attack) − acc(mean, attack): the accuracy it keeps under the attack;

    both paired by seed over the same ``seeds`` (the seeds with all four runs)."""

    context: tuple[tuple[str, Any], ...]
    rule: str
    attack: str
    price: Paired
    rescue: Paired
    baseline: str = NO_ATTACK
    """The runs the price is measured on (one of :data:`NO_ATTACKS`)."""

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(self.price.per_seed)

    @property
    def verdict(self) -> str:
        """What the intervals show: the price's side of 0, then the rescue's (one ``no interval (why)`` when both
        have none for the same reason: the same seeds)."""
        price = self.price.side("gains accuracy", "costs accuracy", "no cost shown")
        rescue = self.rescue.side("falls below the mean", "rescues", "no rescue shown")
        return price if price == rescue else f"{price}; {rescue}"


def _final_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last row of every run that ended (finished, or diverged: its final accuracy counts as 0)."""
    last: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["run"] not in last or r["round"] > last[r["run"]]["round"]:
            last[r["run"]] = r
    return [r for r in last.values() if r.get("finished") or r.get("run_diverged")]


def tradeoff(rows: list[dict[str, Any]], extra: list[str] | tuple[str, ...] = ()) -> list[TradeOff]:
    """The price and rescue of every robust rule against :data:`MEAN`, under every attack but :data:`NO_ATTACK`,
    for each setting of :data:`TRADEOFF_KEYS` that has the mean and the rule with no attack and under that attack;
    [] when a grid has no such setting. Runs are paired by seed (the same seed: the same data split, initial model
    and batch stream); only ended runs count; a seed with two runs of one setting (runs that differ in a key the
    report does not tell apart) is left out of that setting. ``extra``: more keys that must be equal (the runs'
    :func:`other_keys`)."""
    context_keys = (*TRADEOFF_KEYS, *(k for k in extra if k not in TRADEOFF_KEYS))
    cells: dict[tuple[Any, ...], dict[tuple[str, str], dict[int, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for r in _final_runs(rows):
        seed = r.get("seed")
        if isinstance(seed, int) and not isinstance(seed, bool):
            cells[_setting(r, context_keys)][(r["aggregator"], r["attack"])][seed].append(float(r["test_accuracy"]))
    out = []
    for context, by_cell in cells.items():
        acc = {cell: {s: v[0] for s, v in per_seed.items() if len(v) == 1} for cell, per_seed in by_cell.items()}
        rules = sorted({a for a, _ in acc} - {MEAN})
        for attack in sorted({t for _, t in acc} - set(NO_ATTACKS)):
            for rule in rules:  # the first baseline both the mean and the rule have (a rule with none-runs only)
                base = next((b for b in NO_ATTACKS if (MEAN, b) in acc and (rule, b) in acc), NO_ATTACK)
                four = [(MEAN, base), (rule, base), (MEAN, attack), (rule, attack)]
                if not all(c in acc for c in four):
                    continue
                seeds = sorted(set.intersection(*(set(acc[c]) for c in four)))
                if not seeds:
                    continue
                price = paired({s: acc[(MEAN, base)][s] - acc[(rule, base)][s] for s in seeds})
                rescue = paired({s: acc[(rule, attack)][s] - acc[(MEAN, attack)][s] for s in seeds})
                where = (*zip(context_keys, context), ("no-attack runs", base))  # a column where it varies
                out.append(TradeOff(where, rule, attack, price, rescue, base))
    return _holm(out)


def _holm(tradeoffs: list[TradeOff]) -> list[TradeOff]:
    """Every distinct price and rescue of a report as one Holm family (:func:`phalanx.analysis.stats.holm`): the
    report reads their verdicts all at once. A rule's price is one test however many attacks it is shown beside —
    the same setting, rule and per-seed differences are the same comparison (counted once per attack, a grid with
    two attacks corrected each price twice over: a first-hour review)."""
    tests: dict[tuple[Any, ...], Estimate] = {}
    keys = []
    for i, t in enumerate(tradeoffs):
        price_key = ("price", t.context, t.rule, tuple(sorted(t.price.per_seed.items())))
        for key, est in ((price_key, t.price.estimate), (("rescue", i), t.rescue.estimate)):
            tests.setdefault(key, est)
        keys.append((price_key, ("rescue", i)))
    adjusted = dict(zip(tests, holm(list(tests.values()))))
    return [replace(t, price=replace(t.price, estimate=adjusted[pk]), rescue=replace(t.rescue, estimate=adjusted[rk]))
            for t, (pk, rk) in zip(tradeoffs, keys)]


def tradeoff_keys(tradeoffs: list[TradeOff]) -> list[str]:
    """The keys of the trade-offs' settings that take more than one value (the columns that tell them apart)."""
    keys = list(dict.fromkeys(k for t in tradeoffs for k, _ in t.context))
    return [k for k in keys if len({json.dumps(dict(t.context).get(k)) for t in tradeoffs}) > 1]


def _points(p: Paired) -> tuple[str, str, str]:
    """A paired difference in accuracy points: the mean, its interval (— when none is given) and its Holm-adjusted
    p-value (— likewise)."""
    e = p.estimate
    interval = "—" if p.why_no_interval else f"[{100 * e.low:+.1f}, {100 * e.high:+.1f}]"
    return f"{100 * e.mean:+.1f}", interval, "—" if p.why_no_interval else e.holm_text()


def points_pm(p: Paired) -> str:
    """A paired difference in accuracy points as ``mean ± half-width`` of its 95 % interval (the mean alone when no
    interval is given)."""
    e = p.estimate
    return f"{100 * e.mean:+.1f}" + ("" if p.why_no_interval else f" ± {100 * e.half_width:.1f}")


def sorted_tradeoffs(tradeoffs: list[TradeOff]) -> list[TradeOff]:
    """The order of the trade-off tables and panels: by setting, attack, rule."""
    return sorted(tradeoffs, key=lambda t: (json.dumps(t.context), t.attack, t.rule))


TRADEOFF_HEAD = ("rule", "attack", "price (pts)", "95 % interval", "Holm p (price)", "rescue (pts)", "95 % interval",
                 "Holm p (rescue)", "seeds", "verdict")
"""The columns of the trade-off table (after ``rule``, the setting keys that vary): the terminal's (``phalanx run``,
``phalanx report``, any ``--format``) with each interval in a column of its own (issue 38: report.md's headers differed
from the printed table's)."""

TRADEOFF_MEANING = (
    "*Price* = accuracy of the mean with no attack − the rule's: what the rule costs when nobody attacks; *rescue* = "
    "the rule's accuracy under the attack − the mean's: what it keeps. Final test accuracy in points, paired by seed, "
    f"mean over seeds with a 95 % Student-t interval (none from fewer than {MIN_SEEDS} seeds). Verdicts: every price "
    "and rescue of the table is one family, each decided by its Holm-adjusted p < 0.05 (family-wise error ≤ 5 %); a "
    "rule's price shown beside several attacks is one test."
)
"""The sentence under the trade-off table saying what price and rescue are."""

REPLAYED_BASELINE = (
    "Where the no-attack runs are `none`, the Byzantine workers replay copies of honest rows, so the rule sees "
    "duplicated rows, which a rule that favours near neighbours (Krum) picks; the all-honest baseline is `honest`."
)
"""Said under the table when a price is measured on ``none`` runs (a grid without ``honest`` ones)."""


def tradeoff_meaning(tradeoffs: list[TradeOff]) -> str:
    """What the table's price and rescue are, and, where a price stands on ``none`` runs, that those replay rows."""
    replayed = any(t.baseline == "none" for t in tradeoffs)
    return TRADEOFF_MEANING + (" " + REPLAYED_BASELINE if replayed else "")


def tradeoff_table(tradeoffs: list[TradeOff]) -> tuple[list[str], list[list[str]]]:
    """The trade-off table's header and cells (shared by ``report.md`` and the terminal), per setting and attack,
    rules by name."""
    keys = tradeoff_keys(tradeoffs)
    head = [TRADEOFF_HEAD[0], *keys, *TRADEOFF_HEAD[1:]]
    lines = []
    for t in sorted_tradeoffs(tradeoffs):
        ctx = dict(t.context)
        lines.append([t.rule, *(str(ctx[k]) for k in keys), t.attack, *_points(t.price), *_points(t.rescue),
                      str(len(t.seeds)), t.verdict])
    return head, lines


def tradeoff_markdown(tradeoffs: list[TradeOff]) -> str:
    """The trade-off as a Markdown table with the sentence saying what price and rescue mean."""
    head, lines = tradeoff_table(tradeoffs)
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(md) + "\n\n" + tradeoff_meaning(tradeoffs) + "\n"



HIDDEN_SHARE = 0.02
"""Two points of a trade-off panel closer than this share of the axes' span in x and in y are drawn one over the
other (markers are about 2 % of a panel wide)."""


def hidden_pairs(placed: list[tuple[str, float, float]], xspan: float, yspan: float) -> list[tuple[str, str]]:
    """(under, over) for every point drawn before another that covers it: within :data:`HIDDEN_SHARE` of the spans
    in both coordinates (the later one is drawn on top)."""
    out = []
    for i, (a, xa, ya) in enumerate(placed):
        over = [b for b, xb, yb in placed[i + 1:]
                if abs(xa - xb) <= HIDDEN_SHARE * xspan and abs(ya - yb) <= HIDDEN_SHARE * yspan]
        if over:
            out.append((a, over[-1]))
    return out


def label_hidden(ax: Any, placed: list[tuple[str, float, float]], colours: dict[str, str]) -> None:
    """Name each point another covers, beside it ("geomed under nnm>cwtm"): a newcomer found geomed (+0.2, +81.3)
    wholly under nnm>cwtm (+0.2, +81.4) with nothing to say so (issue 38; accuracy.png names such curves "drawn
    over it")."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    at = {rule: (x, y) for rule, x, y in placed}
    for k, (under, over) in enumerate(hidden_pairs(placed, x1 - x0, y1 - y0)):
        ax.annotate(f"{under} hidden under {over}", at[under], xytext=(8, -12 - 10 * k), textcoords="offset points",
                    fontsize=7, color=colours.get(under, "k"))


def plot_tradeoff(tradeoffs: list[TradeOff], path: Path, colours: dict[str, str] | None = None) -> Path | None:
    """Price (x: accuracy points a rule loses with no attack) against rescue (y: points it keeps under the attack),
    both against the mean, one panel per attack (and setting), one labelled point per rule with its 95 % interval
    bars (a hollow point: no interval, too few seeds or zero width); the mean is the origin. None without
    trade-offs."""
    if not tradeoffs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = colours or rule_colours([MEAN, *(t.rule for t in tradeoffs)])
    markers = rule_markers([MEAN, *(t.rule for t in tradeoffs)])  # a rule's marker in every figure
    keys = tradeoff_keys(tradeoffs)
    panels: dict[tuple[str, str], list[TradeOff]] = defaultdict(list)
    for t in sorted_tradeoffs(tradeoffs):
        ctx = dict(t.context)
        panels[(t.attack, ", ".join(f"{k}={ctx[k]}" for k in keys))].append(t)
    cols = min(3, len(panels))
    rows_ = -(-len(panels) // cols)
    size = (max(6.4, 0.4 + 4.6 * cols), 1.3 + 4.2 * rows_)
    fig, axes = plt.subplots(rows_, cols, figsize=size, dpi=120, squeeze=False)
    hollow = False
    for ax, ((attack, ctx_label), ts) in zip(axes.flat, panels.items()):
        ax.axhline(0, color="0.6", lw=0.8, zorder=0)
        ax.axvline(0, color="0.6", lw=0.8, zorder=0)
        ax.plot([0], [0], marker=markers[MEAN], color=colours.get(MEAN, "k"), ms=8, ls="none", label=MEAN)
        placed: list[tuple[str, float, float]] = [(MEAN, 0.0, 0.0)]
        for t in ts:
            x, y = 100 * t.price.estimate.mean, 100 * t.rescue.estimate.mean
            placed.append((t.rule, x, y))
            c = colours[t.rule]
            px = None if t.price.why_no_interval else [[x - 100 * t.price.estimate.low],
                                                        [100 * t.price.estimate.high - x]]
            py = None if t.rescue.why_no_interval else [[y - 100 * t.rescue.estimate.low],
                                                         [100 * t.rescue.estimate.high - y]]
            full = px is not None and py is not None
            hollow = hollow or not full
            ax.errorbar([x], [y], xerr=px, yerr=py, marker=markers[t.rule], ms=8, color=c,
                        mfc=c if full else "white", capsize=3, lw=1.2, ls="none", alpha=0.9, label=t.rule)
        ax.set_title(f"attack = {attack}" + (f" ({ctx_label})" if ctx_label else ""), fontsize=10)
        ax.set_xlabel("price: points lost with no attack →")
        ax.set_ylabel("rescue: points kept under the attack ↑")
        ax.grid(alpha=0.3)
        ax.margins(0.15)
        label_hidden(ax, placed, colours)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    seeds = sorted({len(t.seeds) for t in tradeoffs})
    n = (f"{seeds[0]} seed" + ("s" if seeds[0] != 1 else "")) if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]} seeds"
    fig.suptitle(f"Robust rules against the mean (the origin), paired by seed over {n}\n"
                 "up: keeps accuracy under the attack; right: costs accuracy when no one attacks\n"
                 "bars: 95 % intervals, each on its own (verdicts: the table's Holm-adjusted p)"
                 + ("; hollow: no interval (too few seeds or zero width)" if hollow else ""), fontsize=9)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06 if rows_ == 1 else 0.03, 1, 1))
    return save_figure(fig, path)


def write_report(root: Path, out: Path | None = None, runs: Collection[str] | None = None) -> dict[str, Any]:
    """Write ``report.md``, ``accuracy.png`` (per round: test accuracy, and the aggregation error and Byzantine
    share where the runs logged them), (if useful) ``heatmap.png`` and — when the grid has the mean and another rule
    with no attack and under an attack (:func:`tradeoff`) — the trade-off table and ``tradeoff.png``, for the runs
    under ``root``; returns the summary, the varying keys, the trade-offs (``tradeoff``, maybe []) and the plots
    written (``plots``), each embedded in ``report.md``. With ``runs`` (a grid's run ids: what ``phalanx run`` and
    ``sweep`` report), the runs of ``root`` named by them alone; ``left_out`` counts the other run folders found
    there (reported by ``phalanx report``, not as this grid's: under ``verify_key`` they were never verified).

    A run whose metrics cannot be read is a :class:`ConfigError` naming its file; a directory the report cannot be
    written to an :class:`OutputError` naming the file.
    """
    out = out or root
    try:
        return _write_report(root, out, runs)
    except OutputError as exc:
        if exc.what not in ("permission denied", "read-only file system"):
            raise
        raise OutputError(exc.path, exc.what, f"make {out} writable, or copy it somewhere writable and run phalanx "
                          "report there") from None


def _caption(rows: list[dict[str, Any]]) -> str:
    """What ``accuracy.png`` shows, for its alt text in ``report.md``."""
    return ", ".join(["test accuracy"] + [y for m, y, _ in PANELS[1:] if panel_values(rows, [], m)]) + " per round"


def completeness_line(root: Path, rows: list[dict[str, Any]], runs: Collection[str] | None = None) -> str | None:
    """What a report of ``root`` leaves out, in one sentence — runs still unfinished (their last rows are in the
    table), and runs of the grid (``runs``, else ``grid.json``'s) with no rows yet — or None when every run of the
    grid has finished."""
    present = {r["run"] for r in rows}
    unfinished = len(present - {r["run"] for r in rows if r.get("finished") or r.get("run_diverged")})
    grid = list(runs) if runs is not None else status.runs_of(root) if root.is_dir() else []
    missing = len([run for run in grid if run not in present])
    if not unfinished and not missing:
        return None
    parts = ([f"{unfinished} of them not finished (their last evaluated round is what the table shows)"]
             if unfinished else [])
    parts += [f"{missing} more run(s) of the grid have no results yet"] if missing else []
    return "Incomplete: " + "; ".join(parts) + "."


def mixed_line(extra: list[str]) -> str:
    """What a report says of runs whose configs differ in keys beyond the usual setting keys (a grid that varies
    them, or more than one grid written into one directory)."""
    return ("**These runs' configs also differ in " + ", ".join(f"`{k}`" for k in extra) + "** (beyond the usual "
            "setting keys): runs that differ in them are kept apart, each such key a column, never pooled as seeds of "
            "one setting.")


def left_out_line(root: Path, left_out: int) -> str:
    """What a grid's report says of the run folders in its directory that are not its runs."""
    return (f"{left_out} other run folder(s) under {root} are not runs of this grid: left out of its report "
            f"(`phalanx report {root}` reports every run there)")


def _write_report(root: Path, out: Path, runs: Collection[str] | None) -> dict[str, Any]:
    rows = collect(root, runs)
    left_out = 0 if runs is None else len(run_dirs(root)) - len(run_dirs(root, runs))
    if not rows:
        raise ConfigError("DIR", str(root), "a directory holding run directories (config.json + metrics.jsonl)")
    extra = other_keys(rows)
    summary = summarize(rows, (*SETTING_KEYS, *extra))
    keys = varying(summary, (*SETTING_KEYS, *extra))
    curves = plot_curves(rows, keys, out / "accuracy.png")
    heat = plot_heatmap(summary, out / "heatmap.png", keys)
    trades = tradeoff(rows, extra)
    trade_plot = plot_tradeoff(trades, out / "tradeoff.png")
    for stale in {"heatmap.png", "tradeoff.png"} - {p.name for p in (heat, trade_plot) if p is not None}:
        (out / stale).unlink(missing_ok=True)  # an earlier grid's plot in this folder would read as this one's
    completeness = completeness_line(root, rows, runs)
    md = ["# Phalanx report", "", f"Runs under `{root}`: {len({r['run'] for r in rows})}." + (
        f" **{completeness}**" if completeness else ""), "", (setup_line(rows) or "No setting is shared") + ".", ""]
    if extra:
        md += [mixed_line(extra), ""]
    if left_out:
        md += [left_out_line(root, left_out) + ".", ""]
    md += [markdown_table(summary, keys), SUMMARY_CAPTION]
    if trades:
        md += ["", "## The price and rescue of robustness", "", tradeoff_markdown(trades).rstrip("\n")]
        unfinished = len({r["run"] for r in rows}) - len(_final_runs(rows))
        if unfinished:
            md += ["", f"({unfinished} run(s) still unfinished are left out of this comparison.)"]
        if trade_plot is not None:
            md += ["", f"![price against rescue per rule, against the mean]({trade_plot.name})"]
    elif len(summary) > 1:
        md += ["", f"({NO_COMPARISON}.)"]
    md += ["", f"![{_caption(rows)}]({curves.name})"]
    if heat is not None:
        md += ["", f"![heatmap]({heat.name})"]
    store.atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    return {"summary": summary, "keys": keys, "tradeoff": trades, "incomplete": completeness, "mixed": extra,
            "left_out": left_out, "plots": [p for p in (curves, heat, trade_plot) if p is not None],
            "setup": setup_line(rows)}
