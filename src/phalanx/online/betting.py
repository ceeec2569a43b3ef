r"""One-dimensional parameter-free learners: coin betting with an Online-Newton-Step betting fraction, and its
restriction to the half-line.

**Coin betting** (Orabona & Pál, "Coin betting and parameter-free online learning", NeurIPS 2016): with gradients
scaled into [−1, 1], :math:`\hat g_t = g_t / H`, the learner holds a *wealth* :math:`W_t`, starting at
:math:`W_0 = \epsilon`, and bets the fraction :math:`v_t \in [-\tfrac12, \tfrac12]` of it:

.. math:: w_t = v_t W_{t-1},\qquad W_t = W_{t-1} - \hat g_t w_t = W_{t-1}(1 - \hat g_t v_t) > 0 .

Since :math:`\sum_t \hat g_t w_t = \epsilon - W_T`, a wealth that grows like :math:`\max_v \prod_t (1 - \hat g_t v)`
means low regret against *every* comparator u at once, with no learning rate to tune.

**The betting fraction** is learned by Online Newton Step on the exp-concave losses
:math:`-\ln(1 - \hat g_t v)` (Cutkosky & Orabona, "Black-box reductions for parameter-free online learning in Banach
spaces", COLT 2018, Section 3, the ONS coin-betting algorithm):

.. math:: z_t = \frac{\hat g_t}{1 - \hat g_t v_t},\qquad A_t = 1 + \sum_{s\le t} z_s^2,\qquad
          v_{t+1} = \operatorname{clip}_{[-1/2,\,1/2]}\!\Big(v_t - \frac{2}{2 - \ln 3}\,\frac{z_t}{A_t}\Big),
          \qquad v_1 = 0 .

Their regret bound (the theorem of that section; constants there) is second order: for every u ∈ ℝ, with
:math:`V_T = 1 + \sum_t \hat g_t^2`,

.. math:: \sum_t \hat g_t (w_t - u) \le \epsilon
          + O\!\Big(|u|\sqrt{V_T \ln(1 + |u| V_T/\epsilon)} + |u| \ln(1 + |u| V_T/\epsilon)\Big),

so in the gradients' own units :math:`R_T(u) \le H\epsilon + \tilde O(|u|\sqrt{\sum_t g_t^2} + |u| H)`. The
dependence on :math:`\sum_t g_t^2` rather than on :math:`H^2 T` is what the corruption-robust learner
(:mod:`phalanx.online.robust`) needs: its composite gradients are large (≈ H = (1 + k ln T)G) in a few rounds only.

**The half-line** (:class:`HalfLine`): to play y ≥ 0 with an unconstrained learner, play :math:`y_t = \max(\tilde
y_t, 0)` and feed it :math:`\tilde\ell_t = \ell_t` unless :math:`\tilde y_t < 0 < \ell_t`, when it gets 0. For
every u ≥ 0, :math:`\ell_t(y_t - u) \le \tilde\ell_t(\tilde y_t - u)` (when :math:`\tilde y_t < 0` and
:math:`\ell_t \le 0`: :math:`\ell_t(0 - u) - \ell_t(\tilde y_t - u) = -\ell_t\tilde y_t \le 0`; when
:math:`\ell_t > 0`: :math:`-\ell_t u \le 0`), so the regret on [0, ∞) is at most the inner learner's — the 1-D
case of the constraint reduction of Cutkosky & Orabona (2018, Section 4), with the same gradient bound.
"""

from __future__ import annotations

import math

from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.online.base import ScalarLearner, check_bound, check_keys, load_scalars, scalars

__all__ = ["CoinBetting", "HalfLine"]

_ONS_STEP = 2.0 / (2.0 - math.log(3.0))
_KEYS = ("wealth", "fraction", "hessian", "rounds")


class CoinBetting(ScalarLearner):
    """Coin betting with an ONS betting fraction (see the module): gradients of magnitude ≤ ``bound`` (H), initial
    wealth ``epsilon`` (ε, in the units of the points played; the regret against u = 0 is at most H·ε)."""

    def __init__(self, bound: float, epsilon: float = 1.0) -> None:
        self.bound = check_bound("gradient_bound", bound)
        self.epsilon = check_bound("epsilon", epsilon)
        self.wealth = self.epsilon
        self.fraction = 0.0
        self.hessian = 1.0
        self.rounds = 0

    def predict(self) -> float:
        return self.fraction * self.wealth

    def update(self, g: float) -> None:
        gh = min(max(g / self.bound, -1.0), 1.0)
        w = self.fraction * self.wealth
        self.wealth -= gh * w
        z = gh / (1.0 - gh * self.fraction)
        self.hessian += z * z
        self.fraction = min(max(self.fraction - _ONS_STEP * z / self.hessian, -0.5), 0.5)
        self.rounds += 1

    def state_dict(self) -> dict[str, Tensor]:
        return scalars("", wealth=self.wealth, fraction=self.fraction, hessian=self.hessian, rounds=self.rounds)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        check_keys(state, set(_KEYS), "CoinBetting")
        v = load_scalars(state, "", _KEYS, "CoinBetting")
        if not (v["wealth"] > 0 and abs(v["fraction"]) <= 0.5 and v["hessian"] >= 1 and v["rounds"] >= 0):
            raise ConfigError("learner state", v, "wealth > 0, |fraction| <= 1/2, hessian >= 1 (CoinBetting)")
        self.wealth, self.fraction, self.hessian = v["wealth"], v["fraction"], v["hessian"]
        self.rounds = int(v["rounds"])


class HalfLine(ScalarLearner):
    """``inner`` restricted to [0, ∞) (see the module): plays max(ỹ, 0), feeds 0 when ỹ < 0 < ℓ."""

    def __init__(self, inner: ScalarLearner) -> None:
        self.inner = inner

    def predict(self) -> float:
        return max(self.inner.predict(), 0.0)

    def update(self, g: float) -> None:
        self.inner.update(0.0 if (self.inner.predict() < 0.0 < g) else g)

    def state_dict(self) -> dict[str, Tensor]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.inner.load_state_dict(state)

