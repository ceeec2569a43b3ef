"""The price-of-robustness study of Yang, Shi & Li (ICML 2025) as a preset: grids, tables, trends, report.

The experiment (their Section 6): distributed SGD with **no attack** on n = 16 workers, Dirichlet(α) splits with
α ∈ {0.1, 1, 10}, batch 16 per worker, worker momentum 0.9, a cosine learning rate whose initial value is the best
of {0.1, 0.2, 0.5, 1.0}. Four grids, each a table with rows = the varied parameter and columns = α:

* **T3** Multi-Krum configured for f = 0 … 7;
* **T4** coordinate-wise trimmed mean for f = 0 … 7;
* **T5** NNM with f_NNM = 0 … 7 before Multi-Krum configured for f = 7;
* **T6** NNM with f_NNM = 0 … 7 before the trimmed mean configured for f = 7.

f = 0 (and f_NNM = 0) is the plain mean in every table: Multi-Krum with f = 0 averages all n rows, the trimmed mean
trims nothing, and NNM with f_NNM = 0 replaces every row by the mean of all rows. Those cells run the ``mean``
rule once and are shared by the four tables. Multi-Krum runs with ``strict=false``: Blanchard et al.'s condition
n > 2f + 2 excludes f = 7 at n = 16, which the paper's Table 3 includes.

The learning rate is chosen per cell (table, row, α) as the one with the best mean final accuracy over the
*tuning seeds* (``tuning_seeds``, 1000 … 1002 by default), which are disjoint from the *reported seeds* (``seeds``,
0 … k−1); the cell reports the reported seeds' accuracy at that rate with a 95 % Student-t interval over them.
Choosing on the seeds that are reported would bias each cell up (the maximum of noisy means is biased upward, the
winner's curse; Cawley & Talbot, JMLR 11, 2010, on selection bias in model selection): with disjoint seeds the chosen
rate is independent of the reported runs' noise, given the data. Every (lr, seed) of both sets is trained, so the
report also says how often selection on the reported seeds would have chosen another rate, and by how much it would
have raised the cell — a measured size of that bias on this grid.

Trend verdicts, each from per-seed statistics (runs with the same seed share the data split and initial model, so
these are paired) with a 95 % interval: (a) accuracy falls as f grows — the per-seed least-squares slope of
accuracy on f is negative; (b) it falls faster for small α — slope(α_min) − slope(α_max) is negative; (c) NNM reduces
the drop — accuracy with NNM (f_NNM = f = 7) minus without (the rule alone at f = 7) is positive; (d) smaller f_NNM
gives higher accuracy — the slope of accuracy on f_NNM is negative. The report reads all of them (26 with three
α), so they are one family, Holm-corrected (Holm, Scand. J. Statist. 6, 1979; :func:`phalanx.analysis.stats.holm`):
``holds`` when the Holm-adjusted p-value is below 0.05 and the estimate has the expected sign, ``contradicted`` when
it is below 0.05 with the opposite sign, ``inconclusive`` otherwise. The intervals shown are per comparison (95 %).
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phalanx.analysis.stats import Estimate, mean_ci, slope
from phalanx.errors import ConfigError
from phalanx.experiments.config import RunConfig, ValidRun, make_config
from phalanx.experiments.plots import clipped_errors, save_figure
from phalanx.studies import raw
from phalanx.studies.base import Report, distinct
from phalanx.studies.registry import register
from phalanx.studies.reporting import family_note, holm_family, holm_p, pick_preset, provenance, write_report_files
from phalanx.studies.template import GridFunctions, GridStudy

if TYPE_CHECKING:
    from rich.table import Table

TABLES: dict[str, dict[str, str]] = {
    "T3": {"rule": "multikrum(strict=false)", "label": "Multi-Krum, f = 0 … F", "vary": "f"},
    "T4": {"rule": "cwtm", "label": "trimmed mean, f = 0 … F", "vary": "f"},
    "T5": {"rule": "multikrum(strict=false)", "label": "NNM(f_NNM) > Multi-Krum(f = F)", "vary": "f_NNM"},
    "T6": {"rule": "cwtm", "label": "NNM(f_NNM) > trimmed mean(f = F)", "vary": "f_NNM"},
}
PAIRED = {"T5": "T3", "T6": "T4"}  # NNM table → the table of the same rule without NNM


@dataclass(frozen=True)
class Preset:
    """One setting of the experiment (everything but the grids, which follow from ``workers``)."""

    name: str
    description: str
    dataset: str
    model: str
    model_params: dict[str, Any] = field(default_factory=dict)
    rounds: int = 300
    workers: int = 16
    batch_size: int = 16
    momentum: float = 0.9
    weight_decay: float = 0.0
    lrs: tuple[float, ...] = (0.1, 0.2, 0.5, 1.0)
    alphas: tuple[float, ...] = (0.1, 1.0, 10.0)
    seeds: tuple[int, ...] = (0, 1, 2)
    tuning_seeds: tuple[int, ...] = (1000, 1001, 1002)
    """The seeds lr₀ is chosen on, disjoint from ``seeds`` (the reported ones)."""
    eval_every: int = 100
    fallback_dataset: str | None = None
    device: str = "cpu"
    """The runs' ``device`` (the ``paper`` preset: ``"auto"``, a GPU where there is one; left out of the run ids, so
    runs trained on another device are reused)."""

    @property
    def max_f(self) -> int:
        """F = ⌊(n − 1)/2⌋, the largest f any rule can be configured for (7 at n = 16)."""
        return (self.workers - 1) // 2


PRESETS: dict[str, Preset] = {
    "paper": Preset(
        name="paper",
        description="the paper's setup: ResNet-20 (GroupNorm) on CIFAR-10, 160 epochs (GPU and the data needed)",
        dataset="cifar10", model="resnet20",
        rounds=31_250,  # 160 epochs × 50,000 images / (16 workers × 16 images per round)
        eval_every=1_000, device="auto",
    ),
    "cpu": Preset(
        name="cpu",
        description="the same grids on Fashion-MNIST (digits when absent) with a one-hidden-layer MLP, 300 rounds, "
                    "α ∈ {0.1, 1, 10}, lr₀ ∈ {0.1, 0.2, 0.5, 1} chosen on tuning seeds 1000-1002 (1,044 runs at 3 "
                    "reported seeds and 1,044 tuning runs: about an hour on 2 cores)",
        dataset="fashion-mnist", model="mlp", model_params={"hidden": [64]}, rounds=300, eval_every=100,
        fallback_dataset="digits",
    ),
    "quick": Preset(
        name="quick",
        description="the same grids, smaller: Fashion-MNIST (digits when absent), a one-hidden-layer MLP, 150 rounds, "
                    "α ∈ {0.1, 10}, lr₀ ∈ {0.1, 0.3, 1} chosen on tuning seeds 1000-1002 (522 runs at 3 reported "
                    "seeds and 522 tuning runs: ~15 min on 2 cores)",
        dataset="fashion-mnist", model="mlp", model_params={"hidden": [64]}, rounds=150, eval_every=50,
        lrs=(0.1, 0.3, 1.0), alphas=(0.1, 10.0), fallback_dataset="digits",
    ),
}


def preset(name: str, **changes: Any) -> Preset:
    """A preset by name, with fields replaced (``seeds=(0, 1, 2, 3, 4)``, ``rounds=100``, ...)."""
    p = pick_preset(PRESETS, name, changes, ("lrs", "alphas", "seeds", "tuning_seeds"))
    shared = sorted(set(p.seeds) & set(p.tuning_seeds))
    if shared:
        raise ConfigError("tuning_seeds", list(p.tuning_seeds),
                          f"seeds disjoint from the reported seeds {list(p.seeds)} (both hold {shared})")
    if p.workers < 3:
        raise ConfigError("workers", p.workers, ">= 3 (the grids need f >= 1)")
    return p


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a table row (``x`` = f or f_NNM), a column (α), a learning rate and a seed."""

    table: str
    x: int
    alpha: float
    lr: float
    seed: int


def spec_for(table: str, x: int, max_f: int) -> tuple[str, int]:
    """The aggregator spec and the rule's f for a table row (f = 0 and f_NNM = 0 are the plain mean)."""
    if table not in TABLES:
        raise ConfigError("table", table, "one of " + ", ".join(TABLES))
    rule = TABLES[table]["rule"]
    if x == 0:
        return "mean", 0
    if TABLES[table]["vary"] == "f":
        return rule, x
    return f"nnm(f={x})>{rule}", max_f


def cells(p: Preset) -> list[Cell]:
    """Every (table, row, α, lr, seed) of the four grids, the reported seeds' and the tuning seeds'."""
    return [
        Cell(t, x, a, lr, s)
        for t in TABLES for x in range(p.max_f + 1) for a in p.alphas for lr in p.lrs
        for s in (*p.seeds, *p.tuning_seeds)
    ]


def keys(p: Preset, cell: Cell) -> dict[str, Any]:
    """The run keys of one cell, not validated (no attack: ``byzantine = 0``): the study template applies the command
    line's run keys over them and validates each distinct run once (:class:`~phalanx.studies.template.GridStudy`)."""
    spec, f = spec_for(cell.table, cell.x, p.max_f)
    return {
        "dataset": p.dataset, "model": p.model, "model_params": dict(p.model_params), "workers": p.workers,
        "byzantine": 0, "f": f, "aggregator": spec, "attack": "none", "partition": "dirichlet", "alpha": cell.alpha,
        "rounds": p.rounds, "batch_size": p.batch_size, "lr": cell.lr, "momentum": p.momentum,
        "weight_decay": p.weight_decay, "schedule": "cosine", "seed": cell.seed, "eval_every": p.eval_every,
        "checkpoint_every": max(p.eval_every, p.rounds // 4 or 1), "device": p.device,
    }


def config_for(p: Preset, cell: Cell, overrides: dict[str, Any] | None = None) -> RunConfig:
    """One cell's configuration on its own, validated (:func:`keys` with ``overrides`` over them): for a caller
    that wants one cell's run outside the study (``benchmarks/gpu.py`` times the ``paper`` preset's round with it).
    The study itself plans from :func:`keys` (:meth:`Tension.plan`), each run validated once."""
    return make_config({**keys(p, cell), **(overrides or {})})


def final(cell: Cell, run: ValidRun, rows: list[dict[str, Any]]) -> float:
    """A cell's raw value: the last evaluated round's test accuracy of its ended run (finished, or diverged)."""
    return float(rows[-1]["test_accuracy"])


@dataclass
class CellResult:
    """A table cell: the learning rate chosen on the tuning seeds, the reported seeds' accuracies at it, and their
    mean with an interval."""

    table: str
    x: int
    alpha: float
    lr: float
    per_seed: dict[int, float]
    estimate: Estimate
    tuning_by_lr: dict[float, float]
    """Mean accuracy over the tuning seeds for every learning rate tried: what ``lr`` was chosen on."""
    by_lr: dict[float, float]
    """Mean accuracy over the reported seeds for every learning rate tried (not used to choose)."""

    @property
    def lr_on_reported(self) -> float:
        """The rate that selection on the reported seeds would have chosen (the biased way)."""
        return best_lr(self.by_lr)


def best_lr(means: dict[float, float]) -> float:
    """The learning rate with the best mean accuracy (non-finite counts as worst; ties: the smaller rate)."""
    return min(means, key=lambda lr: (-_finite(means[lr]), lr))


def split_seeds(
    by_seed: dict[int, float], tuning: frozenset[int],
) -> tuple[dict[int, float], dict[int, float]]:
    """One learning rate's per-seed accuracies split into (tuning seeds', reported seeds')."""
    return ({s: v for s, v in by_seed.items() if s in tuning}, {s: v for s, v in by_seed.items() if s not in tuning})


def tabulate(
    cs: list[Cell], accuracy: dict[Cell, float], tuning_seeds: tuple[int, ...],
) -> dict[tuple[str, int, float], CellResult]:
    """Per (table, row, α): choose the learning rate on the tuning seeds alone, then summarise the reported seeds at
    it. Raises :class:`ConfigError` when a cell lacks tuning or reported seeds (nothing to choose on, or to report)."""
    tuning = frozenset(tuning_seeds)
    grouped: dict[tuple[str, int, float], dict[float, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for c in cs:
        grouped[(c.table, c.x, c.alpha)][c.lr][c.seed] = accuracy[c]
    out: dict[tuple[str, int, float], CellResult] = {}
    for key, by_lr in grouped.items():
        split = {lr: split_seeds(v, tuning) for lr, v in by_lr.items()}
        if any(not t or not r for t, r in split.values()):
            raise ConfigError("tuning_seeds", sorted(tuning), f"some but not all of cell {key}'s seeds "
                              f"{sorted({s for v in by_lr.values() for s in v})}")
        tuned = {lr: sum(t.values()) / len(t) for lr, (t, _) in split.items()}
        reported = {lr: sum(r.values()) / len(r) for lr, (_, r) in split.items()}
        best = best_lr(tuned)
        seeds = split[best][1]
        out[key] = CellResult(key[0], key[1], key[2], best, dict(seeds), mean_ci(list(seeds.values())), tuned,
                              reported)
    return out


def selection_note(results: dict[tuple[str, int, float], CellResult], p: Preset) -> str:
    """What choosing on disjoint seeds changed: in how many cells selection on the reported seeds would have picked
    another lr₀, and how much higher those cells would have read (the in-sample optimism, measured on this grid)."""
    moved = [r for r in results.values() if r.lr_on_reported != r.lr]
    gain = [r.by_lr[r.lr_on_reported] - r.estimate.mean for r in moved]
    text = (f"Selection: lr₀ chosen on the tuning seeds {list(p.tuning_seeds)}, disjoint from the reported seeds "
            f"{list(p.seeds)}. Chosen on the reported seeds instead, lr₀ would differ in {len(moved)} of "
            f"{len(results)} cells")
    if not moved:
        return text + "."
    return (text + f", which would read {100 * sum(gain) / len(gain):+.2f} points higher on average there "
            f"(at most {100 * max(gain):+.2f}): the bias that choosing on the reported seeds adds.")


def lr_edges(results: dict[tuple[str, int, float], CellResult], p: Preset) -> str:
    """What the learning-rate search says of itself: in how many cells the chosen lr₀ is the smallest or the
    largest of the grid — there the best rate may lie outside it (a clipped search), so the cell may understate
    the rule; '' when no cell is at an edge. With fewer than three rates every choice is at an edge."""
    lrs = sorted(p.lrs)
    grid_text = "{" + ", ".join(f"{lr:g}" for lr in lrs) + "}"
    if len(lrs) < 3:
        return (f"Learning rate: lr₀ chosen from {grid_text}; with {len(lrs)} rates every choice is at an edge of the "
                "grid, so none of the cells says whether a rate outside it would do better.")
    low = sum(r.lr == lrs[0] for r in results.values())
    high = sum(r.lr == lrs[-1] for r in results.values())
    if not low and not high:
        return ""
    return (f"Learning rate: lr₀ chosen at an edge of its grid {grid_text} in {low + high} of {len(results)} cells "
            f"({high} at the largest, {low} at the smallest): there the search is clipped, and a rate outside the "
            "grid may do better — widen it (--set lrs=[…]).")


def _finite(v: float) -> float:
    return v if math.isfinite(v) else -math.inf


@dataclass(frozen=True)
class Trend:
    """One trend test: what was measured, the estimate over seeds (Holm-corrected within the report's family by
    :func:`trends`), and the sign the trend expects."""

    trend: str
    table: str
    alpha: str
    statistic: str
    estimate: Estimate
    expect: str

    @property
    def verdict(self) -> str:
        """holds / contradicted / inconclusive, decided on the estimate's Holm-adjusted p-value when it has one."""
        return self.estimate.verdict(self.expect)


def trends(results: dict[tuple[str, int, float], CellResult], p: Preset) -> list[Trend]:
    """The four trend tests (module docstring), per α and pooled over α (the per-seed average over α)."""
    seeds = sorted(p.seeds)
    xs = list(range(p.max_f + 1))
    alphas = sorted(p.alphas)

    def acc(table: str, x: int, alpha: float, seed: int) -> float:
        return results[(table, x, alpha)].per_seed[seed]

    def per_seed_slope(table: str, alpha: float, seed: int) -> float:
        return slope(xs, [acc(table, x, alpha, seed) for x in xs])

    out: list[Trend] = []

    def add(trend: str, table: str, stat: str, expect: str, fn: Callable[[float, int], float]) -> None:
        for a in alphas:
            est = mean_ci([fn(a, s) for s in seeds])
            out.append(Trend(trend, table, f"{a:g}", stat, est, expect))
        pooled = mean_ci([sum(fn(a, s) for a in alphas) / len(alphas) for s in seeds])
        out.append(Trend(trend, table, "pooled", stat, pooled, expect))

    def slope_of(t: str) -> Callable[[float, int], float]:
        return lambda a, s: per_seed_slope(t, a, s)

    def nnm_gain(t: str, base: str) -> Callable[[float, int], float]:
        return lambda a, s: acc(t, p.max_f, a, s) - acc(base, p.max_f, a, s)

    for t in ("T3", "T4"):
        add("(a) accuracy falls as f grows", t, "slope of accuracy on f (per f)", "negative", slope_of(t))
    if len(alphas) >= 2:
        lo, hi = alphas[0], alphas[-1]
        for t in ("T3", "T4"):
            diffs = [per_seed_slope(t, lo, s) - per_seed_slope(t, hi, s) for s in seeds]
            est = mean_ci(diffs)
            out.append(Trend("(b) faster for small α", t, f"{lo:g} vs {hi:g}",
                             f"slope(α={lo:g}) − slope(α={hi:g})", est, "negative"))
    for t, base in PAIRED.items():
        add("(c) NNM reduces the drop", t, f"accuracy with NNM(f_NNM = {p.max_f}) − without, rule at f = {p.max_f}",
            "positive", nnm_gain(t, base))
    for t in PAIRED:
        add("(d) smaller f_NNM is better", t, "slope of accuracy on f_NNM (per f_NNM)", "negative", slope_of(t))
    return holm_family(out)


def table_markdown(results: dict[tuple[str, int, float], CellResult], p: Preset, table: str) -> str:
    """One table in the paper's layout: rows = f (or f_NNM), columns = α; cells ``mean ± half-width (lr)`` in %."""
    vary = TABLES[table]["vary"]
    alphas = sorted(p.alphas)
    lines = [f"| {vary} | " + " | ".join(f"α = {a:g}" for a in alphas) + " |",
             "|---|" + "---|" * len(alphas)]
    for x in range(p.max_f + 1):
        cells_txt = []
        for a in alphas:
            r = results[(table, x, a)]
            e = r.estimate
            cells_txt.append(f"{e.show(100, 2)} (lr {r.lr:g})")
        label = f"{x} (mean)" if x == 0 else str(x)
        lines.append(f"| {label} | " + " | ".join(cells_txt) + " |")
    return "\n".join(lines)


def trends_markdown(ts: list[Trend]) -> str:
    """The verdicts as a Markdown table (statistics in accuracy points, i.e. ×100)."""
    lines = ["| trend | table | α | statistic | estimate (points) | 95 % interval | Holm p | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for t in ts:
        e = t.estimate
        lines.append(
            f"| {t.trend} | {t.table} | {t.alpha} | {t.statistic} | {100 * e.mean:+.2f} | "
            f"{e.interval(100)} | {holm_p(e)} | **{t.verdict}** |"
        )
    return "\n".join([*lines, "", family_note(t.estimate for t in ts)])


def cells_csv(results: dict[tuple[str, int, float], CellResult]) -> str:
    """Every cell as CSV: table, x, alpha, the lr chosen on the tuning seeds, mean, low, high, the number of reported
    seeds, their per-seed accuracies, the mean per lr over the tuning seeds (what chose) and over the reported seeds,
    and the lr the reported seeds would have chosen."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["table", "x", "alpha", "lr", "mean", "low", "high", "seeds", "per_seed", "tuning_mean_by_lr",
                "mean_by_lr", "lr_on_reported"])
    for (t, x, a), r in sorted(results.items()):
        e = r.estimate
        w.writerow([t, x, a, r.lr, f"{e.mean:.6f}", f"{e.low:.6f}", f"{e.high:.6f}", e.k,
                    ";".join(f"{s}:{v:.6f}" for s, v in sorted(r.per_seed.items())),
                    ";".join(f"{lr:g}:{v:.6f}" for lr, v in sorted(r.tuning_by_lr.items())),
                    ";".join(f"{lr:g}:{v:.6f}" for lr, v in sorted(r.by_lr.items())), r.lr_on_reported])
    return buf.getvalue()


def plot(results: dict[tuple[str, int, float], CellResult], p: Preset, path: Path) -> Path:
    """Accuracy vs f (or f_NNM) per α, one panel per table, 95 % intervals as error bars clipped to 0 … 100 % (none
    with one seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharey=True)
    xs = list(range(p.max_f + 1))
    for ax, table in zip(axes.flat, TABLES):
        for a in sorted(p.alphas):
            rs = [results[(table, x, a)] for x in xs]
            means = [100 * r.estimate.mean for r in rs]
            errs = clipped_errors(means, [100 * r.estimate.low if r.estimate.k > 1 else m for r, m in zip(rs, means)],
                                  [100 * r.estimate.high if r.estimate.k > 1 else m for r, m in zip(rs, means)])
            ax.errorbar(xs, means, yerr=errs, marker="o", capsize=3, label=f"α = {a:g}")
        label = TABLES[table]["label"].replace("F", str(p.max_f))
        ax.set_title(f"{table}: {label}", fontsize=10)
        ax.set_xlabel(TABLES[table]["vary"])
        ax.set_ylabel("final test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"No attack, n = {p.workers}: {p.dataset}, {p.model}, {p.rounds} rounds, {len(p.seeds)} seeds "
                 "(95 % intervals)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def round_note(overrides: dict[str, Any], p: Preset) -> str:
    """What the report says of the round when the run keys change it (``algorithm = "fedavg"``); else ''."""
    if overrides.get("algorithm") != "fedavg":
        return ""
    c = overrides.get("clients_per_round") or p.workers
    steps = (f"{overrides['local_epochs']:g} local epoch(s)" if overrides.get("local_epochs") is not None
             else f"{overrides.get('local_steps', 1)} local step(s)")
    return (f"Round: federated averaging — each of the {p.workers} workers is a client, {c} sampled per round, "
            f"{steps} of batch {overrides.get('batch_size', p.batch_size)}; the momentum is the clients' local "
            "momentum, lr₀ the clients' learning rate, and the rule aggregates the clients' updates "
            f"(server_lr {overrides.get('server_lr', 1.0):g}).")


def report_markdown(
    results: dict[tuple[str, int, float], CellResult], ts: list[Trend], p: Preset, *, command: str,
    wall_seconds: float | None, runs: int, note: str = "",
) -> str:
    """The whole report: setup, the four tables, the verdicts."""
    F = p.max_f
    parts = [
        f"# Price of robustness — preset `{p.name}`",
        "",
        *provenance(command, wall_seconds, runs, " distinct"),
        "",
        f"Setup: no attack, n = {p.workers} workers, {p.dataset}, model {p.model} {p.model_params or ''}, "
        f"Dirichlet α ∈ {{{', '.join(f'{a:g}' for a in sorted(p.alphas))}}}, batch {p.batch_size} per worker, "
        f"worker momentum {p.momentum}, cosine learning rate over {p.rounds} rounds, lr₀ chosen per cell from "
        f"{{{', '.join(f'{lr:g}' for lr in p.lrs)}}} by mean final accuracy over the tuning seeds "
        f"{list(p.tuning_seeds)}, reported seeds {list(p.seeds)}. Cells: final test accuracy (%) mean ± 95 % "
        "Student-t half-width over the reported seeds, and the chosen lr₀.",
        "",
        selection_note(results, p),
        "",
    ]
    edges = lr_edges(results, p)
    if edges:
        parts += [edges, ""]
    if note:
        parts += [note, ""]
    for table, meta in TABLES.items():
        parts += [f"## {table} — {meta['label'].replace('F', str(F))}", "", table_markdown(results, p, table), ""]
    parts += ["## Trends", "", trends_markdown(ts), "",
              "Statistics are per-seed (paired: same seed = same data split and initial model), then a 95 % "
              "Student-t interval over seeds. *holds*: Holm-adjusted p < 0.05 and the estimate on the expected "
              "side of 0; *contradicted*: p < 0.05 on the other side; *inconclusive*: otherwise.", ""]
    return "\n".join(parts)


def write_outputs(
    results: dict[tuple[str, int, float], CellResult], ts: list[Trend], p: Preset, out: Path, *, command: str,
    wall_seconds: float | None, runs: int, note: str = "",
) -> list[Path]:
    """Write ``report.md``, ``cells.csv`` and ``tension.png`` into ``out`` (atomically); return their paths."""
    text = report_markdown(results, ts, p, command=command, wall_seconds=wall_seconds, runs=runs, note=note)
    return write_report_files(out, text, cells_csv(results), "tension.png", "accuracy vs f",
                              lambda path: plot(results, p, path))


def terminal_tables(results: dict[tuple[str, int, float], CellResult], ts: list[Trend], p: Preset) -> list[Table]:
    """What the terminal shows: the four tables (cells ``mean ± half-width (lr₀)`` in %) and the trend verdicts."""
    from rich.table import Table

    out = []
    for table, meta in TABLES.items():
        t = Table(title=f"{table}: {meta['label'].replace('F', str(p.max_f))} — final accuracy % (lr₀)")
        t.add_column(meta["vary"], justify="right")
        for a in sorted(p.alphas):
            t.add_column(f"α = {a:g}", justify="right")
        for x in range(p.max_f + 1):
            row = [str(x)]
            for a in sorted(p.alphas):
                r = results[(table, x, a)]
                row.append(f"{r.estimate.show(100)} ({r.lr:g})")
            t.add_row(*row)
        out.append(t)
    verdicts = Table(title="Trends (per-seed statistics, 95 % intervals, accuracy points)")
    for c in ("trend", "table", "α", "estimate", "interval", "Holm p", "verdict"):
        verdicts.add_column(c)
    for tr in ts:
        e = tr.estimate
        verdicts.add_row(tr.trend, tr.table, tr.alpha, f"{100 * e.mean:+.2f}",
                         e.interval(100), holm_p(e), tr.verdict)
    out.append(verdicts)
    return out


@register
class Tension(GridStudy[Preset, Cell, float]):
    """The price of robustness (the module's docstring) as a study on the template: ``phalanx experiment tension``,
    also ``phalanx tension paper``. Its two stages are one grid: every (lr₀, seed) of both seed sets is a cell, and
    lr₀ is chosen on the tuning seeds when the report is made (:func:`tabulate`), so the plan is the template's —
    each distinct run validated once. The f = 0 rows of the four tables share their runs (equal run keys, one
    validation): the distinct ones are trained. Its report reads the run keys (the round note under
    ``--set algorithm=fedavg``), so the class writes :meth:`report` rather than the template's ``document``."""

    name = "tension"
    help = ("Yang, Shi & Li (ICML 2025), no attack, n = 16: Tables 3-6 (rows f or f_NNM, columns α), plot, trend "
            "verdicts.")
    preset_type = Preset
    presets = PRESETS
    out = "runs/tension-quick"
    preset_help = "quick (Fashion-MNIST/digits, minutes on a CPU), cpu (the full grids, ~1 h) or paper."
    set_example = "rounds=100"
    raw_value = raw.Share
    functions = GridFunctions(preset, cells, keys, final)

    def runs(self, configs: list[ValidRun]) -> list[ValidRun]:
        return distinct(configs)

    def summary(self, p: Preset, cells: list[Cell], runs: list[ValidRun], out: Path) -> str:
        return (f"[bold]preset {p.name}[/bold]: {p.description}; dataset {p.dataset}; {len(cells)} cells, "
                f"{len(runs)} distinct runs → {out}")

    def report(
        self, p: Preset, cells: list[Cell], collected: dict[Cell, float], out: Path, *, command: str,
        wall_seconds: float | None, runs: int, overrides: dict[str, Any],
    ) -> Report:
        results = tabulate(cells, collected, p.tuning_seeds)
        ts = trends(results, p)
        files = write_outputs(results, ts, p, out, command=command, wall_seconds=wall_seconds, runs=runs,
                              note=round_note(overrides, p))
        edges = lr_edges(results, p)
        return Report(files, [*terminal_tables(results, ts, p), *([edges] if edges else [])])
