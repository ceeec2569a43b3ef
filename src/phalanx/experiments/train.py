"""``train``: one run in this process (every worker simulated), from a config or from an experiment built from
objects, optionally into a run directory that a killed run resumes from."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from phalanx.data.base import Dataset
from phalanx.experiments import runstate
from phalanx.experiments.build import check_engine, from_config
from phalanx.experiments.config import RunConfig
from phalanx.experiments.rundir import opened
from phalanx.training.divergence import Diverged, StopOnDivergence
from phalanx.training.experiment import Experiment
from phalanx.training.loop import Callback, Evaluate, Loop, OnRound, Progress
from phalanx.training.memory import tune_allocator


def train(
    run: RunConfig | Experiment, run_dir: str | Path | None = None, *, dataset: Dataset | None = None,
    progress: Progress | None = None, callbacks: Sequence[Callback] = (), checkpoint_every: int | None = None,
    wait: bool = False,
) -> list[dict[str, Any]]:
    """Train one configuration (or experiment); return the metric rows (one per evaluated round).

    With ``run_dir``, results and checkpoints are written there and an interrupted run resumes from its last
    checkpoint (the random streams and the server optimizer's state are restored with it, so the resumed run
    equals an uninterrupted one). The run holds the directory's lock while it trains: another process on the same
    directory is refused with :class:`~phalanx.experiments.runstate.RunInUse` (or, with ``wait``, waits for it); an
    error leaves a ``FAILED`` marker (:mod:`phalanx.experiments.runstate`). A run whose model becomes non-finite
    stops with :class:`~phalanx.training.divergence.Diverged`, its directory marked ``DIVERGED``.
    ``progress(round, rounds, row_or_None)`` is called after every round;
    ``callbacks`` run after the built-in ones. A config with ``engine = "torchrun"`` is started with ``phalanx
    launch`` or torchrun instead.
    """
    tune_allocator()
    keys: dict[str, str | None] = {}
    if isinstance(run, RunConfig):
        check_engine(run)
        exp = from_config(run, dataset)
        identity, every = run.identity(), run.checkpoint_every
        keys = {"sign_key": run.sign_key, "verify_key": run.verify_key}
    else:
        exp, identity, every = run, run.describe(), 100
    cbs: list[Callback] = [Evaluate(), StopOnDivergence()]
    start = None
    with ExitStack() as held:
        if run_dir is not None:
            held_run = held.enter_context(opened(Path(run_dir), identity, exp, checkpoint_every or every, wait=wait,
                                            **keys))
            if held_run.finished is not None:  # finished meanwhile (by the process this one waited for)
                return held_run.finished
            start = held_run.start
            cbs.append(held_run.directory)
        if progress is not None:
            cbs.append(OnRound(progress))
        cbs.extend(callbacks)
        try:
            return Loop(exp, None, cbs, start).run()
        except Diverged as exc:  # an end, not an error: recorded as such
            if run_dir is not None:
                runstate.record_divergence(Path(run_dir), exc)
            raise
