# examples/plugins/mylab/studies.py
"""A study of one's own: does worker momentum help a robust rule against ALIE? (Karimireddy, He & Jaggi, "Learning
from history for Byzantine robust optimization", ICML 2021, say it does.)

Grid: rule × worker momentum × seeds, n workers of which b send ALIE, every rule configured for f = b. Per cell:
the final test accuracy, mean ± 95 % Student-t half-width over the seeds.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.analysis.stats import Estimate, mean_ci
from phalanx.experiments import grid, make_config
from phalanx.experiments.config import RunConfig
from phalanx.experiments.plots import save_figure
from phalanx.studies import Report, Study
from phalanx.studies.reporting import final_accuracy, provenance, write_report_files


@dataclass(frozen=True)
class Preset:
    """One setting of the study (``--set rounds=20`` changes a field)."""

    name: str
    description: str
    dataset: str = "digits"
    fallback_dataset: str | None = None
    workers: int = 10
    byzantine: int = 2
    rules: tuple[str, ...] = ("cwtm", "cwmed")
    momenta: tuple[float, ...] = (0.0, 0.9)
    rounds: int = 60
    seeds: tuple[int, ...] = (0, 1, 2)


PRESETS = {"quick": Preset("quick", "an MLP on the built-in digits, 10 workers of which 2 send ALIE")}


@dataclass(frozen=True)
class Cell:
    """One run: a rule, a worker momentum, a seed."""

    rule: str
    momentum: float
    seed: int


class Momentum(Study[Preset, Cell, float]):
    """Worker momentum against ALIE, per rule."""

    name = "momentum"
    help = "Worker momentum against ALIE (Karimireddy et al., ICML 2021): each rule's final accuracy with and without."
    preset_type = Preset
    presets = PRESETS
    out = "runs/momentum-quick"

    def plan(self, p: Preset, overrides: dict[str, Any]) -> tuple[list[Cell], list[RunConfig]]:
        cells = [Cell(r, m, s) for r in p.rules for m in p.momenta for s in p.seeds]
        configs = [make_config({
            "dataset": p.dataset, "model": "mlp", "workers": p.workers, "byzantine": p.byzantine, "f": p.byzantine,
            "aggregator": c.rule, "attack": "alie", "momentum": c.momentum, "rounds": p.rounds,
            "eval_every": p.rounds, "seed": c.seed, **overrides,
        }) for c in cells]
        return cells, configs

    def collect(self, cells: list[Cell], configs: list[RunConfig], runs_dir: Path) -> dict[Cell, float]:
        return {c: final_accuracy(runs_dir / grid.run_id(cfg)) for c, cfg in zip(cells, configs)}

    def report(self, p: Preset, cells: list[Cell], collected: dict[Cell, float], out: Path, *, command: str,
               wall_seconds: float | None, runs: int, overrides: dict[str, Any]) -> Report:
        acc = {(r, m): mean_ci([collected[Cell(r, m, s)] for s in p.seeds]) for r in p.rules for m in p.momenta}
        lines = ["| rule | " + " | ".join(f"momentum {m:g}" for m in p.momenta) + " |",
                 "|---|" + "---|" * len(p.momenta)]
        for r in p.rules:
            lines.append(f"| {r} | " + " | ".join(f"{100 * acc[(r, m)].mean:.1f} ± {100 * acc[(r, m)].half_width:.1f}"
                                                  for m in p.momenta) + " |")
        table = "\n".join(lines)
        text = "\n".join([f"# Worker momentum against ALIE — preset `{p.name}`", "",
                          *provenance(command, wall_seconds, runs), "", table, ""])
        csv = "rule,momentum,mean,low,high\n" + "".join(f"{r},{m},{e.mean:.6f},{e.low:.6f},{e.high:.6f}\n"
                                                        for (r, m), e in acc.items())
        files = write_report_files(out, text, csv, "momentum.png", "accuracy vs momentum",
                                   lambda path: plot(acc, p, path))
        return Report(files, [table])


def plot(acc: dict[tuple[str, float], Estimate], p: Preset, path: Path) -> Path:
    """Final accuracy vs worker momentum, a line per rule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in p.rules:
        ax.plot(p.momenta, [100 * acc[(r, m)].mean for m in p.momenta], marker="o", label=r)
    ax.set_xlabel("worker momentum")
    ax.set_ylabel("final test accuracy %")
    ax.legend()
    return save_figure(fig, path)
