"""A run interrupted for real: training stops right after the round-``stop`` checkpoint, as a killed run would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def whole_and_resumed(cfg: RunConfig, tmp_path: Path, stop: int) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """``cfg`` trained once without a stop (into ``tmp_path/whole``) and once stopped after round ``stop`` and resumed
    (``tmp_path/resumed``): both final checkpoints (tensor by key) and the resumed run's directory."""
    from safetensors.torch import load_file

    train(cfg, tmp_path / "whole")
    part = train_interrupted(cfg, tmp_path / "resumed", stop=stop)
    train(cfg, part)
    whole = load_file(str(next((tmp_path / "whole").glob("**/checkpoint.safetensors"))))
    resumed = load_file(str(next(part.glob("**/checkpoint.safetensors"))))
    return whole, resumed, part
