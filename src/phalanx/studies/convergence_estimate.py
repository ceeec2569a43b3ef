"""How long the convergence study (``phalanx tension convergence``) will take here, said before it starts.

Its cells are in-process full-batch GD runs (:mod:`phalanx.studies.convergence_runs`), not run directories, so the
grid's estimate (:mod:`phalanx.experiments.estimate`) never sees them; issue 38 found its full preset taking 42 min
at load 4–14 with no warning. :func:`estimate` measures the same way the grid's does — the study's own code on this
machine as it is now, on the one thread the study runs on — and extrapolates over everything left:

* **the real problems**: for each problem, the first (α, seed) group's problem is built exactly as the study builds
  it (:func:`~phalanx.studies.convergence_runs.group_problem`: the split, the curvature, the step size; timed,
  × the number of (α, seed) groups of that problem), and for each (rule, f) the problem runs with, a warm-up descent
  (two rounds) then :data:`PROBE_STEPS` timed rounds (:func:`phalanx.analysis.problems.descend`); a cell's
  ``rounds`` + 1 evaluations of that setting cost ``(rounds + 1) × t_round``, so the problem's share is
  :math:`\\sum_{(r, f)} \\text{cells}(r, f)\\,(T + 1)\\,t_{r,f} + \\text{groups}\\times t_{\\text{build}}`;
* **the constructions**: for each rule, its first Theorem 4.5 check and its first Proposition 3 run are run whole
  and timed, each × that rule's number of such cells (the cost varies by rule more than by f: Bulyan's check, the
  first, took 0.74 s at load 1 where the quick preset's 82 checks averaged 0.18 s, so its time for all of them
  overstated them fourfold).

Nothing is written, no cell's result is kept, and torch's and numpy's global random state and torch's thread count
are restored, so the study's results are bit for bit those without the estimate
(``tests/test_convergence_estimate.py``). A loaded machine gives a longer estimate; loading the data set comes on
top.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from phalanx import aggregators
from phalanx.analysis import problems as pb
from phalanx.experiments.estimate import MIN_ROUNDS, duration
from phalanx.studies.convergence_runs import (
    CONSTRUCTION,
    PAPER,
    Cell,
    Preset,
    group_problem,
    run_construction,
    run_paper,
)

T = TypeVar("T")

PROBE_STEPS = 3
"""GD rounds timed per (problem, rule, f), after a warm-up descent that is not."""
PROBE_ETA = 1e-3
"""The probe's step size: the timed rounds must stay finite (``descend`` stops at a non-finite value, which would
time fewer rounds than it counts); a round's cost does not depend on the step."""


@dataclass(frozen=True)
class Estimate:
    """``seconds`` the study's cells should take here: ``rounds`` GD rounds of ``cells`` real-problem cells from
    ``settings`` timed (problem, rule, f) settings, and ``checks`` construction cells."""

    seconds: float
    rounds: int
    cells: int
    settings: int
    checks: int

    def text(self) -> str:
        """One clause: the estimate and what it rests on."""
        return (f"about {duration(self.seconds)} for {self.cells + self.checks} in-process GD runs "
                f"({self.rounds:,} rounds of the real problems, {self.checks} constructions) on one thread — "
                f"{PROBE_STEPS} rounds of each of its {self.settings} (problem, rule, f) settings and each rule's "
                "first construction timed here, now (an order of magnitude)")


def _timed(clock: Callable[[], float], work: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``work()`` took by ``clock``, and what it gave."""
    start = clock()
    out = work()
    return max(0.0, clock() - start), out


def estimate(p: Preset, cells: list[Cell], root: str | None = None,
             clock: Callable[[], float] = time.perf_counter) -> Estimate | None:
    """How long :func:`~phalanx.studies.convergence_runs.collect_all` of ``cells`` should take here (module
    docstring); None when they hold fewer than :data:`~phalanx.experiments.estimate.MIN_ROUNDS` rounds in all
    (timing them would cost a noticeable share) or cannot be timed (the study says why itself when it runs)."""
    real = [c for c in cells if c.problem not in (PAPER, CONSTRUCTION)]
    built = {k: [c for c in cells if c.problem == k] for k in (PAPER, CONSTRUCTION)}
    rounds = len(real) * (p.rounds + 1)
    if rounds + sum(len(v) for v in built.values()) * p.construction_steps < MIN_ROUNDS:
        return None
    threads = torch.get_num_threads()
    state = np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.set_num_threads(1)  # the study's runs are on one thread (collect_all)
            seconds, settings = _measure(p, real, built, root, clock)
    except Exception:  # an estimate never stops the study: its own run says what is wrong
        return None
    finally:
        torch.set_num_threads(threads)
        np.random.set_state(state)
    return Estimate(seconds if math.isfinite(seconds) else math.inf, rounds, len(real), settings,
                    sum(len(v) for v in built.values()))


def _measure(p: Preset, real: list[Cell], built: dict[str, list[Cell]], root: str | None,
             clock: Callable[[], float]) -> tuple[float, int]:
    """Seconds of every cell, from the timings of the module docstring, and the number of settings timed."""
    from phalanx import data

    seconds = 0.0
    for kind, run in ((PAPER, run_paper), (CONSTRUCTION, run_construction)):
        for spec in dict.fromkeys(c.rule for c in built[kind]):
            mine = [c for c in built[kind] if c.rule == spec]
            seconds += len(mine) * _timed(clock, functools.partial(run, p, mine[0]))[0]
    if not real:
        return seconds, 0
    settings = 0
    ds = data.load(p.dataset, root=root)
    for prob in dict.fromkeys(c.problem for c in real):
        mine = [c for c in real if c.problem == prob]
        took, (problem, _, _) = _timed(clock, functools.partial(group_problem, p, ds.train_x, ds.train_y, prob,
                                                                mine[0].alpha, mine[0].seed))
        seconds += len({(c.alpha, c.seed) for c in mine}) * took
        counts: dict[tuple[str, int], int] = {}
        for c in mine:
            counts[(c.rule, c.f)] = counts.get((c.rule, c.f), 0) + 1
        for (spec, f), n_cells in counts.items():
            rule = aggregators.make(spec, f=f)
            pb.descend(problem, rule, PROBE_ETA, 1)  # warm-up: the first call of every kernel
            # descend(steps = k) evaluates k + 1 rounds: PROBE_STEPS of them timed
            took, _ = _timed(clock, functools.partial(pb.descend, problem, rule, PROBE_ETA, PROBE_STEPS - 1))
            seconds += n_cells * (p.rounds + 1) * took / PROBE_STEPS
            settings += 1
    return seconds, settings
