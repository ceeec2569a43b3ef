"""Decentralized rounds on real processes: one rank per node of the graph, exchanging with its graph neighbours only
(``engine = "torchrun"``, ``algorithm = "gossip"``, ``topology = "gossip"``; docs/decentralized.md, "On real
processes").

Every rank runs the training loop (:class:`~phalanx.training.loop.Loop`) over :class:`Neighbours`, with the
simulated engine's server (:class:`~phalanx.training.algorithms.gossip.GossipServer`) and node r's side
(:class:`~phalanx.training.algorithms.gossip_node.OneNode`, from ``Gossip.one_worker``). Round t on rank r:

1. node r's local step x̃ᵣ, computed as row r of the simulated engine's batched round (same batch, same operations);
2. point to point, over gloo: x̃ᵣ goes to every computing graph neighbour and x̃ⱼ comes back from each; under a vector
   attack x̃ᵣ also goes to the Byzantine nodes that attack r's neighbours (below), and each Byzantine neighbour b
   sends r its own message of the round (phase 2; it may send every neighbour something else);
3. the loop's server combines, on an ``(n, m)`` matrix that holds x̃ᵣ and what r received (other rows 0: every
   node's combination reads only its own neighbourhood, so row r is the simulated engine's row r), with the
   run's rule — plain gossip with W, a robust gossip rule, or any rule at the node; its new model is row r of X.

What travels per round (m = the message length, d for D-SGD): x̃ᵣ once per computing neighbour; under a vector
attack, in addition, x̃ᵣ to every Byzantine node b with an honest neighbour i such that r ∈ N(i) ∪ {i} (its
neighbours and the neighbours of its honest neighbours:
:func:`~phalanx.training.algorithms.gossip_node.byzantine_inputs`) — the omniscient attacker's view of the simulated
engine, sent explicitly over a link of its own — and one message from b to each honest neighbour.

A silent or crashed neighbour: a rank waits at most ``round_timeout`` for the round's local steps (and as long
again for its Byzantine neighbours' messages); a message that did not arrive is taken as the node's own x̃ᵣ, so W's
row stays stochastic and a robust rule sees a value it trusts, and it is counted (the metric rows'
``missing_messages``, rank 0's ``distributed.json``). A neighbour that missed a round is a *suspect*, waited for
only a quarter of ``round_timeout`` until a message of it comes in time again; one silent for ``KEEP_ROUNDS`` rounds
in a row is dropped. A node whose peers waiting for it are two rounds or more ahead (it slept) sits rounds out —
draws its batches, keeps its model, sends nothing — until it is back in step. A crashed process closes its links
(gloo reports it at once): its neighbours go on without it.

Links: every pair of ranks that exchange holds a gloo process group of its own (two ranks, on a prefix of the job's
store), built in increasing order of the pair at the start, with a thread that receives every message of the peer
into the :class:`Inbox` and one that sends the queued ones: the main thread waits with its own deadlines and never
in gloo, and starts a round once the neighbours it waits for have taken its messages of the last one (at once, as
their receiving threads take every message as it comes). Measured here (torch 2.13, gloo): a receive that times
out raises "Application timeout caused pair closure" and closes *every* pair of its gloo context, so in one world
process group a single silent rank would cut every rank that waited for it off from all its other neighbours; and a
timed-out link is closed for good. Every message carries its round and phase (16 bytes), so a late one can never be
taken for another round's.

Monitoring (not gossip traffic): after every evaluation and checkpoint round each rank puts its rows of the run's
state (its model, its carried momentum, its last displacement, how many messages it missed, its ``attack`` stream)
into the job's c10d store and rank 0 reads them, so that rank 0's X is every node's model when it evaluates and
checkpoints; it waits at most ``GATHER_SHARE × round_timeout`` for them, and a rank that does not answer keeps its
last rows there. Rank 0 also writes the run directory; at the start it publishes the start state (fresh or
resumed), which every rank reads; a rank other than 0 stops when rank 0 stopped with an error (it looks at the
gathering rounds).

**Sealed** (``keys`` set): no gloo and no store. The links are the sealed mesh's (:mod:`phalanx.distributed.mesh`):
rank r opens a TLS connection to each rank it sends to — its receivers, its attack targets, and rank 0 — and is
connected to by each rank it hears from — its inputs, its Byzantine neighbours, and rank 0 (which sends the start
snapshot and, at the end, its stop message over it). Every message is signed for its round, phase, sender and
recipient (:func:`~phalanx.distributed.mesh.mesh_message`, domain ``phalanx/gossip/v1``); the monitoring rows
travel to rank 0 as a signed ``MONITOR`` frame instead of the store. A message that was rejected — no signature, one
that does not verify, from a rank that is not a neighbour sending that phase, of the wrong length, a second one of a
(round, phase) — is **exactly a missing message**: the node's own step takes its place, the sender is a suspect, and
it is counted in ``missing_messages`` (the receiver stops waiting for it at once). What each node took from whom,
with the signatures, and what it missed, travels with its monitoring rows (its *journal*) into rank 0's transcript
(:meth:`~phalanx.distributed.transcript.Transcript.reports`); every rank's rejections reach rank 0 as reports. Bit
for bit the run without keys when no message is lost.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from phalanx.distributed import _test_hooks, wire
from phalanx.distributed.channel import Kind
from phalanx.distributed.env import RankEnv
from phalanx.distributed.gossip_links import ATTACK, KEEP_ROUNDS, STEP, Inbox, Link, MeshInbox, MeshLink
from phalanx.distributed.journal import sign_journal
from phalanx.distributed.mesh import Mesh
from phalanx.distributed.parameter_server import JOIN_TIMEOUT_S, check_digest, collect
from phalanx.distributed.serverless import _start_message, received_start, shared_start
from phalanx.errors import ConfigError
from phalanx.training.algorithms.gossip_node import OneNode, byzantine_inputs
from phalanx.training.loop import Callback, Loop, RoundInfo
from phalanx.training.server import BoundRule
from phalanx.training.state import Received, Snapshot
from phalanx.training.transport import Transport

if TYPE_CHECKING:
    from phalanx.training.experiment import Experiment

SUSPECT_SHARE = 0.25
"""A neighbour that missed the last round is waited for at most this share of ``round_timeout`` (it is back once a
message of it comes in time): a silent neighbour costs one ``round_timeout``, then a quarter of it a round, and a
neighbour that was only delayed (its own neighbour was silent) catches up instead of being left behind."""
GATHER_SHARE = 0.5
"""Rank 0 waits at most this share of ``round_timeout`` for the other ranks' rows after an evaluation or checkpoint
round. Meanwhile its neighbours wait for its next message, and the delay travels on through the graph, one hop a
round: with a dead rank, rank 0 waits the whole share (measured: with the whole ``round_timeout`` its neighbours,
whose own wait for it started at the same time, missed its next message), so the share leaves the other half of
``round_timeout`` for rank 0's evaluation, checkpoint and next local step."""
STATE = ("theta", "momentum", "previous")
"""The ``(n, ·)`` rows of the loop's state that rank 0 gathers."""
_RETIRED: list[Any] = []
"""Links of finished transports: a link's receiving thread may still wait in gloo until the process exits (a
process group is not destroyed under a waiting thread)."""


def key_rows(t: int, rank: int) -> str:
    """A rank's rows after round t, for rank 0 (evaluation and checkpoint rounds)."""
    return f"g/{t}/{rank}"


class Neighbours(Transport, Callback):
    """One rank of the gossip topology (see the module's docstring); over the sealed mesh when ``mesh`` is given
    (then ``store`` is unused). It is also a loop callback, first in the list: after evaluation and checkpoint rounds
    it brings every node's rows to rank 0."""

    def __init__(self, store: dist.Store | None, renv: RankEnv, digest: str, round_timeout: float,
                 checkpoint_every: int, mesh: Mesh | None = None) -> None:
        self.mesh = mesh
        self.on_reports: Callable[[int, list[dict[str, Any]]], None] | None = None
        """Sealed, rank 0: called at every gathering round with what each node reported (its journal): the
        transcript listens here."""
        self.journal: list[dict[str, Any]] = []  # sealed: what this node took and missed, since its last report
        self.peers: list[int] = []  # the ranks this node exchanges gossip messages with (from the graph, at open)
        self.store = store
        self.renv = renv
        self.rank = renv.rank
        self.digest = digest
        self.timeout = round_timeout
        self.round_timeout = round_timeout
        self.checkpoint_every = checkpoint_every
        self.inbox = Inbox()
        self.links: dict[int, Link | MeshLink] = {}
        self.lost: set[int] = set()
        self.suspects: set[int] = set()  # missed the last round: waited for SUSPECT_SHARE × round_timeout only
        self.misses: dict[int, int] = {}  # rounds in a row a peer's message did not come
        self.missed = 0  # messages this rank did not get since its last report to rank 0
        self.pending_missing = 0  # rank 0: every rank's missed messages since the last metric row
        self.silent: set[int] = set()  # rank 0: ranks whose rows did not come at the last gathering (a node whose
        # rows came and were refused answered: it is waited for at the next one, so a refusal's round is an event)

    # ------------------------------------------------------------------------------------------------ start

    def open(self, experiment: Experiment, start: Snapshot) -> Snapshot:
        exp, store, rank = experiment, self.store, self.rank
        self.exp = exp
        self.n = n = exp.workers
        if self.mesh is None:
            assert store is not None
            start = shared_start(store, rank, self.digest, start)
        else:
            start = self._sealed_start(start)
        node = exp.algorithm.one_worker(exp, rank, start.streams, start.state.momentum)
        if not isinstance(node, OneNode):
            raise ConfigError("topology", "gossip", f"'server' or 'serverless' with algorithm = "
                              f"{exp.algorithm.name!r} (topology = 'gossip' runs a decentralized algorithm's nodes)")
        self.node = node
        node.warm_up()
        self._plan()
        self.peers = sorted(set(self.inputs) | set(self.receivers) | set(self.attackers) | set(self.targets))
        if self.mesh is not None:
            self._sealed_links(self.mesh, start.state.theta.dtype)
        else:
            assert store is not None
            wire.put(store, f"ready/{rank}", b"1")
            joined = collect(store, {p: f"ready/{p}" for p in self.peers}, set(), JOIN_TIMEOUT_S)
            for p in self.peers:  # in increasing order of the pair (every rank alike: no two ranks wait on each other)
                if p not in joined:
                    self._lose(p, f"it did not start within {JOIN_TIMEOUT_S:g} s")
                    continue
                try:
                    self.links[p] = Link(store, rank, p, node.message_numel, start.state.theta.dtype, self.inbox,
                                         max(self.timeout, JOIN_TIMEOUT_S))
                except (RuntimeError, dist.DistError) as exc:
                    self._lose(p, f"the link did not connect ({str(exc).splitlines()[0][:160]})")
        self.vector_attack = node.vector_attack
        self.attack_state: Tensor = start.streams["attack"]
        s = start.state
        theta = s.theta if s.theta.dim() == 2 else s.theta.expand(n, -1)
        self.known: dict[str, Tensor | None] = {
            "theta": theta.clone(), "momentum": None if s.momentum is None else s.momentum.clone(),
            "previous": None if s.previous is None else s.previous.clone(),
        }
        return start

    def _sealed_start(self, start: Snapshot) -> Snapshot:
        """The start snapshot over the sealed mesh: rank 0 waits for the ranks to join (at most
        ``JOIN_TIMEOUT_S``) and sends it to each; the others receive it."""
        mesh = self.mesh
        assert mesh is not None
        self.sink = MeshInbox(self)
        mesh.sink = self.sink
        if self.rank == 0:
            mesh.wait_joins(set(range(1, self.n)), JOIN_TIMEOUT_S)
            mesh.offer(_start_message(start, self.digest))
            return start
        init = mesh.receive_init(2 * JOIN_TIMEOUT_S)
        check_digest(init, self.digest, self.rank)
        return received_start(init)

    def _sealed_links(self, mesh: Mesh, dtype: torch.dtype) -> None:
        """Connect to the ranks this node sends to, wait for the ranks it hears from (rank 0 included, both ways)."""
        self.dtype = dtype
        self.width = self.node.message_numel * torch.empty(0, dtype=dtype).element_size()
        sends = set(self.receivers) | set(self.targets)
        hears = set(self.inputs) | set(self.attackers)
        control = set(mesh.book) - {self.rank} if self.rank == 0 else {0}
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        failed = mesh.connect((sends | control) & set(mesh.book), deadline)
        heard = mesh.wait_incoming((hears | control) & set(mesh.book), deadline)
        mesh.ready.set()
        for p in self.peers:
            if p not in mesh.book:
                self._lose(p, f"it did not start within {JOIN_TIMEOUT_S:g} s")
            elif p in failed:
                self._lose(p, f"the link did not connect ({failed[p][:160]})")
            elif p in hears and p not in heard:
                self._lose(p, f"its link did not connect within {JOIN_TIMEOUT_S:g} s")
            else:
                self.links[p] = MeshLink(mesh, p, dtype)
        for p, why in dict(mesh.dead).items():
            if p in self.links:
                self.inbox.close(p, why)

    def _plan(self) -> None:
        """Who this rank hears from and talks to, from the graph (the same on every rank)."""
        node, r, n = self.node, self.rank, self.n
        h, closed = node.honest_n, node.closed
        self.inputs = [k for k in node.inputs() if k != r]

        def inputs_of(k: int) -> list[int]:
            if node.vector_attack and k >= h:
                return byzantine_inputs(closed, h, k)
            if k >= node.computing:
                return []
            return [int(j) for j in closed[k].tolist() if j != k and j < node.computing]

        self.receivers = [k for k in range(n) if k != r and r < node.computing and r in inputs_of(k)]
        self.targets = node.attack_targets()
        hood = closed[r].tolist()
        self.attackers = [int(b) for b in hood if b >= h] if node.vector_attack and r < h else []
        self.neighbours = {int(j) for j in hood if j != r}

    # ------------------------------------------------------------------------------------------------ rounds

    def streams(self) -> dict[str, Tensor]:
        attack = self.attack_state if self.vector_attack else self.node.attack_gen.get_state()
        return {"batches": self.node.batch_gen.get_state(), "attack": attack}

    def exchange(self, theta: Tensor, t: int, rule: BoundRule) -> Received:
        node, r, n = self.node, self.rank, self.n
        closed = self.inbox.closed_links()
        for k, why in closed.items():
            if why != "finished":
                self._lose(k, why)
        # last round's messages reached the live neighbours before this round starts (it costs nothing when they
        # took them already, as their receiving threads do at once; a suspect is not waited for)
        deadline = time.monotonic() + self.timeout
        for k, link in self.links.items():
            if k not in self.lost and k not in self.suspects and k not in closed:
                link.flush(deadline)
        if r == 0:
            _test_hooks.maybe_hold(t)
        _test_hooks.maybe_sleep(r, t)
        if self.mesh is not None:
            self.mesh.round = t
        self.heard: list[dict[str, Any]] = []
        self.inbox.advance(t)
        # the peers that wait for this node's messages gave it up two rounds ago or more: it sits this round out
        # (when more than f of them say so: Inbox.behind)
        waiting = [k for k in self.receivers + self.targets if k not in self.lost]
        behind = self.inbox.behind(waiting, t, self.exp.f)
        if behind:
            node.skip(t)
            mine = None
        else:
            mine = node.step(theta, t)
        m = node.message_numel
        own = (mine if mine is not None else node.held(theta)).to("cpu", theta.dtype)
        half = torch.zeros(n, m, dtype=theta.dtype)
        known = torch.zeros(n, dtype=torch.bool)
        half[r], known[r] = own, True
        item = half.element_size()
        sent = received = 0
        if mine is not None:
            sent += self._send(self.receivers, t, STEP, own) * m * item
        missing: list[int] = []
        deadline = time.monotonic() + self.timeout
        for k, x in self._receive(self.inputs, t, STEP, deadline, behind).items():
            if x is None:
                missing.append(k)
            else:
                half[k], known[k] = x, True
                received += m * item
        if node.sends_attack and not behind:
            for i, v in node.attack_messages(half, known, t).items():
                sent += self._send([i], t, ATTACK, v) * m * item
        messages: dict[int, Tensor] | None = None
        if self.attackers:  # an honest node with Byzantine neighbours: their messages, in index order
            deadline = time.monotonic() + self.timeout
            rows = []
            for b, x in self._receive(self.attackers, t, ATTACK, deadline, behind).items():
                rows.append(half[r] if x is None else x)
                if x is None:
                    missing.append(b)
                else:
                    received += m * item
            messages = {r: torch.stack(rows)}
        if not node.sends_attack:  # a message that did not come: the node's own local step in its place
            for k in missing:
                half[k] = half[r]
        self.missed += len(missing)
        if self.mesh is not None:
            self.journal.append({"round": t, "accepted": self.heard, "missing": sorted(set(missing))})
        return Received(half.to(theta.device), missing=sorted(set(missing) & self.neighbours), sent=sent,
                        received=received, state_rows=False, carry=node.carry(theta), messages=messages)

    def _send(self, peers: list[int], t: int, phase: int, x: Tensor) -> int:
        """Queue ``x`` to each of ``peers`` over its link; how many were queued."""
        count = 0
        for k in peers:
            link = self.links.get(k)
            if k in self.lost or link is None or k in self.inbox.closed_links():  # (closed: it finished the run)
                continue
            if link.backlog() >= KEEP_ROUNDS:
                self._lose(k, f"it has not taken a message for {KEEP_ROUNDS} rounds")
                continue
            link.send(t, phase, x)
            count += 1
        return count

    def _receive(self, peers: list[int], t: int, phase: int, deadline: float,
                 behind: bool) -> dict[int, Tensor | None]:
        """Round t's messages of a phase from ``peers`` (None: did not come). A peer is waited for until
        ``deadline``, a suspect (it missed the last round) only ``SUSPECT_SHARE × round_timeout``; a node that fell
        behind waits for nobody. A peer whose message did not come for ``KEEP_ROUNDS`` rounds in a row is
        dropped."""
        wanted = [(k, t, phase) for k in peers if k not in self.lost]
        if not behind:
            self.inbox.wait([key for key in wanted if key[0] not in self.suspects], deadline)
            patience = deadline - self.timeout + SUSPECT_SHARE * self.timeout
            self.inbox.wait([key for key in wanted if key[0] in self.suspects], min(deadline, patience))
        out: dict[int, Tensor | None] = {}
        for k in peers:
            x, meta = (None, None) if k in self.lost else self.inbox.take((k, t, phase))
            if meta is not None and x is not None:
                self.heard.append(meta)
            if x is not None:
                self.suspects.discard(k)
                self.misses[k] = 0
            elif k not in self.lost:
                self.suspects.add(k)
                self.misses[k] = self.misses.get(k, 0) + 1
                if self.misses[k] >= KEEP_ROUNDS:
                    self._lose(k, f"no message from it for {KEEP_ROUNDS} rounds")
            out[k] = x
        return out

    def _lose(self, k: int, why: str) -> None:
        if k in self.lost:
            return
        self.lost.add(k)
        print(f"[phalanx rank {self.rank}] lost the link to rank {k} ({why}); this node's own local step stands in "
              "for its messages from now on", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------ rows for rank 0 (callback)

    def gathers(self, t: int) -> bool:
        """Whether rank 0 needs every node's rows after round t: an evaluation or a checkpoint round."""
        done = t + 1
        return self.exp.evaluates(t) or done % self.checkpoint_every == 0 or done == self.exp.rounds

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        state = loop.state
        rows = {"theta": state.theta, "momentum": state.momentum, "previous": state.previous}
        if self.rank != 0:
            if self.gathers(info.round):
                self._report(info.round, rows)
            return
        got = self._collect(info.round) if self.gathers(info.round) else {}
        for name in STATE:  # rank 0's X: its own rows live, every other node's as it last reported them
            x = rows[name]
            if x is None or x.dim() != 2:
                continue
            known = self.known[name]
            if known is None or known.shape != x.shape:
                known = self.known[name] = torch.zeros_like(x)
            known[0] = x[0]
            for p, msg in got.items():
                if name in msg and msg[name].shape == known.shape[1:]:
                    known[p] = msg[name].to(known)
            x[1:] = known[1:]
        self.pending_missing += self.missed + sum(int(msg["missing"]) for msg in got.values())
        self.missed = 0

    def _report(self, t: int, rows: dict[str, Tensor | None]) -> None:
        """A rank other than 0: its rows after round t, to rank 0 through the store; stop if rank 0 stopped."""
        r = self.rank
        payload: dict[str, Any] = {name: x[r].clone() for name, x in rows.items() if x is not None and x.dim() == 2}
        payload.update({"missing": self.missed, "attack": self.node.attack_gen.get_state()})
        if self.mesh is not None:
            self._report_sealed(self.mesh, t, payload)
            return
        assert self.store is not None
        wire.put(self.store, key_rows(t, r), wire.pack(payload))
        self.missed = 0
        if self.store.check(["stop"]):  # (the sealed path returned above)
            reason = bytes(self.store.get("stop")).decode(errors="replace")
            if reason != "finished":
                raise ConnectionError(f"rank 0 stopped the run: {reason[:300]}")

    def _report_sealed(self, mesh: Mesh, t: int, payload: dict[str, Any]) -> None:
        """A rank other than 0, sealed: its rows and its journal after round t, signed, to rank 0; stop if rank 0
        stopped (or went away)."""
        nonce = mesh.nonce
        assert nonce is not None
        payload["journal"], payload["journal_signature"] = _test_hooks.journal(  # (signed by this node)
            self.rank, self.journal, lambda items: sign_journal(mesh.identity, nonce, self.digest, t, items))
        self.journal = []
        if mesh.alive(0):
            mesh.send([0], Kind.MONITOR, 0, t, wire.pack(_test_hooks.monitoring_rows(self.rank, payload)))
        self.missed = 0
        reason = mesh.stopped
        if reason is not None and reason != "finished":
            raise ConnectionError(f"rank 0 stopped the run: {reason[:300]}")
        why = mesh.dead.get(0)
        if reason is None and why is not None and why != "finished":
            raise ConnectionError(f"rank 0 went away ({why})")

    def _collect(self, t: int) -> dict[int, dict[str, Any]]:
        """Rank 0: the other ranks' rows after round t, waiting at most ``GATHER_SHARE × round_timeout`` (a rank
        silent at the last gathering is not waited for, only taken if its rows are there; one whose rows came and were
        refused is waited for)."""
        keys = {p: key_rows(t, p) for p in range(1, self.n)}
        gone = self.silent | self.lost | set(self.inbox.closed_links())  # not waited for: only taken if there
        if self.mesh is not None:
            got = self._collect_sealed(self.mesh, t, list(keys), gone)
        else:
            assert self.store is not None
            raw = collect(self.store, keys, gone, GATHER_SHARE * self.timeout)
            self.silent = set(keys) - set(raw)
            got = {p: wire.unpack(data) for p, data in raw.items()}
            for p in raw:
                self.store.delete_key(keys[p])
        last = self.n - 1
        if self.vector_attack and last in got:  # the Byzantine ranks' attack stream, for the checkpoint
            self.attack_state = got[last]["attack"]
        return got

    def _collect_sealed(self, mesh: Mesh, t: int, ranks: list[int], gone: set[int]) -> dict[int, dict[str, Any]]:
        """Rank 0, sealed: the monitoring rows of round t (signed, checked by the mesh); a message that does not
        unpack to rows of the right shapes is rejected (its rank keeps its last rows); every node's journal to the
        transcript."""
        gone = gone | {p for p in ranks if not mesh.alive(p)}
        raw = self.sink.collect(t, ranks, gone, GATHER_SHARE * self.timeout)
        self.silent = set(ranks) - set(raw)
        got: dict[int, dict[str, Any]] = {}
        nodes = [{"node": 0, "rounds": self.journal}]
        self.journal = []
        for p, data in raw.items():
            try:
                msg = wire.unpack(bytes(data))
                journal = {"journal": msg.pop("journal", None), "signature": msg.pop("journal_signature", None)}
                missing = msg["missing"]  # messages the node missed since the last gathering: two per link a round
                assert type(missing) is int and 0 <= missing <= 2 * self.n * (t + 1)
                assert isinstance(msg["attack"], Tensor) and msg["attack"].dtype == torch.uint8
                assert wire.generator_state(msg["attack"]) is not None  # kept unchecked, it broke every resume
                for name in (name for name in STATE if name in msg):  # a row as an honest node sends it, copied
                    known, x = self.known[name], msg[name]  # (dense, on the CPU: a meta, sparse or None row raised
                    assert isinstance(x, Tensor) and x.dtype == self.dtype and x.dim() == 1  # later, outside this)
                    assert known is None or x.shape == known.shape[1:]
                    msg[name] = torch.empty(x.shape, dtype=self.dtype).copy_(x)
            except Exception as exc:  # whatever a broken or hostile message makes torch.load or the checks raise
                mesh.reject(p, f"rank {p}'s monitoring rows of round {t} are malformed ({type(exc).__name__})")
                continue
            got[p] = msg
            nodes.append({"node": p, **journal})  # checked (size, schema, its signature) by the transcript
        if self.on_reports is not None:
            self.on_reports(t, nodes)
        return got

    def take_missing(self) -> int:
        """Rank 0: the messages every rank missed since the last call (the next metric row's count)."""
        count, self.pending_missing = self.pending_missing, 0
        return count

    def close(self, error: BaseException | None) -> None:
        """Send what is queued and a last message on every link (a neighbour that is behind still gets this node's
        messages); rank 0 tells the other ranks whether the run finished."""
        if self.mesh is not None:
            if self.rank == 0:
                self.mesh.stop("finished" if error is None else str(error))
            self.mesh.close(wait_for=set(self.links) - self.lost, timeout=self.timeout)
            self.links = {}
            return
        for k, link in self.links.items():
            if not isinstance(link, Link):
                continue
            if k in self.lost:  # no last message to a rank given up (it may be dead): end the sending thread only,
                link.outbox.put(None)  # or the join below waits round_timeout for a thread blocked on its queue
            else:
                link.finish()
        # both ends of a link end their threads on each other's last message: no gloo call may return into a
        # Python that is shutting down (a thread that does aborts the process: "terminate called ...")
        deadline = time.monotonic() + self.timeout
        for link in self.links.values():
            assert isinstance(link, Link)
            for thread in (link.sender, link.receiver):
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        _RETIRED.append(self.links)
        self.links = {}
        if self.rank == 0:
            assert self.store is not None
            try:
                wire.put(self.store, "stop", b"finished" if error is None else str(error).encode())
            except (dist.DistError, ConnectionError, RuntimeError):  # the store is gone: nobody is listening
                pass


class MessageCount(Callback):
    """``missing_messages`` in rank 0's metric rows (after the evaluation callback): the messages the nodes did not
    receive within ``round_timeout`` since the previous row, summed over the nodes."""

    def __init__(self, transport: Neighbours) -> None:
        self.transport = transport

    def on_start(self, loop: Loop) -> None:
        if loop.rows and loop.rows[-1]["round"] == 0:
            loop.rows[-1].setdefault("missing_messages", 0)

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        if info.row is not None:
            info.row["missing_messages"] = self.transport.take_missing()
