"""The server-side model projection: a server stage that acts on the server's model θ after the optimizer's step,
every round.

Round t of the one loop (:mod:`phalanx.training.loop`) is, with a projection P::

    a = server.aggregate(received, context)
    θ = optimizer.step(θ, a, ηₜ)
    θ = P.apply(θ, t + 1, T, generator)      # the generator is the run's `projection` stream

A projection acts on the *global model*, not on the workers' vectors — which is why it is neither a rule (a rule
maps the ``(n, d)`` vectors to one ``(d,)`` aggregate) nor a server optimizer (which maps an aggregate to a step,
and composes with any projection). It is a :class:`~phalanx.training.stages.base.ServerStage` whose hook
``stepped`` calls :meth:`ServerProjection.apply`; it may add metric columns at the final evaluation
(:meth:`ServerProjection.final_columns`: CRFL's smoothed accuracy and certified radius). Its randomness is the run's
``projection`` stream (:mod:`phalanx.training.streams`), whose state every checkpoint of a run with a projection
holds (``rng.projection``), so a resumed run is the uninterrupted one bit for bit; a projection keeps no other state.

It needs one server model: decentralized rounds (a model per node) and FedBN (a model per client) refuse it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.problem import Problem
from phalanx.training.stages.base import Evaluation, Plan, ServerRound, ServerStage

STREAM = "projection"
"""The named random stream a projection draws from (server side, every round)."""

AttackMetrics = Callable[[Callable[[Tensor], Tensor], Tensor, Tensor], dict[str, float]]
"""An attack's own measure (``attack.metrics(predict, test_x, test_y)``: a backdoor's success rate)."""


class ServerProjection(ServerStage):
    """``θ ← apply(θ, t, T, generator)`` after the server optimizer's step of round t (1-based) of T."""

    name: ClassVar[str] = "projection"
    streams: ClassVar[tuple[str, ...]] = (STREAM,)

    @abstractmethod
    def apply(self, theta: Tensor, round: int, rounds: int, generator: torch.Generator) -> Tensor:
        """The model after round ``round`` of ``rounds`` (a new tensor; ``theta`` is not modified)."""

    def stepped(self, theta: Tensor, r: ServerRound) -> Tensor:
        return self.apply(theta, r.round + 1, r.rounds, r.generators[STREAM])

    def check(self, plan: Plan) -> None:
        """One server model: not with decentralized rounds (a model per node) or a FedBN model (a model per
        client)."""
        key, value = self.parameter("projection"), self.name if self.key else repr(self)
        algo = plan.algorithm
        if algo.decentralized:
            raise ConfigError(key, value, f"unset with algorithm = {algo.name!r} (it clips and perturbs the server's "
                              "model; decentralized rounds have a model per node and no server)")
        if plan.norm == "fedbn":
            raise ConfigError(key, value, f"unset with a FedBN model ({plan.norm_key} = {plan.norm_value!r}: every "
                              "client keeps its own BatchNorm layers: there is no one global model to smooth and "
                              "certify)")

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        """:meth:`final_columns` at the final evaluation of the one global model; None before."""
        if not (ev.final and ev.global_model):
            return dict.fromkeys(self.column_names())
        run = ev.run
        metrics = getattr(run.attack, "metrics", None)
        return self.final_columns(run.problem, ev.theta, run.test_x, run.test_y, run.data.num_classes,
                                  metrics if callable(metrics) else None, run.seed, run.rounds)

    def final_columns(
        self, problem: Problem, theta: Tensor, test_x: Tensor, test_y: Tensor, num_classes: int,
        attack: AttackMetrics | None, seed: int, rounds: int,
    ) -> dict[str, Any]:
        """Metric columns of the final model θ_T (the last evaluation row); empty by default."""
        return {}
