"""``intermittent``: any vector attack, active only in some rounds — an attack that succeeds now and then."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.attacks._common import check_int
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import make, register
from phalanx.errors import ConfigError

__all__ = ["Intermittent"]


@register
class Intermittent(Attack):
    r"""A vector attack ``attack`` (with its ``params``) that is active only in some rounds; in the others the
    Byzantine workers behave as under ``none`` (each replays an honest row of the round).

    Round t (counted from 0, ``ctx.round``) is attacked when

    .. math:: t \ge \text{start} \quad\text{and}\quad (t - \text{start}) \bmod \text{every} < \text{length},

    so over T rounds the attack is active in about ``length``·(T − start)/``every`` of them (:meth:`attacked`
    counts them exactly): the k corrupted rounds of an online learner's budget (Zhang & Cutkosky, "Unconstrained
    robust online convex optimization", ICML 2025, the setting of ``server_optimizer = "robust-online"``;
    docs/online.md). Which rounds are attacked depends on the round alone, so a resumed run attacks the same rounds;
    a stochastic ``attack`` draws from ``ctx.generator`` only in its active rounds (the stream is checkpointed).
    Defaults: ``signflip`` every 10th round from round 0, one round at a time.

    The class declares what its default (``signflip``) is — deterministic, finite, no aggregator needed; wrapping a
    stochastic or adaptive attack makes the instance so (its :meth:`describe` says it).
    """

    name: ClassVar[str] = "intermittent"
    reference: ClassVar[str] = ("an attack active in k of T rounds: the corrupted rounds of Zhang & Cutkosky, "
                                "'Unconstrained Robust Online Convex Optimization', ICML 2025")
    threat: ClassVar[str] = "that of the wrapped attack, in its active rounds"

    def __init__(
        self, attack: str = "signflip", params: dict[str, Any] | None = None, every: int = 10, start: int = 0,
        length: int = 1,
    ) -> None:
        if not isinstance(attack, str) or attack == self.name:
            raise ConfigError("attack", attack, "the name of a vector attack other than intermittent")
        if params is not None and not isinstance(params, dict):
            raise ConfigError("params", params, "a table of the wrapped attack's parameters")
        base = make(attack, **(params or {}))
        if not isinstance(base, Attack):
            raise ConfigError("attack", attack, "a vector attack (a data attack's stop_round ends it instead)")
        self.every = check_int("every", every, low=1)
        self.start = check_int("start", start, low=0)
        self.length = check_int("length", length, low=1)
        if self.length > self.every:
            raise ConfigError("length", length, f"<= every = {self.every}")
        self.base = base
        self.attack, self.base_params = attack, dict(params or {})
        self.reads_honest = True  # its inactive rounds replay honest rows
        self.solo = base.solo  # its inactive rounds replay the worker's own row: no other is needed

    def params(self) -> dict[str, Any]:
        return {"attack": self.attack, "params": dict(self.base_params), "every": self.every, "start": self.start,
                "length": self.length}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "needs_aggregator": type(self.base).needs_aggregator,
                "stochastic": type(self.base).stochastic, "finite": type(self.base).finite}

    def active(self, round: int) -> bool:
        """Whether round ``round`` (from 0) is attacked."""
        return round >= self.start and (round - self.start) % self.every < self.length

    def attacked(self, rounds: int) -> int:
        """How many of rounds 0 … ``rounds`` − 1 are attacked (k of T)."""
        return sum(self.active(t) for t in range(rounds))

    def _run(self, ctx: AttackContext) -> Tensor:
        if self.active(ctx.round):
            return self.base(ctx)
        rows = torch.arange(ctx.n_byzantine, device=ctx.honest.device) % ctx.n_honest
        return ctx.honest.detach().index_select(0, rows)
