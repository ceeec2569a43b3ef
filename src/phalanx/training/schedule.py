"""Learning-rate schedules."""

from __future__ import annotations

import math

from phalanx.training.config import RunConfig


def learning_rate(cfg: RunConfig, t: int) -> float:
    """Learning rate of round ``t`` (0-based).

    ``constant``: η₀. ``step``: η₀ / 10^⌊t / step_every⌋. ``cosine``: η₀ (1 + cos(π t / T)) / 2 over the T rounds
    (the schedule of Yang, Shi & Li, ICML 2025, §5).
    """
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "step":
        return cfg.lr * 0.1 ** (t // cfg.step_every)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * t / cfg.rounds))
