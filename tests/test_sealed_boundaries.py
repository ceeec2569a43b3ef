"""Sealed links at the edges of their checks (split from ``tests/test_sealed.py``, which holds the fixtures): a
vector frame one byte over its kind's limit is refused unread while one exactly at the limit is read, and a
signature binds the run's config digest as well as its nonce, round and rank.

These kill mutants that the campaign's far-off cases let through (an auditor's review): a vector limit ten times too
large (the oversized case claims 100 × the limit), and a signed message that omits the config digest (every forged
case there changes the nonce, the round or the body, never the config).
"""

from __future__ import annotations

import hashlib
import os
import ssl
from pathlib import Path

import pytest

import test_sealed
from phalanx.distributed import wire
from phalanx.distributed.channel import HEADER, MAGIC, Kind
from phalanx.distributed.sealed import ATTACK_STATE_BYTES, SIGNATURE_BYTES, SealedLinks, signed_message
from test_sealed import DIGEST, ROW, ident, reasons, row, wait, worker

LIMIT = SIGNATURE_BYTES + ROW + ATTACK_STATE_BYTES
"""The most bytes a VECTOR frame may hold: a signature, one row, the attack's state."""

keydir, server = test_sealed.keydir, test_sealed.server  # the fixtures: a job's keys, rank 0's links


@pytest.mark.parametrize("length", [LIMIT + 1, LIMIT], ids=["one byte over", "exactly at"])
def test_a_vector_frame_one_byte_over_its_limit_is_refused_and_one_at_it_is_read(
    keydir: Path, server: SealedLinks, length: int,
) -> None:
    """docs/security.md: frames over their kind's size are refused unread. The whole frame is sent either way, so a
    limit set too high would read the frame over it and reject it for its signature instead."""
    w1 = worker(keydir, server, 1)
    server.publish_theta(0, wire.THETA + row(0))
    assert w1.up is not None
    w1.up.sendall(HEADER.pack(MAGIC, Kind.VECTOR, 0, length))
    try:
        w1.up.sendall(os.urandom(length))
    except (ssl.SSLError, OSError):  # the server closed the link after the header: the frame was not read
        assert length > LIMIT
    wait(lambda: len(server.rejections) >= 1, server)
    said = reasons(server)
    if length > LIMIT:
        assert f"a VECTOR frame of {length} bytes, more than the {LIMIT}" in said, said
        wait(lambda: 1 not in server.up, server)  # the link is closed unread
    else:
        assert "more than the" not in said and "signature" in said, said  # read, then refused for what it holds
    assert (0, 1) not in server.inbox


def test_a_vector_signed_under_another_config_digest_is_rejected(keydir: Path, server: SealedLinks) -> None:
    """docs/security.md: a worker's signature covers the run's nonce, config, round and rank. Right nonce, round,
    rank and key, over another config's digest: it does not verify, and the worker's genuine vector still gets in."""
    w1 = worker(keydir, server, 1)
    server.publish_theta(0, wire.THETA + row(0))
    assert w1.up is not None
    body = row(1)
    sig = ident(keydir, 1).sign(signed_message(server.nonce, DIGEST + "-other", 0, 1, hashlib.sha256(body).digest()))
    w1.up.sendall(HEADER.pack(MAGIC, Kind.VECTOR, 0, len(sig) + len(body)) + sig + body)
    wait(lambda: len(server.rejections) >= 1 or (0, 1) in server.inbox, server)
    assert (0, 1) not in server.inbox, "a vector signed under another config was accepted"
    assert "signature that does not verify" in reasons(server), reasons(server)
    w1.send_vector(0, row(1))
    got = server.collect(0, [1], set(), 20.0)
    assert {r: bytes(v) for r, v in got.items()} == {1: row(1)}
