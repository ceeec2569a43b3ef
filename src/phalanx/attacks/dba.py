"""DBA, the distributed backdoor attack: the global trigger split into local patterns, one per attacker."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.attacks.backdoor import Backdoor
from phalanx.attacks.registry import register
from phalanx.errors import ConfigError
from phalanx.validate import check_int

__all__ = ["DBA"]


@register
class DBA(Backdoor):
    r"""DBA: every Byzantine worker trains with its own part of a global trigger; the model is tested with the whole.

    Xie, Huang, Chen & Li, "DBA: Distributed Backdoor Attacks against Federated Learning", ICLR 2020, §2.2: the global
    trigger :math:`\tau` is decomposed into :math:`L` local patterns :math:`\tau_1 … \tau_L`
    (:math:`\tau = \bigcup_l \tau_l`); attacker :math:`j` poisons its batches with :math:`\tau_{j \bmod L}` only
    (their Eq. 3: each attacker's objective on its local trigger), and the attack succeeds when the *global* trigger
    — never used in training — makes the aggregated model predict the target.

    Pattern: ``parts`` horizontal bars of ``size`` pixels, laid out two per row from the image's top-left corner,
    ``gap`` pixels apart (the paper's Fig. 2 layout of four stripes), in every channel; a flat input gets the bars
    one after another from its first feature. Bar :math:`l` of an image sits at row :math:`\lfloor l/2\rfloor (1 +
    \text{gap})`, columns :math:`(l \bmod 2)(\text{size} + \text{gap}) + [0, \text{size})`. In each poisoned batch,
    ``poison_fraction`` of the samples get the attacker's bar and label ``target`` (as :class:`Backdoor`); ``boost``
    scales a federated update (model replacement); ``stop_round`` ends the attack (durability).

    Metric: ``attack_success`` — the share of the test inputs not of class ``target`` that the model, given the
    global trigger (every bar), puts in ``target``. A pattern larger than the image is refused when the run is built.
    """

    name: ClassVar[str] = "dba"
    reference: ClassVar[str] = (
        "C. Xie, K. Huang, P.-Y. Chen, B. Li, 'DBA: Distributed Backdoor Attacks against Federated Learning', ICLR "
        "2020, §2.2 (global trigger decomposed into local patterns)"
    )
    threat: ClassVar[str] = "data and its own update: each attacker trains on its part of the trigger"

    def __init__(
        self, target: int = 0, parts: int = 4, size: int = 3, gap: int = 1, value: float = 2.5,
        poison_fraction: float = 0.5, boost: float = 1.0, stop_round: int | None = None,
    ) -> None:
        super().__init__(target=target, size=size, value=value, poison_fraction=poison_fraction, boost=boost,
                         stop_round=stop_round)
        self.parts = check_int("parts", parts, low=2)
        self.gap = check_int("gap", gap, low=0)

    def params(self) -> dict[str, Any]:
        return {"target": self.target, "parts": self.parts, "size": self.size, "gap": self.gap, "value": self.value,
                "poison_fraction": self.poison_fraction, "boost": self.boost,
                **({"stop_round": self.stop_round} if self.stop_round is not None else {})}

    def part(self, shape: tuple[int, ...], index: int) -> Tensor:
        """Local pattern ``index`` (``0 … parts−1``) on one input of ``shape``, a bool mask; a :class:`ConfigError`
        naming ``size`` when the global pattern does not fit."""
        mask = torch.zeros(shape, dtype=torch.bool)
        s, gap, parts = self.size, self.gap, self.parts
        if len(shape) >= 3:
            height = ((parts + 1) // 2 - 1) * (1 + gap) + 1
            width = (min(parts, 2) - 1) * (s + gap) + s
            if height > shape[-2] or width > shape[-1]:
                raise ConfigError("size", s, f"a DBA pattern of {parts} bars ({height}×{width} pixels with gap={gap}) "
                                  f"within the {shape[-2]}×{shape[-1]} image (a trigger larger than the image)")
            row, col = (index // 2) * (1 + gap), (index % 2) * (s + gap)
            mask[..., row, col : col + s] = True
        else:
            flat = mask.view(-1)
            length = parts * s + (parts - 1) * gap
            if length > flat.numel():
                raise ConfigError("size", s, f"a DBA pattern of {parts} bars ({length} features with gap={gap}) "
                                  f"within the input's {flat.numel()} features (a trigger larger than the input)")
            start = index * (s + gap)
            flat[start : start + s] = True
        return mask

    def pattern(self, shape: tuple[int, ...]) -> Tensor:
        """The global trigger on one input of ``shape``: every local pattern."""
        out = torch.zeros(shape, dtype=torch.bool)
        for index in range(self.parts):
            out |= self.part(shape, index)
        return out

    def trigger(self, x: Tensor) -> Tensor:
        """``x`` (a batch ``(B, ...)``) with the global trigger (a new tensor)."""
        return self.stamp(x, self.pattern(tuple(x.shape[1:])))

    def local_trigger(self, x: Tensor, attacker: int) -> Tensor:
        """``x`` with attacker ``attacker``'s local pattern, ``attacker mod parts`` (a new tensor)."""
        return self.stamp(x, self.part(tuple(x.shape[1:]), attacker % self.parts))
