"""The executor seam of a grid: who runs the runs that are not finished yet.

:func:`phalanx.experiments.runner.run_grid` decides *what* runs (every point validated up front, finished runs
skipped) and an executor decides *where*: :class:`~phalanx.experiments.local.LocalExecutor` (this process or a pool
of worker processes of this machine; the default) or :class:`~phalanx.experiments.slurm.SlurmExecutor` (a Slurm job
array through ``submitit``). Every executor runs each configuration into its own run directory ``OUT/<run_id>``,
exactly as :func:`~phalanx.experiments.train.train` does, so a grid resumes the same way wherever it ran, and a run
directory holds the whole truth about its run (:mod:`phalanx.experiments.runstate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from phalanx.errors import PhalanxError
from phalanx.experiments import build
from phalanx.experiments.config import RunConfig, ValidRun
from phalanx.experiments.specs import DataSpec, read

RoundCallback = Callable[[RunConfig, int, int], None]
DoneCallback = Callable[[RunConfig, str], None]


@dataclass
class Hooks:
    """What an executor reports while a grid runs: ``on_round(cfg, round, rounds)`` (progress), ``on_done(cfg,
    status)``; ``stopped`` holds the signal that stopped the grid, once one did (executors that poll check it)."""

    on_round: RoundCallback | None = None
    on_done: DoneCallback | None = None
    stopped: list[int] = field(default_factory=list)

    def round(self, cfg: RunConfig, t: int) -> None:
        if self.on_round is not None:
            self.on_round(cfg, t, cfg.rounds)

    def done(self, cfg: RunConfig, status: str) -> None:
        if self.on_done is not None:
            self.on_done(cfg, status)


@dataclass
class Outcome:
    """How the runs an executor was given ended, besides finishing: ``failed`` (an error; the run directory keeps
    a ``FAILED`` marker), ``busy`` (another process held the run directory), ``unfinished`` (the executor's job ended
    without finishing the run and without an error: cancelled, out of time, killed) — each by run directory, with
    the error or a one-line reason. ``submitted``: runs handed to a scheduler that the executor does not wait for
    (by run directory: the job)."""

    failed: dict[Path, BaseException | str] = field(default_factory=dict)
    busy: dict[Path, BaseException | str] = field(default_factory=dict)
    unfinished: dict[Path, str] = field(default_factory=dict)
    submitted: dict[Path, str] = field(default_factory=dict)


class Executor(Protocol):
    """Runs a grid's unfinished runs (each validated once: :class:`~phalanx.experiments.validrun.ValidRun`, with the
    directory it runs into); returns early, leaving each run at its last checkpoint, once ``hooks.stopped``
    holds a signal (or raises :class:`~phalanx.experiments.signals.StopRequested` out of a run in this process)."""

    name: str

    def run(self, todo: list[tuple[ValidRun, Path]], out: Path, hooks: Hooks) -> Outcome: ...


class GridFailed(PhalanxError):
    """Some runs of a grid failed (the others finished): each failed directory keeps a ``FAILED`` marker with its
    error (``phalanx status`` lists them). One line, naming the runs and their errors."""

    def __init__(self, outcome: Outcome, total: int) -> None:
        self.outcome = outcome
        parts = []
        for what, runs in (("failed", outcome.failed), ("in use by another process", outcome.busy),
                           ("not finished", outcome.unfinished)):
            if runs:
                parts.append(f"{len(runs)} {what} ({_grouped(runs)})")
        bad = len(outcome.failed) + len(outcome.busy) + len(outcome.unfinished)
        super().__init__(
            f"{bad} of {total} runs did not finish: " + "; ".join(parts) + ". The other runs finished; fix the cause "
            "and run the same command again (finished runs are skipped, the others resume); `phalanx status` lists "
            "every run"
        )


def _grouped(runs: Mapping[Path, BaseException | str], shown: int = 3) -> str:
    """The runs' errors, each distinct one said once with the runs it stopped (a model every seed of a grid fails
    on is one cause, not five copies of one message): ``RUN: error`` or ``RUN and 4 more: error``; at most ``shown``
    distinct errors, then how many more."""
    by_error: dict[str, list[str]] = {}
    for d, e in runs.items():
        by_error.setdefault(_one_line(e), []).append(Path(d).name)
    parts = [f"{names[0]}{f' and {len(names) - 1} more' if len(names) > 1 else ''}: {error}"
             for error, names in list(by_error.items())[:shown]]
    rest = len(by_error) - shown
    return "; ".join(parts) + (f"; and {rest} more distinct error{'s' if rest > 1 else ''}" if rest > 0 else "")


class Submitted(PhalanxError):
    """The grid's unfinished runs were submitted to a scheduler that the command does not wait for (``detach``):
    not an error (exit status 0); the message says how to follow them and how to collect the results."""

    exit_code = 0

    def __init__(self, outcome: Outcome, out: Path) -> None:
        jobs = ", ".join(sorted(set(outcome.submitted.values())))
        super().__init__(
            f"{len(outcome.submitted)} run(s) submitted (Slurm job {jobs}); `phalanx status {out}` follows them; "
            "run the same command again once they are done to collect the results (finished runs are skipped)"
        )


def _one_line(err: BaseException | str) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# Data sets loaded by this process, by (name, parameters, root): a grid runs many configurations on the same data, and
# parsing Fashion-MNIST's files takes ~2 s (more than a short run). Training never writes into a data set.
_DATASETS: dict[tuple[str, str, str | None], Any] = {}


def dataset_for(spec: DataSpec | RunConfig) -> Any:
    """The configuration's data set, loaded once per process (the last two kept); ``spec``: the run's
    :class:`~phalanx.experiments.specs.DataSpec` (a RunConfig is read into it)."""
    if isinstance(spec, RunConfig):
        spec = read(spec).data
    key = spec.key()
    if key not in _DATASETS:
        while len(_DATASETS) >= 2:
            _DATASETS.pop(next(iter(_DATASETS)))
        _DATASETS[key] = build.load_data(spec)
    return _DATASETS[key]
