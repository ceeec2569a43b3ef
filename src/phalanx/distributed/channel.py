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
make another allocate more than one message's worth.
"""

from __future__ import annotations

import enum
import socket
import ssl
import struct
from dataclasses import dataclass

from phalanx.distributed.keys import Identity

MAGIC = b"PHX1"
HEADER = struct.Struct(">4sBQQ")
HANDSHAKE_TIMEOUT_S = 20.0
"""A connection must finish its TLS handshake and introduce itself within this long (an idle outsider cannot hold a
connection slot)."""


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


class Violation(Exception):
    """The peer broke the protocol (a frame too large, of an unknown kind, with a bad header, or cut short): what it
    sent is not used, and the connection is closed."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Limits:
    """The most bytes each kind of frame may hold (a frame over its kind's limit is refused unread)."""

    sizes: dict[Kind, int]

    def check(self, kind: int, length: int) -> Kind:
        """The frame's kind, if this end accepts it and ``length`` is within its limit; else :class:`Violation`."""
        try:
            k = Kind(kind)
        except ValueError:
            raise Violation(f"a frame of unknown kind {kind}") from None
        limit = self.sizes.get(k)
        if limit is None:
            raise Violation(f"a {k.name} frame, which this end never accepts")
        if length > limit:
            raise Violation(f"a {k.name} frame of {length} bytes, more than the {limit} it can hold")
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
                raise Violation("a frame cut short: the connection closed in the middle of it")
            raise Closed("the connection closed")
        got += k
    return buf


def recv_frame(sock: socket.socket, limits: Limits) -> tuple[Kind, int, bytearray]:
    """One frame: (kind, round, payload). :class:`Violation` for a bad header or size (checked before the payload
    is read); ``ssl.SSLError`` / ``OSError`` for a connection that failed (tampering included: TLS refuses a record
    whose authentication tag does not match)."""
    magic, kind, round_, length = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if magic != MAGIC:
        raise Violation("a frame without the protocol's magic bytes")
    k = limits.check(kind, length)
    try:
        return k, round_, _recv_exact(sock, length) if length else bytearray()
    except Closed:
        raise Violation(f"a {k.name} frame cut short: the connection closed after its header") from None
