"""Corrupted rounds, as a preset: an attack that succeeds only now and then, and a second line of defence after
aggregation — server SGD against the corruption-robust online learner (``server_optimizer = "robust-online"``),
each behind the mean and behind a robust rule; and what that second line costs when nobody attacks.

The question. Zhang & Cutkosky ("Unconstrained robust online convex optimization", ICML 2025; docs/online.md) give
an online learner whose regret stays Õ(‖u‖G(√T + k)) when k of the T gradients it receives are corrupted. As the
server optimizer its "gradient" is the round's aggregate, which is corrupted exactly in the rounds where the rule is
fooled. Here the Byzantine workers run ``attack`` (default: sign flipping scaled by 100) only in k of the T rounds
(``intermittent``: every ``every``-th round from ``start``), which fools the mean in exactly those rounds; the robust
learner is told that k (``corruptions``) and the gradient bound ``gradient_bound``; its scale ε is ``online_scale``.

Grid: rule ∈ ``rules`` (the mean with f = 0 and robust rules with f = ``f``) × server optimizer ∈ {sgd,
robust-online} × attack ∈ {none, intermittent} × seeds; distributed SGD with worker momentum. Per cell: the final
test accuracy, mean and 95 % Student-t interval over the seeds. Paired by seed (same seed = same split, initial
model and batches): what the robust learner buys under attack (robust-online − sgd, behind each rule), what it costs
without attack (sgd − robust-online), and the first line of defence for comparison (robust rule − mean, with SGD).
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
from phalanx.experiments import runstate
from phalanx.experiments.config import RunConfig, make_config
from phalanx.experiments.plots import save_figure
from phalanx.studies.base import ModuleStudy, Report, StudyFunctions
from phalanx.studies.registry import register
from phalanx.studies.reporting import pick_preset, provenance, write_report_files

MEAN = "mean"
SGD = "sgd"
ONLINE = "robust-online"
OPTIMIZERS = (SGD, ONLINE)


@dataclass(frozen=True)
class Preset:
    """One setting of the experiment."""

    name: str
    description: str
    dataset: str
    model: str = "mlp"
    model_params: dict[str, Any] = field(default_factory=lambda: {"hidden": [32]})
    workers: int = 20
    byzantine: int = 3
    f: int = 3
    attack: str = "signflip"
    attack_params: dict[str, Any] = field(default_factory=lambda: {"scale": 100.0})
    every: int = 15
    start: int = 7
    rules: tuple[str, ...] = (MEAN, "cwtm")
    rounds: int = 150
    batch_size: int = 32
    lr: float = 0.3
    momentum: float = 0.9
    online_scale: float = 10.0
    gradient_bound: float = 0.3
    corruptions: int | None = None
    """The budget the robust learner is told (None: k, the rounds actually attacked)."""
    eval_every: int = 10
    partition: str = "iid"
    alpha: float = 1.0
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    fallback_dataset: str | None = None


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        name="quick", description="CPU-sized: an MLP on the built-in digits, n = 20 workers, 3 attackers sending "
        "100× the flipped mean in 10 of 150 rounds (every 15th from round 7)", dataset="digits",
    ),
    "full": Preset(
        name="full", description="an MLP on Fashion-MNIST (digits when absent), n = 30, 5 attackers sending 100× the "
        "flipped mean in 20 of 500 rounds; the mean, cwtm and cwmed", dataset="fashion-mnist",
        fallback_dataset="digits", model_params={"hidden": [64]}, workers=30, byzantine=5, f=5, every=25, start=12,
        rules=(MEAN, "cwtm", "cwmed"), rounds=500, eval_every=25,
    ),
}


def attack_params(p: Preset) -> dict[str, Any]:
    """The run's ``attack_params`` for the ``intermittent`` attack (docs/attacks.md): the preset's attack, active one
    round in every ``every`` from ``start``."""
    return {"attack": p.attack, "params": dict(p.attack_params), "every": p.every, "start": p.start, "length": 1}


def active(p: Preset, t: int) -> bool:
    """Whether round ``t`` is attacked: ``intermittent``'s rule (``Intermittent.active``) for this preset."""
    return t >= p.start and (t - p.start) % p.every == 0


def corrupted(p: Preset) -> int:
    """k: how many of the preset's rounds are attacked."""
    return sum(active(p, t) for t in range(p.rounds))


def budget(p: Preset) -> int:
    """The budget the robust learner is told: ``corruptions``, by default k (:func:`corrupted`)."""
    return corrupted(p) if p.corruptions is None else p.corruptions


def preset(name: str, **changes: Any) -> Preset:
    """A preset by name with fields replaced, checked: the mean and a robust rule among the rules, f at least the
    attackers, an attack active in at least one round, a positive gradient bound and scale."""
    p = pick_preset(PRESETS, name, changes, ("rules", "seeds"))
    if MEAN not in p.rules or len(p.rules) < 2:
        raise ConfigError("rules", list(p.rules), "the mean and at least one robust rule")
    if p.f < p.byzantine:
        raise ConfigError("f", p.f, f">= byzantine = {p.byzantine}")
    if not (isinstance(p.gradient_bound, int | float) and math.isfinite(p.gradient_bound) and p.gradient_bound > 0):
        raise ConfigError("gradient_bound", p.gradient_bound, "a finite number > 0 (the robust learner's G)")
    if not (isinstance(p.online_scale, int | float) and math.isfinite(p.online_scale) and p.online_scale > 0):
        raise ConfigError("online_scale", p.online_scale, "a finite number > 0 (the robust learner's scale ε)")
    for key, low in (("every", 1), ("start", 0)):
        value = getattr(p, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(key, value, f"an integer >= {low}")
    if p.corruptions is not None and (isinstance(p.corruptions, bool) or not isinstance(p.corruptions, int)
                                      or p.corruptions < 0):
        raise ConfigError("corruptions", p.corruptions, "an integer >= 0 (the robust learner's budget k)")
    if corrupted(p) == 0:
        raise ConfigError("start", p.start, f"< rounds = {p.rounds} (the attack is active in no round)")
    return p


@dataclass(frozen=True)
class Cell:
    """One run: a rule, a server optimizer, attacked or not, a seed."""

    rule: str
    optimizer: str
    attacked: bool
    seed: int


def cells(p: Preset) -> list[Cell]:
    """Every run of the grid."""
    return [Cell(r, o, a, s) for r in p.rules for o in OPTIMIZERS for a in (False, True) for s in p.seeds]


def config_for(p: Preset, cell: Cell, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The validated run configuration of one cell (the mean with f = 0; the robust learner told k and G, its lr
    the scale ε)."""
    data: dict[str, Any] = {
        "dataset": p.dataset, "model": p.model, "model_params": dict(p.model_params), "workers": p.workers,
        "aggregator": cell.rule, "f": 0 if cell.rule == MEAN else p.f,
        "attack": "intermittent" if cell.attacked else "none", "byzantine": p.byzantine if cell.attacked else 0,
        "rounds": p.rounds, "eval_every": p.eval_every, "checkpoint_every": p.rounds, "batch_size": p.batch_size,
        "lr": p.lr, "momentum": p.momentum, "partition": p.partition, "alpha": p.alpha, "seed": cell.seed,
    }
    if cell.attacked:
        data["attack_params"] = attack_params(p)
    if cell.optimizer == ONLINE:
        data.update({"server_optimizer": ONLINE, "lr": p.online_scale, "server_optimizer_params": {
            "corruptions": budget(p), "gradient_bound": float(p.gradient_bound)}})
    data.update(overrides or {})
    return make_config(data)


def plan(p: Preset, overrides: dict[str, Any] | None = None) -> tuple[list[Cell], list[RunConfig]]:
    """The cells and their configurations."""
    cs = cells(p)
    return cs, [config_for(p, c, overrides) for c in cs]


@dataclass(frozen=True)
class Final:
    """What one ended run ended with: the final test accuracy and the accuracy at every evaluated round (a diverged
    run: as far as its rows go, its final accuracy that of chance as its last row says)."""

    accuracy: float
    curve: tuple[tuple[int, float], ...]


def collect(cs: list[Cell], cfgs: list[RunConfig], runs_dir: Path) -> dict[Cell, Final]:
    """The rows of every cell's ended run under ``runs_dir``."""
    from phalanx.experiments import grid

    out = {}
    for c, cfg in zip(cs, cfgs):
        rows = [r for r in runstate.final_rows(runs_dir / grid.run_id(cfg)) if "test_accuracy" in r]
        curve = tuple((int(r["round"]), float(r["test_accuracy"])) for r in rows)
        out[c] = Final(curve[-1][1], curve)
    return out


Arm = tuple[str, str]  # (rule, optimizer)
Key = tuple[str, str, bool]  # (rule, optimizer, attacked)


def tabulate(finals: dict[Cell, Final]) -> dict[Key, dict[int, float]]:
    """Per (rule, optimizer, attacked): the final accuracy of each seed."""
    out: dict[Key, dict[int, float]] = {}
    for c, fin in finals.items():
        out.setdefault((c.rule, c.optimizer, c.attacked), {})[c.seed] = fin.accuracy
    return out


def estimates(table: dict[Key, dict[int, float]]) -> dict[Key, Estimate]:
    """Mean and 95 % interval over the seeds of every (rule, optimizer, attacked)."""
    return {k: mean_ci(list(v.values())) for k, v in table.items()}


def _paired(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


@dataclass(frozen=True)
class Comparison:
    """One paired difference of final accuracy, ``a − b`` over the seeds: what it compares and its estimate."""

    question: str
    a: Key
    b: Key
    diff: Estimate

    @property
    def verdict(self) -> str:
        return self.diff.side("b is better", "a is better")  # a: with the defence, b: without


def _arm(key: Key) -> str:
    rule, opt, attacked = key
    return f"{rule} + {opt}" + (" (attacked)" if attacked else " (no attack)")


def comparisons(table: dict[Key, dict[int, float]], p: Preset) -> list[Comparison]:
    """The paired differences the study asks about, each a = with a defence − b = without it (positive: the defence
    helps; negative without attack: its price): the second line (robust-online − sgd behind each rule) and the first
    (robust rule − mean, with SGD), with and without the attack; and, attacked, the learner alone (the mean) against
    a robust rule alone (SGD)."""
    pairs: list[tuple[str, Key, Key]] = []
    for attacked in (True, False):
        when = "attacked" if attacked else "no attack: the price"
        for rule in p.rules:
            pairs.append((f"second line, {when}", (rule, ONLINE, attacked), (rule, SGD, attacked)))
        for rule in p.rules:
            if rule != MEAN:
                pairs.append((f"first line, {when}", (rule, SGD, attacked), (MEAN, SGD, attacked)))
        if attacked:
            for rule in p.rules:
                if rule != MEAN:
                    pairs.append(("learner alone vs rule alone, attacked", (MEAN, ONLINE, True), (rule, SGD, True)))
    out = []
    for q, a, b in pairs:
        d = _paired(table.get(a, {}), table.get(b, {}))
        if d:
            out.append(Comparison(q, a, b, mean_ci(list(d.values()))))
    return out


def accuracy_markdown(est: dict[Key, Estimate], p: Preset) -> str:
    """Rows: (rule, server optimizer); columns: no attack, attacked; cells: final test accuracy % mean ± half-width."""
    k = corrupted(p)
    lines = [f"| rule | server optimizer | no attack | {p.attack} in {k} of {p.rounds} rounds (b = {p.byzantine}) |",
             "|---|---|---|---|"]
    for rule in p.rules:
        for opt in OPTIMIZERS:
            row = [est.get((rule, opt, a)) for a in (False, True)]
            lines.append(f"| {rule} | {opt} | " + " | ".join("—" if e is None else e.show(100, 1) for e in row) + " |")
    return "\n".join(lines)


def comparisons_markdown(cs: list[Comparison]) -> str:
    """One line per paired difference: a − b in points, its interval, which is better."""
    lines = ["| question | a | b | a − b (points) | 95 % interval | verdict |", "|---|---|---|---|---|---|"]
    for c in cs:
        lines.append(f"| {c.question} | {_arm(c.a)} | {_arm(c.b)} | {100 * c.diff.mean:+.1f} | "
                     f"{c.diff.interval(100, 1)} | {c.verdict} |")
    return "\n".join(lines)


def readout(cs: list[Comparison], p: Preset) -> str:
    """One paragraph: what the second line of defence buys and costs, as the paired intervals say."""
    if not cs:
        return "Nothing to compare."
    seeds = f"{len(p.seeds)} seeds" + ("" if len(p.seeds) >= MIN_SEEDS else f" (fewer than {MIN_SEEDS}: no verdicts)")
    parts = []
    for c in cs:
        if c.question.startswith("second line"):
            parts.append(f"{c.question.removeprefix('second line, ')}, behind {c.a[0]}: "
                         f"{100 * c.diff.mean:+.1f} points {c.diff.interval(100, 1)} ({c.verdict})")
    return (f"The robust online learner (told k = {budget(p)}, G = {p.gradient_bound:g}, ε = {p.online_scale:g}) "
            "minus server SGD, final accuracy paired by seed — "
            + "; ".join(parts) + f". {seeds}.")


def cells_csv(table: dict[Key, dict[int, float]]) -> str:
    """Every (rule, optimizer, attacked): the accuracy estimate and the per-seed values."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["rule", "optimizer", "attacked", "accuracy_mean", "accuracy_low", "accuracy_high",
                "per_seed_accuracy"])
    for (rule, opt, attacked), seeds in sorted(table.items()):
        e = mean_ci(list(seeds.values()))
        w.writerow([rule, opt, attacked, f"{e.mean:.6f}", f"{e.low:.6f}", f"{e.high:.6f}",
                    " ".join(f"{s}:{a:.6f}" for s, a in sorted(seeds.items()))])
    return buf.getvalue()


def _curves(finals: dict[Cell, Final], key: Key) -> list[tuple[int, Estimate]]:
    runs = [f.curve for c, f in finals.items() if (c.rule, c.optimizer, c.attacked) == key]
    if not runs:
        return []
    rounds = sorted(set.intersection(*[{r for r, _ in curve} for curve in runs]))
    by = [dict(curve) for curve in runs]
    return [(r, mean_ci([b[r] for b in by])) for r in rounds]


def plot(finals: dict[Cell, Final], est: dict[Key, Estimate], p: Preset, path: Path) -> Path:
    """Three panels: final accuracy of every arm without and with the attack (95 % intervals), and the accuracy
    against the round under attack (mean over the seeds, the attacked rounds marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms: list[Arm] = [(r, o) for r in p.rules for o in OPTIMIZERS]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4), gridspec_kw={"width_ratios": [1, 1, 1.4]})
    k = corrupted(p)
    for ax, attacked in zip(axes[:2], (False, True)):
        for i, (rule, opt) in enumerate(arms):
            e = est.get((rule, opt, attacked))
            if e is None:
                continue
            err = 100 * e.half_width if math.isfinite(e.half_width) else 0.0
            ax.bar(i, 100 * e.mean, yerr=err, capsize=4, color=f"C{i}", label=f"{rule} + {opt}")
        ax.set_xticks(range(len(arms)), [f"{r}\n{o}" for r, o in arms], fontsize=8)
        ax.set_title(f"{p.attack} in {k} of {p.rounds} rounds" if attacked else "no attack")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("final test accuracy %")
    ax = axes[2]
    for t in range(p.rounds):
        if active(p, t):
            ax.axvline(t, color="r", alpha=0.15, lw=2)
    for i, (rule, opt) in enumerate(arms):
        pts = _curves(finals, (rule, opt, True))
        if not pts:
            continue
        xs, means = [r for r, _ in pts], [100 * e.mean for _, e in pts]
        lo = [100 * (e.low if math.isfinite(e.low) else e.mean) for _, e in pts]
        hi = [100 * (e.high if math.isfinite(e.high) else e.mean) for _, e in pts]
        ax.plot(xs, means, marker="o", ms=3, color=f"C{i}", label=f"{rule} + {opt}")
        ax.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.15)
    ax.set_xlabel("round (red: attacked rounds)")
    ax.set_ylabel("test accuracy %")
    ax.set_title("under attack, by round")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{p.model} on {p.dataset}, n = {p.workers}, b = {p.byzantine}; robust-online: told k = {budget(p)}, "
                 f"G = {p.gradient_bound:g}, ε = {p.online_scale:g}; SGD lr {p.lr:g}; {len(p.seeds)} seeds "
                 "(95 % intervals)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def report_markdown(
    est: dict[Key, Estimate], cs: list[Comparison], p: Preset, *, command: str, wall_seconds: float | None,
    runs: int,
) -> str:
    """The whole report: setup, the accuracy table, the paired comparisons, the readout."""
    k = corrupted(p)
    parts = [
        f"# Corrupted rounds: a second line of defence after aggregation — preset `{p.name}`", "",
        *provenance(command, wall_seconds, runs), "",
        f"Setup: {p.model} {p.model_params} on {p.dataset}, {p.partition} split, n = {p.workers} workers, "
        f"distributed SGD (batch {p.batch_size}, worker momentum {p.momentum:g}), {p.rounds} rounds. Attack: "
        f"b = {p.byzantine} workers run {p.attack} {p.attack_params} in k = {k} of the {p.rounds} rounds "
        f"(`intermittent`, every {p.every}th round from round {p.start}) and replay honest rows in the others. "
        f"Rules: the mean with f = 0, robust rules with f = {p.f}. Server optimizers: SGD with lr {p.lr:g}; "
        f"robust-online (Zhang & Cutkosky, ICML 2025; docs/online.md) with corruptions = {budget(p)}, gradient_bound = "
        f"{p.gradient_bound:g} and scale ε = lr = {p.online_scale:g} — told k in the unattacked runs too. "
        "(The quick preset's SGD lr and robust-online's G and ε are the best of a small sweep each, on seed 100 "
        "without attack, which is not among the seeds reported: docs/online.md.) "
        f"Seeds {list(p.seeds)}. Cells: final test accuracy %, mean ± 95 % Student-t half-width over the seeds.", "",
        "## Final test accuracy %", "", accuracy_markdown(est, p), "",
        "## Paired by seed (a − b, points)", "", comparisons_markdown(cs), "",
        "## Readout", "", readout(cs, p), "",
    ]
    return "\n".join(parts)


@register
class CorruptedRounds(ModuleStudy[Preset, Cell, Final]):
    """Corrupted rounds (the module's docstring): ``phalanx experiment corrupted-rounds``."""

    name = "corrupted-rounds"
    help = ("An attack that succeeds only now and then (active in k of T rounds) and a second line of defence after "
            "aggregation: server SGD vs the corruption-robust online learner (robust-online; Zhang & Cutkosky, ICML "
            "2025), each behind the mean and robust rules, with and without the attack — what the learner buys and "
            "what it costs. Tables with intervals, paired differences, plot.")
    preset_type = Preset
    presets = PRESETS
    out = "runs/corrupted-rounds-quick"
    preset_help = "quick (digits, CPU, minutes) or full (Fashion-MNIST)."
    set_example = "every=10"

    functions = StudyFunctions(preset, plan, collect)

    def report(
        self, p: Preset, cells: list[Cell], collected: dict[Cell, Final], out: Path, *, command: str,
        wall_seconds: float | None, runs: int, overrides: dict[str, Any],
    ) -> Report:
        table = tabulate(collected)
        est = estimates(table)
        cs = comparisons(table, p)
        text = report_markdown(est, cs, p, command=command, wall_seconds=wall_seconds, runs=runs)
        files = write_report_files(out, text, cells_csv(table), "corrupted-rounds.png",
                                   "accuracy with and without corrupted rounds", lambda path: plot(collected, est, p,
                                                                                                   path))
        return Report(files, [accuracy_markdown(est, p) + "\n\n" + comparisons_markdown(cs) + "\n\n" + readout(cs, p)])
