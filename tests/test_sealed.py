"""Sealed links, attacked in one process with real TLS sockets on loopback: every impostor of the campaign is refused
or its message rejected with a recorded reason, and only allow-listed ranks' genuine vectors are accepted, once.

The server side is a real :class:`~phalanx.distributed.sealed.SealedLinks`; genuine workers are real
:class:`~phalanx.distributed.sealed.SealedWorkerLinks`; impostors speak the same frames from their own sockets, or
sit on the path as a TCP proxy that records, flips or cuts bytes.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from phalanx.distributed import sealed as sealed_module
from phalanx.distributed import wire
from phalanx.distributed.channel import HEADER, MAGIC, Kind, client_context, send_frame
from phalanx.distributed.keys import Identity, init_keys, load_identity
from phalanx.distributed.sealed import SealedLinks, SealedWorkerLinks, signed_message
from phalanx.errors import PhalanxError

DIGEST = "c0nf1g"
ROW = 64  # bytes of one vector (16 float32)
N = 4


@pytest.fixture(scope="module")
def keydir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_keys(d / "job", N)
    init_keys(d / "other", N)  # a second job's keys: none of them is on the first job's list
    return d


def ident(keydir: Path, rank: int, job: str = "job") -> Identity:
    return load_identity(keydir / job, rank, N)


@pytest.fixture
def server(keydir: Path, request: pytest.FixtureRequest) -> Iterator[SealedLinks]:
    """Rank 0's links, waiting (to fix the session nonce) for the workers a ``joins(...)`` mark names (default:
    rank 1) — the ranks the test lets in; the others would be refused as late."""
    mark = request.node.get_closest_marker("joins")
    links = SealedLinks(ident(keydir, 0), "127.0.0.1", 0, DIGEST, ROW, N)
    links.offer({"config": DIGEST, "round": 0, "streams": {}, "momentum": None},
                expected=set(mark.args) if mark else {1})
    yield links
    links.closed = True
    links.close()


def worker(keydir: Path, server: SealedLinks, rank: int, port: int | None = None) -> SealedWorkerLinks:
    w = SealedWorkerLinks(ident(keydir, rank), "127.0.0.1", port or server.port, DIGEST, ROW, N)
    init = w.init()
    assert init["round"] == 0
    w.ready()
    return w


def workers(keydir: Path, server: SealedLinks, ranks: tuple[int, ...],
            ports: dict[int, int] | None = None) -> dict[int, SealedWorkerLinks]:
    """Join ``ranks`` at once (each in its own thread: rank 0 sends no start snapshot before every expected worker's
    contribution came), each through ``ports[rank]`` when given."""
    joined: dict[int, SealedWorkerLinks] = {}
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            joined[rank] = worker(keydir, server, rank, (ports or {}).get(rank))
        except BaseException as exc:  # (re-raised below, in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    if errors:
        raise errors[0]
    assert set(joined) == set(ranks), "a worker did not join"
    return {r: joined[r] for r in ranks}


def wait(cond: Callable[[], bool], server: SealedLinks) -> None:
    with server.cond:
        assert server.cond.wait_for(cond, 20.0), "timed out waiting for the server"


def reasons(server: SealedLinks) -> str:
    return " | ".join(r.reason for r in server.rejections)


def row(value: int) -> bytes:
    return bytes([value]) * ROW


def raw_tls(keydir: Path, rank: int, server: SealedLinks, job: str = "job") -> ssl.SSLSocket:
    ctx = client_context(ident(keydir, rank, job))
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port)))


def hello(tls: ssl.SSLSocket, rank: object, link: str, config: str = DIGEST) -> None:
    import json

    send_frame(tls, Kind.HELLO, 0, json.dumps({"rank": rank, "link": link, "config": config, "share": "00" * 32})
               .encode())


@pytest.mark.joins(1, 2, 3)
def test_genuine_workers_are_heard_once_each_with_their_signature(keydir: Path, server: SealedLinks) -> None:
    ws = workers(keydir, server, (1, 2, 3))
    assert server.joined(N) == {1, 2, 3}
    server.publish_theta(0, wire.THETA + row(0))
    for r, w in ws.items():
        assert w.next_message(0) == (0, wire.THETA + row(0))
        w.send_vector(0, row(r))
    got = server.collect(0, [1, 2, 3], set(), 20.0)
    assert {r: bytes(v) for r, v in got.items()} == {r: row(r) for r in (1, 2, 3)}
    acc = server.accepted(0, 2)
    assert acc is not None
    import hashlib

    assert acc.sha256 == hashlib.sha256(row(2)).hexdigest()
    public = ident(keydir, 2).allow.public_key(2)
    public.verify(bytes.fromhex(acc.signature), signed_message(server.nonce, DIGEST, 0, 2, bytes.fromhex(acc.sha256)))
    assert len(server.rejections) == 0


def test_an_outsider_without_tls_or_without_a_certificate_is_refused(keydir: Path, server: SealedLinks) -> None:
    plain = socket.create_connection(("127.0.0.1", server.port))
    plain.sendall(HEADER.pack(MAGIC, Kind.VECTOR, 0, ROW) + row(9))  # the protocol's bytes, in clear
    plain.close()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    anon = ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port)))  # TLS, but no client certificate
    with pytest.raises((ssl.SSLError, OSError)):
        hello(anon, 1, "down")
        anon.recv(1)
    wait(lambda: len(server.rejections) >= 2, server)
    assert all("TLS handshake" in r.reason and r.rank is None for r in server.rejections[:2]), reasons(server)
    assert server.up == {} and server.down == {}


def test_an_outsider_with_its_own_key_not_on_the_list_is_refused(keydir: Path, server: SealedLinks) -> None:
    with pytest.raises((ssl.SSLError, OSError)):
        tls = raw_tls(keydir, 1, server, job="other")
        hello(tls, 1, "down")
        tls.recv(1)
    wait(lambda: len(server.rejections) >= 1, server)
    assert "TLS handshake" in server.rejections[0].reason and server.rejections[0].rank is None
    assert server.down == {}


def test_a_rank_claiming_another_ranks_identity_is_refused(keydir: Path, server: SealedLinks) -> None:
    tls = raw_tls(keydir, 2, server)  # rank 2's own key, claiming to be rank 1
    hello(tls, 1, "down")
    assert tls.recv(64)[:4] == MAGIC  # the REFUSED frame
    wait(lambda: len(server.rejections) >= 1, server)
    assert server.rejections[0].rank == 2 and "claims rank 1 with rank 2's key" in server.rejections[0].reason
    assert server.down == {}


def test_one_key_used_for_two_ranks_or_twice_is_refused(keydir: Path, server: SealedLinks) -> None:
    worker(keydir, server, 1)
    tls = raw_tls(keydir, 1, server)  # a copy of rank 1's key, while rank 1 is connected
    hello(tls, 1, "down")
    wait(lambda: len(server.rejections) >= 1, server)
    assert "already connected (down): one key used twice" in reasons(server)
    tls2 = raw_tls(keydir, 1, server)
    hello(tls2, 3, "down")  # rank 1's key claiming rank 3
    wait(lambda: len(server.rejections) >= 2, server)
    assert "claims rank 3 with rank 1's key" in reasons(server)
    assert set(server.down) == {1}


def test_a_worker_refuses_a_server_that_is_not_rank_0(keydir: Path) -> None:
    fake = SealedLinks(ident(keydir, 2), "127.0.0.1", 0, DIGEST, ROW, N)  # a listed key, but not the server's
    fake.offer({"config": DIGEST, "round": 0, "streams": {}, "momentum": None})
    try:
        w = SealedWorkerLinks(ident(keydir, 1), "127.0.0.1", fake.port, DIGEST, ROW, N)
        with pytest.raises(PhalanxError, match="holds rank 2's key, not rank 0's"):
            w.init()
        outsider = SealedLinks(ident(keydir, 0, "other"), "127.0.0.1", 0, DIGEST, ROW, N)
        outsider.offer({"config": DIGEST, "round": 0, "streams": {}, "momentum": None})
        w = SealedWorkerLinks(ident(keydir, 1), "127.0.0.1", outsider.port, DIGEST, ROW, N)
        with pytest.raises(PhalanxError, match="did not prove a key of the allow-list"):
            w.init()
        outsider.close()
    finally:
        fake.close()


def _signed_frame(identity: Identity, nonce: bytes, t: int, signer_rank: int, body: bytes, frame_round: int) -> bytes:
    import hashlib

    sig = identity.sign(signed_message(nonce, DIGEST, t, signer_rank, hashlib.sha256(body).digest()))
    payload = sig + body
    return HEADER.pack(MAGIC, Kind.VECTOR, frame_round, len(payload)) + payload


@pytest.mark.joins(1, 2)
def test_replayed_relayed_and_forged_vectors_are_rejected(keydir: Path, server: SealedLinks) -> None:
    w1, w2 = workers(keydir, server, (1, 2)).values()
    server.publish_theta(0, wire.THETA + row(0))
    w1.send_vector(0, row(1))
    wait(lambda: (0, 1) in server.inbox, server)
    server.publish_theta(1, wire.THETA + row(0))
    assert w2.up is not None
    # rank 2 relays rank 1's signed round-0 vector as its own, and replays it into round 1
    w2.up.sendall(_signed_frame(ident(keydir, 1), server.nonce, 0, 1, row(1), frame_round=1))
    # rank 2 replays its own signature of round 0 in round 1
    w2.up.sendall(_signed_frame(ident(keydir, 2), server.nonce, 0, 2, row(2), frame_round=1))
    # rank 2 signs with another run's nonce (a message recorded in another run)
    w2.up.sendall(_signed_frame(ident(keydir, 2), b"\x00" * 32, 1, 2, row(2), frame_round=1))
    # rank 2's key signs for the right round, but the body was changed after signing
    frame = bytearray(_signed_frame(ident(keydir, 2), server.nonce, 1, 2, row(2), frame_round=1))
    frame[-1] ^= 1
    w2.up.sendall(frame)
    wait(lambda: len(server.rejections) >= 4, server)
    assert reasons(server).count("signature that does not verify") == 4
    w2.send_vector(1, row(2))  # its genuine vector still gets in
    w2.send_vector(1, row(3))  # … once
    wait(lambda: len(server.rejections) >= 5, server)
    assert "second vector in round 1" in reasons(server)
    got = server.collect(1, [1, 2], {1}, 5.0)
    assert {r: bytes(v) for r, v in got.items()} == {2: row(2)}


def test_a_vector_for_a_round_not_begun_is_rejected(keydir: Path, server: SealedLinks) -> None:
    w1 = worker(keydir, server, 1)
    server.publish_theta(0, wire.THETA + row(0))
    w1.send_vector(5, row(1))
    wait(lambda: len(server.rejections) >= 1, server)
    assert "round 5, which has not begun" in reasons(server)
    assert (5, 1) not in server.inbox


@pytest.mark.parametrize(("frame", "reason"), [
    (HEADER.pack(MAGIC, Kind.VECTOR, 0, 100 * (64 + ROW + (1 << 16))), "more than the"),
    (HEADER.pack(MAGIC, Kind.THETA, 0, ROW) + row(1), "THETA frame, which this end never accepts"),
    (HEADER.pack(MAGIC, Kind.STOP, 0, 1) + b"X", "STOP frame, which this end never accepts"),
    (HEADER.pack(b"JUNK", Kind.VECTOR, 0, ROW), "magic bytes"),
    (HEADER.pack(MAGIC, 99, 0, 1), "unknown kind 99"),
    (HEADER.pack(MAGIC, Kind.VECTOR, 0, 64 + ROW) + row(1), "cut short"),
    (HEADER.pack(MAGIC, Kind.VECTOR, 0, 64 + ROW), "cut short"),
])
def test_oversized_foreign_and_cut_frames_close_the_link_unread(
    keydir: Path, server: SealedLinks, frame: bytes, reason: str,
) -> None:
    w1 = worker(keydir, server, 1)
    server.publish_theta(0, wire.THETA + row(0))
    assert w1.up is not None
    w1.up.sendall(frame)
    if reason == "cut short":
        try:
            w1.up.unwrap()  # a clean TLS close (close_notify) in the middle of the frame
        except (ssl.SSLError, OSError):  # sent; the server closed without answering it
            pass
        w1.up.close()
    wait(lambda: len(server.rejections) >= 1, server)
    assert reason in reasons(server), reasons(server)
    wait(lambda: 1 not in server.up, server)  # the link is closed: rank 1 is missing from now on
    assert server.collect(0, [1], set(), 1.0) == {}


class Proxy:
    """A TCP proxy on the path between a worker and the server: forwards both ways, records what each connection's
    worker side sends, and on connection number ``conn`` flips one byte, or cuts the stream, at byte ``at``."""

    def __init__(self, target: int, *, conn: int = -1, at: int = -1, how: str = "") -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target = target
        self.conn, self.at, self.how = conn, at, how
        self.sent: list[bytearray] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                a, _ = self.listener.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target))
            self.sent.append(bytearray())
            index = len(self.sent) - 1
            threading.Thread(target=self._pump, args=(a, b, index), daemon=True).start()
            threading.Thread(target=self._pump, args=(b, a, None), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, index: int | None) -> None:
        try:
            while data := src.recv(65536):
                if index is not None:
                    record = self.sent[index]
                    start = len(record)
                    record += data
                    buf = bytearray(data)
                    if index == self.conn and start <= self.at < start + len(buf):
                        if self.how == "cut":
                            dst.sendall(buf[: self.at - start])
                            break
                        buf[self.at - start] ^= 0x40
                    data = bytes(buf)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def test_recorded_traffic_replayed_on_a_new_connection_is_refused(keydir: Path, server: SealedLinks) -> None:
    proxy = Proxy(server.port)
    w = worker(keydir, server, 1, port=proxy.port)
    server.publish_theta(0, wire.THETA + row(0))
    w.send_vector(0, row(1))
    wait(lambda: (0, 1) in server.inbox, server)
    before = len(server.rejections)
    replay = socket.create_connection(("127.0.0.1", server.port))  # an on-path attacker replays the uplink it saw
    replay.sendall(bytes(proxy.sent[1]))
    wait(lambda: len(server.rejections) > before, server)
    assert "TLS handshake" in server.rejections[-1].reason, reasons(server)
    assert [k for k in server.inbox if k[1] == 1] == [(0, 1)]
    replay.close()
    proxy.close()


@pytest.mark.joins(1, 2)
@pytest.mark.parametrize("how", ["flip", "cut"])
def test_a_flipped_or_cut_byte_on_the_path_never_reaches_the_rule(keydir: Path, server: SealedLinks, how: str) -> None:
    # rank 1's uplink (the proxy's second connection) will get the byte flipped, or the stream cut, inside its vector;
    # where that is, rank 2's uplink through an honest proxy measures first (both join at once: the nonce waits)
    probe, proxy = Proxy(server.port), Proxy(server.port, conn=1, how=how)
    w2, w = workers(keydir, server, (2, 1), {2: probe.port, 1: proxy.port}).values()
    wait(lambda: 2 in server.up, server)  # its introduction went through the proxy
    before = len(probe.sent[1])
    server.publish_theta(0, wire.THETA + row(0))
    w2.send_vector(0, row(2))
    wait(lambda: (0, 2) in server.inbox, server)
    size = len(probe.sent[1]) - before
    probe.close()
    proxy.at = before + size // 2
    w.send_vector(0, row(1))
    wait(lambda: any(r.rank == 1 for r in server.rejections), server)
    assert (0, 1) not in server.inbox
    assert "uplink" in reasons(server)
    assert set(server.collect(0, [1, 2], set(), 2.0)) == {2}
    proxy.close()


def test_copies_of_the_key_directory_are_not_needed_beyond_own_key(keydir: Path, tmp_path: Path) -> None:
    """A machine needs only the allow-list and its own private key."""
    only = tmp_path / "machine2"
    only.mkdir()
    shutil.copy(keydir / "job" / "allow-list.json", only / "allow-list.json")
    shutil.copy(keydir / "job" / "rank-2.key", only / "rank-2.key")
    assert load_identity(only, 2, N).rank == 2


@pytest.mark.parametrize("budget", ["kept", "mutant"])
def test_a_listed_rank_flooding_bad_frames_is_disconnected_after_the_bounded_number(
    keydir: Path, server: SealedLinks, budget: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1, with its own key, sends 200 vectors whose signature does not verify: its uplink is closed at the
    MAX_VIOLATIONS-th and the rank is missing from then on (each one was checked and recorded, no more). The mutant
    — a budget that never runs out — keeps checking and recording every one, and the link stays open."""
    from phalanx.distributed import channel

    if budget == "mutant":
        monkeypatch.setattr(sealed_module, "MAX_VIOLATIONS", 10**9)
    w1 = worker(keydir, server, 1)
    wait(lambda: 1 in server.up, server)  # (the ACK goes out before the server registers the link)
    server.publish_theta(0, wire.THETA + row(0))
    assert w1.up is not None
    bad = _signed_frame(ident(keydir, 1), b"\x00" * 32, 0, 1, row(1), frame_round=0)  # another run's nonce
    sent = 0
    try:
        for _ in range(200):
            w1.up.sendall(bad)
            sent += 1
    except (ssl.SSLError, OSError):
        pass  # the server closed the link
    if budget == "kept":
        wait(lambda: 1 not in server.up, server)
        verified = [r for r in server.rejections if "does not verify" in r.reason]
        assert len(verified) == channel.MAX_VIOLATIONS, reasons(server)
        assert f"closed after {channel.MAX_VIOLATIONS} violations" in reasons(server)
        assert server.collect(0, [1], set(), 1.0) == {}
    else:
        wait(lambda: len(server.rejections) >= 200, server)  # (counted by group: the last 64 are kept whole)
        groups = server.rejections.drain()
        assert sum(g["count"] for g in groups if "does not verify" in g["kind"]) == 200, groups
        assert 1 in server.up and sent == 200


@pytest.mark.joins(1, 2)
@pytest.mark.parametrize("bar", ["kept", "mutant"])
def test_a_rank_closed_for_violations_is_refused_a_new_uplink_for_the_session(
    keydir: Path, server: SealedLinks, bar: str,
) -> None:
    """Rank 1, with its own key, floods bad-signature vectors until its uplink is closed, then opens a new uplink
    with the same key and session share (attack38's r1: 25 closures, 200 vectors verified, a genuine vector heard
    again): the new uplink is refused in one line and the rank stays missing — MAX_VIOLATIONS vectors verified in
    all. The mutant — the server that forgets the closure (the code before the fix) — lets it in with a fresh budget
    and accepts its next vector. Rank 2, whose uplink is lost without a violation (its end closed it), opens a new
    one and is heard: only a rank closed for violations is barred."""
    from phalanx.distributed import channel

    class Forgetful(set[int]):
        def add(self, rank: int) -> None:  # the mutant: no rank is ever barred
            pass

    if bar == "mutant":
        server.barred = Forgetful()
    w1, w2 = workers(keydir, server, (1, 2)).values()
    wait(lambda: {1, 2} <= set(server.up), server)  # (the ACK goes out before the server registers the link)
    server.publish_theta(0, wire.THETA + row(0))
    assert w2.up is not None
    w2.up.close()  # an honest rank's uplink lost (not a violation): it may come back
    wait(lambda: 2 not in server.up, server)
    w2.ready()
    w2.send_vector(0, row(2))
    wait(lambda: (0, 2) in server.inbox, server)
    bad = _signed_frame(ident(keydir, 1), b"\x00" * 32, 0, 1, row(1), frame_round=0)  # another run's nonce
    for _closure in range(2):
        up = w1.up
        assert up is not None
        try:
            for _ in range(channel.MAX_VIOLATIONS + 2):
                up.sendall(bad)
        except (ssl.SSLError, OSError):
            pass  # the server closed the link
        wait(lambda: 1 not in server.up, server)
        up.close()
        if bar == "kept":
            with pytest.raises(PhalanxError, match="closed for violations: it is missing for the rest of the session"):
                w1.ready()
            assert 1 not in server.up
            break
        w1.ready()  # the mutant: let in again, a new budget
        wait(lambda: 1 in server.up, server)
    groups = server.rejections.drain()
    verified = sum(g["count"] for g in groups if "does not verify" in g["kind"])
    genuine = _signed_frame(ident(keydir, 1), server.nonce, 0, 1, row(7), frame_round=0)
    if bar == "kept":
        assert verified == channel.MAX_VIOLATIONS, groups
        assert any("closed for violations" in g["kind"] for g in groups), groups
        assert server.collect(0, [1], set(), 1.0) == {}
    else:
        assert verified == 2 * channel.MAX_VIOLATIONS, groups
        assert w1.up is not None
        w1.up.sendall(genuine)
        wait(lambda: (0, 1) in server.inbox, server)


class _Never(Exception):
    """The mutant's ``Malformed``: a class no frame raises, so a wrong header is what it was before — uncounted."""


LOOPS = 20
"""How many reconnections the garbage loop tries (the bound of the mutant's loop: a count, not a time)."""


@pytest.mark.parametrize(("garbage", "counted"), [
    (HEADER.pack(b"JUNK", Kind.VECTOR, 0, ROW), "kept"),
    (HEADER.pack(MAGIC, 99, 0, 1), "kept"),
    (HEADER.pack(MAGIC, Kind.VECTOR, 0, 100 * (64 + ROW + (1 << 16))), "kept"),
    (HEADER.pack(MAGIC, Kind.THETA, 0, ROW) + row(1), "kept"),
    (HEADER.pack(b"JUNK", Kind.VECTOR, 0, ROW), "mutant"),
], ids=["no-magic", "unknown-kind", "oversized", "foreign-kind", "mutant-uncounted"])
def test_a_listed_rank_reconnecting_to_send_frames_that_do_not_frame_is_barred(
    keydir: Path, server: SealedLinks, garbage: bytes, counted: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1, with its own key and session share, loops: open an uplink (a TLS handshake, a reader thread), send a
    complete header that is wrong, get closed, reconnect. Inside TLS that header is the rank's own bytes, so the first
    one bars its uplink for the session: the next reconnection is refused in one line and the loop ends after one
    closure. The mutant — the former code, where such a closure was not held against the rank — lets it in all
    LOOPS times and never bars it."""
    if counted == "mutant":
        monkeypatch.setattr(sealed_module, "Malformed", _Never)
    w1 = worker(keydir, server, 1)
    server.publish_theta(0, wire.THETA + row(0))
    closures = 0
    for loop in range(LOOPS):
        if loop:
            try:
                w1.ready()
            except PhalanxError as exc:
                assert "closed for violations: it is missing for the rest of the session" in str(exc)
                break
        wait(lambda: 1 in server.up, server)  # (the ACK goes out before the server registers the link)
        up = w1.up
        assert up is not None
        try:
            up.sendall(garbage)
        except (ssl.SSLError, OSError):
            pass  # the server closed the link
        wait(lambda: 1 not in server.up, server)
        up.close()
        closures += 1
    if counted == "kept":
        assert closures == 1 and server.barred == {1}, reasons(server)
        assert "the rank barred for the session" in reasons(server)
        assert server.collect(0, [1], set(), 1.0) == {}
    else:
        assert closures == LOOPS and not server.barred, reasons(server)


@pytest.mark.parametrize(("where", "bar"), [
    ("header", "kept"), ("body", "kept"), ("ragged", "kept"), ("reset", "kept"), ("body", "mutant"),
], ids=["mid-header", "mid-body", "no-close-notify-mid-body", "reset-mid-body", "mutant-counts-cuts"])
def test_an_honest_rank_whose_uplink_drops_mid_frame_reconnects_and_is_never_barred(
    keydir: Path, server: SealedLinks, where: str, bar: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1's uplink drops in the middle of a genuine vector's frame — after half its header, after its header and
    half its body (closed with or without TLS's close_notify), or reset there — more times than MAX_VIOLATIONS: each
    time it opens the link again and is let in, is never barred, and its next vector is heard. The mutant that holds
    every closure for a broken frame against the rank (a cut counted as a wrong header) bars it at its first drop."""
    from phalanx.distributed import channel

    if bar == "mutant":
        monkeypatch.setattr(sealed_module, "Malformed", channel.Violation)
    w1 = worker(keydir, server, 1)
    server.publish_theta(0, wire.THETA + row(0))
    genuine = _signed_frame(ident(keydir, 1), server.nonce, 0, 1, row(1), frame_round=0)
    half = HEADER.size // 2 if where == "header" else HEADER.size + (len(genuine) - HEADER.size) // 2
    part = genuine[:half]
    for drop in range(channel.MAX_VIOLATIONS + 2):
        if drop:
            if bar == "mutant":
                with pytest.raises(PhalanxError, match="closed for violations"):
                    w1.ready()
                assert server.barred == {1}
                return
            w1.ready()
        wait(lambda: 1 in server.up, server)
        up = w1.up
        assert up is not None
        up.sendall(part)
        if where == "reset":  # an RST: the connection dropped under the frame
            up.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif where != "ragged":  # (ragged: no close_notify, as when the rank's process is killed)
            try:
                up.unwrap()  # the connection's end closed in the middle of the frame
            except (ssl.SSLError, OSError):
                pass
        up.close()
        wait(lambda: 1 not in server.up, server)
    assert not server.barred and "barred" not in reasons(server), reasons(server)
    drops = [r.reason for r in server.rejections]
    assert len(drops) == channel.MAX_VIOLATIONS + 2, drops
    assert all("cut short" in r or "failed" in r for r in drops), drops
    w1.ready()
    w1.send_vector(0, row(1))
    wait(lambda: (0, 1) in server.inbox, server)


def test_a_late_vector_replayed_is_a_violation_and_a_slow_workers_next_late_one_is_not(tmp_path: Path) -> None:
    """A vector older than the window is dropped as late. A listed rank replaying one such signed vector forever
    cost rank 0 a SHA-256 and a signature check each, never a violation, so its link stayed open (an attacker's
    review: 2,000 replays, 0 violations). Now a late vector not newer than the rank's last late one is a violation;
    a slow honest worker, whose versions only grow, is still just late."""
    import hashlib

    init_keys(tmp_path / "keys", 4)
    links = SealedLinks(load_identity(tmp_path / "keys", 0, 4), "127.0.0.1", 0, "cfg", 8, 4)
    who = load_identity(tmp_path / "keys", 3, 4)
    try:
        links.nonce, links.round = b"n" * 32, 20
        public = links.identity.allow.public_key(3)

        def frame(t: int) -> bytearray:
            body = bytes(range(8))
            return bytearray(who.sign(signed_message(links.nonce, links.digest, t, 3, hashlib.sha256(body).digest()))
                             + body)

        assert links._take_vector(3, public, 2, frame(2)) is None  # late: dropped, counted
        assert links._take_vector(3, public, 5, frame(5)) is None  # a slow worker's next version: late again
        assert links.late[3] == 2
        for t in (5, 2):
            problem = links._take_vector(3, public, t, frame(t))
            assert problem is not None and "a late vector of round" in problem, problem
        assert links.late[3] == 2 and not links.inbox
    finally:
        links.close()
