"""Availability of a keyed rank's listener, attacked in one process with real sockets on loopback: an outsider with
no key holding hundreds of idle connections, slow handshakes or a flood of garbage and of handshakes with unknown
keys never keeps an allow-listed rank from getting in (:mod:`phalanx.distributed.admission`); what it holds is
bounded per source and in all, and closed at its deadline.

The outsider connects from 127.0.0.1 — the honest ranks' own address, the hardest case: shedding cannot tell them
apart by source — and from 127.0.0.2 (another "machine": Linux routes all of 127/8 to the loopback interface).
Every wait is on an event with a bound; nothing asserts a duration.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from _outsider import Outsider
from phalanx.distributed import admission, sealed
from phalanx.distributed.admission import Admission, source_of
from phalanx.distributed.channel import client_context
from phalanx.distributed.keys import Identity, init_keys, load_identity
from phalanx.distributed.sealed import SealedLinks, SealedWorkerLinks
from phalanx.errors import PhalanxError

DIGEST = "c0nf1g"
ROW = 64
N = 4


@pytest.fixture(scope="module")
def keydir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_keys(d / "job", N)
    init_keys(d / "other", N)
    return d


def ident(keydir: Path, rank: int, job: str = "job") -> Identity:
    return load_identity(keydir / job, rank, N)


@pytest.fixture
def server(keydir: Path) -> Iterator[SealedLinks]:
    links = SealedLinks(ident(keydir, 0), "127.0.0.1", 0, DIGEST, ROW, N)
    links.offer({"config": DIGEST, "round": 0, "streams": {}, "momentum": None})
    yield links
    links.close()


def until(cond: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    """Wait for ``cond`` (polled: it reads another thread's state), at most ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def join(keydir: Path, server: SealedLinks, rank: int) -> SealedWorkerLinks:
    w = SealedWorkerLinks(ident(keydir, rank), "127.0.0.1", server.port, DIGEST, ROW, N)
    assert w.init()["round"] == 0
    w.ready()
    return w


def join_all(keydir: Path, server: SealedLinks) -> list[SealedWorkerLinks]:
    """Ranks 1–3 join at once (rank 0 sends no start snapshot before every worker's contribution to the session
    nonce came: one after the other, the first would wait for the others)."""
    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(lambda r: join(keydir, server, r), (1, 2, 3)))


def test_sources_are_addresses_and_ipv6_64s() -> None:
    assert source_of("10.0.0.7") == "10.0.0.7" and source_of("::ffff:10.0.0.7") == "10.0.0.7"
    assert source_of("2001:db8::1") == source_of("2001:db8::ffff:1") == "2001:db8::/64"
    assert source_of("2001:db8:0:1::1") != source_of("2001:db8::1")


def test_hundreds_of_idle_connections_do_not_keep_a_rank_out(keydir: Path, server: SealedLinks) -> None:
    """300 idle connections from the ranks' own address (more than its cap of pending connections, which the former
    pool of 64 handshake threads never allowed) and 200 from another: every rank gets in, the outsider's own oldest
    connections are what is shed, and what it holds stays within the caps."""
    near = Outsider(server.port, idle=300)
    far = Outsider(server.port, "127.0.0.2", idle=200)
    try:
        adm = server.admission
        assert adm is not None
        until(lambda: adm.shed > 0 and len(adm.pending) >= admission.PER_SOURCE, "the outsider fills its cap")
        workers = join_all(keydir, server)
        assert server.joined(N) == {1, 2, 3}
        assert len(workers) == 3
        held = {source: len(adm.idle.get(source, {})) + len(adm.busy.get(source, {}))
                for source in ("127.0.0.1", "127.0.0.2")}
        assert all(count <= admission.PER_SOURCE for count in held.values()), held
        assert len(adm.pending) <= adm.total
    finally:
        near.close()
        far.close()


def test_the_former_policy_turns_the_rank_away(keydir: Path, server: SealedLinks,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a listener that, at a source's cap, refuses the newcomer instead of shedding the source's oldest
    (what the pool of 64 handshake threads did) — the outsider's idle connections keep the rank out."""
    adm = server.admission
    assert adm is not None

    def refuse_newcomer(source: str) -> bool:
        mine = len(adm.idle.get(source, ())) + len(adm.busy.get(source, ()))
        return mine < adm.per_source

    monkeypatch.setattr(adm, "_room_for", refuse_newcomer)
    monkeypatch.setattr(sealed, "JOIN_TIMEOUT_S", 3.0)
    near = Outsider(server.port, idle=admission.PER_SOURCE + 20)
    try:
        until(lambda: len(adm.pending) >= admission.PER_SOURCE, "the outsider fills the cap")
        with pytest.raises(PhalanxError, match="could not reach"):
            SealedWorkerLinks(ident(keydir, 1), "127.0.0.1", server.port, DIGEST, ROW, N).init()
    finally:
        near.close()


def test_slow_handshakes_are_closed_at_their_deadline_and_cost_no_slot(keydir: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    rejected: list[str] = []
    from phalanx.distributed.channel import HEADER, MAGIC, Kind, server_context

    adm = Admission(listener, server_context(ident(keydir, 0)), ident(keydir, 0).allow, header=HEADER, magic=MAGIC,
                    hello_kind=int(Kind.HELLO), admit=lambda *a: None, reject=lambda r, why: rejected.append(why),
                    name="test-admit", deadline_s=1.0, per_source=8)
    slow = Outsider(port, slow=6, drip=0.2)
    try:
        until(lambda: sum("not introduced within 1 s" in r for r in rejected) >= 12, "the slow ones are closed")
        assert adm.thread.is_alive()
    finally:
        slow.close()
    crowd = Outsider(port, slow=30, drip=0.2)  # more than the source's cap: its own oldest are shed
    try:
        until(lambda: adm.shed >= 22, "the source's oldest are shed")
        assert len(adm.pending) <= 8
    finally:
        crowd.close()
        adm.close()
        listener.close()
    assert not adm.thread.is_alive() and adm.pending == {}


def test_a_flood_of_garbage_and_unknown_keys_does_not_keep_ranks_out(keydir: Path, server: SealedLinks) -> None:
    """Four threads reconnecting as fast as they can — garbage in clear, and full handshakes with another job's key —
    plus slow handshakes, from the ranks' own address: each connection is closed at its first record (or its
    handshake), and the ranks get in."""
    flood = Outsider(server.port, flood=4, slow=50, foreign=keydir / "other")
    try:
        until(lambda: flood.opened >= 200, "the flood is under way")
        workers = join_all(keydir, server)
        assert server.joined(N) == {1, 2, 3} and len(workers) == 3
    finally:
        flood.close()
    text = " | ".join(r.reason for r in server.rejections)
    assert "TLS handshake" in text


@pytest.mark.parametrize("policy", ["shed", "mutant"])
def test_at_the_cap_of_all_the_busiest_source_sheds_and_a_rank_gets_in(
    keydir: Path, policy: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two other sources hold 20 idle connections each against a listener with room for 8 pending in all: the
    busiest source sheds its oldest, never the newcomer, and rank 1's connection from a third address is admitted.
    The mutant — at the cap, turn the newcomer away — keeps it out."""
    from phalanx.distributed.channel import HEADER, MAGIC, Kind, send_frame, server_context

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    admitted: list[int] = []
    adm = Admission(listener, server_context(ident(keydir, 0)), ident(keydir, 0).allow, header=HEADER, magic=MAGIC,
                    hello_kind=int(Kind.HELLO), admit=lambda tls, addr, rank, hello: admitted.append(rank),
                    reject=lambda rank, why: None, name="test-admit", total=8)
    if policy == "mutant":
        monkeypatch.setattr(adm, "_room_for", lambda source: len(adm.pending) < adm.total)
    crowd = [Outsider(port, "127.0.0.2", idle=20), Outsider(port, "127.0.0.3", idle=20)]
    try:
        until(lambda: len(adm.pending) >= 8 and sum(o.opened for o in crowd) > 20, "the crowd fills the cap")
        assert len(adm.pending) <= 8
        raw = socket.create_connection(("127.0.0.1", port), timeout=10.0)
        if policy == "mutant":
            with pytest.raises((ssl.SSLError, OSError)):  # turned away: the connection ends in its handshake
                client_context(ident(keydir, 1)).wrap_socket(raw).recv(1)
            raw.close()
            assert admitted == []
            return
        tls = client_context(ident(keydir, 1)).wrap_socket(raw)
        try:
            send_frame(tls, Kind.HELLO, 0, b"{}")
            until(lambda: admitted == [1], "rank 1 is admitted")
            assert adm.shed > 0
        finally:
            tls.close()
    finally:
        for o in crowd:
            o.close()
        adm.close()
        listener.close()


@pytest.mark.parametrize("cap", ["sized", "mutant"])
def test_idle_connections_leave_rank_0_the_descriptors_its_files_need(tmp_path: Path, cap: str) -> None:
    """attack38's r4 at a small scale: rank 0 of 40 ranks (78 link descriptors) under a file limit of 256 it cannot
    raise (soft = hard), and an outsider holding 300 idle connections from 20 addresses. The cap of pending
    connections is sized from the descriptors left free (limit − held − links − FD_RESERVE), so rank 0 still opens
    the 8 files a checkpoint and the transcript need. The mutant — the former ``soft − 64``, whatever the process
    holds — lets the outsider take every descriptor: rank 0 cannot open its files (EMFILE)."""
    import json
    import os
    import subprocess
    import sys

    n, soft, outsiders = 40, 256, 300
    init_keys(tmp_path / "job", n)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(["src", "tests", os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "tests/_fd_rank0.py", str(tmp_path / "job"), str(n), str(soft),
                              str(soft), cap], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    held: list[socket.socket] = []
    try:
        assert child.stdout is not None and child.stdin is not None
        start = json.loads(child.stdout.readline())
        for i in range(outsiders):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 20}", 0))
            s.connect(("127.0.0.1", start["port"]))
            held.append(s)
        child.stdin.write(f"{outsiders}\n")
        child.stdin.flush()
        got = json.loads(child.stdout.readline())
    finally:
        child.kill()
        child.wait()
        for s in held:
            s.close()
    assert got["accepted"] == outsiders, got
    if cap == "sized":
        assert start["cap"] <= soft - 2 * (n - 1) - admission.FD_RESERVE, start
        assert got["pending"] <= start["cap"] and got["files"] == 8 and not got["error"], got
    else:
        assert got["files"] < 8 and got["error"] == "Too many open files", got
