"""An asynchronous parameter server on real processes: FedBuff and BASGD under ``phalanx launch``.

Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022, Alg. 1 (FedBuff); Yang & Li,
"BASGD: Buffered Asynchronous SGD for Byzantine Learning", ICML 2021, Alg. 1. Rank 0 is the server and computes
nothing; ranks 1 … n−1 are workers, each at its own pace: it takes the newest model version it is sent, computes one
minibatch gradient there (FedBuff with one local step, as the simulated algorithm) and sends it tagged with that
version. Server step t (the training loop's round t, which publishes θₜ as version t):

1. every update that arrives — from *any* worker: the server waits on the next arrival, never on a particular
   worker — is checked before it is used (:meth:`Buffer.offer`): a version newer than t, or older than t − S
   (S = ``max_staleness``: **dropped, counted and recorded, never aggregated**), a second update of one worker for
   one version, an older version of a worker than one it already delivered (superseded), a version before the
   session's first (after a resume: ``unpublished``), a payload that is not one row of the model's length, a
   non-finite value, a rank that is not a worker — each dropped and recorded
   (bounded: a count per reason and rank, :data:`~phalanx.distributed.async_buffer.REASONS`);
2. before it waits, the server takes what is already there, at most (S + 1)·(n − 1) arrivals (:meth:`AsyncServer.
   drain_cap`: a flood of notices cannot hold the step); the step holds at most one update per worker —
   its newest version, an older one is dropped as superseded (counted) — as on the simulated clock, where a worker
   delivers at most one update per step. Without this the workers, each of which sends one update per version,
   would queue (n − 1)/K − 1 updates per step more than the buffer takes, and the staleness would grow to the bound
   (measured: it did); updates that arrive after the buffer filled wait for the next step (one per worker). With
   FedBuff and BASGD a worker computes only on a credit of rank 0, carried with each version
   (:mod:`phalanx.distributed.async_credit`), so an honest worker has one update in flight and none is superseded;
3. when the algorithm's buffer is full (:meth:`~phalanx.training.algorithms.asynchronous.Asynchronous.full`: K
   updates for FedBuff, one in each of B buffers for BASGD) the rows the rule aggregates are the algorithm's own
   (:meth:`~phalanx.training.algorithms.asynchronous.Asynchronous.assemble`: FedBuff's 1/√(1 + s) weighting, BASGD's
   buffer means — one source of the math for the simulated and the real server), with staleness s = t − version;
   the loop's server aggregates them with the run's rule and steps θ.

With a filter (Kardam's, Zeno++'s, AFLGuard's), when every live worker's update of version t was rejected and the
buffer is empty, step t is a zero step (:mod:`phalanx.distributed.async_zero`: θ not moved, version t + 1 published).
If no update at all arrives for ``round_timeout`` seconds the step is given up (:class:`RoundAborted`: the loop
writes a checkpoint and stops with :class:`~phalanx.errors.WorkersLostError`); a silent or crashed worker alone never
holds a step up while others deliver. Only an arrival from a worker rank restarts that clock: a skipped ticket or a
notice that names no rank does not, so a store client that draws N tickets without notices (``store.add("async/n",
N)``, possible without keys) holds a step for one ``round_timeout``, not N of them (an attacker's review); a ticket
whose worker died before its notice is skipped as soon as a later notice is there (:class:`StoreArrivals`).

Transports. Without keys the c10d store (:class:`StoreArrivals`): θ as ``s/<t>`` and ``latest`` (the synchronous
server's keys), an update as ``v/<version>/<rank>`` followed by a *notice*: the worker draws a ticket
``store.add("async/n", 1)`` and writes ``async/a/<ticket>``; the server reads tickets in order, so it waits on
whichever worker arrives next. A ticket drawn by a worker that died before writing its notice is skipped once a
later notice is there, or after the step's wait; a notice written late is still read, also while the server waits on
the next ticket. With keys the sealed links
(:class:`SealedArrivals`, :mod:`phalanx.distributed.sealed`): every update is signed for (run, version, rank), one
per worker per version (a second one is a violation of the link; its
eighth closes it), held for the last S + 1 versions only, so the server's memory is bounded by (S + 2)·(n − 1) rows
whatever a worker sends; rank 0's transcript then records every step's signed updates, rows and result
(:mod:`phalanx.distributed.async_transcript`: ``phalanx audit`` recomputes them). torch.distributed's collectives
and gloo point-to-point are not used: a collective waits for every rank, and a gloo receive that times out on a
silent peer leaves the pair unusable (docs/distributed.md).
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from phalanx import waits
from phalanx.attacks import Attack, AttackContext
from phalanx.attacks.base import DataAttack
from phalanx.distributed import _test_hooks, wire
from phalanx.distributed.async_buffer import Buffer
from phalanx.distributed.async_credit import Credits, may_compute, split, trailer
from phalanx.distributed.async_filters import ProcessFilter
from phalanx.distributed.async_zero import summary, zero_rows
from phalanx.distributed.parameter_server import WorkerLinks, check_digest
from phalanx.training.algorithms.asynchronous import TOUCHED, clock_stage
from phalanx.training.algorithms.clock import STATS
from phalanx.training.algorithms.dsgd import poison_rows
from phalanx.training.server import BoundRule
from phalanx.training.shards import sample_batches_of
from phalanx.training.state import Received, RoundAborted, Snapshot
from phalanx.training.transport import Transport

if TYPE_CHECKING:
    from phalanx.training.algorithms.asynchronous import Asynchronous
    from phalanx.training.experiment import Experiment

NOTICES = "async/n"

HOLE = (-1, -1, b"")
"""What :meth:`Arrivals.next` returns for a ticket set aside (its notice not there yet): no arrival, nothing lost."""
LOST = (-1, 0, b"")
"""What :meth:`Arrivals.next` returns for an update announced and gone, of no known rank (a notice that names none, a
ticket set aside and forgotten): counted as ``lost``."""


def notice_key(ticket: int) -> str:
    """The store key of the ``ticket``-th arrival notice (without keys)."""
    return f"async/a/{ticket}"


class Arrivals(Protocol):
    """How updates reach the asynchronous server."""

    last_proof: tuple[str, str, str] | None
    """The SHA-256 and signature of the update :meth:`next` returned last (None without keys)."""

    def publish(self, t: int, msg: bytes, credit: bytes = b"") -> None:
        """Version t's message (``THETA`` + θ, then ``credit``: the workers' credits,
        :func:`~phalanx.distributed.async_credit.trailer`) to every worker."""

    def next(self, timeout: float) -> tuple[int, int, bytes] | None:
        """The next update to arrive, from any worker: (rank, version, payload); None when none within ``timeout``;
        :data:`HOLE` when a ticket was set aside, :data:`LOST` for an update announced and gone."""

    def stale(self) -> Counter[int]:
        """Updates the links themselves dropped as older than the bound, per rank, since the last call."""

    def rejections(self) -> list[dict[str, Any]]:
        """What the links refused since the last call (bounded groups, :mod:`phalanx.distributed.rejections`)."""


class StoreArrivals:
    """Arrivals through the c10d store, without keys (see the module's docstring): nothing says who wrote a key.

    Tickets are read in order. A ticket drawn but without its notice (its worker died between the two, or is a
    moment slower than the worker of the next ticket) does not hold the ones behind it: once a later ticket's notice
    is there — or the whole wait passed — it is set aside (:attr:`skipped`) and looked at again on every later call
    for :attr:`grace` seconds, so a notice written late is still read, and a dead worker's ticket is forgotten.
    Skipping is a *hole*: it does not restart the server's step clock (:meth:`AsyncServer.exchange`), so a store
    client that draws N tickets and writes nothing holds a step one ``round_timeout``, not N of them."""

    LOOK_AHEAD = 8
    """How many later tickets are looked at for a notice before the current one is waited on."""
    SKIPPED_MAX = 256
    """The most tickets set aside at once (the oldest is forgotten first)."""
    POLL_S = 0.05
    """While tickets are set aside, how long one wait on the next ticket lasts before they are looked at again."""

    def __init__(self, links: Any, grace: float) -> None:
        self.links = links  # the synchronous server's StoreLinks (offer, joined, publish_theta, stop, close)
        self.store: dist.Store = links.store
        self.ticket = 1
        self.last_proof: tuple[str, str, str] | None = None
        self.grace = grace
        """How long a ticket set aside is looked at again for a late notice."""
        self.skipped: dict[int, float] = {}
        """Tickets set aside, with when."""
        self.forgotten = 0
        """Tickets forgotten (set aside longer than ``grace``, or the oldest past :data:`SKIPPED_MAX`) not yet
        reported: each is reported once by :meth:`next` as a lost update of no known rank."""

    def publish(self, t: int, msg: bytes, credit: bytes = b"") -> None:
        self.links.publish_theta(t, msg + credit)

    def _skip(self) -> tuple[int, int, bytes]:
        self.skipped[self.ticket] = time.monotonic()
        while len(self.skipped) > self.SKIPPED_MAX:
            del self.skipped[next(iter(self.skipped))]
            self.forgotten += 1
        self.ticket += 1
        return HOLE

    def _late(self) -> int | None:
        """A ticket set aside whose notice is there now (forgetting those set aside more than ``grace`` ago)."""
        now = time.monotonic()
        for ticket, when in list(self.skipped.items()):
            if now - when > self.grace:
                del self.skipped[ticket]
                self.forgotten += 1
            elif self.store.check([notice_key(ticket)]):
                del self.skipped[ticket]
                return ticket
        return None

    def _ahead(self) -> bool:
        """Whether a notice of one of the next :data:`LOOK_AHEAD` tickets already drawn is there."""
        drawn = int(self.store.add(NOTICES, 0))
        return any(self.store.check([notice_key(k)]) for k in range(self.ticket + 1,
                                                                    min(drawn, self.ticket + self.LOOK_AHEAD) + 1))

    def next(self, timeout: float) -> tuple[int, int, bytes] | None:
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            if self.forgotten:
                self.forgotten -= 1
                return LOST
            late = self._late() if self.skipped else None
            if late is not None:
                return self._read(late)
            key = notice_key(self.ticket)
            if self.store.check([key]):
                self.ticket += 1
                return self._read(self.ticket - 1)
            if self._ahead():
                return self._skip()
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # (a ticket drawn and not written within a whole wait is set aside)
                if timeout > 0 and int(self.store.add(NOTICES, 0)) >= self.ticket:
                    return self._skip()
                return None
            if self.skipped:  # look at them again while this one is waited on: their notices may come first, and no
                time.sleep(min(remaining, self.POLL_S))  # later ticket may ever be drawn (every worker waits for its
                continue  # credit); a sleep, not a short store wait: each of those that times out logs two lines
            try:
                self.store.wait([key], timedelta(seconds=max(remaining, 0.001)))
            except dist.DistStoreError:
                continue

    def _read(self, ticket: int) -> tuple[int, int, bytes]:
        """The update ticket's notice names (its notice and vector removed from the store)."""
        key = notice_key(ticket)
        note = bytes(self.store.get(key))
        self.store.delete_key(key)
        try:
            version, rank = (int(x) for x in note.decode().split())
        except (ValueError, UnicodeDecodeError):
            return LOST
        vkey = wire.key_vector(version, rank)
        if not self.store.check([vkey]):
            return rank, version, b""
        payload = bytes(self.store.get(vkey))
        self.store.delete_key(vkey)
        return rank, version, payload

    def stale(self) -> Counter[int]:
        return Counter()

    def rejections(self) -> list[dict[str, Any]]:
        return []


THETA_DIGEST = 32
"""With keys, a worker's signed payload is SHA-256(θ it computed at) ‖ its update: the signature binds θ, not only
the version label rank 0 sent with it (the review's I1)."""


class SealedArrivals:
    """Arrivals over the sealed links (:class:`~phalanx.distributed.sealed.SealedLinks`, with keys): every update
    signed, one per worker per version, versions older than the bound dropped by the links and counted. Each signed
    payload begins with the SHA-256 of the θ the worker computed at (:data:`THETA_DIGEST`); one that names another θ
    than the server published as that version is refused (recorded in the transcript's rejections, not used), so a
    Byzantine worker cannot put two θ digests under one version in the honest server's transcript. The refusal is
    filed under the server's current step (the version named in its reason), like every other refusal of that step:
    filed under the version, it could be drained in a third record of that round, past the 18 groups per round the
    audit allows (attack38's r6). Memory: the digests of the last S + 1 versions."""

    def __init__(self, links: Any, max_staleness: int) -> None:
        self.links = links
        self.last_proof: tuple[str, str, str] | None = None
        self.window = max_staleness
        self.thetas: dict[int, bytes] = {}
        self.step = 0
        """The server's current step (the last version published)."""
        links.window = max_staleness
        links.fresh = []

    def publish(self, t: int, msg: bytes, credit: bytes = b"") -> None:
        self.step = t
        self.thetas[t] = hashlib.sha256(msg[1:]).digest()  # (θ alone: the credits are not what a worker signs)
        for v in [v for v in self.thetas if v < t - self.window]:
            del self.thetas[v]
        self.links.publish_theta(t, msg + credit)

    def next(self, timeout: float) -> tuple[int, int, bytes] | None:
        links = self.links
        with links.cond:
            if not waits.wait_for(links.cond, lambda: bool(links.fresh), timeout):
                return None
            version, rank = links.fresh.pop(0)
            got = links.inbox.get((version, rank))
        self.last_proof = None
        if got is None:
            return rank, version, b""
        body = bytes(got.body)
        theta, row = body[:THETA_DIGEST], body[THETA_DIGEST:]
        published = self.thetas.get(version)
        if len(body) < THETA_DIGEST or (published is not None and theta != published):
            self.links.refuse(self.step, rank, f"rank {rank}'s update of version {version} was computed at another θ "
                              "than the server published as that version (its signed θ digest differs)")
            return rank, version, b""
        self.last_proof = (got.sha256, got.signature, theta.hex())
        return rank, version, row

    def stale(self) -> Counter[int]:
        with self.links.cond:
            late, self.links.late = self.links.late, Counter()
        return late

    def rejections(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.links.new_rejections()
        return out


class AsyncServer(Transport):
    """Rank 0's side (see the module's docstring): the loop's round t is server step t."""

    def __init__(self, links: Any, arrivals: Arrivals, digest: str, round_timeout: float,
                 say: Callable[[str], None]) -> None:
        self.links, self.arrivals = links, arrivals
        self.digest = digest
        self.round_timeout = round_timeout
        self.wait_s = round_timeout
        self.say = say
        self.next_round = 0
        self.started = time.monotonic()
        self.said: set[tuple[str, int]] = set()
        self.live: set[int] = set()
        """The worker ranks that joined: a zero step waits for each one's update of the newest version."""
        self.delivered: set[int] = set()
        """The worker ranks whose update of the newest version arrived (whatever became of it)."""
        self.zero = self.steps = 0
        """Zero steps and steps this session (:mod:`phalanx.distributed.async_zero`)."""
        self.flow = True
        """Whether the workers compute on rank 0's credits (:mod:`phalanx.distributed.async_credit`; not with a
        filtering algorithm, whose zero step waits for every live worker's update of the newest version)."""
        self.credits: Credits | None = None
        self.on_step: Callable[..., None] | None = None
        """With keys, the transcript's hook (:meth:`~phalanx.distributed.transcript.Transcript.step`): step
        t used these updates, made these rows, and the rule's result over them is this; the links' refusals since the
        last step; on a zero step also θₜ and the rejected updates (:mod:`phalanx.distributed.async_zero`)."""

    def open(self, experiment: Experiment, start: Snapshot) -> Snapshot:
        self.exp = experiment
        self.algo: Asynchronous = experiment.algorithm  # type: ignore[assignment]
        n = experiment.workers
        theta = start.state.theta
        self.buffer = Buffer(n, experiment.problem.dim, theta.dtype, self.algo.max_staleness, start.state.round,
                             since=start.state.round)
        self.filter = ProcessFilter(experiment, start.state.own) if self.algo.screens else None
        if self.filter is not None:  # (Kardam's, Zeno++'s, AFLGuard's: from the start's state — a resume's checkpoint)
            self.buffer.judge = self.filter.judge
        self.credits = Credits(n, self.algo.max_staleness, concurrency=self.algo.concurrency) \
            if self.flow and self.filter is None else None
        self.next_round = start.state.round
        self.links.offer({"config": self.digest, "round": start.state.round, "streams": {}, "momentum": None})
        joined = self.links.joined(n)
        self.live = set(joined) & set(range(1, n))
        if set(range(1, n)) - joined:
            self.say(f"ranks {sorted(set(range(1, n)) - joined)} did not start in time; the server goes on without "
                     "waiting for them")
        self.streams_at = start.streams
        return start

    def streams(self) -> dict[str, Tensor]:
        return self.streams_at

    def exchange(self, theta: Tensor, t: int, rule: BoundRule) -> Received:
        buf, algo = self.buffer, self.algo
        _test_hooks.maybe_hold(t)
        msg = wire.THETA + wire.tensor_bytes(theta)
        buf.publish(t)
        if self.filter is not None:
            self.filter.publish(t, theta)
        counts = None if self.credits is None else self.credits.publish(t, {u.rank for u in buf.step})
        credit = trailer(counts)
        self.arrivals.publish(t, msg, credit)
        self.next_round, self.delivered = t + 1, set()
        self.steps += 1
        before = buf.counts()
        sent, received = (len(msg) + len(credit)) * (self.exp.workers - 1), 0
        for _ in range(self.drain_cap()):  # what is already there first (bounded: a flood cannot hold the step)
            if (ready := self.arrivals.next(0.0)) is None:
                break
            received += self._offer(*ready, t)
        take = self._full()
        deadline = time.monotonic() + self.wait_s  # reset by real arrivals only (not a skipped ticket, a junk notice)
        while not take and not self._exhausted():
            got = self.arrivals.next(max(deadline - time.monotonic(), 0.0))
            if got is None:
                raise RoundAborted(sorted({u.rank for u in buf.step} ^ set(range(1, self.exp.workers))),
                                   f"server step {t}: no update arrived within round_timeout="
                                   f"{self.wait_s:g} s")
            if got[0] >= 0:
                deadline = time.monotonic() + self.wait_s
            received += self._offer(*got, t)
            take = self._full()
        groups = self.arrivals.rejections()
        for group in groups:  # (bounded per step: the rejection log's groups)
            self.say(f"server step {t}: refused {group['count']}× from rank {group['rank']}: "
                     f"{(group['samples'] or [group['kind']])[0]}")
        used, buf.step = buf.step[:take], buf.step[take:]
        for u in buf.step:  # (arrived after the buffer filled: kept for the next step, one per worker)
            buf.held.setdefault(u.rank, u)
        buf.step = []
        ids = torch.tensor([u.rank for u in used], dtype=torch.int64)
        staleness = torch.tensor([t - u.version for u in used], dtype=torch.int64)
        if take:
            updates = torch.stack([u.row if u.passed is None else u.passed for u in used]).to(theta)
            vectors, rows, touched = algo.assemble(self.exp, ids, updates, staleness)
        else:  # a zero step (async_zero): every live worker's update of version t rejected, none in the buffer
            vectors, rows, touched = zero_rows(self.exp, [u.rank for u in buf.judged], theta)
            self._zero_step(t)
        if self.on_step is not None and take:  # the result the loop's server will compute: the bound rule, its context
            self.on_step(t, used, vectors, rule(vectors), groups)
        elif self.on_step is not None:
            self.on_step(t, used, vectors, rule(vectors), groups, (theta.detach().clone(), list(buf.judged)))
        own = dict(clock_stage(self.exp).own)
        if self.filter is not None:
            own.update(self.filter.state())
        own[TOUCHED] = touched
        own["stats"] = self._stats(own["stats"], staleness, touched, buf.counts(), before, ids)
        return Received(vectors, rows=rows, state_rows=False, own=own, sent=sent, received=received)

    def drain_cap(self) -> int:
        """How many arrivals a step reads before it looks whether its buffer is full: (S + 1)·(n − 1), what the
        workers can have sent within the bound — honest workers send at most one update per version, so this is all
        of theirs; a worker that writes store notices faster than the server reads them (without keys nothing stops
        it) would otherwise keep the server reading forever."""
        return (self.buffer.max_staleness + 1) * (self.exp.workers - 1)

    def _exhausted(self) -> bool:
        """Whether no update can fill the step (a filtering algorithm's buffer is empty, every live worker's update
        of the newest version arrived, and the filter rejected at least one): a zero step follows
        (:mod:`phalanx.distributed.async_zero`)."""
        return self.filter is not None and not self.buffer.step and bool(self.buffer.judged) and \
            self.live <= self.delivered

    def _zero_step(self, t: int) -> None:
        """Count a zero step at t; say the first one (bounded: one line a session, the rest counted)."""
        self.zero += 1
        if self.zero == 1:
            self.say(f"server step {t}: the filter rejected every live worker's update of version {t} (ranks "
                     f"{sorted(u.rank for u in self.buffer.judged)}): a zero step, θ not moved, version {t + 1} "
                     "published; further ones are counted only")

    def _offer(self, rank: int, version: int, payload: bytes, t: int) -> int:
        """Offer one arrival to the buffer, record why it was dropped (if it was); its size. A :data:`HOLE` is no
        arrival: nothing is counted (a ticket set aside is read later, or reported :data:`LOST` once forgotten)."""
        buf = self.buffer
        if (rank, version, payload) == HOLE:
            return 0
        if version == t and 1 <= rank < self.exp.workers:  # (its update of the newest version came, whatever it is)
            self.delivered.add(rank)
        if self.credits is not None and version <= t:  # (a version not yet published settles nothing)
            self.credits.arrived(rank, version)
        reason = buf.offer(rank, version, payload, self.arrivals.last_proof) if payload else "lost"
        if reason == "lost":
            buf.dropped["lost", rank if 1 <= rank < self.exp.workers else -1] += 1
        if reason is not None and reason != "superseded":  # (superseded: an honest worker's routine, counted only)
            self._record(reason, rank, version, t)
        for late_rank, k in self.arrivals.stale().items():
            buf.dropped["stale", late_rank] += k
            self._record("stale", late_rank, -1, t)
        return len(payload)

    def _full(self) -> int:
        """The length of the step's buffer prefix the algorithm takes (0: not full yet)."""
        step = self.buffer.step
        if not step:
            return 0
        order = torch.tensor([u.rank for u in step], dtype=torch.int64)
        return self.algo.full(self.exp.workers, order, torch.ones(len(step), dtype=torch.bool))

    def _stats(self, old: Tensor, staleness: Tensor, touched: Tensor, after: dict[str, int], before: dict[str, int],
               ids: Tensor) -> Tensor:
        """The clock's statistics (:data:`~phalanx.training.algorithms.clock.STATS`) of a real step: ``sim_time``
        is the server's wall-clock seconds since it started; dropped counts every reason."""
        s = dict(zip(STATS, old.tolist()))
        byz = int((ids >= self.exp.workers - self.exp.byzantine).sum())
        dropped_step = sum(after.values()) - sum(before.values())
        m = len(ids)  # (0: a zero step, whose staleness statistics and share are 0)
        s.update(sim_time=time.monotonic() - self.started, dropped=sum(after.values()),
                 updates=s["updates"] + m, byzantine_updates=s["byzantine_updates"] + byz,
                 staleness_mean=float(staleness.double().mean()) if m else 0.0,
                 staleness_max=float(staleness.max()) if m else 0.0,
                 byzantine_buffer_share=byz / m if m else 0.0, dropped_step=dropped_step,
                 byzantine_rows=int(touched.sum()))
        return torch.tensor([s[k] for k in STATS], dtype=torch.float64)

    def _record(self, reason: str, rank: int, version: int, t: int) -> None:
        """Say the first drop of each (reason, rank) on rank 0's log (bounded: |REASONS| · n lines); all are counted
        (:attr:`Buffer.dropped`, the ``dropped`` metric)."""
        key = (reason, rank if 1 <= rank < self.exp.workers else -1)
        if key in self.said:
            return
        self.said.add(key)
        self.say(f"server step {t}: dropped an update of rank {key[1]} (version {version}): {reason} "
                 f"(max_staleness = {self.buffer.max_staleness}); further ones of this kind are counted only")

    def dropped(self) -> dict[str, int]:
        """Drops per reason over the run (what :meth:`_record` counts)."""
        return self.buffer.counts()

    def close(self, error: BaseException | None) -> None:
        try:
            self.links.stop(self.next_round, b"finished" if error is None else str(error).encode())
        except (dist.DistError, ConnectionError, RuntimeError, OSError):
            pass
        finally:
            self.links.close()
        counts = {k: v for k, v in self.buffer.counts().items() if v} if hasattr(self, "buffer") else {}
        if counts:
            self.say("updates dropped: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        if self.zero:
            self.say(summary(self.zero, self.steps))
        if self.credits is not None:
            self.say(f"credits: {sum(self.credits.granted)} granted, {self.credits.expired} given up after "
                     f"max_staleness = {self.credits.max_staleness} versions, at most {self.credits.most} "
                     "outstanding at once")


class AsyncWorker:
    """A worker rank: take the newest version, compute one minibatch gradient there, send it tagged with the
    version; again, until the server says stop.

    A Byzantine rank (the run's last ``byzantine`` ranks, as on the simulated clock) of a vector attack sends, in
    place of its gradient g, the attack's own code on what it knows — its own update, one row:
    ``attack(AttackContext(honest = g[None], n_byzantine = 1, aggregator = None, round = version))`` with its own
    ``attack`` stream; the protocol gives it θ and nothing else, so only an attack one worker can run alone is
    allowed (``Attack.solo``, :func:`~phalanx.training.algorithms.asynchronous.check_process_attack`). Of a data
    attack (label flip, backdoor, edge case …) it computes its gradient honestly on its batch as the attack object
    transforms it (:func:`~phalanx.training.algorithms.dsgd.poison_rows`, the simulator's call, attacker index
    rank − (n − b), its own ``attack`` stream) while the attack is active at the version.
    """

    def __init__(self, experiment: Experiment, links: WorkerLinks, rank: int, digest: str,
                 notify: Callable[[int], None] | None = None, bind_theta: bool = False) -> None:
        self.exp, self.links, self.rank, self.digest = experiment, links, rank, digest
        self.notify = notify
        self.bind_theta = bind_theta
        """With keys: sign SHA-256(θ) ‖ the update (:data:`THETA_DIGEST`), binding the θ it was computed at."""

    computed = 0
    """The updates this worker sent (with flow control it computes only while rank 0 has granted more)."""

    def run(self) -> None:
        exp, links, rank = self.exp, self.links, self.rank
        try:
            self._serve(exp, links, rank)
        finally:
            log(f"[phalanx rank {rank}] computed {self.computed} updates")

    def _serve(self, exp: Experiment, links: WorkerLinks, rank: int) -> None:
        init = links.init()
        check_digest(init, self.digest, rank)
        links.ready()
        algo: Any = exp.algorithm
        gen = torch.Generator().manual_seed(int(exp.seed) * 1_000_003 + rank)  # this worker's own batches
        byzantine = rank >= exp.workers - exp.byzantine
        attack = exp.attack if byzantine and isinstance(exp.attack, Attack) else None
        poison = exp.attack if byzantine and isinstance(exp.attack, DataAttack) else None
        attack_gen = torch.Generator().manual_seed(int(exp.seed) * 1_000_003 + 500_009 + rank)
        dtype = exp.problem.initial_theta().dtype
        theta_bytes = exp.problem.dim * torch.empty((), dtype=dtype).element_size()
        ids = torch.tensor([rank], dtype=torch.int64)
        t = int(init["round"])
        while t < exp.rounds:
            latest, msg = links.next_message(t)
            if msg is None:
                t = latest
                continue
            if msg[:1] == wire.STOP:
                return
            parts = split(msg, theta_bytes, exp.workers)
            if parts is None or not may_compute(parts[1], rank, self.computed):  # no credit: wait for a version
                t = latest + 1
                continue
            theta = wire.bytes_tensor(parts[0], dtype)
            _test_hooks.maybe_sleep(rank, latest)
            xb, yb = sample_batches_of(exp.data, ids, algo.batch_size, gen)
            if poison is not None and poison.active(latest):  # the simulator's code: its batch, then honest SGD
                xb, yb = poison_rows(poison, xb, yb, 0, exp.data.num_classes, attack_gen,
                                     attackers=[rank - (exp.workers - exp.byzantine)])
            g = exp.problem.grads_each(theta[None], xb, yb)[0]
            if attack is not None:
                g = attack(AttackContext(honest=g[None], n_byzantine=1, f=exp.f, aggregator=None,
                                         generator=attack_gen, round=latest,
                                         knowledge="colluders" if attack.reads_honest else "omniscient"))[0]
            bound = hashlib.sha256(parts[0]).digest() if self.bind_theta else b""
            links.send_vector(latest, bound + wire.tensor_bytes(g))
            self.computed += 1
            if self.notify is not None:
                self.notify(latest)
            t = latest + 1


def store_notifier(store: dist.Store, rank: int) -> Callable[[int], None]:
    """Without keys: after its update of a version is written, a worker announces it (a ticket, then the notice)."""
    lock = threading.Lock()

    def notify(version: int) -> None:
        with lock:
            ticket = int(store.add(NOTICES, 1))
            wire.put(store, notice_key(ticket), f"{version} {rank}")

    return notify


def log(text: str) -> None:
    """A worker's line on stderr."""
    print(text, file=sys.stderr, flush=True)
