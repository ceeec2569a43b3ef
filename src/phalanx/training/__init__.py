"""Training: one round of robust distributed SGD, the simulated engine, and the run loop."""

from phalanx.training.config import RunConfig, apply_overrides, load_toml, make_config
from phalanx.training.trainer import build, train

__all__ = ["RunConfig", "apply_overrides", "build", "load_toml", "make_config", "train"]
