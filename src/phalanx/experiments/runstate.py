"""Who is running a run directory, and how a run ended: the lock, the ``FAILED`` marker, and the state of a run as
``phalanx status`` reports it.

**The lock.** A process that trains into a run directory holds an exclusive ``flock`` on its ``.lock`` file for as
long as it trains (the operating system drops it when the process ends, however it ends — a crash or SIGKILL leaves
no stale lock). A second process on the same directory — a second ``phalanx run``, a sweep re-submitted while the
first array still runs, a torchrun job started twice — is refused with :class:`RunInUse`, which says who holds it
(host, process, Slurm job); asked to wait (``wait=True``), it waits until the first one is done (polling the lock: a
Ctrl-C ends the wait at once, :mod:`phalanx.waits`), then sees the run finished and has nothing left to do. The lock
file also records its holder, for ``phalanx status``. ``flock`` is honoured across the machines of a cluster on NFSv4
and Lustre (with ``flock`` mount option); on file systems without it, the lock is per machine.

**Failures.** A run that stops on an error (not a signal) leaves ``FAILED``: the error's type and message, when and
where; it is cleared when the run starts again. A sweep goes on with its other runs and lists the failed ones at the
end.

**States** (:func:`state`): ``done`` (``DONE``), ``diverged`` (``DIVERGED``: the model became non-finite; a final
state like ``done``: the same run would diverge again), ``running`` (the lock is held), ``failed`` (``FAILED``),
``stopped`` (started, not running, resumes from its checkpoint), ``pending`` (not started).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx import waits
from phalanx.errors import PhalanxError
from phalanx.experiments import dirfd, runfiles, store
from phalanx.training.divergence import Diverged

LOCK = ".lock"
FAILED = "FAILED"
DIVERGED = store.DIVERGED
STATES = ("done", "diverged", "running", "failed", "stopped", "pending")


class RunInUse(PhalanxError, RuntimeError):
    """The run directory is being trained into by another process (named with its host, process id and, under
    Slurm, job id)."""

    def __init__(self, path: Path, holder: dict[str, Any]) -> None:
        self.path = str(path)
        self.holder = holder
        super().__init__(
            f"{path}: in use by {describe_holder(holder)}; wait for it to finish (or stop it), or pass --wait to "
            "wait for it here"
        )


def describe_holder(holder: dict[str, Any]) -> str:
    """``process 123 on node7 (Slurm job 45_2) since 2026-12-01T03:00:00+0000`` — as much as the lock file says."""
    if not holder:
        return "another process"
    text = f"process {holder.get('pid', '?')} on {holder.get('host', '?')}"
    if holder.get("slurm_job"):
        text += f" (Slurm job {holder['slurm_job']})"
    if holder.get("since"):
        text += f" since {holder['since']}"
    return text


def _slurm_job() -> str | None:
    """This process's Slurm job as ``squeue`` names it (``ARRAYJOB_TASK`` for an array task), if under Slurm."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _read_json(path: Path) -> dict[str, Any]:
    """A marker or lock file's JSON object, read with bounded memory (``{}`` if it cannot be read as one)."""
    try:
        data = runfiles.read_json(path, runfiles.MAX_MARKER_BYTES)
    except (OSError, ValueError):  # missing, unreadable, too large, not JSON (ConfigError is a ValueError)
        return {}
    return data if isinstance(data, dict) else {}


@contextmanager
def locked(run_dir: Path, *, wait: bool = False) -> Iterator[None]:
    """Hold the run directory's lock inside the block (see the module's docstring); :class:`RunInUse` if another
    process holds it, or, with ``wait``, wait until it is free (a stop ends the wait)."""
    run_dir = Path(run_dir)
    with dirfd.held(run_dir), _lock(run_dir, wait):  # the directory checked by its descriptor, held while it is used
        yield


@contextmanager
def _lock(run_dir: Path, wait: bool) -> Iterator[None]:
    path = run_dir / LOCK
    fd = store.open_lock(path)  # a link, FIFO or hard link planted there is refused, never written through
    try:
        if not waits.flock(fd, fcntl.LOCK_EX, None if wait else 0.0):  # (a Ctrl-C ends the wait: phalanx.waits)
            raise RunInUse(run_dir, _read_json(path))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "slurm_job": _slurm_job(), "since": _now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def holder(run_dir: Path) -> dict[str, Any] | None:
    """Who holds the run directory's lock now (what its lock file says), or ``None`` when nobody does."""
    path = Path(run_dir) / LOCK
    try:  # a FIFO does not block the open, a link is not followed: neither is a lock Phalanx made
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_json(path)
        return None
    finally:
        os.close(fd)


@contextmanager
def recording_failure(run_dir: Path) -> Iterator[None]:
    """Inside the block a run trains: an earlier ``FAILED`` marker is removed first; an error (an ``Exception``, not
    a stop signal) leaves a new one — its type and message, when and where — and goes on up."""
    run_dir = Path(run_dir)
    dirfd.unlink(run_dir, FAILED)
    try:
        yield
    except Diverged:  # an end of the run, not an error (DIVERGED records it)
        raise
    except Exception as exc:
        record = {"error": type(exc).__name__, "message": str(exc)[:2000], "when": _now(),
                  "host": socket.gethostname(), "pid": os.getpid(), "slurm_job": _slurm_job()}
        try:
            with store.writing(run_dir / FAILED):
                dirfd.write(run_dir, FAILED, (json.dumps(record) + "\n").encode())
        except PhalanxError:  # the disk that failed the run may fail this too: the error itself matters more
            pass
        raise


def failure(run_dir: Path) -> dict[str, Any] | None:
    """What the ``FAILED`` marker says (``None`` without one)."""
    path = Path(run_dir) / FAILED
    if not path.exists():
        return None
    return _read_json(path) or {"error": "?", "message": "(unreadable FAILED marker)"}


def divergence(run_dir: Path) -> dict[str, Any] | None:
    """What the ``DIVERGED`` marker says (``None`` without one)."""
    path = Path(run_dir) / DIVERGED
    if not path.exists():
        return None
    return _read_json(path) or {"round": None}


def is_final(run_dir: Path) -> bool:
    """Whether the run has ended for good (``done`` or ``diverged``): a grid does not run it again."""
    return store.is_finished(Path(run_dir)) or (Path(run_dir) / DIVERGED).exists()


@dataclass(frozen=True)
class RunState:
    """One run's state: one of :data:`STATES`, the last round it recorded, and a one-line detail (the error, who
    runs it, where it diverged)."""

    status: str
    round: int | None = None
    detail: str = ""


def final_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The metric rows, by round, of a run that ended — done, or diverged (its last row marked ``"diverged": true``);
    a :class:`~phalanx.errors.ConfigError` naming ``run`` if it has not ended."""
    if store.is_diverged(Path(run_dir)):  # a marker the manifest does not record: refused, not believed
        rows = store.read_rows(Path(run_dir))
        if rows:
            return sorted(rows, key=lambda r: r["round"])
    return store.finished_rows(Path(run_dir))


def last_round(run_dir: Path) -> int | None:
    """The round of the last metrics row written (metrics are written at every checkpoint), or ``None``."""
    path = Path(run_dir) / "metrics.jsonl"
    try:  # only a regular file, opened without blocking (a FIFO there would hang `phalanx status` and the watcher)
        with runfiles.open_regular(path) as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            lines = fh.read(65536).splitlines()
    except (OSError, ValueError):  # missing, unreadable, not a regular file (ConfigError is a ValueError)
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, a number too long, nested too deeply
            continue
        if isinstance(row, dict) and isinstance(row.get("round"), int):
            return int(row["round"])
    return None


def state(run_dir: Path) -> RunState:
    """The state of the run in ``run_dir`` (see the module's docstring)."""
    run_dir = Path(run_dir)
    t = last_round(run_dir)
    if store.is_finished(run_dir):
        return RunState("done", t)
    div = divergence(run_dir)
    if div is not None:
        return RunState("diverged", t, f"non-finite model at round {div.get('round')}")
    who = holder(run_dir)
    if who is not None:
        return RunState("running", t, describe_holder(who))
    fail = failure(run_dir)
    if fail is not None:
        return RunState("failed", t, f"{fail.get('error')}: {fail.get('message')}")
    if (run_dir / "checkpoint.safetensors").exists() or t is not None:
        return RunState("stopped", t, "resumes from its last checkpoint")
    return RunState("pending", t)


def record_divergence(run_dir: Path, diverged: Diverged) -> None:
    """Write a diverged run's metrics (JSON lines and Parquet, ending with the diverged round's row) and its
    ``DIVERGED`` marker (round, how many coordinates are non-finite, when), all recorded in the manifest."""
    run_dir = Path(run_dir)
    store.write_artifact(run_dir, "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in diverged.rows).encode())
    store.write_parquet(run_dir / "metrics.parquet", diverged.rows)
    record = {"round": diverged.round, "non_finite": diverged.bad, "size": diverged.size, "when": _now()}
    store.write_artifact(run_dir, DIVERGED, (json.dumps(record) + "\n").encode())


def diverged_again(run_dir: Path) -> Diverged | None:
    """A run directory marked ``DIVERGED``, as the :class:`Diverged` it ended with (``None`` if it is not)."""
    if not store.is_diverged(Path(run_dir)):  # a marker the manifest does not record: refused, not believed
        return None
    record = divergence(run_dir) or {}
    rows = store.read_rows(Path(run_dir))
    return Diverged(int(record.get("round") or 0), int(record.get("non_finite") or 0), int(record.get("size") or 0),
                    rows)
