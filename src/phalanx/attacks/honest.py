"""``honest``: the all-honest baseline at the same n — the Byzantine workers compute real gradients on their own
data."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.attacks.registry import register

__all__ = ["Honest"]


@register
class Honest(DataAttack):
    r"""No attack at all: every would-be Byzantine worker trains on its own batch, unchanged,

    .. math:: (x', y') = (x, y),

    and sends the vector an honest worker would — its own gradient (or update) on its own shard, not a copy of
    another worker's. The run is then an all-honest run of n workers whose last ``byzantine`` are only *labelled*
    Byzantine (their share of the aggregate is still measured): the baseline against which the price of robustness
    (Yang, Shi & Li, ICML 2025) is measured at the same n and with the same data as the runs under attack. ``none``
    is the vector-level stand-in: its Byzantine workers replay copies of honest rows, so the rule sees duplicates.
    """

    name: ClassVar[str] = "honest"
    reference: ClassVar[str] = ("the all-honest baseline: Byzantine workers compute real gradients on their own data "
                                "(no attack)")
    threat: ClassVar[str] = "none (is honest)"
    baseline: ClassVar[bool] = True

    def _transform(
        self, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        return x, y
