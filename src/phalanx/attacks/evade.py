"""An attack that adapts to the asynchronous server's filter: the most harmful update it still accepts.

Kardam's Lipschitz filter, Zeno++'s validation score and AFLGuard's ball (:mod:`phalanx.training.algorithms.kardam`,
:mod:`~phalanx.training.algorithms.zenopp`, :mod:`~phalanx.training.algorithms.aflguard`) each accept an update
when a test on it passes. An attacker with full power knows the test and the server's state it is judged at (the
last accepted update and θ for Kardam, the validation gradient v for Zeno++, the trusted update g₀ for AFLGuard):
Phalanx gives it the test as an oracle (``AttackContext.screen``: candidate rows → accepted or not, judged as the
server judges this step's updates after its honest ones, nothing committed). Phalanx's own attack (not a published
one; the idea — search the largest perturbation the defence still accepts — is min-max's, Shejwalkar & Houmansadr,
NDSS 2021): walk from the honest mean ḡ (an honest-looking update, which the filter usually accepts) towards a
harmful target y,

    g(α) = (1 − α) ḡ + α y,    α ∈ [0, 1],

and send g(α*) with α* the largest α of a bisection of ``steps`` halvings whose every Byzantine row the oracle
accepts (α* = 1 when the target itself passes; α* = 0, the honest mean, when no tried α passes — the attacker then
behaves honestly). Targets (``target``):

* ``"signflip"``: y = −s ḡ (``s`` = ``scale``), the sign flip of :class:`~phalanx.attacks.scaling.SignFlip`. The
  path stays on the line of ḡ: g(α) = (1 − α(1 + s)) ḡ, a flip once α > 1/(1 + s). Against AFLGuard the search finds
  the flip that just fits the ball (‖cḡ − g₀‖ ≤ λ‖g₀‖: c ≈ 1 − λ when ḡ ≈ g₀) without being told λ; against
  Kardam the flip whose Lipschitz coefficient ‖g − ĝ‖/‖θ − θ̂‖ is just under the quantile. Zeno++ normalises every
  update to ‖v‖, so on this line its test sees only the sign: the search can only send a positive multiple of ḡ
  (an honest direction).
* ``"drift"``: y = s ‖ḡ‖ u with u a fixed unit direction (standard normal in float64 drawn from ``seed``, the same at
  every step) orthogonalised against ḡ at each step: u = (z − ⟨z, ḡ⟩ḡ/‖ḡ‖²)/‖·‖. Against Zeno++ the search ends
  where cos(v, g) is just above the test's threshold ρ − ε/‖v‖² (``rho``, ``epsilon``), so each accepted update moves
  θ by γ‖v‖ mostly along u: a consistent drift that is first-order neutral on the validation loss (⟨v, u⟩ ≈ 0 when
  ḡ ≈ v) and descends on it by the little the test demands.

What it assumes it knows: every honest update of the step (omniscient, ``ctx.honest``: their mean ḡ) and the
server's filter (``ctx.screen``); nothing else (not v, g₀ or θ themselves). Where the server has no filter
(``ctx.screen`` is None: every synchronous algorithm, FedBuff, BASGD) every update is accepted, α* = 1, and it sends
its target — ``evade(target = "signflip", scale = s)`` is then ``signflip(scale = s)``. All ``b`` rows are the same
vector. Cost: at most ``steps`` + 1 calls of the filter per step. Deterministic (no draw from ``ctx.generator``; the
drift direction is a function of ``seed`` and the dimension).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks._common import check_choice, check_int, check_real, honest_mean, repeat_row
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["TARGETS", "Evade", "drift_direction", "target_vector"]

TARGETS = ("signflip", "drift")
"""What the attack walks towards (see the module's docstring)."""


def drift_direction(mean: Tensor, seed: int) -> Tensor:
    """u: the unit direction drawn once from ``seed`` (standard normal, float64, CPU), orthogonalised against the
    honest mean ``mean`` (in ``mean``'s dtype and device); ``mean`` itself normalised when z ∥ ḡ (never for d > 1
    in practice)."""
    z = torch.randn(mean.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    z = z.to(mean)
    sq = mean.dot(mean)
    u = z - (z.dot(mean) / sq) * mean if float(sq) > 0 else z
    norm = torch.linalg.vector_norm(u)
    return u / norm if float(norm) > 0 else z / torch.linalg.vector_norm(z)


def target_vector(mean: Tensor, target: str, scale: float, seed: int) -> Tensor:
    """y: ``−scale · ḡ`` (``"signflip"``) or ``scale · ‖ḡ‖ · u`` (``"drift"``, :func:`drift_direction`)."""
    if target == "signflip":
        return mean * (-scale)
    return drift_direction(mean, seed) * (scale * torch.linalg.vector_norm(mean))


@register
class Evade(Attack):
    r"""The most harmful update the server's filter still accepts: the bisection's largest α with
    g(α) = (1 − α) ḡ + α y accepted (see the module's docstring).

    .. math:: \alpha^* = \max\{\alpha \in \{0, 2^{-k}, \dots, 1\} : \mathrm{screen}((1-\alpha)\bar g + \alpha y)\},
        \qquad y \in \{-s\bar g,\ s\|\bar g\| u\}.
    """

    name: ClassVar[str] = "evade"
    reference: ClassVar[str] = (
        "Phalanx's filter-adaptive attack (its own): a bisection towards a sign flip or a fixed drift against the "
        "asynchronous filter's test as an oracle; the search idea of V. Shejwalkar, A. Houmansadr, 'Manipulating the "
        "Byzantine', NDSS 2021 (min-max)"
    )
    threat: ClassVar[str] = "omniscient: sees every honest vector of the step and the server's filter (an oracle)"

    def __init__(self, target: str = "signflip", scale: float = 10.0, steps: int = 12, seed: int = 0) -> None:
        self.target = check_choice("target", target, TARGETS)
        self.scale = check_real("scale", scale, low=0.0, low_open=True)
        self.steps = check_int("steps", steps, low=1, high=52)
        self.seed = check_int("seed", seed, low=0)

    def _run(self, ctx: AttackContext) -> Tensor:
        mean = honest_mean(ctx.honest)
        y = target_vector(mean, self.target, self.scale, self.seed)
        b = ctx.n_byzantine
        screen = ctx.screen
        if screen is None or passes(screen, y, b, ctx.honest):
            return repeat_row(y, b, ctx.honest)
        lo, hi = 0.0, 1.0
        for _ in range(self.steps):
            mid = (lo + hi) / 2
            if passes(screen, mean + mid * (y - mean), b, ctx.honest):
                lo = mid
            else:
                hi = mid
        return repeat_row(mean + lo * (y - mean), b, ctx.honest)


def passes(screen: Callable[[Tensor], Tensor], vector: Tensor, b: int, like: Tensor) -> bool:
    """Whether the filter accepts all ``b`` rows of ``vector`` (sent in the honest rows' dtype and device)."""
    return bool(screen(repeat_row(vector, b, like)).all())
