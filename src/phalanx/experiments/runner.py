"""Run a grid of configurations, in this process or in parallel worker processes, skipping finished runs.

Each configuration gets its own run directory ``OUT/<run_id>``; a finished run (``DONE`` marker) is skipped, an
unfinished one resumes from its checkpoint. So a killed sweep, started again, redoes no finished run and no round
before the last checkpoint.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any

import torch

from phalanx import data, signing
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
    torch.set_num_threads(threads)
    cfg = make_config(cfg_json)
    progress = None
    if rounds_queue is not None:  # report every round to the parent, which drives the progress bar
        def progress(t: int, total: int, row: Any) -> None:
            rounds_queue.put((run_dir, t))
    train(cfg, run_dir, dataset=dataset_for(cfg), progress=progress)
    return run_dir


def run_grid(
    cfgs: list[RunConfig], out: Path, *, jobs: int = 1, on_round: RoundCallback | None = None,
    on_done: DoneCallback | None = None,
) -> list[Path]:
    """Run every configuration into ``out/<run_id>``; return the run directories (in the order of ``cfgs``)."""
    check_points(cfgs, dataset_for)  # every point can run, before the first one starts
    out.mkdir(parents=True, exist_ok=True)
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
        for c, d in todo:
            cb = (lambda t, total, row, c=c: on_round(c, t, total)) if on_round is not None else None
            train(c, d, progress=cb, dataset=dataset_for(c))
            if on_done is not None:
                on_done(c, "done")
        return dirs
    threads = max(1, (os.cpu_count() or 1) // jobs)
    ctx = multiprocessing.get_context("spawn")
    by_dir = {str(d): c for c, d in todo}
    manager = SyncManager(ctx=ctx)
    manager.start(_exit_with_parent)  # the progress queue's server: a process that ends with the sweep, too
    with manager, ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_exit_with_parent) as pool:
        rounds_queue = manager.Queue() if on_round is not None else None
        futures = {
            pool.submit(_run_one, c.model_dump(mode="json"), str(d), threads, rounds_queue): c for c, d in todo
        }
        pending = set(futures)
        done_dirs: set[str] = set()
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(rounds_queue, by_dir, done_dirs, on_round)
            for fut in finished:
                try:
                    done_dirs.add(fut.result())
                except BaseException:  # a failed run stops the grid: queued runs are not started
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
                if on_done is not None:
                    on_done(futures[fut], "done")
    return dirs


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
