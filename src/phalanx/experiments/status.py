"""The state of a grid's output directory, run by run: what ``phalanx status OUT`` prints.

A grid records the run ids it is made of in ``OUT/grid.json`` (the union over every command that wrote into
``OUT``, with the executor and, under Slurm, the job arrays it submitted), so that runs not started yet are listed
too; every other fact comes from the run directories themselves (:mod:`phalanx.experiments.runstate`) — the same
on the machine that submitted a Slurm array and on any other that sees the shared file system.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx import waits
from phalanx.errors import OutputError
from phalanx.experiments import runfiles, runstate, store

GRID = "grid.json"
GRID_LOCK_TIMEOUT_S = 60.0
"""How long a command waits for ``OUT/.grid.lock``: its holders keep it for one read and one atomic write."""


@contextmanager
def _grid_lock(out: Path) -> Iterator[None]:
    """Serialise read-modify-write of ``grid.json`` between commands writing into the same ``OUT``; a lock held past
    :data:`GRID_LOCK_TIMEOUT_S` (another command holds it for milliseconds; anyone who can open the file in a shared
    ``OUT`` can hold it for ever) is an :class:`~phalanx.errors.OutputError` naming the file."""
    path = out / ".grid.lock"
    fd = store.open_lock(path)  # a link, FIFO or hard link planted there is refused, never followed
    try:
        if not waits.flock(fd, fcntl.LOCK_EX, GRID_LOCK_TIMEOUT_S):
            raise OutputError(str(out / GRID), f"{path} was held by other processes for {GRID_LOCK_TIMEOUT_S:g} s",
                              "a process on this machine or another sharing the folder holds it (fuser or lsof on the "
                              "file finds one on this machine); end it, then run the command again")
        yield
    finally:
        os.close(fd)


def _empty() -> dict[str, Any]:
    return {"runs": [], "slurm_jobs": []}


def read_grid(out: Path) -> dict[str, Any]:
    """What ``OUT/grid.json`` says (an empty record if there is none or it cannot be read).

    ``OUT`` may be a shared folder whose co-users can write it, so the file is read as every run-directory file is
    (:func:`phalanx.experiments.runfiles.read_json_object`: a regular file only, opened without blocking, at most
    :data:`~phalanx.experiments.runfiles.MAX_JSON_BYTES`, nesting and over-long numbers refused), and its shape is
    checked: ``runs`` keeps only run ids (plain names: none leads out of ``OUT``), ``slurm_jobs`` only the entries
    :func:`record_slurm_job` writes;
    anything else is dropped (and the next write of the record leaves it out)."""
    try:
        data = runfiles.read_json_object(Path(out) / GRID)
    except (OSError, ValueError):  # missing, unreadable, too large, not a JSON object (ConfigError is a ValueError)
        return _empty()
    runs, jobs = data.get("runs"), data.get("slurm_jobs")
    data["runs"] = [r for r in runs if isinstance(r, str) and store.plain_name(r)] if isinstance(runs, list) else []
    data["slurm_jobs"] = [j for j in jobs if _job_ok(j)] if isinstance(jobs, list) else []
    return data


def _job_ok(job: Any) -> bool:
    """Whether a ``slurm_jobs`` entry is one :func:`record_slurm_job` writes: a job id, and per task a list of run
    ids."""
    return (isinstance(job, dict) and isinstance(job.get("job"), str) and isinstance(job.get("runs", []), list)
            and all(isinstance(t, list) and all(isinstance(n, str) and store.plain_name(n) for n in t)
                    for t in job.get("runs", [])))


def _update(out: Path, change: dict[str, Any]) -> None:
    with _grid_lock(out):
        data = read_grid(out)
        runs = list(dict.fromkeys([*data["runs"], *change.pop("runs", [])]))
        jobs = [*data["slurm_jobs"], *change.pop("slurm_jobs", [])]
        data.update(change, runs=runs, slurm_jobs=jobs, updated=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        store.atomic_write_text(out / GRID, json.dumps(data, indent=2) + "\n")


def record_grid(out: Path, dirs: list[Path], executor: str) -> None:
    """Add the grid's runs (their directories under ``out``) to ``OUT/grid.json``."""
    _update(Path(out), {"runs": [Path(d).name for d in dirs], "executor": executor})


def record_slurm_job(out: Path, job_id: str, runs: list[list[str]], folder: str) -> None:
    """Record a submitted Slurm job array: its id, the runs each of its tasks trains, and its log folder."""
    _update(Path(out), {"slurm_jobs": [{"job": job_id, "runs": runs, "logs": folder,
                                        "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z")}]})


@dataclass(frozen=True)
class RunStatus:
    """One run of a grid: its id, state, last recorded round and total rounds (when known), and a detail."""

    run: str
    status: str
    round: int | None
    rounds: int | None
    detail: str


def recorded_config(run_dir: Path) -> dict[str, Any]:
    """The config a run directory recorded (``config.json``), or {} where it cannot be read: for what a listing or a
    report shows, not for resuming (a resume checks it against the config asked for)."""
    try:
        cfg = runfiles.read_json(run_dir / "config.json")
    except (OSError, ValueError):  # missing, unreadable, too large, not JSON (ConfigError is a ValueError)
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _rounds(run_dir: Path) -> int | None:
    value = recorded_config(run_dir).get("rounds")
    return value if isinstance(value, int) else None


def runs_of(out: Path) -> list[str]:
    """The run ids of ``out``: those ``grid.json`` records, then any other run directory found there."""
    out = Path(out)
    listed = read_grid(out)["runs"]
    found = sorted(p.name for p in out.iterdir() if p.is_dir() and (p / "config.json").exists()) if out.is_dir() else []
    return list(dict.fromkeys([*listed, *found]))


def grid_status(out: Path, queued: Mapping[str, str] | None = None) -> list[RunStatus]:
    """Every run of ``out`` with its state; a run not running yet whose id is in ``queued`` (its scheduler task
    and the task's state, ``"1234_5 PENDING"``) is reported as ``queued``."""
    rows = []
    for name in runs_of(out):
        d = Path(out) / name
        st = runstate.state(d)
        status, detail = st.status, st.detail
        if status in ("pending", "stopped", "failed") and queued and name in queued:
            task, _, state = queued[name].partition(" ")
            doing = "starting" if state == "RUNNING" else state.lower() or "queued"
            status, detail = "queued", f"Slurm task {task} {doing} (the run was {st.status})"
        rows.append(RunStatus(name, status, st.round, _rounds(d), detail))
    return rows


def counts(rows: list[RunStatus]) -> dict[str, int]:
    """How many runs are in each state."""
    return dict(Counter(r.status for r in rows))
