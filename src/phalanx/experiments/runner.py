"""Run a grid of configurations, skipping finished runs, on an executor (this machine by default, or Slurm).

Each configuration gets its own run directory ``OUT/<run_id>``; a finished run (``DONE``, or ``DIVERGED``: it would
diverge again) is skipped once what it recorded is checked (:mod:`phalanx.experiments.ended`), an unfinished one
resumes from its checkpoint. So a killed sweep, started again, redoes no finished run and no round before the last
checkpoint. The grid's run ids are recorded in ``OUT/grid.json`` so
that ``phalanx status OUT`` can list the runs not started yet.

A run that fails does not stop the others: its directory keeps a ``FAILED`` marker with the error, and once the
others are done :func:`run_grid` raises :class:`~phalanx.experiments.executor.GridFailed`, naming the failed runs
(a grid of one run raises that run's own error).

Interruptions: the first SIGINT (Ctrl-C) or SIGTERM stops the grid cleanly — no new run starts, the worker processes
end (each run keeps its last checkpoint) and so does the progress queue's manager process — and :func:`run_grid`
raises :class:`Interrupted`, which says how many runs finished (the CLI prints it as one line and exits with 130 or
143). The worker processes ignore the terminal's SIGINT: the sweep that started them decides when they stop.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from phalanx import PhalanxError, code_digest
from phalanx.experiments import ended, runstate, status, store
from phalanx.experiments.build import check_points
from phalanx.experiments.config import RunConfig, ValidRun, validate
from phalanx.experiments.executor import (
    DoneCallback,
    Executor,
    GridFailed,
    Hooks,
    RoundCallback,
    Submitted,
    dataset_for,
)
from phalanx.experiments.local import LocalExecutor
from phalanx.experiments.signals import STOP_SIGNALS, Interrupted, StopRequested, stop_on_signals

__all__ = [
    "STOP_SIGNALS", "GridFailed", "Interrupted", "StopRequested", "Submitted", "dataset_for", "run_grid",
    "stop_on_signals",
]


def _counts(dirs: list[Path]) -> tuple[int, int]:
    """(finished, total) distinct runs among ``dirs``."""
    distinct = set(dirs)
    return sum(runstate.is_final(d) for d in distinct), len(distinct)


def run_grid(
    points: Sequence[ValidRun | RunConfig], out: Path, *, jobs: int = 1, executor: Executor | None = None,
    on_round: RoundCallback | None = None, on_done: DoneCallback | None = None, wait: bool = False,
    before: Callable[[list[tuple[ValidRun, Path]]], None] | None = None,
) -> list[Path]:
    """Run every configuration into ``out/<run_id>`` on ``executor`` (default: this machine with ``jobs`` worker
    processes; ``wait``: wait for run directories another process holds instead of reporting them busy); return the
    run directories (in the order of ``points``: validated runs, or configs validated here). ``before`` is called with
    the unfinished runs (validated run, directory) once every point is checked, before the first starts (the command
    line says how long they should take). The hooks receive each run's config.

    SIGINT or SIGTERM while it runs stops it cleanly: :class:`Interrupted` (see the module's docstring).
    """
    runs = [p if isinstance(p, ValidRun) else validate(p) for p in points]
    # every point can run, before the first one starts (its device: where it trains, not on a Slurm login node)
    check_points(runs, dataset_for, here=executor is None or executor.name == "local")
    store.make_dir(out)
    dirs = [out / r.run_id for r in runs]
    executor = executor if executor is not None else LocalExecutor(jobs, wait=wait)
    status.record_grid(out, dirs, executor.name)
    seen: set[Path] = set()  # the same configuration twice in a grid is one run (one directory, one process)
    todo = []
    for r, d in zip(runs, dirs):
        if d not in seen and not runstate.is_final(d):
            todo.append((r, d))
        seen.add(d)
    hooks = Hooks(on_round, on_done)
    for c, d in zip((r.cfg for r in runs), dirs):
        if runstate.is_final(d):  # finished or diverged: held to the same checks before it is skipped and reported
            ended.check(d, c)
            check_same_data(d, dataset_for(c))
            hooks.done(c, "skipped (finished)" if store.is_finished(d) else "skipped (diverged)")
    say_other_code(sorted(set(dirs)))
    if before is not None and todo:
        before(todo)
    try:
        outcome = executor.run(todo, out, hooks)
    except StopRequested as stop:
        raise Interrupted(stop.signum, *_counts(dirs)) from None
    if hooks.stopped:
        raise Interrupted(hooks.stopped[0], *_counts(dirs), detail=getattr(executor, "interrupted_detail", None))
    if len(todo) == 1:  # a grid of one run: its own error, as it was raised
        for err in (*outcome.failed.values(), *outcome.busy.values()):
            if isinstance(err, BaseException):
                raise err
    if outcome.submitted:
        raise Submitted(outcome, out)
    if outcome.failed or outcome.busy or outcome.unfinished:
        raise GridFailed(outcome, len(set(dirs)))
    for r, d in todo:  # trained here under both keys: verified and pinned as a reused run is, before any report
        ended.check_trained(d, r.cfg)
    return dirs


def check_same_data(run_dir: Path, dataset: object) -> None:
    """Before a grid skips the ended run in ``run_dir``: the data set its manifest records is ``dataset`` (the one
    this grid loaded for its config, already in the process's cache: hashed once per data set, as a resume does).
    A run is named by its configuration, not by its data, so a run under the same ``data_root`` whose files changed
    since was reused as it was, its rows reported as this grid's (an earlier note). A :class:`ProvenanceError`
    naming the run and both fingerprints; ``PHALANX_FORCE=1`` (``--force``) reuses it anyway. Lazily read
    populations record no fingerprint and are not compared."""
    from phalanx.data.base import Dataset
    from phalanx.experiments.provenance import ProvenanceError

    recorded = store.recorded_fingerprint(run_dir)
    if recorded is None or not isinstance(dataset, Dataset) or store.forced():
        return
    current = dataset.fingerprint()
    if recorded != current:
        raise ProvenanceError(str(run_dir), f"it was trained on the data set of fingerprint {recorded[:12]}…, and "
                              f"this grid's data set has fingerprint {current[:12]}… (its files changed since, or "
                              "another copy was found)", f"delete {run_dir} to train it again on this data, give "
                              "another --out, or pass --force (PHALANX_FORCE=1) to reuse it as it is")


def say_other_code(dirs: list[Path]) -> int:
    """One line on stderr when some of ``dirs`` — runs this grid reuses (ended) or goes on with (started) — were
    started by other code than this installation's (their manifest's ``code`` differs from
    :func:`phalanx.code_digest`, or predates it): their rows are reused as they are, so a reader knows a grid may mix
    code versions (``__version__`` does not change with every commit that changes results). Returns how many."""
    started = [d for d in dirs if (d / store.MANIFEST).exists()]
    other = [d for d in started if _recorded_code(d) != code_digest()]
    if other:
        print(f"phalanx: {len(other)} of the {len(started)} run(s) found in {other[0].parent} were started by other "
              f"code than this installation's (their manifest.json records another 'code' digest, or none), e.g. "
              f"{other[0].name}; their results are reused as they are — train them again with this code in a new "
              "--out (or after deleting their directories)", file=sys.stderr, flush=True)
    return len(other)


def _recorded_code(run_dir: Path) -> str | None:
    """The code digest ``run_dir``'s manifest records; None where none is recorded or the manifest cannot be read —
    this line informs, it never stops a grid (a damaged manifest is the run's own error, or ``--force``'s to pass:
    a review found one unreadable manifest stopping every run of the grid here)."""
    try:
        return store.recorded_fingerprint(run_dir, "code")
    except (PhalanxError, OSError, ValueError):
        return None
