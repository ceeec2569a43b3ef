"""The sealed mesh of a keyed serverless or gossip job: every rank listens for its peers over mutually authenticated
TLS 1.3, connects to the peers it sends to, and signs every row it contributes.

With keys (``keys = "DIR"``) and ``topology = "serverless"`` or ``"gossip"``, no vector, model, start snapshot or
monitoring row travels through gloo or the c10d store. The protocol:

**Connections.** One TLS connection per direction and pair: the *sender* opens it to the receiver's listener and is
the only one who writes on it after the introduction; the receiver only reads it (an SSL object is never used by two
threads). A listener admits connections through :class:`~phalanx.distributed.admission.Admission` (one thread,
handshake deadlines, caps per source: no slot a stranger can hold); the connecting end checks that the listener holds
the key of the rank it meant to reach and tries again while a listener under attack sheds it. The connecting peer
introduces itself (``HELLO``: its rank, the config digest, and either the address it listens on and its share of
the nonce — to rank 0 — or the run's nonce); the receiver refuses, with a reason sent back and recorded, a claimed
rank that is not the certificate's, a rank not in the job, another config, another nonce, and a second connection of
one rank (one key, one connection, for the whole run); it answers ``ACK`` otherwise, then only reads. Who sent a
frame is the certificate's rank, never what the frame says.

**Rendezvous** (:mod:`phalanx.distributed.rendezvous`). Rank 0 listens on ``MASTER_ADDR:MASTER_PORT`` (under
torchrun's agent, which holds that port: ``PHALANX_SEALED_PORT``, or a free port published in the agent's store and
read back as untrusted input). Every other rank listens on ``bind_host`` with a free port, connects to rank 0 from
that address and says where it listens — rank 0 takes only the address the connection came from — and rank 0
connects back to every rank at once (at most :data:`DIAL_BACK_S`), checks the certificate there is that rank's, and
sends it the start snapshot (``INIT``: the run's nonce, its contributions, the address book, the state), after which
the ranks connect to one another through the book, in parallel. The nonce is SHA-256 of every joined rank's fresh
share (:mod:`~phalanx.distributed.contribution`; a rank joining after it was fixed is refused); a rank whose own is
not in the snapshot unchanged, or whose nonce does not follow, stops in one line before it signs anything. Rank 0's
connection to a rank and that rank's to rank 0: the start snapshot, its stop, gossip monitoring rows and reports.

**Frames.** ``PHASED_MAGIC · kind · phase · round · length`` (:func:`~phalanx.distributed.channel.recv_phased`), the
length checked against the kind's limit before the payload is read; a receiver takes only the kinds its sender may send
(``INIT`` and ``STOP`` only from rank 0, ``MONITOR`` and ``REPORT`` only at rank 0). A frame that breaks this, or is
garbage or cut, closes the connection at once; a frame that frames but must not be used (a signature that does not
verify, a second row …) is a violation, closing it at the ``MAX_VIOLATIONS``-th. Its sender is gone for the run.

**Signatures.** A ``ROW`` or ``MONITOR`` payload is ``signature (64) ‖ body``; the Ed25519 signature covers
:func:`mesh_message` — a domain string per topology (``phalanx/serverless/v1``, ``phalanx/gossip/v1``), the run's
nonce, the config digest, the kind and phase, the round, the sender, the recipient (gossip: the neighbour it is
sent to; serverless: :data:`EVERYONE`, a row being one broadcast) and the body's SHA-256 — so a row cannot be
replayed into another round, phase, run or topology, relayed by another rank, or (gossip) redirected to another
neighbour. A row that fails is a *rejection* (:class:`~phalanx.distributed.rejections.Rejection`, with the reason) and
is handed to the topology as refused (:class:`Sink`), which decides what a refused row means.

**Rejections** are recorded by the rank that made them, counted by group (:mod:`phalanx.distributed.rejections`);
every rank other than 0 also reports them to rank 0 (``REPORT``: a few with their reasons, the rest as counts) for
its transcript (:mod:`phalanx.distributed.transcript`).
"""

from __future__ import annotations

import hashlib
import json
import queue
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from phalanx import waits
from phalanx.distributed import _test_hooks, wire
from phalanx.distributed.admission import Admission, Shed, at_once, dial, listen_on
from phalanx.distributed.channel import (
    HANDSHAKE_TIMEOUT_S,
    MAX_VIOLATIONS,
    PHASED_HEADER,
    PHASED_MAGIC,
    Closed,
    Cut,
    Kind,
    Limits,
    Violation,
    client_context,
    close_quietly,
    peer_rank,
    recv_phased,
    send_phased,
    server_context,
    strict_json,
    why,
)
from phalanx.distributed.contribution import check_init, draw, fix, share_problem, too_late
from phalanx.distributed.keys import Identity
from phalanx.distributed.parameter_server import JOIN_TIMEOUT_S
from phalanx.distributed.rejections import REASON_CHARS, Rejection, RejectionLog, Reporter, parse_report
from phalanx.distributed.rendezvous import claimed_address
from phalanx.distributed.sealed import SIGNATURE_BYTES, STOP_BYTES
from phalanx.errors import PhalanxError

DOMAINS = {"serverless": b"phalanx/serverless/v1\x00", "gossip": b"phalanx/gossip/v1\x00"}
"""What a signature of each topology starts with (and the parameter server's ``phalanx/vector/v1``): a signature of
one topology is never valid in another."""
EVERYONE = 0xFFFFFFFF
"""The recipient of a serverless row (one row, sent to every rank)."""
REPORT_BYTES = 1 << 16
CLOSE_WAIT_S = 10.0
DIAL_BACK_S = 15.0
"""How long rank 0 tries to reach a rank that joined at the address it gave (all at once; a refusal is final: it
listened there when it joined): the most a rank that does not answer there delays the start of the others."""


def mesh_message(topology: str, nonce: bytes, config: str, kind: Kind, phase: int, t: int, sender: int, to: int,
                 digest: bytes) -> bytes:
    """What a mesh signature covers (every field of fixed length: the nonce 32 bytes, the config digest 64 hex)."""
    return (DOMAINS[topology] + nonce + config.encode() + bytes([int(kind), phase]) + t.to_bytes(8, "big")
            + sender.to_bytes(4, "big") + to.to_bytes(4, "big") + digest)


class Sink(Protocol):
    """What a topology does with what the mesh received (called from the mesh's reader threads)."""

    def signed(self, sender: int, kind: Kind, phase: int, t: int, body: bytearray, digest: bytes,
               signature: bytes) -> str | None:
        """A ``ROW`` or ``MONITOR`` whose signature verified; a reason to reject it (e.g. a second one), or None."""

    def refused(self, sender: int, kind: Kind, phase: int, t: int, reason: str) -> None:
        """``sender``'s message of (kind, phase, round t) was rejected: it is never used (stop waiting for it)."""

    def gone(self, sender: int, why: str) -> None:
        """``sender``'s connection to this rank, or this rank's to it, ended (``"finished"``: it said goodbye)."""


@dataclass
class _Out:
    """A connection this rank sends on: its socket and its writer thread's queue."""

    peer: int
    sock: ssl.SSLSocket
    mailbox: queue.SimpleQueue[tuple[Kind, int, int, bytes] | None] = field(default_factory=queue.SimpleQueue)
    cond: threading.Condition = field(default_factory=threading.Condition)
    pending: int = 0
    """``ROW`` frames queued and not written yet."""
    alive: bool = True
    done: bool = False

    def post(self, kind: Kind, phase: int, t: int, payload: bytes) -> bool:
        if not self.alive:
            return False
        if kind == Kind.ROW:
            with self.cond:
                self.pending += 1
        self.mailbox.put((kind, phase, t, payload))
        return True


class Mesh:
    """This rank's end of the sealed mesh (see the module's docstring).

    ``listen``: where to listen (port 0: a free one); ``row_limit``: the most bytes a row's body may have;
    ``init_limit``: the start snapshot's; ``monitor_limit``: a monitoring message's (gossip, at rank 0).
    """

    def __init__(self, identity: Identity, topology: str, digest: str, workers: int, listen: tuple[str, int], *,
                 row_limit: int, init_limit: int, monitor_limit: int = 0) -> None:
        if topology not in DOMAINS:
            raise ValueError(f"no sealed mesh for topology {topology!r}")
        self.identity, self.rank, self.topology, self.digest = identity, identity.rank, topology, digest
        self.n = workers
        self.server_ctx, self.client_ctx = server_context(identity), client_context(identity)
        self.listener = listen_on(*listen)
        bound = self.listener.getsockname()
        self.address = (str(bound[0]), int(bound[1]))  # (a literal address: what peers see this rank connect from)
        self.nonce: bytes | None = None  # (rank 0: fixed in offer(); the others: from its start snapshot)
        self.share, self.shares = draw(), dict[int, bytes]()  # its share of the nonce (per start); rank 0: the others'
        self.contributions: list[bytes | None] | None = None  # rank 0: what the nonce follows from (rank order)
        self.cond = threading.Condition()
        self.rejections = RejectionLog()  # bounded: counted per (round, rank or peer, kind)
        self.reporter = Reporter()  # a rank other than 0: what of its rejections goes to rank 0, and when
        self.round = 0
        self.joined: dict[int, tuple[str, int]] = {}  # rank 0: where each rank that joined listens
        self.book: dict[int, tuple[str, int]] = {}
        self.heard_from: set[int] = set()  # ranks whose connection to this rank was let in (once per run)
        self.incoming: dict[int, ssl.SSLSocket] = {}
        self.out: dict[int, _Out] = {}
        self.dead: dict[int, str] = {}
        self.init_bytes: bytes | None = None
        self.init: dict[str, Any] | None = None
        self.init_error = ""
        self.stopped: str | None = None
        self.sink: Sink | None = None
        self.ready = threading.Event()  # rows are handed to the sink only once the topology is set up
        self.closing = False
        self.row_limit, self.init_limit, self.monitor_limit = row_limit, init_limit, monitor_limit
        self.admission = Admission(self.listener, self.server_ctx, identity.allow, header=PHASED_HEADER,
                                   magic=PHASED_MAGIC, hello_kind=int(Kind.HELLO), admit=self._introduce,
                                   reject=self.reject, name="phalanx-mesh-admit", links=2 * workers)

    # -- records ---------------------------------------------------------------------------------------------------

    def reject(self, rank: int | None, reason: str) -> None:
        """Record a rejection (and, on a rank other than 0, report it to rank 0)."""
        with self.cond:
            rejection = Rejection(self.round, rank, reason[:REASON_CHARS])
            self.rejections.append(rejection)
            reports = self.reporter.add(rejection) if self.rank != 0 else []
            self.cond.notify_all()
        self._report(reports)

    def _report(self, reports: list[dict[str, Any]]) -> None:
        out = self.out.get(0)
        if self.rank != 0 and out is not None:  # rank 0 keeps the job's transcript
            for report in reports:
                out.post(Kind.REPORT, 0, self.round, json.dumps(report).encode()[:REPORT_BYTES])

    def new_rejections(self) -> list[dict[str, Any]]:
        """The rejections recorded (here, and at rank 0 those the other ranks reported) since the last call, counted
        by group (:mod:`phalanx.distributed.rejections`)."""
        return self.rejections.drain()

    def _gone(self, peer: int, why: str) -> None:
        with self.cond:
            self.dead.setdefault(peer, why)
            self.cond.notify_all()
        sink = self.sink
        if sink is not None:
            sink.gone(peer, why)

    def alive(self, peer: int) -> bool:
        """Whether this rank's connections with ``peer`` are up (it has not left, and nothing failed)."""
        with self.cond:
            return peer not in self.dead

    # -- listening -------------------------------------------------------------------------------------------------

    def _introduce(self, tls: ssl.SSLSocket, addr: str, rank: int, payload: bytes) -> None:
        """A connection whose certificate is rank ``rank``'s introduced itself (:class:`Admission`): let it in
        (``ACK``, then read it) or refuse it with the reason."""
        try:
            hello = strict_json(payload)
            claimed, config = hello["rank"], hello["config"]
        except (ValueError, KeyError, TypeError) as exc:
            close_quietly(tls)
            self.reject(rank, f"a connection from {addr} that did not introduce itself ({why(exc)})")
            return
        problem = self._check_hello(rank, claimed, config, hello, addr)
        with self.cond:
            if problem is None and rank in self.heard_from:
                problem = f"rank {rank} is already connected: one connection per rank and run (one key used twice)"
            if problem is None and self.rank == 0:  # (under the lock: the nonce is fixed under it too)
                problem = too_late(rank) if self.contributions is not None else share_problem(hello.get("share"))
            if problem is None:
                self.heard_from.add(rank)
                self.incoming[rank] = tls
                if self.rank == 0:
                    host, port = hello["listen"]
                    self.joined[rank], self.shares[rank] = (str(host), int(port)), bytes.fromhex(hello["share"])
                self.cond.notify_all()
        if problem is not None:
            self.reject(rank, f"a connection from {addr} refused: {problem}")
            try:
                send_phased(tls, Kind.REFUSED, 0, 0, problem.encode()[:STOP_BYTES])
            except (ssl.SSLError, OSError):
                pass
            close_quietly(tls)
            return
        try:
            send_phased(tls, Kind.ACK, 0, 0)
            tls.settimeout(None)
        except (ssl.SSLError, OSError) as exc:  # (it failed, or this rank is closing)
            self._end_incoming(rank, tls, f"its connection failed ({why(exc)})")
            return
        threading.Thread(target=self._read, args=(rank, tls), daemon=True, name=f"phalanx-mesh-in-{rank}").start()

    def _check_hello(self, rank: int, claimed: Any, config: Any, hello: dict[str, Any], addr: str) -> str | None:
        if claimed != rank:
            return f"it claims rank {claimed!r} with rank {rank}'s key"
        if not 0 <= rank < self.n or rank == self.rank:
            return f"rank {rank} is not a peer of rank {self.rank} in this job (0 … {self.n - 1})"
        if config != self.digest:
            return "it runs another config"
        if self.rank == 0:
            return claimed_address(hello.get("listen"), addr)
        if rank == 0:  # rank 0's connection brings the nonce
            return None
        with self.cond:  # a peer may connect before this rank has its start snapshot (and the nonce)
            waits.wait_for(self.cond, lambda: self.nonce is not None or self.closing, JOIN_TIMEOUT_S)
            nonce = self.nonce
        if nonce is None or hello.get("nonce") != nonce.hex():
            return "it runs another start of the job (its nonce is not this run's)"
        return None

    def _limits(self, sender: int) -> Limits:
        sizes = {Kind.ROW: SIGNATURE_BYTES + self.row_limit, Kind.BYE: 0}
        if sender == 0:
            sizes.update({Kind.INIT: self.init_limit, Kind.STOP: STOP_BYTES})
        if self.rank == 0:
            sizes.update({Kind.REPORT: REPORT_BYTES})
            if self.monitor_limit:
                sizes[Kind.MONITOR] = SIGNATURE_BYTES + self.monitor_limit
        return Limits(sizes)

    def _read(self, sender: int, tls: ssl.SSLSocket) -> None:
        limits = self._limits(sender)
        public = self.identity.allow.public_key(sender)
        reason = "finished"
        violations = 0
        while True:
            try:
                kind, phase, t, payload = recv_phased(tls, limits)
            except Closed:
                reason = "its connection closed"
                break
            except (ssl.SSLError, OSError, Cut) as exc:  # (a frame cut short: a drop, as a reset — not its doing)
                reason = f"its connection failed ({why(exc)})"
                if not self.closing:
                    self.reject(sender, f"rank {sender}'s link failed ({why(exc)})")
                break
            except Violation as exc:  # (a wrong header: its doing; it can never connect again in this run)
                reason = f"it broke the protocol ({exc.reason})"
                self.reject(sender, f"rank {sender}'s link: {exc.reason}; connection closed")
                break
            if kind == Kind.BYE:
                break
            if kind == Kind.INIT:
                self._take_init(bytes(payload))
                continue
            if kind == Kind.STOP:
                with self.cond:
                    self.stopped = bytes(payload).decode(errors="replace")
                    self.cond.notify_all()
                continue
            if kind == Kind.REPORT:
                problem = self._take_report(sender, payload)
            else:
                self.ready.wait()
                problem = self._take_signed(sender, public, kind, phase, t, payload)
            if problem is None:
                continue
            violations += 1
            self.reject(sender, problem)
            if violations >= MAX_VIOLATIONS:
                reason = f"it broke the protocol's rules {violations} times"
                self.reject(sender, f"rank {sender}'s link closed after {violations} violations")
                break
        self._end_incoming(sender, tls, reason)

    def _take_init(self, data: bytes) -> None:
        """Rank 0's start snapshot (read here, so that the nonce is known as soon as it arrives: peers that got
        theirs first are waiting for it in their introduction)."""
        with self.cond:
            if self.init_bytes is not None:
                return
        try:
            init: dict[str, Any] = wire.unpack(data)
            parsed = {int(r): (str(a[0]), int(a[1])) for r, a in init.pop("book").items()}
        except Exception as exc:  # torch.load's many ways of refusing bytes
            self.init_error = f"rank 0's start snapshot is unreadable ({why(exc)})"
        try:  # its own contribution in, unchanged, and the nonce SHA-256 of the list
            nonce = b"" if self.init_error else check_init(init, self.rank, self.n, self.share)
        except ValueError as exc:
            self.init_error = f"refused the start snapshot: {exc}"
        if self.init_error:
            with self.cond:
                self.init_bytes = data
                self.cond.notify_all()
            return
        del init["nonce"], init["contributions"]
        with self.cond:
            self.init, self.nonce, self.book, self.init_bytes = init, nonce, parsed, data
            self.cond.notify_all()

    def _end_incoming(self, sender: int, tls: ssl.SSLSocket, why: str) -> None:
        with self.cond:
            if self.incoming.get(sender) is tls:
                del self.incoming[sender]
            self.cond.notify_all()
        self._gone(sender, why)
        close_quietly(tls)

    def _take_report(self, sender: int, payload: bytearray) -> str | None:
        """Rank 0: rejections ``sender`` reports, for the transcript (counted by group, filed under this rank's
        round: a reporter cannot open groups by naming rounds); why not, if it is malformed (a violation)."""
        parsed = parse_report(payload, self.n)
        if isinstance(parsed, str):
            return f"rank {sender} sent a report that is not one ({parsed})"
        rank, reason, count = parsed
        with self.cond:
            self.rejections.append(Rejection(self.round, rank, reason, at=sender), count)
            self.cond.notify_all()
        return None

    def _take_signed(self, sender: int, public: Any, kind: Kind, phase: int, t: int,
                     payload: bytearray) -> str | None:
        """A ``ROW`` or ``MONITOR`` of ``sender``: to the sink if its signature verifies and the sink takes it;
        else why not (a violation)."""
        from cryptography.exceptions import InvalidSignature

        sink = self.sink
        if sink is None or self.nonce is None:  # (closing before the topology was set up)
            return None
        what = f"round-{t} {kind.name} (phase {phase})"
        if len(payload) < SIGNATURE_BYTES:
            reason = f"rank {sender} sent a {what} without a signature"
            sink.refused(sender, kind, phase, t, reason)
            return reason
        signature, body = bytes(payload[:SIGNATURE_BYTES]), payload[SIGNATURE_BYTES:]
        digest = hashlib.sha256(body).digest()
        to = EVERYONE if self.topology == "serverless" and kind == Kind.ROW else self.rank
        try:
            public.verify(signature, mesh_message(self.topology, self.nonce, self.digest, kind, phase, t, sender, to,
                                                  digest))
        except InvalidSignature:
            reason = f"rank {sender}'s {what} has a signature that does not verify"
            sink.refused(sender, kind, phase, t, reason)
            return reason
        return sink.signed(sender, kind, phase, t, body, digest, signature)

    # -- connecting ------------------------------------------------------------------------------------------------

    def _connect(self, peer: int, host: str, port: int, extra: dict[str, Any], deadline: float,
                 source: str | None = None, listened: bool = False) -> _Out:
        """This rank's connection to ``peer`` at ``host:port`` (:func:`~phalanx.distributed.admission.dial`, with
        ``gone_if_refused=listened``), introduced and let in; :class:`PhalanxError` if it is not ``peer``'s."""
        who, where = f"rank {self.rank}", f"{host}:{port}"
        hello = json.dumps({"rank": self.rank, "config": self.digest, **extra}).encode()

        def introduce(tls: ssl.SSLSocket) -> ssl.SSLSocket:
            got = peer_rank(tls, self.identity)
            if got != peer:
                raise PhalanxError(f"{who}: the peer at {where} holds rank {got}'s key, not rank {peer}'s")
            tls.settimeout(max(1.0, deadline - time.monotonic()))  # it may wait for its start snapshot to answer
            send_phased(tls, Kind.HELLO, 0, 0, hello)
            try:
                kind, _, _, answer = recv_phased(tls, Limits({Kind.ACK: 0, Kind.REFUSED: STOP_BYTES}))
            except Closed:
                raise Shed("closed") from None
            except Violation as exc:
                raise PhalanxError(f"{who}: rank {peer} at {where} answered with {exc.reason}") from None
            except TimeoutError:
                raise PhalanxError(f"{who}: rank {peer} at {where} did not answer in time") from None
            if kind == Kind.REFUSED:
                raise PhalanxError(f"{who}: rank {peer} refused this rank: {answer.decode(errors='replace')}")
            tls.settimeout(None)
            return tls

        tls = dial(host, port, self.client_ctx, deadline, introduce, who=who, timeout=HANDSHAKE_TIMEOUT_S,
                   source=source, gone_if_refused=listened)
        out = _Out(peer, tls)
        with self.cond:
            self.out[peer] = out
        threading.Thread(target=self._write, args=(out,), daemon=True, name=f"phalanx-mesh-out-{peer}").start()
        return out

    def _connect_all(self, targets: dict[int, tuple[str, int]], extra: dict[str, Any],
                     deadline: float, listened: bool = False) -> dict[int, str]:
        """:meth:`_connect` to every peer of ``targets`` at once (one that stalls delays only itself): who failed."""
        connect = self._connect
        return at_once(targets, lambda p, a: connect(p, *a, extra, deadline, listened=listened), f"rank {self.rank}")

    def _write(self, out: _Out) -> None:
        while (item := out.mailbox.get()) is not None:
            kind, phase, t, payload = item
            try:
                send_phased(out.sock, kind, phase, t, payload)
            except (ssl.SSLError, OSError) as exc:
                out.alive = False
                with self.cond:
                    finished = self.dead.get(out.peer) == "finished"
                if not (self.closing or finished):
                    self.reject(out.peer, f"the link to rank {out.peer} failed ({why(exc)})")
                self._gone(out.peer, f"the link to it failed ({why(exc)})")
                break
            finally:
                if kind == Kind.ROW:
                    with out.cond:
                        out.pending -= 1
                        out.cond.notify_all()
        out.alive = False
        with out.cond:
            out.done = True
            out.cond.notify_all()

    def join(self, host: str, port: int) -> None:
        """A rank other than 0: connect to rank 0 at ``host:port`` and tell it where this rank listens (from the
        address it listens on, which rank 0 checks)."""
        self._connect(0, host, port, {"listen": [self.address[0], self.address[1]], "share": self.share.hex()},
                      time.monotonic() + JOIN_TIMEOUT_S, source=self.address[0])

    def wait_joins(self, ranks: set[int], timeout: float) -> set[int]:
        """Rank 0: the ranks of ``ranks`` that joined within ``timeout`` seconds."""
        with self.cond:
            waits.wait_for(self.cond, lambda: ranks <= set(self.joined), timeout)
            return ranks & set(self.joined)

    def offer(self, init: dict[str, Any]) -> bytes:
        """Rank 0: fix the nonce from the joined ranks' shares (a later rank is refused), connect to each and send it
        ``init`` with the nonce, its contributions and the book of the ranks it reached; the bytes sent (to all)."""
        assert self.rank == 0 and self.nonce is None
        with self.cond:
            joined = dict(self.joined)
            self.contributions, self.nonce = _test_hooks.nonce_mutant(*fix(self.share, self.shares, self.n))
        failed = self._connect_all(joined, {}, time.monotonic() + DIAL_BACK_S, listened=True)
        for r, reason in failed.items():
            self.reject(r, reason)
            self._gone(r, reason)
        book = {0: self.address, **{r: a for r, a in sorted(joined.items()) if r not in failed}}
        payload = wire.pack({**init, "nonce": self.nonce, "contributions": self.contributions,
                             "book": {r: [h, p] for r, (h, p) in book.items()}})
        self.book = book
        for r in book:
            if r != 0:
                self.out[r].post(Kind.INIT, 0, int(init["round"]), payload)
        self.init_bytes = payload
        return payload

    def receive_init(self, timeout: float) -> dict[str, Any]:
        """A rank other than 0: rank 0's start snapshot (the nonce and address book taken out of it)."""
        with self.cond:
            waits.wait_for(self.cond, lambda: self.init_bytes is not None or 0 in self.dead, timeout)
            init, error = self.init, self.init_error
        if self.init_bytes is None:
            raise PhalanxError(f"rank {self.rank}: no start snapshot from rank 0 within {timeout:g} s "
                               f"({self.dead.get(0, 'it did not connect')})")
        if init is None:
            raise PhalanxError(f"rank {self.rank}: {error}")
        return init

    def connect(self, peers: set[int], deadline: float) -> dict[int, str]:
        """Open this rank's connection to each of ``peers`` it has none to yet, through the address book; the peers
        it could not reach, and why — gone, so that :meth:`wait_incoming` does not wait for them either."""
        assert self.nonce is not None
        absent = {p: "it did not join the job" for p in peers if p not in self.out and p not in self.book}
        targets = {p: self.book[p] for p in peers if p not in self.out and p in self.book}
        failed = self._connect_all(targets, {"nonce": self.nonce.hex()}, deadline, listened=True)
        for p, reason in failed.items():
            self.reject(p, reason)
            self._gone(p, reason)
        return dict(sorted({**absent, **failed}.items()))

    def wait_incoming(self, peers: set[int], deadline: float) -> set[int]:
        """The ranks of ``peers`` whose connections to this rank are in, waiting until ``deadline`` (monotonic)."""
        with self.cond:
            waits.wait_for(self.cond, lambda: all(p in self.heard_from or p in self.dead for p in peers),
                               max(0.0, deadline - time.monotonic()))
            return peers & self.heard_from

    # -- sending ---------------------------------------------------------------------------------------------------

    def send(self, peers: list[int], kind: Kind, phase: int, t: int, body: bytes) -> tuple[bytes, dict[int, bytes]]:
        """Sign ``body`` and queue it to each of ``peers`` (serverless rows: one signature for everyone; otherwise
        one per recipient); the body's SHA-256 and each peer's signature (:data:`EVERYONE`: a broadcast)."""
        assert self.nonce is not None
        digest = hashlib.sha256(body).digest()
        broadcast = self.topology == "serverless" and kind == Kind.ROW
        sigs = {p: self.identity.sign(mesh_message(self.topology, self.nonce, self.digest, kind, phase, t, self.rank,
                                                   p, digest)) for p in ([EVERYONE] if broadcast else peers)}
        payload = sigs[EVERYONE] + body if broadcast else b""
        for p in peers:
            out = self.out.get(p)
            if out is not None:
                out.post(kind, phase, t, payload if broadcast else sigs[p] + body)
        return digest, sigs

    def backlog(self, peer: int) -> int:
        """Rows queued to ``peer`` and not written to its connection yet."""
        out = self.out.get(peer)
        if out is None:
            return 0
        with out.cond:
            return out.pending

    def flush(self, peer: int, deadline: float) -> None:
        """Wait until every row queued to ``peer`` is written, at most until ``deadline`` (monotonic)."""
        out = self.out.get(peer)
        if out is None:
            return
        with out.cond:
            waits.wait_for(out.cond, lambda: out.pending == 0 or out.done, max(0.0, deadline - time.monotonic()))

    def stop(self, reason: str) -> None:
        """Rank 0: tell every rank it reaches that the run ended (``"finished"``, or why it stopped)."""
        for out in list(self.out.values()):
            out.post(Kind.STOP, 0, self.round, reason.encode()[:STOP_BYTES])

    def close(self, wait_for: set[int] | None = None, timeout: float = CLOSE_WAIT_S) -> None:
        """Say goodbye on every connection (after what is queued), wait — at most ``timeout`` — until it is written
        and the peers of ``wait_for`` (default: every peer) said goodbye or left, then close everything."""
        deadline = time.monotonic() + timeout
        with self.cond:
            reports = self.reporter.flush()
        self._report(reports)  # the counts not reported yet, before the goodbye
        outs = list(self.out.values())
        for out in outs:
            out.post(Kind.BYE, 0, self.round, b"")
            out.mailbox.put(None)
        for out in outs:
            with out.cond:
                waits.wait_for(out.cond, lambda o=out: o.done, max(0.0, deadline - time.monotonic()))  # type: ignore[misc]
        waited = set(self.heard_from) if wait_for is None else wait_for
        with self.cond:
            waits.wait_for(self.cond, lambda: not (waited & set(self.incoming)), max(0.0, deadline - time.monotonic()))
        self.closing = True
        self.ready.set()
        with self.cond:
            self.cond.notify_all()
        self.admission.close()
        close_quietly(self.listener)
        for out in outs:
            close_quietly(out.sock)
        for tls in list(self.incoming.values()):
            close_quietly(tls)
