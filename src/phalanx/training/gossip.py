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
   * any other rule or chain — xᵢ ← Agg({x̃ⱼ : j ∈ N(i) ∪ {i}}), the rule configured for f applied to node i's
     closed neighbourhood (a loop over nodes). A rule that takes a centre gets the node's own x̃ᵢ: ``cc`` is then
     self-centred clipping (He, Karimireddy & Jaggi, "Byzantine-robust decentralized learning via ClippedGossip",
     2022), xᵢ ← x̃ᵢ + (1/|N(i)∪{i}|) Σⱼ CLIP(x̃ⱼ − x̃ᵢ, τ), with uniform weights and a fixed radius τ.

On the loop's seam: the node side is this module's :class:`GossipNodes` (the in-process transport's worker side);
the aggregation is :class:`GossipServer`, which returns the displacement X − X_new so that the experiment's
optimizer, plain SGD with step 1, lands on the new models. Evaluation reports the honest nodes' mean and worst test
accuracy and their consensus distance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from phalanx.attacks.base import Attack, DataAttack
from phalanx.decentralized import gossip as gossip_ops
from phalanx.decentralized.topology import Graph
from phalanx.errors import ConfigError
from phalanx.training.dsgd import byzantine_vectors, computing_workers, worker_batches
from phalanx.training.server import BoundRule, RoundResult
from phalanx.training.state import Received
from phalanx.training.streams import restored
from phalanx.validate import check_int, check_real

if TYPE_CHECKING:
    from phalanx.aggregators.base import Aggregator
    from phalanx.training.experiment import Experiment


@dataclass(frozen=True)
class Gossip:
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

    def per_round(self, workers: int) -> int:
        """How many vectors a node's rule aggregates at least: the smallest closed neighbourhood."""
        if workers != self.graph.n:
            raise ConfigError("workers", workers, f"= the graph's nodes ({self.graph.n})")
        return int(self.graph.degrees.min()) + 1

    def node_lr(self, t: int) -> float:
        """The nodes' learning rate in round t."""
        return float(self.lr(t)) if callable(self.lr) else float(self.lr)

    def all_workers(self, exp: Experiment, streams: dict[str, Tensor], momentum: Tensor | None) -> GossipNodes:
        """The n nodes in this process, one batched gradient call per round over their own parameters."""
        return GossipNodes(self, exp, streams, momentum)

    def one_worker(self, exp: Experiment, rank: int, streams: dict[str, Tensor], momentum: Tensor | None) -> Any:
        raise ConfigError("engine", "torchrun", "'simulated' with algorithm = 'gossip' (decentralized rounds run in "
                          "one process so far)")

    def make_server(self, exp: Experiment, generator: torch.Generator) -> GossipServer:
        """Every honest node's combination of its neighbourhood (there is no server)."""
        return GossipServer(self, exp, generator)


def closed_neighbourhoods(graph: Graph) -> list[Tensor]:
    """N(i) ∪ {i} of every node, in increasing order."""
    adj = graph.adjacency | torch.eye(graph.n, dtype=torch.bool)
    return [torch.nonzero(adj[i]).flatten() for i in range(graph.n)]


class GossipNodes:
    """All n nodes in one process (see the module's docstring): their batches, gradients, momentum and local steps,
    and the Byzantine nodes' messages to each honest neighbour."""

    def __init__(self, algo: Gossip, exp: Experiment, streams: dict[str, Tensor], momentum: Tensor | None) -> None:
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

    def streams(self) -> dict[str, Tensor]:
        """The node-side streams' states now."""
        return {"batches": self.batch_gen.get_state(), "attack": self.attack_gen.get_state()}

    def round(self, theta: Tensor, t: int, rule: Callable[[Tensor], Tensor]) -> Received:
        """The local steps x̃ of every node ``(n, d)`` (a vector-attack Byzantine node's row: its model, unused), the
        Byzantine messages to each honest node, and the momentum rows to carry."""
        exp, algo = self.exp, self.algo
        x = theta if theta.dim() == 2 else theta.expand(self.n, -1)
        xb, yb = worker_batches(exp.data, exp.attack, workers=self.n, byzantine=self.b,
                                batch_size=algo.batch_size, batch_gen=self.batch_gen, attack_gen=self.attack_gen)
        c = self.computing
        g = exp.problem.grads_each(x[:c].contiguous(), xb, yb)
        if algo.weight_decay:
            g.add_(x[:c], alpha=algo.weight_decay)
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
        """What the Byzantine neighbours of each honest node send it: the attack on that node's honest closed
        neighbourhood, one attack call per honest node with Byzantine neighbours (in index order)."""
        exp = self.exp
        assert isinstance(exp.attack, Attack)
        out: dict[int, Tensor] = {}
        for i in range(self.honest_n):
            hood = self.closed[i]
            byz = int((hood >= self.honest_n).sum())
            if byz == 0:
                continue
            honest_rows = half[hood[hood < self.honest_n]]
            centre = {"center": half[i]} if "center" in getattr(exp.rule, "context_keys", frozenset()) else {}
            out[i] = byzantine_vectors(exp.attack, honest_rows, byzantine=byz, f=exp.f,
                                       rule=BoundRule(exp.rule, centre), attack_gen=self.attack_gen, round=t)
        return out


class GossipServer:
    """The honest nodes' combination step (see the module's docstring); the loop's server for gossip rounds."""

    def __init__(self, algo: Gossip, exp: Experiment, generator: torch.Generator) -> None:
        self.algo = algo
        self.exp = exp
        self.rule: Aggregator = exp.rule
        self.f = exp.f
        self.generator = generator
        self.honest = exp.honest
        self.closed = closed_neighbourhoods(algo.graph)
        self.plain = getattr(exp.rule, "name", "") == "mean"
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
        """The displacement X − X_new of every node. The nodes that follow the protocol combine — the honest ones,
        and a data attack's nodes (they only train on poisoned data); a vector attack's nodes keep their row."""
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
            for i in range(follow):
                hood = self.closed[i]
                rows = half[hood] if i not in messages else torch.cat([half[hood[hood < h]], messages[i]])
                new[i] = self.rule(rows, **node_context(self.rule, half[i], self.generator))
        assert self.theta is not None, "context() first"
        return self.theta - new, None


def node_context(rule: Any, own: Tensor, generator: torch.Generator) -> dict[str, Any]:
    """What a rule that takes a context gets at node i: its own local step as the centre (centered clipping
    becomes self-centred clipping, He, Karimireddy & Jaggi 2022), the run's aggregator stream for a stochastic
    rule."""
    keys: frozenset[str] = getattr(rule, "context_keys", frozenset())
    ctx: dict[str, Any] = {}
    if "center" in keys:
        ctx["center"] = own
    if "generator" in keys:
        ctx["generator"] = generator
    return ctx


def honest_metrics(theta: Tensor, honest: int, evaluate: Callable[[Tensor], tuple[float, float]]) -> dict[str, Any]:
    """Test accuracy and loss of every honest node's model: their mean, the worst node's accuracy, and the honest
    nodes' consensus distance (1/h) Σᵢ ‖xᵢ − x̄‖²."""
    accs, losses = zip(*(evaluate(theta[i]) for i in range(honest)))
    return {"test_accuracy": sum(accs) / honest, "test_loss": sum(losses) / honest,
            "worst_node_accuracy": min(accs), "consensus_distance": gossip_ops.consensus_distance(theta[:honest])}
