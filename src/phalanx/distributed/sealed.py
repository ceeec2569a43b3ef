"""Sealed links of the parameter-server topology: every worker talks to the server over mutually authenticated TLS,
and signs every vector it sends.

With keys (``keys = "DIR"``), no c10d store carries a vector, θ or a stop message. Each worker rank r opens two TLS 1.3
connections to rank 0 — *down* (server → worker: the start snapshot, θ of every round, the honest vectors for a
Byzantine rank, stop) and *up* (worker → server: its vectors) — so that each TLS connection is read or written by one
thread only. Who is speaking is decided by the certificate the peer proved it holds the key of, looked up in the
allow-list (:mod:`phalanx.distributed.keys`); the rank a peer *claims* in its introduction must be that rank, a rank is
let in once per link (a second connection under a key already connected is refused: one key, one rank), and a worker
accepts θ only from rank 0's key. Every vector carries an Ed25519 signature over ``(run nonce, config digest, round,
rank, SHA-256 of the payload)``, checked before the vector is used, and kept in the run's transcript
(:mod:`phalanx.distributed.transcript`) so that anyone holding the allow-list can check later who was heard.

The run nonce is not rank 0's alone (:mod:`phalanx.distributed.contribution`): SHA-256 of the domain and the 32 fresh
random bytes every worker sends in its hello, which rank 0 waits for (at most ``JOIN_TIMEOUT_S``) before any start
snapshot; a worker whose own is not in it unchanged stops in one line, and one that comes later is refused.

Rank 0 admits connections through :class:`~phalanx.distributed.admission.Admission` (deadlines, caps per source; a
shed worker tries again until ``JOIN_TIMEOUT_S``), answers a downlink with the start snapshot, then its uplink with
``ACK`` — an uplink before the nonce is fixed is refused (a vector signed over no nonce binds to no run).

What is never used: a frame over its kind's size (refused before it is read, and the connection closed), a frame of a
kind the server does not take, a vector whose signature does not verify, a second vector of one rank in one round, a
vector of a round that has not begun, a late one replayed, and anything from a connection that failed TLS (an unknown
key, a flipped or cut byte, a replay of recorded traffic). Each is a *rejection*, recorded with the round, the rank
(None for an unknown key) and the reason; the rank's row is then missing from the round and counts against f, exactly
as a silent worker's does. An uplink is closed at its ``MAX_VIOLATIONS``-th vector that must not be used or its first
wrong header (``channel.Malformed``), and the rank refused a new uplink for the session (a link closed, reset or cut
mid-frame may be opened again): a listed rank cannot make the server check bad frames forever, nor reconnect for more.

The server never blocks on a worker: each downlink has its own writer thread with a mailbox in which a newer round's
θ replaces messages of older rounds that have not been sent yet (a worker that fell behind receives the newest θ and
skips ahead, as with the store's ``latest`` key); each uplink has a reader thread.

**Worker-stage reports.** In a run whose worker stages report (:func:`~phalanx.distributed.wire.reporting`), a worker
sends its vector in a ``REPORTED_VECTOR`` frame: its report enclosed ahead of the vector
(:func:`~phalanx.distributed.wire.enclose`), the signature over the SHA-256 of both — the digest the transcript
records and the audit checks, so a report altered or forged on the path never verifies, and the rank cannot later
deny what it claimed. The server cuts the report off before the vector is used and hands it to the stages as that
rank's claim (:meth:`SealedLinks.reports`, :func:`~phalanx.distributed.wire.absorb_reports`): bounded by the stage,
only ever in metric columns. A plain ``VECTOR`` frame (a Byzantine rank's vector attack, or a rank that chose to
report nothing) is a vector with no report; a ``REPORTED_VECTOR`` frame in a run that does not report is refused
like any kind the server never takes, and so is one whose enclosure is not one (a violation).
"""

from __future__ import annotations

import hashlib
import json
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phalanx import waits
from phalanx.distributed import _test_hooks, wire
from phalanx.distributed.admission import Admission, Shed, dial, listen_on
from phalanx.distributed.channel import (
    HANDSHAKE_TIMEOUT_S,
    HEADER,
    MAGIC,
    MAX_VIOLATIONS,
    Closed,
    Kind,
    Limits,
    Malformed,
    Violation,
    client_context,
    close_quietly,
    peer_rank,
    recv_frame,
    send_frame,
    server_context,
    strict_json,
    why,
)
from phalanx.distributed.contribution import check_init, draw, fix, parse_hex, too_late
from phalanx.distributed.keys import Identity
from phalanx.distributed.parameter_server import JOIN_TIMEOUT_S
from phalanx.distributed.rejections import Rejection, RejectionLog
from phalanx.errors import PhalanxError

SIGNATURE_BYTES = 64
STOP_BYTES = 1 << 16
ATTACK_STATE_BYTES = 1 << 16
"""The most a Byzantine rank's attack-stream state appended to its vector may take."""
DOMAIN = b"phalanx/vector/v1\x00"


def signed_message(nonce: bytes, config: str, t: int, rank: int, digest: bytes) -> bytes:
    """What a worker's Ed25519 signature covers: the run (its nonce and config digest), the round, the sender, and
    the SHA-256 of the payload — so a signed vector cannot be replayed into another round, run or rank."""
    return DOMAIN + nonce + config.encode() + t.to_bytes(8, "big") + rank.to_bytes(4, "big") + digest


@dataclass
class Accepted:
    """A vector that passed every check: its payload, the payload's SHA-256 (hex) and the sender's signature."""

    body: bytearray
    sha256: str
    signature: str
    report: bytes | None = None
    """The worker-stage report that came with it, under the same signature (a ``REPORTED_VECTOR`` frame); a claim."""


@dataclass
class _Down:
    """A downlink: its socket, the writer thread's mailbox."""

    sock: ssl.SSLSocket
    pending: list[tuple[Kind, int, bytes]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    alive: bool = True
    started: bool = False


class SealedLinks:
    """Rank 0's sealed links to the workers (see the module's docstring); a :class:`ServerLinks`."""

    def __init__(self, identity: Identity, host: str, port: int, digest: str, row_bytes: int, workers: int,
                 reports: bool = False) -> None:
        self.identity = identity
        self.digest = digest
        self.row_bytes = row_bytes
        self.ctx = server_context(identity)
        self.listener = listen_on(host, port)
        self.port = int(self.listener.getsockname()[1])
        self.own = draw()
        """Rank 0's contribution to the session nonce."""
        self.shares: dict[int, bytes] = {}
        """Each worker's contribution, from the hello of its downlink (the first of the session)."""
        self.expected: set[int] = set(range(1, workers))
        """The workers whose contributions rank 0 waits for before it fixes the nonce (:meth:`offer`)."""
        self.contributions: list[bytes | None] | None = None
        """The list the nonce was derived from (rank order, None: absent), once fixed."""
        self.nonce = b""
        """The session nonce: :func:`~phalanx.distributed.contribution.derive` of the contributions, fixed when every
        expected worker's came or at the join deadline (empty until then)."""
        self.deadline = 0.0
        self.cond = threading.Condition()
        self.inbox: dict[tuple[int, int], Accepted] = {}
        self.window = 1
        """Vectors of rounds t − window … t are kept (the synchronous server: the round and the one before; the
        asynchronous server, :mod:`~phalanx.distributed.async_server`: its staleness bound S)."""
        self.fresh: list[tuple[int, int]] | None = None
        """The asynchronous server's arrival order: (round, rank) of each vector kept, when not None."""
        self.late: Counter[int] = Counter()
        """Vectors older than the window, per rank (dropped, never kept)."""
        self.late_newest: dict[int, int] = {}  # each rank's newest late round: one not newer is a replay (violation)
        self.rejections = RejectionLog()  # bounded: counted per (round, rank or peer, kind)
        self.down: dict[int, _Down] = {}
        self.up: dict[int, ssl.SSLSocket] = {}
        self.dead_up: set[int] = set()
        self.ever_up: set[int] = set()
        self.barred: set[int] = set()  # ranks whose uplink was closed for violations: refused a new one
        self.round = 0
        self.n = workers
        self.init_payload: dict[str, Any] | None = None
        self.closed = False
        vector = SIGNATURE_BYTES + row_bytes + ATTACK_STATE_BYTES
        self.vector_limits = Limits({Kind.VECTOR: vector, **({Kind.REPORTED_VECTOR: vector + 2 + wire.REPORT_BYTES}
                                                             if reports else {})})
        self.admission: Admission | None = None

    # -- connections ---------------------------------------------------------------------------------------------

    def _reject(self, rank: int | None, reason: str) -> None:
        with self.cond:
            self.rejections.append(Rejection(self.round, rank, reason))
            self.cond.notify_all()

    def _introduce(self, tls: ssl.SSLSocket, addr: str, rank: int, payload: bytes) -> None:
        """A connection whose certificate is rank ``rank``'s introduced itself (:class:`Admission`): let it in as
        that rank's down- or uplink, or refuse it with the reason."""
        try:
            hello = strict_json(payload)
            claimed, link, config = hello["rank"], hello["link"], hello["config"]
        except (ValueError, KeyError, TypeError) as exc:
            tls.close()
            self._reject(rank, f"a connection from {addr} that did not introduce itself ({why(exc)})")
            return
        problem = None
        if claimed != rank:
            problem = f"it claims rank {claimed!r} with rank {rank}'s key"
        elif not 1 <= rank < self.n:
            problem = f"rank {rank} is not a worker of this job (1 … {self.n - 1})"
        elif config != self.digest:
            problem = "it runs another config"
        elif link not in ("up", "down"):
            problem = f"unknown link {link!r}"
        share = b""
        if problem is None:  # (after who it is: an impostor's refusal still says what it claimed)
            try:
                share = parse_hex(hello.get("share"))
            except ValueError as exc:
                problem = str(exc)
        with self.cond:
            old = self.down.get(rank) if problem is None and link == "down" else None
            if old is not None and old.alive and not old.started and share == self.shares.get(rank):
                close_quietly(old.sock)  # the same session's worker again, before its start snapshot: this one counts
                old.alive = False
            if problem is None and rank is not None and (
                (link == "down" and rank in self.down and self.down[rank].alive)
                or (link == "up" and rank in self.up)
            ):
                problem = f"rank {rank} is already connected ({link}): one key used twice"
            if problem is None and link == "up" and rank in self.barred:
                problem = f"rank {rank}'s uplink was closed for violations: it is missing for the rest of the session"
            if problem is None and link == "up" and (rank not in self.down or not self.down[rank].alive
                                                     or self.contributions is None):  # (a vector over no nonce)
                problem = f"rank {rank} opened its uplink before its downlink or before the session nonce was fixed"
            if problem is None:
                problem = self._contribute(rank, link, share)
            if problem is None and link == "down":  # (registered under the lock: the nonce is fixed under it too)
                self.down[rank] = _Down(tls)
                if self.contributions is None and self.expected <= set(self.shares):
                    self._fix()
                self.cond.notify_all()  # (whoever waits for this rank's link: an event, not a timeout)
            if problem is not None:
                self.rejections.append(Rejection(self.round, rank, f"a connection from {addr} refused: {problem}"))
                self.cond.notify_all()
        if problem is not None:
            try:
                send_frame(tls, Kind.REFUSED, 0, problem.encode()[:STOP_BYTES])
            except (ssl.SSLError, OSError):
                pass
            tls.close()
            return
        if link == "down":  # (its answer is the start snapshot, which its writer sends first, once the nonce is fixed)
            try:
                tls.settimeout(None)
            except OSError:  # (closed under it: the server is closing)
                return
            self._open_down(rank)
            return
        try:
            send_frame(tls, Kind.ACK, 0)  # the uplink's only frame from this end: the worker reads it
            tls.settimeout(None)
        except (ssl.SSLError, OSError) as exc:
            close_quietly(tls)
            self._reject(rank, f"rank {rank}'s uplink failed before it was let in ({why(exc)})")
            return
        with self.cond:
            self.up[rank] = tls
            self.ever_up.add(rank)
            self.dead_up.discard(rank)
            self.cond.notify_all()
        threading.Thread(target=self._read_up, args=(rank, tls), daemon=True, name=f"phalanx-up-{rank}").start()

    def _contribute(self, rank: int, link: str, share: bytes) -> str | None:
        """(Under the lock.) Take rank ``rank``'s contribution from its hello, or why its connection is refused: a
        contribution other than the one it gave this session once the nonce is fixed — or none at all then (it came
        too late to count: it is missing this session)."""
        known = self.shares.get(rank)
        if self.contributions is None:
            if link == "down":
                self.shares[rank] = share  # (a downlink opened again before the nonce was fixed: its latest bytes)
            return None
        if known is None:
            return too_late(rank)
        if share != known:
            return f"rank {rank}'s contribution is not the one it gave this session"
        return None

    def _fix(self) -> None:
        """(Under the lock.) Fix the session nonce from rank 0's and the workers' contributions that came (the others
        absent), and send every waiting downlink its start snapshot."""
        self.contributions, self.nonce = _test_hooks.nonce_mutant(*fix(self.own, self.shares, self.n))
        self.cond.notify_all()
        for rank in sorted(self.down):
            self._start(rank, self.down[rank])

    def _start(self, rank: int, down: _Down) -> None:
        """Post rank ``rank``'s start snapshot (the nonce and the contributions with it) and start its writer."""
        assert self.init_payload is not None
        init = dict(self.init_payload)
        momentum = init["momentum"]
        init["momentum"] = None if momentum is None else momentum[rank].clone()
        init["nonce"], init["contributions"] = self.nonce, self.contributions
        down.started = True
        with down.cond:
            down.pending.insert(0, (Kind.INIT, init["round"], wire.pack(init)))
            down.cond.notify_all()
        threading.Thread(target=self._write_down, args=(rank, down), daemon=True, name=f"phalanx-down-{rank}").start()

    def _open_down(self, rank: int) -> None:
        """A downlink let in: its start snapshot goes out now if the nonce is fixed (else when it is: :meth:`_fix`)."""
        with self.cond:
            down = self.down.get(rank)
            if down is not None and self.contributions is not None and not down.started:
                self._start(rank, down)

    def _write_down(self, rank: int, down: _Down) -> None:
        while True:
            with down.cond:
                down.cond.wait_for(lambda: bool(down.pending))
                kind, t, payload = down.pending.pop(0)
            try:
                send_frame(down.sock, kind, t, payload)
            except (ssl.SSLError, OSError) as exc:
                if not self.closed:
                    self._reject(rank, f"the downlink to rank {rank} failed ({why(exc)})")
                break
            if kind == Kind.STOP:
                break
        down.alive = False
        close_quietly(down.sock)

    def _post(self, rank: int, kind: Kind, t: int, payload: bytes) -> None:
        down = self.down.get(rank)
        if down is None or not down.alive:
            return
        with down.cond:
            if kind == Kind.THETA:  # a newer θ: older unsent messages are moot (the worker skips ahead)
                down.pending = [m for m in down.pending if m[0] == Kind.INIT or m[1] >= t]
            elif kind == Kind.STOP:
                down.pending = [m for m in down.pending if m[0] == Kind.INIT]
            down.pending.append((kind, t, payload))
            down.cond.notify_all()

    def _read_up(self, rank: int, tls: ssl.SSLSocket) -> None:
        public = self.identity.allow.public_key(rank)
        violations = 0
        while True:
            try:
                kind, t, payload = recv_frame(tls, self.vector_limits)
            except Closed:  # the worker left between two frames: from now on it is missing, like a silent one
                break
            except Violation as exc:  # cut short (a drop: it may come back), or a wrong header (its own doing: barred)
                if isinstance(exc, Malformed):
                    self.barred.add(rank)  # (before the link is removed: never neither open nor barred)
                if not self.closed:
                    self._reject(rank, f"rank {rank}'s uplink: {exc.reason}; connection closed"
                                 + (", the rank barred for the session" if rank in self.barred else ""))
                break
            except (ssl.SSLError, OSError) as exc:
                if not self.closed:
                    self._reject(rank, f"rank {rank}'s uplink failed ({why(exc)})")
                break
            problem = self._take_vector(rank, public, t, payload, kind == Kind.REPORTED_VECTOR)
            if problem is None:
                continue
            violations += 1
            self._reject(rank, problem)
            if violations >= MAX_VIOLATIONS:
                self._reject(rank, f"rank {rank}'s uplink closed after {violations} violations: it is missing from "
                                   "now on")
                self.barred.add(rank)  # (before the link is removed: never neither open nor barred)
                break
        with self.cond:
            if self.up.get(rank) is tls:
                del self.up[rank]
            self.dead_up.add(rank)
            self.cond.notify_all()
        close_quietly(tls)

    def _take_vector(self, rank: int, public: Any, t: int, payload: bytearray, reported: bool = False) -> str | None:
        """Keep a vector of ``rank`` if it passes every check (``reported``: with its report, cut off), else why."""
        from cryptography.exceptions import InvalidSignature
        if len(payload) < SIGNATURE_BYTES:
            return f"rank {rank} sent a round-{t} vector without a signature"
        signature, body = bytes(payload[:SIGNATURE_BYTES]), payload[SIGNATURE_BYTES:]
        digest = hashlib.sha256(body).digest()
        try:
            public.verify(signature, signed_message(self.nonce, self.digest, t, rank, digest))
        except InvalidSignature:
            return f"rank {rank}'s round-{t} vector has a signature that does not verify"
        report = None
        if reported:
            parts = wire.disclose(body)
            if parts is None:
                return f"rank {rank}'s round-{t} vector carries a report that is not enclosed (a length over its body)"
            report, body = parts
        with self.cond:
            if t > self.round:
                return f"rank {rank} sent a vector for round {t}, which has not begun"
            if (t, rank) in self.inbox:
                return f"rank {rank} sent a second vector in round {t}"
            if t + self.window >= self.round:  # (an older one is late, not wrong: a slow worker's; it is dropped)
                self.inbox[(t, rank)] = Accepted(body, digest.hex(), signature.hex(), report)
                if self.fresh is not None:
                    self.fresh.append((t, rank))
                self.cond.notify_all()
            elif t <= self.late_newest.get(rank, -1):  # an honest worker's versions only grow: a replay
                return f"rank {rank} sent a late vector of round {t} after one of round {self.late_newest[rank]}"
            else:
                self.late_newest[rank], self.late[rank] = t, self.late[rank] + 1
        return None

    # -- ServerLinks -----------------------------------------------------------------------------------------------

    def offer(self, init: dict[str, Any], expected: set[int] | None = None) -> None:
        """Start admitting the workers; the start snapshot ``init`` goes to each once the nonce is fixed — when every
        rank of ``expected`` (default: every worker) has sent its contribution, or at the join deadline (`joined`)."""
        self.init_payload = init
        self.round = int(init["round"])
        self.deadline = time.monotonic() + JOIN_TIMEOUT_S
        if expected is not None:
            self.expected = set(expected)
        with self.cond:
            if self.contributions is None and self.expected <= set(self.shares):
                self._fix()
        self.admission = Admission(self.listener, self.ctx, self.identity.allow, header=HEADER, magic=MAGIC,
                                   hello_kind=int(Kind.HELLO), admit=self._introduce, reject=self._reject,
                                   name="phalanx-sealed-admit", links=2 * self.n)

    def joined(self, n: int) -> set[int]:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        with self.cond:
            # the nonce first: every expected worker's contribution, or those that came by the join deadline
            waits.wait_for(self.cond, lambda: self.contributions is not None,
                           max(0.0, self.deadline - time.monotonic()))
            if self.contributions is None:
                self._fix()
            # every rank that opened its uplink has joined, even if it has left again since (a rank whose run has no
            # round left connects, finds nothing to do and closes at once)
            waits.wait_for(self.cond, lambda: len(self.ever_up) >= n - 1, max(0.0, deadline - time.monotonic()))
            return set(self.ever_up)

    def publish_theta(self, t: int, msg: bytes) -> None:
        with self.cond:
            self.round = t
            for key in [k for k in self.inbox if k[0] < t - self.window]:
                del self.inbox[key]
            if self.fresh is not None:  # (not yet taken and now older than the window: late, counted)
                self.late.update(r for v, r in self.fresh if v < t - self.window)
                self.fresh = [k for k in self.fresh if k[0] >= t - self.window]
        for rank in list(self.down):
            self._post(rank, Kind.THETA, t, msg)

    def arrived(self, t: int, rank: int) -> bool:
        with self.cond:
            return (t, rank) in self.inbox

    def collect(self, t: int, ranks: list[int], suspects: set[int], timeout: float) -> dict[int, bytes]:
        waited = [r for r in ranks if r not in suspects]
        with self.cond:
            waits.wait_for(self.cond, lambda: all((t, r) in self.inbox or r not in self.up for r in waited), timeout)
            return {r: self.inbox[(t, r)].body for r in ranks if (t, r) in self.inbox}  # type: ignore[misc]

    def publish_honest(self, t: int, msg: bytes, ranks: list[int]) -> None:
        for rank in ranks:
            self._post(rank, Kind.HONEST, t, msg)

    def stop(self, t: int, reason: bytes) -> None:
        for rank in list(self.down):
            self._post(rank, Kind.STOP, t, wire.STOP + reason[:STOP_BYTES - 1])

    def reports(self, t: int, ranks: list[int]) -> dict[int, bytes]:
        with self.cond:  # (the reports that came signed with the vectors of round t: claims)
            got = {r: self.inbox[(t, r)].report for r in ranks if (t, r) in self.inbox}
        return {r: report for r, report in got.items() if report is not None}

    def refuse(self, t: int, rank: int, reason: str) -> None:
        with self.cond:  # a signed vector the server could not use (not of the model's length): in the transcript
            self.rejections.append(Rejection(t, rank, reason))

    def close(self) -> None:
        deadline = time.monotonic() + 10.0
        for down in list(self.down.values()):  # let the stop messages go out
            while down.alive and down.pending and time.monotonic() < deadline:
                time.sleep(0.01)
        self.closed = True
        if self.admission is not None:
            self.admission.close()
        close_quietly(self.listener)
        for tls in list(self.up.values()):
            close_quietly(tls)

    # -- what the transcript reads ---------------------------------------------------------------------------------

    def accepted(self, t: int, rank: int) -> Accepted | None:
        """The accepted vector of ``rank`` in round t (still held: rounds t and t − 1)."""
        with self.cond:
            return self.inbox.get((t, rank))

    def new_rejections(self) -> list[dict[str, Any]]:
        """The rejections recorded since the last call, counted by group (:mod:`phalanx.distributed.rejections`)."""
        return self.rejections.drain()


class SealedWorkerLinks:
    """A worker's sealed links to rank 0 (see the module's docstring); a :class:`WorkerLinks`."""

    def __init__(self, identity: Identity, host: str, port: int, digest: str, row_bytes: int, workers: int) -> None:
        self.identity = identity
        self.host, self.port = host, port
        self.digest = digest
        self.rank = identity.rank
        self.ctx = client_context(identity)
        self.n = workers
        self.nonce = b""
        self.share = draw()
        """This rank's contribution to the session nonce: drawn once per session (per start of this process), sent in
        the hello of every connection it opens to rank 0 — the same bytes when it opens one again."""
        self.limits = Limits({
            Kind.INIT: 4 * row_bytes + (64 << 20), Kind.THETA: 1 + row_bytes + 8 * workers + 4, Kind.STOP: STOP_BYTES,
            Kind.HONEST: 1 + (workers + 8) * row_bytes + (64 << 20), Kind.REFUSED: STOP_BYTES,
        })
        self.ack_limits = Limits({Kind.ACK: 0, Kind.REFUSED: STOP_BYTES})
        self.down: ssl.SSLSocket | None = None
        self.up: ssl.SSLSocket | None = None
        self.pushed: tuple[Kind, int, bytearray] | None = None

    def _connect(self, link: str) -> ssl.SSLSocket:
        """Open ``link`` to rank 0 (:func:`~phalanx.distributed.admission.dial`: a connection the server sheds or
        resets is tried again until :data:`JOIN_TIMEOUT_S`); its answer — the start snapshot on the downlink,
        ``ACK`` on the uplink — is read here, a refusal is one line."""
        who = f"rank {self.rank}"

        def introduce(tls: ssl.SSLSocket) -> ssl.SSLSocket:
            server = peer_rank(tls, self.identity)
            if server != 0:
                raise PhalanxError(f"{who}: the server at {self.host}:{self.port} holds rank {server}'s key, not "
                                   "rank 0's")
            tls.settimeout(2 * JOIN_TIMEOUT_S)  # (the start snapshot waits for every worker, or the join deadline)
            send_frame(tls, Kind.HELLO, 0, json.dumps({"rank": self.rank, "link": link, "config": self.digest,
                                                       "share": self.share.hex()}).encode())
            try:
                frame = recv_frame(tls, self.limits if link == "down" else self.ack_limits)
            except Closed:
                raise Shed("closed") from None
            except Violation as exc:
                raise PhalanxError(f"{who}: the server answered with {exc.reason}") from None
            if frame[0] == Kind.REFUSED:
                raise PhalanxError(f"{who}: the server refused this rank: {frame[2].decode(errors='replace')}")
            if link == "down":
                if frame[0] != Kind.INIT:
                    raise PhalanxError(f"{who}: a {frame[0].name} frame where the start snapshot was due")
                self.pushed = frame
            tls.settimeout(None)
            return tls

        return dial(self.host, self.port, self.ctx, time.monotonic() + JOIN_TIMEOUT_S, introduce, who=who,
                    timeout=HANDSHAKE_TIMEOUT_S)

    def _next(self) -> tuple[Kind, int, bytearray]:
        if self.pushed is not None:
            frame, self.pushed = self.pushed, None
            return frame
        assert self.down is not None
        kind, t, payload = recv_frame(self.down, self.limits)
        if kind == Kind.REFUSED:
            raise PhalanxError(f"rank {self.rank}: the server refused this rank: {payload.decode(errors='replace')}")
        return kind, t, payload

    def init(self) -> dict[str, Any]:
        self.down = self._connect("down")
        _, _, payload = self._next()  # (the start snapshot, read by _connect)
        init: dict[str, Any] = wire.unpack(bytes(payload))
        try:
            self.nonce = check_init(init, self.rank, self.n, self.share)
        except ValueError as exc:
            close_quietly(self.down)
            raise PhalanxError(f"rank {self.rank}: refused the start snapshot: {exc}") from None
        init.pop("nonce")
        init.pop("contributions")
        return init

    def ready(self) -> None:
        self.up = self._connect("up")

    def next_message(self, t: int) -> tuple[int, bytes | None]:
        while True:
            kind, r, payload = self._next()
            if kind == Kind.STOP:
                return t, bytes(payload)
            if kind == Kind.THETA and r >= t:
                return r, bytes(payload)
            # an honest-vector message of a round this rank no longer serves, or an old θ: not for now

    def send_vector(self, t: int, payload: bytes, report: bytes | None = None) -> None:
        assert self.up is not None, "ready() first"
        kind = Kind.VECTOR
        if report is not None:  # the report ahead of the vector, both signed (the module's docstring)
            kind, payload = Kind.REPORTED_VECTOR, wire.enclose(report, payload)
        digest = hashlib.sha256(payload).digest()
        signature = self.identity.sign(signed_message(self.nonce, self.digest, t, self.rank, digest))
        send_frame(self.up, kind, t, signature + payload)

    def honest(self, t: int) -> bytes | None:
        while True:
            frame = self._next()
            kind, r, payload = frame
            if kind == Kind.HONEST and r == t:
                return bytes(payload)
            if kind in (Kind.THETA, Kind.STOP):  # the round went on without this rank's vector
                self.pushed = frame
                return None


def warn_unsealed(say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> None:
    """The one line a run without keys prints: nothing checks who is speaking."""
    say("no keys: messages are not authenticated — any process that reaches the store can speak for any rank "
        "(fine on one trusted machine; see docs/security.md, `phalanx keys init`)")
