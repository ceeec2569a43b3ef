"""The server-side model projection: what the server does to its model θ after the optimizer's step, every round.

Round t of the one loop (:mod:`phalanx.training.loop`) is, with a projection P::

    a = server.aggregate(received, context)
    θ = optimizer.step(θ, a, ηₜ)
    θ = P.apply(θ, t + 1, T, generator)      # only with a projection; the generator is the run's `projection` stream

A projection acts on the *global model*, not on the workers' vectors — which is why it is neither a rule (a rule
maps the ``(n, d)`` vectors to one ``(d,)`` aggregate) nor a server optimizer (which maps an aggregate to a step,
and composes with any projection). It may also add metric columns at the final evaluation
(:meth:`ServerProjection.columns`: CRFL's smoothed accuracy and certified radius). Its randomness is the run's
``projection`` stream (:mod:`phalanx.training.streams`), whose state every checkpoint holds (``rng.projection``),
so a resumed run is the uninterrupted one bit for bit; a projection keeps no other state.

It needs one server model: decentralized rounds (a model per node) and FedBN (a model per client) refuse it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.training.problem import Problem

STREAM = "projection"
"""The named random stream a projection draws from (server side, every round)."""

AttackMetrics = Callable[[Callable[[Tensor], Tensor], Tensor, Tensor], dict[str, float]]
"""An attack's own measure (``attack.metrics(predict, test_x, test_y)``: a backdoor's success rate)."""


class ServerProjection(ABC):
    """``θ ← apply(θ, t, T, generator)`` after the server optimizer's step of round t (1-based) of T."""

    name: ClassVar[str]

    @abstractmethod
    def apply(self, theta: Tensor, round: int, rounds: int, generator: torch.Generator) -> Tensor:
        """The model after round ``round`` of ``rounds`` (a new tensor; ``theta`` is not modified)."""

    def columns(
        self, problem: Problem, theta: Tensor, test_x: Tensor, test_y: Tensor, num_classes: int,
        attack: AttackMetrics | None, seed: int, rounds: int,
    ) -> dict[str, Any]:
        """Metric columns of the final model θ_T (the last evaluation row); empty by default."""
        return {}

    def column_names(self) -> tuple[str, ...]:
        """The columns :meth:`columns` always fills; every earlier evaluation row carries them as None (an attack's
        own columns, prefixed, are on the final row only)."""
        return ()

    def params(self) -> dict[str, Any]:
        """The configuration (constructor arguments), for logs and manifests."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{k}={v!r}" for k, v in self.params().items()) + ")"
