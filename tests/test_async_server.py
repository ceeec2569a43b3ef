"""The asynchronous parameter server's logic, in process (phalanx.distributed.async_server): its checks on every
update, each with a mutant that the check's test rejects; its memory under a flood; and its server step, which must
be the simulated FedBuff's and BASGD's math on the same buffer (docs/async.md, "On real processes")."""

from __future__ import annotations

import math
import time
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from phalanx.distributed import async_server, wire
from phalanx.distributed.async_buffer import REASONS, Buffer
from phalanx.distributed.async_server import AsyncServer
from phalanx.errors import ConfigError
from phalanx.experiments import make_config
from phalanx.experiments.build import from_config
from phalanx.training.algorithms import fedbuff
from phalanx.training.state import RoundAborted

DIM = 5
ROW = DIM * 4


def row(*values: float) -> bytes:
    x = torch.zeros(DIM)
    x[: len(values)] = torch.tensor(values)
    return wire.tensor_bytes(x)


class NoDuplicateCheck(Buffer):
    """Mutant: a server that accepts two updates of one worker for one version."""

    def _check(self, rank: int, version: int, payload: bytes | bytearray) -> str | None:
        got = super()._check(rank, version, payload)
        return None if got == "duplicate" else got


class NoStalenessBound(Buffer):
    """Mutant: a server that aggregates updates older than the bound."""

    def _check(self, rank: int, version: int, payload: bytes | bytearray) -> str | None:
        got = super()._check(rank, version, payload)
        return None if got == "stale" else got


class NoShapeCheck(Buffer):
    """Mutant: a server that takes a row of any length (it is cut or padded to d)."""

    def _check(self, rank: int, version: int, payload: bytes | bytearray) -> str | None:
        got = super()._check(rank, version, payload)
        return None if got == "shape" else got

    def offer(self, rank: int, version: int, payload: bytes | bytearray) -> str | None:
        return super().offer(rank, version, (bytes(payload) + bytes(ROW))[:ROW])


class NoFiniteCheck(Buffer):
    """Mutant: a server that buffers NaN rows."""

    def offer(self, rank: int, version: int, payload: bytes | bytearray) -> str | None:
        reason = self._check(rank, version, payload)
        if reason is not None:
            return reason
        self.seen.add((rank, version))
        self.step.append(fedbuff_update(rank, version, payload))
        return None


def fedbuff_update(rank: int, version: int, payload: bytes | bytearray) -> Any:
    from phalanx.distributed.async_buffer import Update

    return Update(rank, version, wire.bytes_tensor(bytes(payload), torch.float32).clone())


def hostile(cls: type[Buffer]) -> dict[str, str | None]:
    """A Byzantine worker's moves against a server at version 5 with S = 2 (workers 1 … 7)."""
    b = cls(workers=8, dim=DIM, dtype=torch.float32, max_staleness=2)
    b.publish(5)
    return {
        "first": b.offer(3, 5, row(1.0)),
        "second for the same version": b.offer(3, 5, row(100.0)),
        "stale": b.offer(4, 2, row(1.0)),
        "future": b.offer(5, 6, row(1.0)),
        "wrong shape": b.offer(6, 4, b"\x00" * (ROW - 4)),
        "nan": b.offer(2, 5, row(float("nan"))),
        "not a worker": b.offer(0, 5, row(1.0)),
        "outside the job": b.offer(9, 5, row(1.0)),
    }


def test_every_bad_update_is_dropped_with_its_reason_and_counted() -> None:
    got = hostile(Buffer)
    assert got == {"first": None, "second for the same version": "duplicate", "stale": "stale", "future": "future",
                   "wrong shape": "shape", "nan": "nonfinite", "not a worker": "rank", "outside the job": "rank"}
    b = Buffer(workers=4, dim=DIM, dtype=torch.float32, max_staleness=2)
    b.publish(5)
    b.offer(3, 5, row(1.0))
    b.offer(3, 5, row(2.0))
    b.offer(3, 1, row(2.0))
    assert b.counts() == {**dict.fromkeys(REASONS, 0), "duplicate": 1, "stale": 1}
    assert [u.rank for u in b.step] == [3] and float(b.step[0].row[0]) == 1.0  # the first one, never the second


def test_a_resumed_buffer_drops_a_version_its_session_never_published() -> None:
    """After a resume from round 6 (S = 3), a worker's update of version 4 — within the bound, but published only by
    the session before the checkpoint — is dropped as ``unpublished`` and counted; version 6 is accepted. The mutant
    buffer that forgets where its session started (``since`` = 0) keeps it."""
    for since, kept, dropped in ((6, [(1, 6)], 1), (0, [(2, 4), (1, 6)], 0)):
        b = Buffer(workers=4, dim=DIM, dtype=torch.float32, max_staleness=3, version=6, since=since)
        b.publish(6)
        assert (b.offer(2, 4, row(1.0)) == "unpublished") == bool(dropped)
        assert b.offer(1, 6, row(2.0)) is None
        assert [(u.rank, u.version) for u in b.step] == kept and b.counts()["unpublished"] == dropped


@pytest.mark.parametrize(("mutant", "move"), [
    (NoDuplicateCheck, "second for the same version"), (NoStalenessBound, "stale"), (NoShapeCheck, "wrong shape"),
    (NoFiniteCheck, "nan"),
])
def test_each_check_rejects_its_mutant(mutant: type[Buffer], move: str) -> None:
    assert hostile(Buffer)[move] is not None
    assert hostile(mutant)[move] is None  # the mutant takes what the server drops: the test above fails on it


class NoOrderCheck(Buffer):
    """The mutant that forgets each worker's newest version: an older one after a newer is taken."""

    def _check(self, rank: int, version: int, payload: bytes | bytearray) -> str | None:
        self.newest.clear()
        return super()._check(rank, version, payload)


@pytest.mark.parametrize(("cls", "taken"), [(Buffer, False), (NoOrderCheck, True)])
def test_a_workers_older_version_after_a_newer_one_is_dropped(cls: type[Buffer], taken: bool) -> None:
    """A Byzantine worker sends version 5, then version 4 (both within the bound, neither a duplicate): the server
    drops the older as superseded, so a worker's aggregated versions increase step after step — what the audit of a
    keyed transcript checks (tests/test_async_audit.py, "stale-kept"). The mutant takes it."""
    b = cls(workers=4, dim=DIM, dtype=torch.float32, max_staleness=3)
    b.publish(5)
    assert b.offer(1, 5, row(1.0)) is None
    b.publish(6)  # (the step took version 5)
    assert (b.offer(1, 4, row(2.0)) is None) is taken
    assert b.counts()["superseded"] == (0 if taken else 1)


def test_a_flooding_worker_is_bounded_by_the_buffer_and_the_versions_in_flight() -> None:
    """10,000 updates from one Byzantine worker (every version, duplicates, junk) and the versions moving on: what
    the server holds never exceeds one step row and one held row per worker and (S + 1)(n − 1) seen pairs; what it
    records, |REASONS| · n counters (ranks 1 … n − 1, and one for every rank outside the job)."""
    n, s = 6, 3
    b = Buffer(workers=n, dim=DIM, dtype=torch.float32, max_staleness=s)
    g = torch.Generator().manual_seed(0)
    for t in range(40):
        b.publish(t)
        for _ in range(250):
            rank = int(torch.randint(-3, n + 3, (1,), generator=g))
            version = t - int(torch.randint(-2, 8, (1,), generator=g))
            payload = row(1.0) if int(torch.randint(0, 4, (1,), generator=g)) else b"junk"
            b.offer(rank, version, payload)
            assert len(b.step) <= n - 1 and len(b.held) <= n - 1
            assert len(b.seen) <= (s + 1) * (n - 1)
        b.step = b.step[:1]  # (the server takes a buffer each step)
    assert len(b.dropped) <= len(REASONS) * n
    assert sum(b.counts().values()) > 9000


class Links:
    def offer(self, init: dict[str, Any]) -> None:
        self.init = init

    def joined(self, n: int) -> set[int]:
        return set(range(1, n))

    def stop(self, t: int, reason: bytes) -> None:
        pass

    def close(self) -> None:
        pass


class Scripted:
    """Arrivals in a scripted order: (rank, version, payload); None when the script is spent."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int, bytes]] = []
        self.last_proof: tuple[str, str] | None = None

    def publish(self, t: int, msg: bytes, credit: bytes = b"") -> None:
        pass

    def next(self, timeout: float) -> tuple[int, int, bytes] | None:
        return self.items.pop(0) if self.items else None

    def stale(self) -> Counter[int]:
        return Counter()

    def rejections(self) -> list[dict[str, Any]]:
        return []


def server(algorithm: str, params: dict[str, Any], workers: int = 5) -> tuple[AsyncServer, Scripted, Any]:
    cfg = make_config({"dataset": "digits", "model": "logreg", "workers": workers, "byzantine": 0, "attack": "none",
                       "aggregator": "mean", "f": 0, "algorithm": algorithm, "algorithm_params": params,
                       "engine": "torchrun", "round_timeout": 1.0})
    exp = from_config(cfg)
    theta = exp.problem.initial_theta()
    exp.algorithm.load_state(exp, exp.algorithm.initial_state(exp, theta))
    arrivals = Scripted()
    srv = AsyncServer(Links(), arrivals, "digest", 1.0, lambda s: None)
    srv.open(exp, SimpleNamespace(state=SimpleNamespace(round=0, theta=theta), streams={}))  # type: ignore[arg-type]
    return srv, arrivals, theta


def updates(k: int, dim: int, seed: int) -> list[torch.Tensor]:
    return list(torch.randn(k, dim, generator=torch.Generator().manual_seed(seed)))


def test_the_real_servers_fedbuff_step_is_the_papers_and_the_simulated_ones() -> None:
    """Steps 0 and 1 of a real FedBuff server (K = 3, S = 2) on scripted arrivals: the rows are Δᵢ/√(1 + sᵢ) with
    sᵢ = t − version (Nguyen et al., AISTATS 2022, §5), exactly what the simulated FedBuff assembles from the same
    buffer; a duplicate, a NaN row and a stale update are dropped, a worker's newer update supersedes its older one
    in a step."""
    srv, arrivals, theta = server("fedbuff", {"buffer_size": 3, "max_staleness": 2}, workers=6)
    d = theta.numel()
    u = updates(8, d, 0)
    b = lambda x: wire.tensor_bytes(x)  # noqa: E731
    arrivals.items = [(1, 0, b(u[0])), (1, 0, b(u[1])), (2, 0, b(torch.full((d,), math.nan))),
                      (3, 0, b(u[3])), (4, 0, b(u[4]))]
    got = srv.exchange(theta, 0, None)  # type: ignore[arg-type]
    assert torch.equal(got.vectors, torch.stack([u[0], u[3], u[4]]))
    assert got.rows == [1, 3, 4]
    assert srv.dropped()["duplicate"] == 1 and srv.dropped()["nonfinite"] == 1
    # worker 2's NaN was its update of version 0: another one for that version is a duplicate
    arrivals.items = [(2, 0, b(u[6])), (5, 0, b(u[5])), (3, 1, b(u[7])), (4, 1, b(u[1]))]
    got = srv.exchange(theta, 1, None)  # type: ignore[arg-type]
    assert srv.dropped()["duplicate"] == 2
    ids, stale = torch.tensor([5, 3, 4]), torch.tensor([1, 0, 0])
    expected = torch.stack([u[5] / math.sqrt(2.0), u[7], u[1]])
    torch.testing.assert_close(got.vectors, expected, rtol=1e-6, atol=0)  # float32 rounding of one product
    simulated, rows, _ = srv.exp.algorithm.assemble(srv.exp, ids, torch.stack([u[5], u[7], u[1]]), stale)
    assert torch.equal(got.vectors, simulated) and rows == got.rows
    # step 3: version 0 is older than S = 2 (dropped, never aggregated); worker 1's version 2 supersedes its version 1
    arrivals.items = [(1, 0, b(u[0])), (1, 1, b(u[2])), (1, 2, b(u[3])), (3, 2, b(u[4])), (2, 3, b(u[5]))]
    got = srv.exchange(theta, 3, None)  # type: ignore[arg-type]
    assert got.rows == [1, 3, 2]
    torch.testing.assert_close(got.vectors, torch.stack([u[3] / math.sqrt(2.0), u[4] / math.sqrt(2.0), u[5]]),
                               rtol=1e-6, atol=0)
    assert srv.dropped()["stale"] == 1 and srv.dropped()["superseded"] == 1
    assert got.own is not None and int(got.own["stats"][1]) == sum(srv.dropped().values())


def test_updates_after_a_full_buffer_wait_for_the_next_step() -> None:
    """K = 2: a third update that arrives while the step fills is the next step's, not lost."""
    srv, arrivals, theta = server("fedbuff", {"buffer_size": 2, "max_staleness": 2})
    u = updates(3, theta.numel(), 3)
    arrivals.items = [(1, 0, wire.tensor_bytes(u[0])), (2, 0, wire.tensor_bytes(u[1])), (3, 0, wire.tensor_bytes(u[2]))]
    assert srv.exchange(theta, 0, None).rows == [1, 2]  # type: ignore[arg-type]
    arrivals.items = [(1, 1, wire.tensor_bytes(u[0]))]
    got = srv.exchange(theta, 1, None)  # type: ignore[arg-type]
    assert got.rows == [3, 1]
    torch.testing.assert_close(got.vectors[0], u[2] / math.sqrt(2.0), rtol=1e-6, atol=0)


class NoHeldStalenessCheck(Buffer):
    """Mutant: the held updates start the next step whatever their age (the check of ``publish`` removed)."""

    def publish(self, t: int) -> None:
        self.version, self.judged = t, []
        self.seen = {(r, v) for r, v in self.seen if t - v <= self.max_staleness}
        held, self.held, self.step = self.held, {}, []
        self.step.extend(held.values())


@pytest.mark.parametrize("buffer", [Buffer, NoHeldStalenessCheck])
def test_a_held_update_that_crosses_the_bound_is_dropped(buffer: type[Buffer], monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 2, S = 2. In step 3 rank 4 sends its version-1 update (staleness 2 = S, accepted) after ranks 1 and 2
    filled the buffer, so it is held for step 4 — where its staleness is 3 > S: it is dropped as stale, never
    aggregated (docs/async.md). The mutant aggregates it at staleness 3 (a review found no test failed on it)."""
    monkeypatch.setattr(async_server, "Buffer", buffer)
    srv, arrivals, theta = server("fedbuff", {"buffer_size": 2, "max_staleness": 2})
    u = updates(5, theta.numel(), 0)
    b = wire.tensor_bytes
    for t in range(3):
        arrivals.items = [(1, t, b(u[0])), (2, t, b(u[1]))]
        srv.exchange(theta, t, None)  # type: ignore[arg-type]
    arrivals.items = [(1, 3, b(u[0])), (2, 3, b(u[1])), (4, 1, b(u[4]))]
    assert srv.exchange(theta, 3, None).rows == [1, 2]  # type: ignore[arg-type]
    arrivals.items = [(1, 4, b(u[0])), (2, 4, b(u[1]))]
    got = srv.exchange(theta, 4, None)  # type: ignore[arg-type]
    if buffer is Buffer:
        assert got.rows == [1, 2] and srv.dropped()["stale"] == 1
    else:
        assert 4 in got.rows and srv.dropped()["stale"] == 0


def test_the_staleness_weighting_is_checked_against_a_mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: FedBuff without its staleness weighting — the real server's step is then not the paper's."""
    monkeypatch.setattr(fedbuff, "staleness_weight", lambda s: torch.ones(s.shape, dtype=torch.float64))
    srv, arrivals, theta = server("fedbuff", {"buffer_size": 2, "max_staleness": 2})
    u = updates(2, theta.numel(), 1)
    arrivals.items = [(1, 0, wire.tensor_bytes(u[0])), (2, 1, wire.tensor_bytes(u[1]))]
    got = srv.exchange(theta, 1, None)  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got.vectors, torch.stack([u[0] / math.sqrt(2.0), u[1]]))


def test_the_real_servers_basgd_step_is_the_buffer_means() -> None:
    """BASGD (B = 2, workers 1 … 4 hashed j mod 2): the step is full once both buffers hold an update; the rows are
    the buffers' means (Yang & Li, ICML 2021, Alg. 1), unweighted."""
    srv, arrivals, theta = server("basgd", {"buffers": 2, "max_staleness": 2})
    u = updates(3, theta.numel(), 2)
    arrivals.items = [(1, 0, wire.tensor_bytes(u[0])), (3, 0, wire.tensor_bytes(u[1])), (2, 0, wire.tensor_bytes(u[2]))]
    got = srv.exchange(theta, 0, None)  # type: ignore[arg-type]
    torch.testing.assert_close(got.vectors, torch.stack([u[2], (u[0] + u[1]) / 2]), rtol=1e-6, atol=1e-7)


def test_silence_gives_the_step_up_instead_of_hanging() -> None:
    srv, arrivals, theta = server("fedbuff", {"buffer_size": 2})
    arrivals.items = [(1, 0, wire.tensor_bytes(torch.zeros(theta.numel())))]
    with pytest.raises(RoundAborted, match="no update arrived"):
        srv.exchange(theta, 0, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("params", "extra", "match"), [
    ({"buffer_size": 4}, {}, "buffer_size"),  # 4 workers: rank 0 serves, 3 compute
    ({"buffer_size": 2, "byzantine_timing": "always_first"}, {}, "byzantine_timing"),
    ({"buffer_size": 2}, {"attack": "alie", "byzantine": 1}, "attack"),  # (signflip is played: test_async_attacks.py)
    ({"buffer_size": 2}, {"topology": "serverless"}, "topology"),
])
def test_what_real_processes_do_not_run_is_refused_in_one_line(params: dict[str, Any], extra: dict[str, Any],
                                                                match: str) -> None:
    data = {"dataset": "digits", "model": "logreg", "workers": 4, "byzantine": 0, "attack": "none",
            "aggregator": "mean", "f": 0, "algorithm": "fedbuff", "algorithm_params": params, "engine": "torchrun",
            **extra}
    with pytest.raises(ConfigError, match=match):
        from_config(make_config(data))
    with pytest.raises(ConfigError, match=r"filter_f=1 .*on processes"):  # 3 worker ranks compute: 3f < 3 fails
        from_config(make_config({**data, "algorithm": "kardam", "algorithm_params": {}, "attack": "none",
                                 "byzantine": 0, "topology": "server"}))


class Holes(Scripted):
    """A store client drew a million tickets and wrote no notice (``store.add("async/n", 10**6)``, possible without
    keys): every call waits out part of its timeout on a missing notice, then skips the ticket — a hole, not an
    arrival; with no time left it reports nothing, as :class:`StoreArrivals` does."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def next(self, timeout: float) -> tuple[int, int, bytes] | None:
        self.calls += 1
        assert self.calls < 1000, "the step went on skipping tickets: each hole restarted its clock"
        if timeout <= 0:
            return None
        time.sleep(min(timeout, 0.01))
        return -1, -1, b""


def test_tickets_drawn_without_notices_hold_a_step_one_round_timeout_not_one_each() -> None:
    """Before, each skipped ticket waited a whole round_timeout: a million holes held the server a million times
    round_timeout (an attacker's review measured 8 holes at 0.5 s: 4.0 s). Now only an arrival from a worker restarts
    the step's clock, so the step is given up once (the loop checkpoints and stops) after a bounded number of skips."""
    srv, _, theta = server("fedbuff", {"buffer_size": 2, "max_staleness": 2})
    srv.arrivals = holes = Holes()
    srv.wait_s = 0.05
    with pytest.raises(RoundAborted):
        srv.exchange(theta, 0, None)  # type: ignore[arg-type]
    assert holes.calls < 1000


def _store_server(wait: float) -> tuple[AsyncServer, Any, torch.Tensor, list[torch.Tensor]]:
    """A real FedBuff server (K = 2) over real StoreArrivals on a c10d HashStore, grace = round_timeout = ``wait``,
    as topologies.py builds it."""
    import torch.distributed as dist

    from phalanx.distributed.async_server import StoreArrivals

    srv, _, theta = server("fedbuff", {"buffer_size": 2, "max_staleness": 2})
    store = dist.HashStore()
    srv.arrivals = StoreArrivals(SimpleNamespace(store=store, publish_theta=lambda t, m: None), wait)
    srv.wait_s = wait
    return srv, store, theta, updates(3, theta.numel(), 0)


def _send(store: Any, ticket: int, rank: int, row: torch.Tensor) -> None:
    """An honest worker's update of version 0: its vector, then the notice of its ``ticket``."""
    from phalanx.distributed.async_server import notice_key

    store.set(wire.key_vector(0, rank), wire.tensor_bytes(row))
    store.set(notice_key(ticket), f"0 {rank}".encode())


def test_a_worker_that_died_between_its_ticket_and_its_notice_does_not_hold_the_ones_behind_it() -> None:
    """Ticket 1 drawn by a worker that crashed, tickets 2 and 3 honest: the step takes 2 and 3 (an attacker's
    review of the step clock: with the grace compared to a wait that was never whole, the hole was never skipped
    and the run stopped with the honest notices unread)."""
    from phalanx.distributed.async_server import NOTICES

    srv, store, theta, u = _store_server(0.5)
    store.add(NOTICES, 3)
    _send(store, 2, 1, u[0])
    _send(store, 3, 2, u[1])
    assert srv.exchange(theta, 0, None).rows == [1, 2]  # type: ignore[arg-type]


def test_a_notice_written_after_its_ticket_was_skipped_is_still_read() -> None:
    """A worker a moment slower than the next one: its ticket is set aside, not lost."""
    from phalanx.distributed.async_server import NOTICES

    srv, store, _, u = _store_server(5.0)
    store.add(NOTICES, 2)
    _send(store, 2, 2, u[1])
    assert srv.arrivals.next(0.0) == (-1, -1, b"")  # ticket 1 set aside: ticket 2's notice is there
    assert srv.arrivals.next(0.0)[0] == 2
    _send(store, 1, 1, u[0])  # ticket 1's notice, late
    rank, version, payload = srv.arrivals.next(0.0)
    assert (rank, version) == (1, 0) and payload == wire.tensor_bytes(u[0])


def test_a_store_client_drawing_a_thousand_tickets_stops_the_step_once() -> None:
    """Without keys anyone who reaches the store can draw tickets: a thousand holes before the honest notices stop
    the step after one round_timeout (the run checkpoints and stops), not a thousand."""
    from phalanx.distributed.async_server import NOTICES

    srv, store, theta, _ = _store_server(0.2)
    store.add(NOTICES, 1000)
    with pytest.raises(RoundAborted):
        srv.exchange(theta, 0, None)  # type: ignore[arg-type]


class _WritesWhileWaited:
    """A c10d store on which a slow worker writes its notice just after the server has looked at ``key`` and found
    nothing there (the event the server cannot see coming: it goes on to wait for ``key``)."""

    def __init__(self, store: Any, key: str, late: Any) -> None:
        self.store, self.key, self.late = store, key, late

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def check(self, keys: list[str]) -> bool:
        there = bool(self.store.check(keys))
        if keys == [self.key] and not there and self.late is not None:
            self.late, late = None, self.late
            late()
        return there


def test_a_late_notice_is_read_while_the_server_waits_on_the_next_ticket() -> None:
    """Ticket 1's worker draws, ticket 2's writes first (1 set aside, 2 read); then every worker waits for its credit,
    so no ticket 3 is ever drawn, and ticket 1's notice comes while the server waits on ticket 3. Before, that wait
    looked only at ticket 3: the notice lay unread for the whole round_timeout and the step was given up (CI, stop 56:
    FedBuff K = 4 on five processes, "1 worker(s) missing … no update arrived within round_timeout=20 s")."""
    from phalanx.distributed.async_server import NOTICES

    srv, store, _, u = _store_server(30.0)
    store.add(NOTICES, 2)
    _send(store, 2, 2, u[1])
    assert srv.arrivals.next(0.0) == (-1, -1, b"")  # ticket 1 set aside: ticket 2's notice is there
    assert srv.arrivals.next(0.0)[0] == 2
    from phalanx.distributed.async_server import notice_key

    srv.arrivals.store = _WritesWhileWaited(store, notice_key(3), lambda: _send(store, 1, 1, u[0]))
    got = srv.arrivals.next(30.0)
    assert got is not None and got[:2] == (1, 0) and got[2] == wire.tensor_bytes(u[0])


def test_a_ticket_set_aside_is_not_counted_lost_until_it_is_forgotten() -> None:
    """Ticket 1 set aside while tickets 2 and 3 fill the step: nothing was lost (before, every skip was counted as a
    lost update of rank −1: the CI log of stop 56 said "lost 3" of a run that lost none). A ticket forgotten after its
    grace is reported once as lost."""
    from phalanx.distributed.async_server import LOST, NOTICES, StoreArrivals

    srv, store, theta, u = _store_server(5.0)
    store.add(NOTICES, 3)
    _send(store, 2, 1, u[0])
    _send(store, 3, 2, u[1])
    assert srv.exchange(theta, 0, None).rows == [1, 2]  # type: ignore[arg-type]
    assert srv.dropped().get("lost", 0) == 0
    arrivals = StoreArrivals(SimpleNamespace(store=store, publish_theta=lambda t, m: None), -1.0)  # grace: none
    store.add(NOTICES, 2)  # tickets 4 and 5: 4 never written, 5 written
    _send(store, 5, 3, u[2])
    arrivals.ticket = 4
    assert arrivals.next(0.0) == (-1, -1, b"")
    assert arrivals.next(0.0)[0] == 3 and arrivals.next(0.0) == LOST and arrivals.next(0.0) is None


def test_an_update_older_than_the_janitors_window_but_within_the_bound_is_read() -> None:
    """S = 20: a slow worker's update of version 0 is read at t = 16, within the bound. Before, the asynchronous
    server without keys kept the synchronous server's janitor, which deleted ``v/<t − 16>/*`` as version t was
    published: the update was counted lost (and a delete between the server's check and its read held the read for
    the store's own timeout, 3600 s on rank 0 — a review). The keyless asynchronous topology's links are built so."""
    import torch.distributed as dist

    from phalanx.distributed import topologies
    from phalanx.distributed.async_server import NOTICES, StoreArrivals, notice_key
    from phalanx.distributed.parameter_server import StoreLinks

    store = dist.HashStore()
    built: list[StoreLinks] = []

    class Recorded(StoreLinks):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    exp = SimpleNamespace(algorithm=SimpleNamespace(max_staleness=20), workers=2)
    rank = SimpleNamespace(renv=SimpleNamespace(rank=0), exp=exp, digest="d", cfg=SimpleNamespace(round_timeout=30.0),
                           identity=None, log=SimpleNamespace(say=print))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(topologies, "_store", lambda r: store)
        mp.setattr(topologies, "StoreLinks", Recorded)
        mp.setattr(topologies, "AsyncServer", lambda links, arrivals, *a: arrivals)
        mp.setattr(topologies, "Part", lambda server: server)
        arrivals = topologies.start_async(rank)  # type: ignore[arg-type]
    assert isinstance(arrivals, StoreArrivals) and built == [arrivals.links]
    links = built[0]
    store.set("ready/1", b"1")
    links.joined(2)
    row = wire.tensor_bytes(torch.arange(4, dtype=torch.float32))
    arrivals.publish(0, b"T")
    store.set(wire.key_vector(0, 1), row)  # the slow worker's vector of version 0 ...
    for t in range(1, 17):  # ... while versions 1 … 16 are published
        arrivals.publish(t, b"T")
    assert links.janitor is not None
    links.janitor.close()  # (its queued deletions done)
    store.add(NOTICES, 1)
    store.set(notice_key(1), b"0 1")  # ... and only then its notice
    assert arrivals.next(0.0) == (1, 0, row)


def test_a_ticket_set_aside_floods_no_store_timeout_warnings(capfd: pytest.CaptureFixture[str]) -> None:
    """While a ticket is set aside the server looks at it again every 0.05 s. It did so with short store waits, and
    each one that timed out printed two c10d warnings on stderr (plain torchrun does not silence them): about 35
    lines a second for as long as the ticket stayed set aside (a review of this session's fix). A real TCPStore,
    one ticket set aside, one second waited on the next."""
    import torch.distributed as dist

    from phalanx.distributed.async_server import NOTICES, StoreArrivals, notice_key

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=60))
    arrivals = StoreArrivals(SimpleNamespace(store=store, publish_theta=lambda t, m: None), 60.0)
    store.add(NOTICES, 2)
    store.set(notice_key(2), b"0 1")  # (its vector is gone: a lost update)
    assert arrivals.next(0.0) == (-1, -1, b"") and arrivals.next(0.0) == (1, 0, b"")
    capfd.readouterr()
    assert arrivals.next(1.0) is None
    said = [line for line in capfd.readouterr().err.splitlines() if "timeout" in line.lower()]
    assert len(said) <= 2, said[:4]
