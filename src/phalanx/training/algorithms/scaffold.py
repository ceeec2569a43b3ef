"""SCAFFOLD: federated learning with control variates against client drift, aggregated robustly.

Karimireddy, Kale, Mohri, Reddi, Stich & Suresh, "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, Algorithm 1 (option II for the client control variate). The server keeps the model x and a
control variate c; every client i keeps its own cᵢ (all start at 0). Round t:

1. the server samples C of the N clients (the run's ``clients`` stream, as
   :mod:`phalanx.training.algorithms.fedavg` does);
2. each sampled client starts from y ← x and takes Kᵢ local steps y ← y − η_l (gᵢ(y) − cᵢ + c) — the drift
   correction, on top of FedAvg's local SGD (weight decay, FedProx, momentum apply to the corrected gradient);
3. option II: cᵢ⁺ = cᵢ − c + (x − y)/(Kᵢ η_l); it sends its pseudo-gradient x − y (FedAvg's sign and scale, so that
   every rule and attack applies) and Δcᵢ = cᵢ⁺ − cᵢ, and keeps cᵢ ← cᵢ⁺;
4. the sampled Byzantine clients send what their attack makes of the honest *pairs* [x − yᵢ | Δcᵢ] (a data attack's
   clients follow the protocol on poisoned batches);
5. the server aggregates both halves with the run's robust rule — Agg(x − yᵢ) is the step of the server optimizer
   (x ← x − η_g·Agg, η_g the run's ``lr``; the paper's mean with η_g = 1 is plain SCAFFOLD) and
   c ← c + (C/N)·Agg(Δcᵢ) (the paper's (1/N)·ΣΔcᵢ with the mean).

The control variates are the algorithm's state: a table of N + 1 rows (cᵢ of every client, then c), carried from
round to round and checkpointed with the run (a resumed run is bit for bit the uninterrupted one). Rules that take a
centre or a reference gradient from the server (centered clipping, FLTrust) are refused: that context is a model
update's and says nothing about a control variate. In-process only so far (``engine = "simulated"``).

Config: ``algorithm = "scaffold"`` with ``algorithm_params`` holding FedAvg's client parameters (``clients_per_round``,
``local_steps``, ``local_epochs``, ``batch_size``, ``lr`` — the clients' η_l —, ``momentum``, ``weight_decay``,
``prox_mu``); the run's ``lr`` is the server's η_g (1 for the paper's algorithm).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.algorithms.base import register
from phalanx.training.algorithms.fedavg import FedAvg, FedAvgClients, attack_rows, previous_aggregate
from phalanx.training.server import RoundResult, Server
from phalanx.training.state import Received


@register
@dataclass(frozen=True)
class Scaffold(FedAvg):
    """SCAFFOLD (see the module's docstring): FedAvg's clients with control variates, both halves aggregated by the
    run's rule."""

    name = "scaffold"
    knowledge = ("omniscient",)  # its round is its own: the colluders' honest pairs are not computed
    pools_norm_stats = False
    keeps_local_norms = False
    samples_population = False  # a control variate per client: an (N + 1, d) table, no population
    runs_worker_stages = False  # a client's control-variate update Δcᵢ leaves it too, past the worker stages
    lr_role = "server"  # the run's lr is the server's η_g; the clients' η_l is algorithm_params.lr

    def check(self, run: Any) -> None:
        """Refuse rules whose server context (a centre, a reference gradient) belongs to model updates only."""
        needs = set(getattr(run.rule, "context_keys", ())) & {"center", "reference"}
        if needs:
            raise ConfigError("aggregator", run.rule_named, "a rule without a server centre or reference gradient "
                              f"with algorithm scaffold (it takes {', '.join(sorted(needs))}, which a control variate "
                              "has no counterpart of)")
        if getattr(run.rule, "stateful", False):  # it aggregates twice a round: updates, then control variates
            raise ConfigError("aggregator", run.rule_named, "a rule that keeps no state across rounds with "
                              "algorithm scaffold (the rule aggregates the control variates too)")

    def all_workers(self, run: Any, streams: dict[str, Tensor], carried: Tensor | None) -> ScaffoldClients:
        """The population in this process, with the control-variate table carried from the last round."""
        return ScaffoldClients(self, run, streams, carried)

    def one_worker(self, run: Any, rank: int, streams: dict[str, Tensor], carried: Tensor | None) -> Any:
        raise ConfigError("engine", "torchrun", "'simulated' with algorithm scaffold (its control variates are kept "
                          "in one process so far)")

    def make_server(self, run: Any, generator: torch.Generator) -> ScaffoldServer:
        """The run's robust server on the model half, and c's update from the control-variate half."""
        return ScaffoldServer(run, generator)


class ScaffoldClients(FedAvgClients):
    """The client population with its control variates (rows 0 … N−1: cᵢ; row N: the server's c)."""

    def __init__(self, algo: Scaffold, exp: Any, streams: dict[str, Tensor], carried: Tensor | None) -> None:
        super().__init__(algo, exp, streams)
        dim = exp.problem.dim
        if carried is not None and tuple(carried.shape) != (self.n + 1, dim):
            raise ConfigError("start", f"a state of shape {tuple(carried.shape)}", f"SCAFFOLD's control variates, "
                              f"({self.n + 1}, {dim})")
        theta = exp.problem.initial_theta()
        self.table = carried if carried is not None else theta.new_zeros(self.n + 1, dim, device=exp.device)

    def correct(self, g: Tensor, ids: Tensor) -> Tensor:
        """gᵢ − cᵢ + c, for the clients ``ids``."""
        table = self.table
        return g - table[ids.to(table.device)] + table[self.n]

    def round(self, theta: Tensor, t: int, rule: Callable[[Tensor], Tensor]) -> Received:
        """Sample, train with the drift correction, update the clients' cᵢ; the C pairs [x − yᵢ | Δcᵢ]."""
        exp, algo = self.exp, self.algo
        self.previous = previous_aggregate(rule)
        ids = self.sample()
        honest_ids, byz_ids = ids[ids < self.honest_n], ids[ids >= self.honest_n]
        train_ids = ids if self.data_attack else honest_ids
        poisoned = int(byz_ids.numel()) if self.poisoning(t) else 0
        pseudo = self._train(theta, train_ids, t, poisoned)  # x − yᵢ, the drift-corrected local steps (correct())
        rows = train_ids.to(self.table.device)
        steps = self.steps_of(train_ids).to(pseudo)
        before = self.table[rows]
        after = before - self.table[self.n] + pseudo / (steps[:, None] * algo.client_lr(t))  # option II
        self.table[rows] = after
        pairs = torch.cat([pseudo, after - before], dim=1)
        if self.vector_attack and byz_ids.numel():
            byz = attack_rows(exp, pairs, int(byz_ids.numel()), rule, self.attack_gen, t)
            pairs = torch.cat([pairs, byz]) if pairs.numel() else byz
        return Received(pairs, rows=ids.tolist(), state_rows=False, carry=self.table)


class ScaffoldServer(Server):
    """The run's robust server on the pseudo-gradients (the server optimizer's step, and the round's measurements)
    and, with the same rule, the update of the server's control variate c (row N of the carried table)."""

    def __init__(self, run: Any, generator: torch.Generator) -> None:
        super().__init__(run.rule, honest=run.honest, problem=run.problem, reference_batch=run.reference_batch,
                         generator=generator, rule_for=run.rule_for)
        self.population = run.workers

    def aggregate(self, got: Received, context: dict[str, Any], measure: bool) -> tuple[Tensor, RoundResult | None]:
        assert got.carry is not None, "SCAFFOLD's clients carry their control variates"
        d = got.vectors.shape[1] // 2
        agg, result = super().aggregate(replace(got, vectors=got.vectors[:, :d]), context, measure)
        dc, _ = super().aggregate(replace(got, vectors=got.vectors[:, d:]), context, False)
        got.carry[self.population] += (got.vectors.shape[0] / self.population) * dc.to(got.carry)
        return agg, result
