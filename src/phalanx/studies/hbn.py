"""BatchNorm under heterogeneity, as a preset: GroupNorm vs BatchNorm vs FedBN vs Hybrid BN in federated training,
with the mean and with a robust rule, over Dirichlet splits — tables with intervals, paired differences, a plot, a
report.

The question of Chen, Xu, Wu & Kittler ("Hybrid Batch Normalisation: resolving the dilemma of batch normalisation
in federated learning", ICML 2025, arXiv 2505.21877): BatchNorm in federated learning has to normalise with
statistics that differ between clients (label skew, Dirichlet α) and that are noisy for small local batches; GroupNorm
avoids statistics altogether; Hybrid BN mixes each batch's statistics with the server's global ones (a learned
per-channel factor) and evaluates with the global ones; FedBN (Li et al., ICLR 2021, arXiv 2102.07623) sidesteps
the dilemma by keeping every client's BatchNorm layers local — no global model at all. Phalanx adds the robustness
question: the statistics are pooled by the server like the updates, so does a robust rule change the picture?

Grid: norm ∈ ``norms`` (``group``, ``batch``, ``fedbn``, ``hybrid`` — :mod:`phalanx.models.norm`) × rule ∈ ``rules``
× α ∈ ``alphas`` × seeds, no attack, FedAvg with ``clients_per_round`` of ``clients`` sampled per round. Per cell: the
final test accuracy, mean and 95 % Student-t interval over seeds. FedBN has one model per client, so its row is a
different measure (:mod:`phalanx.training.algorithms.fedbn`): each evaluated honest client's own model on the test set
re-weighted to its own label mix (``test_accuracy``), and a second row, "FedBN, whole test set", with the same models
on the plain test set (``global_test_accuracy``). Paired differences (same seed = same split, same initial weights
for the layers the variants share) HBN − BN, HBN − GN, BN − GN, FedBN − BN (both measures) per (rule, α), with 95 %
intervals.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.analysis.stats import Estimate, mean_ci
from phalanx.errors import ConfigError
from phalanx.experiments import store
from phalanx.experiments.plots import clipped_errors, save_figure
from phalanx.experiments.validrun import ValidRun
from phalanx.studies import raw
from phalanx.studies.registry import register
from phalanx.studies.reporting import (
    family_note,
    holm_family,
    holm_p,
    pick_preset,
    provenance,
)
from phalanx.studies.template import Document, GridFunctions, GridStudy

NORM_LABELS = {"group": "GroupNorm", "batch": "BatchNorm", "fedbn": "FedBN", "hybrid": "Hybrid BN", "none": "no norm",
               "fedbn-global": "FedBN, whole test set"}
NORMS = ("none", "group", "batch", "fedbn", "hybrid")
"""The normalisations a preset's ``norms`` may name. ``"fedbn-global"`` is not one: it is the second measure of the
FedBN runs (:func:`collect`)."""
FEDBN_GLOBAL = "fedbn-global"


@dataclass(frozen=True)
class Preset:
    """One setting of the experiment."""

    name: str
    description: str
    dataset: str
    model: str = "cnn"
    model_params: dict[str, Any] = field(default_factory=dict)
    clients: int = 100
    clients_per_round: int = 10
    local_steps: int = 10
    local_epochs: float | None = None
    batch_size: int = 4
    lr: float = 0.02
    momentum: float = 0.9
    rounds: int = 100
    schedule: str = "constant"
    stats_batch: int = 64
    stats_momentum: float = 0.1
    norms: tuple[str, ...] = ("group", "batch", "fedbn", "hybrid")
    rules: tuple[tuple[str, int], ...] = (("mean", 0), ("cwtm", 1))
    alphas: tuple[float, ...] = (0.1, 0.5, 1.0)
    seeds: tuple[int, ...] = (0, 1, 2)
    eval_every: int = 50
    eval_clients: int = 100
    fallback_dataset: str | None = None
    device: str = "cpu"
    """The runs' ``device`` (the ``paper`` preset: ``"auto"``, a GPU where there is one)."""


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        name="quick", description="CPU-sized: a small CNN on Fashion-MNIST (digits when absent), 70 rounds",
        dataset="fashion-mnist", model_params={"channels": [8, 16], "hidden": 64}, fallback_dataset="digits",
        rounds=70, eval_every=70, eval_clients=10,
    ),
    "paper": Preset(
        name="paper", description="Chen et al.'s setup (GPU-sized): CIFAR-10, their 3-layer CNN, 1 local epoch of "
        "batch 4, 500 rounds, statistics momentum 0.002",
        dataset="cifar10", model_params={"channels": [16, 32, 64], "kernel_size": 3, "hidden": 128},
        local_epochs=1.0, batch_size=4, lr=0.01, rounds=500, stats_momentum=0.002, eval_every=100, device="auto",
    ),
}


def preset(name: str, **changes: Any) -> Preset:
    """A preset by name with fields replaced (``seeds=(0, 1, 2, 3)``, ``rounds=50``, ...), checked."""
    p = pick_preset(PRESETS, name, changes, ("norms", "rules", "alphas", "seeds"))
    bad = [n for n in p.norms if n not in NORMS]
    if bad:
        raise ConfigError("norms", list(p.norms), "names among " + ", ".join(NORMS))
    return p


@dataclass(frozen=True)
class Cell:
    """One run: a normalisation, a rule (spec, f), a Dirichlet α and a seed."""

    norm: str
    rule: str
    f: int
    alpha: float
    seed: int


def cells(p: Preset) -> list[Cell]:
    """Every run of the grid."""
    return [Cell(n, r, f, a, s) for n in p.norms for r, f in p.rules for a in p.alphas for s in p.seeds]


def keys(p: Preset, cell: Cell) -> dict[str, Any]:
    """The run keys of one cell (no attack)."""
    data: dict[str, Any] = {
        "algorithm": "fedavg", "dataset": p.dataset, "model": p.model,
        "model_params": {**p.model_params, "norm": cell.norm}, "workers": p.clients,
        "clients_per_round": p.clients_per_round, "local_steps": p.local_steps, "local_epochs": p.local_epochs,
        "batch_size": p.batch_size, "lr": p.lr, "momentum": p.momentum, "schedule": p.schedule,
        "byzantine": 0, "f": cell.f, "aggregator": cell.rule, "attack": "none", "partition": "dirichlet",
        "alpha": cell.alpha, "rounds": p.rounds, "seed": cell.seed, "eval_every": p.eval_every,
        "checkpoint_every": max(p.eval_every, p.rounds // 4 or 1), "device": p.device,
    }
    if cell.norm in ("batch", "hybrid"):
        data.update(stats_batch=p.stats_batch, stats_momentum=p.stats_momentum)
    if cell.norm == "fedbn":
        data.update(eval_clients=p.eval_clients)
    return data


@dataclass
class Result:
    """A table cell: per-seed final accuracies and their mean with a 95 % interval."""

    norm: str
    rule: str
    f: int
    alpha: float
    per_seed: dict[int, float]
    estimate: Estimate


@dataclass(frozen=True)
class Difference:
    """A paired difference of two normalisations at one (rule, α): per-seed accuracy differences, 95 % interval."""

    a: str
    b: str
    rule: str
    f: int
    alpha: float
    estimate: Estimate

    @property
    def verdict(self) -> str:
        return self.estimate.side(f"{NORM_LABELS[self.b]} better", f"{NORM_LABELS[self.a]} better")


def tabulate(cs: list[Cell], accuracy: dict[Cell, float]) -> dict[tuple[str, str, int, float], Result]:
    """Group the runs into cells (norm, rule, f, α) with their per-seed accuracies (and the FedBN runs' second
    measure, the cells of :func:`collect` not in ``cs``)."""
    groups: dict[tuple[str, str, int, float], dict[int, float]] = {}
    listed = set(cs)
    for c in [*cs, *(c for c in accuracy if c not in listed)]:
        groups.setdefault((c.norm, c.rule, c.f, c.alpha), {})[c.seed] = accuracy[c]
    return {k: Result(*k, per_seed=v, estimate=mean_ci(list(v.values()))) for k, v in groups.items()}


def table_norms(p: Preset) -> list[str]:
    """The table's rows per rule: the preset's norms, with FedBN's whole-test-set measure after FedBN."""
    return [m for n in p.norms for m in ((n, FEDBN_GLOBAL) if n == "fedbn" else (n,))]


def differences(results: dict[tuple[str, str, int, float], Result], p: Preset) -> list[Difference]:
    """Hybrid BN − BatchNorm, Hybrid BN − GroupNorm, BatchNorm − GroupNorm and FedBN − BatchNorm (both of FedBN's
    measures; those present), per rule and α, paired by seed; one Holm family (the report reads them all)."""
    rows = table_norms(p)
    pairs = [(a, b) for a, b in (("hybrid", "batch"), ("hybrid", "group"), ("batch", "group"), ("fedbn", "batch"),
                                 (FEDBN_GLOBAL, "batch"))
             if a in rows and b in rows and all((a, r, f, al) in results for r, f in p.rules for al in p.alphas)]
    out = []
    for a, b in pairs:
        for rule, f in p.rules:
            for alpha in p.alphas:
                ra, rb = results[(a, rule, f, alpha)], results[(b, rule, f, alpha)]
                seeds = sorted(set(ra.per_seed) & set(rb.per_seed))
                est = mean_ci([ra.per_seed[s] - rb.per_seed[s] for s in seeds])
                out.append(Difference(a, b, rule, f, alpha, est))
    return holm_family(out)


def _rule_label(rule: str, f: int) -> str:
    return rule if rule == "mean" else f"{rule} f={f}"


def table_markdown(results: dict[tuple[str, str, int, float], Result], p: Preset) -> str:
    """Rows: (rule, norm); columns: α; cells: accuracy % mean ± half-width."""
    head = "| rule | norm | " + " | ".join(f"α = {a:g}" for a in p.alphas) + " |"
    lines = [head, "|" + "---|" * (2 + len(p.alphas))]
    for rule, f in p.rules:
        for norm in table_norms(p):
            if (norm, rule, f, p.alphas[0]) not in results:
                continue
            cells_ = [results[(norm, rule, f, a)].estimate for a in p.alphas]
            lines.append(f"| {_rule_label(rule, f)} | {NORM_LABELS[norm]} | "
                         + " | ".join(e.show(100) for e in cells_) + " |")
    return "\n".join(lines)


def differences_markdown(ds: list[Difference]) -> str:
    """One line per paired difference: estimate, interval, Holm-adjusted p, verdict; the family's note under it."""
    lines = ["| difference | rule | α | points | 95 % interval | Holm p | verdict |", "|---|---|---|---|---|---|---|"]
    for d in ds:
        e = d.estimate
        lines.append(f"| {NORM_LABELS[d.a]} − {NORM_LABELS[d.b]} | {_rule_label(d.rule, d.f)} | {d.alpha:g} | "
                     f"{100 * e.mean:+.2f} | {e.interval(100)} | {holm_p(e)} | {d.verdict} |")
    return "\n".join(lines) + "\n\n" + family_note(d.estimate for d in ds)


def cells_csv(results: dict[tuple[str, str, int, float], Result]) -> str:
    """Every cell: its keys, mean, interval and per-seed accuracies."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["norm", "rule", "f", "alpha", "mean", "low", "high", "per_seed"])
    for (norm, rule, f, alpha), r in sorted(results.items()):
        e = r.estimate
        w.writerow([norm, rule, f, alpha, f"{e.mean:.6f}", f"{e.low:.6f}", f"{e.high:.6f}",
                    " ".join(f"{s}:{v:.6f}" for s, v in sorted(r.per_seed.items()))])
    return buf.getvalue()


def plot(results: dict[tuple[str, str, int, float], Result], p: Preset, path: Path) -> Path:
    """Accuracy vs α, a line per normalisation with its 95 % intervals (clipped to 0 … 100 %; one seed's, unbounded,
    spans it all), a panel per rule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(p.rules), figsize=(5 * len(p.rules), 3.8), squeeze=False, sharey=True)
    alphas = sorted(p.alphas)
    lines = [n for n in table_norms(p) if all((n, r, f, a) in results for r, f in p.rules for a in alphas)]
    for ax, (rule, f) in zip(axes[0], p.rules):
        for i, norm in enumerate(lines):
            es = [results[(norm, rule, f, a)].estimate for a in alphas]
            shift = 1.04 ** (i - (len(lines) - 1) / 2)  # side by side, so that the intervals do not hide each other
            means = [100 * e.mean for e in es]
            errs = clipped_errors(means, [100 * e.low for e in es], [100 * e.high for e in es])
            ax.errorbar([a * shift for a in alphas], means, yerr=errs, marker="o", capsize=3, label=NORM_LABELS[norm])
        ax.set_xscale("log")
        ax.set_xticks(alphas, [f"{a:g}" for a in alphas])
        ax.set_xlabel("Dirichlet α (smaller: more heterogeneous)")
        ax.set_title(_rule_label(rule, f))
        ax.grid(alpha=0.3)
    lows = [100 * r.estimate.low for r in results.values()]
    axes[0][0].set_ylim(max(0.0, min(lows) - 5), 100)
    axes[0][0].set_ylabel("final test accuracy %")
    axes[0][-1].legend()
    fig.suptitle(f"FedAvg, {p.clients} clients ({p.clients_per_round} a round), {p.dataset}, {p.model}, "
                 f"batch {p.batch_size}, {p.rounds} rounds, {len(p.seeds)} seeds (95 % intervals)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def report_markdown(
    results: dict[tuple[str, str, int, float], Result], ds: list[Difference], p: Preset, *, command: str,
    wall_seconds: float | None, runs: int,
) -> str:
    """The whole report: setup, the accuracy table, the paired differences."""
    steps = f"{p.local_epochs:g} local epoch(s)" if p.local_epochs is not None else f"{p.local_steps} local steps"
    parts = [
        f"# BatchNorm under heterogeneity — preset `{p.name}`", "",
        *provenance(command, wall_seconds, runs), "",
        f"Setup: FedAvg, no attack, {p.clients} clients with {p.clients_per_round} sampled per round, {steps} of "
        f"batch {p.batch_size}, client lr {p.lr:g} with momentum {p.momentum:g}, {p.rounds} rounds; {p.dataset}, "
        f"model {p.model} {p.model_params}; Dirichlet α ∈ {{{', '.join(f'{a:g}' for a in p.alphas)}}}; BatchNorm / "
        f"Hybrid BN statistics measured on {p.stats_batch} samples per sampled client, pooled by a trimmed mean at "
        f"the rule's f, momentum {p.stats_momentum:g}; seeds {list(p.seeds)}. Cells: final test accuracy (%) mean "
        "± 95 % Student-t half-width over the seeds.", "",
        *([f"FedBN has no global model: its row is the mean over {p.eval_clients} evenly spaced honest clients (or "
           "all, if fewer) of each client's own model (shared weights + its BatchNorm layers) on the test set "
           "re-weighted to that client's label mix (Σ_c p_ic · acc_i(c)), the analogue of the FedBN authors' "
           "per-client test splits; the row \"FedBN, whole test set\" is the same models on the plain test set. The "
           "other rows are one global model on the plain test set.", ""] if "fedbn" in p.norms else []),
        "## Accuracy", "", table_markdown(results, p), "",
        "## Paired differences (accuracy points, same seed = same split)", "", differences_markdown(ds), "",
    ]
    return "\n".join(parts)


def final(cell: Cell, run: ValidRun, rows: list[dict[str, Any]]) -> float:
    """The final accuracy (``test_accuracy``) of a cell's ended run."""
    return float(rows[-1]["test_accuracy"])


@register
class HBN(GridStudy[Preset, Cell, float]):
    """BatchNorm under heterogeneity (the module's docstring) as a study: ``phalanx experiment hbn``."""

    name = "hbn"
    help = ("BatchNorm under heterogeneity (Chen et al., ICML 2025): GroupNorm vs BatchNorm vs FedBN vs Hybrid BN in "
            "federated training over Dirichlet splits, with the mean and a robust rule; table, paired differences, "
            "plot.")
    preset_type = Preset
    presets = PRESETS
    out = "runs/hbn-quick"
    preset_help = "quick (CPU, ≤ 30 min) or paper (CIFAR-10, GPU)."
    set_example = "rounds=50"

    functions = GridFunctions(preset, cells, keys, final)
    raw_value = raw.Share

    def collect(self, cells: list[Cell], configs: list[ValidRun], runs_dir: Path) -> dict[Cell, float]:
        """:func:`final` of every cell's run; for a FedBN run also its ``global_test_accuracy``, under the same cell
        with norm ``"fedbn-global"``."""
        out = super().collect(cells, configs, runs_dir)
        for c, r in zip(cells, configs):
            if c.norm == "fedbn":
                last = store.finished_rows(runs_dir / r.run_id)[-1]
                out[Cell(FEDBN_GLOBAL, c.rule, c.f, c.alpha, c.seed)] = float(last["global_test_accuracy"])
        return out

    def raw_cells(self, p: Preset, cells: list[Cell], configs: list[ValidRun]) -> tuple[list[Cell], list[str]]:
        """The planned cells, then each FedBN cell's whole-test-set accuracy (norm ``fedbn-global``, read from the
        same run: :func:`collect`)."""
        from phalanx.studies import raw

        ids = raw.run_ids(configs)
        extra = [(Cell(FEDBN_GLOBAL, c.rule, c.f, c.alpha, c.seed), i) for c, i in zip(cells, ids) if c.norm == "fedbn"]
        return [*cells, *(c for c, _ in extra)], [*ids, *(i for _, i in extra)]

    def document(
        self, p: Preset, cells: list[Cell], collected: dict[Cell, float], *, command: str,
        wall_seconds: float | None, runs: int,
    ) -> Document:
        results = tabulate(cells, collected)
        diffs = differences(results, p)
        return Document(report_markdown(results, diffs, p, command=command, wall_seconds=wall_seconds, runs=runs),
                        cells_csv(results), "hbn.png", "accuracy vs alpha", lambda path: plot(results, p, path),
                        [table_markdown(results, p) + "\n\n" + differences_markdown(diffs)])
