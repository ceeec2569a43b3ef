"""Experiments: configs and how they become objects, run directories, checkpoints, sweeps and reports."""

from phalanx.experiments.build import from_config
from phalanx.experiments.config import RunConfig, apply_overrides, load_grid, load_toml, make_config, validate
from phalanx.experiments.train import train
from phalanx.experiments.validrun import ValidRun

__all__ = ["RunConfig", "ValidRun", "apply_overrides", "from_config", "load_grid", "load_toml", "make_config", "train",
           "validate"]
