"""The planner: on the user's own task, what each (rule, f) costs with no attack and buys under attack.

For a run configuration (the user's data, model, n, schedule …), the planner trains every rule of a list, each
configured for every f of a list, twice over: with **no attack** (all n workers honest — the price of robustness,
Yang, Shi & Li, ICML 2025) and with K = ``expect_byzantine`` workers running each of a set of strong attacks. The
plain mean (f = 0) runs too, as the baseline. The result is the trade-off table: per (rule, f), the no-attack
accuracy and its cost against the mean, the accuracy under each attack and the worst case.

The recommendation for the stated threat K: among the (rule, f) configured to tolerate it (f ≥ K), take the best
worst-case accuracy under attack; every candidate within ``tolerance`` of it is as good under attack, and of those
the one with the highest no-attack accuracy — the cheapest robustness that still holds — is recommended.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx import aggregators
from phalanx.errors import ConfigError, PhalanxError
from phalanx.experiments import grid, store
from phalanx.experiments.config import RunConfig, make_config
from phalanx.experiments.report import save_figure

DEFAULT_RULES = ("cwtm", "nnm>cwtm", "multikrum", "geomed")
DEFAULT_ATTACKS = ("alie", "foe", "signflip", "minmax")
_PLANNER_KEYS = ("aggregator", "f", "attack", "byzantine", "seed")


def default_fs(expect: int, workers: int) -> list[int]:
    """f values to try: half the expected threat, the threat itself, and twice it (within 1 … ⌊(n−1)/2⌋)."""
    fmax = (workers - 1) // 2
    if expect == 0:
        return sorted({v for v in (1, max(1, fmax // 2)) if 1 <= v <= fmax})
    return sorted({v for v in (max(1, expect // 2), expect, 2 * expect) if 1 <= v <= fmax})


@dataclass(frozen=True)
class Job:
    """One planned run: which rule and f, under which attack (``none`` = no attack), which seed."""

    rule: str
    f: int
    attack: str
    seed: int


@dataclass
class Plan:
    """The validated grid of the planner, and the settings it skipped (a rule that cannot run with that f)."""

    base: dict[str, Any]
    rules: list[str]
    fs: list[int]
    attacks: list[str]
    expect: int
    seeds: list[int]
    jobs: list[Job]
    configs: list[RunConfig]
    skipped: list[str]


def _single(base: dict[str, Any], key: str) -> Any:
    v = base.get(key)
    return v[0] if isinstance(v, list) and len(v) == 1 else v


def make_plan(
    base: dict[str, Any], *, expect: int, rules: list[str] | None = None, fs: list[int] | None = None,
    attacks: list[str] | None = None, seeds: list[int] | None = None,
) -> Plan:
    """Build and validate every run of the plan from the user's config ``base`` (a dict as read from TOML).

    The planner chooses ``aggregator``, ``f``, ``attack``, ``byzantine`` and ``seed`` itself; list values of
    ``aggregator``, ``attack`` and ``seed`` in ``base`` are taken as the rules, attacks and seeds to try. Any other
    list-valued key is an error (one plan is one task).
    """
    base = dict(base)
    other_lists = [k for k, v in base.items() if isinstance(v, list) and k not in _PLANNER_KEYS]
    if other_lists:
        raise ConfigError(other_lists[0], base[other_lists[0]],
                          "a single value (the planner varies aggregator, f, attack and seed itself)")
    workers = int(_single(base, "workers") or RunConfig.model_fields["workers"].default)
    if isinstance(expect, bool) or not isinstance(expect, int) or not 0 <= expect < workers:
        raise ConfigError("expect_byzantine", expect, f"an integer in [0, {workers - 1}] (workers = {workers})")
    if rules is None:
        agg = base.get("aggregator")
        rules = list(agg) if isinstance(agg, list) else list(DEFAULT_RULES)
    if attacks is None:
        att = base.get("attack")
        attacks = [a for a in att if a != "none"] if isinstance(att, list) else list(DEFAULT_ATTACKS)
    if seeds is None:
        sd = base.get("seed", 0)
        seeds = list(sd) if isinstance(sd, list) else [int(sd)]
    fs = sorted(set(fs)) if fs is not None else default_fs(expect, workers)
    for name, values in (("rules", rules), ("fs", fs), ("seeds", seeds)):
        if not values:
            raise ConfigError(name, values, "a non-empty list")
    if expect > 0 and not attacks:
        raise ConfigError("attacks", attacks, "at least one attack when expect_byzantine > 0")
    for key in _PLANNER_KEYS:
        base.pop(key, None)
    jobs: list[Job] = []
    skipped: list[str] = []
    settings = [("mean", 0)] + [(r, f) for r in rules for f in fs if r != "mean"]
    for rule, f in settings:
        try:
            comp = aggregators.make(rule, f=f)
        except PhalanxError as exc:
            raise ConfigError("rules", rule, "aggregator specs (phalanx list aggregators)", str(exc)) from None
        if workers < comp.min_workers():
            skipped.append(f"{rule} with f={f}: needs n >= {comp.min_workers()} ({comp.requirement}), n = {workers}")
            continue
        threats = ["none"] + (list(attacks) if expect > 0 else [])
        jobs += [Job(rule, f, a, s) for a in threats for s in seeds]
    configs = [
        make_config({**base, "aggregator": j.rule, "f": j.f, "attack": j.attack,
                     "byzantine": 0 if j.attack == "none" else expect, "seed": j.seed})
        for j in jobs
    ]
    return Plan(base, list(rules), fs, list(attacks), expect, list(seeds), jobs, configs, skipped)


@dataclass
class Row:
    """One (rule, f) line of the trade-off table (accuracies are means over seeds, in [0, 1])."""

    rule: str
    f: int
    no_attack: float
    cost: float  # mean's no-attack accuracy − this one's (positive = robustness costs accuracy)
    agg_error: float | None  # mean no-attack aggregation error (the measured price, per evaluated round)
    under_attack: dict[str, float]
    worst: float | None
    worst_attack: str | None


def final_rows(plan: Plan, runs_dir: Path) -> list[Row]:
    """Read the finished runs and build the table (one row per (rule, f), seeds averaged)."""
    acc: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    err: dict[tuple[str, int], list[float]] = defaultdict(list)
    for job, cfg in zip(plan.jobs, plan.configs):
        rows = store.finished_rows(runs_dir / grid.run_id(cfg))
        last = rows[-1]
        acc[(job.rule, job.f, job.attack)].append(float(last["test_accuracy"]))
        if job.attack == "none":
            err[(job.rule, job.f)] += [float(r["agg_error"]) for r in rows if r.get("agg_error") is not None]
    mean_acc = {k: sum(v) / len(v) for k, v in acc.items()}
    baseline = mean_acc[("mean", 0, "none")]
    out = []
    for rule, f in dict.fromkeys((j.rule, j.f) for j in plan.jobs):
        under = {a: mean_acc[(rule, f, a)] for a in plan.attacks if (rule, f, a) in mean_acc}
        worst_attack = min(under, key=lambda a: under[a]) if under else None
        errs = err.get((rule, f), [])
        no = mean_acc[(rule, f, "none")]
        out.append(Row(rule, f, no, baseline - no, sum(errs) / len(errs) if errs else None, under,
                       under[worst_attack] if worst_attack else None, worst_attack))
    return out


@dataclass
class Recommendation:
    """The chosen (rule, f) for the threat, and why."""

    rule: str
    f: int
    text: str


def recommend(rows: list[Row], expect: int, tolerance: float = 0.01) -> Recommendation:
    """The cheapest (highest no-attack accuracy) row among those configured for f ≥ ``expect`` whose worst case
    under attack is within ``tolerance`` of the best worst case (module docstring)."""
    if not 0 <= tolerance < 1:
        raise ConfigError("tolerance", tolerance, "a number in [0, 1) (accuracy points / 100)")
    mean_row = next(r for r in rows if r.rule == "mean" and r.f == 0)
    if expect == 0:
        best = max(rows, key=lambda r: r.no_attack)
        return Recommendation(best.rule, best.f, (
            f"With no Byzantine worker expected, robustness only costs: {best.rule} (f={best.f}) has the best "
            f"no-attack accuracy, {100 * best.no_attack:.1f}%."))
    candidates = [r for r in rows if r.f >= expect and r.worst is not None]
    if not candidates:
        return Recommendation("mean", 0, (
            f"No rule in the plan was configured for f >= {expect}: add larger f values (--f) — nothing here is "
            "meant to tolerate the stated threat."))
    top = max(r.worst for r in candidates if r.worst is not None)
    good = [r for r in candidates if r.worst is not None and r.worst >= top - tolerance]
    pick = max(good, key=lambda r: (r.no_attack, -r.f))
    assert pick.worst is not None and mean_row.worst is not None
    text = (
        f"Expecting {expect} Byzantine worker(s): use {pick.rule} with f={pick.f}. Under the worst of the attacks "
        f"tried ({pick.worst_attack}) it keeps {100 * pick.worst:.1f}% accuracy (the mean: "
        f"{100 * mean_row.worst:.1f}% under {mean_row.worst_attack}); with no attack it costs "
        f"{100 * pick.cost:+.1f} points against the mean ({100 * pick.no_attack:.1f}% vs "
        f"{100 * mean_row.no_attack:.1f}%). {len(good)} of {len(candidates)} settings with f >= {expect} were within "
        f"{100 * tolerance:g} point(s) of the best worst case; this one costs least with no attack."
    )
    return Recommendation(pick.rule, pick.f, text)


def to_markdown(rows: list[Row], plan: Plan, rec: Recommendation) -> str:
    """The trade-off table and the recommendation as Markdown."""
    attacks = plan.attacks if plan.expect > 0 else []
    head = ["rule", "f", "no attack %", "cost (points)", "agg. error"] + [f"{a} %" for a in attacks]
    head += ["worst %", "worst attack"] if attacks else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.rule, str(r.f), f"{100 * r.no_attack:.1f}", f"{100 * r.cost:+.1f}",
                 "—" if r.agg_error is None else f"{r.agg_error:.3g}"]
        cells += [f"{100 * r.under_attack[a]:.1f}" if a in r.under_attack else "—" for a in attacks]
        if attacks:
            cells += ["—" if r.worst is None else f"{100 * r.worst:.1f}", r.worst_attack or "—"]
        mark = "**" if (r.rule, r.f) == (rec.rule, rec.f) else ""
        lines.append("| " + " | ".join(f"{mark}{c}{mark}" if c else c for c in cells) + " |")
    return "\n".join(lines)


def to_csv(rows: list[Row], plan: Plan) -> str:
    """The table as CSV (accuracies in [0, 1])."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["rule", "f", "no_attack", "cost", "agg_error", *plan.attacks, "worst", "worst_attack"])
    for r in rows:
        w.writerow([r.rule, r.f, f"{r.no_attack:.6f}", f"{r.cost:.6f}",
                    "" if r.agg_error is None else f"{r.agg_error:.6g}",
                    *[f"{r.under_attack[a]:.6f}" if a in r.under_attack else "" for a in plan.attacks],
                    "" if r.worst is None else f"{r.worst:.6f}", r.worst_attack or ""])
    return buf.getvalue()


def plot(rows: list[Row], plan: Plan, rec: Recommendation, path: Path) -> Path | None:
    """No-attack accuracy (x) against worst-case accuracy under attack (y), one point per (rule, f)."""
    if plan.expect == 0:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    rules = list(dict.fromkeys(r.rule for r in rows))
    for i, rule in enumerate(rules):
        pts = [r for r in rows if r.rule == rule and r.worst is not None]
        baseline = rule == "mean"  # the no-defence reference: a star drawn on top
        ax.plot([100 * r.no_attack for r in pts], [100 * (r.worst or 0) for r in pts],
                marker="*" if baseline else "o", markersize=14 if baseline else 6, zorder=5 if baseline else 2,
                linestyle="-" if len(pts) > 1 else "none", color="k" if baseline else f"C{i}",
                label="mean (no defence)" if baseline else rule)
        for r in pts:
            ax.annotate(f"f={r.f}", (100 * r.no_attack, 100 * (r.worst or 0)), fontsize=7,
                        textcoords="offset points", xytext=(4, 3))
    picked = next(r for r in rows if (r.rule, r.f) == (rec.rule, rec.f))
    if picked.worst is not None:
        ax.scatter([100 * picked.no_attack], [100 * picked.worst], s=200, facecolors="none", edgecolors="k",
                   label="recommended")
    ax.set_xlabel("accuracy with no attack (%)")
    ax.set_ylabel(f"worst accuracy under attack, {plan.expect} Byzantine (%)")
    ax.set_title("What robustness costs (→ left) and buys (↑ up)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def write_outputs(rows: list[Row], plan: Plan, rec: Recommendation, out: Path) -> list[Path]:
    """Write ``plan.md`` (the recommendation and the table), ``plan.csv`` and ``plan.png`` into ``out`` (atomically);
    the paths written."""
    md = (f"# Robustness plan\n\n{rec.text}\n\n" + to_markdown(rows, plan, rec) + "\n\n"
          + "".join(f"- skipped: {n}\n" for n in plan.skipped))
    store.atomic_write_text(out / "plan.md", md)
    store.atomic_write_text(out / "plan.csv", to_csv(rows, plan))
    written = [out / "plan.md", out / "plan.csv"]
    fig = plot(rows, plan, rec, out / "plan.png")
    return [*written, fig] if fig else written
