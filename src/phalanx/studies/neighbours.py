"""Robust gossip vs the number of Byzantine neighbours, as a preset: what each robust gossip rule buys under the
decentralized attacks and what it costs with no attack — tables with intervals, paired differences, a plot, a
report. The decentralized analogue of the price of robustness.

Graph: ``attached`` (:func:`phalanx.decentralized.topology.attached`) — a torus of ``honest`` nodes and b further
nodes, each linked to every torus node, so that every honest node has exactly b Byzantine neighbours (the worst case
for b Byzantine nodes). Every rule is configured for f = b. Three situations per (rule, b):

- ``none`` — the same graph, all nodes honest (``byzantine = 0``): the price of configuring the rule for f = b;
- ``dissensus`` — He, Karimireddy & Jaggi (2022), ε = 1.5: push every target away from its honest neighbours;
- ``spectral`` — Gaucher, Dieuleveut & Hendrikx (ICML 2025): along the honest subgraph's Fiedler vector, the
  scale found by search.

Per cell: the honest nodes' mean and worst final test accuracy (mean and 95 % Student-t interval over seeds). Paired
differences (same seed = same split and initial model) plain gossip (``mean``) − rule with no attack: the price.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.analysis.stats import Estimate, mean_ci
from phalanx.errors import ConfigError
from phalanx.experiments.plots import clipped_errors, rule_colours, save_figure
from phalanx.experiments.validrun import ValidRun
from phalanx.studies import raw
from phalanx.studies.registry import register
from phalanx.studies.reporting import family_note, holm_family, holm_p, pick_preset, provenance
from phalanx.studies.template import Document, GridFunctions, GridStudy

PLAIN = "mean"
"""Plain gossip: the reference of the price."""


@dataclass(frozen=True)
class Preset:
    """One setting of the experiment."""

    name: str
    description: str
    dataset: str
    model: str = "mlp"
    model_params: dict[str, Any] = field(default_factory=lambda: {"hidden": [32]})
    honest: int = 16
    byzantine: tuple[int, ...] = (1, 2, 3)
    rules: tuple[str, ...] = ("mean", "cwtm", "clipped_gossip", "cs_plus", "ios", "monna")
    attacks: tuple[str, ...] = ("none", "dissensus", "spectral")
    algorithm: str = "gossip"
    alpha: float = 1.0
    batch_size: int = 16
    lr: float = 0.1
    momentum: float = 0.9
    rounds: int = 100
    seeds: tuple[int, ...] = (0, 1, 2)
    fallback_dataset: str | None = None


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        name="quick", description="CPU-sized: an MLP on the built-in digits, 16 honest nodes on a 4 × 4 torus, "
        "b ∈ {1, 2, 3} Byzantine neighbours per node, 100 rounds", dataset="digits",
    ),
    "full": Preset(
        name="full", description="an MLP on Fashion-MNIST (digits when absent), 36 honest nodes on a 6 × 6 torus, "
        "b ∈ {1, 2, 3, 4}, 300 rounds", dataset="fashion-mnist", fallback_dataset="digits", honest=36,
        byzantine=(1, 2, 3, 4), model_params={"hidden": [64]}, rounds=300,
    ),
}


def preset(name: str, **changes: Any) -> Preset:
    """A preset by name with fields replaced (``seeds=(0, 1, 2, 3)``, ``byzantine=(1, 2)``, ...), checked."""
    p = pick_preset(PRESETS, name, changes, ("byzantine", "rules", "attacks", "seeds"))
    if PLAIN not in p.rules:
        raise ConfigError("rules", list(p.rules), f"a list that includes {PLAIN!r} (the reference of the price)")
    if "none" not in p.attacks:
        raise ConfigError("attacks", list(p.attacks), "a list that includes 'none' (the price with no attack)")
    if min(p.byzantine) < 1:
        raise ConfigError("byzantine", list(p.byzantine), "counts >= 1 (Byzantine neighbours per honest node)")
    return p


@dataclass(frozen=True)
class Cell:
    """One run: a rule, an attack (``none``: the same graph without one), b and a seed."""

    rule: str
    attack: str
    b: int
    seed: int


def cells(p: Preset) -> list[Cell]:
    """Every run of the grid."""
    return [Cell(r, a, b, s) for b in p.byzantine for a in p.attacks for r in p.rules for s in p.seeds]


def keys(p: Preset, cell: Cell) -> dict[str, Any]:
    """The run keys of one cell."""
    byz = 0 if cell.attack == "none" else cell.b
    data: dict[str, Any] = {
        "algorithm": p.algorithm, "graph": "attached", "graph_params": {"byzantine": cell.b, "base": "torus"},
        "workers": p.honest + cell.b, "byzantine": byz, "f": cell.b, "aggregator": cell.rule, "attack": cell.attack,
        "dataset": p.dataset, "model": p.model, "model_params": dict(p.model_params), "partition": "dirichlet",
        "alpha": p.alpha, "batch_size": p.batch_size, "lr": p.lr, "momentum": p.momentum, "rounds": p.rounds,
        "eval_every": p.rounds, "checkpoint_every": p.rounds, "seed": cell.seed,
    }
    return data


@dataclass(frozen=True)
class Final:
    """The honest nodes' final mean and worst test accuracy of one run (0 and 0 when it diverged)."""

    mean: float = field(metadata=raw.SHARE)
    worst: float = field(metadata=raw.SHARE)
    diverged: bool = False


@dataclass
class Result:
    """A table cell (rule, attack, b): per-seed finals and their estimates."""

    rule: str
    attack: str
    b: int
    per_seed: dict[int, Final]
    mean: Estimate
    worst: Estimate

    @property
    def diverged(self) -> int:
        """How many seeds diverged (their models became non-finite)."""
        return sum(1 for f in self.per_seed.values() if f.diverged)


def final(cell: Cell, run: ValidRun, rows: list[dict[str, Any]]) -> Final:
    """The last evaluation of a cell's finished (or diverged) run."""
    last = rows[-1]
    return Final(float(last["test_accuracy"]), float(last.get("worst_node_accuracy", last["test_accuracy"])),
                 bool(last.get("diverged")))


def tabulate(finals: dict[Cell, Final]) -> dict[tuple[str, str, int], Result]:
    """Group the runs into cells (rule, attack, b)."""
    groups: dict[tuple[str, str, int], dict[int, Final]] = {}
    for c, fin in finals.items():
        groups.setdefault((c.rule, c.attack, c.b), {})[c.seed] = fin
    return {k: Result(*k, per_seed=v, mean=mean_ci([f.mean for f in v.values()]),
                      worst=mean_ci([f.worst for f in v.values()])) for k, v in groups.items()}


@dataclass(frozen=True)
class Price:
    """Plain gossip − rule, mean honest accuracy with no attack at one b, paired by seed: the price of robustness as
    every other table states it (mean − rule; a cost is positive — this table said rule − mean until a newcomer read
    cs_plus's −16.37 beside the README's krum +10.3, both "costs accuracy")."""

    rule: str
    b: int
    estimate: Estimate

    @property
    def verdict(self) -> str:
        return self.estimate.side("gains accuracy", "costs accuracy")


def prices(results: dict[tuple[str, str, int], Result], p: Preset) -> list[Price]:
    """Every robust rule's price with no attack, per b; one Holm family (the report reads them all)."""
    out = []
    for b in p.byzantine:
        ref = results.get((PLAIN, "none", b))
        for rule in p.rules:
            r = results.get((rule, "none", b))
            if rule == PLAIN or r is None or ref is None:
                continue
            seeds = sorted(set(r.per_seed) & set(ref.per_seed))
            out.append(Price(rule, b, mean_ci([ref.per_seed[s].mean - r.per_seed[s].mean for s in seeds])))
    return holm_family(out)


def _fmt(e: Estimate) -> str:
    return e.show(100)


def table_markdown(results: dict[tuple[str, str, int], Result], p: Preset) -> str:
    """Rows: rule; columns: (attack, b); cells: mean / worst honest accuracy %, ``(k/s diverged)`` when some did."""
    cols = [(a, b) for a in p.attacks for b in p.byzantine]
    lines = ["| rule | " + " | ".join(f"{a}, b = {b}" for a, b in cols) + " |", "|" + "---|" * (1 + len(cols))]
    for rule in p.rules:
        row = []
        for a, b in cols:
            r = results.get((rule, a, b))
            if r is None:
                row.append("—")
                continue
            div = f" ({r.diverged}/{len(r.per_seed)} diverged)" if r.diverged else ""
            row.append(f"{_fmt(r.mean)} / {100 * r.worst.mean:.1f}{div}")
        lines.append(f"| {rule} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def prices_markdown(ps: list[Price]) -> str:
    """One line per price: estimate, interval, Holm-adjusted p, verdict; the family's note under it."""
    lines = ["| rule | b (= f) | price: mean − rule, no attack (points) | 95 % interval | Holm p | verdict |",
             "|---|---|---|---|---|---|"]
    for q in ps:
        e = q.estimate
        lines.append(f"| {q.rule} | {q.b} | {100 * e.mean:+.2f} | {e.interval(100)} | {holm_p(e)} | "
                     f"{q.verdict} |")
    return "\n".join(lines) + "\n\n" + family_note(q.estimate for q in ps)


def cells_csv(results: dict[tuple[str, str, int], Result]) -> str:
    """Every cell: its keys, mean and worst accuracy estimates, per-seed values."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["rule", "attack", "b", "mean", "low", "high", "worst_mean", "per_seed_mean", "per_seed_worst"])
    for (rule, attack, b), r in sorted(results.items()):
        e = r.mean
        w.writerow([rule, attack, b, f"{e.mean:.6f}", f"{e.low:.6f}", f"{e.high:.6f}", f"{r.worst.mean:.6f}",
                    " ".join(f"{s}:{f.mean:.6f}" for s, f in sorted(r.per_seed.items())),
                    " ".join(f"{s}:{f.worst:.6f}" for s, f in sorted(r.per_seed.items()))])
    return buf.getvalue()


def plot(results: dict[tuple[str, str, int], Result], p: Preset, path: Path) -> Path:
    """Mean honest accuracy vs b, a line per rule with 95 % intervals, a panel per attack."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(p.attacks), figsize=(4.6 * len(p.attacks), 3.8), squeeze=False, sharey=True)
    bs = sorted(p.byzantine)
    colours = rule_colours(list(p.rules))  # each rule's colour in every figure
    for ax, attack in zip(axes[0], p.attacks):
        for i, rule in enumerate(p.rules):
            pts = [(b, results[(rule, attack, b)]) for b in bs if (rule, attack, b) in results]
            if not pts:
                continue
            shift = 0.06 * (i - (len(p.rules) - 1) / 2)  # side by side, so that the intervals do not hide each other
            means = [100 * r.mean.mean for _, r in pts]
            errs = clipped_errors(means, [100 * r.mean.low for _, r in pts], [100 * r.mean.high for _, r in pts])
            ax.errorbar([b + shift for b, _ in pts], means, yerr=errs, marker="o", capsize=3, label=rule,
                        color=colours[rule])
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("Byzantine neighbours per honest node (b = f)")
        ax.set_title("no attack (price)" if attack == "none" else attack)
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final mean honest accuracy %")
    axes[0][0].legend(fontsize=8, loc="lower left")  # the no-attack panel has room below its lines
    fig.suptitle(f"{p.algorithm} on a torus of {p.honest} honest nodes + b attached, {p.model} on {p.dataset}, "
                 f"{p.rounds} rounds, {len(p.seeds)} seeds (95 % intervals)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def report_markdown(
    results: dict[tuple[str, str, int], Result], ps: list[Price], p: Preset, *, command: str,
    wall_seconds: float | None, runs: int,
) -> str:
    """The whole report: setup, the accuracy table, the prices."""
    parts = [
        f"# Robust gossip vs the number of Byzantine neighbours — preset `{p.name}`", "",
        *provenance(command, wall_seconds, runs), "",
        f"Setup: algorithm {p.algorithm}; a torus of {p.honest} honest nodes and b further nodes each linked to every "
        f"honest node (graph `attached`), b ∈ {{{', '.join(map(str, p.byzantine))}}}, every rule configured for f = "
        f"b; 'none' = the same graph with every node honest; {p.model} {p.model_params} on {p.dataset}, Dirichlet "
        f"α = {p.alpha:g}, batch {p.batch_size}, lr {p.lr:g}, momentum {p.momentum:g}, {p.rounds} rounds; seeds "
        f"{list(p.seeds)}. Cells: honest nodes' mean final test accuracy % (mean ± 95 % Student-t half-width over "
        "the seeds) / the worst honest node's (mean over seeds); a diverged run counts as 0.", "",
        "## Accuracy", "", table_markdown(results, p), "",
        "## Price with no attack (paired by seed)", "", prices_markdown(ps), "",
    ]
    return "\n".join(parts)


@register
class ByzantineNeighbours(GridStudy[Preset, Cell, Final]):
    """Robust gossip vs the number of Byzantine neighbours (the module's docstring) as a study: ``phalanx experiment
    byzantine-neighbours``."""

    name = "byzantine-neighbours"
    help = ("Robust gossip vs the number of Byzantine neighbours: every rule at f = b under the dissensus and spectral "
            "attacks, and its price with no attack; tables with intervals, paired prices, plot.")
    preset_type = Preset
    presets = PRESETS
    out = "runs/neighbours-quick"
    preset_help = "quick (digits, CPU, minutes) or full (Fashion-MNIST)."
    set_example = "byzantine=[1,2]"

    functions = GridFunctions(preset, cells, keys, final)
    raw_value = Final

    def document(
        self, p: Preset, cells: list[Cell], collected: dict[Cell, Final], *, command: str,
        wall_seconds: float | None, runs: int,
    ) -> Document:
        results = tabulate(collected)
        ps = prices(results, p)
        return Document(report_markdown(results, ps, p, command=command, wall_seconds=wall_seconds, runs=runs),
                        cells_csv(results), "neighbours.png", "accuracy vs Byzantine neighbours",
                        lambda path: plot(results, p, path),
                        [table_markdown(results, p) + "\n\n" + prices_markdown(ps)])
