"""Decentralized SGD over a communication graph (gossip), with Byzantine nodes and robust gossip, as a round
algorithm of the one loop.

There is no server: node i of the graph keeps its own model xᵢ, so the run's θ is the stacked ``(n, d)`` matrix X
(row i is xᵢ; every node starts from the same θ₀). Round t (D-SGD of Lian et al., "Can decentralized algorithms
outperform centralized algorithms?", NeurIPS 2017, Algorithm 1, with local momentum; the robust variant in which every
node aggregates its neighbourhood with a robust rule, e.g. Farhadkhani et al., ICML 2023, and He, Karimireddy &
Jaggi, 2022):

1. every honest node draws a batch of its shard, computes gᵢ = ∇ℓ(xᵢ; batch) + λxᵢ and its momentum
   mᵢ ← β mᵢ + (1 − β) gᵢ (m₀ = g₀), and takes a local step x̃ᵢ = xᵢ − η mᵢ;
2. it sends x̃ᵢ to its neighbours N(i); a Byzantine node j sends each neighbour i what its attack says — a vector
   attack computes it on i's honest closed neighbourhood {x̃ₖ : k ∈ N(i) ∪ {i} honest} with i's rule, so different
   neighbours may get different vectors; a data attack's node trains on poisoned batches and sends its x̃ⱼ;
3. every honest node combines what it received with its own x̃ᵢ:

   * ``rule = "mean"`` — gossip averaging with the graph's mixing matrix W (Metropolis–Hastings by default):
     xᵢ ← Σⱼ Wᵢⱼ x̃ⱼ (a Byzantine neighbour's message in place of x̃ⱼ), for all nodes one matrix product;
   * a robust gossip rule (:mod:`phalanx.decentralized.robust_gossip`: ``clipped_gossip``, ``cs_plus``, ``ios``,
     ``monna``) — xᵢ ← x̃ᵢ + Σⱼ cᵢⱼ (x̃ⱼ − x̃ᵢ), coefficients from W, the differences and the Byzantine weight f
     neighbours can have; all nodes batched (neighbourhoods padded to the largest degree, :class:`Neighbourhoods`);
   * any other rule or chain — xᵢ ← Agg({x̃ⱼ : j ∈ N(i) ∪ {i}}), the rule configured for f applied to node i's
     closed neighbourhood (a loop over nodes). A rule that takes a centre gets the node's own x̃ᵢ: ``cc`` is then
     self-centred clipping (He, Karimireddy & Jaggi, "Byzantine-robust decentralized learning via ClippedGossip",
     2022), xᵢ ← x̃ᵢ + (1/|N(i)∪{i}|) Σⱼ CLIP(x̃ⱼ − x̃ᵢ, τ), with uniform weights and a fixed radius τ.

A decentralized attack (:mod:`phalanx.decentralized.gossip_attacks`: ``dissensus``, ``spectral``) computes every
target's message at once from the honest local steps, the graph and W; it may evaluate the targets' rule
(``spectral`` with ``scale = "search"``).

On the loop's seam: the node side is this module's :class:`GossipNodes` (the in-process transport's worker side);
the aggregation is :class:`GossipServer`, which returns the displacement X − X_new so that the experiment's
optimizer, plain SGD with step 1, lands on the new models. Evaluation reports the honest nodes' mean and worst test
accuracy and their consensus distance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from phalanx.attacks.base import Attack, DataAttack
from phalanx.decentralized import gossip as gossip_ops
from phalanx.decentralized import gossip_attacks, robust_gossip, topology
from phalanx.decentralized.gossip_attacks import GossipAttack, GossipView
from phalanx.decentralized.robust_gossip import GossipRule
from phalanx.decentralized.topology import Graph
from phalanx.errors import ConfigError
from phalanx.training.algorithms.base import RoundAlgorithm, built_in_params, check_knowledge, check_stop
from phalanx.training.algorithms.dsgd import byzantine_vectors, computing_workers, worker_batches
from phalanx.training.algorithms.gossip_node import AnytimeNode, OneNode, check_attack
from phalanx.training.neighbourhood import NodeRule, closed_neighbourhoods
from phalanx.training.schedule import LRSchedule
from phalanx.training.server import BoundRule, RoundResult
from phalanx.training.state import Received, RoundState
from phalanx.training.streams import restored
from phalanx.validate import Key, Section, check_choice, check_int, check_real

if TYPE_CHECKING:
    from phalanx.aggregators.base import Aggregator
    from phalanx.training.algorithms.base import Run

GRAPH_BYTES_PER_PAIR = 64
"""What building a decentralized run holds per pair of nodes at its peak: the dense adjacency (1 byte), the mixing
matrix W in float64 (8), the copies that building and checking W make, and the padded neighbourhood tables (for a
complete graph n × (n − 1) weights, indices and masks). Measured: 60 bytes per pair for the complete graph at
n = 4,000 (the densest case; peak resident memory of topology.make + Gossip + Neighbourhoods)."""


def check_graph_memory(n: int) -> None:
    """Refuse (one line, before anything is built) a decentralized run whose dense n × n graph and mixing matrices
    would not fit in the memory this process can still get (:func:`phalanx.memory.available_memory`)."""
    from phalanx.memory import MEMORY_SHARE, available_memory

    need = GRAPH_BYTES_PER_PAIR * n * n
    avail = available_memory()
    if avail is not None and need > MEMORY_SHARE * avail:
        largest = int((MEMORY_SHARE * avail / GRAPH_BYTES_PER_PAIR) ** 0.5)
        raise ConfigError(
            "workers", n, f"at most {largest:,} nodes for a decentralized run on this machine (its n × n graph and "
            f"mixing matrices need ~{need / 1e9:.1f} GB; {avail / 1e9:.1f} GB are available)",
            "fewer nodes, or a machine with more memory",
        )


@dataclass(frozen=True)
class Gossip(RoundAlgorithm):
    """Decentralized SGD on ``graph``: ``batch_size`` samples per node and round, local learning rate ``lr`` (a
    number or a schedule over rounds), local momentum β, L2 penalty λ; ``weights`` names the mixing matrix of plain
    gossip (``metropolis_hastings`` or ``uniform_neighbour``, :mod:`phalanx.decentralized.gossip`)."""

    graph: Graph
    weights: str = "metropolis_hastings"
    batch_size: int = 32
    lr: float | Callable[[int], float] = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    mixing: Tensor = field(init=False, repr=False, compare=False)
    name = "gossip"
    missing_word = "neighbours"
    lr_role = "node"
    config_section = Section("gossip", (
        Key("graph", "graph", str, "ring", "gossip: the communication graph (ring, torus, complete, star, "
            "erdos_renyi, exponential, hypercube, or a 'module:attr' builder) over the `workers` nodes"),
        Key("graph_params", "graph_params", dict[str, Any], {}, "gossip: the graph's parameters (erdos_renyi: p, "
            "seed; torus: rows, cols)"),
        Key("weights", "gossip_weights", str, "metropolis_hastings", "gossip: the mixing matrix of plain gossip "
            "(aggregator = 'mean'): metropolis_hastings or uniform_neighbour"),
    ), "gossip's and Anytime SGD's own flat keys")
    config_keys = config_section.flat_keys()
    section_keys: ClassVar[dict[str, str]] = config_section.renamed()
    config_columns = ("algorithm", "graph", "gossip_weights")
    decentralized = True
    topologies = ("gossip",)  # a rank per node, exchanging with its graph neighbours
    population_key = "graph"

    def __post_init__(self) -> None:
        if not isinstance(self.graph, Graph):
            raise ConfigError("graph", self.graph, "a phalanx.decentralized.topology.Graph")
        check_int("batch_size", self.batch_size, low=1)
        if not callable(self.lr):
            check_real("lr", self.lr, low=0.0, low_open=True)
        check_real("momentum", self.momentum, low=0.0, high=1.0, high_open=True)
        check_real("weight_decay", self.weight_decay, low=0.0)
        w = gossip_ops.weights(self.weights, self.graph, torch.float64)
        gossip_ops.check_gossip_matrix(w, self.graph, kind="row", parameter="gossip_weights")
        object.__setattr__(self, "mixing", w)

    @classmethod
    def from_config(cls, cfg: Any, lr: Callable[[int], float]) -> tuple[Gossip, Callable[[int], float]]:
        """Over ``graph`` (with ``graph_params``) on the ``workers`` nodes, mixing with ``gossip_weights``; ``lr``,
        ``momentum`` and ``weight_decay`` are the nodes', and the loop's step applies what the nodes computed
        (a constant 1). The graph's memory is checked before it is built (:func:`check_graph_memory`)."""
        built_in_params(cfg)
        check_choice("gossip_weights", cfg.gossip_weights, gossip_ops.weight_names())
        check_graph_memory(cfg.workers)  # before the graph is built: its matrices are dense n × n
        graph = topology.make(cfg.graph, cfg.workers, **cfg.graph_params)
        algorithm = cls(graph=graph, weights=cfg.gossip_weights, batch_size=cfg.batch_size, lr=lr,
                        momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        return algorithm, LRSchedule(1.0, "constant", cfg.rounds, cfg.step_every)

    @classmethod
    def make_rule(cls, spec: str, f: int) -> Aggregator:
        """Any rule of :func:`phalanx.aggregators.make`, or a robust gossip rule (it runs at every node)."""
        return robust_gossip.configured(spec, f, cls.name, True)

    @classmethod
    def make_attack(cls, name: str, params: dict[str, Any]) -> Attack | DataAttack:
        """Any attack of :func:`phalanx.attacks.make`, or a decentralized attack (it uses the graph)."""
        return gossip_attacks.configured(name, params, cls.name, True)

    def check_config(self, cfg: Any, rule: Aggregator, attack: Attack | DataAttack) -> None:
        """An attached graph's Byzantine nodes are the run's; every node's closed neighbourhood
        N(i) ∪ {i} large enough for the rule with f; on the torchrun engine, an attack a rank can compute from its
        neighbourhood (:func:`~phalanx.training.algorithms.gossip_node.check_attack`)."""
        check_knowledge(cfg.attack_knowledge, attack, self, cfg.engine)
        check_stop(attack, self, "attack_params.stop_round")
        if cfg.graph == "attached" and cfg.byzantine not in (0, cfg.graph_params.get("byzantine")):
            raise ConfigError("graph_params.byzantine", cfg.graph_params.get("byzantine"), f"= byzantine "
                              f"({cfg.byzantine}): the attached nodes are the run's Byzantine ones (or byzantine = 0: "
                              "the same graph without an attack)")
        hood = self.per_round(cfg.workers)
        if 2 * rule.f >= hood or hood < rule.min_workers():
            need = max(2 * rule.f + 1, rule.min_workers())
            raise ConfigError(
                "graph", cfg.graph, f"a graph whose every node has >= {need - 1} neighbours for aggregator "
                f"{cfg.aggregator!r} with f={cfg.f} (the smallest closed neighbourhood of this one has {hood} nodes)",
                "a denser graph (torus, exponential, complete) or a smaller f",
            )
        if cfg.engine == "torchrun":
            check_attack(attack)  # a rank holds its neighbourhood only: spectral (uᵀX̃ of every node) is refused

    def per_round(self, workers: int) -> int:
        """How many vectors a node's rule aggregates at least: the smallest closed neighbourhood."""
        if workers != self.graph.n:
            raise ConfigError("workers", workers, f"= the graph's nodes ({self.graph.n})")
        return int(self.graph.degrees.min()) + 1

    def population(self, workers: int) -> str:
        """A node's rule aggregates its closed neighbourhood."""
        return "the smallest closed neighbourhood of the graph"

    def node_lr(self, t: int) -> float:
        """The nodes' learning rate in round t."""
        return float(self.lr(t)) if callable(self.lr) else float(self.lr)

    def all_workers(self, exp: Run, streams: dict[str, Tensor], momentum: Tensor | None) -> GossipNodes:
        """The n nodes in this process, one batched gradient call per round over their own parameters."""
        return GossipNodes(self, exp, streams, momentum)

    def one_worker(self, exp: Run, rank: int, streams: dict[str, Tensor], momentum: Tensor | None) -> Any:
        """Node ``rank`` alone, as one rank of the torchrun engine runs it (``topology = "gossip"``,
        :mod:`phalanx.distributed.neighbours`); ``momentum``: every node's carried rows ``(n, d)``, or None."""
        return OneNode(self, exp, rank, streams, momentum)

    def make_server(self, exp: Run, generator: torch.Generator) -> GossipServer:
        """Every honest node's combination of its neighbourhood (there is no server)."""
        return GossipServer(self, exp, generator)

    def evaluate(self, exp: Run, state: RoundState) -> dict[str, Any] | None:
        """A model per node: the honest nodes' test accuracies and losses (:func:`honest_metrics`); None before the
        first round, when every node holds the one initial model θ₀ ``(d,)``."""
        if state.theta.dim() == 1:
            return None
        return honest_metrics(state.theta, exp.honest,
                              lambda theta: exp.problem.evaluate(theta, exp.test_x, exp.test_y))


@dataclass(frozen=True)
class AnytimeGossip(Gossip):
    """Decentralized Anytime SGD (Eisen, Dorfman & Levy, "Enhancing parallelism in decentralized stochastic convex
    optimization", ICML 2025, arXiv 2506.00961) on ``graph``.

    Every node i keeps two sequences, its iterate wᵢ and its query point xᵢ (the node's model: it is evaluated and
    reported), both starting at θ₀. Round t = 1, 2, … with weights αₜ = t and α₁:ₜ = Σ_{τ≤t} α_τ = t(t + 1)/2:

        gᵢ = ∇ℓ(xᵢ; batch) + λ xᵢ                              (the gradient at the query point)
        w̃ᵢ = wᵢ − η αₜ gᵢ
        x̃ᵢ = (α₁:ₜ₋₁ / α₁:ₜ) xᵢ + (αₜ / α₁:ₜ) w̃ᵢ = xᵢ + 2/(t + 1) · (w̃ᵢ − xᵢ)
        wᵢ ← Σⱼ Wᵢⱼ w̃ⱼ,   xᵢ ← Σⱼ Wᵢⱼ x̃ⱼ                       (both sequences gossiped)

    so that xᵢ is (up to gossip) the αₜ-weighted average of the node's iterates: the anytime online-to-batch
    conversion of Cutkosky ("Anytime online-to-batch, optimism and acceleration", ICML 2019) made decentralized.
    ``lr`` is η: the step taken on w grows as η·t, so η is much smaller than a D-SGD step size. There is no
    momentum (``momentum`` must be 0). A node's message is the pair (w̃ᵢ, x̃ᵢ) as one 2d-vector; a robust rule, a
    Byzantine neighbour's vector attack and the decentralized attacks see that pair (the combination clips or
    trims it as a whole), plain gossip mixes both halves with W."""

    name = "anytime"
    config_defaults: ClassVar[dict[str, Any]] = {"momentum": 0.0}  # no momentum: its default, not an error

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_momentum(self.momentum)

    @staticmethod
    def check_momentum(momentum: float) -> None:
        """Decentralized Anytime SGD has no momentum: a ConfigError naming ``momentum`` unless it is 0."""
        if momentum:
            raise ConfigError("momentum", momentum, "0 with algorithm = 'anytime' (Decentralized Anytime SGD steps "
                              "on the gradient at the query point, without momentum)")

    @staticmethod
    def average_weight(t: int) -> float:
        """αₜ / α₁:ₜ = 2/(t + 1) of round ``t`` (0-based: the paper's round t + 1): how far x̃ moves to w̃."""
        return 2.0 / (t + 2)

    def all_workers(self, exp: Run, streams: dict[str, Tensor], momentum: Tensor | None) -> AnytimeNodes:
        """The n nodes in this process; ``momentum`` carries their iterates w (``None``: w = θ₀)."""
        return AnytimeNodes(self, exp, streams, momentum)

    def one_worker(self, exp: Run, rank: int, streams: dict[str, Tensor], momentum: Tensor | None) -> Any:
        """Node ``rank`` alone, as one rank of the torchrun engine runs it; ``momentum``: every node's iterates
        ``(n, d)``, or None."""
        return AnytimeNode(self, exp, rank, streams, momentum)

    def make_server(self, exp: Run, generator: torch.Generator) -> AnytimeServer:
        """Every honest node's combination of its neighbourhood, for both sequences."""
        return AnytimeServer(self, exp, generator)


class GossipNodes:
    """All n nodes in one process (see the module's docstring): their batches, gradients, momentum and local steps,
    and the Byzantine nodes' messages to each honest neighbour."""

    def __init__(self, algo: Gossip, exp: Run, streams: dict[str, Tensor], momentum: Tensor | None) -> None:
        self.algo = algo
        self.exp = exp
        self.n, self.b = exp.workers, exp.byzantine
        self.honest_n = self.n - self.b
        self.computing = computing_workers(exp.attack, self.n, self.b)
        self.vector_attack = self.b > 0 and not isinstance(exp.attack, DataAttack)
        self.batch_gen = restored(streams["batches"])
        self.attack_gen = restored(streams["attack"])
        self.buffer = momentum
        self.closed = closed_neighbourhoods(algo.graph)
        self.node_rule = NodeRule(algo, exp)
        hoods = self.node_rule.hoods
        self.targets = torch.nonzero(hoods.byzantine_counts[: self.honest_n] > 0).flatten()

    def streams(self) -> dict[str, Tensor]:
        """The node-side streams' states now."""
        return {"batches": self.batch_gen.get_state(), "attack": self.attack_gen.get_state()}

    def gradients(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        """Every node's rows X ``(n, d)`` and the gradients gᵢ = ∇ℓ(xᵢ; batch) + λxᵢ of the nodes that compute
        (``(computing, d)``), each on the round's batch of its shard."""
        exp, algo = self.exp, self.algo
        x = theta if theta.dim() == 2 else theta.expand(self.n, -1)
        xb, yb = worker_batches(exp.data, exp.attack, workers=self.n, byzantine=self.b,
                                batch_size=algo.batch_size, batch_gen=self.batch_gen, attack_gen=self.attack_gen)
        c = self.computing
        g = exp.problem.grads_each(x[:c].contiguous(), xb, yb)
        if algo.weight_decay:
            g.add_(x[:c], alpha=algo.weight_decay)
        return x, g

    def round(self, theta: Tensor, t: int, rule: Callable[[Tensor], Tensor]) -> Received:
        """The local steps x̃ of every node ``(n, d)`` (a vector-attack Byzantine node's row: its model, unused), the
        Byzantine messages to each honest node, and the momentum rows to carry."""
        exp, algo = self.exp, self.algo
        x, g = self.gradients(theta)
        c = self.computing
        if self.buffer is None:
            self.buffer = torch.zeros(self.n, exp.problem.dim, dtype=g.dtype)
            self.buffer[:c] = g
        else:
            self.buffer[:c].lerp_(g, 1.0 - algo.momentum)
        if c == self.n:  # one pass over the (n, d) state
            half = torch.sub(x, self.buffer, alpha=algo.node_lr(t))
        else:
            half = x.clone()
            half[:c].sub_(self.buffer[:c], alpha=algo.node_lr(t))
        messages = self._messages(half, t) if self.vector_attack else {}
        return Received(half, state_rows=False, carry=self.buffer, messages=messages)

    def _messages(self, half: Tensor, t: int) -> dict[int, Tensor]:
        """What the Byzantine neighbours of each honest node send it: a decentralized attack's messages for all
        targets at once, or a server attack on that node's honest closed neighbourhood, one attack call per honest
        node with Byzantine neighbours (in index order)."""
        exp = self.exp
        assert isinstance(exp.attack, Attack)
        if isinstance(exp.attack, GossipAttack):
            return self._gossip_messages(exp.attack, half, t)
        out: dict[int, Tensor] = {}
        for i in self.targets.tolist():
            hood = self.closed[i]
            byz = int((hood >= self.honest_n).sum())
            honest_rows = half[hood[hood < self.honest_n]]
            context = self.node_rule.attack_context(i, half)
            out[i] = byzantine_vectors(exp.attack, honest_rows, byzantine=byz, f=exp.f,
                                       rule=BoundRule(exp.rule, context), attack_gen=self.attack_gen, round=t)
        return out

    def _gossip_messages(self, attack: GossipAttack, half: Tensor, t: int) -> dict[int, Tensor]:
        """A decentralized attack: one vector per target, sent by each of its Byzantine neighbours. Its evaluations
        of a stochastic rule draw from a generator of their own (seeded with the round), not from the run's
        streams."""
        h, targets = self.honest_n, self.targets
        if targets.numel() == 0:
            return {}
        search = torch.Generator().manual_seed(t)
        view = GossipView(
            honest=half[:h], mixing=self.algo.mixing, targets=targets, f=self.exp.f,
            combine=lambda m: self.node_rule.combine_targets(half, targets, m, search),
            generator=self.attack_gen, round=t,
        )
        msgs = attack.messages(view).to(half.dtype)
        counts = self.node_rule.hoods.byzantine_counts
        return {int(i): msgs[k].expand(int(counts[i]), -1) for k, i in enumerate(targets.tolist())}


class GossipServer:
    """The honest nodes' combination step (see the module's docstring); the loop's server for gossip rounds."""

    def __init__(self, algo: Gossip, exp: Run, generator: torch.Generator) -> None:
        self.algo = algo
        self.exp = exp
        self.rule: Aggregator = exp.rule
        self.f = exp.f
        self.generator = generator
        self.honest = exp.honest
        self.closed = closed_neighbourhoods(algo.graph)
        self.plain = getattr(exp.rule, "name", "") == "mean"
        if isinstance(exp.rule, GossipRule):
            exp.rule.check_graph(algo.graph)
        self.node_rule = NodeRule(algo, exp)
        self.theta: Tensor | None = None
        # the nodes that combine: the honest ones, and a data attack's (they follow the protocol)
        self.follow = exp.workers if isinstance(exp.attack, DataAttack) else self.honest
        # plain gossip among them as one (sparse, for large sparse graphs) matrix product
        self.mix = gossip_ops.operator(algo.mixing[: self.follow, : self.follow].to(torch.float32))

    def context(self, theta: Tensor, previous: Tensor | None) -> dict[str, Any]:
        """No server context: every node's rule sees only its neighbourhood (the round's X is kept for the
        displacement)."""
        self.theta = theta
        return {}

    def aggregate(self, got: Received, context: dict[str, Any], measure: bool) -> tuple[Tensor, RoundResult | None]:
        """The displacement X − X_new of every node."""
        assert self.theta is not None, "context() first"
        return self.theta - self.combined(got), None

    def combined(self, got: Received) -> Tensor:
        """Every node's row after the combination step. The nodes that follow the protocol combine — the honest
        ones, and a data attack's nodes (they only train on poisoned data); a vector attack's nodes keep their
        row."""
        half, messages = got.vectors, got.messages or {}
        h, follow = self.honest, self.follow
        if self.plain and follow == half.shape[0]:  # every node combines: no copy of the state first
            new = gossip_ops.gossip(self.mix, half)
        else:
            new = half.clone()
        if self.plain:
            if follow < half.shape[0]:
                new[:follow] = gossip_ops.gossip(self.mix, half[:follow].contiguous())
            w = self.algo.mixing
            for i, msgs in messages.items():  # Byzantine neighbours' messages, weighted as their rows would be
                byz = self.closed[i][self.closed[i] >= h]
                new[i] += (w[i, byz].to(half.dtype)[:, None] * msgs).sum(0)
        else:
            new[:follow] = self.node_rule.combine(half, follow, messages, self.generator)
        return new


class AnytimeNodes(GossipNodes):
    """The n nodes of Decentralized Anytime SGD (:class:`AnytimeGossip`): the carried state is the iterates w, the
    round's vectors are the pairs [w̃ᵢ | x̃ᵢ] ``(n, 2d)``."""

    def round(self, theta: Tensor, t: int, rule: Callable[[Tensor], Tensor]) -> Received:
        algo = self.algo
        assert isinstance(algo, AnytimeGossip)
        x, g = self.gradients(theta)
        c = self.computing
        if self.buffer is None:  # w₁ = x₁ = θ₀
            self.buffer = x.clone()
        w_half = self.buffer.clone()
        w_half[:c].sub_(g, alpha=algo.node_lr(t) * (t + 1))  # η αₜ gᵢ, αₜ = t in the paper's 1-based rounds
        x_half = x.clone()
        x_half[:c].lerp_(w_half[:c], algo.average_weight(t))
        half = torch.cat([w_half, x_half], dim=1)
        messages = self._messages(half, t) if self.vector_attack else {}
        return Received(half, state_rows=False, carry=self.buffer, messages=messages)


class AnytimeServer(GossipServer):
    """The honest nodes' combination of the pairs [w̃ | x̃]: the combined iterates are written into the nodes'
    carried state, the query points become the run's X."""

    def aggregate(self, got: Received, context: dict[str, Any], measure: bool) -> tuple[Tensor, RoundResult | None]:
        new = self.combined(got)
        d = new.shape[1] // 2
        assert got.carry is not None and self.theta is not None, "the nodes' iterates, and context() first"
        got.carry.copy_(new[:, :d])
        return self.theta - new[:, d:], None


def honest_metrics(theta: Tensor, honest: int, evaluate: Callable[[Tensor], tuple[float, float]]) -> dict[str, Any]:
    """Test accuracy and loss of every honest node's model: their mean, the worst node's accuracy, and the honest
    nodes' consensus distance (1/h) Σᵢ ‖xᵢ − x̄‖²."""
    accs, losses = zip(*(evaluate(theta[i]) for i in range(honest)))
    return {"test_accuracy": sum(accs) / honest, "test_loss": sum(losses) / honest,
            "worst_node_accuracy": min(accs), "consensus_distance": gossip_ops.consensus_distance(theta[:honest])}
