"""One wiring of a run, shared by every engine: the simulated one (:func:`phalanx.experiments.train`) and each rank
of torchrun (:mod:`phalanx.distributed.worker`) build their experiment and transport, then hand them here.

A run is the loop over its transport with, in this order::

    first         what must see a round before it is measured (a gossip transport's own callback: every node's
                  rows reach rank 0 first)
    Evaluate      the metric rows                                  ┐ the process that measures the run
    StopOnDivergence   a non-finite model ends the run             │ (every process of a simulated run; rank 0
    measures      what adds to the rows (a gossip run's message    │  of torchrun)
                  counts)                                          │
    Tracked       the experiment trackers (TensorBoard, MLflow,    │
                  W&B): every row as it is made                    ┘
    RunDirectory  checkpoints (with their provenance record),      ┐ with a run directory, unless the run has
                  final metrics, DONE                              │ finished already
    recorders     what else writes into the directory (torchrun's  │
                  distributed.json, the transcript)                │
    SignDirectory with a signing key: the finished directory's     ┘
                  signature, once nothing writes into it any more
    callbacks     the caller's (progress, logs)

The run directory is held as :func:`phalanx.experiments.rundir.opened` holds it (lock, ``FAILED`` on an error, the
same configuration or a one-line refusal, the checkpoint to resume from; a diverged run raises its divergence
again), and a divergence is recorded (``DIVERGED``). A run that has finished already runs no round and its
directory is not written: its rows are returned (over a transport to other processes, the loop starts from its last
checkpoint and ends at once, which tells the other ranks to stop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.experiments import runstate
from phalanx.experiments.rundir import RunDirectory, opened
from phalanx.experiments.tracking import Tracking
from phalanx.experiments.tracking.callback import Tracked
from phalanx.training.divergence import Diverged, StopOnDivergence
from phalanx.training.experiment import Experiment
from phalanx.training.loop import Callback, Evaluate, Loop
from phalanx.training.transport import Transport


@dataclass(frozen=True)
class Recording:
    """Where a run is recorded: its directory ``path``, the ``identity`` it must hold (the config's), the checkpoint
    cadence, the keys that sign a finished run and verify a signed one, and whether to ``wait`` for another process
    that holds the directory."""

    path: Path
    identity: dict[str, Any]
    checkpoint_every: int
    sign_key: str | None = None
    verify_key: str | None = None
    wait: bool = False


def run_experiment(
    exp: Experiment, transport: Transport | None = None, recording: Recording | None = None, *,
    measured: bool = True, first: Sequence[Callback] = (), measures: Sequence[Callback] = (),
    recorders: Callable[[RunDirectory], Sequence[Callback]] | None = None, callbacks: Sequence[Callback] = (),
    say: Callable[[str], None] | None = None, tracking: Tracking | None = None,
) -> list[dict[str, Any]]:
    """Run ``exp`` over ``transport`` (default: every worker in this process), wired as the module's docstring says;
    the metric rows. ``measured``: this process evaluates the run (False: a rank of torchrun other than 0);
    ``say`` hears that a finished run trains nothing; ``tracking``: the experiment trackers that also receive the
    run (:mod:`phalanx.experiments.tracking`; a finished run is not sent again)."""
    cbs: list[Callback] = list(first)
    if measured:
        cbs += [Evaluate(), StopOnDivergence(), *measures]
    with ExitStack() as held:
        start = None
        if recording is not None:
            r = recording
            run = held.enter_context(opened(r.path, r.identity, exp, r.checkpoint_every, sign_key=r.sign_key,
                                            verify_key=r.verify_key, wait=r.wait))
            start = run.start
            if run.finished is None:
                if measured and tracking is not None:
                    cbs.append(held.enter_context(Tracked(tracking, r.path).closing()))
                cbs.append(run.directory)
                if recorders is not None:
                    cbs += recorders(run.directory)
                sign = run.directory.signer()  # after every callback that writes into the directory
                cbs += [] if sign is None else [sign]
            else:
                if say is not None:
                    say(f"{r.path} has finished already: nothing to train")
                if transport is None:  # in this process: nobody to tell
                    return run.finished
        elif measured and tracking is not None:
            cbs.append(held.enter_context(Tracked(tracking).closing()))
        cbs += callbacks
        try:
            return Loop(exp, transport, cbs, start).run()
        except Diverged as exc:  # an end, not an error: recorded as such
            if recording is not None:
                runstate.record_divergence(recording.path, exc)
            raise
