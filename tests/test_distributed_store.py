"""The server's store helpers on a real in-process c10d TCPStore: ``collect`` (one request when everything arrives,
partial results after a timeout, suspects not waited for) and the ``Janitor`` (old rounds' keys removed off the
critical path, the server's message replaced by a tombstone)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from phalanx.distributed import wire
from phalanx.distributed.env import free_port
from phalanx.distributed.parameter_server import Janitor, StoreLinks, StoreWorkerLinks, collect


@pytest.fixture
def store() -> Iterator[dist.Store]:
    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, None, True, timeout=timedelta(seconds=30), use_libuv=True)
    yield dist.PrefixStore("test/", host)


def test_collect_everything_present(store: dist.Store) -> None:
    store.multi_set(["a", "b"], [b"1", b"2"])
    assert collect(store, {1: "a", 2: "b"}, set(), timeout=5.0) == {1: b"1", 2: b"2"}
    assert store.timeout == timedelta(seconds=30)  # type: ignore[attr-defined]  # the default is restored


def test_collect_waits_for_a_late_key(store: dist.Store) -> None:
    store.set("a", b"1")
    started = threading.Event()

    def late() -> None:  # set "b" only once collect has begun waiting
        started.wait(30)
        store.clone().set("b", b"2")  # type: ignore[attr-defined]

    threading.Thread(target=late, daemon=True).start()
    spy = _Spy(store, on_wait=started.set)
    assert collect(spy, {1: "a", 2: "b"}, set(), timeout=30.0) == {1: b"1", 2: b"2"}  # "b" came after the wait began


def test_collect_returns_what_arrived_after_the_timeout(store: dist.Store) -> None:
    store.multi_set(["a", "c"], [b"1", b"3"])
    got = collect(store, {1: "a", 2: "b", 3: "c"}, set(), timeout=0.3)
    assert got == {1: b"1", 3: b"3"}
    assert store.timeout == timedelta(seconds=30)  # type: ignore[attr-defined]


class _Spy:
    """A store that records which keys were read with a wait (``multi_get``) and which were only checked."""

    def __init__(self, store: dist.Store, on_wait: Callable[[], None] = lambda: None) -> None:
        self.store, self.on_wait = store, on_wait
        self.waited: list[list[str]] = []

    @property
    def timeout(self) -> timedelta:
        return self.store.timeout  # type: ignore[attr-defined, no-any-return]

    def set_timeout(self, t: timedelta) -> None:
        self.store.set_timeout(t)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.waited.append(list(keys))
        self.on_wait()
        return self.store.multi_get(keys)

    def check(self, keys: list[str]) -> bool:
        return self.store.check(keys)


def test_collect_does_not_wait_for_suspects(store: dist.Store) -> None:
    store.set("a", b"1")
    spy = _Spy(store)
    assert collect(spy, {1: "a", 2: "b"}, {2}, timeout=3600.0) == {1: b"1"}  # rank 2's key is absent: not waited
    assert spy.waited == [["a"]]  # only rank 1's key was waited for; "b" was only checked
    store.set("b", b"2")
    assert collect(store, {1: "a", 2: "b"}, {2}, timeout=10.0) == {1: b"1", 2: b"2"}  # present: taken


def test_janitor_removes_old_rounds_and_leaves_a_tombstone(store: dist.Store) -> None:
    n, keep = 3, wire.KEEP_ROUNDS
    janitor = Janitor(store, n)
    for t in range(keep + 2):
        store.multi_set(
            [wire.key_server(t), wire.key_honest(t), *(wire.key_vector(t, r) for r in range(n))], [b"T"] * (n + 2),
        )
        janitor.round_started(t)
    janitor.close()
    for old in (0, 1):  # rounds t − KEEP_ROUNDS for t = KEEP, KEEP + 1
        assert store.get(wire.key_server(old)) == wire.LAPSED
        assert not store.check([wire.key_honest(old)])
        assert not any(store.check([wire.key_vector(old, r)]) for r in range(n))
    assert store.get(wire.key_server(2)) == b"T" and store.check([wire.key_vector(2, 0)])  # recent rounds stay


def test_reports_are_read_with_their_vectors_and_a_rank_without_one_is_not_waited_for(store: dist.Store) -> None:
    """Worker-stage reports (``m/<t>/<r>``, tests/test_stage_reports.py): a worker writes its report and its vector in
    one request; rank 0 reads the reports of the ranks whose vectors it used, at once — a rank that sent none (a peer
    of another release, a Byzantine one) is skipped, not waited for — and the janitor removes old rounds' reports."""
    links = StoreLinks(store)
    links.joined(1)
    for r in (1, 2):
        StoreWorkerLinks(store, r).send_vector(0, b"v", b"R1report" if r == 1 else None)
    assert store.get(wire.key_vector(0, 1)) == b"v" and store.get(wire.key_vector(0, 2)) == b"v"
    assert links.reports(0, [1]) == {1: b"R1report"}
    assert links.reports(0, [1, 2]) == {1: b"R1report"}  # rank 2's is not there: the 30 s store timeout not spent
    assert links.reports(0, []) == {}
    janitor = links.janitor
    assert janitor is not None and janitor.reports
    janitor.n = 3
    for t in range(1, wire.KEEP_ROUNDS + 1):
        janitor.round_started(t)
    janitor.close()
    assert not store.check([wire.key_report(0, 1)])


def test_an_attack_state_is_kept_only_if_a_generator_takes_it() -> None:
    """What rank 0 keeps of a Byzantine rank's attack-stream state (parameter server, serverless, gossip): a
    generator's state, bytes or tensor; 0xff bytes of the right length, a state cut short, or nothing are refused
    (kept, they made every resume fail in ``set_state``)."""
    import torch

    state = torch.Generator().manual_seed(7).get_state()
    kept = wire.generator_state(wire.tensor_bytes(state))
    assert kept is not None and torch.equal(kept, state)
    assert wire.generator_state(state) is not None
    for bad in (b"\xff" * state.numel(), wire.tensor_bytes(state)[:-1], b"", state[:100]):
        assert wire.generator_state(bad) is None
