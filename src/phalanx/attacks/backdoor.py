"""A pixel-pattern backdoor with a target label, and model-replacement boosting of the poisoned update."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.attacks.registry import register
from phalanx.errors import ConfigError
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

    Durability: with ``stop_round = s`` the Byzantine workers poison rounds ``0 … s−1`` only and behave honestly from
    round ``s`` on; every metric row then carries ``rounds_since_stop`` (its ``round`` − s, None before), so the
    attack's durability k rounds after it stopped is ``attack_success`` on the row with ``rounds_since_stop = k``.

    A trigger larger than the images (``size`` > H or W, ``size²`` > the features of a flat input) is refused when
    the run is built (:meth:`prepare`).
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
        stop_round: int | None = None,
    ) -> None:
        self.target = check_int("target", target, low=0)
        self.size = check_int("size", size, low=1)
        self.value = check_real("value", value)
        self.poison_fraction = check_real("poison_fraction", poison_fraction, low=0.0, low_open=True, high=1.0)
        self.boost = check_real("boost", boost, low=0.0, low_open=True)
        self.stop_round = None if stop_round is None else check_int("stop_round", stop_round, low=1)

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "size": self.size, "value": self.value,
                               "poison_fraction": self.poison_fraction, "boost": self.boost}
        if self.stop_round is not None:  # left out by default: the attack's repr (a run's identity) is unchanged
            out["stop_round"] = self.stop_round
        return out

    def prepare(self, train_x: Tensor, train_y: Tensor, num_classes: int) -> None:
        """Refuse a target outside the classes or a trigger larger than the inputs (:meth:`pattern`)."""
        if self.target >= num_classes:
            raise ConfigError("target", self.target, f"a class in [0, {num_classes - 1}]")
        self.pattern(tuple(train_x.shape[1:]))

    def pattern(self, shape: tuple[int, ...]) -> Tensor:
        """Where the trigger goes on one input of ``shape`` (a bool mask of that shape): the bottom-right
        ``size × size`` square of every channel of an image ``(C, H, W)``, or the last ``size²`` features of a flat
        input; a :class:`ConfigError` naming ``size`` when it does not fit."""
        mask = torch.zeros(shape, dtype=torch.bool)
        s = self.size
        if len(shape) >= 3:
            if s > shape[-2] or s > shape[-1]:
                raise ConfigError("size", s, f"<= the image's height and width {shape[-2]}×{shape[-1]} (a trigger "
                                  "larger than the image)")
            mask[..., -s:, -s:] = True
        else:
            flat = mask.view(-1)
            if s * s > flat.numel():
                raise ConfigError("size", s, f"size² <= the input's {flat.numel()} features (a trigger larger than "
                                  "the input)")
            flat[-s * s :] = True
        return mask

    def stamp(self, x: Tensor, mask: Tensor) -> Tensor:
        """``x`` (a batch ``(B, ...)``) with ``value`` written where ``mask`` (one input's shape) is set (new)."""
        return torch.where(mask.to(x.device), torch.as_tensor(self.value, dtype=x.dtype, device=x.device), x)

    def trigger(self, x: Tensor) -> Tensor:
        """``x`` (a batch ``(B, ...)``) with the trigger stamped on every input (a new tensor); a trigger larger
        than the input is cut to it here (stand-alone use; a run refuses it, :meth:`prepare`)."""
        out = x.clone()
        s = self.size
        if out.dim() >= 4:  # (B, C, H, W)
            out[..., -min(s, out.shape[-2]):, -min(s, out.shape[-1]):] = self.value
        else:
            flat = out.reshape(out.shape[0], -1)
            flat[:, -min(s * s, flat.shape[1]):] = self.value
            out = flat.reshape(out.shape)
        return out

    def local_trigger(self, x: Tensor, attacker: int) -> Tensor:
        """The trigger Byzantine worker ``attacker`` trains with: the whole trigger (DBA: its own part)."""
        return self.trigger(x)

    def _transform(
        self, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        return self._transform_as(0, x, y, num_classes, generator)

    def _transform_as(
        self, attacker: int, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        b = y.shape[0]
        k = max(1, round(self.poison_fraction * b))
        chosen = torch.randperm(b, generator=generator)[:k].to(x.device)  # drawn on the CPU stream
        x2, y2 = x.clone(), y.clone()
        x2[chosen] = self.local_trigger(x[chosen], attacker)
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
