"""How long a grid will take here, said before it starts: a few rounds of its first unfinished run timed on this
machine, extrapolated to every round left.

A newcomer's config that trains for hours should say so before the first run, not in a progress line an hour in
(issue 38: a tutorial step estimated by its own progress line at 4.6 h at load 4 and 8–9 h at load 7–14, with no
warning). :func:`estimate` times :data:`PROBE_ROUNDS` rounds after one warm-up round of the first unfinished run —
built from a copy of its config in this process, nothing written, the global random state restored, so the runs
themselves are bit for bit what they would have been (``tests/test_estimate.py``) — and multiplies by every round
the unfinished runs have left, scaled per run by workers × parameters where the model's size can be counted before
it is built, divided among the worker processes. It counts rounds only (evaluation and checkpoints add to it) and
measures the machine as it is now (a loaded machine gives a longer estimate): an order of magnitude, said as such.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from phalanx import models
from phalanx.experiments import components, runstate
from phalanx.experiments.schema import RunConfig
from phalanx.experiments.validrun import ValidRun

PROBE_ROUNDS = 3
"""Rounds timed (after one warm-up round that is not)."""
MIN_ROUNDS = 20
"""Below this many rounds left in the whole grid no estimate is made: timing them would cost a noticeable share."""


@dataclass(frozen=True)
class Estimate:
    """``seconds`` the grid's unfinished runs should take here, from ``per_round`` seconds a round of ``probed``
    (a short label of the run timed), ``rounds`` rounds left over ``runs`` runs, ``parallel`` processes."""

    seconds: float
    per_round: float
    probed: str
    rounds: int
    runs: int
    parallel: int

    def text(self) -> str:
        """One clause: the estimate and what it rests on."""
        return (f"about {duration(self.seconds)} for {self.rounds:,} rounds of {self.runs} run(s) on {self.parallel} "
                f"process(es) — {PROBE_ROUNDS} rounds of {self.probed} took {self.per_round:.3g} s each here, now "
                "(evaluations and checkpoints come on top)")


def duration(seconds: float) -> str:
    """``42 s``, ``7.5 min`` or ``4.6 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _left(rounds: int, run_dir: Path) -> int:
    """Rounds a run of ``rounds`` into ``run_dir`` has left: all of them, less the rounds before its last
    checkpoint."""
    done = runstate.last_round(run_dir) if run_dir.is_dir() else None
    return max(0, rounds - (done or 0))


def _size(cfg: RunConfig, input_shape: tuple[int, ...], num_classes: int) -> float | None:
    """workers × parameters of ``cfg``'s model (None when it cannot be counted before it is built)."""
    try:
        d = models.planned_parameters(cfg.model, input_shape, num_classes, **cfg.model_params)
    except Exception:  # an estimate never stops a grid: the run says what is wrong itself
        return None
    return None if d is None else float(d * cfg.workers)


def time_rounds(run: ValidRun | RunConfig, rounds: int = PROBE_ROUNDS,
                clock: Callable[[], float] = time.perf_counter) -> tuple[float, tuple[int, ...], int]:
    """Seconds a round of ``run`` takes here (the mean of ``rounds`` rounds after a warm-up round), with its data
    set's input shape and class count. Built with components of its own (those validating ``run`` built stay the
    run's), nothing written, torch's and numpy's global random state restored. A RunConfig is validated first."""
    from phalanx.experiments.build import from_config
    from phalanx.experiments.config import validate
    from phalanx.experiments.executor import dataset_for
    from phalanx.training import Loop

    valid = run if isinstance(run, ValidRun) else validate(run)
    probe = replace(valid, parts=components.build(valid.specs, valid.cfg if valid.specs.legacy_hooks else None),
                    _taken=[])
    ds = dataset_for(probe.specs.data)
    state = np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            loop = Loop(from_config(probe, ds), callbacks=[])
            loop.step()  # warm-up: the first call of every kernel
            start = clock()
            for _ in range(rounds):
                loop.step()
            per_round = (clock() - start) / rounds
    finally:
        np.random.set_state(state)
    return per_round, tuple(ds.input_shape), int(ds.num_classes)


def estimate(todo: Sequence[tuple[ValidRun | RunConfig, Path]], jobs: int, label: Callable[[RunConfig], str] = str,
             clock: Callable[[], float] = time.perf_counter) -> Estimate | None:
    """How long ``todo`` (the unfinished runs and their directories) should take on ``jobs`` processes here; None
    when fewer than :data:`MIN_ROUNDS` rounds are left or the first run cannot be timed (it will say why itself)."""
    runs = [(r, r.cfg if isinstance(r, ValidRun) else r, d) for r, d in todo]
    left = [(r, cfg, _left(cfg.rounds, d)) for r, cfg, d in runs]
    left = [(r, cfg, k) for r, cfg, k in left if k > 0]
    total = sum(k for _, _, k in left)
    if total < MIN_ROUNDS:
        return None
    run, first = left[0][0], left[0][1]
    try:
        per_round, shape, classes = time_rounds(run, min(PROBE_ROUNDS, max(1, first.rounds - 1)), clock)
    except Exception:  # an estimate never stops a grid: the run says what is wrong itself
        return None
    base = _size(first, shape, classes)
    work = 0.0
    for _, cfg, k in left:
        size = _size(cfg, shape, classes)
        work += k * (size / base if size is not None and base else 1.0)
    parallel = max(1, min(jobs, len(left)))
    seconds = per_round * work / parallel
    return Estimate(seconds if math.isfinite(seconds) else math.inf, per_round, label(first), total, len(left),
                    parallel)
