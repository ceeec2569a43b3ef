"""The links of a gossip rank (:mod:`phalanx.distributed.neighbours`): what its receiving threads put in the
:class:`Inbox` the main thread waits on, and the two kinds of link — a gloo process group per pair of ranks
(:class:`Link`, without keys) or the sealed mesh's connections (:class:`MeshLink`, with keys; what they receive goes
through :class:`MeshInbox`, the mesh's :class:`~phalanx.distributed.mesh.Sink`).

Every message carries its round and phase, so a late one can never be taken for another round's; one far ahead is
not kept, and no single neighbour's claim of a round far ahead makes a node sit rounds out (:meth:`Inbox.ahead`).
"""

from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from phalanx import waits
from phalanx.distributed import wire
from phalanx.distributed.channel import Kind
from phalanx.distributed.mesh import Mesh

STEP, ATTACK, BYE = 0, 1, 2
"""A message's phase: a local step, a Byzantine node's message, or the sender's last message (the run is over)."""
HEADER = 16
"""Bytes in front of every message: its round and its phase (two int64)."""
FOREVER = timedelta(days=365)
"""How long a link's thread waits for gloo (the main thread keeps the round's deadlines itself)."""
KEEP_ROUNDS = wire.KEEP_ROUNDS
"""A link whose peer has not taken this many messages is closed; a node keeps at most this many rounds of one
peer's messages ahead of its own round."""


class Inbox:
    """What the links' receiving threads got — message rows by (peer, round, phase) — and the links that closed;
    the main thread waits on it with the round's deadline."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: dict[tuple[int, int, int], Tensor] = {}
        self.meta: dict[tuple[int, int, int], Any] = {}
        self.seen: set[tuple[int, int, int]] = set()
        self.refused: set[tuple[int, int, int]] = set()
        self.newest: dict[int, int] = {}
        self.closed: dict[int, str] = {}
        self.floor = 0

    def put(self, peer: int, t: int, phase: int, x: Tensor, meta: Any = None) -> bool:
        """Keep a message (``meta``: what the sealed links know of it); False if one of (peer, round, phase) came
        before (the first one counts)."""
        key = (peer, t, phase)
        with self.cond:
            if key in self.seen:
                return False
            # a message far ahead is not kept (this node will not wait for it), and counts as that far only
            self.newest[peer] = max(self.newest.get(peer, -1), min(t, self.floor + KEEP_ROUNDS))
            if self.floor <= t <= self.floor + KEEP_ROUNDS:
                self.seen.add(key)
                self.items[key] = x
                if meta is not None:
                    self.meta[key] = meta
                held = sorted({u for (p, u, _) in self.items if p == peer})
                for old in held[: max(0, len(held) - KEEP_ROUNDS)]:  # this node's main thread is far behind
                    for ph in (STEP, ATTACK):
                        self.items.pop((peer, old, ph), None)
                        self.meta.pop((peer, old, ph), None)
            self.cond.notify_all()
        return True

    def refuse(self, peer: int, t: int, phase: int) -> None:
        """The sealed links rejected the peer's message of (round, phase): it is missing, and not waited for."""
        key = (peer, t, phase)
        with self.cond:
            if t >= self.floor and key not in self.seen:
                self.seen.add(key)
                self.refused.add(key)
            self.cond.notify_all()

    def close(self, peer: int, why: str) -> None:
        with self.cond:
            self.closed.setdefault(peer, why)
            self.cond.notify_all()

    def wait(self, keys: list[tuple[int, int, int]], deadline: float) -> None:
        """Until every key has arrived (or its link closed), at most until ``deadline`` (monotonic)."""
        with self.cond:
            waits.wait_for(self.cond,
                           lambda: all(k in self.items or k in self.refused or k[0] in self.closed for k in keys),
                           max(0.0, deadline - time.monotonic()))

    def take(self, key: tuple[int, int, int]) -> tuple[Tensor | None, Any]:
        """The message of ``key`` (None: not here) and its ``meta``."""
        with self.cond:
            self.refused.discard(key)
            return self.items.pop(key, None), self.meta.pop(key, None)

    def advance(self, t: int) -> None:
        """The main thread is in round t: messages of earlier rounds are dropped, and never kept again."""
        with self.cond:
            self.floor = t
            for key in [k for k in self.items if k[1] < t]:
                del self.items[key]
            self.meta = {k: v for k, v in self.meta.items() if k[1] >= t}
            self.seen = {k for k in self.seen if k[1] >= t}
            self.refused = {k for k in self.refused if k[1] >= t}

    def closed_links(self) -> dict[int, str]:
        """The peers whose link closed, and why (``"finished"``: the peer ended the run)."""
        with self.cond:
            return dict(self.closed)

    def ahead(self, peers: list[int]) -> int:
        """The round every one of ``peers`` has sent a message of, at least (−1: one of them has sent nothing, or
        ``peers`` is empty): one peer claiming a round far ahead — a Byzantine neighbour signs what it likes —
        cannot make this node sit rounds out; all of them must be ahead, a silent one included (before an honest
        peer's first message, a Byzantine one alone used to be all of them). :meth:`behind` also needs more than f
        of them, so that one honest peer is among them."""
        with self.cond:
            if not peers:
                return -1
            return min(self.newest.get(k, -1) for k in peers)

    def behind(self, waiting: list[int], t: int, f: int) -> bool:
        """Whether a node in round t sits it out: the peers ``waiting`` for its messages (those not lost) have all
        sent messages of round t + 2 or later, and there are more than ``f`` of them — up to f of a node's
        neighbours may be Byzantine and claim any round, so f of them alone (a node whose honest receivers were
        lost) never keep it out."""
        return len(waiting) > f and self.ahead(waiting) >= t + 2


class Link:
    """The gloo process group of two ranks, this one and ``peer`` (see the module's docstring), with a thread that
    receives every message of the peer into the inbox and a thread that sends the queued ones, so that the main
    thread never waits in gloo: a gloo wait that times out would close the link."""

    def __init__(self, store: dist.Store, rank: int, peer: int, numel: int, dtype: torch.dtype, inbox: Inbox,
                 connect_s: float) -> None:
        a, b = sorted((rank, peer))
        self.peer = peer
        self.other = 1 if rank == a else 0
        self.width = HEADER + numel * torch.empty(0, dtype=dtype).element_size()
        self.dtype = dtype
        self.inbox = inbox
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore(f"link/{a}-{b}/", store), 1 - self.other, 2,
                                        timedelta(seconds=connect_s))
        self.outbox: queue.SimpleQueue[Tensor | None] = queue.SimpleQueue()
        self.sending = threading.Condition()
        self.pending = 0  # messages queued and not yet taken by the peer
        self.dead = False  # the sending thread ended on an error: nothing queued will be taken
        self.sender = threading.Thread(target=self._send, name=f"phalanx-send-{peer}", daemon=True)
        self.receiver = threading.Thread(target=self._receive, name=f"phalanx-recv-{peer}", daemon=True)
        self.sender.start()
        self.receiver.start()

    def send(self, t: int, phase: int, x: Tensor) -> None:
        """Queue a message (``x`` a row of ``numel`` elements, any device)."""
        header = torch.tensor([t, phase], dtype=torch.int64).view(torch.uint8)
        with self.sending:
            self.pending += 1
        self.outbox.put(torch.cat([header, x.detach().to("cpu", self.dtype).contiguous().view(torch.uint8)]))

    def backlog(self) -> int:
        """Messages queued that the peer has not taken yet."""
        with self.sending:
            return self.pending

    def flush(self, deadline: float) -> None:
        """Wait until the peer has taken every queued message, at most until ``deadline`` (monotonic)."""
        with self.sending:
            waits.wait_for(self.sending, lambda: self.pending == 0 or self.dead,
                           max(0.0, deadline - time.monotonic()))

    def finish(self) -> None:
        """Queue the last message (after what is queued): the peer's receiving thread ends on it."""
        self.send(-1, BYE, torch.zeros((self.width - HEADER) // torch.empty(0, dtype=self.dtype).element_size(),
                                       dtype=self.dtype))
        self.outbox.put(None)

    def _send(self) -> None:
        while (msg := self.outbox.get()) is not None:
            try:
                self.pg.send([msg], self.other, 0).wait(FOREVER)  # type: ignore[attr-defined]  # (not in the stubs)
            except (RuntimeError, dist.DistError) as exc:
                self.inbox.close(self.peer, str(exc).splitlines()[0][:160])
                with self.sending:  # a flush waiting on this link ends now, not at its deadline (a review)
                    self.dead = True
                    self.sending.notify_all()
                return
            with self.sending:
                self.pending -= 1
                self.sending.notify_all()

    def _receive(self) -> None:
        while True:
            buf = torch.empty(self.width, dtype=torch.uint8)
            try:
                self.pg.recv([buf], self.other, 0).wait(FOREVER)  # type: ignore[attr-defined]  # (not in the stubs)
            except (RuntimeError, dist.DistError) as exc:
                self.inbox.close(self.peer, str(exc).splitlines()[0][:160])
                return
            t, phase = (int(v) for v in buf[:HEADER].view(torch.int64))
            if phase == BYE:
                self.inbox.close(self.peer, "finished")
                return
            self.inbox.put(self.peer, t, phase, buf[HEADER:].view(self.dtype))


class MeshLink:
    """A gossip link over the sealed mesh: this rank's connection to ``peer`` (if it sends to it) and the peer's to
    this rank (if it hears from it) are the mesh's; sending signs each message for this peer
    (:meth:`Mesh.send <phalanx.distributed.mesh.Mesh.send>`)."""

    def __init__(self, mesh: Mesh, peer: int, dtype: torch.dtype) -> None:
        self.mesh = mesh
        self.peer = peer
        self.dtype = dtype

    def send(self, t: int, phase: int, x: Tensor) -> None:
        """Sign and queue a message (``x`` a row of ``numel`` elements, any device)."""
        self.mesh.send([self.peer], Kind.ROW, phase, t, wire.tensor_bytes(x.detach().to("cpu", self.dtype)))

    def backlog(self) -> int:
        """Messages queued and not written to the peer's connection yet."""
        return self.mesh.backlog(self.peer)

    def flush(self, deadline: float) -> None:
        """Wait until every queued message is written, at most until ``deadline`` (monotonic)."""
        self.mesh.flush(self.peer, deadline)


class Node(Protocol):
    """What :class:`MeshInbox` reads of its gossip rank (a :class:`~phalanx.distributed.neighbours.Neighbours`)."""

    rank: int
    inputs: list[int]
    """The ranks whose local steps it takes."""
    attackers: list[int]
    """The Byzantine ranks whose messages it takes."""
    peers: list[int]
    width: int
    """Bytes of one message."""
    dtype: torch.dtype
    inbox: Inbox
    mesh: Mesh | None
    exp: Any
    """The experiment (its ``rounds``)."""

    def gathers(self, t: int) -> bool:
        """Whether rank 0 gathers every node's rows after round t."""


class MeshInbox:
    """The sealed gossip rank's :class:`~phalanx.distributed.mesh.Sink`: verified messages of its inputs (local
    steps) and Byzantine neighbours (their messages) into the :class:`Inbox`, rejected ones as refused there, the
    monitoring rows (rank 0) kept for :meth:`collect`."""

    def __init__(self, nb: Node) -> None:
        self.nb = nb
        self.cond = threading.Condition()
        self.monitor: dict[tuple[int, int], bytearray] = {}

    def signed(self, sender: int, kind: Kind, phase: int, t: int, body: bytearray, digest: bytes,
               signature: bytes) -> str | None:
        nb = self.nb
        if kind == Kind.MONITOR:  # kept only for the gathering rounds from rank 0's on: what a node makes rank 0
            now = nb.mesh.round if nb.mesh is not None else t  # hold is a few messages, each an honest one's size
            if abs(t - now) > KEEP_ROUNDS:
                return f"rank {sender} sent monitoring rows of round {t}, far from round {now}"
            if not nb.gathers(t):
                return f"rank {sender} sent monitoring rows of round {t}, which rank 0 does not gather"
            if t < now:  # rank 0 gathered that round already: too late to use (a slow node's, not a violation)
                return None
            with self.cond:
                if (t, sender) in self.monitor:
                    return f"rank {sender} sent its monitoring rows of round {t} twice"
                self.monitor[(t, sender)] = body
                self.cond.notify_all()
            return None
        if kind != Kind.ROW or phase not in (STEP, ATTACK):
            return f"rank {sender} sent a {kind.name} frame of phase {phase}, which the gossip topology never sends"
        if t >= nb.exp.rounds:
            nb.inbox.refuse(sender, t, phase)
            return f"rank {sender} sent a message of round {t}, beyond the run's last ({nb.exp.rounds - 1})"
        what = "local step" if phase == STEP else "Byzantine node's message"
        if sender not in (nb.inputs if phase == STEP else nb.attackers):
            nb.inbox.refuse(sender, t, phase)
            return f"rank {sender} sent node {nb.rank} a round-{t} {what}, which it does not take from it"
        if len(body) != nb.width:
            nb.inbox.refuse(sender, t, phase)
            return f"rank {sender}'s round-{t} {what} has {len(body)} bytes, not {nb.width}"
        meta = {"rank": sender, "phase": phase, "sha256": digest.hex(), "signature": signature.hex()}
        if not nb.inbox.put(sender, t, phase, wire.bytes_tensor(body, nb.dtype), meta):
            return f"rank {sender} sent a second round-{t} {what}"
        return None

    def refused(self, sender: int, kind: Kind, phase: int, t: int, reason: str) -> None:
        if kind == Kind.ROW:
            self.nb.inbox.refuse(sender, t, phase)

    def gone(self, sender: int, why: str) -> None:
        if sender in self.nb.peers:  # (rank 0's and the rank's own connections for the start and monitoring only
            self.nb.inbox.close(sender, why)  # do not count as gossip links)

    def collect(self, t: int, ranks: list[int], gone: set[int], timeout: float) -> dict[int, bytearray]:
        """Rank 0: the monitoring rows of round t of ``ranks`` within ``timeout`` (``gone``: not waited for)."""
        with self.cond:
            waits.wait_for(self.cond, lambda: all((t, p) in self.monitor for p in ranks if p not in gone), timeout)
            got = {p: self.monitor.pop((t, p)) for p in ranks if (t, p) in self.monitor}
            for key in [k for k in self.monitor if k[0] < t]:
                del self.monitor[key]
            return got
