"""Joining the sealed mesh, attacked: rank 0 dials a rank back only at the address it connected from, a rank that
stalls the dial-back delays the start boundedly, a rank that left — before rank 0 dialled it back, or before a peer
dialled it — is given up at the first refused connection, and a listed rank holds at most two admissions at once.
Real :class:`~phalanx.distributed.mesh.Mesh` objects on loopback, as in ``tests/test_mesh.py`` (whose helpers these
use)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from tests.test_mesh import DIGEST, N, _hello, ident, keydir, mesh, reasons, rendezvous, wait_until

from phalanx.distributed import mesh as mesh_module
from phalanx.distributed.channel import Kind, client_context, send_phased

__all__ = ["keydir"]

DIAL_BACK_S = 10.0
"""rank 0's dial-back bound in these tests (the code's is longer): the honest ranks 1 and 3, in this process, must
finish connecting within it while a loaded machine may deschedule them — 2 s was thin (a flaky-test review); still
far below the waits the tests bound (20 s)."""


@pytest.mark.parametrize("check", ["kept", "mutant"])
def test_rank_0_dials_back_only_the_address_a_rank_connected_from(
    keydir: Path, check: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1 (its own key) says it listens on 10.0.0.1:22 and on 127.0.0.2, connecting from 127.0.0.1: rank 0
    refuses both, so it never dials an arbitrary host:port for a rank. The mutant — any address taken — records
    10.0.0.1:22 as rank 1's, to be dialled."""
    if check == "mutant":
        monkeypatch.setattr(mesh_module, "claimed_address", lambda listen, addr: None)
    m0 = mesh(keydir, 0)
    try:
        answers = []
        for host, port in (("10.0.0.1", 22), ("127.0.0.2", 40000)):
            tls = client_context(ident(keydir, 1)).wrap_socket(socket.create_connection(m0.address))
            answers.append(_hello(tls, {"rank": 1, "config": DIGEST, "listen": [host, port], "share": "ab" * 32}))
            tls.close()
            if check == "mutant":
                break
        if check == "mutant":
            assert answers == ["ACK"] and m0.joined[1] == ("10.0.0.1", 22)
        else:
            assert all("not on 127.0.0.1, the address it connected from" in a for a in answers), answers
            assert m0.joined == {}
    finally:
        m0.close(wait_for=set(), timeout=1.0)


def test_a_rank_that_stalls_rank_0s_dial_back_delays_the_start_boundedly(
    keydir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 2 (its own key) joins, saying it listens on a port that accepts TCP and never answers the handshake:
    rank 0 dials every rank back at once, gives rank 2 up at DIAL_BACK_S, and ranks 1 and 3 get the start snapshot
    with rank 2 out of the book — one stalled rank cannot hold the others' start for longer."""
    monkeypatch.setattr(mesh_module, "DIAL_BACK_S", DIAL_BACK_S)
    stall = socket.create_server(("127.0.0.1", 0))  # never accepts: connections wait in its backlog, unanswered
    m0, m1, m3 = mesh(keydir, 0), mesh(keydir, 1), mesh(keydir, 3)
    tls = client_context(ident(keydir, 2)).wrap_socket(socket.create_connection(m0.address))
    try:
        assert _hello(tls, {"rank": 2, "config": DIGEST, "listen": ["127.0.0.1", stall.getsockname()[1]],
                            "share": "ab" * 32}) == "ACK"
        m1.join(*m0.address)
        m3.join(*m0.address)
        assert m0.wait_joins({1, 2, 3}, 20.0) == {1, 2, 3}
        m0.offer({"config": DIGEST, "round": 0})
        assert set(m0.book) == {0, 1, 3}
        for m in (m1, m3):
            assert m.receive_init(20.0) == {"config": DIGEST, "round": 0} and set(m.book) == {0, 1, 3}
        assert any(r.rank == 2 and "could not reach" in r.reason for r in m0.rejections), reasons(m0)
    finally:
        tls.close()
        stall.close()
        for m in (m0, m1, m3):
            m.close(wait_for=set(), timeout=1.0)


def counted_dials(monkeypatch: pytest.MonkeyPatch, policy: str) -> list[int]:
    """The ports every TCP connection of the mesh's dials goes to, in order (the list fills as they happen); with
    ``policy == "mutant"`` the mesh dials as before this was fixed: a refused connection is tried again."""
    from phalanx.distributed import admission

    tries: list[int] = []
    connect = admission.socket.create_connection

    def counted(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        tries.append(address[1])
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(admission.socket, "create_connection", counted)
    if policy == "mutant":
        dial = mesh_module.dial
        monkeypatch.setattr(mesh_module, "dial", lambda *a, **k: dial(*a, **{**k, "gone_if_refused": False}))
    return tries


@pytest.mark.parametrize("policy", ["kept", "mutant"])
def test_rank_0_gives_up_a_joined_rank_whose_listener_closed_at_the_first_refusal(
    keydir: Path, policy: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 2 joins, saying it listens on a port whose listener has since closed: rank 0's dial-back is refused and
    rank 2 is out of the book at that first refusal (it listened there when it joined: nothing there now means it
    left), not retried for DIAL_BACK_S while ranks 1 and 3 wait for their start. Mutant: the former retrying."""
    monkeypatch.setattr(mesh_module, "DIAL_BACK_S", DIAL_BACK_S)
    tries = counted_dials(monkeypatch, policy)
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    m0, m1, m3 = mesh(keydir, 0), mesh(keydir, 1), mesh(keydir, 3)
    tls = client_context(ident(keydir, 2)).wrap_socket(socket.create_connection(m0.address))
    try:
        assert _hello(tls, {"rank": 2, "config": DIGEST, "listen": ["127.0.0.1", port], "share": "ab" * 32}) == "ACK"
        m1.join(*m0.address)
        m3.join(*m0.address)
        assert m0.wait_joins({1, 2, 3}, 20.0) == {1, 2, 3}
        m0.offer({"config": DIGEST, "round": 0})
        assert set(m0.book) == {0, 1, 3}
        said = [r.reason for r in m0.rejections if r.rank == 2]
        if policy == "kept":
            assert tries.count(port) == 1 and any("nothing listens" in r for r in said), (tries, said)
        else:
            assert tries.count(port) > 1 and any("in time" in r for r in said), (tries, said)
    finally:
        tls.close()
        for m in (m0, m1, m3):
            m.close(wait_for=set(), timeout=1.0)


@pytest.mark.parametrize("policy", ["kept", "mutant"])
def test_a_rank_that_left_before_a_peer_dialled_it_is_given_up_at_the_first_refusal(
    keydir: Path, policy: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 3 is in the book (rank 0 reached it) and leaves before rank 1 dials it: the refused connection is final
    at the first try — rank 1 does not retry until its deadline (the join timeout in a job), which held a gossip node
    out of round 0 for 120 s when a rank it sends to died, long enough for its own neighbours to miss its first
    message. Mutant: the former policy (retry a refusal) keeps dialling the closed port until the deadline."""
    tries = counted_dials(monkeypatch, policy)
    meshes = [mesh(keydir, r, "gossip") for r in range(N)]
    try:
        rendezvous(meshes)
        port = meshes[1].book[3][1]
        meshes[3].close(wait_for=set(), timeout=1.0)
        tries.clear()
        failed = meshes[1].connect({3}, time.monotonic() + 2.0)
        assert set(failed) == {3}
        # gone: rank 1 does not wait for rank 3's own connection either (it held the node as long as the refusals)
        assert not meshes[1].alive(3) and meshes[1].wait_incoming({3}, time.monotonic() + 600.0) == set()
        if policy == "kept":
            assert tries.count(port) == 1 and "nothing listens" in failed[3], (tries, failed)
        else:
            assert tries.count(port) > 1 and "in time" in failed[3], (tries, failed)
    finally:
        for m in meshes:
            m.close(wait_for=set(), timeout=1.0)


@pytest.mark.parametrize("cap", ["kept", "mutant"])
def test_a_listed_rank_holds_at_most_two_admissions_at_once(
    keydir: Path, cap: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before its start snapshot, rank 1 holds a peer's introduction until the run's nonce is known (a thread
    each). Rank 3, with its own key, introduces itself five times: two wait, the others are refused — its threads
    on rank 1 are bounded. The mutant (no cap) holds all five."""
    from phalanx.distributed import admission

    if cap == "mutant":
        monkeypatch.setattr(admission, "ADMITTING_PER_RANK", 10**6)
    m1 = mesh(keydir, 1)
    socks = []
    try:
        for _ in range(5):
            tls = client_context(ident(keydir, 3)).wrap_socket(socket.create_connection(m1.address))
            send_phased(tls, Kind.HELLO, 0, 0, json.dumps({"rank": 3, "config": DIGEST, "nonce": "00" * 32}).encode())
            socks.append(tls)
        if cap == "kept":
            wait_until(lambda: reasons(m1).count("connections being admitted already") == 3, m1)
            assert m1.admission.admitting[3] == 2
        else:
            deadline = time.monotonic() + 20.0
            while m1.admission.admitting.get(3, 0) < 5:
                assert time.monotonic() < deadline, m1.admission.admitting
                time.sleep(0.01)
    finally:
        m1.close(wait_for=set(), timeout=1.0)
        for s in socks:
            s.close()
