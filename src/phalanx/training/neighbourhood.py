"""A gossip node's neighbourhood and its combination step: what the simulated nodes
(:mod:`phalanx.training.algorithms.gossip`) and one node on its own process
(:mod:`phalanx.training.algorithms.gossip_node`) share.

Node i combines its closed neighbourhood N(i) ∪ {i} with the run's rule: plain gossip (xᵢ ← Σⱼ Wᵢⱼ x̃ⱼ, the
``mean`` rule), a robust gossip rule batched over nodes (:mod:`phalanx.decentralized.robust_gossip`), or any other
rule node by node.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.decentralized.robust_gossip import CHUNK_ELEMENTS, GossipRule, byzantine_weights
from phalanx.decentralized.topology import Graph


class NodeSettings(Protocol):
    """What a gossip node reads of its round algorithm (:class:`~phalanx.training.algorithms.gossip.Gossip` is one):
    the graph
    and mixing matrix, its batch size, penalty, momentum and learning rate."""

    @property
    def graph(self) -> Graph: ...

    @property
    def mixing(self) -> Tensor: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def weight_decay(self) -> float: ...

    @property
    def momentum(self) -> float: ...

    def node_lr(self, t: int) -> float: ...


class AnytimeSettings(NodeSettings, Protocol):
    """A Decentralized Anytime SGD node's settings (:class:`~phalanx.training.algorithms.gossip.AnytimeGossip`): also
    how far
    round t's query point moves to the iterate."""

    def average_weight(self, t: int) -> float: ...


def closed_neighbourhoods(graph: Graph) -> list[Tensor]:
    """N(i) ∪ {i} of every node, in increasing order."""
    adj = graph.adjacency | torch.eye(graph.n, dtype=torch.bool)
    return [torch.nonzero(adj[i]).flatten() for i in range(graph.n)]


class Neighbourhoods:
    """Every node's neighbours N(i) padded to the largest degree K, for batched combination.

    ``index`` ``(n, K)``: the neighbours in increasing order, then the node itself as padding; ``valid`` which
    slots are real; ``weights`` Wᵢⱼ of each slot (float64, 0 on padding); ``own`` Wᵢᵢ; ``tolerated`` bᵢ, the
    Byzantine weight f neighbours can have (:func:`~phalanx.decentralized.robust_gossip.byzantine_weights`);
    ``byzantine`` the slots of Byzantine neighbours (nodes ≥ ``honest``; they are the last real slots of a row).
    """

    def __init__(self, graph: Graph, mixing: Tensor, honest: int, f: int) -> None:
        n = graph.n
        cols = torch.arange(n)
        key = torch.where(graph.adjacency, cols[None, :], torch.full((n, n), n))
        k = max(int(graph.degrees.max()), 1)
        raw = torch.sort(key, dim=1).values[:, :k]
        self.valid = raw < n
        self.index = torch.where(self.valid, raw, cols[:, None].expand(n, k))
        w64 = mixing.to(torch.float64)
        self.weights = torch.where(self.valid, torch.gather(w64, 1, self.index), torch.zeros(n, k, dtype=torch.float64))
        self.own = w64.diagonal().clone()
        self.tolerated = byzantine_weights(self.weights, f)
        self.byzantine = self.valid & (self.index >= honest)
        self.byzantine_counts = self.byzantine.sum(dim=1)

    def chunks(self, nodes: Tensor, dim: int) -> list[Tensor]:
        """``nodes`` cut so that a chunk gathers at most ``CHUNK_ELEMENTS`` (B · K · d) elements."""
        size = max(1, CHUNK_ELEMENTS // max(1, self.index.shape[1] * dim))
        return list(torch.split(nodes, size))

    def rows(self, half: Tensor, nodes: Tensor, messages: dict[int, Tensor]) -> Tensor:
        """What ``nodes`` (increasing) received, ``(B, K, d)``: x̃ⱼ of each neighbour, a Byzantine neighbour's
        message in its place (``messages[i]``: one row per Byzantine neighbour of i, in increasing order)."""
        y = half[self.index[nodes]]
        got = [int(i) for i in nodes.tolist() if int(i) in messages]
        if got:
            mask = self.byzantine[nodes] & torch.isin(nodes, torch.tensor(got))[:, None]
            y[mask] = torch.cat([messages[i] for i in got]).to(y.dtype)
        return y

    def rows_same(self, half: Tensor, nodes: Tensor, messages: Tensor) -> Tensor:
        """What ``nodes`` received when all Byzantine neighbours of node ``nodes[t]`` send it ``messages[t]``."""
        y = half[self.index[nodes]]
        return torch.where(self.byzantine[nodes][:, :, None], messages.to(y.dtype)[:, None, :], y)


class NodeRule:
    """The nodes' combination step with the run's rule: plain gossip (``mean``), a robust gossip rule (batched over
    nodes) or any other rule (node by node), for the server's round and for an attacker that evaluates it."""

    def __init__(self, algo: Any, exp: Any) -> None:
        """``algo``: the gossip algorithm (its graph, its mixing matrix W); ``exp``: the run (rule, honest, f)."""
        self.rule: Aggregator = exp.rule
        self.honest = exp.honest
        self.mixing = algo.mixing
        self.plain = getattr(exp.rule, "name", "") == "mean"
        self.batched = isinstance(exp.rule, GossipRule)
        self.closed = closed_neighbourhoods(algo.graph)
        self.hoods = Neighbourhoods(algo.graph, algo.mixing, exp.honest, exp.f)

    def _batched(self, half: Tensor, nodes: Tensor, y: Tensor) -> Tensor:
        hd = self.hoods
        if self.plain:  # Σⱼ Wᵢⱼ yⱼ, row stochastic: x̃ᵢ Wᵢᵢ + Σ_slots w y
            return (hd.own[nodes].to(half.dtype)[:, None] * half[nodes]
                    + torch.einsum("bk,bkd->bd", hd.weights[nodes].to(half.dtype), y))
        assert isinstance(self.rule, GossipRule)
        return self.rule.combine(half[nodes], y, hd.weights[nodes], hd.own[nodes], hd.tolerated[nodes])

    def combine(self, half: Tensor, follow: int, messages: dict[int, Tensor], generator: torch.Generator) -> Tensor:
        """The new models of nodes ``0 … follow − 1`` with a rule that is not plain gossip, ``(follow, d)``."""
        nodes = torch.arange(follow)
        if self.batched:
            return torch.cat([self._batched(half, c, self.hoods.rows(half, c, messages))
                              for c in self.hoods.chunks(nodes, half.shape[1])])
        h = self.honest
        out = torch.empty(follow, half.shape[1], dtype=half.dtype)
        for i in range(follow):
            hood = self.closed[i]
            rows = half[hood] if i not in messages else torch.cat([half[hood[hood < h]], messages[i]])
            out[i] = self.rule(rows, **node_context(self.rule, half[i], generator))
        return out

    def combine_targets(self, half: Tensor, targets: Tensor, messages: Tensor, generator: torch.Generator) -> Tensor:
        """The new models ``(T, d)`` of ``targets`` when every Byzantine neighbour of ``targets[t]`` sends it
        ``messages[t]`` (what an adaptive decentralized attack evaluates)."""
        if self.plain or self.batched:
            parts = []
            for c in self.hoods.chunks(torch.arange(targets.numel()), half.shape[1]):
                nodes = targets[c]
                parts.append(self._batched(half, nodes, self.hoods.rows_same(half, nodes, messages[c])))
            return torch.cat(parts) if parts else half.new_empty((0, half.shape[1]))
        h = self.honest
        out = torch.empty(targets.numel(), half.shape[1], dtype=half.dtype)
        for t, i in enumerate(targets.tolist()):
            hood = self.closed[i]
            byz = int((hood >= h).sum())
            rows = torch.cat([half[hood[hood < h]], messages[t].to(half.dtype).expand(byz, -1)])
            out[t] = self.rule(rows, **node_context(self.rule, half[i], generator))
        return out

    def attack_context(self, i: int, half: Tensor) -> dict[str, Any]:
        """The rule's context at honest node i for a (server-style) vector attack that calls it on
        ``[honest rows of N(i) ∪ {i}; Byzantine rows]``: the node's own row (its centre, or its index and the rows'
        gossip weights for a robust gossip rule)."""
        keys: frozenset[str] = getattr(self.rule, "context_keys", frozenset())
        hood = self.closed[i]
        honest = hood[hood < self.honest]
        ctx: dict[str, Any] = {}
        if "center" in keys:
            ctx["center"] = half[i]
        if self.batched:
            ctx["own"] = int(torch.nonzero(honest == i)[0])
            ctx["weights"] = torch.cat([self.mixing[i, honest], self.mixing[i, hood[hood >= self.honest]]])
        return ctx


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
