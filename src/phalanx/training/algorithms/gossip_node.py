"""One node of a decentralized round in a process of its own: what rank r of the torchrun engine's
``topology = "gossip"`` computes (:mod:`phalanx.distributed.neighbours` moves the rows between the ranks).

:class:`OneNode` is node r of :class:`~phalanx.training.algorithms.gossip.GossipNodes`, alone (D-SGD of Lian et al.,
NeurIPS 2017, Algorithm 1, with local momentum — the module :mod:`phalanx.training.algorithms.gossip`):

* its local step is row r of :meth:`GossipNodes.round <phalanx.training.algorithms.gossip.GossipNodes.round>` with
  the same operations: the round's batch positions are drawn for *every* computing node from the shared
  ``batches`` stream
  (so every rank's stream stays in step) and only row r's samples are gathered; gᵣ = ∇ℓ(xᵣ; batch) + λxᵣ,
  mᵣ ← β mᵣ + (1 − β) gᵣ (m₀ = g₀), x̃ᵣ = xᵣ − η mᵣ. Under a data attack every rank builds all the batches, so that
  the ``attack`` stream, drawn once per Byzantine node in index order, stays in step too;
* a Byzantine node of a vector attack computes nothing (it draws, to stay in step) and, once it holds the honest
  local steps it is sent, computes its message to each honest neighbour i exactly as the simulated engine's
  omniscient attacker computes it for i: the attack on i's honest closed neighbourhood {x̃ₖ : k ∈ N(i) ∪ {i}
  honest}, with i's rule and context (:meth:`NodeRule.attack_context <phalanx.training.algorithms.gossip.NodeRule.
  attack_context>`), keeping its own row of the attack's output (its place among i's Byzantine neighbours, in index
  order). It makes the attack call of every target, its own or not, in the simulated engine's order, so that the
  one ``attack`` stream the Byzantine nodes share advances alike on every Byzantine rank; ``dissensus`` is one
  view of the honest rows, as in the simulation. ``spectral`` (and a decentralized attack of your own) is refused:
  its messages need every honest node's local step (uᵀX̃), which no node of a real graph holds.

The node keeps every node's carried rows ``(n, d)`` (its own row live, the others as it was started with or told),
so that the loop's server — :class:`~phalanx.training.algorithms.gossip.GossipServer`, unchanged — sees the shapes of
the simulated engine.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from phalanx.attacks.base import Attack, DataAttack
from phalanx.decentralized.gossip_attacks import GossipAttack, GossipView
from phalanx.errors import ConfigError
from phalanx.training.algorithms.dsgd import byzantine_vectors, computing_workers, worker_batches
from phalanx.training.neighbourhood import AnytimeSettings, NodeRule, NodeSettings, closed_neighbourhoods
from phalanx.training.server import BoundRule
from phalanx.training.shards import sample_batch_of
from phalanx.training.streams import restored

if TYPE_CHECKING:
    from phalanx.training.algorithms.base import Run

def check_attack(attack: Attack | DataAttack) -> None:
    """Refuse a decentralized attack whose messages need every honest node's local step (a one-line
    :class:`ConfigError` naming ``attack``)."""
    if isinstance(attack, GossipAttack) and not attack.neighbourhood_only:
        raise ConfigError(
            "attack", attack.name, "a Phalanx attack or 'dissensus' with engine = 'torchrun' (a decentralized attack "
            f"that needs every honest node's local step, as {attack.name!r} does, runs on engine = 'simulated')",
        )


def byzantine_inputs(closed: list[Tensor], honest: int, node: int) -> list[int]:
    """What Byzantine node ``node`` is sent each round under a vector attack: the honest nodes of the closed
    neighbourhoods of its honest neighbours, ∪_{i ∈ N(node), i < h} (N(i) ∪ {i}) ∩ honest, increasing — its
    neighbours and their honest neighbours (the omniscient attacker's view, sent explicitly)."""
    hood = closed[node]
    targets = [int(i) for i in hood.tolist() if i < honest and i != node]
    seen: set[int] = set()
    for i in targets:
        seen.update(int(k) for k in closed[i].tolist() if k < honest)
    return sorted(seen)


class OneNode:
    """Node ``rank`` of ``exp`` alone (see the module's docstring); ``carry``: every node's carried rows ``(n, d)``
    (their momentum), or None before the first round."""

    def __init__(
        self, algo: NodeSettings, exp: Run, rank: int, streams: dict[str, Tensor], carry: Tensor | None,
    ) -> None:
        self.algo = algo
        self.exp = exp
        self.rank = rank
        self.n, self.b = exp.workers, exp.byzantine
        self.honest_n = self.n - self.b
        self.computing = computing_workers(exp.attack, self.n, self.b)
        self.vector_attack = self.b > 0 and not isinstance(exp.attack, DataAttack)
        self.sends_attack = self.vector_attack and rank >= self.honest_n
        check_attack(exp.attack)
        self.batch_gen = restored(streams["batches"])
        self.attack_gen = restored(streams["attack"])
        self.buffer = None if carry is None else carry.clone()
        self.closed = closed_neighbourhoods(algo.graph)
        self.node_rule = NodeRule(algo, exp)
        hoods = self.node_rule.hoods
        self.targets = torch.nonzero(hoods.byzantine_counts[: self.honest_n] > 0).flatten()

    @property
    def message_numel(self) -> int:
        """The length of a node's message (its local step x̃ᵢ)."""
        return self.exp.problem.dim

    def warm_up(self) -> None:
        """One throw-away gradient call on one sample (no random stream is touched): the first ``torch.func`` call
        of a process costs seconds of lazy set-up, which must not count against a round's timeout."""
        data, problem = self.exp.data, self.exp.problem
        problem.grads_each(problem.initial_theta()[None], data.x[:1][None], data.y[:1][None])

    def streams(self) -> dict[str, Tensor]:
        """The node-side streams' states now."""
        return {"batches": self.batch_gen.get_state(), "attack": self.attack_gen.get_state()}

    def _batch(self) -> tuple[Tensor, Tensor]:
        """This node's batch ``(x (1, B, ...), y (1, B))``; the shared streams advance as on every rank."""
        exp, b = self.exp, self.b
        if isinstance(exp.attack, DataAttack) and b:
            xb, yb = worker_batches(exp.data, exp.attack, workers=self.n, byzantine=b,
                                    batch_size=self.algo.batch_size, batch_gen=self.batch_gen,
                                    attack_gen=self.attack_gen)
            return xb[self.rank : self.rank + 1], yb[self.rank : self.rank + 1]
        return sample_batch_of(exp.data, self.computing, self.algo.batch_size, self.batch_gen,
                               min(self.rank, self.computing - 1))

    def gradient(self, theta: Tensor) -> tuple[Tensor, Tensor] | None:
        """This node's model xᵣ ``(1, d)`` and gradient gᵣ = ∇ℓ(xᵣ; batch) + λxᵣ ``(1, d)`` of the round (the shared
        streams advance as on every rank); None for a node that computes nothing (a vector attack's Byzantine one)."""
        xb, yb = self._batch()
        r = self.rank
        if r >= self.computing:
            return None
        x = (theta[r] if theta.dim() == 2 else theta)[None]
        g = self.exp.problem.grads_each(x.contiguous(), xb, yb)
        if self.algo.weight_decay:
            g.add_(x, alpha=self.algo.weight_decay)
        return x, g

    def step(self, theta: Tensor, t: int) -> Tensor | None:
        """Round t's local step x̃ᵣ ``(d,)`` of this node at θ (its row of the ``(n, d)`` models; θ₀ itself before
        the first round); a vector attack's Byzantine node returns None (it only draws, to stay in step)."""
        exp, algo, r = self.exp, self.algo, self.rank
        got = self.gradient(theta)
        if got is None:
            return None
        x, g = got
        if self.buffer is None:  # m₀ = g₀, in an (n, d) buffer like the simulated nodes'
            self.buffer = torch.zeros(self.n, exp.problem.dim, dtype=g.dtype, device=g.device)
            self.buffer[r] = g[0]
        else:
            self.buffer[r : r + 1].lerp_(g, 1.0 - algo.momentum)
        return torch.sub(x[0], self.buffer[r], alpha=algo.node_lr(t))

    def held(self, theta: Tensor) -> Tensor:
        """The row a node that takes no local step this round stands for (a vector attack's Byzantine node, or a
        node that sits a round out): its model, as the simulated engine keeps it."""
        return theta[self.rank] if theta.dim() == 2 else theta

    def skip(self, t: int) -> None:
        """A round this node sits out (it fell behind its neighbours): draw its batch, so that the shared streams
        stay in step; its model and momentum stay as they are."""
        self._batch()

    def carry(self, like: Tensor) -> Tensor:
        """Every node's carried rows ``(n, d)`` (zeros before a node's first step)."""
        if self.buffer is None:
            self.buffer = torch.zeros(self.n, self.exp.problem.dim, dtype=like.dtype, device=like.device)
        return self.buffer

    def inputs(self) -> list[int]:
        """The honest nodes whose local steps this node is sent: a vector attack's Byzantine node gets
        :func:`byzantine_inputs`, any other node its computing neighbours."""
        if self.sends_attack:
            return byzantine_inputs(self.closed, self.honest_n, self.rank)
        if self.rank >= self.computing:
            return []
        return [int(j) for j in self.closed[self.rank].tolist() if j != self.rank and j < self.computing]

    def attack_targets(self) -> list[int]:
        """The honest neighbours this Byzantine node sends an attack message to (none for an honest node)."""
        if not self.sends_attack:
            return []
        return [int(i) for i in self.closed[self.rank].tolist() if i < self.honest_n]

    def attack_messages(self, half: Tensor, known: Tensor, t: int) -> dict[int, Tensor]:
        """This Byzantine node's message of round t to each honest neighbour whose local step it holds.

        ``half`` ``(n, m)``: the local steps it was sent (row k = x̃ₖ; other rows 0), ``known`` ``(n,)`` which rows
        arrived. An input that did not arrive is taken as the target's own x̃ᵢ (what the target itself puts in
        place of a missing neighbour). A server attack is called for *every* target in index order, as the
        simulated engine calls it — on the rows this node holds for the targets that are not its own, whose
        messages it drops — so that the shared ``attack`` stream advances on every Byzantine rank as it does there
        (exact for attacks whose draws depend on the shapes only: every built-in one)."""
        attack = self.exp.attack
        assert isinstance(attack, Attack)
        h = self.honest_n
        mine = [i for i in self.attack_targets() if bool(known[i])]
        needed = byzantine_inputs(self.closed, h, self.rank)
        complete = bool(known[needed].all())
        out: dict[int, Tensor] = {}
        if isinstance(attack, GossipAttack):  # one view of the honest rows for every target, as simulated
            groups = [(None, mine)] if complete or not mine else [(i, [i]) for i in mine]
            before = self.attack_gen.get_state()  # one call's draws per round, however many views
            for fill, group in groups:
                self.attack_gen.set_state(before)
                rows = half if fill is None else self._filled(half, known, fill)
                search = torch.Generator().manual_seed(t)
                targets = self.targets
                view = GossipView(
                    honest=rows[:h], mixing=self.algo.mixing, targets=targets, f=self.exp.f,
                    combine=functools.partial(self.node_rule.combine_targets, rows, targets, generator=search),
                    generator=self.attack_gen, round=t,
                )
                msgs = attack.messages(view).to(half.dtype)
                index = {int(i): k for k, i in enumerate(targets.tolist())}
                out.update({i: msgs[index[i]] for i in group})
            return out
        for i in self.targets.tolist():  # every target's attack call, in the simulated engine's order (see above)
            rows = self._filled(half, known, i) if i in mine and not complete else half
            hood = self.closed[i]
            byz = hood[hood >= h]
            context = self.node_rule.attack_context(i, rows)
            v = byzantine_vectors(attack, rows[hood[hood < h]], byzantine=byz.numel(), f=self.exp.f,
                                  rule=BoundRule(self.exp.rule, context), attack_gen=self.attack_gen, round=t)
            if i in mine:
                out[i] = v[int(torch.nonzero(byz == self.rank)[0])]
        return out

    @staticmethod
    def _filled(half: Tensor, known: Tensor, i: int) -> Tensor:
        """``half`` with the rows that did not arrive replaced by x̃ᵢ."""
        rows = half.clone()
        rows[~known] = half[i]
        return rows


class AnytimeNode(OneNode):
    """Node ``rank`` of Decentralized Anytime SGD alone (:class:`~phalanx.training.algorithms.gossip.AnytimeGossip`):
    its carried rows are the iterates w ``(n, d)`` (θ₀'s rows before the first round), its message the pair
    [w̃ᵣ | x̃ᵣ] — row r of :class:`AnytimeNodes <phalanx.training.algorithms.gossip.AnytimeNodes>`' round, with the same
    operations."""

    def __init__(
        self, algo: AnytimeSettings, exp: Run, rank: int, streams: dict[str, Tensor], carry: Tensor | None,
    ) -> None:
        super().__init__(algo, exp, rank, streams, carry)
        self.anytime = algo

    @property
    def message_numel(self) -> int:
        """The length of a node's message: the pair (w̃ᵢ, x̃ᵢ)."""
        return 2 * self.exp.problem.dim

    def _iterates(self, theta: Tensor) -> Tensor:
        """Every node's iterates w ``(n, d)``; w₁ = x₁ = θ₀ (as the simulated nodes start them)."""
        if self.buffer is None:
            self.buffer = (theta if theta.dim() == 2 else theta.expand(self.n, -1)).clone()
        return self.buffer

    def step(self, theta: Tensor, t: int) -> Tensor | None:
        """Round t's pair [w̃ᵣ | x̃ᵣ] ``(2d,)``: the gradient at the query point xᵣ, w̃ᵣ = wᵣ − η αₜ gᵣ, x̃ᵣ = xᵣ +
        2/(t + 1)·(w̃ᵣ − xᵣ); a vector attack's Byzantine node returns None."""
        algo, r = self.anytime, self.rank
        got = self.gradient(theta)
        if got is None:
            return None
        x, g = got
        w = self._iterates(theta)
        w_half = torch.sub(w[r], g[0], alpha=algo.node_lr(t) * (t + 1))
        x_half = x[0].clone().lerp_(w_half, algo.average_weight(t))
        return torch.cat([w_half, x_half])

    def held(self, theta: Tensor) -> Tensor:
        """The pair a node that takes no step this round stands for: its iterate and its model."""
        return torch.cat([self._iterates(theta)[self.rank], super().held(theta)])

    def carry(self, like: Tensor) -> Tensor:
        """Every node's iterates ``(n, d)`` (θ₀'s rows before the first round)."""
        return self._iterates(like)
