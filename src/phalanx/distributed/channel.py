"""Sealed, authenticated links between the ranks of a keyed job: mutual TLS 1.3 with pinned certificates, and framed
messages whose size is checked before they are read.

Why TLS: it is the standard construction for exactly this — both ends prove their key (the certificate is checked
against the job's allow-list, :mod:`phalanx.distributed.keys`), every byte after the handshake is encrypted and
authenticated (AEAD: AES-256-GCM or ChaCha20-Poly1305, negotiated by OpenSSL), the keys of each connection are fresh
(ephemeral X25519), so a recorded message can be replayed neither into another connection nor into another run, and a
flipped, dropped or inserted byte ends the connection instead of reaching the reader. Python's ``ssl`` (OpenSSL) does
all of it; Phalanx adds no cryptography of its own (docs/security.md, docs/dependencies.md).

A frame is ``MAGIC (4 bytes) · kind (1) · round (8) · length (8)`` followed by ``length`` bytes. The receiver knows
the most each kind can hold (:class:`Limits`) and refuses a larger length *before* reading the payload: a peer cannot
make another allocate more than one message's worth. The sealed mesh of the serverless and gossip topologies
(:mod:`phalanx.distributed.mesh`) adds the message's phase to the header: ``PHASED_MAGIC · kind (1) · phase (1) ·
round (8) · length (8)`` (:func:`send_phased`, :func:`recv_phased`), with the same checks.
"""

from __future__ import annotations

import enum
import json
import math
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import Any

from phalanx.distributed.keys import Identity

MAGIC = b"PHX1"
HEADER = struct.Struct(">4sBQQ")
PHASED_MAGIC = b"PHM1"
PHASED_HEADER = struct.Struct(">4sBBQQ")
HANDSHAKE_TIMEOUT_S = 10.0
"""How long a connecting rank waits for its TCP connection and TLS handshake (the listening end gives a connection
:data:`~phalanx.distributed.admission.ADMIT_DEADLINE_S` to introduce itself)."""
MAX_VIOLATIONS = 8
"""A listed peer's connection is closed at its this-many-th violation — a frame that framed correctly but must not be
used (no signature, one that does not verify, a second row of a round, a round far out of range, a malformed report)
— so a peer cannot make a rank check bad frames forever. A frame that does not frame closes the connection at once:
a complete header that is wrong (:class:`Malformed`: the peer's own doing — rank 0 also bars the uplink for the
session), or a frame the connection's end cut short (:class:`Cut`: a drop, never held against the peer)."""


class Kind(enum.IntEnum):
    """What a frame carries."""

    HELLO = 1
    """worker → server: its rank and config digest (JSON)"""
    INIT = 2
    """server → worker: the run's start snapshot for that rank"""
    THETA = 3
    """server → worker: θ of round t"""
    STOP = 4
    """server → worker: stop, with the reason"""
    HONEST = 5
    """server → Byzantine worker: the honest vectors of round t (and the server's context)"""
    VECTOR = 6
    """worker → server: the rank's signed vector of round t"""
    REFUSED = 7
    """server → connecting peer: why it is not let in (then the connection closes)"""
    ROW = 8
    """mesh: a rank's signed row of round t and phase p (serverless: its vector, or a Byzantine rank's row; gossip:
    a local step, or a Byzantine node's message)"""
    MONITOR = 9
    """mesh, rank r → rank 0: its signed rows of the run's state after an evaluation or checkpoint round (gossip)"""
    BYE = 10
    """mesh: the sender's last frame on this connection (it ended the run)"""
    ACK = 11
    """the receiving end let the connecting peer in (its only frame on a mesh connection or a worker's uplink)"""
    REPORT = 12
    """mesh, rank r → rank 0: what rank r rejected (JSON), for rank 0's transcript"""
    REPORTED_VECTOR = 13
    """worker → server, in a run whose worker stages report: the rank's signed vector of round t with its worker-stage
    report ahead of it (:func:`~phalanx.distributed.wire.enclose`), both under the signature; a server of an earlier
    release refuses the kind (one line: "a frame of unknown kind 13")"""


class Violation(Exception):
    """The peer broke the protocol (a frame too large, of an unknown kind, with a bad header, or cut short): what it
    sent is not used, and the connection is closed."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Malformed(Violation):
    """A *complete* header that is wrong: without the magic, of an unknown kind, of a kind this end never accepts from
    this peer, or longer than its kind's limit.

    Why this is held against the peer (and a :class:`Cut` is not): inside TLS every byte read is a byte the peer's own
    process wrote — the record layer's AEAD tag refuses a flipped, inserted or reordered byte (RFC 8446 §5.2), and
    what the path can still do is end the stream, which shows as a cut, never as other bytes. A genuine rank's code
    writes only headers of the kinds its link carries, with lengths its config (the digest checked at its
    introduction) bounds. So a complete wrong header is proof of the sender's intent, with no honest mishap to
    forgive — unlike a frame that frames but must not be used, which rank 0 checks up to
    :data:`MAX_VIOLATIONS` times per link. Rank 0 therefore bars the rank's uplink for the session at the first one
    (:meth:`~phalanx.distributed.sealed.SealedLinks._read_up`) rather than counting it as one violation: counting
    would need a tally kept across connections and would buy the rank ``MAX_VIOLATIONS`` handshakes, reader threads
    and session-share checks per session instead of one, for no honest rank's benefit."""


class Cut(Violation):
    """The connection ended in the middle of a frame (after part of its header, or after its header and part of its
    body): what a network drop, a reset or a crashed peer looks like. The frame is not used and the connection is
    closed, but nothing is held against the peer: a link lost this way may be opened again, as one lost between two
    frames (:class:`Closed`)."""


@dataclass(frozen=True)
class Limits:
    """The most bytes each kind of frame may hold (a frame over its kind's limit is refused unread)."""

    sizes: dict[Kind, int]

    def check(self, kind: int, length: int) -> Kind:
        """The frame's kind, if this end accepts it and ``length`` is within its limit; else :class:`Violation`."""
        try:
            k = Kind(kind)
        except ValueError:
            raise Malformed(f"a frame of unknown kind {kind}") from None
        limit = self.sizes.get(k)
        if limit is None:
            raise Malformed(f"a {k.name} frame, which this end never accepts")
        if length > limit:
            raise Malformed(f"a {k.name} frame of {length} bytes, more than the {limit} it can hold")
        return k


def _context(identity: Identity, server: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # identity is the pinned certificate, not a host name
    ctx.verify_mode = ssl.CERT_REQUIRED  # both ends (mutual TLS)
    if server:
        # No session tickets: nothing is resumed, and an uplink (which its worker never reads) must hold no unread
        # bytes — a socket closed with unread data is reset, and a reset can lose the worker's last vector in flight.
        ctx.num_tickets = 0
    with identity.chain_files() as (cert, key):
        ctx.load_cert_chain(cert, key)
    with identity.allow.trust_file() as trusted:
        ctx.load_verify_locations(trusted)
    return ctx


def server_context(identity: Identity) -> ssl.SSLContext:
    """TLS 1.3, this rank's certificate, client certificates required and checked against the allow-list."""
    return _context(identity, server=True)


def client_context(identity: Identity) -> ssl.SSLContext:
    """TLS 1.3, this rank's certificate, the server's certificate checked against the allow-list."""
    return _context(identity, server=False)


def peer_rank(sock: ssl.SSLSocket, identity: Identity) -> int | None:
    """The rank the other end's certificate speaks for (None: not on the allow-list)."""
    return identity.allow.rank_of(sock.getpeercert(binary_form=True))


def send_frame(sock: socket.socket, kind: Kind, round_: int, payload: bytes | bytearray | memoryview = b"") -> None:
    """Send one frame (header, then payload)."""
    sock.sendall(HEADER.pack(MAGIC, int(kind), round_, len(payload)))
    if len(payload):
        sock.sendall(payload)


class Closed(Violation):
    """The peer closed the connection between two frames (it left; nothing it sent was lost)."""


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if k == 0:
            if got:
                raise Cut("a frame cut short: the connection closed in the middle of it")
            raise Closed("the connection closed")
        got += k
    return buf


def send_phased(sock: socket.socket, kind: Kind, phase: int, round_: int,
                payload: bytes | bytearray | memoryview = b"") -> None:
    """Send one mesh frame (header with the phase, then payload)."""
    sock.sendall(PHASED_HEADER.pack(PHASED_MAGIC, int(kind), phase, round_, len(payload)))
    if len(payload):
        sock.sendall(payload)


def recv_phased(sock: socket.socket, limits: Limits) -> tuple[Kind, int, int, bytearray]:
    """One mesh frame: (kind, phase, round, payload), checked as :func:`recv_frame` checks a frame."""
    magic, kind, phase, round_, length = PHASED_HEADER.unpack(_recv_exact(sock, PHASED_HEADER.size))
    if magic != PHASED_MAGIC:
        raise Malformed("a frame without the protocol's magic bytes")
    k = limits.check(kind, length)
    try:
        return k, phase, round_, _recv_exact(sock, length) if length else bytearray()
    except Closed:
        raise Cut(f"a {k.name} frame cut short: the connection closed after its header") from None


def recv_frame(sock: socket.socket, limits: Limits) -> tuple[Kind, int, bytearray]:
    """One frame: (kind, round, payload). :class:`Violation` for a bad header or size (checked before the payload
    is read); ``ssl.SSLError`` / ``OSError`` for a connection that failed (tampering included: TLS refuses a record
    whose authentication tag does not match)."""
    magic, kind, round_, length = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if magic != MAGIC:
        raise Malformed("a frame without the protocol's magic bytes")
    k = limits.check(kind, length)
    try:
        return k, round_, _recv_exact(sock, length) if length else bytearray()
    except Closed:
        raise Cut(f"a {k.name} frame cut short: the connection closed after its header") from None


def why(exc: BaseException) -> str:
    """An exception's reason in a few words, for a rejection record (at most 160 characters)."""
    text = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    return str(text)[:160]


def close_quietly(sock: socket.socket) -> None:
    """Close a socket that may be closed or broken already."""
    try:
        sock.close()
    except OSError:
        pass


def strict_json(data: bytes | bytearray) -> Any:
    """JSON as the protocol writes it: ``NaN``, ``Infinity`` and numbers that overflow to them are refused
    (``ValueError``), so a peer cannot slip a non-finite number into a field that is later made an integer."""

    def constant(name: str) -> float:
        raise ValueError(f"{name} is not a number the protocol sends")

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{text[:20]} is not a finite number")
        return value

    return json.loads(data, parse_constant=constant, parse_float=finite)
