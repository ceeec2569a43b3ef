"""Label flipping, a data-level attack."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.attacks.registry import register

__all__ = ["LabelFlip"]


@register
class LabelFlip(DataAttack):
    r"""Label flipping: a Byzantine worker trains on its own inputs with every label reversed.

    .. math:: y' = (C - 1) - y, \qquad x' = x,

    for ``C = num_classes`` classes (on 10 classes: 0↔9, 1↔8, …). The worker then computes an ordinary gradient on
    ``(x, y')``, so its vector looks honest to the server. Tolpegin, Truex, Gursoy & Liu, "Data Poisoning Attacks
    Against Federated Learning Systems", ESORICS 2020 (label flipping); the ``C − 1 − y`` map is the one of
    Allen-Zhu et al. (ICLR 2021) and Karimireddy et al. (ICML 2021), and ByzFL's ``LabelFlipping``.
    ``x`` is returned as is (not copied); ``y'`` is a new tensor.
    """

    name: ClassVar[str] = "labelflip"
    reference: ClassVar[str] = (
        "V. Tolpegin, S. Truex, M. E. Gursoy, L. Liu, 'Data Poisoning Attacks Against Federated Learning Systems', "
        "ESORICS 2020; y -> C - 1 - y as in Allen-Zhu et al. ICLR 2021 and ByzFL LabelFlipping"
    )

    def _transform(
        self, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        return x, (num_classes - 1) - y
