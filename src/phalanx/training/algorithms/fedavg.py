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
   the vectors have a gradient's sign and scale for every rule and attack — passed through the worker-side stages
   first (``Run.worker_stages``, :mod:`phalanx.training.stages`; client-level differential privacy clips it to norm
   C and adds N(0, σ²C²·I) at the client: DP-FedAvg, McMahan, Ramage, Talwar & Zhang, ICLR 2018, with the noise at
   each client);
4. sampled Byzantine clients send what their attack says (a vector attack sees the round's honest pseudo-gradients
   — or, with ``attack_knowledge = "colluders"``, only the pseudo-gradients the sampled Byzantine clients compute
   honestly on their own shards; a data attack trains locally on poisoned batches until its ``stop_round``, and its
   :meth:`~phalanx.attacks.base.DataAttack.update` makes the update it sends: boosted, projected);
5. the server aggregates the C vectors with the robust rule and its optimizer steps θ ← step(θ, Agg, η_server):
   with plain SGD and η_server = 1 and the mean, θ ← θ + mean(θᵢ − θ) — FedAvg with equal client weights (robust
   aggregation weighs every client equally, so the data-size weights of FedAvg are not applied); server momentum
   gives FedAvgM, ``server_optimizer = "adam"`` FedAdam.

With a FedBN model (``norm = "fedbn"``) every client keeps its BatchNorm layers: it trains from θ with its own γ, β,
sends the shared coordinates of its pseudo-gradient only, and the round writes the honest sampled clients' new
BatchNorm parameters and running statistics into their rows (:mod:`phalanx.training.algorithms.fedbn`).

The Byzantine clients are a fixed subset of the population (the last ``byzantine`` indices); how many of them are
sampled varies from round to round, and the rule tolerates the ``f`` it is configured for — each round's true number
is measured (``byzantine_sampled`` in the metric rows). All sampled clients' local training runs as one batched
computation over their stacked parameters (``torch.func.vmap`` over per-client parameters), not a loop over clients.

Over a client population (:mod:`phalanx.training.population`: the data set is a
:class:`~phalanx.data.population.Population` of up to millions of clients whose data are produced when sampled) the
round samples by Floyd's algorithm — O(C), not a permutation of the N clients — and keeps nothing per client; the
``byzantine_count`` stage (:mod:`phalanx.training.stages.byzantine_count`) records every round's sampled Byzantine
count against f.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.aggregators.lora import AdapterUpdates
from phalanx.attacks.base import Attack, DataAttack
from phalanx.data.population import Population
from phalanx.errors import ConfigError
from phalanx.training.algorithms.base import RoundAlgorithm, built_in_params
from phalanx.training.algorithms.dsgd import byzantine_vectors, poison_rows
from phalanx.training.algorithms.fedbn import STATE_KEY, local_norms
from phalanx.training.norm_stats import NormStats
from phalanx.training.population import PopulationData, sample_clients
from phalanx.training.schedule import LRSchedule
from phalanx.training.server import BoundRule
from phalanx.training.shards import sample_batches_of
from phalanx.training.stages.base import Stage, WorkerStages
from phalanx.training.stages.byzantine_count import ByzantineCount
from phalanx.training.stages.lora import LoraResidual
from phalanx.training.stages.norm_stats import PoolStats
from phalanx.training.state import Received, RoundState, SlotPlan
from phalanx.training.streams import restored
from phalanx.validate import Key, Section, check_int, check_real

if TYPE_CHECKING:
    from phalanx.training.algorithms.base import Run


@dataclass(frozen=True)
class FedAvg(RoundAlgorithm):
    """Federated averaging: ``clients_per_round`` sampled clients (None: all), ``local_steps`` SGD steps each (or
    ``local_epochs`` passes over its shard) with batch ``batch_size``, client learning rate ``lr`` (a number or a
    schedule over rounds), local momentum, weight decay and FedProx's ``prox_mu``. A model with BatchNorm / Hybrid BN
    layers: each sampled client measures their statistics on ``stats_batch`` samples, blended into the global
    statistics with momentum ``stats_momentum`` (:mod:`phalanx.training.norm_stats`); a FedBN model: each client keeps
    its own BatchNorm layers (:mod:`phalanx.training.algorithms.fedbn`)."""

    clients_per_round: int | None = None
    local_steps: int = 1
    local_epochs: float | None = None
    batch_size: int = 32
    lr: float | Callable[[int], float] = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    prox_mu: float = 0.0
    stats_batch: int = 64
    stats_momentum: float = 0.1
    name = "fedavg"
    missing_word = "clients"
    lr_role = "client"
    config_section = Section("fedavg", (
        Key("clients_per_round", "clients_per_round", int | None, None, "fedavg: clients sampled per round (default: "
            "all `workers`, the population)", ge=1),
        Key("local_steps", "local_steps", int, 1, "fedavg: local SGD steps per sampled client and round", ge=1),
        Key("local_epochs", "local_epochs", float | None, None, "fedavg: local passes over the client's shard "
            "(instead of local_steps)", gt=0),
        Key("server_lr", "server_lr", float, 1.0, "fedavg: the server's step size on the aggregated update", gt=0),
        Key("prox_mu", "prox_mu", float, 0.0, "fedavg: FedProx's proximal term μ (Li et al., MLSys 2020)", ge=0),
        Key("stats_batch", "stats_batch", int, 64, "fedavg, a model with norm = 'batch' | 'hybrid': samples each "
            "sampled client measures the normalisation statistics on", ge=1),
        Key("stats_momentum", "stats_momentum", float, 0.1, "fedavg, norm = 'batch' | 'hybrid': weight of the round's "
            "pooled statistics in the global ones (Hybrid BN's authors: 0.002 over 500 rounds)", gt=0, le=1),
    ), "federated averaging's own flat keys")
    config_keys = config_section.flat_keys()
    config_columns = ("algorithm", "clients_per_round", "local_steps", "local_epochs", "server_lr")
    topologies = ("server",)  # the server samples the clients: a process per client slot
    population_key = "clients_per_round"
    runs_on_device = True
    knowledge: ClassVar[tuple[str, ...]] = ("omniscient", "colluders")
    stops_attacks = True
    pools_norm_stats = True
    keeps_local_norms = True
    runs_worker_stages = True
    samples_population = True

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
        check_int("stats_batch", self.stats_batch, low=1)
        check_real("stats_momentum", self.stats_momentum, low=0.0, high=1.0, low_open=True)

    @classmethod
    def from_config(cls, cfg: Any, lr: Callable[[int], float]) -> tuple[FedAvg, Callable[[int], float]]:
        """From its config keys (:attr:`config_keys`) and the clients' ``batch_size``, ``momentum`` and
        ``weight_decay``; ``lr`` is the clients' (local) learning rate, ``server_lr`` the server's (constant)."""
        built_in_params(cfg)
        algorithm = cls(clients_per_round=cfg.clients_per_round, local_steps=cfg.local_steps,
                        local_epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=lr, momentum=cfg.momentum,
                        weight_decay=cfg.weight_decay, prox_mu=cfg.prox_mu, stats_batch=cfg.stats_batch,
                        stats_momentum=cfg.stats_momentum)
        return algorithm, LRSchedule(cfg.server_lr, "constant", cfg.rounds, cfg.step_every)

    def check_config(self, cfg: Any, rule: Aggregator, attack: Attack | DataAttack) -> None:
        """``clients_per_round`` at most the population, then the population's checks on the sampled clients."""
        c = self.clients_per_round or cfg.workers
        if c > cfg.workers:
            raise ConfigError("clients_per_round", c, f"<= workers = {cfg.workers} (the client population)")
        super().check_config(cfg, rule, attack)

    @classmethod
    def processes(cls, cfg: Any) -> int:
        """A process per client slot (rank 0 is also the server)."""
        return int(cfg.clients_per_round or cfg.workers)

    def per_round(self, workers: int) -> int:
        """How many vectors the server aggregates each round: the sampled clients."""
        c = self.clients_per_round or workers
        if c > workers:
            raise ConfigError("clients_per_round", c, f"<= clients = {workers}")
        return c

    def stages(self, exp: Run) -> tuple[Stage, ...]:
        """A model with BatchNorm / Hybrid BN statistics: the server stage that pools the statistics the clients
        measure and blends them in with momentum ``stats_momentum`` (:mod:`phalanx.training.stages.norm_stats`).
        A rule aggregating LoRA adapters per layer update: the stage that records its truncation residual
        (:mod:`phalanx.training.stages.lora`)."""
        norm = NormStats.of(exp.problem.model)
        out: tuple[Stage, ...] = () if norm is None else (PoolStats(norm, self.stats_momentum),)
        if isinstance(exp.rule, AdapterUpdates):  # LoRA adapters aggregated per layer update: record the truncation
            out += (LoraResidual(exp.rule),)
        if isinstance(exp.dataset, Population):  # a population: each round's sampled Byzantine count, against f
            out += (ByzantineCount(exp.workers, exp.byzantine, per_round=self.per_round(exp.workers)),)
        return out

    def make_server(self, exp: Run, generator: torch.Generator) -> Any:
        """The standard server; with a FedBN model, one whose rule sees the shared coordinates only (a coordinate
        mask: :class:`~phalanx.training.algorithms.fedbn.SharedServer`)."""
        server = super().make_server(exp, generator)
        norms = local_norms(exp.problem)
        return server if norms is None else norms.server(server)

    def initial_state(self, exp: Run, theta: Tensor) -> dict[str, Tensor]:
        """A FedBN model: every client's BatchNorm row of the initial model
        (:mod:`phalanx.training.algorithms.fedbn`); else nothing — plain federated averaging keeps no state between
        rounds."""
        norms = local_norms(exp.problem)
        return {} if norms is None else {STATE_KEY: norms.initial(theta, exp.workers)}

    def load_state(self, exp: Run, own: dict[str, Tensor]) -> None:
        """A FedBN model: take the table of every client's BatchNorm rows for the next round."""
        norms = local_norms(exp.problem)
        if norms is None:
            return
        if STATE_KEY not in own:
            raise ConfigError("start", "a snapshot without 'local_norms'", "a FedBN run's snapshot, with every "
                              "client's BatchNorm rows")
        norms.load(own[STATE_KEY])

    def evaluate(self, exp: Run, state: RoundState) -> dict[str, Any] | None:
        """A FedBN model has no global model: every evaluated honest client's own model
        (:meth:`~phalanx.training.algorithms.fedbn.LocalNorms.metrics`); else None (θ's plain accuracy)."""
        norms = local_norms(exp.problem)
        return None if norms is None else norms.metrics(exp, state.theta, state.own[STATE_KEY])

    def client_lr(self, t: int) -> float:
        """The clients' learning rate in round t."""
        return float(self.lr(t)) if callable(self.lr) else float(self.lr)

    def all_workers(self, exp: Run, streams: dict[str, Tensor], momentum: Tensor | None) -> FedAvgClients:
        """The population in this process: the round's sampled clients train as one batched computation."""
        return FedAvgClients(self, exp, streams)

    def one_worker(self, exp: Run, rank: int, streams: dict[str, Tensor], momentum: Tensor | None) -> FedAvgSlot:
        """Client slot ``rank`` of a process-per-slot run: it trains the ``rank``-th sampled client of each round."""
        if isinstance(exp.data, PopulationData):
            raise ConfigError("engine", "torchrun", "'simulated' for a client population (its rounds run in one "
                              "process so far)")
        if exp.attack_knowledge != "omniscient":
            raise ConfigError("attack_knowledge", exp.attack_knowledge, "'omniscient' with a process per client slot "
                              "(the attacking slots are sent the honest slots' vectors; colluders run in process)")
        if isinstance(exp.attack, DataAttack) and exp.attack.needs_previous:
            raise ConfigError("attack", exp.attack.name, "an attack that does not read the previous aggregate with a "
                              "process per client slot (it is passed in process only so far)")
        if exp.stage(PoolStats) is not None:
            raise ConfigError("engine", "torchrun", "'simulated' for a model with BatchNorm / Hybrid BN layers (their "
                              "statistics are pooled in one process so far)")
        if local_norms(exp.problem) is not None:
            raise ConfigError("engine", "torchrun", "'simulated' for a FedBN model (every client's own BatchNorm "
                              "layers are kept in one process so far)")
        return FedAvgSlot(self, exp, rank, streams)


class _Clients:
    """What both shapes share: the population's sizes, each client's number of local steps, the three streams."""

    def __init__(self, algo: FedAvg, exp: Run, streams: dict[str, Tensor]) -> None:
        self.algo = algo
        self.exp = exp
        self.n, self.b = exp.workers, exp.byzantine
        self.honest_n = self.n - self.b
        self.c = algo.per_round(self.n)
        self.data_attack = isinstance(exp.attack, DataAttack)
        self.vector_attack = self.b > 0 and not self.data_attack
        self.colluders = self.vector_attack and exp.attack_knowledge == "colluders"
        self.previous: Tensor | None = None
        """The previous round's aggregate, for an attack that shapes its update by it (set by each round)."""
        self.batch_gen = restored(streams["batches"])
        self.pool = exp.stage(PoolStats)
        """The run's pooling of BatchNorm / Hybrid BN statistics, whose layers the clients measure (None: the model
        has none)."""
        self.attack_gen = restored(streams["attack"])
        self.client_gen = restored(streams["clients"])
        self.stages = WorkerStages(exp.worker_stages, streams, exp.seed)
        self.population = isinstance(exp.data, PopulationData)
        """A client population (:mod:`phalanx.training.population`): nothing is kept per client of it."""
        self.steps: Tensor | None = None
        if not self.population:
            self.steps = self._step_counts(exp.data._sizes)

    def _step_counts(self, sizes: Tensor) -> Tensor:
        """Each client's number of local steps: K, or ⌈E · |shard| / B⌉ with ``local_epochs`` = E."""
        algo = self.algo
        if algo.local_epochs is not None:
            return torch.ceil(algo.local_epochs * sizes.double() / algo.batch_size).long().clamp_min(1)
        return torch.full((int(sizes.numel()),), algo.local_steps, dtype=torch.long)

    def steps_of(self, ids: Tensor) -> Tensor:
        """The local steps of the clients ``ids``: kept for a split data set, computed from the sampled clients'
        sizes for a population."""
        if self.steps is not None:
            return self.steps[ids]
        data = self.exp.data
        assert isinstance(data, PopulationData)
        sizes = data.sizes(ids) if self.algo.local_epochs is not None else torch.zeros(int(ids.numel()))
        return self._step_counts(sizes)

    def streams(self) -> dict[str, Tensor]:
        """The streams' states now: batches, attack and client sampling (and the worker stages' own: the ``dp``
        noise, with differential privacy)."""
        return {"batches": self.batch_gen.get_state(), "attack": self.attack_gen.get_state(),
                "clients": self.client_gen.get_state(), **self.stages.streams()}

    def poisoning(self, t: int) -> bool:
        """Whether the sampled Byzantine clients of round ``t`` train on poisoned batches (a data attack, before its
        ``stop_round``); after it they train honestly."""
        attack = self.exp.attack
        return isinstance(attack, DataAttack) and attack.active(t)

    def sample(self) -> Tensor:
        """The round's clients: C of N uniformly without replacement, in increasing index order (honest clients
        first: the Byzantine ones are the last indices)."""
        if self.population:  # Floyd's algorithm: O(C), not a permutation of the N clients
            return sample_clients(self.n, self.c, self.client_gen)
        return torch.randperm(self.n, generator=self.client_gen)[: self.c].sort().values

    def _train(self, theta: Tensor, ids: Tensor, t: int, poisoned: int, rows: slice = slice(None)) -> Tensor:
        """Local training of the clients ``ids`` from θ; their pseudo-gradients ``θ − θᵢ``, ``(len(ids), d)``. The
        last ``poisoned`` of them train on batches the data attack poisons.

        ``rows``: train only the clients in these positions (one slot of a distributed run: one position, or none
        for a round it missed) and return their rows; the streams are drawn for all of them, as in the batched run,
        so that every slot stays in step and gets the batches the batched run gives its client.
        """
        exp = self.exp
        w = int(ids.numel())
        if w == 0:
            return theta.new_zeros(0, exp.problem.dim)
        params = self._steps(theta, theta.expand(int(ids[rows].numel()), -1).clone(), ids, t, poisoned, rows)
        pseudo = theta - params
        if self.stages:  # every training client's own update, through the worker stages (before any boost)
            pseudo = self.stages.update(pseudo, w, rows)
        return self._boosted(pseudo, w, poisoned, rows)

    def _train_local(self, theta: Tensor, ids: Tensor, t: int, poisoned: int) -> tuple[Tensor, Tensor]:
        """FedBN's local training of the clients ``ids`` (:mod:`phalanx.training.algorithms.fedbn`): each from θ with
        its own BatchNorm parameters, its running statistics tracked step by step. Their pseudo-gradients on the shared
        coordinates ``(len(ids), d_shared)``, and the new table: the honest ones' rows written (the last
        ``poisoned`` clients are a data attack's, whose rows are left as they are)."""
        norms = local_norms(self.exp.problem)
        assert norms is not None
        w = int(ids.numel())
        if w == 0:
            return theta.new_zeros(0, int(norms.shared_index.numel())), norms.current()
        own = norms.current()[ids.to(norms.current().device)]
        start = norms.models(theta, own)
        running = own[:, norms.params :].to(theta).clone()
        params = self._steps(start, start.clone(), ids, t, poisoned, slice(None), running)
        shared = norms.shared(start - params)
        if self.stages:  # every training client's update of the shared coordinates, through the worker stages
            shared = self.stages.update(shared, w)
        pseudo = self._boosted(shared, w, poisoned, slice(None))
        honest = w - poisoned
        return pseudo, norms.updated(ids[:honest], norms.rows(params[:honest], running[:honest]))

    def _steps(
        self, anchor: Tensor, params: Tensor, ids: Tensor, t: int, poisoned: int, rows: slice,
        running: Tensor | None = None,
    ) -> Tensor:
        """The local steps of the clients ``ids[rows]`` from ``params`` (their stacked start, updated in place and
        returned); FedProx pulls towards ``anchor``. With ``running`` (a FedBN model), each step's batch statistics
        are blended into these running statistics, row by row."""
        algo, exp = self.algo, self.exp
        norms = local_norms(exp.problem) if running is not None else None
        w = int(ids.numel())
        velocity = torch.zeros_like(params) if algo.momentum else None
        counts = self.steps_of(ids)
        steps = counts[rows]
        lr = algo.client_lr(t)
        for k in range(int(counts.max())):
            xb, yb = sample_batches_of(exp.data, ids, algo.batch_size, self.batch_gen)
            if poisoned:
                assert isinstance(exp.attack, DataAttack)
                xb, yb = poison_rows(exp.attack, xb, yb, w - poisoned, exp.data.num_classes, self.attack_gen,
                                     (ids[w - poisoned :] - self.honest_n).tolist())
            active = steps > k
            if not bool(active.any()):
                continue
            if norms is None:
                g = exp.problem.grads_each(params, xb[rows], yb[rows])
            else:
                assert running is not None
                g, stats = norms.grads_each(exp.problem, params, xb[rows], yb[rows])
                norms.track(running, stats, active)
            g = self.correct(g, ids[rows])
            if algo.weight_decay:
                g.add_(params, alpha=algo.weight_decay)
            if algo.prox_mu:
                g.add_(params - anchor, alpha=algo.prox_mu)
            if velocity is not None:
                g = velocity.mul_(algo.momentum).add_(g)
            if bool(active.all()):
                params.sub_(g, alpha=lr)
            else:
                on = active.to(params.device)  # the step counts are CPU bookkeeping
                params[on] -= lr * g[on]
        return params

    def correct(self, g: Tensor, ids: Tensor) -> Tensor:
        """The local gradient a step takes, from the clients' stochastic gradients ``g`` (a row per client of
        ``ids``), before weight decay, FedProx and momentum: ``g`` itself. A local-step algorithm built on these
        clients overrides it (SCAFFOLD's drift correction gᵢ − cᵢ + c, say)."""
        return g

    def _boosted(self, pseudo: Tensor, w: int, poisoned: int, rows: slice) -> Tensor:
        """The poisoned clients' updates as their data attack makes them from their pseudo-gradients
        (:meth:`~phalanx.attacks.base.DataAttack.update`: model replacement's ``boost``, a projection), in place."""
        attack = self.exp.attack
        if not poisoned or not isinstance(attack, DataAttack):
            return pseudo
        if attack.boost == 1.0 and not attack.shapes_update:
            return pseudo
        first = w - poisoned
        positions = torch.arange(w, device=pseudo.device)[rows]
        mine = positions >= first
        if bool(mine.any()):
            pseudo[mine] = attack.update(pseudo[mine], self.previous)
        return pseudo


class FedAvgClients(_Clients):
    """The client population of one process (see the module's docstring)."""

    def round(self, theta: Tensor, t: int, rule: Callable[[Tensor], Tensor]) -> Received:
        """Sample, train locally, attack; the C pseudo-gradients with the clients they came from."""
        exp = self.exp
        self.previous = previous_aggregate(rule)
        ids = self.sample()
        honest_ids = ids[ids < self.honest_n]
        byz_ids = ids[ids >= self.honest_n]
        train_ids = ids if self.data_attack or self.colluders else honest_ids
        poisoned = int(byz_ids.numel()) if self.poisoning(t) else 0
        stats = None if self.pool is None else self._stats(theta, train_ids, poisoned, byz_ids, t)
        local = None
        if local_norms(exp.problem) is None:
            vectors = self._train(theta, train_ids, t, poisoned)
        else:
            vectors, local = self._train_local(theta, train_ids, t, poisoned)
        if self.vector_attack and byz_ids.numel():
            vectors = self._with_attack(exp, vectors, int(byz_ids.numel()), rule, t)
        return Received(vectors, rows=ids.tolist(), state_rows=False, stats=stats,
                        own=None if local is None else {STATE_KEY: local})

    def _with_attack(self, exp: Run, rows: Tensor, byzantine: int, rule: Callable[[Tensor], Tensor],
                     t: int) -> Tensor:
        """The round's rows with the sampled Byzantine clients' vector-attack rows last: an omniscient attack sees
        every honest row (``rows`` holds those only); colluders (``rows`` ends with their own ``byzantine`` honest
        computations) see theirs alone, which their attack's rows replace."""
        if self.colluders:
            honest = rows[: rows.shape[0] - byzantine]
            own = rows[rows.shape[0] - byzantine :]
            byz = attack_rows(exp, own, byzantine, rule, self.attack_gen, t, workers=rows.shape[0],
                              knowledge="colluders")
            return torch.cat([honest, byz])
        byz = attack_rows(exp, rows, byzantine, rule, self.attack_gen, t)
        return torch.cat([rows, byz]) if rows.numel() else byz

    def _stats(self, theta: Tensor, ids: Tensor, poisoned: int, byz_ids: Tensor, t: int) -> Tensor:
        """The normalisation statistics the round's clients report, a row per client in the order of the vectors:
        the computing clients' measurements on one batch each of θ (a data attack's on its poisoned batch), then
        a vector attack's rows computed on the honest ones."""
        exp, algo = self.exp, self.algo
        assert self.pool is not None
        norm = self.pool.norm
        width = 2 * norm.channels
        rows = theta.new_zeros(0, width)
        if ids.numel():
            xs, ys = sample_batches_of(exp.data, ids, algo.stats_batch, self.batch_gen)
            if poisoned:
                assert isinstance(exp.attack, DataAttack)
                xs, ys = poison_rows(exp.attack, xs, ys, int(ids.numel()) - poisoned, exp.data.num_classes,
                                     self.attack_gen, (ids[int(ids.numel()) - poisoned :] - self.honest_n).tolist())
            rows = norm.measure(exp.problem.layout.views(theta), exp.problem.buffers, xs)
        if self.vector_attack and byz_ids.numel():
            rows = self._with_attack(exp, rows, int(byz_ids.numel()), lambda r: norm.pool(r, exp.f), t)
        return rows


def attack_rows(
    exp: Run, honest: Tensor, byzantine: int, rule: Callable[[Tensor], Tensor], attack_gen: torch.Generator,
    t: int, workers: int | None = None, knowledge: str = "omniscient",
    screen: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The sampled Byzantine clients' vectors of a vector attack: zeros (no draw) when no honest client was sampled
    — the attackers have nothing to look at. Colluders: ``honest`` is their own honest rows and ``workers`` the
    round's number of vectors; ``screen``: an asynchronous server's filter as an oracle."""
    if honest.shape[0] == 0:
        return honest.new_zeros(byzantine, honest.shape[1])
    assert isinstance(exp.attack, Attack)
    return byzantine_vectors(exp.attack, honest, byzantine=byzantine, f=exp.f, rule=rule, attack_gen=attack_gen,
                             round=t, workers=workers, knowledge=knowledge, screen=screen)


def previous_aggregate(rule: Callable[[Tensor], Tensor]) -> Tensor | None:
    """The previous round's aggregate the loop hands the round with the server's rule (``BoundRule.previous``);
    None in the first round or for a plain callable."""
    return rule.previous if isinstance(rule, BoundRule) else None


class FedAvgSlot(_Clients):
    """Client slot ``rank`` of a distributed run (parameter-server topology, one process per slot).

    Every slot draws the round's sample from the shared ``clients`` stream, so slot j trains the j-th sampled client
    (in increasing index order) — the row the batched run gives that client. A vector attack's Byzantine slots of a
    round differ from round to round, so the ``attack`` stream travels with the honest vectors: the server sends its
    state, the attacking slots draw from it and send the new state back.
    """

    def __init__(self, algo: FedAvg, exp: Run, rank: int, streams: dict[str, Tensor]) -> None:
        super().__init__(algo, exp, streams)
        self.rank = rank
        self.plan = SlotPlan([], [], [])
        self.shares_attack_stream = True

    def warm_up(self) -> None:
        """One throw-away gradient call on one sample (no stream touched): ``torch.func``'s first-call set-up."""
        data, problem = self.exp.data, self.exp.problem
        problem.grads_each(problem.initial_theta()[None], data.x[:1][None], data.y[:1][None])

    def _begin(self) -> Tensor:
        """Sample the round's clients (every slot alike) and set the round's plan."""
        ids = self.sample()
        slots = list(range(int(ids.numel())))
        honest = [j for j in slots if int(ids[j]) < self.honest_n]
        byz = [j for j in slots if int(ids[j]) >= self.honest_n]
        self.plan = SlotPlan(honest, slots if self.data_attack else honest, byz if self.vector_attack else [],
                             ids.tolist())
        return ids

    def vector(self, theta: Tensor, t: int) -> Tensor | None:
        """This round's pseudo-gradient of the slot's client; None for a vector attack's Byzantine client (it
        trains nothing; the batch stream is drawn as in the batched run)."""
        out = self._round(theta, t, train=True)
        return None if out.shape[0] == 0 else out[0]

    def attack_vector(self, honest: Tensor, rule: Callable[[Tensor], Tensor], t: int) -> Tensor:
        """This Byzantine slot's vector of round t: its row of the attack's output on the honest vectors."""
        byz = attack_rows(self.exp, honest, len(self.plan.attacking), rule, self.attack_gen, t)
        return byz[self.plan.attacking.index(self.rank)]

    def skip(self, t: int) -> None:
        """A round this slot missed: draw the round's sample and batches (the streams stay in step), train nothing."""
        self._round(torch.zeros(self.exp.problem.dim, device=self.exp.device), t, train=False)

    def _round(self, theta: Tensor, t: int, train: bool) -> Tensor:
        ids = self._begin()
        computing = self.plan.computing
        poisoned = len(computing) - len(self.plan.honest) if self.poisoning(t) else 0
        mine = train and self.rank in computing
        rows = slice(self.rank, self.rank + 1) if mine else slice(0, 0)
        return self._train(theta, ids[computing], t, poisoned, rows)
