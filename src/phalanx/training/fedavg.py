"""Federated averaging with local steps and client sampling, as a round algorithm of the one loop.

Round t (McMahan et al., "Communication-efficient learning of deep networks from decentralized data", AISTATS
2017, Algorithm 1; with the server optimizer of Reddi et al., "Adaptive federated optimization", ICLR 2021,
Algorithm 1):

1. the server samples C of the N clients uniformly without replacement (the run's ``clients`` stream);
2. every sampled honest client starts from θ and takes K local SGD steps on batches of its own shard,
   θᵢ ← θᵢ − η_local · uᵢ with uᵢ = μ uᵢ + gᵢ (local momentum μ, reset every round; u = g when μ = 0) and
   gᵢ = ∇ℓ(θᵢ; batch) + λθᵢ + μ_prox (θᵢ − θ) (weight decay λ; FedProx's proximal term, Li et al., MLSys 2020,
   Eq. 2); with ``local_epochs`` = E, client i takes ⌈E · |shardᵢ| / B⌉ steps instead of K;
3. it sends its *pseudo-gradient* Δ̃ᵢ = θ − θᵢ (the negative of its update θᵢ − θ, Reddi et al.'s −Δᵢ), so that
   the vectors have a gradient's sign and scale for every rule and attack;
4. sampled Byzantine clients send what their attack says (a vector attack sees the round's honest pseudo-gradients;
   a data attack trains locally on poisoned batches);
5. the server aggregates the C vectors with the robust rule and its optimizer steps θ ← step(θ, Agg, η_server):
   with plain SGD and η_server = 1 and the mean, θ ← θ + mean(θᵢ − θ) — FedAvg with equal client weights (robust
   aggregation weighs every client equally, so the data-size weights of FedAvg are not applied); server momentum
   gives FedAvgM, ``server_optimizer = "adam"`` FedAdam.

The Byzantine clients are a fixed subset of the population (the last ``byzantine`` indices); how many of them are
sampled varies from round to round, and the rule tolerates the ``f`` it is configured for — each round's true number
is measured (``byzantine_sampled`` in the metric rows). All sampled clients' local training runs as one batched
computation over their stacked parameters (``torch.func.vmap`` over per-client parameters), not a loop over clients.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from phalanx.attacks.base import Attack, DataAttack
from phalanx.errors import ConfigError
from phalanx.training.dsgd import byzantine_vectors, poison_rows
from phalanx.training.shards import sample_batches_of
from phalanx.training.state import Received
from phalanx.training.streams import restored
from phalanx.validate import check_int, check_real

if TYPE_CHECKING:
    from phalanx.training.experiment import Experiment


@dataclass(frozen=True)
class FedAvg:
    """Federated averaging: ``clients_per_round`` sampled clients (None: all), ``local_steps`` SGD steps each (or
    ``local_epochs`` passes over its shard) with batch ``batch_size``, client learning rate ``lr`` (a number or a
    schedule over rounds), local momentum, weight decay and FedProx's ``prox_mu``."""

    clients_per_round: int | None = None
    local_steps: int = 1
    local_epochs: float | None = None
    batch_size: int = 32
    lr: float | Callable[[int], float] = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    prox_mu: float = 0.0
    name = "fedavg"

    def __post_init__(self) -> None:
        if self.clients_per_round is not None:
            check_int("clients_per_round", self.clients_per_round, low=1)
        check_int("local_steps", self.local_steps, low=1)
        if self.local_epochs is not None:
            check_real("local_epochs", self.local_epochs, low=0.0, low_open=True)
        check_int("batch_size", self.batch_size, low=1)
        if not callable(self.lr):
            check_real("lr", self.lr, low=0.0, low_open=True)
        check_real("momentum", self.momentum, low=0.0, high=1.0, high_open=True)
        check_real("weight_decay", self.weight_decay, low=0.0)
        check_real("prox_mu", self.prox_mu, low=0.0)

    def per_round(self, workers: int) -> int:
        """How many vectors the server aggregates each round: the sampled clients."""
        c = self.clients_per_round or workers
        if c > workers:
            raise ConfigError("clients_per_round", c, f"<= clients = {workers}")
        return c

    def client_lr(self, t: int) -> float:
        """The clients' learning rate in round t."""
        return float(self.lr(t)) if callable(self.lr) else float(self.lr)

    def all_workers(self, exp: Experiment, streams: dict[str, Tensor], momentum: Tensor | None) -> FedAvgClients:
        """The population in this process: the round's sampled clients train as one batched computation."""
        return FedAvgClients(self, exp, streams)

    def one_worker(self, exp: Experiment, rank: int, streams: dict[str, Tensor], momentum: Tensor | None) -> Any:
        raise ConfigError("algorithm", self.name, "'dsgd' with engine = 'torchrun' (federated rounds run in one "
                          "process so far: engine = 'simulated')")


class FedAvgClients:
    """The client population of one process (see the module's docstring)."""

    def __init__(self, algo: FedAvg, exp: Experiment, streams: dict[str, Tensor]) -> None:
        self.algo = algo
        self.exp = exp
        self.n, self.b = exp.workers, exp.byzantine
        self.honest_n = self.n - self.b
        self.c = algo.per_round(self.n)
        self.batch_gen = restored(streams["batches"])
        self.attack_gen = restored(streams["attack"])
        self.client_gen = restored(streams["clients"])
        sizes = exp.data._sizes
        if algo.local_epochs is not None:
            self.steps = torch.ceil(algo.local_epochs * sizes.double() / algo.batch_size).long().clamp_min(1)
        else:
            self.steps = torch.full((self.n,), algo.local_steps, dtype=torch.long)

    def streams(self) -> dict[str, Tensor]:
        """The streams' states now: batches, attack and client sampling."""
        return {"batches": self.batch_gen.get_state(), "attack": self.attack_gen.get_state(),
                "clients": self.client_gen.get_state()}

    def sample(self) -> Tensor:
        """The round's clients: C of N uniformly without replacement, in increasing index order."""
        return torch.randperm(self.n, generator=self.client_gen)[: self.c].sort().values

    def round(self, theta: Tensor, t: int, rule: Callable[[Tensor], Tensor]) -> Received:
        """Sample, train locally, attack; the C pseudo-gradients with the clients they came from."""
        exp = self.exp
        ids = self.sample()
        honest_ids = ids[ids < self.honest_n]
        byz_ids = ids[ids >= self.honest_n]
        data_attack = isinstance(exp.attack, DataAttack)
        train_ids = ids if data_attack else honest_ids
        vectors = self._train(theta, train_ids, t, poisoned=int(byz_ids.numel()) if data_attack else 0)
        boost = float(getattr(exp.attack, "boost", 1.0))
        if data_attack and byz_ids.numel() and boost != 1.0:  # model replacement: the poisoned updates scaled
            vectors[-int(byz_ids.numel()):] *= boost
        if not data_attack and byz_ids.numel():
            if honest_ids.numel():
                assert isinstance(exp.attack, Attack)
                byz = byzantine_vectors(exp.attack, vectors, byzantine=int(byz_ids.numel()), f=exp.f, rule=rule,
                                        attack_gen=self.attack_gen, round=t)
            else:  # no honest client sampled: the attackers have nothing to look at
                byz = vectors.new_zeros(int(byz_ids.numel()), exp.problem.dim)
            vectors = torch.cat([vectors, byz]) if vectors.numel() else byz
        return Received(vectors, rows=ids.tolist(), state_rows=False)

    def _train(self, theta: Tensor, ids: Tensor, t: int, poisoned: int) -> Tensor:
        """Local training of the clients ``ids`` from θ; their pseudo-gradients ``θ − θᵢ``, ``(len(ids), d)``. The
        last ``poisoned`` of them train on batches the data attack poisons."""
        algo, exp = self.algo, self.exp
        w = int(ids.numel())
        if w == 0:
            return theta.new_zeros(0, exp.problem.dim)
        params = theta.expand(w, -1).clone()
        velocity = torch.zeros_like(params) if algo.momentum else None
        steps = self.steps[ids]
        lr = algo.client_lr(t)
        for k in range(int(steps.max())):
            xb, yb = sample_batches_of(exp.data, ids, algo.batch_size, self.batch_gen)
            if poisoned:
                assert isinstance(exp.attack, DataAttack)
                xb, yb = poison_rows(exp.attack, xb, yb, w - poisoned, exp.data.num_classes, self.attack_gen)
            g = exp.problem.grads_each(params, xb, yb)
            if algo.weight_decay:
                g.add_(params, alpha=algo.weight_decay)
            if algo.prox_mu:
                g.add_(params - theta, alpha=algo.prox_mu)
            if velocity is not None:
                g = velocity.mul_(algo.momentum).add_(g)
            active = steps > k
            if bool(active.all()):
                params.sub_(g, alpha=lr)
            else:
                params[active] -= lr * g[active]
        return theta - params
