"""The sealed mesh of the serverless and gossip topologies, attacked in one process with real TLS sockets on loopback:
every impostor is refused at the handshake with a recorded reason, a forged address leads only to a refusal, and a
relayed, replayed, foreign-run, redirected, altered, oversized, foreign or cut message is never used — the serverless
rank's collective fails (the round is given up, as a gloo failure), the gossip node counts the message missing at
once.

Every rank is a real :class:`~phalanx.distributed.mesh.Mesh` (rank 0 offers the start snapshot, the others join,
then all connect as the book says); impostors speak the same frames from their own sockets, or sit on the path as
the TCP proxy of ``tests/test_sealed.py``.
"""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tests.test_sealed import Proxy

from phalanx.distributed import mesh as mesh_module
from phalanx.distributed.channel import PHASED_HEADER, PHASED_MAGIC, Kind, client_context, recv_phased, send_phased
from phalanx.distributed.gossip_links import ATTACK, KEEP_ROUNDS, STEP, Inbox, MeshInbox
from phalanx.distributed.keys import Identity, init_keys, load_identity
from phalanx.distributed.mesh import DOMAINS, EVERYONE, Mesh, mesh_message
from phalanx.distributed.serverless import GATHER, RowBox, _CollectiveFailed
from phalanx.errors import PhalanxError

DIGEST = "c0nf1g"
ROW = 64  # bytes of a row's body
N = 4


@pytest.fixture(scope="module")
def keydir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_keys(d / "job", N)
    init_keys(d / "other", N)
    return d


def ident(keydir: Path, rank: int, job: str = "job") -> Identity:
    return load_identity(keydir / job, rank, N)


def mesh(keydir: Path, rank: int, topology: str = "serverless", job: str = "job") -> Mesh:
    return Mesh(ident(keydir, rank, job), topology, DIGEST, N, ("127.0.0.1", 0), row_limit=ROW + 64,
                init_limit=1 << 20, monitor_limit=1 << 16)


def rendezvous(meshes: list[Mesh]) -> None:
    """The rendezvous of a job: every rank joins rank 0 and gets the start snapshot with the book."""
    for m in meshes[1:]:
        m.join(*meshes[0].address)
    assert meshes[0].wait_joins(set(range(1, N)), 20.0) == set(range(1, N))
    meshes[0].offer({"config": DIGEST, "round": 0})
    for m in meshes[1:]:
        assert m.receive_init(20.0) == {"config": DIGEST, "round": 0}


def assemble(meshes: list[Mesh], edit: Callable[[list[Mesh]], None] = lambda m: None) -> None:
    """The rendezvous and the connections of a job, every rank to every other (``edit``: change the books first)."""
    rendezvous(meshes)
    edit(meshes)
    deadline = time.monotonic() + 20.0
    for m in meshes:
        assert m.connect(set(range(N)) - {m.rank}, deadline) == {}
    for m in meshes:
        assert m.wait_incoming(set(range(N)) - {m.rank}, deadline) == set(range(N)) - {m.rank}
        m.ready.set()


@pytest.fixture
def job(keydir: Path) -> Iterator[tuple[list[Mesh], list[RowBox]]]:
    meshes = [mesh(keydir, r) for r in range(N)]
    boxes = [RowBox(0) for _ in range(N)]
    for m, b in zip(meshes, boxes):
        m.sink = b
    assemble(meshes)
    yield meshes, boxes
    for m in meshes:
        m.close(wait_for=set(), timeout=1.0)


def reasons(m: Mesh) -> str:
    return " | ".join(r.reason for r in m.rejections)


def wait_until(cond: Callable[[], bool], m: Mesh) -> None:
    with m.cond:
        assert m.cond.wait_for(cond, 20.0), "timed out: " + reasons(m)


def row(value: int) -> bytes:
    return bytes([value]) * ROW


def frame(identity: Identity, nonce: bytes, t: int, signer: int, body: bytes, frame_round: int, *,
          topology: str = "serverless", to: int = EVERYONE, phase: int = GATHER,
          signed_phase: int | None = None) -> bytes:
    """A ROW frame as a peer would write it, signed by ``identity`` for (t, signer, to, signed_phase)."""
    what = phase if signed_phase is None else signed_phase
    sig = identity.sign(mesh_message(topology, nonce, DIGEST, Kind.ROW, what, t, signer, to,
                                     hashlib.sha256(body).digest()))
    return PHASED_HEADER.pack(PHASED_MAGIC, Kind.ROW, phase, frame_round, 64 + len(body)) + sig + body


# -- serverless ---------------------------------------------------------------------------------------------------

def test_every_rank_hears_every_other_once_with_its_signature(job: tuple[list[Mesh], list[RowBox]]) -> None:
    meshes, boxes = job
    nonce = meshes[0].nonce
    assert nonce is not None and all(m.nonce == nonce for m in meshes)  # one run, one nonce, from rank 0
    for m in meshes:
        m.send([p for p in range(N) if p != m.rank], Kind.ROW, GATHER, 0, row(m.rank))
    for r, box in enumerate(boxes):
        got = box.wait(0, GATHER, [p for p in range(N) if p != r], 20.0)
        assert {p: bytes(a.body) for p, a in got.items()} == {p: row(p) for p in range(N) if p != r}
        acc = got[(r + 1) % N]
        public = ident_public(meshes, (r + 1) % N)
        public.verify(bytes.fromhex(acc.signature), mesh_message("serverless", nonce, DIGEST, Kind.ROW, GATHER, 0,
                                                                 (r + 1) % N, EVERYONE, bytes.fromhex(acc.sha256)))
    assert all(len(m.rejections) == 0 for m in meshes)


def ident_public(meshes: list[Mesh], rank: int) -> Any:
    return meshes[0].identity.allow.public_key(rank)


def _hello(tls: ssl.SSLSocket, hello: dict[str, object]) -> str:
    send_phased(tls, Kind.HELLO, 0, 0, json.dumps(hello).encode())
    from phalanx.distributed.channel import Limits

    kind, _, _, answer = recv_phased(tls, Limits({Kind.REFUSED: 1 << 16, Kind.ACK: 0}))
    return answer.decode() if kind == Kind.REFUSED else "ACK"


def test_impostors_are_refused_at_the_handshake_with_their_reason(keydir: Path,
                                                                  job: tuple[list[Mesh], list[RowBox]]) -> None:
    meshes, _ = job
    target = meshes[3]
    nonce = target.nonce
    assert nonce is not None
    plain = socket.create_connection(target.address)  # no TLS: a row's frame in clear
    plain.sendall(PHASED_HEADER.pack(PHASED_MAGIC, Kind.ROW, GATHER, 0, ROW) + row(9))
    plain.close()
    with pytest.raises((ssl.SSLError, OSError)):  # another job's key: neither end trusts the other
        client_context(ident(keydir, 1, "other")).wrap_socket(socket.create_connection(target.address))

    def tls(rank: int) -> ssl.SSLSocket:
        return client_context(ident(keydir, rank)).wrap_socket(socket.create_connection(target.address))

    answers = [
        _hello(tls(2), {"rank": 1, "config": DIGEST, "nonce": nonce.hex()}),  # rank 2's key claiming rank 1
        _hello(tls(1), {"rank": 1, "config": DIGEST, "nonce": nonce.hex()}),  # a copy of rank 1's key, rank 1 is in
        _hello(tls(1), {"rank": 1, "config": DIGEST, "nonce": "00" * 32}),  # … from another start of the job
        _hello(tls(1), {"rank": 1, "config": "other", "nonce": nonce.hex()}),  # … running another config
    ]
    assert "claims rank 1 with rank 2's key" in answers[0]
    assert "already connected: one connection per rank and run" in answers[1]
    assert "another start of the job" in answers[2]
    assert "runs another config" in answers[3]
    wait_until(lambda: len(target.rejections) >= 6, target)
    assert reasons(target).count("TLS handshake") == 2, reasons(target)
    assert target.rejections[-1].rank == 1
    # rank 3 reported each to rank 0, for the job's transcript
    wait_until(lambda: sum(r.at == 3 for r in meshes[0].rejections) >= 6, meshes[0])


def test_a_forged_address_leads_only_to_a_refusal(keydir: Path) -> None:
    meshes = [mesh(keydir, r) for r in range(N)]
    outsider = mesh(keydir, 2, job="other")
    try:
        for m in meshes[1:]:
            m.join(*meshes[0].address)
        meshes[0].wait_joins(set(range(1, N)), 20.0)
        meshes[0].offer({"config": DIGEST, "round": 0})
        for m in meshes[1:]:
            m.receive_init(20.0)
        meshes[1].book[2] = meshes[3].address  # rank 3 listens there, not rank 2
        meshes[1].book[3] = outsider.address  # a listener whose key is on no list of this job
        failed = meshes[1].connect({2, 3}, time.monotonic() + 10.0)
        assert "holds rank 3's key, not rank 2's" in failed[2]
        assert "did not prove a key of the allow-list" in failed[3]
        assert 2 not in meshes[1].out and 3 not in meshes[1].out
        with pytest.raises(PhalanxError, match="holds rank 1's key, not rank 0's"):
            mesh(keydir, 2).join(*meshes[1].address)  # a forged rank-0 address (the store's key under torchrun)
    finally:
        for m in [*meshes, outsider]:
            m.close(wait_for=set(), timeout=1.0)


def test_replayed_relayed_and_forged_rows_are_rejected_and_fail_the_collective(
    keydir: Path, job: tuple[list[Mesh], list[RowBox]],
) -> None:
    meshes, boxes = job
    nonce = meshes[0].nonce
    assert nonce is not None
    sock = meshes[2].out[1].sock  # rank 2's own connection to rank 1 (its writer thread is idle)
    bad = [
        frame(ident(keydir, 0), nonce, 1, 0, row(0), 1),  # rank 0's signed row, relayed by rank 2
        frame(ident(keydir, 2), nonce, 0, 2, row(2), 1),  # rank 2's own round-0 signature, replayed in round 1
        frame(ident(keydir, 2), b"\x00" * 32, 1, 2, row(2), 1),  # another run's nonce
        frame(ident(keydir, 2), nonce, 1, 2, row(2), 1, topology="gossip", to=1),  # another topology's signature
        frame(ident(keydir, 2), nonce, 1, 2, row(2), 1, signed_phase=1),  # signed for the other phase
    ]
    flipped = bytearray(frame(ident(keydir, 2), nonce, 1, 2, row(2), 2))  # the body changed after signing
    flipped[-1] ^= 1
    for data in [*bad, bytes(flipped)]:
        sock.sendall(data)
    wait_until(lambda: len(meshes[1].rejections) >= 6, meshes[1])
    assert reasons(meshes[1]).count("signature that does not verify") == 6, reasons(meshes[1])
    boxes[1].advance(1)
    with pytest.raises(_CollectiveFailed, match=r"rank 2's row of round 1 was rejected: .*does not verify"):
        boxes[1].wait(1, GATHER, [0, 2, 3], 5.0)  # serverless: a failed collective, the round is given up
    boxes[1].advance(2)
    with pytest.raises(_CollectiveFailed, match="rank 2's row of round 2 was rejected"):
        boxes[1].wait(2, GATHER, [2], 5.0)  # … even if a genuine row of that round came later


def test_the_first_row_of_a_round_counts_and_a_second_is_rejected(job: tuple[list[Mesh], list[RowBox]]) -> None:
    meshes, boxes = job
    meshes[2].send([1], Kind.ROW, GATHER, 0, row(2))
    meshes[2].send([1], Kind.ROW, GATHER, 0, row(7))
    meshes[2].send([1], Kind.ROW, GATHER, 5, row(2))  # a round far ahead
    wait_until(lambda: len(meshes[1].rejections) >= 2, meshes[1])
    assert "second row in round 0" in reasons(meshes[1]) and "round 5, which has not begun" in reasons(meshes[1])
    assert bytes(boxes[1].wait(0, GATHER, [2], 5.0)[2].body) == row(2)


@pytest.mark.parametrize(("data", "reason"), [
    (PHASED_HEADER.pack(PHASED_MAGIC, Kind.ROW, 0, 0, 100 * (64 + ROW + 64)), "more than the"),
    (PHASED_HEADER.pack(PHASED_MAGIC, Kind.INIT, 0, 0, 8) + b"\x00" * 8, "INIT frame, which this end never accepts"),
    (PHASED_HEADER.pack(PHASED_MAGIC, Kind.STOP, 0, 0, 1) + b"X", "STOP frame, which this end never accepts"),
    (PHASED_HEADER.pack(PHASED_MAGIC, Kind.MONITOR, 0, 0, 8) + b"\x00" * 8, "MONITOR frame, which this end never"),
    (PHASED_HEADER.pack(b"JUNK", Kind.ROW, 0, 0, ROW), "magic bytes"),
    (PHASED_HEADER.pack(PHASED_MAGIC, 99, 0, 0, 1), "unknown kind 99"),
    (PHASED_HEADER.pack(PHASED_MAGIC, Kind.ROW, 0, 0, 64 + ROW) + row(1), "cut short"),
], ids=["oversized", "init-from-a-peer", "stop-from-a-peer", "monitor-to-a-peer", "no-magic", "unknown-kind", "cut"])
def test_oversized_foreign_and_cut_frames_close_the_link_unread(
    job: tuple[list[Mesh], list[RowBox]], data: bytes, reason: str,
) -> None:
    meshes, boxes = job
    out = meshes[2].out[1]
    out.sock.sendall(data)
    if reason == "cut short":
        try:
            out.sock.unwrap()  # a clean TLS close in the middle of the frame
        except (ssl.SSLError, OSError):
            pass
    wait_until(lambda: any(r.rank == 2 for r in meshes[1].rejections), meshes[1])
    assert reason in reasons(meshes[1]), reasons(meshes[1])
    wait_until(lambda: 2 not in meshes[1].incoming, meshes[1])  # closed: rank 2 is gone for rank 1
    with pytest.raises(_CollectiveFailed, match="rank 2 left before its row of round 0 came"):
        boxes[1].wait(0, GATHER, [2], 5.0)


@pytest.mark.parametrize("how", ["no-magic", "cut", "mutant-forgets"])
def test_a_peer_closed_for_a_broken_frame_never_connects_again_and_a_cut_is_a_failed_link(
    job: tuple[list[Mesh], list[RowBox]], how: str,
) -> None:
    """A mesh connection is one per rank and run, so a rank closed for a frame that does not frame cannot loop
    (reconnect, send garbage) as it could on the parameter server's uplink: its new connection is refused in one
    line. A frame cut short (a drop) is recorded as a failed connection, not as a break of the protocol. The mutant
    that forgets the closed connection (as if one per rank were per connection) lets it in again."""
    meshes, _ = job
    out, nonce = meshes[2].out[1], meshes[2].nonce
    assert nonce is not None
    if how == "cut":
        out.sock.sendall(frame(meshes[2].identity, nonce, 0, 2, row(2), 0)[:40])  # its header and part of its body
        try:
            out.sock.unwrap()
        except (ssl.SSLError, OSError):
            pass
    else:
        out.sock.sendall(PHASED_HEADER.pack(b"JUNK", Kind.ROW, GATHER, 0, ROW))
    wait_until(lambda: 2 not in meshes[1].incoming and 2 in meshes[1].dead, meshes[1])
    gone = meshes[1].dead[2]
    said = "its connection failed (a frame cut short" if how == "cut" else "it broke the protocol"
    assert gone.startswith(said), gone
    if how == "mutant-forgets":
        with meshes[1].cond:
            meshes[1].heard_from.discard(2)
        meshes[2]._connect(1, *meshes[1].address, {"nonce": nonce.hex()}, time.monotonic() + 20.0)
        return
    with pytest.raises(PhalanxError, match="already connected: one connection per rank and run"):
        meshes[2]._connect(1, *meshes[1].address, {"nonce": nonce.hex()}, time.monotonic() + 20.0)


@pytest.mark.parametrize("how", ["flip", "cut"])
def test_a_flipped_or_cut_byte_on_the_path_never_reaches_the_rule(keydir: Path, how: str) -> None:
    meshes = [mesh(keydir, r) for r in range(N)]
    boxes = [RowBox(0) for _ in range(N)]
    for m, b in zip(meshes, boxes):
        m.sink = b
    proxies: list[Proxy] = []

    def through_proxy(ms: list[Mesh]) -> None:  # rank 2 reaches rank 1 through an on-path attacker
        # its connection's bytes: handshake + hello (well under 4 KB), then the row, which the attacker hits
        proxies.append(Proxy(ms[1].address[1], conn=0, at=6000, how=how))
        ms[2].book[1] = ("127.0.0.1", proxies[0].port)

    try:
        assemble(meshes, through_proxy)
        meshes[2].send([1], Kind.ROW, GATHER, 0, bytes(8000))  # long enough to hold byte 6000 of the connection
        wait_until(lambda: any(r.rank == 2 for r in meshes[1].rejections) or 2 not in meshes[1].incoming, meshes[1])
        with pytest.raises(_CollectiveFailed, match="rank 2"):
            boxes[1].wait(0, GATHER, [2], 5.0)
        assert (0, GATHER, 2) not in boxes[1].rows
    finally:
        for p in proxies:
            p.close()
        for m in meshes:
            m.close(wait_for=set(), timeout=1.0)


# -- gossip -------------------------------------------------------------------------------------------------------

def test_a_rejected_gossip_message_is_missing_at_once_and_the_first_one_counts(keydir: Path) -> None:
    """Node 1 takes local steps from nodes 0 and 2 only (a ring piece); a message that is redirected (signed for
    another node), from a node it does not take steps from, of the wrong length, or a second one, is rejected: the
    inbox stops waiting for it and it is taken as missing — what the node does with any missing message."""
    meshes = [mesh(keydir, r, "gossip") for r in range(N)]
    nodes = []
    for m in meshes:
        nb = SimpleNamespace(rank=m.rank, inputs=[(m.rank - 1) % N, (m.rank + 1) % N], attackers=[],
                             width=ROW, dtype=torch.uint8, inbox=Inbox(), peers=[(m.rank - 1) % N, (m.rank + 1) % N],
                             exp=SimpleNamespace(rounds=100))
        nb.sink = MeshInbox(nb)  # type: ignore[arg-type]
        m.sink = nb.sink
        nodes.append(nb)
    try:
        assemble(meshes)
        nonce = meshes[0].nonce
        assert nonce is not None
        inbox = nodes[1].inbox
        meshes[0].send([1], Kind.ROW, STEP, 0, row(0))
        meshes[0].send([1], Kind.ROW, STEP, 0, row(5))  # a second one
        meshes[3].send([1], Kind.ROW, STEP, 0, row(3))  # not a neighbour of node 1
        meshes[2].send([1], Kind.ROW, STEP, 0, b"\x01" * (ROW - 1))  # wrong length
        redirected = frame(ident(keydir, 2), nonce, 1, 2, row(2), 1, topology="gossip", to=3, phase=STEP)
        meshes[2].flush(1, time.monotonic() + 20.0)  # (its queued row written first: one writer on the socket at once)
        meshes[2].out[1].sock.sendall(redirected)  # signed for node 3, sent to node 1
        wait_until(lambda: len(meshes[1].rejections) >= 4, meshes[1])
        text = reasons(meshes[1])
        assert "second round-0 local step" in text and "which it does not take from it" in text
        assert "has 63 bytes, not 64" in text and "signature that does not verify" in text
        keys = [(0, 0, STEP), (2, 0, STEP), (2, 1, STEP)]
        inbox.wait(keys, time.monotonic() + 20.0)
        # refused: each rejected message is settled as missing (the wait ended on that, not on its deadline)
        assert all(k in inbox.items for k in keys[:1]) and all(k in inbox.refused for k in keys[1:])
        x, meta = inbox.take((0, 0, STEP))
        assert x is not None and bytes(x.numpy()) == row(0) and meta["rank"] == 0  # the first one counts
        assert inbox.take((2, 0, STEP)) == (None, None) and inbox.take((2, 1, STEP)) == (None, None)
        assert DOMAINS["gossip"] != DOMAINS["serverless"]
    finally:
        for m in meshes:
            m.close(wait_for=set(), timeout=1.0)


def test_a_rank_that_sends_different_rows_to_different_peers_stops_the_serverless_run(
    job: tuple[list[Mesh], list[RowBox]],
) -> None:
    """Rank 3 equivocates in round 0 (one row to ranks 0 and 2, another to rank 1): every rank's round-1 row carries
    the digest of the rows it aggregated, so in round 1 each honest rank finds a peer that aggregated other rows than
    it did, and gives the round up — the ranks' models cannot split unnoticed."""
    from concurrent.futures import ThreadPoolExecutor

    from phalanx.distributed.serverless import VIEW_BYTES, AllGather
    from phalanx.training.server import BoundRule
    from phalanx.training.state import RoundAborted

    meshes, boxes = job
    dim = ROW // 4
    exp = SimpleNamespace(workers=N, honest=N, problem=SimpleNamespace(dim=dim), rounds=100)
    gathers = []
    for r in range(3):
        ag = AllGather(None, SimpleNamespace(rank=r), DIGEST, 10.0, "gloo", meshes[r])  # type: ignore[arg-type]
        ag.exp, ag.box, ag.view = exp, boxes[r], b"\x00" * VIEW_BYTES  # type: ignore[assignment]
        ag.me = SimpleNamespace(vector=lambda theta, t: theta.clone(), vector_attack=False,  # type: ignore[assignment]
                                sends_attack=False, attack_gen=torch.Generator())
        gathers.append(ag)
    theta = torch.zeros(dim)
    rule = BoundRule(lambda x: x.mean(dim=0), {})  # type: ignore[arg-type]

    def rank_3(t: int, split: bool) -> None:
        for p in range(3):
            vector = torch.full((dim,), 9 if split and p == 1 else 7, dtype=torch.float32)
            meshes[3].send([p], Kind.ROW, GATHER, t, b"\x00" * VIEW_BYTES + vector.numpy().tobytes())

    with ThreadPoolExecutor(3) as pool:
        rank_3(0, split=True)
        got = [f.result().vectors for f in [pool.submit(ag.exchange, theta, 0, rule) for ag in gathers]]
        assert torch.equal(got[0], got[2]) and not torch.equal(got[0], got[1])  # the split happened
        rank_3(1, split=False)
        futures = [pool.submit(ag.exchange, theta, 1, rule) for ag in gathers]
        for f in futures:
            with pytest.raises(RoundAborted, match="aggregated other rows in round 0"):
                f.result()


# -- availability and bounds (issue 33) -------------------------------------------------------------------------

@pytest.mark.parametrize("budget", ["kept", "mutant"])
def test_a_rank_flooding_bad_rows_is_disconnected_after_the_bounded_number(
    keydir: Path, job: tuple[list[Mesh], list[RowBox]], budget: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 2, with its own key, floods rank 1 with rows signed for another run: rank 1 closes its link at the
    MAX_VIOLATIONS-th (each was checked and recorded, no more). The mutant — a budget that never runs out — checks
    and records every one and keeps reading."""
    from phalanx.distributed import channel

    if budget == "mutant":
        monkeypatch.setattr(mesh_module, "MAX_VIOLATIONS", 10**9)
    meshes, _ = job
    bad = frame(ident(keydir, 2), b"\x00" * 32, 0, 2, row(2), 0)
    try:
        for _ in range(40):
            meshes[2].out[1].sock.sendall(bad)
    except (ssl.SSLError, OSError):
        pass
    if budget == "kept":
        wait_until(lambda: 2 not in meshes[1].incoming, meshes[1])
        assert reasons(meshes[1]).count("does not verify") == channel.MAX_VIOLATIONS
        assert f"closed after {channel.MAX_VIOLATIONS} violations" in reasons(meshes[1])
    else:
        wait_until(lambda: reasons(meshes[1]).count("does not verify") == 40, meshes[1])
        assert 2 in meshes[1].incoming


BAD_REPORTS = ['{"round": Infinity, "rank": 1, "reason": "x"}', '{"round": 1e999, "rank": 1, "reason": "x"}',
               '{"round": NaN, "rank": 1, "reason": "x"}', '{"round": 3.0, "rank": 1, "reason": "x"}',
               '{"round": -1, "rank": 1, "reason": "x"}', '{"round": 99999999999999999999999, "reason": "x"}',
               '[1, 2]']


def _old_parse_report(payload: bytes | bytearray, workers: int) -> tuple[int | None, str, int]:
    """The mutant: the report parsing before issue 33 (``json.loads``, then ``int``)."""
    item = json.loads(payload)
    int(item["round"])
    return item.get("rank"), str(item["reason"]), int(item.get("count", 1))


@pytest.mark.parametrize("parse", ["strict", "mutant"])
def test_a_report_with_non_finite_or_out_of_range_numbers_is_a_violation_not_a_dead_thread(
    job: tuple[list[Mesh], list[RowBox]], parse: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 2 reports rejections to rank 0 with a round of Infinity, 1e999, NaN, 3.0, −1, 10²³ and a list: each is
    a violation, recorded, and rank 0 keeps reading — a genuine report after them is recorded. The mutant (the
    parsing before issue 33) dies on the first: ``int(inf)`` raises OverflowError in rank 0's reader thread."""
    meshes, _ = job
    died: list[BaseException] = []
    if parse == "mutant":
        import threading

        monkeypatch.setattr(mesh_module, "parse_report", _old_parse_report)
        monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    sock = meshes[2].out[0].sock
    for text in BAD_REPORTS:
        sock.sendall(PHASED_HEADER.pack(PHASED_MAGIC, Kind.REPORT, 0, 0, len(text)) + text.encode())
    good = json.dumps({"round": 3, "rank": 1, "reason": "a genuine report"}).encode()
    sock.sendall(PHASED_HEADER.pack(PHASED_MAGIC, Kind.REPORT, 0, 0, len(good)) + good)
    if parse == "mutant":
        deadline = time.monotonic() + 20.0
        while not died and time.monotonic() < deadline:
            time.sleep(0.01)
        assert died and isinstance(died[0], OverflowError)
        assert "a genuine report" not in reasons(meshes[0])
        return
    wait_until(lambda: "a genuine report" in reasons(meshes[0]), meshes[0])
    assert reasons(meshes[0]).count("sent a report that is not one") == len(BAD_REPORTS)
    assert [(r.rank, r.at) for r in meshes[0].rejections if r.reason == "a genuine report"] == [(1, 2)]
    assert 2 in meshes[0].incoming


@pytest.mark.parametrize("confirm", ["kept", "mutant"])
def test_a_rank_that_equivocates_in_the_last_round_stops_the_serverless_run(
    job: tuple[list[Mesh], list[RowBox]], confirm: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 3 sends rank 1 another row than ranks 0 and 2 in the run's last round, and each honest rank the view it
    expects: no next round carries the views, but the last round's view exchange finds that ranks 0 and 1 (and 1 and
    2) aggregated different rows — every honest rank gives the round up. The mutant without the exchange ends with
    rank 1's model split from the others', unnoticed."""
    from concurrent.futures import ThreadPoolExecutor

    from phalanx.distributed.serverless import VIEW, VIEW_BYTES, AllGather
    from phalanx.training.server import BoundRule
    from phalanx.training.state import RoundAborted

    if confirm == "mutant":
        monkeypatch.setattr(AllGather, "_confirm_view", lambda self, mesh, others, t: None)
    meshes, boxes = job
    dim = ROW // 4
    exp = SimpleNamespace(workers=N, honest=N, problem=SimpleNamespace(dim=dim), rounds=1)
    gathers = []
    for r in range(3):
        ag = AllGather(None, SimpleNamespace(rank=r), DIGEST, 10.0, "gloo", meshes[r])  # type: ignore[arg-type]
        ag.exp, ag.box, ag.view = exp, boxes[r], b"\x00" * VIEW_BYTES  # type: ignore[assignment]
        ag.me = SimpleNamespace(vector=lambda theta, t: theta.clone(), vector_attack=False,  # type: ignore[assignment]
                                sends_attack=False, attack_gen=torch.Generator())
        gathers.append(ag)
    theta = torch.zeros(dim)
    honest = hashlib.sha256(b"\x00" * VIEW_BYTES + theta.numpy().tobytes()).digest()
    for p in range(3):
        body = b"\x00" * VIEW_BYTES + torch.full((dim,), 9 if p == 1 else 7, dtype=torch.float32).numpy().tobytes()
        meshes[3].send([p], Kind.ROW, GATHER, 0, body)
        view = hashlib.sha256(honest * 3 + hashlib.sha256(body).digest()).digest()  # what rank p aggregated
        meshes[3].send([p], Kind.ROW, VIEW, 0, view)
    rule = BoundRule(lambda x: x.mean(dim=0), {})  # type: ignore[arg-type]
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(ag.exchange, theta, 0, rule) for ag in gathers]
        if confirm == "mutant":
            got = [f.result().vectors for f in futures]
            assert torch.equal(got[0], got[2]) and not torch.equal(got[0], got[1])  # split, and nobody knows
            return
        for f in futures:
            with pytest.raises(RoundAborted, match=r"aggregated other rows in round 0 \(the last\)"):
                f.result()


@pytest.mark.parametrize("rule", ["least", "mutant"])
def test_one_neighbour_claiming_a_round_far_ahead_does_not_make_a_node_sit_out(
    rule: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node r waits for two receivers; the Byzantine one signs a row of round 10⁹ (and of the round it likes), the
    honest one is in step: r is not behind. The far-ahead row is not kept. The mutant — the most advanced peer
    decides, as before issue 33 — makes r sit every round out."""
    if rule == "mutant":
        monkeypatch.setattr(Inbox, "ahead", lambda self, peers: max((self.newest.get(k, -1) for k in peers),
                                                                    default=-1))
    inbox = Inbox()
    inbox.advance(5)
    assert inbox.put(1, 5, STEP, torch.zeros(2))  # the honest receiver, in step
    assert inbox.put(2, 10**9, STEP, torch.zeros(2))  # the Byzantine one
    assert (2, 10**9, STEP) not in inbox.items
    behind = inbox.ahead([1, 2]) >= 5 + 2
    assert behind is (rule == "mutant")


@pytest.mark.parametrize("rule", ["all of them", "mutant"])
def test_a_far_ahead_claim_before_an_honest_peers_first_message_does_not_make_a_node_sit_out(
    rule: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh inbox (round 0, or the first round after a resume): the Byzantine receiver's message tagged far
    ahead comes before the honest receiver's first one. The honest peer has sent nothing, so it is not ahead, and
    the node is not behind. The mutant — the minimum over the peers that sent anything, as before — makes the
    Byzantine claim all of it (a review)."""
    if rule == "mutant":
        monkeypatch.setattr(Inbox, "ahead", lambda self, peers: min(
            (self.newest[k] for k in peers if k in self.newest), default=-1))
    inbox = Inbox()
    inbox.advance(0)
    inbox.put(2, 10_000, ATTACK, torch.zeros(3))
    assert inbox.behind([1, 2], 0, 1) is (rule == "mutant")
    inbox.put(1, 0, STEP, torch.zeros(3))  # the honest receiver, in step
    assert not inbox.behind([1, 2], 0, 1)


@pytest.mark.parametrize("rule", ["more than f", "mutant"])
def test_f_byzantine_receivers_alone_never_keep_a_node_out(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's honest receiver was lost; its one remaining receiver (f = 1) is Byzantine and claims round
    t + 16 every round. Fewer than f + 1 peers cannot vouch for the node being behind: it steps every round. The
    mutant (no count) keeps it out of 20 rounds of 20, as a review measured."""
    if rule == "mutant":
        monkeypatch.setattr(Inbox, "behind", lambda self, waiting, t, f: self.ahead(waiting) >= t + 2)
    inbox = Inbox()
    sat_out = 0
    for t in range(20):
        inbox.advance(t)
        inbox.put(2, t + KEEP_ROUNDS, ATTACK, torch.zeros(3))
        sat_out += inbox.behind([2], t, 1)
    assert sat_out == (20 if rule == "mutant" else 0)
    # with f = 0 (no Byzantine peer configured) one receiver ahead is enough, as before
    assert inbox.behind([2], 19, 0)


def test_a_gossip_row_beyond_the_runs_last_round_is_a_violation(keydir: Path) -> None:
    m = SimpleNamespace(round=0)
    nb = SimpleNamespace(rank=1, inputs=[0, 2], attackers=[], width=ROW, dtype=torch.uint8, inbox=Inbox(),
                         peers=[0, 2], mesh=m, exp=SimpleNamespace(rounds=10))
    sink = MeshInbox(nb)  # type: ignore[arg-type]
    problem = sink.signed(0, Kind.ROW, STEP, 2**63, bytearray(row(0)), b"", b"")
    assert problem is not None and "beyond the run's last (9)" in problem
    assert (0, 2**63, STEP) in nb.inbox.refused and nb.inbox.newest == {}
