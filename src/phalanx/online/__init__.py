"""Online learners on ℝ^d that stay low-regret when some of their gradients are corrupted.

- :mod:`phalanx.online.betting`: 1-D parameter-free coin betting (ONS betting fractions) and its half-line version;
- :mod:`phalanx.online.reduction`: the direction × magnitude reduction and the plain parameter-free learner;
- :mod:`phalanx.online.robust`: the corruption-robust learner for a known gradient bound G (Zhang & Cutkosky,
  ICML 2025, Algorithm 1, as far as its structure is known; docs/online.md);
- :mod:`phalanx.online.game`: the synthetic games (problems, corruptions, the true regret);
- :mod:`phalanx.online.bound`: the bound the learner is held to — proved against u = 0, calibrated once elsewhere
  (``bound_constants.json``);
- :mod:`phalanx.online.mutants`: the learners the check runs, the real one and the mutants it must reject;
- :mod:`phalanx.online.check`: the check itself (``python -m phalanx.online.check``), which can fail.

Every learner has ``predict() -> Tensor``, ``update(g)``, ``state_dict()`` and ``load_state_dict()``.
"""

from phalanx.online.base import OnlineLearner
from phalanx.online.betting import CoinBetting, HalfLine
from phalanx.online.reduction import DirectionMagnitude, UnitBallOGD, parameter_free
from phalanx.online.robust import RobustMagnitude, robust

__all__ = [
    "CoinBetting", "DirectionMagnitude", "HalfLine", "OnlineLearner", "RobustMagnitude", "UnitBallOGD",
    "parameter_free", "robust",
]
