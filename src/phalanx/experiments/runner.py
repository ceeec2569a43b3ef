"""Run a grid of configurations, in this process or in parallel worker processes, skipping finished runs.

Each configuration gets its own run directory ``OUT/<run_id>``; a finished run (``DONE`` marker) is skipped, an
unfinished one resumes from its checkpoint. So a killed sweep, started again, redoes no finished run and no round
before the last checkpoint.

Interruptions: the first SIGINT (Ctrl-C) or SIGTERM stops the grid cleanly — no new run starts, the worker processes
end (each run keeps its last checkpoint) and so does the progress queue's manager process — and :func:`run_grid`
raises :class:`Interrupted`, which says how many runs finished (the CLI prints it as one line and exits with 130 or
143). The worker processes ignore the terminal's SIGINT: the sweep that started them decides when they stop.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from multiprocessing.managers import SyncManager
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from phalanx import data, signing
from phalanx.errors import PhalanxError
from phalanx.experiments import store
from phalanx.experiments.build import check_points
from phalanx.experiments.config import RunConfig, make_config
from phalanx.experiments.grid import run_id
from phalanx.experiments.train import train

RoundCallback = Callable[[RunConfig, int, int], None]
DoneCallback = Callable[[RunConfig, str], None]

# Data sets loaded by this process, by (name, root): a grid runs many configurations on the same data, and
# parsing Fashion-MNIST's files takes ~2 s (more than a short run). Training never writes into a data set.
_DATASETS: dict[tuple[str, str | None], Any] = {}


def dataset_for(cfg: RunConfig) -> Any:
    """The configuration's data set, loaded once per process (the last two kept)."""
    key = (data.canonical(cfg.dataset), cfg.data_root)
    if key not in _DATASETS:
        while len(_DATASETS) >= 2:
            _DATASETS.pop(next(iter(_DATASETS)))
        _DATASETS[key] = data.load(cfg.dataset, root=cfg.data_root, download=cfg.download)
    return _DATASETS[key]


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a grid cleanly."""


class Interrupted(PhalanxError):
    """A grid stopped by SIGINT (Ctrl-C) or SIGTERM. ``finished`` of ``total`` runs are finished; the others keep
    their last checkpoint, so the same command, started again, resumes. ``exit_code``: 128 + the signal's number (130
    for SIGINT, 143 for SIGTERM), as a shell reports a process ended by that signal."""

    def __init__(self, signum: int, finished: int, total: int) -> None:
        self.signum = signum
        self.finished = finished
        self.total = total
        self.exit_code = 128 + signum
        super().__init__(
            f"interrupted by {signal.Signals(signum).name}: {finished} of {total} runs finished; run the same command "
            "again to resume (finished runs are skipped, the others go on from their last checkpoint)"
        )


class StopRequested(BaseException):
    """SIGINT or SIGTERM arrived (raised by the handlers of :func:`stop_on_signals`; a ``BaseException``, like
    ``KeyboardInterrupt``, so that no ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _handlers(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """Handle SIGINT and SIGTERM with ``handler`` inside the block (the previous handlers come back after); nothing
    outside the main thread, where Python cannot install handlers."""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside the block, the first SIGINT or SIGTERM raises :class:`StopRequested` (later ones are ignored while the
    program winds down): a run in this process stops where it is, its files as they were at its last checkpoint."""
    fired: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if not fired:
            fired.append(signum)
            raise StopRequested(signum)

    with _handlers(handler):
        yield


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """Block SIGINT and SIGTERM in this thread: a process started inside the block inherits the mask, and so cannot
    be ended by the terminal's Ctrl-C before its initializer has set its own handlers (the parent's signal arrives
    when the block ends)."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not POSIX
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _unblock() -> None:
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


_IN_RUN = False  # in a worker process: whether it is inside a run (see _worker_sigterm)


class _Terminated(BaseException):
    """Raised in a worker process by SIGTERM, to unwind its run (temporary files removed) before it exits."""


def _worker_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM in a worker process: unwind the run it is in (its atomic writes clean up), else exit at once."""
    if _IN_RUN:
        raise _Terminated
    os._exit(128 + signum)


def _worker_init() -> None:
    """Initializer of a grid's worker process: the sweep decides when it stops (SIGINT from the terminal is
    ignored, SIGTERM from the sweep ends it cleanly), and it ends when the sweep does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _worker_sigterm)
    _unblock()
    _exit_with_parent()


def _manager_init() -> None:
    """Initializer of the progress queue's manager process: deaf to the terminal's SIGINT (the sweep shuts it down),
    and it ends when the sweep does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _unblock()
    _exit_with_parent()


def _exit_with_parent() -> None:
    """Make a worker process of a grid end when the sweep that started it ends (killed, Ctrl-C): its run resumes from
    its last checkpoint next time, instead of going on unseen (a pool worker outlives a parent killed by a signal)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns when the parent process has exited (its sentinel is closed)
        os._exit(1)

    threading.Thread(target=watch, name="phalanx-parent-watch", daemon=True).start()


def _run_one(cfg_json: dict[str, Any], run_dir: str, threads: int, rounds_queue: Any = None) -> str:
    global _IN_RUN
    torch.set_num_threads(threads)
    progress = None
    if rounds_queue is not None:  # report every round to the parent, which drives the progress bar
        def progress(t: int, total: int, row: Any) -> None:
            rounds_queue.put((run_dir, t))
    try:
        _IN_RUN = True
        cfg = make_config(cfg_json)
        train(cfg, run_dir, dataset=dataset_for(cfg), progress=progress)
    except _Terminated:  # the sweep is stopping: the run keeps its last checkpoint
        os._exit(128 + signal.SIGTERM)
    finally:
        _IN_RUN = False
    return run_dir


def _counts(dirs: list[Path]) -> tuple[int, int]:
    """(finished, total) distinct runs among ``dirs``."""
    distinct = set(dirs)
    return sum(store.is_finished(d) for d in distinct), len(distinct)


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


def run_grid(
    cfgs: list[RunConfig], out: Path, *, jobs: int = 1, on_round: RoundCallback | None = None,
    on_done: DoneCallback | None = None,
) -> list[Path]:
    """Run every configuration into ``out/<run_id>``; return the run directories (in the order of ``cfgs``).

    SIGINT or SIGTERM while it runs stops it cleanly: :class:`Interrupted` (see the module's docstring).
    """
    check_points(cfgs, dataset_for)  # every point can run, before the first one starts
    store.make_dir(out)
    dirs = [out / run_id(c) for c in cfgs]
    seen: set[Path] = set()  # the same configuration twice in a grid is one run (one directory, one process)
    todo = []
    for c, d in zip(cfgs, dirs):
        if d not in seen and not store.is_finished(d):
            todo.append((c, d))
        seen.add(d)
    for c, d in zip(cfgs, dirs):
        if store.is_finished(d):
            if c.verify_key is not None:  # its results will be used: they must be the signed ones
                signing.verify(d, c.verify_key)
            if on_done is not None:
                on_done(c, "skipped (finished)")
    if jobs <= 1 or len(todo) <= 1:
        try:
            for c, d in todo:
                cb = (lambda t, total, row, c=c: on_round(c, t, total)) if on_round is not None else None
                train(c, d, progress=cb, dataset=dataset_for(c))
                if on_done is not None:
                    on_done(c, "done")
        except StopRequested as stop:
            raise Interrupted(stop.signum, *_counts(dirs)) from None
        return dirs
    stopped: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stopped:
            stopped.append(signum)

    with _handlers(on_signal):  # the loop below sees the signal within 0.2 s and stops the grid
        _run_parallel(todo, jobs, on_round, on_done, stopped)
    if stopped:
        raise Interrupted(stopped[0], *_counts(dirs))
    return dirs


def _run_parallel(
    todo: list[tuple[RunConfig, Path]], jobs: int, on_round: RoundCallback | None, on_done: DoneCallback | None,
    stopped: list[int],
) -> None:
    """Run ``todo`` in ``jobs`` spawned worker processes; return early, the workers ended, once ``stopped`` holds a
    signal."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    ctx = multiprocessing.get_context("spawn")
    by_dir = {str(d): c for c, d in todo}
    manager = SyncManager(ctx=ctx)
    with _signals_blocked():
        manager.start(_manager_init)  # the progress queue's server: a process that ends with the sweep, too
    with manager, ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init) as pool:
        rounds_queue = manager.Queue() if on_round is not None else None
        with _signals_blocked():  # the worker processes start here
            futures = {
                pool.submit(_run_one, c.model_dump(mode="json"), str(d), threads, rounds_queue): c for c, d in todo
            }
        pending = set(futures)
        done_dirs: set[str] = set()
        while pending and not stopped:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            if stopped:
                break
            _drain(rounds_queue, by_dir, done_dirs, on_round)
            for fut in finished:
                try:
                    done_dirs.add(fut.result())
                except BaseException:  # a failed run stops the grid: queued runs are not started
                    if stopped:
                        break
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
                if on_done is not None:
                    on_done(futures[fut], "done")
        if stopped:
            _end_workers(pool)


def _drain(
    rounds_queue: Any, by_dir: dict[str, RunConfig], done_dirs: set[str], on_round: RoundCallback | None,
) -> None:
    """Pass the rounds the worker processes reported to ``on_round`` (the latest per unfinished run)."""
    if rounds_queue is None or on_round is None:
        return
    latest: dict[str, int] = {}
    while True:
        try:
            run_dir, t = rounds_queue.get_nowait()
        except queue.Empty:
            break
        latest[run_dir] = max(t, latest.get(run_dir, 0))
    for run_dir, t in latest.items():
        if run_dir in done_dirs:  # a late report of a run already counted as done
            continue
        cfg = by_dir[run_dir]
        on_round(cfg, t, cfg.rounds)
