"""Targeted label flipping (Tolpegin et al., ESORICS 2020): one source class relabelled as one target class."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.attacks.registry import register
from phalanx.errors import ConfigError
from phalanx.validate import check_int

__all__ = ["TargetFlip"]


@register
class TargetFlip(DataAttack):
    r"""Targeted label flipping: a Byzantine worker trains on its own inputs with every example of class ``source``
    relabelled ``target``, the other labels kept.

    .. math:: y' = \begin{cases} c_{\mathrm{target}} & y = c_{\mathrm{source}} \\ y & \text{otherwise,} \end{cases}
              \qquad x' = x.

    Tolpegin, Truex, Gursoy & Liu, "Data Poisoning Attacks Against Federated Learning Systems", ESORICS 2020:
    the malicious participants flip the labels of one source class to one target class (their CIFAR-10
    experiments: dog → cat, 5 → 3, the defaults here; Fashion-MNIST: shirt → T-shirt/top, 6 → 0). The worker then
    computes an ordinary gradient, so its vector looks honest to the server; the attack's effect is the source
    class's recall, not the overall accuracy. ``labelflip`` is the untargeted map y ↦ C − 1 − y of other papers.
    """

    name: ClassVar[str] = "targetflip"
    reference: ClassVar[str] = (
        "V. Tolpegin, S. Truex, M. E. Gursoy, L. Liu, 'Data Poisoning Attacks Against Federated Learning Systems', "
        "ESORICS 2020 (label flipping from a source class to a target class)"
    )

    def __init__(self, source: int = 5, target: int = 3) -> None:
        self.source = check_int("source", source, low=0)
        self.target = check_int("target", target, low=0)
        if self.source == self.target:
            raise ConfigError("target", target, f"a class other than source = {source}")

    def prepare(self, train_x: Tensor, train_y: Tensor, num_classes: int) -> None:
        """Both classes must be classes of the data set (before the run trains)."""
        for key, value in (("source", self.source), ("target", self.target)):
            if value >= num_classes:
                raise ConfigError(f"attack_params.{key}", value, f"a class of the data set: 0 … {num_classes - 1}")

    def _transform(
        self, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        return x, torch.where(y == self.source, torch.full_like(y, self.target), y)
