"""How long a grid will take here, said before it starts: a few rounds of its first unfinished run timed on this
machine, extrapolated to every round left.

A newcomer's config that trains for hours should say so before the first run, not in a progress line an hour in
(issue 38: a tutorial step estimated by its own progress line at 4.6 h at load 4 and 8–9 h at load 7–14, with no
warning). :func:`estimate` times :data:`PROBE_ROUNDS` rounds, one by one, after :data:`WARMUP_ROUNDS` warm-up rounds
of the first unfinished run, and takes their median (:func:`steady`) —
built from a copy of its config in this process, nothing written, the global random state restored, so the runs
themselves are bit for bit what they would have been (``tests/test_estimate.py``) — and multiplies by every round
the unfinished runs have left, scaled per run by workers × parameters where the model's size can be counted before
it is built, plus the probed run's set-up once per run and one evaluation's time for every evaluation left, divided
among the worker processes. It counts rounds, set-up and evaluations (checkpoints add to it) and
measures the machine as it is now (a loaded machine gives a longer estimate): an order of magnitude, said as such.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from phalanx import models
from phalanx.experiments import components, runstate
from phalanx.experiments.schema import RunConfig
from phalanx.experiments.validrun import ValidRun

PROBE_ROUNDS = 3
"""Rounds timed, one by one (after :data:`WARMUP_ROUNDS` that are not); their median is the estimate's round."""
WARMUP_ROUNDS = 2
"""Rounds run before the timed ones and not timed: the first rounds pay one-time costs — the first call of every
kernel, each worker's first batch, memory first touched — that a run pays once, not every round. Issue 38: with one
warm-up round and the mean of three, step 2 of docs/start.md measured 15 s, 8.3 s, then 1.1–1.6 s a round at load
6–8; the second round alone made the mean 4.3 s, three times the steady 1.5 s (tests/test_estimate.py)."""
PROBE_SECONDS = 1.0
"""A fast round is timed for at least this long (beyond :data:`PROBE_ROUNDS`): on a loaded 2-core machine a round of
the README's job at 2 threads took 0.7 ms or 80 ms as the other processes happened to run, so three rounds' median
said 76 ms where the runs averaged 25 ms — a newcomer's estimates 3–10× too long (issue 38)."""
PROBE_MAX = 400
"""At most this many rounds are timed (a round of 2.5 ms reaches :data:`PROBE_SECONDS` at 400)."""
MEAN_FROM = 10
"""From this many timed rounds on, the round is their mean — what a run pays is the sum of its rounds, stalls
included at their frequency — and below it their median (:func:`steady`): with a few slow rounds a single stall
would weigh a third of the estimate."""
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
    setup: float = 0.0
    """Seconds the probed run's set-up took (its data, model and experiment built), counted once per run."""
    timed: int = PROBE_ROUNDS
    """How many rounds the probe timed (:func:`time_rounds`)."""
    evaluation: float = 0.0
    """Seconds one evaluation of the probed run took (its test set at θ), counted at every evaluation left."""
    evaluations: int = 0
    """Evaluations left over every run (:func:`evaluations`)."""
    load: float | None = field(default_factory=lambda: load_now())
    """The 1-minute load average when the estimate was made (None where the system has none): the estimate holds at
    that load, and a machine that grows busier makes the runs slower (issue 38: a newcomer could not tell an estimate
    made at load 1 from one at load 8)."""

    def text(self) -> str:
        """One clause: the estimate and what it rests on."""
        evals = (f"{self.evaluations:,} evaluations at {self.evaluation:.2g} s each counted; "
                 if self.evaluations else "")
        return (f"about {duration(self.seconds)} for {self.rounds:,} rounds of {self.runs} run(s) on {self.parallel} "
                f"process(es) — a round of {self.probed} took {self.per_round:.3g} s here, now "
                f"({statistic(self.timed)} after {WARMUP_ROUNDS} warm-up rounds; its set-up {self.setup:.2g} s, "
                f"counted once a run; {evals}checkpoints come on top){at_load(self.load)}")


def load_now() -> float | None:
    """The 1-minute load average (``os.getloadavg``), or None where the system keeps none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def at_load(load: float | None) -> str:
    """`` at load 3.2 on 2 cores: more if the machine gets busier`` — what an estimate made now assumes."""
    if load is None:
        return ""
    return f", at load {load:.1f} on {os.cpu_count() or 1} cores: more if the machine gets busier"


def evaluations(rounds: int, left: int, every: int) -> int:
    """How many evaluations a run of ``rounds`` rounds with ``left`` of them to go still makes: round 0's when it has
    not started, then every round t with (t + 1) a multiple of ``every``, and the last
    (:meth:`phalanx.training.experiment.Experiment.evaluates`)."""
    if left <= 0:
        return 0
    start = rounds - left
    every = max(1, every)
    count = rounds // every - start // every  # multiples of `every` in (start, rounds]
    if rounds % every:
        count += 1  # the last round
    return count + (1 if start == 0 else 0)


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


def _dimension(cfg: RunConfig, input_shape: tuple[int, ...], num_classes: int) -> int | None:
    """The model's parameter count d (None when it cannot be counted before it is built)."""
    try:
        return models.planned_parameters(cfg.model, input_shape, num_classes, **cfg.model_params)
    except Exception:  # an estimate never stops a grid: the run says what is wrong itself
        return None


def _size(cfg: RunConfig, input_shape: tuple[int, ...], num_classes: int) -> float | None:
    """workers × parameters of ``cfg``'s model (None when it cannot be counted before it is built)."""
    d = _dimension(cfg, input_shape, num_classes)
    return None if d is None else float(d * cfg.workers)


RULE_SECONDS = 0.05
"""Each distinct rule of a grid is timed on rows of its shape for at least this long (:func:`rule_cost`)."""


def rule_cost(run: ValidRun | RunConfig, d: int | None, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds ``run``'s rule takes on one round's rows here: its own rule (a copy: a stateful one keeps its state),
    on ``(m, d)`` float32 normal rows — m the vectors its algorithm aggregates a round, d the model's parameters —
    after one untimed call, the mean of calls over :data:`RULE_SECONDS` (at least 3). 0 where it cannot be timed (a
    config not yet validated, a model whose size is not known before it is built): the probed round then speaks for
    every rule. A newcomer's README job of five rules was estimated at 4 s from its mean / none round; it took 11 s."""
    if not isinstance(run, ValidRun) or d is None:
        return 0.0
    import copy

    try:
        rule = copy.deepcopy(run.parts.rule)
        m = run.parts.algorithm.per_round(run.cfg.workers)
        rows = torch.randn(m, d, generator=torch.Generator().manual_seed(0))
        rule(rows)
        calls, begin = 0, clock()
        while calls < 3 or (clock() - begin < RULE_SECONDS and calls < PROBE_MAX):
            rule(rows)
            calls += 1
        return (clock() - begin) / calls
    except Exception:  # an estimate never stops a grid: the run says what is wrong itself
        return 0.0


def steady(seconds: Sequence[float]) -> float:
    """What a round costs once the run is under way, from the timed rounds ``seconds`` (the warm-up rounds are not
    among them): their median when fewer than :data:`MEAN_FROM` — a round that another process slowed tenfold moves
    it by one rank, not by a third of its time — and their mean from :data:`MEAN_FROM` on, when a second's worth of
    fast rounds holds the machine's stalls at their frequency and the mean is what the runs will pay."""
    values = np.asarray(seconds, dtype=float)
    return float(values.mean() if values.size >= MEAN_FROM else np.median(values))


def statistic(timed: int) -> str:
    """What :func:`steady` took of ``timed`` rounds, in words."""
    return f"the {'mean' if timed >= MEAN_FROM else 'median'} of {timed}"


def time_rounds(run: ValidRun | RunConfig, rounds: int = PROBE_ROUNDS,
                clock: Callable[[], float] = time.perf_counter,
                threads: int | None = None) -> tuple[float, tuple[int, ...], int, float, int, float]:
    """Seconds a round of ``run`` takes here (:func:`steady` of at least ``rounds`` rounds timed one by one after
    :data:`WARMUP_ROUNDS` warm-up rounds, and of more while they took less than :data:`PROBE_SECONDS`, up to
    :data:`PROBE_MAX` and the run's last round; how many is the fifth value returned), the seconds its set-up
    took (loading the data, building the experiment: what every run pays once), with its data set's input shape
    and class count, and last the seconds one evaluation took (the test set at θ, as a run's metric row: a newcomer's
    study estimates left them out and were short by up to 1.75× of CPU, issue 38). Built with components of its
    own (those validating ``run`` built stay the run's), nothing written, torch's and numpy's global random state
    restored. A RunConfig is validated first.
    ``threads``: torch's intra-op threads during the probe (the count the runs will train with; this process's own
    count restored after), None: this process's count as it is."""
    from phalanx.experiments.build import from_config
    from phalanx.experiments.config import validate
    from phalanx.experiments.executor import dataset_for
    from phalanx.training import Loop

    valid = run if isinstance(run, ValidRun) else validate(run)
    probe = replace(valid, parts=components.build(valid.specs, valid.cfg if valid.specs.legacy_hooks else None),
                    _taken=[])
    begin = clock()
    ds = dataset_for(probe.specs.data)
    state, before = np.random.get_state(), torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        with torch.random.fork_rng(devices=[]):
            loop = Loop(from_config(probe, ds), callbacks=[])
            setup = clock() - begin
            for _ in range(min(WARMUP_ROUNDS, max(0, loop.experiment.rounds - rounds))):
                loop.step()  # warm-up: one-time costs (WARMUP_ROUNDS), not timed
            times: list[float] = []
            room = max(rounds, min(PROBE_MAX, loop.experiment.rounds - loop.state.round))  # never past the run's end
            while len(times) < rounds or (sum(times) < PROBE_SECONDS and len(times) < room):
                start = clock()
                loop.step()
                times.append(clock() - start)
            per_round = steady(times)
            timed = len(times)
            from phalanx.training.loop import Evaluate

            start = clock()
            Evaluate.row(loop, None)  # one evaluation, as a run makes at round 0 and every eval_every rounds
            evaluation = clock() - start
    finally:
        np.random.set_state(state)
        if threads is not None:
            torch.set_num_threads(before)
    return per_round, tuple(ds.input_shape), int(ds.num_classes), setup, timed, evaluation


def estimate(todo: Sequence[tuple[ValidRun | RunConfig, Path]], jobs: int, label: Callable[[RunConfig], str] = str,
             clock: Callable[[], float] = time.perf_counter, threads: int | None = None) -> Estimate | None:
    """How long ``todo`` (the unfinished runs and their directories) should take on ``jobs`` processes of
    ``threads`` intra-op threads each (None: this process's count) here; None when fewer than :data:`MIN_ROUNDS`
    rounds are left or the first run cannot be timed (it will say why itself).

    The probe must train at the runs' own thread count: on a loaded 2-core machine a round at torch's default of 2
    threads took 80–160 ms where the same round at the 1 thread each of 2 worker processes uses took 1–10 ms
    (digits MLP, load 6, issue 38) — the 13–20× overstatement of ``phalanx experiment corrupted-rounds``."""
    runs = [(r, r.cfg if isinstance(r, ValidRun) else r, d) for r, d in todo]
    left = [(r, cfg, _left(cfg.rounds, d)) for r, cfg, d in runs]
    left = [(r, cfg, k) for r, cfg, k in left if k > 0]
    total = sum(k for _, _, k in left)
    if total < MIN_ROUNDS:
        return None
    run, first = left[0][0], left[0][1]
    try:
        timed = min(PROBE_ROUNDS, max(1, first.rounds - WARMUP_ROUNDS))
        per_round, shape, classes, setup, timed, evaluation = time_rounds(run, timed, clock, threads)
    except Exception:  # an estimate never stops a grid: the run says what is wrong itself
        return None
    base = _size(first, shape, classes)
    costs: dict[tuple[str, int, int, int | None], float] = {}

    def cost(r: ValidRun | RunConfig, cfg: RunConfig) -> float:
        key = (str(cfg.aggregator), int(cfg.f), int(cfg.workers), _dimension(cfg, shape, classes))
        if key not in costs:
            costs[key] = rule_cost(r, key[3], clock)
        return costs[key]

    before = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)  # the rules are timed at the runs' thread count, as the round was
        own = cost(run, first)
        for r, cfg, _ in left:
            cost(r, cfg)
    finally:
        torch.set_num_threads(before)
    work = 0.0
    for r, cfg, k in left:
        size = _size(cfg, shape, classes)
        ratio = size / base if size is not None and base else 1.0
        # the probed round scaled by the model's size, with the probed rule's cost swapped for this run's own
        work += k * max(0.5 * per_round * ratio, per_round * ratio + cost(r, cfg) - own * ratio)
    evals = sum(evaluations(cfg.rounds, k, int(cfg.eval_every)) for _, cfg, k in left)
    parallel = max(1, min(jobs, len(left)))
    seconds = (work + setup * len(left) + evaluation * evals) / parallel
    return Estimate(seconds if math.isfinite(seconds) else math.inf, per_round, label(first), total, len(left),
                    parallel, setup, timed, evaluation, evals)
