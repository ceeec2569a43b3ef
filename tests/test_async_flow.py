"""Flow control of the real asynchronous server (issue 36; phalanx.distributed.async_credit, docs/async.md "Flow
control"): a worker computes only on rank 0's credit, so the honest work is aggregated or dropped with a reason
(the mutant without credits over-produces); a lost update, a crashed or silent worker never stalls the server; a
malformed credit gives none; a flood of notices cannot hold a step. The workers are simulated in process against the
real server (:class:`~phalanx.distributed.async_server.AsyncServer`) and read its real published messages."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from tests.test_async_server import Links, Scripted, updates

from phalanx.distributed import wire
from phalanx.distributed.async_credit import Credits, may_compute, split, trailer
from phalanx.distributed.async_server import AsyncServer
from phalanx.experiments import make_config
from phalanx.experiments.build import from_config
from phalanx.training.state import RoundAborted


class Workers(Scripted):
    """Simulated honest workers over the real server's messages. Worker w is free from the step after it delivered;
    a free worker reads each version's message as it is published and, when it may compute (its credit, or no flow
    control), computes there; its update arrives during step version + ``delay[w]`` (or, when no update is due in a
    step, as the next to arrive: :meth:`next`), unless ``lost`` names it (it vanishes: counted as computed, never
    delivered). ``silent`` workers never compute (crashed)."""

    def __init__(self, delay: dict[int, int], dim: int, ranks: int, silent: frozenset[int] = frozenset(),
                 lost: frozenset[tuple[int, int]] = frozenset()) -> None:
        super().__init__()
        self.delay, self.dim, self.ranks, self.silent, self.lost = delay, dim, ranks, silent, lost
        self.free_from = dict.fromkeys(delay, 0)
        self.computed: Counter[int] = Counter()
        self.due: dict[int, list[tuple[int, int, bytes]]] = {}
        self.messages: list[bytes] = []
        self.t = 0

    def publish(self, t: int, msg: bytes, credit: bytes = b"") -> None:
        self.messages.append(msg + credit)
        parts = split(msg + credit, self.dim * 4, self.ranks)
        assert parts is not None
        for w in sorted(self.delay):
            if w in self.silent or self.free_from[w] > t or not may_compute(parts[1], w, self.computed[w]):
                continue
            self.computed[w] += 1
            arrives = t + self.delay[w]
            self.free_from[w] = arrives + 1
            if (w, t) not in self.lost:
                g = torch.Generator().manual_seed(100 * w + t)
                self.due.setdefault(arrives, []).append((w, t, wire.tensor_bytes(torch.randn(self.dim, generator=g))))
        self.items = self.due.pop(t, [])
        self.t = t

    def next(self, timeout: float) -> tuple[int, int, bytes] | None:
        """The next arrival; when none is due in this step the server waits for the earliest one scheduled later
        (time moves on to it: its worker is free from the next version; with every worker in flight one is always
        due, with few in flight — concurrency — all of them may be slow)."""
        if not self.items and self.due:
            self.items = self.due.pop(min(self.due))
            for w, _, _ in self.items:
                self.free_from[w] = self.t + 1
        return super().next(timeout)


def run(workers: Workers, steps: int, flow: bool = True, k: int = 2, s: int = 4,
        credits: Credits | None = None, concurrency: int | None = None) -> tuple[AsyncServer, Counter[int]]:
    """``steps`` steps of the real FedBuff server (K = ``k``, S = ``s``, ``concurrency`` C) fed by ``workers``; the
    server and the updates each rank had aggregated."""
    params: dict[str, int] = {"buffer_size": k, "max_staleness": s}
    if concurrency is not None:
        params["concurrency"] = concurrency
    cfg = make_config({"dataset": "digits", "model": "logreg", "workers": workers.ranks, "byzantine": 0,
                       "attack": "none", "aggregator": "mean", "f": 0, "algorithm": "fedbuff",
                       "algorithm_params": params, "engine": "torchrun", "round_timeout": 1.0})
    exp = from_config(cfg)
    theta = exp.problem.initial_theta()
    exp.algorithm.load_state(exp, exp.algorithm.initial_state(exp, theta))
    srv = AsyncServer(Links(), workers, "digest", 1.0, lambda text: None)
    srv.flow = flow
    srv.open(exp, SimpleNamespace(state=SimpleNamespace(round=0, theta=theta), streams={}))  # type: ignore[arg-type]
    if credits is not None:
        srv.credits = credits
    used: Counter[int] = Counter()
    srv.on_step = lambda t, taken, *rest: used.update(u.rank for u in taken)
    for t in range(steps):
        srv.exchange(theta, t, lambda v: v.mean(0))  # type: ignore[arg-type]
    return srv, used


DELAYS = {1: 0, 2: 0, 3: 0, 4: 0, 5: 1, 6: 1, 7: 2, 8: 2}  # 8 workers, K = 2: they could deliver ~5 updates a step


@pytest.mark.parametrize("flow", [True, False])
def test_with_credits_the_honest_work_is_aggregated_or_dropped_with_a_reason(flow: bool) -> None:
    """8 honest workers of different speeds, K = 2, S = 4, 30 steps, on the real server. Every computed update is
    accounted for — aggregated, dropped with its reason, or in flight — and with credits the work computed is at
    most the updates aggregated + those dropped as stale + n − 1 in flight (none superseded: a worker has one update
    in flight). The mutant without credits (every worker computes on every version it reads) computes more than
    twice that, and the surplus is dropped as superseded."""
    workers = Workers(DELAYS, dim=64 * 10 + 10, ranks=9)
    srv, used = run(workers, 30, flow=flow)
    dropped = srv.dropped()
    computed, aggregated = sum(workers.computed.values()), sum(used.values())
    held = len(srv.buffer.step) + len(srv.buffer.held)
    in_flight = sum(len(v) for v in workers.due.values()) + held
    assert computed == aggregated + sum(dropped.values()) + in_flight
    assert aggregated == 2 * 30
    bound = aggregated + dropped["stale"] + 8
    if flow:
        assert computed <= bound and dropped["superseded"] == 0
        assert srv.credits is not None and srv.credits.expired == 0
    else:
        assert computed > 2 * bound and dropped["superseded"] > aggregated


def test_a_lost_update_or_a_crashed_worker_costs_that_worker_s_versions_never_the_server() -> None:
    """Rank 8 crashed (never computes) and rank 7's update of version 0 is lost on its way: the server steps 20
    times on the others' updates; rank 7's credit is given up after S = 4 versions and granted again, so it computes
    again (at version 5) — and rank 8's every S + 1 versions (re-sent with each version: a worker that missed a
    message reads it in the next). The mutant that never gives a credit up leaves rank 7 idle for the rest of the
    run."""
    for expire in (True, False):
        workers = Workers(DELAYS, dim=64 * 10 + 10, ranks=9, silent=frozenset({8}), lost=frozenset({(7, 0)}))
        credits = Credits(9, 4 if expire else 10**9)
        _, used = run(workers, 20, credits=credits)
        assert sum(used.values()) == 40 and used[8] == 0
        if expire:
            assert workers.computed[7] >= 3 and used[7] >= 2
            assert credits.expired == 1 + 3  # (rank 7's once; rank 8's at versions 5, 10, 15)
            assert split(workers.messages[19], (64 * 10 + 10) * 4, 9)[1][8] == 4  # type: ignore[index] (0, 5, 10, 15)
        else:
            assert workers.computed[7] == 1 and used[7] == 0 and credits.expired == 0


def test_a_malformed_credit_gives_none() -> None:
    """A version's message gives a worker a credit only when it is well formed: θ of the model's length, one count
    per rank (or none: no flow control), none negative. A truncated trailer, counts for a job of another size, a
    negative count or θ of another length gives no credit (the worker waits for the next version). The mutant reader
    that trusts the trailer's own count k (no check of k against the job nor of the message's length) takes a
    credit from the counts of a 3-rank job."""
    theta = bytes(40)
    good = wire.THETA + theta + trailer([0, 1, 2, 0])
    assert split(good, 40, 4) == (theta, [0, 1, 2, 0])
    assert split(wire.THETA + theta + trailer(None), 40, 4) == (theta, None)
    assert may_compute([0, 1, 2, 0], 2, 1) and not may_compute([0, 1, 2, 0], 1, 1) and may_compute(None, 1, 9)
    other_job = wire.THETA + theta + trailer([0, 1, 2])
    bad = [good[:-2], other_job, wire.THETA + theta + trailer([0, -1, 2, 0]),
           wire.THETA + theta[:-4] + trailer([0, 1, 2, 0]), wire.THETA + theta, b""]
    assert all(split(m, 40, 4) is None for m in bad)

    def lax(msg: bytes) -> list[int]:  # the mutant: k from the tail, counts right after θ, nothing checked
        k = int.from_bytes(msg[-4:], "little")
        return [int.from_bytes(msg[41 + 8 * i:49 + 8 * i], "little", signed=True) for i in range(k)]

    assert may_compute(lax(other_job), 1, 0)


def test_credits_ride_on_every_version_and_a_byzantine_worker_that_ignores_them_is_held_to_one_a_step() -> None:
    """Rank 8 ignores its credits and sends an update at every version (and its version 0 again): the buffer keeps
    one of its updates a step (the newest: its older one in the step is superseded, a second of one version a
    duplicate — the existing caps, ``tests/test_async_server.py::test_a_flooding_worker_is_bounded_by_the_buffer_and_
    the_versions_in_flight``) and the honest workers' credits are unchanged by it: each still has one update in
    flight."""
    workers = Workers(DELAYS, dim=64 * 10 + 10, ranks=9, silent=frozenset({8}))
    orig = workers.publish

    def publish(t: int, msg: bytes, credit: bytes = b"") -> None:
        orig(t, msg, credit)
        junk = [(8, v, wire.tensor_bytes(torch.ones(workers.dim))) for v in (0, t, t)]
        workers.items = junk + workers.items

    workers.publish = publish  # type: ignore[method-assign]
    srv, used = run(workers, 15)
    assert used[8] <= 15 and srv.dropped()["duplicate"] >= 15
    honest = sum(workers.computed.values())
    assert honest <= sum(used[w] for w in range(1, 8)) + srv.dropped()["stale"] + 7


def test_a_flood_of_notices_cannot_hold_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncwaste36's drain cap: step 0 leaves two updates held, enough for step 1's K = 2; then 10,000 junk arrivals
    (rank 9, outside the job) are already there when step 1 begins. The server reads at most (S + 1)(n − 1) of them
    before it finds its buffer full and steps; the rest stay unread. The mutant without the cap reads them all (a
    flood written as fast as it is read would hold the step forever)."""
    from tests.test_async_server import server

    class Counting(Scripted):
        read = 0

        def next(self, timeout: float) -> tuple[int, int, bytes] | None:
            got = super().next(timeout)
            self.read += got is not None
            return got

    for capped in (True, False):
        srv, _, theta = server("fedbuff", {"buffer_size": 2, "max_staleness": 2})
        arrivals = Counting()
        srv.arrivals = arrivals
        if not capped:
            monkeypatch.setattr(AsyncServer, "drain_cap", lambda self: 10**9)
        u = updates(4, theta.numel(), 5)
        arrivals.items = [(r, 0, wire.tensor_bytes(u[r - 1])) for r in range(1, 5)]
        assert srv.exchange(theta, 0, None).rows == [1, 2]  # type: ignore[arg-type]
        arrivals.read = 0
        arrivals.items = [(9, 1, b"junk")] * 10_000
        assert srv.exchange(theta, 1, None).rows == [3, 4]  # type: ignore[arg-type]
        assert (arrivals.read <= 3 * 4) is capped
        assert srv.dropped()["rank"] == arrivals.read
        monkeypatch.undo()


def test_the_filtering_algorithms_send_no_credit() -> None:
    """Kardam, Zeno++ and AFLGuard keep every worker computing on every version (their zero step waits for every
    live worker's update of the newest version): their messages carry no counts; FedBuff's carry one per rank."""
    from tests.test_async_zero_step import server as aflguard_server

    srv, arrivals, _, theta, _ = aflguard_server(1.5, {1, 2, 3, 4})
    sent: list[bytes] = []
    arrivals.publish = lambda t, msg, credit=b"": sent.append(msg + credit)  # type: ignore[method-assign]
    arrivals.queue = [(r, 0, wire.tensor_bytes(torch.zeros(theta.numel()))) for r in range(1, 5)]
    srv.exchange(theta, 0, srv.exp.rule)  # type: ignore[arg-type]
    assert srv.credits is None and split(sent[0], theta.numel() * 4, 5) == (sent[0][1:-4], None)
    fedbuff = Workers(DELAYS, dim=64 * 10 + 10, ranks=9)
    run(fedbuff, 1)
    assert split(fedbuff.messages[0], (64 * 10 + 10) * 4, 9)[1] == [0] + [1] * 8  # type: ignore[index]


class Outstanding(Credits):
    """The ledger, recording how many credits are outstanding after each version's grants."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.seen: list[int] = []

    def publish(self, t: int, pending: set[int]) -> list[int]:
        out = super().publish(t, pending)
        self.seen.append(len(self.owed))
        return out


class IgnoresC(Outstanding):
    """The mutant: a grant loop that ignores C (every worker without a credit gets one)."""

    def publish(self, t: int, pending: set[int]) -> list[int]:
        c, self.concurrency = self.concurrency, None
        try:
            return super().publish(t, pending)
        finally:
            self.concurrency = c


@pytest.mark.parametrize("c", [2, 3, 5])
def test_with_concurrency_at_most_c_credits_are_outstanding_and_the_work_is_accounted(c: int) -> None:
    """FedBuff's concurrency on the real server (``algorithm_params.concurrency`` = C < n − 1 = 8, K = 2, S = 4, the
    workers of three speeds, 30 steps): after every version's grants at most C credits are outstanding (exactly C
    here: nothing is lost), every computed update is aggregated, dropped with its reason or in flight, and the work
    computed is at most aggregated + stale drops + C; the longest-waiting order lets every worker compute. The
    server builds its ledger from the config (its closing line says the most outstanding). The mutant grant loop that
    ignores C is caught: 8 outstanding."""
    for ledger in (Outstanding, IgnoresC):
        workers = Workers(DELAYS, dim=64 * 10 + 10, ranks=9)
        credits = ledger(9, 4, concurrency=c)
        srv, used = run(workers, 30, credits=credits, concurrency=c)
        assert srv.credits is credits
        if ledger is IgnoresC:
            assert max(credits.seen) == 8
            continue
        assert max(credits.seen) == c and credits.most == c and credits.expired == 0
        dropped = srv.dropped()
        computed, aggregated = sum(workers.computed.values()), sum(used.values())
        in_flight = sum(len(v) for v in workers.due.values()) + len(srv.buffer.step) + len(srv.buffer.held)
        assert computed == aggregated + sum(dropped.values()) + in_flight and aggregated == 2 * 30
        assert computed <= aggregated + dropped["stale"] + c and dropped["superseded"] == 0
        assert all(workers.computed[w] > 0 for w in DELAYS)


def test_the_server_builds_its_ledger_with_the_configs_concurrency() -> None:
    """Without an injected ledger the server's own is built from ``algorithm_params.concurrency``: at C = 3 the
    messages give 3 first credits (ranks 1–3: a tie at version 0 goes by rank), without the key one to every rank."""
    for c, first in ((3, [0, 1, 1, 1, 0, 0, 0, 0, 0]), (None, [0] + [1] * 8)):
        workers = Workers(DELAYS, dim=64 * 10 + 10, ranks=9)
        srv, _ = run(workers, 5, concurrency=c)
        assert srv.credits is not None and srv.credits.concurrency == c
        assert split(workers.messages[0], (64 * 10 + 10) * 4, 9)[1] == first  # type: ignore[index]


def test_f_silent_credit_holders_cannot_stop_the_server_when_c_leaves_them_room() -> None:
    """A Byzantine rank with its own valid key (or a crashed one) can take its credit and never deliver. With C
    credits outstanding and K deliveries needed a step, the server tolerates C − K silent holders; so on processes
    C ≥ K + f is required (``algorithm_params.concurrency`` below it is refused in one line,
    ``tests/test_async_concurrency.py::test_a_bad_concurrency_is_refused_in_one_line``). Rank 1 — the first credited
    at version 0 — is silent: at C = K + 1 = 3 the server ends all 30 steps on the others, and rank 1's credit is
    given up every S + 1 versions and granted again when its turn comes (it stays silent); the mutant ledger at
    C = K = 2 (the bound without f) is stopped at step 0 — no update within round_timeout, the loop's checkpoint and
    exit."""
    workers = Workers(DELAYS, dim=64 * 10 + 10, ranks=9, silent=frozenset({1}))
    credits = Outstanding(9, 4, concurrency=3)
    _, used = run(workers, 30, credits=credits, concurrency=3)
    assert sum(used.values()) == 60 and used[1] == 0 and max(credits.seen) == 3 and credits.expired >= 1
    mutant = Workers(DELAYS, dim=64 * 10 + 10, ranks=9, silent=frozenset({1}))
    with pytest.raises(RoundAborted, match="server step 0"):
        run(mutant, 30, credits=Outstanding(9, 4, concurrency=2), concurrency=2)
