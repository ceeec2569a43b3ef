"""The parallelism threshold of decentralized learning, as a preset: D-SGD vs Decentralized Anytime SGD as the
number of nodes grows at a fixed total sample budget — tables with intervals, paired differences, a plot, a report.

The question of Eisen, Dorfman & Levy ("Enhancing parallelism in decentralized stochastic convex optimization",
ICML 2025, arXiv 2506.00961): with N samples in all, n nodes each draw b per round for T = N/(n·b) rounds. Up to
some n (the *parallelism threshold*) more nodes cost nothing — the error is that of centralized SGD on N samples —
beyond it the graph's slow mixing takes over and the error grows. They prove that Decentralized Anytime SGD
(``algorithm = "anytime"``) has a larger threshold than D-SGD (``algorithm = "gossip"``) in stochastic convex
optimization. Here: multinomial logistic regression (convex), Dirichlet label skew, the nodes of a ring and of a
torus, and the complete graph with uniform weights (W = J/n: exact averaging, i.e. centralized minibatch SGD / Anytime
SGD on n·b samples a round) as the reference.

Grid: graph ∈ ``graphs`` × n ∈ ``nodes`` × algorithm × learning rate (the algorithm's own grid: D-SGD's η is a step,
Anytime SGD's is multiplied by the round t) × seeds, no attack, every node evaluated at the end. Per (graph, n,
algorithm) the learning rate with the lowest mean final test loss over the *tuning seeds* (``tuning_seeds``, 1000 …
1002 by default) is kept, and the *reported seeds* (``seeds``, disjoint from them) give its final test loss (the mean
over nodes of each node's own model's loss on the test set: the population risk of stochastic convex optimization)
and accuracy as mean and 95 % Student-t interval over seeds. Choosing on the reported seeds would make the reported
loss optimistic by the selection (the winner's curse; Cawley & Talbot, JMLR 11, 2010); on disjoint seeds the choice
is independent of the reported runs' noise, given the data. Every (lr, seed) of both sets is trained, and the report
counts the cells where the reported seeds would have chosen another rate. Paired differences Anytime − D-SGD per
(graph, n), same seed = same split and initial model. The readout per (graph, algorithm): the largest n whose loss is
within ``tolerance`` (relative) of the centralized reference at that n (the complete graph's best loss over both
algorithms).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.analysis.stats import Estimate, mean_ci
from phalanx.errors import ConfigError
from phalanx.experiments.plots import save_figure
from phalanx.experiments.validrun import ValidRun
from phalanx.studies import raw
from phalanx.studies.registry import register
from phalanx.studies.reporting import family_note, holm_family, holm_p, pick_preset, provenance
from phalanx.studies.template import Document, GridFunctions, GridStudy

ALGORITHM_LABELS = {"gossip": "D-SGD", "anytime": "Anytime SGD"}
REFERENCE = "complete"
"""The graph of the centralized reference (with ``gossip_weights = "uniform_neighbour"``: W = J/n)."""


@dataclass(frozen=True)
class Preset:
    """One setting of the experiment."""

    name: str
    description: str
    dataset: str
    model: str = "logreg"
    model_params: dict[str, Any] = field(default_factory=dict)
    budget: int = 36_864
    batch_size: int = 4
    nodes: tuple[int, ...] = (9, 16, 36, 64, 144)
    graphs: tuple[str, ...] = ("ring", "torus", REFERENCE)
    alpha: float = 0.5
    lrs: dict[str, tuple[float, ...]] = field(default_factory=lambda: {
        "gossip": (0.1, 0.2, 0.4, 0.8, 1.6, 3.2),
        "anytime": (0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512),
    })
    seeds: tuple[int, ...] = (0, 1, 2)
    tuning_seeds: tuple[int, ...] = (1000, 1001, 1002)
    """The seeds the learning rate is chosen on, disjoint from ``seeds`` (the reported ones)."""
    tolerance: float = 0.1
    fallback_dataset: str | None = None

    def rounds(self, n: int) -> int:
        """T = N / (n · b): every n spends the same samples."""
        return self.budget // (n * self.batch_size)


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        name="quick", description="CPU-sized: logistic regression on the built-in digits, N = 36,864 samples, "
        "n ∈ {9, 16, 36, 64, 144}", dataset="digits",
    ),
    "full": Preset(
        name="full", description="logistic regression on Fashion-MNIST (digits when absent), N = 2^20 samples, "
        "n ∈ {16, 64, 144, 256, 576}", dataset="fashion-mnist", fallback_dataset="digits", budget=1 << 20,
        batch_size=8, nodes=(16, 64, 144, 256, 576),
        lrs={"gossip": (0.05, 0.1, 0.2, 0.4, 0.8, 1.6), "anytime": (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016,
                                                                    0.032)},
    ),
}


def preset(name: str, **changes: Any) -> Preset:
    """A preset by name with fields replaced (``seeds=(0, 1, 2, 3)``, ``nodes=(9, 16)``, ...), checked: every n
    spends the budget in at least one round, a torus needs n = rows × cols with rows, cols ≥ 3."""
    from phalanx.decentralized import topology

    p = pick_preset(PRESETS, name, changes, ("nodes", "graphs", "seeds", "tuning_seeds"))
    shared = sorted(set(p.seeds) & set(p.tuning_seeds))
    if shared:
        raise ConfigError("tuning_seeds", list(p.tuning_seeds),
                          f"seeds disjoint from the reported seeds {list(p.seeds)} (both hold {shared})")
    for n in p.nodes:
        if p.rounds(n) < 1:
            raise ConfigError("nodes", n, f"<= budget / batch_size = {p.budget // p.batch_size} (one round at least)")
        for g in p.graphs:
            try:
                topology.make(g, n)
            except ConfigError as exc:  # a graph this n cannot have
                raise ConfigError("nodes", n, f"sizes every graph of the preset has ({g}: {exc.allowed})") from None
    if set(p.lrs) != set(ALGORITHM_LABELS) or not all(p.lrs.values()):
        raise ConfigError("lrs", p.lrs, "a non-empty grid for each of " + ", ".join(ALGORITHM_LABELS))
    return p


@dataclass(frozen=True)
class Cell:
    """One run: a graph, a number of nodes, an algorithm, a learning rate and a seed."""

    graph: str
    n: int
    algorithm: str
    lr: float
    seed: int


def cells(p: Preset) -> list[Cell]:
    """Every run of the grid, at the reported seeds and at the tuning seeds."""
    return [Cell(g, n, a, lr, s) for g in p.graphs for n in p.nodes for a in ALGORITHM_LABELS for lr in p.lrs[a]
            for s in (*p.seeds, *p.tuning_seeds)]


def keys(p: Preset, cell: Cell) -> dict[str, Any]:
    """The run keys of one cell (no attack, plain gossip, evaluated at the end)."""
    rounds = p.rounds(cell.n)
    data: dict[str, Any] = {
        "algorithm": cell.algorithm, "graph": cell.graph, "workers": cell.n, "dataset": p.dataset, "model": p.model,
        "model_params": dict(p.model_params), "aggregator": "mean", "attack": "none", "byzantine": 0, "f": 0,
        "batch_size": p.batch_size, "lr": cell.lr, "momentum": 0.0, "partition": "dirichlet", "alpha": p.alpha,
        "rounds": rounds, "eval_every": rounds, "checkpoint_every": rounds, "seed": cell.seed,
        "gossip_weights": "uniform_neighbour" if cell.graph == REFERENCE else "metropolis_hastings",
    }
    return data


@dataclass(frozen=True)
class Final:
    """What one finished run ended with."""

    loss: float = field(metadata=raw.NON_NEGATIVE)
    accuracy: float = field(metadata=raw.SHARE)
    consensus: float = field(metadata=raw.NON_NEGATIVE)


@dataclass
class Result:
    """A table cell (graph, n, algorithm): the chosen learning rate, the per-seed finals at it, and their estimates."""

    graph: str
    n: int
    algorithm: str
    lr: float
    per_seed: dict[int, Final]
    loss: Estimate
    accuracy: Estimate
    lr_on_reported: float
    """The rate that selection on the reported seeds would have kept (not used)."""


def final(cell: Cell, run: ValidRun, rows: list[dict[str, Any]]) -> Final:
    """The last evaluation of a cell's ended run. A run that diverged has no loss: it counts as infinitely bad (its
    learning rate is never chosen)."""
    last = rows[-1]
    loss = last.get("test_loss")
    return Final(math.inf if loss is None else float(loss), float(last["test_accuracy"]),
                 float(last.get("consensus_distance") or 0.0))


def lowest_loss(by_lr: dict[float, dict[int, Final]]) -> float:
    """The learning rate of lowest mean final test loss over the seeds given (NaN counts as diverged; ties: the
    smaller rate)."""
    def mean(r: float) -> float:
        m = sum(f.loss for f in by_lr[r].values()) / len(by_lr[r])
        return math.inf if math.isnan(m) else m
    return min(by_lr, key=lambda r: (mean(r), r))


def split_seeds(by_seed: dict[int, Final], tuning: frozenset[int]) -> tuple[dict[int, Final], dict[int, Final]]:
    """One learning rate's per-seed finals split into (tuning seeds', reported seeds')."""
    return ({s: v for s, v in by_seed.items() if s in tuning}, {s: v for s, v in by_seed.items() if s not in tuning})


def tabulate(finals: dict[Cell, Final], tuning_seeds: tuple[int, ...]) -> dict[tuple[str, int, str], Result]:
    """Per (graph, n, algorithm): the learning rate of lowest mean final test loss over the tuning seeds alone, and
    the reported seeds' estimates at it. Raises :class:`ConfigError` when a cell lacks tuning or reported seeds."""
    tuning = frozenset(tuning_seeds)
    groups: dict[tuple[str, int, str], dict[float, dict[int, Final]]] = {}
    for c, fin in finals.items():
        groups.setdefault((c.graph, c.n, c.algorithm), {}).setdefault(c.lr, {})[c.seed] = fin
    out = {}
    for key, by_lr in groups.items():
        split = {r: split_seeds(v, tuning) for r, v in by_lr.items()}
        if any(not t or not rep for t, rep in split.values()):
            raise ConfigError("tuning_seeds", sorted(tuning), f"some but not all of cell {key}'s seeds")
        lr = lowest_loss({r: t for r, (t, _) in split.items()})
        seeds = split[lr][1]
        out[key] = Result(*key, lr=lr, per_seed=seeds, loss=mean_ci([f.loss for f in seeds.values()]),
                          accuracy=mean_ci([f.accuracy for f in seeds.values()]),
                          lr_on_reported=lowest_loss({r: rep for r, (_, rep) in split.items()}))
    return out


def selection_note(results: dict[tuple[str, int, str], Result], p: Preset) -> str:
    """What choosing on disjoint seeds changed: in how many cells the reported seeds would have kept another rate."""
    moved = sum(r.lr_on_reported != r.lr for r in results.values())
    return (f"Selection: the lr is chosen on the tuning seeds {list(p.tuning_seeds)}, disjoint from the reported seeds "
            f"{list(p.seeds)}; chosen on the reported seeds instead it would differ in {moved} of {len(results)} "
            "cells.")


@dataclass(frozen=True)
class Difference:
    """Anytime − D-SGD final test loss at one (graph, n), paired by seed, each at its chosen learning rate."""

    graph: str
    n: int
    estimate: Estimate

    @property
    def verdict(self) -> str:
        return self.estimate.side("Anytime SGD better", "D-SGD better")


def differences(results: dict[tuple[str, int, str], Result], p: Preset) -> list[Difference]:
    """Anytime − D-SGD per (graph, n), paired by seed; one Holm family (the report reads them all)."""
    out = []
    for g in p.graphs:
        for n in p.nodes:
            a, d = results.get((g, n, "anytime")), results.get((g, n, "gossip"))
            if a is None or d is None:
                continue
            seeds = sorted(set(a.per_seed) & set(d.per_seed))
            out.append(Difference(g, n, mean_ci([a.per_seed[s].loss - d.per_seed[s].loss for s in seeds])))
    return holm_family(out)


def reference(results: dict[tuple[str, int, str], Result], n: int) -> float | None:
    """The centralized reference at n: the complete graph's best mean loss over both algorithms (None if absent)."""
    losses = [results[(REFERENCE, n, a)].loss.mean for a in ALGORITHM_LABELS if (REFERENCE, n, a) in results]
    return min(losses) if losses else None


def thresholds(results: dict[tuple[str, int, str], Result], p: Preset) -> dict[tuple[str, str], int | None]:
    """Per (graph, algorithm) of the sparse graphs: the largest n (counting up from the smallest, stopping at the
    first that fails) whose mean loss is within ``tolerance`` of :func:`reference`; None if even the smallest is
    not."""
    out: dict[tuple[str, str], int | None] = {}
    for g in p.graphs:
        if g == REFERENCE:
            continue
        for a in ALGORITHM_LABELS:
            best = None
            for n in sorted(p.nodes):
                ref, r = reference(results, n), results.get((g, n, a))
                if ref is None or r is None or r.loss.mean > (1 + p.tolerance) * ref:
                    break
                best = n
            out[(g, a)] = best
    return out


def _fmt(e: Estimate, scale: float = 1.0, digits: int = 3) -> str:
    if not math.isfinite(e.mean):
        return "diverged"
    return e.show(scale, digits)


def _by_nodes(results: dict[tuple[str, int, str], Result], p: Preset, column: Callable[[int], str],
              cell: Callable[[Result], str]) -> str:
    """A table with a row per (graph, algorithm) and a column per n: ``column(n)`` heads it, ``cell`` fills it."""
    lines = ["| graph | algorithm | " + " | ".join(column(n) for n in p.nodes) + " |",
             "|" + "---|" * (2 + len(p.nodes))]
    for g in p.graphs:
        for a, label in ALGORITHM_LABELS.items():
            cells_ = [results.get((g, n, a)) for n in p.nodes]
            lines.append(f"| {g} | {label} | " + " | ".join("—" if r is None else cell(r) for r in cells_) + " |")
    return "\n".join(lines)


def table_markdown(results: dict[tuple[str, int, str], Result], p: Preset) -> str:
    """Rows: (graph, algorithm); columns: n; cells: final test loss mean ± half-width (chosen lr)."""
    return _by_nodes(results, p, lambda n: f"n = {n} (T = {p.rounds(n)})", lambda r: f"{_fmt(r.loss)} ({r.lr:g})")


def accuracy_markdown(results: dict[tuple[str, int, str], Result], p: Preset) -> str:
    """The same cells as :func:`table_markdown` as final test accuracy %."""
    return _by_nodes(results, p, lambda n: f"n = {n}", lambda r: _fmt(r.accuracy, 100, 1))


def differences_markdown(ds: list[Difference]) -> str:
    """One line per paired difference: estimate, interval, Holm-adjusted p, verdict; the family's note under it."""
    lines = ["| graph | n | Anytime − D-SGD (test loss) | 95 % interval | Holm p | verdict |",
             "|---|---|---|---|---|---|"]
    for d in ds:
        e = d.estimate
        lines.append(f"| {d.graph} | {d.n} | {e.mean:+.4f} | {e.interval(1.0, 4)} | {holm_p(e)} | {d.verdict} |")
    return "\n".join(lines) + "\n\n" + family_note(d.estimate for d in ds)


def thresholds_markdown(th: dict[tuple[str, str], int | None], p: Preset) -> str:
    """The readout per sparse graph and algorithm."""
    lines = [f"| graph | algorithm | largest n within {100 * p.tolerance:g} % of the centralized loss |",
             "|---|---|---|"]
    for (g, a), n in th.items():
        lines.append(f"| {g} | {ALGORITHM_LABELS[a]} | {'none of the grid' if n is None else n} |")
    return "\n".join(lines)


def cells_csv(results: dict[tuple[str, int, str], Result]) -> str:
    """Every table cell: its keys, the chosen lr, loss and accuracy estimates, per-seed values."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["graph", "n", "algorithm", "lr", "loss_mean", "loss_low", "loss_high", "accuracy_mean",
                "accuracy_low", "accuracy_high", "per_seed_loss", "lr_on_reported"])
    for (g, n, a), r in sorted(results.items()):
        w.writerow([g, n, a, r.lr, f"{r.loss.mean:.6f}", f"{r.loss.low:.6f}", f"{r.loss.high:.6f}",
                    f"{r.accuracy.mean:.6f}", f"{r.accuracy.low:.6f}", f"{r.accuracy.high:.6f}",
                    " ".join(f"{s}:{f.loss:.6f}" for s, f in sorted(r.per_seed.items())), r.lr_on_reported])
    return buf.getvalue()


def plot(results: dict[tuple[str, int, str], Result], p: Preset, path: Path) -> Path:
    """Final test loss vs n (log scale), a line per algorithm with 95 % intervals, a panel per sparse graph, the
    centralized reference dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sparse = [g for g in p.graphs if g != REFERENCE] or list(p.graphs)
    fig, axes = plt.subplots(1, len(sparse), figsize=(5 * len(sparse), 3.8), squeeze=False, sharey=True)
    nodes = sorted(p.nodes)
    for ax, g in zip(axes[0], sparse):
        for i, (a, label) in enumerate(ALGORITHM_LABELS.items()):
            rs = [results.get((g, n, a)) for n in nodes]
            pts = [(n, r) for n, r in zip(nodes, rs) if r is not None and math.isfinite(r.loss.mean)]
            if not pts:
                continue
            shift = 1.03 ** (i - 0.5)  # side by side, so that the intervals do not hide each other
            means = [r.loss.mean for _, r in pts]
            errs = [[m - max(r.loss.low, 0.0) if math.isfinite(r.loss.low) else 0.0 for m, (_, r) in zip(means, pts)],
                    [r.loss.high - m if math.isfinite(r.loss.high) else 0.0 for m, (_, r) in zip(means, pts)]]
            ax.errorbar([n * shift for n, _ in pts], means, yerr=errs, marker="o", capsize=3, label=label)
        refs = [(n, reference(results, n)) for n in nodes]
        ref_pts = [(n, v) for n, v in refs if v is not None and math.isfinite(v)]
        if ref_pts and g != REFERENCE:
            ax.plot([n for n, _ in ref_pts], [v for _, v in ref_pts], "k--", lw=1,
                    label="centralized (complete, W = J/n)")
        ax.set_xscale("log")
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.set_xlabel(f"nodes n (T = {p.budget:,} / (n · {p.batch_size}) rounds)")
        ax.set_title(g)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final test loss (mean over nodes)")
    axes[0][-1].legend()
    fig.suptitle(f"{p.model} on {p.dataset}, Dirichlet α = {p.alpha:g}, {p.budget:,} samples in all, "
                 f"{len(p.seeds)} seeds (95 % intervals; best lr per point)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def report_markdown(
    results: dict[tuple[str, int, str], Result], ds: list[Difference], p: Preset, *, command: str,
    wall_seconds: float | None, runs: int,
) -> str:
    """The whole report: setup, the loss and accuracy tables, the paired differences, the readout."""
    grids = "; ".join(f"{ALGORITHM_LABELS[a]} η ∈ {{{', '.join(f'{x:g}' for x in lrs)}}}" for a, lrs in p.lrs.items())
    parts = [
        f"# Parallelism threshold: D-SGD vs Decentralized Anytime SGD — preset `{p.name}`", "",
        *provenance(command, wall_seconds, runs), "",
        f"Setup: {p.model} on {p.dataset}, Dirichlet α = {p.alpha:g}, no attack, plain gossip (Metropolis–Hastings "
        f"W; the complete graph with W = J/n is the centralized reference); N = {p.budget:,} samples in all, batch "
        f"{p.batch_size} per node, T = N/(n·b) rounds; {grids}; the lr of lowest mean final test loss over the "
        f"tuning seeds {list(p.tuning_seeds)} is kept per cell (in brackets); reported seeds {list(p.seeds)}. "
        "Cells: final test loss (mean over the nodes' own models) mean ± "
        "95 % Student-t half-width over the reported seeds.", "", selection_note(results, p), "",
        "## Final test loss", "", table_markdown(results, p), "",
        "## Final test accuracy %", "", accuracy_markdown(results, p), "",
        "## Paired differences (same seed = same split and initial model)", "", differences_markdown(ds), "",
        "## Readout", "", thresholds_markdown(thresholds(results, p), p), "",
    ]
    return "\n".join(parts)


@register
class Parallelism(GridStudy[Preset, Cell, Final]):
    """The parallelism threshold (the module's docstring) as a study: ``phalanx experiment parallelism``."""

    name = "parallelism"
    help = ("The parallelism threshold (Eisen, Dorfman & Levy, ICML 2025): D-SGD vs Decentralized Anytime SGD as the "
            "number of nodes grows at a fixed sample budget, on a ring and a torus against the centralized reference; "
            "tables with intervals, paired differences, plot.")
    preset_type = Preset
    presets = PRESETS
    out = "runs/parallelism-quick"
    preset_help = "quick (digits, CPU, minutes) or full (Fashion-MNIST)."
    set_example = "nodes=[9,16]"
    raw_value = Final

    functions = GridFunctions(preset, cells, keys, final)

    def document(
        self, p: Preset, cells: list[Cell], collected: dict[Cell, Final], *, command: str,
        wall_seconds: float | None, runs: int,
    ) -> Document:
        results = tabulate(collected, p.tuning_seeds)
        diffs = differences(results, p)
        return Document(report_markdown(results, diffs, p, command=command, wall_seconds=wall_seconds, runs=runs),
                        cells_csv(results), "parallelism.png", "test loss vs nodes",
                        lambda path: plot(results, p, path),
                        [table_markdown(results, p) + "\n\n" + differences_markdown(diffs) + "\n\n"
                         + thresholds_markdown(thresholds(results, p), p)])
