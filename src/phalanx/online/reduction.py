r"""From one dimension to ℝ^d: the direction × magnitude reduction, and the plain parameter-free learner built on it.

**Direction × magnitude** (Cutkosky & Orabona, "Black-box reductions for parameter-free online learning in Banach
spaces", COLT 2018, Section 3): play :math:`w_t = y_t x_t`, with :math:`x_t` from a learner on the unit ball fed
:math:`g_t` and :math:`y_t \in \mathbb R` from a 1-D learner fed the scalar :math:`s_t = \langle g_t, x_t\rangle`.
For every u ≠ 0,

.. math:: \sum_t \langle g_t, w_t - u\rangle
          = \underbrace{\sum_t s_t\,(y_t - \|u\|)}_{R^{1D}_T(\|u\|)}
          + \|u\|\underbrace{\sum_t \langle g_t, x_t - u/\|u\|\rangle}_{R^{\rm ball}_T(u/\|u\|)},

an identity (expand :math:`y_t x_t - u = (y_t - \|u\|)x_t + \|u\|(x_t - u/\|u\|)`), so a parameter-free 1-D
learner and a bounded-domain learner make a parameter-free learner on ℝ^d, with :math:`|s_t| \le \|g_t\|`.

**The unit ball** (:class:`UnitBallOGD`): projected online gradient descent with the adaptive step
:math:`\eta_t = D/\sqrt{2\sum_{s\le t}\|g_s\|^2}` for a domain of diameter D = 2, i.e.
:math:`x_{t+1} = \Pi_{\|x\|\le1}(x_t - \eta_t g_t)`, :math:`x_1 = 0`; its regret is at most
:math:`\sqrt2\,D\sqrt{\sum_t\|g_t\|^2} = 2\sqrt2\sqrt{\sum_t\|g_t\|^2}` (Orabona, "A modern introduction to online
learning", arXiv:1912.13213, the adaptive-step theorem for OGD, §4.2; Streeter & McMahan 2010).

**Clipping and bad gradients.** :class:`DirectionMagnitude` clips every gradient to norm ≤ G before either learner
sees it (so :math:`|s_t| \le G`, the scalar clip of Zhang & Cutkosky 2025, eq. (5), in its 1-D form) and skips a
non-finite one (:mod:`phalanx.online.base`). With k = 0 corruptions that is a plain parameter-free learner
(:func:`parameter_free`); the corruption-robust one (:func:`phalanx.online.robust.robust`) swaps in a robust 1-D
magnitude learner.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.online.base import (
    DTYPE,
    OnlineLearner,
    ScalarLearner,
    as_gradient,
    check_bound,
    check_dim,
    check_keys,
    load_scalars,
    prefixed,
    scalars,
    sub,
)
from phalanx.online.betting import CoinBetting

__all__ = ["DirectionMagnitude", "UnitBallOGD", "parameter_free"]


class UnitBallOGD:
    """Projected OGD on the unit ball of ℝ^d with the adaptive step √2 / √(Σ‖g_s‖²) (see the module)."""

    def __init__(self, dim: int) -> None:
        self.dim = check_dim(dim)
        self.x = torch.zeros(self.dim, dtype=DTYPE)
        self.squares = 0.0

    def predict(self) -> Tensor:
        return self.x.clone()

    def update(self, g: Tensor) -> None:
        self.squares += float(g @ g)
        if self.squares > 0.0:
            x = self.x - (math.sqrt(2.0) / math.sqrt(self.squares)) * g
            n = float(torch.linalg.vector_norm(x))
            self.x = x / n if n > 1.0 else x

    def state_dict(self) -> dict[str, Tensor]:
        return {"x": self.x.clone(), **scalars("", squares=self.squares)}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        check_keys(state, {"x", "squares"}, "UnitBallOGD")
        x = state["x"]
        if x.shape != (self.dim,):
            raise ConfigError("learner state", tuple(x.shape), f"x of shape ({self.dim},) (UnitBallOGD)")
        self.x = x.detach().to(device="cpu", dtype=DTYPE).clone()
        self.squares = load_scalars(state, "", ("squares",), "UnitBallOGD")["squares"]


class DirectionMagnitude(OnlineLearner):
    """``w_t = y_t · x_t``: ``magnitude`` (1-D, fed ⟨g, x_t⟩) times a :class:`UnitBallOGD` direction, every gradient
    clipped to norm ≤ ``gradient_bound`` (G) and non-finite ones skipped (see the module).

    ``skipped`` counts the skipped rounds and ``clipped`` the rounds whose gradient was longer than G.
    """

    def __init__(self, dim: int, magnitude: ScalarLearner, gradient_bound: float) -> None:
        self.dim = check_dim(dim)
        self.gradient_bound = check_bound("gradient_bound", gradient_bound)
        self.magnitude = magnitude
        self.direction = UnitBallOGD(self.dim)
        self.rounds = self.skipped = self.clipped = 0

    def predict(self) -> Tensor:
        return self.magnitude.predict() * self.direction.predict()

    def update(self, g: Tensor) -> None:
        v, ok = as_gradient(g, self.dim)
        self.rounds += 1
        if not ok:
            self.skipped += 1
        n = float(torch.linalg.vector_norm(v))
        if n > self.gradient_bound:
            self.clipped += 1
            v = v * (self.gradient_bound / n)
        s = float(v @ self.direction.x)
        self.magnitude.update(min(max(s, -self.gradient_bound), self.gradient_bound))
        self.direction.update(v)

    def state_dict(self) -> dict[str, Tensor]:
        return {
            **prefixed(self.magnitude.state_dict(), "magnitude."),
            **prefixed(self.direction.state_dict(), "direction."),
            **scalars("", rounds=self.rounds, skipped=self.skipped, clipped=self.clipped),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        own = ("rounds", "skipped", "clipped")
        known = {k for k in state if k.startswith(("magnitude.", "direction."))} | set(own)
        check_keys(state, known, type(self).__name__)
        v = load_scalars(state, "", own, type(self).__name__)
        self.magnitude.load_state_dict(sub(state, "magnitude."))
        self.direction.load_state_dict(sub(state, "direction."))
        self.rounds, self.skipped, self.clipped = (int(v[k]) for k in own)


def parameter_free(dim: int, gradient_bound: float, epsilon: float = 1.0) -> DirectionMagnitude:
    """The plain (undefended) parameter-free learner on ℝ^d: coin betting with ONS fractions
    (:class:`~phalanx.online.betting.CoinBetting`, bound G, initial wealth ε) as the magnitude, clipping at G.

    Uncorrupted, its regret is :math:`G\\epsilon + \\tilde O(\\|u\\|G\\sqrt T)` (the two bounds above added); a
    corrupted round, though, is paid for at the size of the point then played, which nothing keeps small.
    """
    check_dim(dim)
    check_bound("gradient_bound", gradient_bound)
    return DirectionMagnitude(dim, CoinBetting(gradient_bound, epsilon), gradient_bound)
