"""Learning-rate schedules: the server's step size ηₜ of round t."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from phalanx.validate import check_choice, check_int, check_real

Kind = Literal["constant", "step", "cosine"]


@dataclass(frozen=True)
class LRSchedule:
    """ηₜ for round ``t`` (0-based) of a run of ``rounds`` rounds.

    ``constant``: η₀. ``step``: η₀ / 10^⌊t / step_every⌋. ``cosine``: η₀ (1 + cos(π t / T)) / 2 over the T rounds
    (the schedule of Yang, Shi & Li, ICML 2025, §5).
    """

    lr: float = 0.1
    kind: Kind = "constant"
    rounds: int = 1
    step_every: int = 100

    def __post_init__(self) -> None:
        check_real("lr", self.lr, low=0.0, low_open=True)
        check_choice("schedule", self.kind, ("constant", "step", "cosine"))
        check_int("rounds", self.rounds, low=1)
        check_int("step_every", self.step_every, low=1)

    def __call__(self, t: int) -> float:
        if self.kind == "constant":
            return self.lr
        if self.kind == "step":
            return self.lr * 0.1 ** (t // self.step_every)
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * t / self.rounds))
