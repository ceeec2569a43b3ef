"""A pixel-pattern backdoor with a target label, and model-replacement boosting of the poisoned update."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.attacks.registry import register
from phalanx.validate import check_int, check_real

__all__ = ["Backdoor"]


@register
class Backdoor(DataAttack):
    r"""Backdoor: a Byzantine worker trains on batches in which a fraction of the inputs carry a trigger and the
    target label; ``boost`` scales its federated update (model replacement).

    Trigger (BadNets' pixel pattern; Gu, Dolan-Gavitt & Garg, "BadNets", 2017, §3): the bottom-right ``size × size``
    square of every channel of an image ``(C, H, W)`` set to ``value`` (in the data set's standardised units; the
    default 2.5 is brighter than almost every pixel), or the last ``size²`` features of a flat input. In each
    poisoned batch, ``poison_fraction`` of the samples (drawn from the attack stream) get the trigger and label
    ``target``; the rest stay clean, so the worker's model keeps its accuracy on clean data (Bagdasaryan et al.,
    "How to backdoor federated learning", AISTATS 2020, §4.1: clean and backdoored inputs mixed in every batch).

    Boosting (model replacement, Bagdasaryan et al. Eq. 3: the update scaled by γ = n/η so that it survives the
    averaging; explicit boosting, Bhagoji et al., "Analyzing federated learning through an adversarial lens", ICML
    2019, §3): a federated Byzantine client sends ``boost`` × its pseudo-gradient. Distributed SGD carries a
    worker's vector into its momentum, so boosting applies to federated rounds only (``boost = 1`` otherwise).

    Metric: the attack success rate — the share of the test inputs not of class ``target`` that the model, given the
    trigger, classifies as ``target`` — is logged beside the accuracy (``attack_success``).
    """

    name: ClassVar[str] = "backdoor"
    reference: ClassVar[str] = (
        "T. Gu, B. Dolan-Gavitt, S. Garg, 'BadNets', arXiv:1708.06733, 2017 (pixel-pattern trigger); E. Bagdasaryan "
        "et al., 'How to backdoor federated learning', AISTATS 2020, Eq. 3 (model replacement); A. N. Bhagoji et "
        "al., ICML 2019 (explicit boosting)"
    )
    threat: ClassVar[str] = "data and its own update: trains on triggered inputs, may scale what it sends"

    def __init__(
        self, target: int = 0, size: int = 2, value: float = 2.5, poison_fraction: float = 0.5, boost: float = 1.0,
    ) -> None:
        self.target = check_int("target", target, low=0)
        self.size = check_int("size", size, low=1)
        self.value = check_real("value", value)
        self.poison_fraction = check_real("poison_fraction", poison_fraction, low=0.0, low_open=True, high=1.0)
        self.boost = check_real("boost", boost, low=0.0, low_open=True)

    def params(self) -> dict[str, Any]:
        return {"target": self.target, "size": self.size, "value": self.value,
                "poison_fraction": self.poison_fraction, "boost": self.boost}

    def trigger(self, x: Tensor) -> Tensor:
        """``x`` (a batch ``(B, ...)``) with the trigger stamped on every input (a new tensor)."""
        out = x.clone()
        s = self.size
        if out.dim() >= 4:  # (B, C, H, W)
            out[..., -min(s, out.shape[-2]):, -min(s, out.shape[-1]):] = self.value
        else:
            flat = out.reshape(out.shape[0], -1)
            flat[:, -min(s * s, flat.shape[1]):] = self.value
            out = flat.reshape(out.shape)
        return out

    def _transform(
        self, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        b = y.shape[0]
        k = max(1, round(self.poison_fraction * b))
        chosen = torch.randperm(b, generator=generator)[:k].to(x.device)  # drawn on the CPU stream
        x2, y2 = x.clone(), y.clone()
        x2[chosen] = self.trigger(x[chosen])
        y2[chosen] = min(self.target, num_classes - 1)
        return x2, y2

    def metrics(self, predict: Callable[[Tensor], Tensor], test_x: Tensor, test_y: Tensor) -> dict[str, float]:
        """``attack_success``: the share of the triggered test inputs not of the target class that ``predict``
        (inputs → class indices) puts in the target class."""
        keep = test_y != self.target
        if not bool(keep.any()):
            return {"attack_success": float("nan")}
        predicted = predict(self.trigger(test_x[keep]))
        return {"attack_success": float((predicted == self.target).double().mean())}
