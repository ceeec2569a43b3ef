"""Run a grid of configurations, in this process or in parallel worker processes, skipping finished runs.

Each configuration gets its own run directory ``OUT/<run_id>``; a finished run (``DONE`` marker) is skipped, an
unfinished one resumes from its checkpoint. So a killed sweep, started again, redoes no finished run and no round
before the last checkpoint.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import torch

from phalanx.experiments import store
from phalanx.experiments.grid import run_id
from phalanx.training.config import RunConfig

RoundCallback = Callable[[RunConfig, int, int], None]
DoneCallback = Callable[[RunConfig, str], None]


def _run_one(cfg_json: dict[str, Any], run_dir: str, threads: int) -> str:
    from phalanx.training.config import make_config
    from phalanx.training.trainer import train

    torch.set_num_threads(threads)
    train(make_config(cfg_json), run_dir)
    return run_dir


def run_grid(
    cfgs: list[RunConfig], out: Path, *, jobs: int = 1, on_round: RoundCallback | None = None,
    on_done: DoneCallback | None = None,
) -> list[Path]:
    """Run every configuration into ``out/<run_id>``; return the run directories (in the order of ``cfgs``)."""
    from phalanx.training.trainer import train

    out.mkdir(parents=True, exist_ok=True)
    dirs = [out / run_id(c) for c in cfgs]
    todo = [(c, d) for c, d in zip(cfgs, dirs) if not store.is_finished(d)]
    for c, d in zip(cfgs, dirs):
        if store.is_finished(d) and on_done is not None:
            on_done(c, "skipped (finished)")
    if jobs <= 1 or len(todo) <= 1:
        for c, d in todo:
            cb = (lambda t, total, row, c=c: on_round(c, t, total)) if on_round is not None else None
            train(c, d, progress=cb)
            if on_done is not None:
                on_done(c, "done")
        return dirs
    threads = max(1, (os.cpu_count() or 1) // jobs)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(_run_one, c.model_dump(mode="json"), str(d), threads): c for c, d in todo}
        for fut in as_completed(futures):
            fut.result()
            if on_done is not None:
                on_done(futures[fut], "done")
    return dirs
