"""The planner: on the user's own task, what each (rule, f) costs with no attack and buys under attack.

For a run configuration (the user's data, model, n, schedule …), the planner trains every rule of a list, each
configured for every f of a list, twice over: with **no attack** (all n workers honest — the price of robustness,
Yang, Shi & Li, ICML 2025) and with K = ``expect_byzantine`` workers running each of a set of strong attacks. The
plain mean (f = 0) runs too, as the baseline. The result is the trade-off table: per (rule, f), the no-attack
accuracy and its cost against the mean, the accuracy under each attack and the worst case.

The recommendation for the stated threat K: among the (rule, f) configured to tolerate it (f ≥ K), leave out
every one whose worst-case accuracy under the attacks tried is below the plain mean's (it did worse than no defence
at all); of the rest take the best worst case; every candidate within ``tolerance`` of it is as good under attack,
and of those the one with the highest no-attack accuracy — the cheapest robustness that still holds — is
recommended. When none is left, the mean is recommended and the text says why (every robust setting did worse than
no defence under the attacks tried, or under every one of them).

A (rule, f) that cannot run with the task's n — the rule's requirement fails, or f ≥ n/2 (no honest majority) — is
skipped with a note that says what to change: the largest f this n allows for that rule, or the n that f needs.
What it can know before training it refuses before training, in one line: a threat of K ≥ n/2 (no rule tolerates
it), or f values none of which a rule can run with at f ≥ K.

A rule whose output does not depend on f (the geometric median: f only checks n > 2f) is planned once, at the
smallest f ≥ K it can run with, and shown with f "any" — three f values of it would be three copies of one run.
Whether f matters is found out, not listed: the rule configured for two values of f, on the same random rows.

Every accuracy is a mean over the seeds; with three seeds or more the table and the recommendation give its 95 %
Student-t interval, and with fewer the recommendation says it is a suggestion, not a verdict. The default tolerance
is derived from the data (:func:`derived_tolerance`): one test sample's worth of accuracy, or the seeds' spread of
the worst cases when that is wider.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from phalanx import aggregators
from phalanx.analysis.stats import Estimate, mean_ci
from phalanx.errors import ConfigError, PhalanxError
from phalanx.experiments import grid, store
from phalanx.experiments.config import RunConfig, make_config
from phalanx.experiments.plots import rule_colours, save_figure
from phalanx.experiments.report import format_agg_error

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
    """The validated grid of the planner, and the settings it skipped (a rule that cannot run with that f and n),
    each a note that says what to change (:func:`too_large`)."""

    base: dict[str, Any]
    rules: list[str]
    fs: list[int]
    attacks: list[str]
    expect: int
    seeds: list[int]
    jobs: list[Job]
    configs: list[RunConfig]
    skipped: list[str]
    f_free: frozenset[str] = frozenset()
    """The rules planned once because their output does not depend on f (:func:`f_matters`)."""


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
    if expect > 0 and 2 * expect >= workers:  # knowable now: train nothing
        raise ConfigError("expect_byzantine", expect, f"< n/2 = {workers / 2:g} with workers = {workers}: no rule "
                          "tolerates f >= n/2 (each needs an honest majority, n > 2f)",
                          f"use n >= {2 * expect + 1} workers, or plan for at most {(workers - 1) // 2}")
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
    free: set[str] = set()
    settings: list[tuple[str, int]] = [("mean", 0)]
    for rule in (r for r in rules if r != "mean"):
        try:
            notes = {f: too_large(rule, f, workers) for f in fs}
        except PhalanxError as exc:
            raise ConfigError("rules", rule, "aggregator specs (phalanx list aggregators)", str(exc)) from None
        runnable = [f for f in fs if notes[f] is None]
        if len(runnable) > 1 and not f_matters(rule, runnable[0], runnable[-1], workers):
            free.add(rule)
            runnable = [next((f for f in runnable if f >= expect), runnable[-1])]
        skipped += [note for note in notes.values() if note is not None]
        settings += [(rule, f) for f in runnable]
    if expect > 0 and not any(f >= expect for rule, f in settings if rule != "mean"):
        raise ConfigError("f", fs, f"at least one value >= expect_byzantine = {expect} that a rule of the plan can "
                          f"run with at n = {workers} (nothing else is meant to tolerate the threat)",
                          "; ".join(skipped) or f"add {expect} to --f")
    for rule, f in settings:
        threats = ["none"] + (list(attacks) if expect > 0 else [])
        jobs += [Job(rule, f, a, s) for a in threats for s in seeds]
    configs = [
        make_config({**base, "aggregator": j.rule, "f": j.f, "attack": j.attack,
                     "byzantine": 0 if j.attack == "none" else expect, "seed": j.seed})
        for j in jobs
    ]
    return Plan(base, list(rules), fs, list(attacks), expect, list(seeds), jobs, configs, skipped, frozenset(free))


def f_matters(rule: str, f_a: int, f_b: int, workers: int, dim: int = 8, trials: int = 20) -> bool:
    """Whether ``rule`` configured for ``f_a`` and for ``f_b`` gives different outputs on the same rows: ``trials``
    random ``(workers, dim)`` draws, some with a few rows scaled by 10 or 100 (a rule that trims or selects shows its
    f on those), with the same generator and a reference near the rows for a rule that takes one. False for a rule
    that reads f only to check n (the geometric median, the coordinate-wise median, centered clipping)."""
    rules = [aggregators.make(rule, f=f) for f in (f_a, f_b)]
    keys = set(getattr(rules[0], "context_keys", ()))
    for seed in range(trials):
        x = torch.randn(workers, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        x[: seed % 5] *= 10.0 ** (seed % 3)
        outs = []
        for agg in rules:
            ctx: dict[str, Any] = {}
            if "reference" in keys:
                ctx["reference"] = x.mean(0) + 0.1
            if "generator" in keys:
                ctx["generator"] = torch.Generator().manual_seed(seed)
            outs.append(agg(x, **ctx))
        if not torch.equal(outs[0], outs[1]):
            return True
    return False


def _fits(rule: str, f: int, workers: int) -> bool:
    """Whether ``rule`` configured for ``f`` can run with n = ``workers``: its requirement holds and n > 2f."""
    try:
        return 2 * f < workers and workers >= aggregators.make(rule, f=f).min_workers()
    except PhalanxError:  # a spec that takes no such f
        return False


def largest_f(rule: str, workers: int, below: int | None = None) -> int | None:
    """The largest f ≥ 1 (and < ``below``) that ``rule`` can be configured for with n = ``workers``; None if none."""
    top = (workers - 1) // 2 if below is None else min(below - 1, (workers - 1) // 2)
    return next((g for g in range(top, 0, -1) if _fits(rule, g, workers)), None)


def too_large(rule: str, f: int, workers: int) -> str | None:
    """None if ``rule`` with ``f`` can run with n = ``workers``; else the note that says so and what to change —
    the largest f this n allows for the rule, and the n that f needs (its requirement, and n > 2f)."""
    comp = aggregators.make(rule, f=f)
    need = max(comp.min_workers(), 2 * f + 1 if f > 0 else 1)
    if workers >= need:
        return None
    why = (f"needs n >= {need} ({comp.requirement})" if workers < comp.min_workers()
           else f"f >= n/2 leaves no honest majority (needs n > 2f, n >= {need})")
    g = largest_f(rule, workers, below=f)
    if g is None:
        return (f"{rule} with f={f}: {why}, n = {workers} — {rule} cannot run with n = {workers} at any f >= 1: use "
                f"n >= {need} workers for f={f}")
    return (f"{rule} with f={f}: {why}, n = {workers} — with n = {workers} use f <= {g} for {rule}, or n >= {need} "
            f"workers for f={f}")


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
    seeds: int = 1
    no_attack_ci: Estimate | None = None
    """The 95 % interval of the no-attack accuracy over the seeds (None with fewer than 3)."""
    worst_ci: Estimate | None = None
    """The 95 % interval of the accuracy under the worst attack over the seeds (None with fewer than 3)."""
    f_free: bool = False
    """Its output does not depend on f: planned once, shown with f "any"."""

    @property
    def f_label(self) -> str:
        return "any" if self.f_free else str(self.f)


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

    def ci(values: list[float]) -> Estimate | None:
        return mean_ci(values) if len(values) >= 3 else None

    out = []
    for rule, f in dict.fromkeys((j.rule, j.f) for j in plan.jobs):
        under = {a: mean_acc[(rule, f, a)] for a in plan.attacks if (rule, f, a) in mean_acc}
        worst_attack = min(under, key=lambda a: under[a]) if under else None
        errs = err.get((rule, f), [])
        no = mean_acc[(rule, f, "none")]
        out.append(Row(rule, f, no, baseline - no, sum(errs) / len(errs) if errs else None, under,
                       under[worst_attack] if worst_attack else None, worst_attack,
                       seeds=len(acc[(rule, f, "none")]), no_attack_ci=ci(acc[(rule, f, "none")]),
                       worst_ci=ci(acc[(rule, f, worst_attack)]) if worst_attack else None,
                       f_free=rule in plan.f_free))
    return out


def derived_tolerance(rows: list[Row], test_samples: int) -> float:
    """Within how much two worst cases count as equal, from the data: one test sample's worth of accuracy
    (1 / ``test_samples``; finer differences are not measured), or the widest 95 % half-width of the worst cases
    over the seeds when that is wider (differences the seeds' spread cannot tell apart)."""
    spread = [r.worst_ci.half_width for r in rows if r.worst_ci is not None]
    return max([1.0 / max(1, test_samples), *spread])


def with_interval(value: float, ci: Estimate | None) -> str:
    """A percentage, with its interval's half-width when there is one."""
    return f"{100 * value:.1f}" + (f" ± {100 * ci.half_width:.1f}" if ci is not None else "")


@dataclass
class Recommendation:
    """The chosen (rule, f) for the threat, and why."""

    rule: str
    f: int
    text: str


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _worse_everywhere(r: Row, mean_row: Row) -> bool:
    """Whether ``r`` did worse than the mean under every attack both were run with."""
    common = [a for a in r.under_attack if a in mean_row.under_attack]
    return bool(common) and all(r.under_attack[a] < mean_row.under_attack[a] for a in common)


def recommend(rows: list[Row], expect: int, tolerance: float = 0.01, workers: int | None = None) -> Recommendation:
    """The cheapest (highest no-attack accuracy) row among those configured for f ≥ ``expect`` and not worse than
    no defence (the mean) in the worst case under attack, whose worst case is within ``tolerance`` of the best
    (module docstring); the mean, with the reason, when every such row did worse than the mean. ``workers`` (n),
    when given, lets the text say what to change when nothing in the plan tolerates the threat."""
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
        return Recommendation("mean", 0, _no_candidates(expect, workers))
    baseline = mean_row.worst

    def did_worse(r: Row) -> bool:  # than no defence, in the worst case over the attacks tried
        return baseline is not None and r.worst is not None and r.worst < baseline

    worse = [r for r in candidates if did_worse(r)]
    eligible = [r for r in candidates if not did_worse(r)]
    if not eligible:
        return Recommendation("mean", 0, _mean_wins(candidates, mean_row, expect))
    top = max(r.worst for r in eligible if r.worst is not None)
    good = [r for r in eligible if r.worst is not None and r.worst >= top - tolerance]
    pick = max(good, key=lambda r: (r.no_attack, -r.f))
    assert pick.worst is not None
    use = f"{pick.rule} (its output does not depend on f)" if pick.f_free else f"{pick.rule} with f={pick.f}"
    versus = ("" if mean_row.worst is None
              else f" (the mean: {_pct(mean_row.worst)} under {mean_row.worst_attack})")
    text = (
        f"Expecting {expect} Byzantine worker(s): use {use}. Under the worst of the attacks "
        f"tried ({pick.worst_attack}) it keeps {_pct(pick.worst)} accuracy{versus}; with no attack it costs "
        f"{100 * pick.cost:+.1f} points against the mean ({_pct(pick.no_attack)} vs {_pct(mean_row.no_attack)}). "
        f"{len(good)} of {len(eligible)} settings with f >= {expect}{' not worse than no defence' if worse else ''} "
        f"were within {100 * tolerance:.3g} point(s) of the best worst case; this one costs least with no attack."
    )
    if mean_row.worst is not None and pick.worst <= mean_row.worst + tolerance:
        text += (f" It is within {100 * tolerance:.3g} point(s) of no defence in the worst case: the attacks tried do "
                 "not separate it from the mean on this task.")
    if worse:
        text += (" Left out as worse than no defence under the attacks tried: "
                 + ", ".join(f"{r.rule} (f={r.f_label})" for r in worse) + ".")
    return Recommendation(pick.rule, pick.f, _seeds_caveat(rows) + text)


def _seeds_caveat(rows: list[Row]) -> str:
    """What a recommendation from fewer than 3 seeds is: a suggestion (no interval, no verdict)."""
    k = min((r.seeds for r in rows), default=0)
    if k >= 3:
        return ""
    return (f"From {k} seed(s) — a suggestion, not a verdict (an interval needs 3 seeds or more: list them, "
            "seed = [0, 1, 2]). ")


def _no_candidates(expect: int, workers: int | None) -> str:
    """The recommendation's text when no setting of the plan is configured for f ≥ ``expect``: what to change."""
    if workers is not None and 2 * expect >= workers:
        return (f"Expecting {expect} of n = {workers} workers to be Byzantine: no rule tolerates f >= n/2 (each needs "
                f"an honest majority, n > 2f). Use n >= {2 * expect + 1} workers, or plan for at most "
                f"{(workers - 1) // 2} Byzantine worker(s) with n = {workers}; until then use mean (f=0) — nothing "
                "here is meant to tolerate the stated threat.")
    limit = ("" if workers is None else f" (with n = {workers}, f can be at most {(workers - 1) // 2}; each skipped "
             "setting says its rule's own limit)")
    return (f"No rule in the plan was configured for f >= {expect}: add f = {expect} to the f values (--f){limit} — "
            "nothing here is meant to tolerate the stated threat; until then use mean (f=0).")


def _mean_wins(candidates: list[Row], mean_row: Row, expect: int) -> str:
    """The recommendation's text when every setting with f ≥ ``expect`` did worse than the mean under attack."""
    assert mean_row.worst is not None
    best = max(candidates, key=lambda r: (r.worst or 0.0, r.no_attack))
    assert best.worst is not None
    everywhere = all(_worse_everywhere(r, mean_row) for r in candidates)
    how = "under every attack tried" if everywhere else "in the worst case over the attacks tried"
    return (
        f"Expecting {expect} Byzantine worker(s): use mean (f=0) — no defence. Every robust setting with f >= "
        f"{expect} did worse than the plain mean {how}: the mean keeps {_pct(mean_row.worst)} under its worst attack "
        f"({mean_row.worst_attack}), the best of them, {best.rule} with f={best.f}, {_pct(best.worst)} under "
        f"{best.worst_attack}. On this task the rules tried buy nothing against these attacks; try other rules or "
        "attacks, more rounds or seeds before trusting a defence."
    )


def to_markdown(rows: list[Row], plan: Plan, rec: Recommendation) -> str:
    """The trade-off table and the recommendation as Markdown (accuracies as mean ± the 95 % half-width over the
    seeds when there are 3 or more)."""
    attacks = plan.attacks if plan.expect > 0 else []
    head = ["rule", "f", "no attack %", "cost (points)", "agg. error"] + [f"{a} %" for a in attacks]
    head += ["worst %", "worst attack"] if attacks else []
    head += ["seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.rule, r.f_label, with_interval(r.no_attack, r.no_attack_ci), f"{100 * r.cost:+.1f}",
                 format_agg_error(r.agg_error)]
        cells += [f"{100 * r.under_attack[a]:.1f}" if a in r.under_attack else "—" for a in attacks]
        if attacks:
            cells += ["—" if r.worst is None else with_interval(r.worst, r.worst_ci), r.worst_attack or "—"]
        cells.append(str(r.seeds))
        mark = "**" if (r.rule, r.f) == (rec.rule, rec.f) else ""
        lines.append("| " + " | ".join(f"{mark}{c}{mark}" if c else c for c in cells) + " |")
    notes = [f"{rule}: its output does not depend on f (checked on random rows), so it ran once"
             for rule in sorted(plan.f_free)]
    return "\n".join(lines) + "".join(f"\n\n{n}." for n in notes)


def to_csv(rows: list[Row], plan: Plan) -> str:
    """The table as CSV (accuracies in [0, 1])."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["rule", "f", "no_attack", "cost", "agg_error", *plan.attacks, "worst", "worst_attack", "seeds",
                "f_matters"])
    for r in rows:
        w.writerow([r.rule, r.f, f"{r.no_attack:.6f}", f"{r.cost:.6f}",
                    "" if r.agg_error is None else f"{r.agg_error:.6g}",
                    *[f"{r.under_attack[a]:.6f}" if a in r.under_attack else "" for a in plan.attacks],
                    "" if r.worst is None else f"{r.worst:.6f}", r.worst_attack or "", r.seeds,
                    "no" if r.f_free else "yes"])
    return buf.getvalue()


def point_labels(rows: list[Row]) -> list[tuple[float, float, str]]:
    """One label per drawn point of :func:`plot` (in %): ``f=K`` alone, and the settings of points that coincide at
    the table's precision (0.1 point) in one label — ``mean = cwtm f=4`` — instead of labels printed over each
    other (a robust setting that lands on the mean is hidden under its star otherwise)."""
    groups: dict[tuple[float, float], list[Row]] = {}
    for r in rows:
        if r.worst is not None:
            groups.setdefault((round(100 * r.no_attack, 1), round(100 * r.worst, 1)), []).append(r)
    out = []
    for (x, y), members in groups.items():
        if len(members) == 1:
            text = f"f={members[0].f_label}"
        else:
            text = " = ".join("mean" if m.rule == "mean" else f"{m.rule} f={m.f_label}" for m in members)
        out.append((x, y, text))
    return out


def plot(rows: list[Row], plan: Plan, rec: Recommendation, path: Path) -> Path | None:
    """No-attack accuracy (x) against worst-case accuracy under attack (y), one point per (rule, f)."""
    if plan.expect == 0:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    rules = list(dict.fromkeys(r.rule for r in rows))
    colours = rule_colours(rules)  # each rule's colour in every figure (the mean: a black star here)
    for rule in rules:
        pts = [r for r in rows if r.rule == rule and r.worst is not None]
        baseline = rule == "mean"  # the no-defence reference: a star drawn on top
        ax.plot([100 * r.no_attack for r in pts], [100 * (r.worst or 0) for r in pts],
                marker="*" if baseline else "o", markersize=14 if baseline else 6, zorder=5 if baseline else 2,
                linestyle="-" if len(pts) > 1 else "none", color="k" if baseline else colours[rule],
                label="mean (no defence)" if baseline else rule)
        for r in pts:
            if r.no_attack_ci is not None and r.worst_ci is not None:
                ax.errorbar([100 * r.no_attack], [100 * (r.worst or 0)], xerr=[100 * r.no_attack_ci.half_width],
                            yerr=[100 * r.worst_ci.half_width], fmt="none", ecolor="k" if baseline else colours[rule],
                            alpha=0.5, capsize=2)
    for x, y, text in point_labels(rows):
        ax.annotate(text, (x, y), fontsize=7, textcoords="offset points", xytext=(4, 3))
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
