"""Every rank's share of a keyed session's nonce (issue 36): rank 0 no longer draws it alone (parameter server, mesh).

Every worker rank r draws 32 fresh random bytes ``c_r`` (:func:`draw`, ``secrets.token_bytes``) once per session —
per start of its process — and sends them in the hello of its (TLS-authenticated, identity-checked) links to rank 0;
a connection it opens again within the session carries the same bytes. Rank 0 draws its own ``c_0``, waits for every
expected worker's contribution (at most the join timeout), and fixes the session's nonce

    nonce = SHA-256(DOMAIN ‖ s_0 ‖ s_1 ‖ … ‖ s_{n−1}),   s_r = 0x01 ‖ c_r,  or 0x00 × 33 when rank r's is absent

(:func:`derive`; ranks in order, every slot 33 bytes, so no two lists of contributions give one input). The start
snapshot (``INIT``) carries the list; each worker checks that its own ``c_r`` is there, unchanged, and that the nonce
follows from the list (:func:`check_init`) — else it stops in one line. A rank 0 that reuses another run's nonce
must then find SHA-256 preimages: every honest worker's fresh ``c_r`` is inside. The transcript's session line
carries the list (:func:`as_json`), and ``phalanx audit`` recomputes each session's nonce from it
(:func:`session_problem`). A session line without the list (a transcript written before this) is read as before and
counted as *not contributed*.

The sealed mesh (serverless, gossip: :mod:`phalanx.distributed.mesh`) uses the same function: every rank r ≠ 0 sends
its ``c_r`` in the introduction of its (identity-checked) connection to rank 0, rank 0 fixes the nonce (:func:`fix`)
from the ranks that joined when it sends the start snapshot, and each rank checks the snapshot with
:func:`check_init` before it signs anything.

No cryptography of Phalanx's own beyond SHA-256 over this domain-separated concatenation (RFC 6234's hash).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

SHARE_BYTES = 32
"""The length of every contribution (checked exactly before it is used)."""
DOMAIN = b"phalanx/session-nonce/v1\x00"
PRESENT, ABSENT = b"\x01", b"\x00" * (1 + SHARE_BYTES)
"""A slot of :func:`derive`: ``0x01 ‖ c_r`` for a contribution, the fixed marker ``0x00 × 33`` for an absent one."""
_HEX = re.compile(r"[0-9a-f]{64}")


def draw() -> bytes:
    """One contribution: 32 fresh random bytes."""
    return secrets.token_bytes(SHARE_BYTES)


def derive(shares: list[bytes | None]) -> bytes:
    """The session nonce of ``shares`` (index r: rank r's contribution, None when absent; rank 0's first)."""
    h = hashlib.sha256(DOMAIN)
    for share in shares:
        if share is None:
            h.update(ABSENT)
        else:
            if len(share) != SHARE_BYTES:
                raise ValueError(f"a contribution of {len(share)} bytes, not {SHARE_BYTES}")
            h.update(PRESENT + share)
    return h.digest()


def fix(own: bytes, got: dict[int, bytes], n: int) -> tuple[list[bytes | None], bytes]:
    """Rank 0 fixes the session's nonce: the list (rank 0's ``own`` first, then ``got[r]`` for r = 1 … n−1, None for a
    rank whose contribution did not come) and :func:`derive` of it (its callers pass both through the test hook
    :func:`phalanx.distributed._test_hooks.nonce_mutant`: unchanged unless ``PHALANX_TEST_NONCE`` is set)."""
    shares: list[bytes | None] = [own, *(got.get(r) for r in range(1, n))]
    return shares, derive(shares)


def too_late(rank: int) -> str:
    """Why rank 0 refuses a rank that introduces itself after the nonce was fixed (its contribution could not count)."""
    return f"rank {rank} came after the session nonce was fixed without its contribution; it is missing this session"


def parse_hex(value: Any) -> bytes:
    """A contribution sent as 64 lowercase hex characters (a worker's hello); ValueError otherwise."""
    if not (isinstance(value, str) and len(value) == 2 * SHARE_BYTES and _HEX.fullmatch(value)):
        raise ValueError(f"its contribution to the session nonce is not {SHARE_BYTES} bytes in hex")
    return bytes.fromhex(value)


def share_problem(value: Any) -> str | None:
    """Why ``value`` (from a mesh rank's introduction) is not a contribution in hex (:func:`parse_hex`), or None."""
    try:
        parse_hex(value)
    except ValueError as exc:
        return str(exc)
    return None


def as_json(shares: list[bytes | None]) -> list[str | None]:
    """The list as a session line holds it (hex or null, rank order)."""
    return [None if s is None else s.hex() for s in shares]


def check_init(init: dict[str, Any], rank: int, n: int, mine: bytes) -> bytes:
    """A worker's check of rank 0's start snapshot: its ``contributions`` are n slots, rank 0's and rank ``rank``'s
    own (``mine``, unchanged) present, every present one 32 bytes, and its ``nonce`` is :func:`derive` of them. The
    nonce, or ValueError saying what is wrong (the worker stops in one line)."""
    shares, nonce = init.get("contributions"), init.get("nonce")
    if not isinstance(shares, list) or len(shares) != n:
        raise ValueError(f"the start snapshot does not carry the {n} contributions to the session nonce")
    if not all(s is None or (isinstance(s, bytes) and len(s) == SHARE_BYTES) for s in shares) or shares[0] is None:
        raise ValueError(f"the start snapshot's contributions are not {SHARE_BYTES} bytes each (rank 0's present)")
    if shares[rank] != mine:
        what = "absent" if shares[rank] is None else "altered"
        raise ValueError(f"this rank's contribution to the session nonce is {what} in the start snapshot")
    if not isinstance(nonce, bytes) or nonce != derive(shares):
        raise ValueError("the session nonce does not follow from the contributions (SHA-256 of them): rank 0 chose "
                         "it alone")
    return nonce


def session_problem(rec: dict[str, Any], n: int) -> str | None:
    """The audit's check of a session line that carries ``contributions``: n slots of hex or null, rank 0's present,
    and the line's nonce :func:`derive` of them; a problem line, or None."""
    raw = rec["contributions"]
    start = rec.get("from_round")
    if not isinstance(raw, list) or len(raw) != n:
        return f"the session from round {start} does not list the {n} ranks' contributions to its nonce"
    try:
        shares = [None if s is None else parse_hex(s) for s in raw]
    except ValueError:
        return f"the session from round {start} lists a contribution that is not {SHARE_BYTES} bytes in hex"
    if shares[0] is None:
        return f"the session from round {start} lists no contribution of rank 0"
    if derive(shares).hex() != rec["nonce"]:
        return (f"the session from round {start} has a nonce that does not follow from its contributions "
                "(SHA-256 of them): rank 0 chose it alone")
    return None
