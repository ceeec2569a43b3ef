"""A run interrupted for real: training stops right after the round-``stop`` checkpoint, as a killed run would."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.experiments import train
from phalanx.experiments.config import RunConfig
from phalanx.training.loop import Callback, Loop, RoundInfo


class _Stopped(BaseException):  # a kill, not an error: no FAILED marker
    pass


class _StopAt(Callback):
    def __init__(self, stop: int) -> None:
        self.stop = stop

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        if loop.state.round == self.stop:  # the run directory (a built-in callback) has checkpointed this round
            raise _Stopped


def train_interrupted(cfg: RunConfig, out: Path, stop: int) -> Path:
    """Train ``cfg`` into ``out`` and stop after round ``stop`` (a checkpoint round); the directory as it is left."""
    assert stop % cfg.checkpoint_every == 0, "stop at a checkpoint round"
    with pytest.raises(_Stopped):
        train(cfg, out, callbacks=[_StopAt(stop)])
    return out
