"""The local executor of a grid: its runs in this process, or in ``jobs`` worker processes of this machine.

Worker processes are spawned (a clean interpreter each), use ``cores / jobs`` threads, report every round back
through a queue (the progress bar), ignore the terminal's SIGINT (the grid decides when they stop: SIGTERM, on which
a worker unwinds its run — its atomic writes clean up — and exits) and end when the grid's process ends, however it
ends (:func:`phalanx.experiments.signals.exit_with_parent`).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing.managers import SyncManager
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from phalanx import _spawned
from phalanx.experiments import signals
from phalanx.experiments.config import RunConfig, ValidRun
from phalanx.experiments.executor import Hooks, Outcome, dataset_for
from phalanx.experiments.runstate import RunInUse
from phalanx.experiments.train import train
from phalanx.training.divergence import Diverged

_IN_RUN = False  # in a worker process: whether it is inside a run (see _worker_sigterm)


class _Terminated(BaseException):
    """Raised in a worker process by SIGTERM, to unwind its run (temporary files removed) before it exits."""


def _worker_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM in a worker process: unwind the run it is in (its atomic writes clean up), else exit at once."""
    if _IN_RUN:
        raise _Terminated
    os._exit(128 + signum)


def _worker_init() -> None:
    """Initializer of a grid's worker process: the grid decides when it stops (SIGINT from the terminal is
    ignored, SIGTERM from the grid ends it cleanly), and it ends when the grid does.

    DuckDB (the Parquet writer a finished run uses) is imported here, before the SIGTERM handler exists: imported
    lazily when a run finishes, a SIGTERM that landed inside its extension's initialisation raised there, and
    nanobind printed a "Critical nanobind error" with a traceback instead of the grid's one line."""
    import duckdb  # noqa: F401 - imported for its side effect: initialised before any signal can interrupt it

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (phalanx._spawned did already, at the child's first import)
    signal.signal(signal.SIGTERM, _worker_sigterm)
    signals.exit_with_parent()


def _manager_init() -> None:
    """Initializer of the progress queue's manager process: deaf to the terminal's SIGINT (the grid shuts it down),
    and it ends when the grid does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signals.exit_with_parent()


def _run_one(cfg: RunConfig, run_dir: str, threads: int, wait_lock: bool, rounds_queue: Any = None) -> str:
    """Train one run of the grid in a worker process: ``cfg`` as the parent validated it, pickled (the objects the
    parent built stay there): validated here, once, by :func:`~phalanx.experiments.train.train`, which builds its
    components."""
    global _IN_RUN
    torch.set_num_threads(threads)
    progress = None
    if rounds_queue is not None:  # report every round to the parent, which drives the progress bar
        def progress(t: int, total: int, row: Any) -> None:
            rounds_queue.put((run_dir, t))
    try:
        _IN_RUN = True
        train(cfg, run_dir, dataset=dataset_for(cfg), progress=progress, wait=wait_lock)
    except _Terminated:  # the grid is stopping: the run keeps its last checkpoint
        os._exit(128 + signal.SIGTERM)
    finally:
        _IN_RUN = False
    return run_dir


def _end_workers(pool: ProcessPoolExecutor) -> None:
    """Stop a pool at once: no queued run starts, every worker process gets SIGTERM (it unwinds its run and exits)
    and is waited for (killed if it does not end within a minute), and so is the pool's management thread.

    Queued runs are cancelled by the pool's own thread (``shutdown(cancel_futures=True)``), never from here: a future
    cancelled from outside and then failed by the pool as broken raises ``InvalidStateError`` in that thread."""
    procs = list((pool._processes or {}).values())
    thread: threading.Thread | None = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():  # pragma: no cover - a worker stuck in a system call
            p.kill()
            p.join()
    if thread is not None:
        thread.join(timeout=60)


class LocalExecutor:
    """Run a grid's runs on this machine: one after the other in this process (``jobs = 1``), or in ``jobs``
    worker processes. A run that fails does not stop the others; with ``wait``, a run whose directory another
    process holds is waited for instead of reported as busy."""

    name = "local"

    def __init__(self, jobs: int = 1, *, wait: bool = False, threads: int | None = None) -> None:
        self.jobs = jobs
        self.wait = wait
        self.threads = threads
        """Intra-op threads of each run (:func:`phalanx.experiments.threads.choose`); None: torch's default in this
        process, ``cores // jobs`` in worker processes."""

    def run(self, todo: list[tuple[ValidRun, Path]], out: Path, hooks: Hooks) -> Outcome:
        outcome = Outcome()
        if self.jobs <= 1 or len(todo) <= 1:
            before = torch.get_num_threads()
            if self.threads is not None:
                torch.set_num_threads(self.threads)
            try:
                self._run_here(todo, hooks, outcome)
            finally:
                if self.threads is not None:  # this process's count as it was (a library caller's own)
                    torch.set_num_threads(before)
            return outcome
        with signals.recording(hooks.stopped):  # the loop below sees a signal within 0.2 s and stops the grid
            self._run_parallel([(r.cfg, d) for r, d in todo], hooks, outcome)  # each worker validates its config
        return outcome

    def _run_here(self, todo: list[tuple[ValidRun, Path]], hooks: Hooks, outcome: Outcome) -> None:
        """Run ``todo`` one after the other in this process."""
        for r, d in todo:  # a signal raises StopRequested out of the run (the caller's stop_on_signals)
            c = r.cfg
            cb = (lambda t, total, row, c=c: hooks.round(c, t)) if hooks.on_round is not None else None
            try:
                train(r, d, progress=cb, dataset=dataset_for(r.specs.data), wait=self.wait)
            except Exception as exc:
                _ended(c, d, exc, hooks, outcome)
            else:
                _ended(c, d, None, hooks, outcome)

    def _run_parallel(self, todo: list[tuple[RunConfig, Path]], hooks: Hooks, outcome: Outcome) -> None:
        """Run ``todo`` in spawned worker processes; return early, the workers ended, once a signal arrived."""
        threads = self.threads or max(1, (os.cpu_count() or 1) // self.jobs)
        ctx = multiprocessing.get_context("spawn")
        by_dir = {str(d): c for c, d in todo}
        manager = SyncManager(ctx=ctx)
        # the initializers are phalanx._spawned's: a child imports that module first, and it ignores SIGINT
        manager.start(_spawned.run, (f"{__name__}:_manager_init",))  # the progress queue's server: it ends with
        with manager, ProcessPoolExecutor(max_workers=self.jobs, mp_context=ctx,  # the grid, too
                                          initializer=_spawned.run, initargs=(f"{__name__}:_worker_init",)) as pool:
            rounds_queue = manager.Queue() if hooks.on_round is not None else None
            futures: dict[Future[str], tuple[RunConfig, Path]] = {  # the worker processes start here
                pool.submit(_run_one, c, str(d), threads, self.wait, rounds_queue): (c, d) for c, d in todo
            }
            pending = set(futures)
            done_dirs: set[str] = set()
            while pending and not hooks.stopped:
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                if hooks.stopped:
                    break
                _drain(rounds_queue, by_dir, done_dirs, hooks)
                for fut in finished:
                    c, d = futures[fut]
                    done_dirs.add(str(d))
                    try:
                        fut.result()
                    except Exception as exc:  # the other runs go on
                        _ended(c, d, exc, hooks, outcome)
                    else:
                        _ended(c, d, None, hooks, outcome)
            if hooks.stopped:
                _end_workers(pool)


def _ended(cfg: RunConfig, run_dir: Path, error: Exception | None, hooks: Hooks, outcome: Outcome) -> None:
    """Book how one run ended: finished, diverged (an end, not an error), busy (another process holds its
    directory) or failed (the other runs go on)."""
    if error is None:
        hooks.done(cfg, "done")
    elif isinstance(error, Diverged):
        hooks.done(cfg, "diverged")
    elif isinstance(error, RunInUse):
        outcome.busy[run_dir] = error
        hooks.done(cfg, "in use by another process")
    else:
        outcome.failed[run_dir] = error
        hooks.done(cfg, "failed")


def _drain(rounds_queue: Any, by_dir: dict[str, RunConfig], done_dirs: set[str], hooks: Hooks) -> None:
    """Pass the rounds the worker processes reported to the hooks (the latest per unfinished run)."""
    if rounds_queue is None:
        return
    latest: dict[str, int] = {}
    while True:
        try:
            run_dir, t = rounds_queue.get_nowait()
        except queue.Empty:
            break
        latest[run_dir] = max(t, latest.get(run_dir, 0))
    for run_dir, t in latest.items():
        if run_dir not in done_dirs:  # not a late report of a run already counted as done
            hooks.round(by_dir[run_dir], t)
