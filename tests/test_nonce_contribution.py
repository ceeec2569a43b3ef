"""The workers' share of the session nonce (issue 36, :mod:`phalanx.distributed.contribution`): rank 0 waits for every
expected worker's 32 random bytes before it sends the start snapshot; the nonce is SHA-256 of the domain and every
contribution in rank order; each worker checks that its own is there, unchanged, and that the nonce follows — a rank 0
that reuses an old nonce, or drops or alters one worker's contribution, is refused by that worker in one line.

The sealed mesh (serverless, gossip) uses the same function: every rank ≠ 0 contributes in its introduction to rank 0,
and the rank a mutant rank 0 cheats refuses its start snapshot.

In one process with real TLS sockets on loopback (:class:`~phalanx.distributed.sealed.SealedLinks` and
:class:`~phalanx.distributed.sealed.SealedWorkerLinks`; :class:`~phalanx.distributed.mesh.Mesh`); the same mutants on
real processes are in ``tests/test_distributed_sealed.py`` and ``tests/test_distributed_mesh.py``, the audit's
recomputation in ``tests/test_audit.py`` and ``tests/test_distributed_mesh.py``.
"""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.distributed import _test_hooks, contribution, sealed
from phalanx.distributed import mesh as mesh_module
from phalanx.distributed.channel import (
    Kind,
    Limits,
    client_context,
    recv_frame,
    recv_phased,
    send_frame,
    send_phased,
)
from phalanx.distributed.contribution import ABSENT, DOMAIN, PRESENT, check_init, derive, session_problem
from phalanx.distributed.keys import Identity, init_keys, load_identity
from phalanx.distributed.mesh import Mesh
from phalanx.distributed.sealed import SealedLinks, SealedWorkerLinks
from phalanx.errors import PhalanxError

DIGEST = "c0nf1g"
ROW = 64
N = 4


@pytest.fixture(scope="module")
def keydir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_keys(d / "job", N)
    return d


def ident(keydir: Path, rank: int) -> Identity:
    return load_identity(keydir / "job", rank, N)


@pytest.fixture
def server(keydir: Path) -> Iterator[SealedLinks]:
    links = SealedLinks(ident(keydir, 0), "127.0.0.1", 0, DIGEST, ROW, N)
    links.offer({"config": DIGEST, "round": 0, "streams": {}, "momentum": None})
    yield links
    links.closed = True
    links.close()


def join_all(keydir: Path, server: SealedLinks) -> dict[int, SealedWorkerLinks | BaseException]:
    """Ranks 1–3 join at once; each rank's links, or what its ``init`` raised."""
    out: dict[int, SealedWorkerLinks | BaseException] = {}

    def one(rank: int) -> None:
        w = SealedWorkerLinks(ident(keydir, rank), "127.0.0.1", server.port, DIGEST, ROW, N)
        try:
            w.init()
            out[rank] = w
        except PhalanxError as exc:
            out[rank] = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert set(out) == {1, 2, 3}, "a worker neither joined nor was refused"
    return out


def test_the_nonce_is_sha256_of_the_domain_and_every_slot_in_rank_order() -> None:
    c = [bytes([r]) * 32 for r in range(4)]
    assert derive(c) == hashlib.sha256(DOMAIN + b"".join(PRESENT + x for x in c)).digest()
    assert derive([c[0], None, c[2], c[3]]) == hashlib.sha256(DOMAIN + PRESENT + c[0] + ABSENT + PRESENT + c[2]
                                                               + PRESENT + c[3]).digest()
    # every slot counts, in its place; absent is not 32 zero bytes
    assert len({derive(c), derive([c[0], c[2], c[1], c[3]]), derive([c[0], None, c[2], c[3]]),
                derive([c[0], bytes(32), c[2], c[3]])}) == 4
    with pytest.raises(ValueError, match="31 bytes"):
        derive([c[0], b"x" * 31])


def test_every_worker_contributes_and_checks_the_nonce(keydir: Path, server: SealedLinks) -> None:
    joined = join_all(keydir, server)
    assert server.contributions is not None and server.contributions[0] == server.own
    for r, w in joined.items():
        assert isinstance(w, SealedWorkerLinks), w
        assert server.contributions[r] == w.share and w.nonce == server.nonce
    assert server.nonce == derive(server.contributions)


@pytest.mark.parametrize(("mutant", "refusing", "why"), [
    ("reuse:" + "ab" * 32, {1, 2, 3}, "does not follow from the contributions"),
    ("drop:2", {2}, "this rank's contribution to the session nonce is absent"),
    ("alter:1", {1}, "this rank's contribution to the session nonce is altered"),
])
def test_a_rank_0_mutant_at_the_nonce_is_refused_by_the_worker_it_cheats(
    keydir: Path, server: SealedLinks, monkeypatch: pytest.MonkeyPatch, mutant: str, refusing: set[int], why: str,
) -> None:
    """Rank 0 reusing another run's nonce (every worker's contribution ignored): every worker refuses; dropping or
    altering one worker's contribution (the nonce derived from the list it sends): that worker refuses, the others —
    whose own bytes are in the nonce — go on."""
    monkeypatch.setenv(_test_hooks.NONCE_VAR, mutant)
    joined = join_all(keydir, server)
    refused = {r for r, w in joined.items() if isinstance(w, PhalanxError)}
    assert refused == refusing, joined
    for r in refused:
        text = str(joined[r])
        assert why in text and "\n" not in text and text.startswith(f"rank {r}: refused the start snapshot")


def test_mutant_a_worker_that_does_not_check_takes_the_reused_nonce(
    keydir: Path, server: SealedLinks, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutant worker (no check: it takes rank 0's nonce as before) signs under another run's nonce."""
    monkeypatch.setenv(_test_hooks.NONCE_VAR, "reuse:" + "ab" * 32)
    monkeypatch.setattr(sealed, "check_init", lambda init, rank, n, mine: init["nonce"])
    joined = join_all(keydir, server)
    assert all(isinstance(w, SealedWorkerLinks) and w.nonce == bytes.fromhex("ab" * 32) for w in joined.values())


@pytest.mark.parametrize(("edit", "why"), [
    (lambda i: i.pop("contributions"), "does not carry the 4 contributions"),
    (lambda i: i["contributions"].pop(), "does not carry the 4 contributions"),
    (lambda i: i["contributions"].__setitem__(0, None), "rank 0's present"),
    (lambda i: i["contributions"].__setitem__(3, b"x" * 33), "32 bytes each"),
    (lambda i: i["contributions"].__setitem__(3, "ab" * 32), "32 bytes each"),
    (lambda i: i.__setitem__("nonce", "ab" * 32), "does not follow"),
])
def test_a_malformed_start_snapshot_is_one_line(edit: object, why: str) -> None:
    mine = contribution.draw()
    shares: list[bytes | None] = [contribution.draw(), mine, None, contribution.draw()]
    init = {"contributions": list(shares), "nonce": derive(shares)}
    assert check_init(dict(init, contributions=list(shares)), 1, 4, mine) == derive(shares)
    edit(init)  # type: ignore[operator]
    with pytest.raises(ValueError, match=why):
        check_init(init, 1, 4, mine)


def test_a_reconnection_resends_the_same_contribution_and_a_new_session_draws_new_bytes(
    keydir: Path, server: SealedLinks,
) -> None:
    """Every connection a worker's links open in one session carries one contribution (its downlink's is the one
    counted; its uplink must say the same: another is refused); a new session (new links) draws new bytes."""
    joined = join_all(keydir, server)
    w1 = joined[1]
    assert isinstance(w1, SealedWorkerLinks)
    share = w1.share
    w1.ready()  # the uplink's hello carries the same bytes: let in
    with server.cond:  # the server registers the uplink just after its ACK, which ready() returned on: wait for it
        assert server.cond.wait_for(lambda: 1 in server.up, 20.0)
    assert server.shares[1] == share
    assert SealedWorkerLinks(ident(keydir, 1), "127.0.0.1", server.port, DIGEST, ROW, N).share != share
    # rank 2's key opening its uplink with other bytes than its downlink gave: refused
    w2 = joined[2]
    assert isinstance(w2, SealedWorkerLinks)
    tls = client_context(ident(keydir, 2)).wrap_socket(socket.create_connection(("127.0.0.1", server.port)))
    send_frame(tls, Kind.HELLO, 0, json.dumps({"rank": 2, "link": "up", "config": DIGEST,
                                               "share": contribution.draw().hex()}).encode())
    kind, _, answer = recv_frame(tls, Limits({Kind.REFUSED: 1 << 16, Kind.ACK: 0}))
    tls.close()
    assert kind == Kind.REFUSED and b"not the one it gave this session" in answer


def test_a_worker_reconnecting_before_the_start_snapshot_is_let_in_once(keydir: Path) -> None:
    """Rank 1's downlink waits for rank 2's contribution; rank 1 connects again (its first connection lost, say) with
    the same contribution: the new connection replaces the old and gets the start snapshot. A second connection of
    rank 1's key with other bytes meanwhile is refused (one key used twice)."""
    links = SealedLinks(ident(keydir, 0), "127.0.0.1", 0, DIGEST, ROW, N)
    links.offer({"config": DIGEST, "round": 0, "streams": {}, "momentum": None}, expected={1, 2})
    try:
        share = contribution.draw()

        def first_down(share_hex: str) -> ssl.SSLSocket:
            tls = client_context(ident(keydir, 1)).wrap_socket(socket.create_connection(("127.0.0.1", links.port)))
            send_frame(tls, Kind.HELLO, 0, json.dumps({"rank": 1, "link": "down", "config": DIGEST,
                                                       "share": share_hex}).encode())
            return tls

        lost = first_down(share.hex())
        with links.cond:
            assert links.cond.wait_for(lambda: 1 in links.down, 20.0)
            first = links.down[1]  # the server's side of `lost`
        other = first_down(contribution.draw().hex())  # rank 1's key, other bytes: refused
        kind, _, answer = recv_frame(other, Limits({Kind.REFUSED: 1 << 16}))
        assert kind == Kind.REFUSED and b"already connected (down)" in answer
        again = SealedWorkerLinks(ident(keydir, 1), "127.0.0.1", links.port, DIGEST, ROW, N)
        again.share = share  # the same session's links (what a retried dial sends)
        done = threading.Thread(target=again.init, daemon=True)
        done.start()
        with links.cond:  # the retried dial has replaced the first link before rank 2 lets the nonce be fixed
            assert links.cond.wait_for(lambda: links.down[1] is not first, 20.0)
        lost.close()  # (held open until replaced: a collected socket would close the first link early)
        SealedWorkerLinks(ident(keydir, 2), "127.0.0.1", links.port, DIGEST, ROW, N).init()
        done.join(60.0)
        assert again.nonce == links.nonce and links.contributions is not None and links.contributions[1] == share
    finally:
        links.closed = True
        links.close()


def test_a_worker_after_the_nonce_was_fixed_is_refused_in_one_line(keydir: Path) -> None:
    """Rank 0 waits for rank 1 only (the others did not come by the join deadline): rank 2 coming afterwards is refused
    at its handshake — its contribution could no longer count — and is missing this session."""
    links = SealedLinks(ident(keydir, 0), "127.0.0.1", 0, DIGEST, ROW, N)
    links.offer({"config": DIGEST, "round": 0, "streams": {}, "momentum": None}, expected={1})
    try:
        SealedWorkerLinks(ident(keydir, 1), "127.0.0.1", links.port, DIGEST, ROW, N).init()
        assert links.contributions is not None and links.contributions[2:] == [None, None]
        with pytest.raises(PhalanxError, match="came after the session nonce was fixed"):
            SealedWorkerLinks(ident(keydir, 2), "127.0.0.1", links.port, DIGEST, ROW, N).init()
    finally:
        links.closed = True
        links.close()


def test_an_uplink_before_the_nonce_is_fixed_is_refused_and_no_vector_signed_over_no_nonce_is_kept(
        keydir: Path) -> None:
    """Rank 3 (Byzantine: its own key) opens its downlink, then its uplink while rank 0 still waits for rank 1's
    contribution, and sends a vector signed over the *empty* nonce — valid in every run, and not under the session's
    nonce the audit checks (rank 0's transcript would fail). The uplink is refused before the nonce is fixed; once it
    is fixed (rank 1 joins), the same rank's uplink is let in (the honest order), and nothing of rank 3 was kept."""
    links = SealedLinks(ident(keydir, 0), "127.0.0.1", 0, DIGEST, ROW, N)
    links.offer({"config": DIGEST, "round": 0, "streams": {}, "momentum": None}, expected={1, 3})
    ctx, share = client_context(ident(keydir, 3)), contribution.draw().hex()
    answers = Limits({Kind.ACK: 0, Kind.REFUSED: 1 << 16, Kind.INIT: 1 << 20})

    def link(name: str) -> ssl.SSLSocket:
        tls = ctx.wrap_socket(socket.create_connection(("127.0.0.1", links.port), timeout=20.0))
        send_frame(tls, Kind.HELLO, 0, json.dumps({"rank": 3, "link": name, "config": DIGEST, "share": share}).encode())
        return tls

    try:
        down = link("down")
        with links.cond:
            assert links.cond.wait_for(lambda: 3 in links.down, 20.0)
        early = link("up")
        kind, _, answer = recv_frame(early, answers)
        assert kind == Kind.REFUSED and b"before the session nonce was fixed" in answer, (kind, bytes(answer))
        body = bytes(ROW)
        signature = ident(keydir, 3).sign(sealed.signed_message(b"", DIGEST, 0, 3, hashlib.sha256(body).digest()))
        try:  # (the old code took this vector)
            send_frame(early, Kind.VECTOR, 0, signature + body)
        except OSError:
            pass
        early.close()
        SealedWorkerLinks(ident(keydir, 1), "127.0.0.1", links.port, DIGEST, ROW, N).init()
        assert links.contributions is not None and recv_frame(down, answers)[0] == Kind.INIT
        late = link("up")
        assert recv_frame(late, answers)[0] == Kind.ACK  # after the nonce: let in
        late.close()
        down.close()
        assert links.accepted(0, 3) is None and "before the session nonce was fixed" in str(links.rejections.drain())
    finally:
        links.closed = True
        links.close()


@pytest.mark.parametrize(("contributions", "why"), [
    (None, "does not list the 4 ranks' contributions"),
    (["ab" * 32] * 3, "does not list the 4 ranks' contributions"),
    ([None, "ab" * 32, "ab" * 32, "ab" * 32], "no contribution of rank 0"),
    (["ab" * 32, "AB" * 32, None, None], "not 32 bytes in hex"),
    (["ab" * 32, 7, None, None], "not 32 bytes in hex"),
    (["ab" * 32, "cd" * 32, None, "ef" * 32], "does not follow from its contributions"),
])
def test_the_audits_check_of_a_session_line(contributions: object, why: str) -> None:
    good = ["ab" * 32, "cd" * 32, None, "ef" * 32]
    nonce = derive([None if s is None else bytes.fromhex(s) for s in good]).hex()
    assert session_problem({"nonce": nonce, "from_round": 0, "contributions": good}, 4) is None
    rec = {"nonce": "00" * 32 if why.startswith("does not follow") else nonce, "from_round": 0,
           "contributions": contributions}
    problem = session_problem(rec, 4)
    assert problem is not None and why in problem


# -- the sealed mesh (serverless, gossip): the same function, every rank ≠ 0 contributing in its join ----------------

def mesh(keydir: Path, rank: int) -> Mesh:
    return Mesh(ident(keydir, rank), "serverless", DIGEST, N, ("127.0.0.1", 0), row_limit=ROW + 64,
                init_limit=1 << 20)


def start_mesh(keydir: Path, joining: tuple[int, ...] = (1, 2, 3)) -> tuple[Mesh, dict[int, Mesh], dict[int, str]]:
    """Ranks of ``joining`` join rank 0, which offers the start snapshot; the meshes, and for each joined rank what
    its ``receive_init`` raised ("" when it took the snapshot)."""
    m0 = mesh(keydir, 0)
    others = {r: mesh(keydir, r) for r in joining}
    for m in others.values():
        m.join(*m0.address)
    assert m0.wait_joins(set(joining), 20.0) == set(joining)
    m0.offer({"config": DIGEST, "round": 0})
    errors = {}
    for r, m in others.items():
        try:
            assert m.receive_init(20.0) == {"config": DIGEST, "round": 0}
            errors[r] = ""
        except PhalanxError as exc:
            errors[r] = str(exc)
    return m0, others, errors


def close_all(*meshes: Mesh) -> None:
    for m in meshes:
        m.close(wait_for=set(), timeout=1.0)


def test_every_mesh_rank_contributes_and_checks_the_nonce(keydir: Path) -> None:
    """Rank 0 fixes the nonce when it sends the start snapshot: SHA-256 of its own and every joined rank's share, in
    rank order; each rank takes it only after checking it; a new start of a rank (a resumed job) draws new bytes."""
    m0, others, errors = start_mesh(keydir)
    try:
        assert errors == {1: "", 2: "", 3: ""}
        assert m0.contributions == [m0.share, *(others[r].share for r in (1, 2, 3))]
        assert m0.nonce == derive(m0.contributions) and all(m.nonce == m0.nonce for m in others.values())
        assert len({m0.share, *(m.share for m in others.values())}) == 4
        assert mesh(keydir, 1).share != others[1].share  # (closed by the garbage collector: never joined)
    finally:
        close_all(m0, *others.values())


@pytest.mark.parametrize(("mutant", "refusing", "why"), [
    ("reuse:" + "ab" * 32, {1, 2, 3}, "does not follow from the contributions"),
    ("drop:2", {2}, "this rank's contribution to the session nonce is absent"),
    ("alter:1", {1}, "this rank's contribution to the session nonce is altered"),
])
def test_a_mesh_rank_0_mutant_at_the_nonce_is_refused_by_the_rank_it_cheats(
    keydir: Path, monkeypatch: pytest.MonkeyPatch, mutant: str, refusing: set[int], why: str,
) -> None:
    """The mesh's rank 0 reusing another run's nonce: every rank refuses the start snapshot; dropping or altering one
    rank's share: that rank refuses, the others (their own bytes in the nonce) take it. A rank that refuses holds no
    nonce: it can sign nothing."""
    monkeypatch.setenv(_test_hooks.NONCE_VAR, mutant)
    m0, others, errors = start_mesh(keydir)
    try:
        assert {r for r, e in errors.items() if e} == refusing, errors
        for r in refusing:
            assert errors[r].startswith(f"rank {r}: refused the start snapshot: ") and why in errors[r]
            assert "\n" not in errors[r] and others[r].nonce is None
        assert all(others[r].nonce == m0.nonce for r in set(others) - refusing)
    finally:
        close_all(m0, *others.values())


def test_mutant_a_mesh_rank_that_does_not_check_takes_the_reused_nonce(
    keydir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutant rank (no check: it takes rank 0's nonce as before the contributions) signs under another run's."""
    monkeypatch.setenv(_test_hooks.NONCE_VAR, "reuse:" + "ab" * 32)
    monkeypatch.setattr(mesh_module, "check_init", lambda init, rank, n, mine: init["nonce"])
    m0, others, errors = start_mesh(keydir)
    try:
        assert errors == {1: "", 2: "", 3: ""}
        assert all(m.nonce == bytes.fromhex("ab" * 32) for m in others.values())
    finally:
        close_all(m0, *others.values())


@pytest.mark.parametrize("check", ["kept", "mutant"])
def test_a_mesh_rank_after_the_nonce_was_fixed_or_without_a_share_is_refused(
    keydir: Path, monkeypatch: pytest.MonkeyPatch, check: str,
) -> None:
    """Rank 0 fixed the nonce with ranks 1 and 2 (rank 3 absent from the list): rank 3 joining afterwards is refused
    at its introduction, in one line — its share could no longer count. The mutant (no such refusal) lets it in, to
    wait for a start snapshot that never comes. An introduction without a share (or not 32 bytes in hex) is refused
    with its reason."""
    if check == "mutant":
        monkeypatch.setattr(mesh_module, "too_late", lambda rank: None)
    m0, others, errors = start_mesh(keydir, (1, 2))
    late = mesh(keydir, 3)
    try:
        assert errors == {1: "", 2: ""} and m0.contributions is not None and m0.contributions[3] is None
        if check == "mutant":
            late.join(*m0.address)
            assert 3 in m0.joined
            return
        with pytest.raises(PhalanxError, match="rank 3 came after the session nonce was fixed") as info:
            late.join(*m0.address)
        assert "\n" not in str(info.value) and 3 not in m0.joined
        fresh = mesh(keydir, 0)
        try:
            for share in (None, "ab" * 31, "AB" * 32):
                tls = client_context(ident(keydir, 1)).wrap_socket(socket.create_connection(fresh.address))
                send_phased(tls, Kind.HELLO, 0, 0, json.dumps({"rank": 1, "config": DIGEST, "listen": [
                    "127.0.0.1", 1], **({} if share is None else {"share": share})}).encode())
                kind, _, _, answer = recv_phased(tls, Limits({Kind.REFUSED: 1 << 16, Kind.ACK: 0}))
                tls.close()
                assert kind == Kind.REFUSED and b"not 32 bytes in hex" in answer, answer
            assert fresh.joined == {} and fresh.shares == {}
        finally:
            close_all(fresh)
    finally:
        close_all(m0, late, *others.values())
