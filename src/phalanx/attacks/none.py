"""``none``: no Byzantine behaviour — the Byzantine workers behave honestly."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["NoAttack"]


@register
class NoAttack(Attack):
    r"""No attack: Byzantine worker ``i`` sends a copy of honest row ``i mod h``.

    .. math:: y_i = x_{(i \bmod h)}, \qquad i = 0, \dots, b - 1.

    It stands in for "the Byzantine workers follow the protocol": the server still receives ``n = h + b`` vectors
    that all come from the honest distribution, so a run with ``none`` measures an aggregator's no-attack cost
    (Yang, Shi & Li, ICML 2025) at the same ``n`` as the runs under attack — with ``b`` duplicated rows, so it is
    not the all-honest run: ``honest`` (:class:`~phalanx.attacks.honest.Honest`) makes the would-be Byzantine workers
    compute real gradients on their own data, which equals ``byzantine = 0``.
    """

    name: ClassVar[str] = "none"
    reference: ClassVar[str] = "no attack (baseline): Byzantine workers replay honest rows"
    threat: ClassVar[str] = "none (behaves honestly)"
    baseline: ClassVar[bool] = True
    solo = True  # one worker replays its own honest vector

    def _run(self, ctx: AttackContext) -> Tensor:
        rows = torch.arange(ctx.n_byzantine, device=ctx.honest.device) % ctx.n_honest
        return ctx.honest.detach().index_select(0, rows)
