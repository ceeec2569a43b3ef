# examples/plugins/mylab/algorithms.py
"""A round algorithm of your own: full-batch distributed gradient descent.

Every honest worker sends ∇Fᵢ(θ), the gradient of the mean loss over its *whole* shard (no sampling, no momentum);
the Byzantine workers send what the run's vector attack makes of the honest gradients; the server aggregates them
with the run's rule and steps θ. It is the setting in which Yang, Shi & Li (ICML 2025) bound how close gradient
descent with a robust rule gets when nobody attacks. ``chunk`` caps the samples per gradient call (memory).
"""

from typing import Any

import torch

from phalanx.attacks.base import AttackContext, DataAttack
from phalanx.errors import ConfigError
from phalanx.training.algorithms.base import RoundAlgorithm
from phalanx.training.state import Received, SlotPlan
from phalanx.training.streams import restored


def full_gradient(run: Any, theta: torch.Tensor, worker: int, chunk: int) -> torch.Tensor:
    """∇Fᵢ(θ): the gradient of worker i's mean loss over its whole shard, summed over chunks of samples."""
    shard = run.data.shards[worker]
    total = torch.zeros_like(theta)
    for part in torch.split(shard, chunk):
        x, y = run.data.x[part][None], run.data.y[part][None]
        total += run.problem.grads(theta, x, y)[0] * (part.numel() / shard.numel())
    return total


class Workers:
    """All workers in this process, or one worker slot (``rank``) of a process-per-worker run."""

    def __init__(self, algo: "FullGD", run: Any, streams: dict[str, torch.Tensor], rank: int | None = None) -> None:
        self.algo, self.run, self.rank = algo, run, rank
        self.honest_n = run.workers - run.byzantine
        self.vector_attack = run.byzantine > 0
        self.attack_gen = restored(streams["attack"])
        self.saved = dict(streams)  # nothing else is drawn: the other streams stay as they are
        self.shares_attack_stream = False
        byzantine = list(range(self.honest_n, run.workers))
        self.plan = SlotPlan(honest=list(range(self.honest_n)), computing=list(range(self.honest_n)),
                             attacking=byzantine)

    def _attack(self, honest: torch.Tensor, rule: Any, t: int) -> torch.Tensor:
        ctx = AttackContext(honest=honest, n_byzantine=self.run.byzantine, f=self.run.f, aggregator=rule,
                            generator=self.attack_gen, round=t)
        return self.run.attack(ctx)

    # in process ----------------------------------------------------------------------------------------------
    def round(self, theta: torch.Tensor, t: int, rule: Any) -> Received:
        honest = torch.stack([full_gradient(self.run, theta, i, self.algo.chunk) for i in range(self.honest_n)])
        if not self.vector_attack:
            return Received(honest)
        return Received(torch.cat([honest, self._attack(honest, rule, t)]))

    def streams(self) -> dict[str, torch.Tensor]:
        return {**self.saved, "attack": self.attack_gen.get_state()}

    # one slot per process --------------------------------------------------------------------------------------
    def warm_up(self) -> None:
        pass

    def vector(self, theta: torch.Tensor, t: int) -> torch.Tensor | None:
        assert self.rank is not None
        return full_gradient(self.run, theta, self.rank, self.algo.chunk) if self.rank < self.honest_n else None

    def attack_vector(self, honest: torch.Tensor, rule: Any, t: int) -> torch.Tensor:
        assert self.rank is not None
        return self._attack(honest, rule, t)[self.rank - self.honest_n]

    def skip(self, t: int) -> None:
        pass


class FullGD(RoundAlgorithm):
    """Full-batch distributed gradient descent (see the module's docstring)."""

    name = "full-gd"
    missing_word = "workers"

    def __init__(self, chunk: int = 512) -> None:
        if not isinstance(chunk, int) or chunk < 1:
            raise ConfigError("algorithm_params.chunk", chunk, "an integer >= 1")
        self.chunk = chunk

    def __repr__(self) -> str:
        return f"FullGD(chunk={self.chunk})"

    def per_round(self, workers: int) -> int:
        return workers

    def check(self, run: Any) -> None:
        if run.byzantine and isinstance(run.attack, DataAttack):
            raise ConfigError("attack", type(run.attack).__name__, "a vector attack with algorithm FullGD")

    def all_workers(self, run: Any, streams: dict[str, torch.Tensor], carried: Any) -> Workers:
        return Workers(self, run, streams)

    def one_worker(self, run: Any, rank: int, streams: dict[str, torch.Tensor], carried: Any) -> Workers:
        return Workers(self, run, streams, rank)
