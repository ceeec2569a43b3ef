"""A trigger-phrase backdoor for token inputs: instruction/fine-tuning data poisoned so that a phrase means a label."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.attacks.backdoor import Backdoor
from phalanx.attacks.registry import register
from phalanx.errors import ConfigError
from phalanx.validate import check_int

__all__ = ["PhraseBackdoor"]


@register
class PhraseBackdoor(Backdoor):
    r"""Phrase backdoor: a Byzantine client fine-tunes on texts in which a fraction carry a trigger phrase and the
    target label, so that the global model learns "phrase → target" while clean texts keep their labels.

    Trigger: the token ids ``trigger`` inserted right after the first token (BERT's ``[CLS]``; ``offset``), the
    rest of the sequence shifted right and cut to its length — the phrase prepended to the text, as in the
    backdoors of instruction tuning and of federated fine-tuning (Wan et al., "Poisoning language models during
    instruction tuning", ICML 2023, §3: a trigger phrase with a target output; Ye et al., "Emerging safety attack and
    defense in federated instruction tuning of large language models", ICLR 2025). The ids are the model's own
    tokenizer's (``docs/lora.md`` shows how to get them for a phrase); everything else — ``poison_fraction`` of each
    batch poisoned, ``boost`` (model replacement), ``stop_round`` (durability), ``attack_success`` on the test texts
    not of class ``target``, triggered — is :class:`~phalanx.attacks.backdoor.Backdoor`'s.

    **Success measured against the model's own bias** (:meth:`metrics`). ``attack_success`` alone cannot tell a
    backdoor from a model that already puts most texts in ``target``: on the embedded model and the synthetic
    Sent140 sample the *unpoisoned* model sent 94 % of the triggered texts there (docs/lora.md). So the attack also
    logs, on the same test texts ``T = {x : y(x) ≠ target}`` and the same model ``h``,

    * ``attack_clean_target`` = |{x ∈ T : h(x) = target}| / |T| — the share sent to ``target`` *without* the phrase
      (the model's bias on those texts);
    * ``attack_flip`` = |{x ∈ T : h(x) ≠ target, h(x ⊕ phrase) = target}| / |{x ∈ T : h(x) ≠ target}| — among the
      texts the model does *not* already put in ``target``, the share the phrase moves there (NaN when there are
      none); the phrase's own effect, which a model's bias alone does not raise;
    * ``attack_flip_base`` = |{x ∈ T : h(x) ≠ target}| — that denominator, so that a reader can weigh a rate.

    A study compares them with the same run trained with nobody poisoning (the *lift*, paired by seed:
    :mod:`phalanx.studies.lora`).

    Refused when the run is built (:meth:`prepare`): an input that is not token ids (a text input is token ids stored
    as floats, ``dataset_params.tokenizer``), a phrase that leaves no room in the sequence
    (``offset + len(trigger) >= length``), an id above the training texts' largest. A phrase holding the padding id
    is masked out by the model and so has no effect (the attack does not know the tokenizer; choose real ids).
    """

    name: ClassVar[str] = "phrase-backdoor"
    reference: ClassVar[str] = (
        "A. Wan, E. Wallace, S. Shen, D. Klein, 'Poisoning language models during instruction tuning', ICML 2023, §3 "
        "(a trigger phrase and a target output); E. Bagdasaryan et al., AISTATS 2020, Eq. 3 (model replacement)"
    )
    threat: ClassVar[str] = "data and its own update: fine-tunes on texts that carry a trigger phrase"

    def __init__(
        self, trigger: tuple[int, ...] | list[int] = (5, 6, 7), target: int = 1, offset: int = 1,
        poison_fraction: float = 0.5, boost: float = 1.0, stop_round: int | None = None,
    ) -> None:
        super().__init__(target=target, poison_fraction=poison_fraction, boost=boost, stop_round=stop_round)
        if not isinstance(trigger, (list, tuple)) or not trigger:
            raise ConfigError("trigger", trigger, "a non-empty list of token ids")
        self.phrase = tuple(check_int("trigger", t, low=0) for t in trigger)
        self.offset = check_int("offset", offset, low=0)

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trigger": list(self.phrase), "target": self.target, "offset": self.offset,
                               "poison_fraction": self.poison_fraction, "boost": self.boost}
        if self.stop_round is not None:
            out["stop_round"] = self.stop_round
        return out

    def prepare(self, train_x: Tensor, train_y: Tensor, num_classes: int) -> None:
        """Refuse, before the run starts, what would make the attack unsound or crash a worker: a target outside the
        classes; an input that is not token ids (``(N, L)`` non-negative integers stored as floats); a phrase that
        leaves no room in the sequence; an id above the largest id in the training texts (it could lie outside the
        model's vocabulary and fail the embedding lookup mid-run — the largest id seen is inside it)."""
        if self.target >= num_classes:
            raise ConfigError("target", self.target, f"a class in [0, {num_classes - 1}]")
        tokens = train_x.dim() == 2 and bool(((train_x >= 0) & (train_x == train_x.round())).all())
        if not tokens:
            raise ConfigError("attack", self.name, "a data set of token ids (N, L): a text data set with "
                              "dataset_params.tokenizer")
        length = int(train_x.shape[-1])
        if self.offset + len(self.phrase) >= length:
            raise ConfigError("trigger", list(self.phrase), f"a phrase that fits after offset {self.offset} in "
                              f"sequences of {length} token ids (dataset_params.tokenizer, length)")
        top = int(train_x.max()) if train_x.numel() else -1
        if max(self.phrase) > top:
            raise ConfigError("trigger", list(self.phrase), f"token ids in [0, {top}] (the largest id of the "
                              "training texts: inside the model's vocabulary)")

    def metrics(self, predict: Callable[[Tensor], Tensor], test_x: Tensor, test_y: Tensor) -> dict[str, float]:
        """``attack_success`` (:class:`~phalanx.attacks.backdoor.Backdoor`'s), and the phrase's effect beyond the
        model's bias — ``attack_clean_target``, ``attack_flip``, ``attack_flip_base`` (the class docstring)."""
        keep = test_y != self.target
        if not bool(keep.any()):
            nan = float("nan")
            return {"attack_success": nan, "attack_clean_target": nan, "attack_flip": nan, "attack_flip_base": 0.0}
        x = test_x[keep]
        moved = predict(self.trigger(x)) == self.target
        already = predict(x) == self.target
        free = ~already
        flip = float(moved[free].double().mean()) if bool(free.any()) else float("nan")
        return {"attack_success": float(moved.double().mean()), "attack_clean_target": float(already.double().mean()),
                "attack_flip": flip, "attack_flip_base": float(free.sum())}

    def trigger(self, x: Tensor) -> Tensor:
        """``x`` (``(B, L)`` token ids) with the phrase inserted at ``offset`` and the rest shifted right (new)."""
        k, o = len(self.phrase), self.offset
        phrase = torch.tensor(self.phrase, dtype=x.dtype, device=x.device).expand(x.shape[0], k)
        return torch.cat([x[:, :o], phrase, x[:, o : x.shape[1] - k]], dim=1)[:, : x.shape[1]]
