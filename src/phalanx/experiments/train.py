"""``train``: one run in this process (every worker simulated), from a config or from an experiment built from
objects, optionally into a run directory that a killed run resumes from."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phalanx.data.base import Dataset
from phalanx.experiments.build import check_engine, from_config
from phalanx.experiments.config import RunConfig, validate
from phalanx.experiments.tracking import TrackerLike, Tracking
from phalanx.experiments.tracking import of_keys as trackers_of
from phalanx.experiments.validrun import ValidRun
from phalanx.experiments.wiring import Recording, run_experiment
from phalanx.training.experiment import Experiment
from phalanx.training.loop import Callback, OnRound, Progress
from phalanx.training.memory import tune_allocator
from phalanx.training.stages.privacy import run_note


def train(
    run: ValidRun | RunConfig | Experiment, run_dir: str | Path | None = None, *, dataset: Dataset | None = None,
    progress: Progress | None = None, callbacks: Sequence[Callback] = (), checkpoint_every: int | None = None,
    wait: bool = False, tracking: Tracking | Sequence[str | TrackerLike] | None = None,
) -> list[dict[str, Any]]:
    """Train one configuration (or experiment); return the metric rows (one per evaluated round).

    With ``run_dir``, results and checkpoints are written there and an interrupted run resumes from its last
    checkpoint (the random streams and the server optimizer's state are restored with it, so the resumed run
    equals an uninterrupted one). The run holds the directory's lock while it trains: another process on the same
    directory is refused with :class:`~phalanx.experiments.runstate.RunInUse` (or, with ``wait``, waits for it); an
    error leaves a ``FAILED`` marker (:mod:`phalanx.experiments.runstate`). A run whose model becomes non-finite
    stops with :class:`~phalanx.training.divergence.Diverged`, its directory marked ``DIVERGED``.
    ``progress(round, rounds, row_or_None)`` is called after every round;
    ``callbacks`` run after the built-in ones. ``tracking``: experiment trackers that also receive the run — names
    (``["tensorboard", "mlflow"]``), tracker objects or a :class:`~phalanx.experiments.tracking.Tracking`; a
    config's own ``tracking`` when not given (docs/tracking.md). A config with ``engine = "torchrun"`` is started
    with ``phalanx launch`` or torchrun instead. A RunConfig is validated here
    (:func:`~phalanx.experiments.config.validate`); a :class:`~phalanx.experiments.validrun.ValidRun` was already.
    """
    tune_allocator()
    recording = None
    if isinstance(run, RunConfig):
        run = validate(run)
    if isinstance(run, ValidRun):
        cfg = run.cfg
        check_engine(run.specs.device, run.specs.shape.processes)
        exp = from_config(run, dataset)
        if run_dir is not None:
            recording = Recording(Path(run_dir), cfg.identity(), checkpoint_every or cfg.checkpoint_every,
                                  sign_key=cfg.sign_key, verify_key=cfg.verify_key, wait=wait)
    else:
        exp = run
        if run_dir is not None:
            recording = Recording(Path(run_dir), run.describe(), checkpoint_every or 100, wait=wait)
    said = run_note(exp.stages)
    if said is not None:
        print(f"[phalanx] {said}", file=sys.stderr, flush=True)
    cbs = [] if progress is None else [OnRound(progress)]
    if isinstance(run, ValidRun):  # what names and describes the run, and the trackers its config names
        named, params, own = run.run_id, run.cfg.described(), run.specs.tracking
    else:
        named, params, own = None, run.describe(), None
    tracked = _tracking(named, params, own, run_dir, tracking)
    return run_experiment(exp, None, recording, callbacks=[*cbs, *callbacks], tracking=tracked)


def _tracking(run_id: str | None, params: dict[str, Any], own: tuple[list[str], dict[str, Any]] | None,
              run_dir: str | Path | None, given: Tracking | Sequence[str | TrackerLike] | None) -> Tracking | None:
    """The run's trackers: given ones, else a config's own (``own``: its ``tracking`` names and
    ``tracking_params``); named by the run directory, else by the run id; ``params``: what describes the run."""
    name = Path(run_dir).name if run_dir is not None else run_id
    if isinstance(given, Tracking):
        return given
    if given is not None:
        if not given:
            return None
        return Tracking.of_names(list(given), params, name)
    return trackers_of(*own, params, name) if own is not None else None
