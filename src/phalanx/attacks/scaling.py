"""Attacks that send a negative multiple of the honest mean: sign flipping, IPM and Fall of Empires.

All three send ``−c · ḡ`` with ``ḡ = (1/h) Σ_i x_i`` the mean of the honest vectors; they differ in the paper
they come from and in the default ``c``. They are kept as separate, documented presets because the literature
(and the peer libraries) compare them under these names.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from phalanx.attacks._common import check_real, honest_mean, repeat_row
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["FallOfEmpires", "InnerProductManipulation", "SignFlip", "negative_mean", "negative_of"]

_XIE = (
    "C. Xie, O. Koyejo, I. Gupta, 'Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product "
    "Manipulation', UAI 2019 (PMLR 115, 2020)"
)


def negative_of(mean: Tensor, factor: float) -> Tensor:
    """``−factor · mean`` (the one formula, shared with ``optimal`` so both give bit-identical vectors)."""
    return mean * (-factor)


def negative_mean(honest: Tensor, factor: float) -> Tensor:
    """``−factor · ḡ``, shape ``(d,)``: the one vector of the whole family."""
    return negative_of(honest_mean(honest), factor)


@register
class SignFlip(Attack):
    r"""Sign flipping: every Byzantine worker sends the honest mean with its sign flipped, scaled by ``s``.

    .. math:: y_i = -s\,\bar g, \qquad \bar g = \frac1h \sum_{j=1}^{h} x_j, \qquad s > 0 \ (\text{default } 1).

    Reference: Allen-Zhu, Ebrahimian, Li & Alistarh, "Byzantine-resilient non-convex stochastic gradient descent",
    ICLR 2021 (the sign-flipping attack of their experiments); ByzFL's ``SignFlipping`` is ``s = 1``.
    """

    name: ClassVar[str] = "signflip"
    reference: ClassVar[str] = (
        "Z. Allen-Zhu, F. Ebrahimian, J. Li, D. Alistarh, 'Byzantine-Resilient Non-Convex Stochastic Gradient "
        "Descent', ICLR 2021 (sign-flipping attack); ByzFL SignFlipping"
    )
    solo = True  # a function of the honest mean alone

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = check_real("scale", scale, low=0.0, low_open=True)

    def _run(self, ctx: AttackContext) -> Tensor:
        return repeat_row(negative_mean(ctx.honest, self.scale), ctx.n_byzantine, ctx.honest)


@register
class InnerProductManipulation(Attack):
    r"""Inner-product manipulation (IPM), small-ε preset: send :math:`-\varepsilon\,\bar g`.

    .. math:: y_i = -\varepsilon\,\bar g, \qquad \varepsilon > 0 \ (\text{default } 0.1).

    Xie, Koyejo & Gupta (UAI 2019) make the inner product between the aggregate and the true gradient negative.
    With a *small* ε the Byzantine vectors sit close to the honest ones, so distance-based rules such as Krum select
    them (the paper's attack on Krum); ε = 0.1 is a setting commonly used for IPM in later benchmarks. For the
    large-ε preset see :class:`FallOfEmpires` (``foe``).
    """

    name: ClassVar[str] = "ipm"
    reference: ClassVar[str] = _XIE + " (inner product manipulation), small-epsilon preset"
    solo = True  # a function of the honest mean alone

    def __init__(self, epsilon: float = 0.1) -> None:
        self.epsilon = check_real("epsilon", epsilon, low=0.0, low_open=True)

    def _run(self, ctx: AttackContext) -> Tensor:
        return repeat_row(negative_mean(ctx.honest, self.epsilon), ctx.n_byzantine, ctx.honest)


@register
class FallOfEmpires(Attack):
    r"""Fall of Empires (FOE): the same inner-product manipulation with a large ε (default 2).

    .. math:: y_i = -\varepsilon\,\bar g = (1 - \tau)\,\bar g, \qquad \tau = 1 + \varepsilon.

    Large ε pushes coordinate-wise rules (median, trimmed mean) towards the negative of the true gradient when the
    Byzantine vectors outnumber the honest spread (Xie, Koyejo & Gupta, UAI 2019). The default ε = 2 is
    the vector ByzFL sends by default — ByzFL 0.0.11's ``InnerProductManipulation(tau=2.0)`` (:math:`-\tau\bar g`)
    and its earlier ``FallOfEmpires(tau=3)`` (:math:`(1-\tau)\bar g`) — so results are comparable with ByzFL's;
    ``foe(epsilon=e)`` and ``ipm(epsilon=e)`` send the same vector.
    """

    name: ClassVar[str] = "foe"
    reference: ClassVar[str] = (
        _XIE + ", large-epsilon preset (ByzFL 0.0.11 InnerProductManipulation default tau = 2)"
    )
    solo = True  # a function of the honest mean alone

    def __init__(self, epsilon: float = 2.0) -> None:
        self.epsilon = check_real("epsilon", epsilon, low=0.0, low_open=True)

    def _run(self, ctx: AttackContext) -> Tensor:
        return repeat_row(negative_mean(ctx.honest, self.epsilon), ctx.n_byzantine, ctx.honest)
