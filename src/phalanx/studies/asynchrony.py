"""Asynchrony as a preset: simulated wall-clock time to a target accuracy, synchronous rounds against buffered
asynchronous aggregation, with stragglers and attackers, per robust rule — ``phalanx experiment async``.

The question. A synchronous round waits for its slowest worker; with heavy-tailed device speeds (stragglers) most of
its wall-clock time is waiting. FedBuff (Nguyen et al., AISTATS 2022, Alg. 1) and BASGD (Yang & Li, ICML 2021,
Alg. 1) step whenever a buffer is full, on stale updates. Where does asynchrony pay — less simulated time to a
target accuracy — and what does robustness (a robust rule in place of the mean) cost there, with and without
attackers?

The modes, on one population of n workers whose speeds vᵢ are drawn once per seed from ``speeds`` (the same draw
for every mode: :meth:`phalanx.training.algorithms.clock.Speeds.draw` from the run's seed; an update takes 1/vᵢ):

* ``sync`` — federated averaging (``algorithm = "fedavg"``) with ``clients_per_round = K`` sampled workers and one
  local step: round r waits for its slowest sampled worker, so it lasts maxᵢ∈Sᵣ 1/vᵢ and the simulated time after
  round r is the sum of those (:func:`sync_times`, which replays the run's own ``clients`` stream: the sampled sets
  are the run's, ``tests/test_async_study.py``). Under the always-first time attack the Byzantine workers take no time,
  so the round waits for its slowest sampled *honest* worker (a synchronous round has no arrival order to exploit);
  the run itself is the vector attack's.
* ``fedbuff`` — ``algorithm = "fedbuff"`` with ``buffer_size = K``;
* ``basgd`` — ``algorithm = "basgd"`` with ``buffers = K``;

the asynchronous ones on the simulated clock of :mod:`phalanx.training.algorithms.clock` (its ``sim_time`` column).
Every mode aggregates K vectors per step with the same rule and f, and the same server step size ``lr`` (FedAvg with
one local step and ``server_lr = 1`` steps θ − lr·Agg(g), FedBuff θ − lr·Agg(w(s)·g)).

Attacks: ``none``; ``vector`` — ``attack`` (a vector attack) by the last ``byzantine`` workers at their drawn speeds;
``always_first`` — the same attack with ``byzantine_timing = "always_first"`` (docs/async.md, the threat model of
time). Rules: the mean with f = 0, robust rules with f = ``f``.

Measured per run: the simulated time at which the test accuracy first reaches ``target`` (evaluated every
``eval_every`` steps: a measured upper bound of the first crossing, to within one evaluation interval; a run that
never reaches it is *censored*) and the accuracy at the simulated time ``horizon`` (the last evaluation at or
before it). The target and the horizon are fields of the preset, fixed before any run of the study (each preset
says how). Verdicts, one Holm family (:func:`phalanx.studies.reporting.holm_family`): *asynchrony pays* — sync −
async time to target, paired by seed, per asynchronous mode, rule and attack; *the price of robustness* — rule −
mean time to target without attack, per mode. A pair with a censored seed decides nothing (said so), nor does one
with fewer than 3 seeds.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.analysis.stats import MIN_SEEDS, Estimate, mean_ci
from phalanx.errors import ConfigError
from phalanx.experiments.config import RunConfig
from phalanx.experiments.plots import save_figure
from phalanx.experiments.stragglers import sync_times
from phalanx.experiments.validrun import ValidRun
from phalanx.studies import raw
from phalanx.studies.base import distinct
from phalanx.studies.registry import register
from phalanx.studies.reporting import family_note, holm_family, holm_p, pick_preset, provenance
from phalanx.studies.template import Document, GridFunctions, GridStudy

MEAN = "mean"
MODES = ("sync", "fedbuff", "basgd")
ASYNC = ("fedbuff", "basgd")
ATTACKS = ("none", "vector", "always_first")


@dataclass(frozen=True)
class Preset:
    """One setting of the study (the module's docstring)."""

    name: str
    description: str
    dataset: str
    target: float
    """The test accuracy to reach, fixed before any run (the preset's description says how)."""
    horizon: float
    """The simulated time at which the accuracies are compared, fixed before any run."""
    model: str = "logreg"
    workers: int = 20
    per_step: int = 7
    """K: sync's sampled workers per round, FedBuff's buffer size, BASGD's buffers."""
    byzantine: int = 2
    f: int = 2
    attack: str = "signflip"
    attack_scale: float = 10.0
    rules: tuple[str, ...] = (MEAN, "cwtm", "cwmed")
    speeds: str = "lognormal(1.0)"
    max_staleness: int = 4
    sync_rounds: int = 60
    async_steps: int = 500
    sync_eval_every: int = 2
    async_eval_every: int = 10
    batch_size: int = 32
    lr: float = 0.5
    partition: str = "iid"
    seeds: tuple[int, ...] = (0, 1, 2)
    fallback_dataset: str | None = None


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        name="quick", description="CPU-sized: logistic regression on the built-in digits, n = 20 workers with "
        "log-normal speeds (σ = 1), K = 7 (so that cwtm with f = 2 is not the median), 2 sign-flipping attackers "
        "(×10), the mean, cwtm and cwmed; target 80 % test accuracy and horizon 60 simulated time units, both fixed "
        "before any run (80 %: between chance, 10 %, and the 94.7 % of the documented default run on digits; 60: "
        "about 15 synchronous rounds at the expected straggler delay, the largest of 7 draws of σ = 1, ≈ e^1.35)",
        dataset="digits", target=0.80, horizon=60.0,
    ),
    "full": Preset(
        name="full", description="a larger population: logistic regression on digits, n = 100 workers, K = 10, "
        "4 sign-flipping attackers (×10), f = 4, 5 seeds; the quick preset's target and horizon (80 %; 60 time "
        "units), fixed before any run", dataset="digits", target=0.80, horizon=60.0, workers=100, per_step=10,
        byzantine=4, f=4, sync_rounds=60, async_steps=2400, async_eval_every=40, seeds=(0, 1, 2, 3, 4),
    ),
}


def preset(name: str, **changes: Any) -> Preset:
    """A preset by name with fields replaced, checked: the mean among at least two rules, 0 < target ≤ 1, a horizon
    > 0, f at least the attackers, 2f < K ≤ workers (the rules' buffers), positive step counts."""
    p = pick_preset(PRESETS, name, changes, ("rules", "seeds"))
    if MEAN not in p.rules or len(p.rules) < 2:
        raise ConfigError("rules", list(p.rules), "the mean and at least one robust rule")
    if not (isinstance(p.target, int | float) and 0 < p.target <= 1):
        raise ConfigError("target", p.target, "a test accuracy in (0, 1]")
    if not (isinstance(p.horizon, int | float) and math.isfinite(p.horizon) and p.horizon > 0):
        raise ConfigError("horizon", p.horizon, "a simulated time > 0")
    if p.f < p.byzantine:
        raise ConfigError("f", p.f, f">= byzantine = {p.byzantine}")
    if not 2 * p.f < p.per_step <= p.workers:
        raise ConfigError("per_step", p.per_step, f"2f < K <= workers ({2 * p.f} < K <= {p.workers})")
    for key in ("sync_rounds", "async_steps", "sync_eval_every", "async_eval_every"):
        if not (isinstance(getattr(p, key), int) and getattr(p, key) >= 1):
            raise ConfigError(key, getattr(p, key), "an integer >= 1")
    return p


@dataclass(frozen=True)
class Cell:
    """One run: a mode, a rule, an attack and a seed."""

    mode: str
    rule: str
    attack: str
    seed: int


def cells(p: Preset) -> list[Cell]:
    """Every cell of the grid (sync's always-first cell shares the vector attack's run, timed without its attackers)."""
    return [Cell(m, r, a, s) for m in MODES for r in p.rules for a in ATTACKS for s in p.seeds]


def keys(p: Preset, cell: Cell) -> dict[str, Any]:
    """The run keys of one cell (the mean with f = 0; constant step size)."""
    attacked = cell.attack != "none"
    data: dict[str, Any] = {
        "dataset": p.dataset, "model": p.model, "workers": p.workers, "aggregator": cell.rule,
        "f": 0 if cell.rule == MEAN else p.f, "byzantine": p.byzantine if attacked else 0,
        "attack": p.attack if attacked else "none", "batch_size": p.batch_size, "lr": p.lr, "schedule": "constant",
        "partition": p.partition, "seed": cell.seed,
    }
    if attacked and p.attack_scale != 1.0:
        data["attack_params"] = {"scale": p.attack_scale}
    if cell.mode == "sync":
        data.update(algorithm="fedavg", clients_per_round=p.per_step, local_steps=1, server_lr=1.0,
                    rounds=p.sync_rounds, eval_every=p.sync_eval_every)
    else:
        params: dict[str, Any] = {"max_staleness": p.max_staleness, "speeds": p.speeds, "batch_size": p.batch_size,
                                  "byzantine_timing": "always_first" if cell.attack == "always_first" else "honest"}
        params["buffer_size" if cell.mode == "fedbuff" else "buffers"] = p.per_step
        data.update(algorithm=cell.mode, algorithm_params=params, rounds=p.async_steps, eval_every=p.async_eval_every)
    data["checkpoint_every"] = data["rounds"]
    return data


@dataclass(frozen=True)
class Curve:
    """What one run ended with: its evaluations as (simulated time, test accuracy), in order."""

    points: tuple[tuple[float, float], ...] = field(metadata=raw.FINITE)

    def time_to(self, target: float) -> float:
        """The simulated time of the first evaluation at or above ``target`` (∞: never, censored)."""
        return next((t for t, a in self.points if a >= target), math.inf)

    def accuracy_at(self, horizon: float) -> float | None:
        """The accuracy of the last evaluation at or before ``horizon`` (None: the run ended before reaching it)."""
        if not self.points or self.points[-1][0] < horizon:
            return None
        before = [a for t, a in self.points if t <= horizon]
        return before[-1] if before else None


def curve(rows: list[dict[str, Any]], cell: Cell, cfg: RunConfig, speeds: str) -> Curve:
    """A run's evaluation rows as a :class:`Curve`: the asynchronous clock's ``sim_time``, or for ``sync`` the
    replayed straggler times (:func:`sync_times` with the study's ``speeds``) after the row's round (a row's
    ``round`` counts the rounds done; round 0 is time 0)."""
    evaluated = [r for r in rows if r.get("test_accuracy") is not None]
    if cell.mode != "sync":
        return Curve(tuple((float(r["sim_time"] or 0.0), float(r["test_accuracy"])) for r in evaluated))
    instant = cfg.byzantine if cell.attack == "always_first" else 0
    times = sync_times(speeds, cfg.workers, int(cfg.clients_per_round or cfg.workers), int(cfg.rounds), cell.seed,
                       instant)
    at = [0.0, *times]
    return Curve(tuple((at[min(int(r["round"]), len(times))], float(r["test_accuracy"])) for r in evaluated))


def speeds_of(runs: list[ValidRun]) -> str:
    """The speed distribution the asynchronous cells' runs name (one per study: the same population), with which
    the sync cells are timed."""
    named = {str(r.cfg.algorithm_params["speeds"]) for r in runs if r.cfg.algorithm in ASYNC}
    if len(named) != 1:
        raise ConfigError("speeds", sorted(named), "one speed distribution for every asynchronous cell")
    return named.pop()


Key = tuple[str, str, str]
"""(mode, rule, attack)."""


def tabulate(curves: dict[Cell, Curve], p: Preset) -> tuple[dict[Key, dict[int, float]], dict[Key, dict[int, float]]]:
    """Per (mode, rule, attack): each seed's time to target (∞: censored) and accuracy at the horizon (seeds whose
    run ended before it are left out)."""
    times: dict[Key, dict[int, float]] = {}
    accs: dict[Key, dict[int, float]] = {}
    for c, cv in curves.items():
        key = (c.mode, c.rule, c.attack)
        times.setdefault(key, {})[c.seed] = cv.time_to(p.target)
        acc = cv.accuracy_at(p.horizon)
        accs.setdefault(key, {})
        if acc is not None:
            accs[key][c.seed] = acc
    return times, accs


@dataclass(frozen=True)
class Comparison:
    """One verdict: ``what`` (``"asynchrony pays"``: sync − mode; ``"price of robustness"``: rule − mean), its
    mode, rule and attack, the paired differences' estimate (None: a censored seed), and the censored seeds."""

    what: str
    mode: str
    rule: str
    attack: str
    estimate: Estimate | None
    censored: tuple[int, ...]


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[list[float], tuple[int, ...]]:
    seeds = sorted(set(a) & set(b))
    censored = tuple(s for s in seeds if not (math.isfinite(a[s]) and math.isfinite(b[s])))
    return [a[s] - b[s] for s in seeds if s not in censored], censored


def comparisons(times: dict[Key, dict[int, float]], p: Preset) -> list[Comparison]:
    """Every verdict of the report, Holm-corrected as one family: sync − async time to target per asynchronous mode,
    rule and attack; rule − mean time to target without attack per mode and robust rule (paired by seed)."""
    out = []
    for mode in ASYNC:
        for rule in p.rules:
            for attack in ATTACKS:
                d, cens = _paired(times.get(("sync", rule, attack), {}), times.get((mode, rule, attack), {}))
                out.append(Comparison("asynchrony pays", mode, rule, attack, None if cens or not d else mean_ci(d),
                                      cens))
    for mode in MODES:
        for rule in p.rules:
            if rule == MEAN:
                continue
            d, cens = _paired(times.get((mode, rule, "none"), {}), times.get((mode, MEAN, "none"), {}))
            out.append(Comparison("price of robustness", mode, rule, "none", None if cens or not d else mean_ci(d),
                                  cens))
    return holm_family(out)


def verdict(c: Comparison) -> str:
    """What the comparison shows: for asynchrony, *async sooner* / *sync sooner*; for the price, *rule slower* /
    *rule faster*; or why it decides nothing."""
    if c.estimate is None:
        seeds = f"seed{'s' if len(c.censored) > 1 else ''} {', '.join(map(str, c.censored))}"
        return f"no verdict (a run of {seeds} did not reach the target)" if c.censored else "no verdict (no runs)"
    if c.what == "asynchrony pays":
        return c.estimate.side("sync sooner", "async sooner")
    return c.estimate.side("rule sooner", "rule slower")


def _time_cell(seeds: dict[int, float]) -> str:
    reached = [t for t in seeds.values() if math.isfinite(t)]
    if len(reached) < len(seeds):
        return f"{len(reached)}/{len(seeds)} reached" + (f" (≤ {max(reached):.1f})" if reached else "")
    return mean_ci(reached).show(1, 1)


def _label(attack: str, p: Preset) -> str:
    return {"none": "none", "vector": f"{p.attack} ×{p.attack_scale:g} (b = {p.byzantine})",
            "always_first": f"{p.attack} always first"}[attack]


def time_markdown(times: dict[Key, dict[int, float]], p: Preset) -> str:
    """Rows: (mode, rule); columns: attacks; cells: simulated time to the target, mean ± 95 % half-width, or how many
    seeds reached it."""
    lines = ["| mode | rule | " + " | ".join(_label(a, p) for a in ATTACKS) + " |", "|" + "---|" * (2 + len(ATTACKS))]
    for mode in MODES:
        for rule in p.rules:
            lines.append(f"| {mode} | {rule} | " + " | ".join(_time_cell(times.get((mode, rule, a), {}))
                                                            for a in ATTACKS) + " |")
    return "\n".join(lines)


def accuracy_markdown(accs: dict[Key, dict[int, float]], p: Preset) -> str:
    """Rows: (mode, rule); columns: attacks; cells: test accuracy % at the horizon, mean ± 95 % half-width."""
    lines = ["| mode | rule | " + " | ".join(_label(a, p) for a in ATTACKS) + " |", "|" + "---|" * (2 + len(ATTACKS))]
    for mode in MODES:
        for rule in p.rules:
            row = []
            for a in ATTACKS:
                v = accs.get((mode, rule, a), {})
                row.append(mean_ci(list(v.values())).show(100, 1) if v else "— (ended before the horizon)")
            lines.append(f"| {mode} | {rule} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def verdicts_markdown(cs: list[Comparison]) -> str:
    """One line per comparison: the paired difference of the time to target, its interval, Holm p, the verdict."""
    lines = ["| comparison | mode | rule | attack | difference (time units) | 95 % interval | Holm p | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cs:
        e = c.estimate
        what = "sync − async" if c.what == "asynchrony pays" else "rule − mean"
        lines.append(f"| {what} | {c.mode} | {c.rule} | {c.attack} | {'—' if e is None else f'{e.mean:+.1f}'} | "
                     f"{'—' if e is None else e.interval(1, 1)} | {holm_p(e)} | {verdict(c)} |")
    return "\n".join(lines) + "\n\n" + family_note(c.estimate for c in cs)


def readout(cs: list[Comparison], p: Preset) -> str:
    """One paragraph: how many comparisons show each side, and how many decide nothing."""
    if len(p.seeds) < MIN_SEEDS:
        return f"{len(p.seeds)} seeds: fewer than {MIN_SEEDS}, no verdict is drawn."
    pays = [c for c in cs if c.what == "asynchrony pays"]
    price = [c for c in cs if c.what == "price of robustness"]
    count = {v: sum(verdict(c) == v for c in pays) for v in ("async sooner", "sync sooner")}
    cost = {v: sum(verdict(c) == v for c in price) for v in ("rule slower", "rule sooner")}
    return (f"Asynchrony reached {p.target:.0%} test accuracy in less simulated time than the straggler-bound "
            f"synchronous round in {count['async sooner']} of {len(pays)} (mode, rule, attack) comparisons and in more "
            f"in {count['sync sooner']}; the rest show no difference or decide nothing (a censored seed). A robust "
            f"rule took more simulated time than the mean without attack in {cost['rule slower']} of {len(price)} "
            f"(mode, rule) comparisons and less in {cost['rule sooner']}; {len(p.seeds)} seeds.")


def runs_csv(curves: dict[Cell, Curve], p: Preset) -> str:
    """Every run: its cell, time to target (inf: censored), accuracy at the horizon, final simulated time and
    accuracy."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["mode", "rule", "attack", "seed", "time_to_target", "accuracy_at_horizon", "final_sim_time",
                "final_accuracy"])
    for c, cv in sorted(curves.items(), key=lambda kv: (MODES.index(kv[0].mode), kv[0].rule,
                                                         ATTACKS.index(kv[0].attack), kv[0].seed)):
        acc = cv.accuracy_at(p.horizon)
        last = cv.points[-1] if cv.points else (math.nan, math.nan)
        w.writerow([c.mode, c.rule, c.attack, c.seed, f"{cv.time_to(p.target):.4f}",
                    "" if acc is None else f"{acc:.4f}", f"{last[0]:.4f}", f"{last[1]:.4f}"])
    return buf.getvalue()


def plot(curves: dict[Cell, Curve], p: Preset, path: Path) -> Path:
    """Test accuracy vs simulated time, one panel per attack: a line per run, coloured by mode, styled by rule; the
    target and the horizon drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ATTACKS), figsize=(16, 4.4), sharey=True)
    styles = ("-", "--", ":", "-.")
    for ax, attack in zip(axes, ATTACKS):
        for c, cv in curves.items():
            if c.attack != attack or not cv.points:
                continue
            xs, ys = zip(*cv.points)
            label = f"{c.mode}, {c.rule}" if c.seed == p.seeds[0] else None
            ax.plot(xs, [100 * y for y in ys], color=f"C{MODES.index(c.mode)}",
                    ls=styles[p.rules.index(c.rule) % len(styles)], lw=0.9, alpha=0.7, label=label)
        ax.axhline(100 * p.target, color="k", lw=0.8)
        ax.axvline(p.horizon, color="grey", lw=0.8)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("simulated time")
        ax.set_title(_label(attack, p))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy %")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{p.model} on {p.dataset}, n = {p.workers}, K = {p.per_step}, speeds {p.speeds}, "
                 f"{len(p.seeds)} seeds (a line per run)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def report_markdown(times: dict[Key, dict[int, float]], accs: dict[Key, dict[int, float]], cs: list[Comparison],
                    p: Preset, *, command: str, wall_seconds: float | None, runs: int) -> str:
    """The whole report: setup, the two tables, the verdicts, the readout."""
    parts = [
        f"# Asynchrony, stragglers and robustness — preset `{p.name}`", "",
        *provenance(command, wall_seconds, runs, " distinct"), "",
        f"Setup: {p.model} on {p.dataset}, {p.partition} split, n = {p.workers} workers with speeds {p.speeds} "
        f"(drawn once per seed, the same for every mode); K = {p.per_step} vectors per step: sync = FedAvg with K "
        f"sampled workers and one local step, each round as long as its slowest sampled worker ({p.sync_rounds} "
        f"rounds); fedbuff = a buffer of K; basgd = K buffers ({p.async_steps} server steps, staleness bound "
        f"{p.max_staleness}); batch {p.batch_size}, step size {p.lr:g}. The mean with f = 0, robust rules with "
        f"f = {p.f}; attacks by the last {p.byzantine} workers. Target {p.target:.0%} test accuracy and horizon "
        f"{p.horizon:g} simulated time units, fixed before any run ({p.description}). Times are the first "
        "evaluation at or above the target (an upper bound of the crossing, within one evaluation interval); seeds "
        f"{list(p.seeds)}; cells: mean ± 95 % Student-t half-width over the seeds.", "",
        f"## Simulated time to {p.target:.0%} test accuracy", "", time_markdown(times, p), "",
        f"## Test accuracy % at simulated time {p.horizon:g}", "", accuracy_markdown(accs, p), "",
        "## Verdicts (paired by seed)", "", verdicts_markdown(cs), "",
        "## Readout", "", readout(cs, p), "",
    ]
    return "\n".join(parts)


@register
class Asynchrony(GridStudy[Preset, Cell, Curve]):
    """Asynchrony, stragglers and robustness (the module's docstring): ``phalanx experiment async``."""

    name = "async"
    help = ("Simulated wall-clock time to a target accuracy, synchronous FedAvg (each round waits for its slowest "
            "sampled worker) vs buffered asynchronous FedBuff and BASGD, with stragglers and attackers (none, a "
            "vector attack, always-first timing), per rule; accuracy at a fixed simulated time; Holm-corrected "
            "paired verdicts; plot.")
    preset_type = Preset
    presets = PRESETS
    out = "runs/async-quick"
    preset_help = "quick (digits, 20 workers, CPU, minutes) or full (100 workers, 5 seeds)."
    set_example = "rules=['mean','cwmed']"

    functions = GridFunctions(preset, cells, keys)
    raw_value = Curve

    def runs(self, configs: list[ValidRun]) -> list[ValidRun]:
        """The runs with the same run id once (sync's always-first cells share the vector attack's run)."""
        return distinct(configs)

    def collect(self, cells: list[Cell], configs: list[ValidRun], runs_dir: Path) -> dict[Cell, Curve]:
        """Every cell's curve from its ended run, the sync cells timed with :func:`speeds_of` the runs."""
        from phalanx.experiments import runstate

        speeds = speeds_of(configs)
        return {c: curve(runstate.final_rows(runs_dir / r.run_id), c, r.cfg, speeds) for c, r in zip(cells, configs)}

    def document(
        self, p: Preset, cells: list[Cell], collected: dict[Cell, Curve], *, command: str,
        wall_seconds: float | None, runs: int,
    ) -> Document:
        times, accs = tabulate(collected, p)
        cs = comparisons(times, p)
        return Document(report_markdown(times, accs, cs, p, command=command, wall_seconds=wall_seconds, runs=runs),
                        runs_csv(collected, p), "async.png", "test accuracy vs simulated time",
                        lambda path: plot(collected, p, path),
                        [time_markdown(times, p) + "\n\n" + verdicts_markdown(cs) + "\n\n" + readout(cs, p)])
