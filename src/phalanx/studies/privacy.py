"""Differential privacy next to robustness, as a preset: accuracy against the privacy budget ε of client-level DP,
with and without an attack, for the mean and robust rules — tables with intervals, the price of robustness as the
noise grows, paired differences, a plot, a report.

The question. Yang, Shi & Li (ICML 2025, Definition 2.2 and Theorem 3.1; docs/tension.md) show that a rule
tolerating f of n Byzantine workers is at best ε-accurate with ε ≥ f/(n − f), ‖Agg(x) − x̄‖² ≤ ε · (1/n) Σᵢ ‖xᵢ − x̄‖²:
what it costs when nobody attacks (the *price of robustness*) is ε times the honest vectors' spread, and gradient
descent with it stalls in a neighbourhood of size ~εG². Client-level DP at the worker (:mod:`phalanx.training.privacy`:
every honest update clipped to C, N(0, σ²C²·I) added by the worker) adds to that spread: d·σ²C² to each noised
gradient, and about d·σ²C²·(1 − β)/(1 + β) (≈ 0.05·d·σ²C² at worker momentum β = 0.9) to each momentum row
m ← βm + (1 − β)g̃ the rule receives after the first rounds (tests/test_privacy_noise.py): does the price grow with
σ, as the bound predicts?

Grid: noise multiplier σ ∈ ``noises`` (0 = no DP) × rule ∈ ``rules`` (the mean with f = 0, robust rules with
f = ``f``) × attack ∈ {none, ``attack`` with ``byzantine`` attackers} × seeds; distributed SGD with worker momentum
(DP-SGD's clip-and-noise per client, q = 1: every worker every round), the budget (ε, δ) of each σ after ``rounds``
rounds from dp-accounting's RDP accountant (:mod:`phalanx.analysis.privacy`: an upper bound on the mechanism's ε, not a
measurement; labelled "ε ≤"). Per cell: the final test accuracy, mean and 95 %
Student-t interval over the seeds. The price of robustness at σ: mean − rule accuracy without attack, paired by seed
(same seed = same split, initial model, batches and noise draws); its change from no DP to σ, paired by seed, with
the verdict "holds" when the whole interval is above 0 (the price grew), "contradicted" below, else inconclusive.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.analysis import privacy as accounting
from phalanx.analysis.stats import MIN_SEEDS, Estimate, mean_ci
from phalanx.errors import ConfigError
from phalanx.experiments import legacy
from phalanx.experiments.plots import rule_colours, save_figure
from phalanx.experiments.validrun import ValidRun
from phalanx.studies import raw
from phalanx.studies.registry import register
from phalanx.studies.reporting import family_note, holm_family, holm_p, pick_preset, provenance
from phalanx.studies.template import Document, GridFunctions, GridStudy

MEAN = "mean"


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
    attack: str = "alie"
    rules: tuple[str, ...] = (MEAN, "cwtm", "cwmed", "nnm>cwtm")
    noises: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5)
    clip: float = 1.0
    delta: float = 1e-5
    rounds: int = 150
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    partition: str = "iid"
    alpha: float = 1.0
    seeds: tuple[int, ...] = (0, 1, 2)
    fallback_dataset: str | None = None


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        name="quick", description="CPU-sized: an MLP on the built-in digits, n = 20 workers, 3 ALIE attackers, "
        "σ ∈ {0, 0.5, 1, 1.5}, 150 rounds", dataset="digits",
    ),
    "full": Preset(
        name="full", description="an MLP on Fashion-MNIST (digits when absent), n = 30, 5 ALIE attackers, "
        "σ ∈ {0, 0.25, 0.5, 1, 2, 4}, 500 rounds", dataset="fashion-mnist", fallback_dataset="digits",
        model_params={"hidden": [64]}, workers=30, byzantine=5, f=5, noises=(0.0, 0.25, 0.5, 1.0, 2.0, 4.0),
        rounds=500,
    ),
}


def preset(name: str, **changes: Any) -> Preset:
    """A preset by name with fields replaced, checked: the mean among the rules (the price is measured against it),
    no negative noise, 0 (no DP) among the noises, f at least the attackers."""
    p = pick_preset(PRESETS, name, changes, ("rules", "noises", "seeds"))
    if MEAN not in p.rules or len(p.rules) < 2:
        raise ConfigError("rules", list(p.rules), "the mean and at least one robust rule")
    if any(not isinstance(s, int | float) or s < 0 for s in p.noises) or 0 not in p.noises:
        raise ConfigError("noises", list(p.noises), "noise multipliers >= 0, 0 (no DP) among them")
    if p.f < p.byzantine:
        raise ConfigError("f", p.f, f">= byzantine = {p.byzantine}")
    return p


@dataclass(frozen=True)
class Cell:
    """One run: a rule, attacked or not, a noise multiplier (0: no DP) and a seed."""

    rule: str
    attacked: bool
    noise: float
    seed: int


def cells(p: Preset) -> list[Cell]:
    """Every run of the grid."""
    return [Cell(r, a, float(s), seed) for r in p.rules for a in (False, True) for s in p.noises for seed in p.seeds]


def keys(p: Preset, cell: Cell) -> dict[str, Any]:
    """The run keys of one cell (evaluated at the end; the mean with f = 0)."""
    data: dict[str, Any] = {
        "dataset": p.dataset, "model": p.model, "model_params": dict(p.model_params), "workers": p.workers,
        "aggregator": cell.rule, "f": 0 if cell.rule == MEAN else p.f,
        "attack": p.attack if cell.attacked else "none", "byzantine": p.byzantine if cell.attacked else 0,
        "rounds": p.rounds, "eval_every": p.rounds, "checkpoint_every": p.rounds, "batch_size": p.batch_size,
        "lr": p.lr, "momentum": p.momentum, "partition": p.partition, "alpha": p.alpha, "seed": cell.seed,
    }
    if cell.noise > 0:
        data.update(legacy.flat_keys("dp", {"noise": cell.noise, "clip": p.clip, "delta": p.delta}))
    return data


@dataclass(frozen=True)
class Final:
    """What one ended run ended with (a diverged run: accuracy as its last row says)."""

    accuracy: float = field(metadata=raw.SHARE)
    epsilon: float | None = field(metadata=raw.NON_NEGATIVE)


def final(cell: Cell, run: ValidRun, rows: list[dict[str, Any]]) -> Final:
    """The last row of a cell's ended run: its test accuracy and ε."""
    last = rows[-1]
    eps = last.get("dp_epsilon")
    return Final(float(last["test_accuracy"]), None if eps is None else float(eps))


def epsilon(p: Preset, noise: float, rounds: int | None = None) -> float:
    """The budget ε after the preset's rounds at noise multiplier ``noise`` (∞ without DP), from the accountant."""
    if noise == 0:
        return math.inf
    n = p.workers
    return accounting.budget(float(noise), p.delta, p.rounds if rounds is None else rounds, n, n).epsilon


Key = tuple[str, bool, float]


def tabulate(finals: dict[Cell, Final]) -> dict[Key, dict[int, float]]:
    """Per (rule, attacked, noise): the final accuracy of each seed."""
    out: dict[Key, dict[int, float]] = {}
    for c, fin in finals.items():
        out.setdefault((c.rule, c.attacked, c.noise), {})[c.seed] = fin.accuracy
    return out


def estimates(table: dict[Key, dict[int, float]]) -> dict[Key, Estimate]:
    """Mean and 95 % interval over the seeds of every (rule, attacked, noise)."""
    return {k: mean_ci(list(v.values())) for k, v in table.items()}


def _paired(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


def price(table: dict[Key, dict[int, float]], rule: str, noise: float) -> dict[int, float]:
    """The price of robustness of ``rule`` at ``noise`` per seed: mean − rule final accuracy, no attack."""
    return _paired(table.get((MEAN, False, noise), {}), table.get((rule, False, noise), {}))


@dataclass(frozen=True)
class Growth:
    """How the price of robustness of one rule changed from no DP to noise σ, paired by seed."""

    rule: str
    noise: float
    price: Estimate
    change: Estimate

    @property
    def verdict(self) -> str:
        return self.change.verdict("positive")


def growth(table: dict[Key, dict[int, float]], p: Preset) -> list[Growth]:
    """Per robust rule and σ > 0: the price at σ and its change from σ = 0 (paired by seed); the changes are one
    Holm family (the report reads them all)."""
    out = []
    for rule in p.rules:
        if rule == MEAN:
            continue
        base = price(table, rule, 0.0)
        for s in p.noises:
            if s == 0:
                continue
            at = price(table, rule, float(s))
            change = _paired(at, base)
            if at and change:
                out.append(Growth(rule, float(s), mean_ci(list(at.values())), mean_ci(list(change.values()))))
    return holm_family(out, "change")


def _eps_label(p: Preset, noise: float) -> str:
    e = epsilon(p, noise)
    return "no DP" if math.isinf(e) else f"σ = {noise:g} (ε ≤ {e:.3g})"  # the RDP accountant's bound, not a measurement


def accuracy_markdown(est: dict[Key, Estimate], p: Preset) -> str:
    """Rows: (rule, attack); columns: σ with its ε; cells: final test accuracy % mean ± half-width."""
    lines = ["| rule | attack | " + " | ".join(_eps_label(p, s) for s in p.noises) + " |",
             "|" + "---|" * (2 + len(p.noises))]
    for attacked in (False, True):
        for rule in p.rules:
            what = f"{p.attack} (b = {p.byzantine})" if attacked else "none"
            row = [est.get((rule, attacked, float(s))) for s in p.noises]
            lines.append(f"| {rule} | {what} | " + " | ".join("—" if e is None else e.show(100, 1) for e in row) + " |")
    return "\n".join(lines)


def growth_markdown(gs: list[Growth], p: Preset) -> str:
    """One line per (robust rule, σ): the price at σ, its change from no DP, interval, verdict."""
    lines = ["| rule | σ | ε ≤ | price of robustness (mean − rule, points) | change from no DP | 95 % interval | "
             "Holm p | the price grew? |", "|---|---|---|---|---|---|---|---|"]
    for g in gs:
        lines.append(f"| {g.rule} | {g.noise:g} | {epsilon(p, g.noise):.3g} | {g.price.show(100, 1, '+')} | "
                     f"{100 * g.change.mean:+.1f} | {g.change.interval(100, 1)} | {holm_p(g.change)} | {g.verdict} |")
    return "\n".join(lines) + "\n\n" + family_note(g.change for g in gs)


def readout(gs: list[Growth], p: Preset) -> str:
    """One paragraph: how many (rule, σ) pairs show the price growing, shrinking or neither."""
    if not gs:
        return "No robust rule and noise level to compare."
    counts = {v: sum(g.verdict == v for g in gs) for v in ("holds", "contradicted", "inconclusive")}
    other = len(gs) - sum(counts.values())
    seeds = f"{len(p.seeds)} seeds" + ("" if len(p.seeds) >= MIN_SEEDS else f" (fewer than {MIN_SEEDS}: no verdicts)")
    return (f"Of {len(gs)} (robust rule, σ) pairs, the price of robustness grew with the DP noise (Holm-adjusted "
            f"p < 0.05, the change above 0) in {counts['holds']}, shrank in {counts['contradicted']}, and neither was "
            f"shown in {counts['inconclusive'] + other}; {seeds}.")


def cells_csv(table: dict[Key, dict[int, float]], p: Preset) -> str:
    """Every (rule, attacked, noise): ε, the accuracy estimate, the per-seed values."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["rule", "attacked", "noise", "epsilon", "accuracy_mean", "accuracy_low", "accuracy_high",
                "per_seed_accuracy"])
    for (rule, attacked, noise), seeds in sorted(table.items()):
        e = mean_ci(list(seeds.values()))
        w.writerow([rule, attacked, noise, f"{epsilon(p, noise):.6g}", f"{e.mean:.6f}", f"{e.low:.6f}",
                    f"{e.high:.6f}", " ".join(f"{s}:{a:.6f}" for s, a in sorted(seeds.items()))])
    return buf.getvalue()


def plot(est: dict[Key, Estimate], gs: list[Growth], p: Preset, path: Path) -> Path:
    """Three panels: accuracy vs ε without attack and under attack (a line per rule, 95 % intervals; no DP at the
    right, marked ∞), and the price of robustness vs σ (a line per robust rule)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    noisy = sorted(float(s) for s in p.noises if s > 0)
    eps = {s: epsilon(p, s) for s in noisy}
    right = 3 * max(eps.values()) if eps else 1.0  # where "no DP" (ε = ∞) is drawn
    xs = {**eps, 0.0: right}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    for ax, attacked in zip(axes[:2], (False, True)):
        for i, rule in enumerate(p.rules):
            pts = sorted((xs[s], est[(rule, attacked, s)]) for s in [*noisy, 0.0] if (rule, attacked, s) in est)
            if not pts:
                continue
            shift = 1.04 ** (i - (len(p.rules) - 1) / 2)  # side by side, so that the intervals do not hide each other
            means = [100 * e.mean for _, e in pts]
            errs = [[100 * e.half_width if math.isfinite(e.half_width) else 0.0 for _, e in pts]] * 2
            ax.errorbar([x * shift for x, _ in pts], means, yerr=errs, marker="o", capsize=3, label=rule,
                        color=rule_colours(list(p.rules))[rule])
        ax.set_xscale("log")
        ticks = [xs[s] for s in noisy] + [right]
        ax.set_xticks(ticks, [f"{eps[s]:.3g}\n(σ={s:g})" for s in noisy] + ["∞\n(no DP)"])
        ax.minorticks_off()
        ax.set_xlabel(f"ε (RDP upper bound) after {p.rounds} rounds (δ = {p.delta:g})")
        ax.set_title(f"{p.attack}, b = {p.byzantine}" if attacked else "no attack")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("final test accuracy %")
    axes[0].legend()
    ax = axes[2]
    for rule in p.rules:
        if rule == MEAN:
            continue
        rows = [g for g in gs if g.rule == rule]
        if not rows:
            continue
        zero = rows[0].price.mean - rows[0].change.mean  # the price at σ = 0, as the paired change implies
        bars = [0.0] + [100 * g.price.half_width if math.isfinite(g.price.half_width) else 0.0 for g in rows]
        ax.errorbar([0.0] + [g.noise for g in rows], [100 * zero] + [100 * g.price.mean for g in rows], yerr=bars,
                    marker="o", capsize=3, label=rule, color=rule_colours(list(p.rules))[rule])
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("noise multiplier σ (0: no DP)")
    ax.set_ylabel("price of robustness: mean − rule, points")
    ax.set_title("no attack")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.suptitle(f"{p.model} on {p.dataset}, n = {p.workers}, f = {p.f}, client-level DP (clip C = {p.clip:g}) at "
                 f"every worker, {len(p.seeds)} seeds (95 % intervals)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def report_markdown(
    est: dict[Key, Estimate], gs: list[Growth], p: Preset, *, command: str, wall_seconds: float | None, runs: int,
) -> str:
    """The whole report: setup, the accuracy table, the price of robustness and its growth, the readout."""
    parts = [
        f"# Differential privacy and the price of robustness — preset `{p.name}`", "",
        *provenance(command, wall_seconds, runs), "",
        f"Setup: {p.model} {p.model_params} on {p.dataset}, {p.partition} split, n = {p.workers} workers, "
        f"distributed SGD (batch {p.batch_size}, lr {p.lr:g}, worker momentum {p.momentum:g}), {p.rounds} rounds; "
        f"client-level DP at every honest worker: its gradient clipped to C = {p.clip:g}, N(0, σ²C²·I) added before "
        f"its momentum; ε after {p.rounds} rounds at δ = {p.delta:g} from dp-accounting's RDP accountant "
        "(replace-one neighbours, every worker every round; docs/privacy.md). The mean with f = 0; robust rules with "
        f"f = {p.f}; attack {p.attack} with b = {p.byzantine} (its rows are not bound by DP); seeds {list(p.seeds)}. "
        "Cells: final test accuracy %, mean ± 95 % Student-t half-width over the seeds.", "",
        "## Final test accuracy %", "", accuracy_markdown(est, p), "",
        "## The price of robustness as the noise grows (no attack; paired by seed)", "", growth_markdown(gs, p), "",
        "## Readout", "", readout(gs, p), "",
    ]
    return "\n".join(parts)


@register
class Privacy(GridStudy[Preset, Cell, Final]):
    """Differential privacy next to robustness (the module's docstring): ``phalanx experiment privacy``."""

    name = "privacy"
    help = ("Client-level differential privacy next to robustness: final accuracy vs the DP budget ε (noise "
            "multipliers σ at every worker, dp-accounting's RDP accountant) with and without an attack, for the mean "
            "and robust rules; does DP noise raise the price of robustness (Yang, Shi & Li, ICML 2025)? Tables with "
            "intervals, paired differences, plot.")
    preset_type = Preset
    presets = PRESETS
    out = "runs/privacy-quick"
    preset_help = "quick (digits, CPU, minutes) or full (Fashion-MNIST)."
    set_example = "noises=[0,1]"

    functions = GridFunctions(preset, cells, keys, final)
    raw_value = Final

    def document(
        self, p: Preset, cells: list[Cell], collected: dict[Cell, Final], *, command: str,
        wall_seconds: float | None, runs: int,
    ) -> Document:
        table = tabulate(collected)
        est = estimates(table)
        gs = growth(table, p)
        return Document(report_markdown(est, gs, p, command=command, wall_seconds=wall_seconds, runs=runs),
                        cells_csv(table, p), "privacy.png", "accuracy vs DP ε", lambda path: plot(est, gs, p, path),
                        [accuracy_markdown(est, p) + "\n\n" + growth_markdown(gs, p) + "\n\n" + readout(gs, p)])
