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
    ``(x, y')``, so its vector looks honest to the server. The ``C − 1 − y`` map is the one of Allen-Zhu et al.
    (ICLR 2021) and Karimireddy et al. (ICML 2021), and ByzFL's ``LabelFlipping``; it is not Tolpegin et al.'s
    (ESORICS 2020), who flip one source class to one target class: that attack is ``targetflip``.
    ``x`` is returned as is (not copied); ``y'`` is a new tensor.
    """

    name: ClassVar[str] = "labelflip"
    reference: ClassVar[str] = (
        "Z. Allen-Zhu, F. Ebrahimian, J. Li, D. Alistarh, 'Byzantine-Resilient Non-Convex Stochastic Gradient "
        "Descent', ICLR 2021 and Karimireddy et al. ICML 2021 (label flipping y -> C - 1 - y); ByzFL LabelFlipping"
    )

    def _transform(
        self, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        return x, (num_classes - 1) - y
