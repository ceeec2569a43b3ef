r"""The learners the regret check runs, by name: the corruption-robust learner and the mutants the check must reject.

A check that no wrong learner fails checks nothing, so :mod:`phalanx.online.check` runs these beside the real one
(``--learners``) and ``tests/test_online_check.py`` asserts that each mutant breaks the fixed bound
(:mod:`phalanx.online.bound`) on a cell named in :data:`REJECTED_ON`, while the real learner keeps it there:

- ``robust``: :func:`phalanx.online.robust.robust`, the learner under test (c = 2kG).
- ``plain``: the undefended parameter-free learner (:func:`~phalanx.online.reduction.parameter_free`): it ignores
  the corruption altogether (no regulariser, c = 0), though it still clips at G.
- ``no-k-term``: the robust learner with its regulariser's weight c = 2G whatever k it is told — the k-term
  removed. Against few corruptions it pays less than the real one (its regulariser is k times lighter); the bias it
  leaves uncancelled, :math:`2(k-1)G\max_s|y_s|`, shows once the adversary gets k ≫ ln T rounds to push it out.
- ``wrong-step``: the robust learner whose direction learner steps 100 times too far
  (:math:`\eta_t = 100\sqrt2/\sqrt{\sum_s\|g_s\|^2}`): its direction jumps to wherever the last gradient points,
  so the magnitude cannot settle and the regret against u ≠ 0 grows like T, not √T. (A step 100 times too *short* is
  not a mutant this check can see: the parameter-free magnitude makes up for a short direction, and its regret was
  no larger than the real learner's.)
- ``wrong-scale``: the robust learner whose magnitude bets from a wealth of 1000·ε while it is told ε (the scale of
  its first moves 1000 times too large): its regret against u = 0 leaves the proven :math:`(2+6k)G\epsilon`.

Each is built as the real learner and then has one piece swapped, so nothing else about it differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.online.base import OnlineLearner
from phalanx.online.betting import CoinBetting, HalfLine
from phalanx.online.reduction import DirectionMagnitude, UnitBallOGD, parameter_free
from phalanx.online.robust import RobustMagnitude, robust

__all__ = ["LEARNERS", "MUTANTS", "REJECTED_ON", "make"]

Factory = Callable[[int, float, int, int, float], OnlineLearner]
"""``(dim, G, k, T, epsilon) -> learner``: k is the budget it is told, T the horizon."""


def _robust(dim: int, G: float, k: int, T: int, eps: float) -> OnlineLearner:
    return robust(dim, G, k, T, eps)


def _plain(dim: int, G: float, k: int, T: int, eps: float) -> OnlineLearner:
    return parameter_free(dim, G, eps)


def _magnitude(learner: DirectionMagnitude) -> RobustMagnitude:
    m = learner.magnitude
    assert isinstance(m, RobustMagnitude)
    return m


def _no_k_term(dim: int, G: float, k: int, T: int, eps: float) -> OnlineLearner:
    learner = robust(dim, G, k, T, eps)
    m = _magnitude(learner)
    c = 2.0 * G  # the regulariser's weight without its k
    m.weight, m.composite_bound = c, G + c
    m.x = CoinBetting(m.composite_bound, eps)
    m.y = HalfLine(CoinBetting(m.composite_bound * c, eps / c))
    return learner


class _LongStep(UnitBallOGD):
    """Unit-ball OGD with its adaptive step scaled by 100."""

    def update(self, g: Tensor) -> None:
        self.squares += float(g @ g)
        if self.squares > 0.0:
            x = self.x - (100.0 * math.sqrt(2.0) / math.sqrt(self.squares)) * g
            n = float(x.norm())
            self.x = x / n if n > 1.0 else x


def _wrong_step(dim: int, G: float, k: int, T: int, eps: float) -> OnlineLearner:
    learner = robust(dim, G, k, T, eps)
    learner.direction = _LongStep(dim)
    return learner


def _wrong_scale(dim: int, G: float, k: int, T: int, eps: float) -> OnlineLearner:
    learner = robust(dim, G, k, T, eps)
    m = _magnitude(learner)
    m.x = CoinBetting(m.composite_bound, 1000.0 * eps)
    return learner


LEARNERS: dict[str, Factory] = {
    "robust": _robust, "plain": _plain, "no-k-term": _no_k_term, "wrong-step": _wrong_step,
    "wrong-scale": _wrong_scale,
}
"""Every learner the check can run, by name."""

MUTANTS = tuple(n for n in LEARNERS if n != "robust")
"""The learners the check must reject."""

REJECTED_ON: dict[str, tuple[str, str, int, int, float]] = {
    "plain": ("convex", "push", 1000, 32, 0.0),
    "no-k-term": ("convex", "push", 1000, 128, 0.0),
    "wrong-step": ("convex", "none", 4000, 0, 10.0),
    "wrong-scale": ("linear", "none", 1000, 0, 0.0),
}
"""For each mutant, one cell (problem, attack, T, k, ‖u‖) on which it breaks the fixed bound with every seed checked
and the real learner keeps it (tests/test_online_check.py; the measured ratios are in docs/online.md). (With no
attack and u = 0 the ``convex`` problem never moves any learner — its subgradient at w = 0 is 0 — so u = 0 without
attack is checked on ``linear``.)"""


def make(name: str, dim: int, gradient_bound: float, corruptions: int, horizon: int,
         epsilon: float = 1.0) -> OnlineLearner:
    """The learner ``name`` (:data:`LEARNERS`) on ℝ^dim, told the gradient bound G, the budget k and the horizon T."""
    if name not in LEARNERS:
        raise ConfigError("learner", name, ", ".join(LEARNERS))
    return LEARNERS[name](dim, gradient_bound, corruptions, horizon, epsilon)
