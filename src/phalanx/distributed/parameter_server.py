"""Parameter-server topology: rank 0 aggregates and sends θ; workers that crash or go silent do not stop training.

Transport: the c10d ``TCPStore`` (part of torch.distributed). It was chosen over gloo point-to-point by measurement
(torch 2.13, gloo, 2 CPU processes): a receive that times out waiting for a sleeping peer raises
"Application timeout caused pair closure" and the pair to that peer is unusable afterwards, so a silent worker would
be lost for good; collectives block on a dead rank. The store lives in rank 0 (``phalanx launch``) or in torchrun's
agent, so a dead worker only means keys that never appear.

Rank 0 runs the training loop (:class:`~phalanx.training.loop.Loop`) over :class:`ParameterServer`, which is also
worker 0; every other rank runs :class:`ParameterServerWorker`. Round t of the transport:

1. publish ``s/t`` = θ_t; compute its own vector (worker 0);
2. wait at most ``round_timeout`` for the vectors ``v/t/r`` of the computing workers (honest, and the Byzantine
   workers of a data attack); workers that missed the previous round ("suspects") are not waited for, only picked up
   if their vector is already there — a suspect is waited for again once its (late) vector of the previous round
   has arrived, so a worker that was only slow rejoins;
3. vector attacks: publish the honest vectors that arrived as ``h/t`` (the omniscient attacker's view, sent
   explicitly), with the server's context for an adaptive attack (centre, reference gradient, the aggregator
   stream's state), and wait at most ``round_timeout`` more for the Byzantine ranks' vectors;
4. deliver what arrived; the loop's server aggregates m missing workers' round with the rule for f − m, or gives
   the round up when m > f (a checkpoint of the state at the start of round t, then
   :class:`~phalanx.errors.WorkersLostError`; :meth:`ParameterServer.close` tells the workers to stop).
"""

from __future__ import annotations

import hashlib
import json
import queue
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from phalanx.distributed import _test_hooks, wire
from phalanx.errors import ConfigError
from phalanx.training.server import BoundRule
from phalanx.training.state import Received, RoundAborted, SlotPlan, Snapshot
from phalanx.training.transport import Transport, WorkerSlot

if TYPE_CHECKING:
    from phalanx.training.experiment import Experiment

JOIN_TIMEOUT_S = 120.0
"""How long rank 0 waits for every worker to start (import, load data, build the model) before round 0; a worker
not there by then is missing from round 0 on (and counts against f)."""


def config_digest(identity: dict[str, Any]) -> str:
    """A hash of the resolved config: every rank must run the same one."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def check_digest(init: dict[str, Any], digest: str, rank: int) -> None:
    """Refuse to run a config other than rank 0's."""
    if init["config"] != digest:
        raise ConfigError(
            "config", f"rank {rank}'s config", "the same resolved config on every rank (rank 0's differs)",
            "start every rank with the same CONFIG and --set overrides",
        )


def collect(store: dist.Store, keys: dict[int, str], suspects: set[int], timeout: float) -> dict[int, bytes]:
    """The values of ``keys`` (rank → key) present within ``timeout`` seconds.

    Waits for the keys of ranks not in ``suspects``; suspects' keys are only taken if they are already there. When
    everything waited for arrives in time (the normal round) this is one request — ``multi_get`` under a timeout
    (every store request costs a round trip between processes); after a timeout, each key is checked and the present
    ones are read.
    """
    waited = [r for r in keys if r not in suspects]
    got: dict[int, bytes] = {}
    if waited:
        default = store.timeout  # type: ignore[attr-defined]  # (missing from the c10d stubs)
        store.set_timeout(timedelta(seconds=timeout))
        try:
            got = dict(zip(waited, store.multi_get([keys[r] for r in waited])))
        except dist.DistStoreError:
            got = {}
        finally:
            store.set_timeout(default)
    late = [r for r in keys if r not in got and store.check([keys[r]])]
    if late:
        got.update(zip(late, store.multi_get([keys[r] for r in late])))
    return dict(sorted(got.items()))


class Janitor:
    """Removes the keys of rounds older than :data:`~phalanx.distributed.wire.KEEP_ROUNDS`, on its own connection
    to the store, in a background thread: n + 2 requests per round that would otherwise sit on the round's critical
    path.

    ``v/`` and ``h/`` keys are deleted; ``s/<t>`` becomes the tombstone ``LAPSED`` (a worker that far behind gets an
    answer at once, reads ``latest`` and skips ahead). ``vectors=False`` (the asynchronous server, which deletes each
    vector as it reads it): ``v/`` keys are left alone — a version older than ``KEEP_ROUNDS`` may still be within its
    staleness bound, and a delete between the server's check and its read would hold the read for the store's
    timeout (a review).
    """

    def __init__(self, store: dist.Store, n: int, vectors: bool = True) -> None:
        self.store = store.clone()  # type: ignore[attr-defined]  # a new connection (missing from the stubs)
        self.n, self.vectors = n, vectors
        self.reports = False
        """Whether the run's workers send worker-stage reports (``m/`` keys to delete too)."""
        self.rounds: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="phalanx-janitor", daemon=True)
        self.thread.start()

    def round_started(self, t: int) -> None:
        """Round t began: the keys of round t − KEEP_ROUNDS may go."""
        if t >= wire.KEEP_ROUNDS:
            self.rounds.put(t - wire.KEEP_ROUNDS)

    def _run(self) -> None:
        while (old := self.rounds.get()) is not None:
            try:
                self.store.set(wire.key_server(old), wire.LAPSED)
                reports = [wire.key_report(old, r) for r in range(self.n)] if self.reports else []
                vectors = [wire.key_vector(old, r) for r in range(self.n)] if self.vectors else []
                for key in (wire.key_honest(old), *vectors, *reports):
                    self.store.delete_key(key)
            except (dist.DistError, ConnectionError, RuntimeError):  # the store went away: the job is ending
                return

    def close(self) -> None:
        """Finish the queued work and stop the thread."""
        self.rounds.put(None)
        self.thread.join(timeout=10.0)


def fits(size: int, row_bytes: int, state_bytes: int | None = None) -> bool:
    """Whether a vector of ``size`` bytes is a row of this model: exactly ``row_bytes`` (d coordinates), or — from a
    Byzantine rank of a vector attack (``state_bytes`` given) — a row followed by the attack stream's state.

    Nothing else is truncated, padded or reshaped: a LoRA adapter of another rank r′ or on other layers has
    r′·Σ(d_in + d_out) coordinates where the model has r·Σ(d_in + d_out), so it is a row of the wrong length, and the
    rank is missing from the round (counted against f, as a silent worker is; docs/lora.md)."""
    return size == row_bytes or (state_bytes is not None and size == row_bytes + state_bytes)


def misfit_reason(rank: int, t: int, size: int, row_bytes: int, itemsize: int) -> str:
    """One line: rank ``rank``'s vector of round t had ``size`` bytes where the model's row has ``row_bytes``."""
    return (f"rank {rank} sent a round-{t} vector of {size} bytes ({size / itemsize:g} coordinates); this model's "
            f"row is {row_bytes} bytes ({row_bytes // itemsize} coordinates)")


class ServerLinks(Protocol):
    """How the parameter server reaches its workers: the c10d store (:class:`StoreLinks`, no authentication) or
    mutually authenticated TLS connections (:class:`~phalanx.distributed.sealed.SealedLinks`)."""

    def offer(self, init: dict[str, Any]) -> None:
        """Offer the workers the start snapshot ``init`` (every worker's momentum row in ``init['momentum']``)."""

    def joined(self, n: int) -> set[int]:
        """The worker ranks of 1 … n−1 that joined within :data:`JOIN_TIMEOUT_S`."""

    def publish_theta(self, t: int, msg: bytes) -> None:
        """Round t's server message (``THETA`` + θ) to every worker."""

    def arrived(self, t: int, rank: int) -> bool:
        """Whether ``rank``'s vector of round t is here (a late one included)."""

    def collect(self, t: int, ranks: list[int], suspects: set[int], timeout: float) -> dict[int, bytes]:
        """The vectors of round t of ``ranks`` that arrive within ``timeout`` (suspects are not waited for)."""

    def publish_honest(self, t: int, msg: bytes, ranks: list[int]) -> None:
        """Round t's honest-vector message to the Byzantine ranks ``ranks``."""

    def stop(self, t: int, reason: bytes) -> None:
        """Tell every worker to stop (``STOP`` + reason), as the message of round t."""

    def refuse(self, t: int, rank: int, reason: str) -> None:
        """Record that ``rank``'s vector of round t was not used, and why (sealed links: a rejection in the
        transcript; the store: nothing beyond the missing rank, since nothing says who wrote the key)."""

    def reports(self, t: int, ranks: list[int]) -> dict[int, bytes]:
        """The worker-stage reports of round t of ``ranks`` (whose vectors arrived) that are here, not waited for
        (:func:`~phalanx.distributed.wire.absorb_reports`; sealed links: those signed with the vectors)."""

    def close(self) -> None:
        """Release what the links hold (threads, sockets)."""


class StoreLinks:
    """The parameter server's links through the c10d store (see :mod:`phalanx.distributed.wire`): anyone who reaches
    the store can read and write every key, so nothing here says who wrote a vector (docs/security.md).
    ``vectors_read_once``: the reader deletes each vector it reads, and the janitor none (:class:`Janitor`)."""

    def __init__(self, store: dist.Store, vectors_read_once: bool = False) -> None:
        self.store = store
        self.janitor: Janitor | None = None
        self.vectors_read_once = vectors_read_once

    def offer(self, init: dict[str, Any]) -> None:
        wire.put(self.store, "init", wire.pack(init))
        wire.put(self.store, "latest", str(init["round"]))

    def joined(self, n: int) -> set[int]:
        joined = collect(self.store, {r: f"ready/{r}" for r in range(1, n)}, set(), JOIN_TIMEOUT_S)
        self.janitor = Janitor(self.store, n, vectors=not self.vectors_read_once)
        return set(joined)

    def publish_theta(self, t: int, msg: bytes) -> None:
        assert self.janitor is not None, "joined() first"
        wire.put_many(self.store, [wire.key_server(t), "latest"], [msg, str(t).encode()])
        self.janitor.round_started(t)

    def arrived(self, t: int, rank: int) -> bool:
        return bool(self.store.check([wire.key_vector(t, rank)]))

    def collect(self, t: int, ranks: list[int], suspects: set[int], timeout: float) -> dict[int, bytes]:
        return collect(self.store, {r: wire.key_vector(t, r) for r in ranks}, suspects, timeout)

    def publish_honest(self, t: int, msg: bytes, ranks: list[int]) -> None:
        wire.put(self.store, wire.key_honest(t), msg)

    def stop(self, t: int, reason: bytes) -> None:
        wire.put(self.store, wire.key_server(t), wire.STOP + reason)
        wire.put(self.store, "latest", str(t))

    def refuse(self, t: int, rank: int, reason: str) -> None:
        pass

    def reports(self, t: int, ranks: list[int]) -> dict[int, bytes]:
        if self.janitor is not None:
            self.janitor.reports = True
        keys = [wire.key_report(t, r) for r in ranks]
        if not keys:
            return {}
        if self.store.check(keys):  # the normal round: every report came with its vector (one request each way)
            return dict(zip(ranks, self.store.multi_get(keys)))
        here = [r for r, k in zip(ranks, keys) if self.store.check([k])]  # a rank that sent none: not waited for
        return dict(zip(here, self.store.multi_get([wire.key_report(t, r) for r in here]))) if here else {}

    def close(self) -> None:
        if self.janitor is not None:
            self.janitor.close()


class ParameterServer(Transport):
    """Rank 0's side of the parameter-server topology (see the module's docstring), over store or sealed links."""

    def __init__(self, links: ServerLinks | dist.Store, digest: str, round_timeout: float,
                 say: Callable[[str], None]) -> None:
        self.links: ServerLinks = StoreLinks(links) if isinstance(links, dist.Store) else links
        self.digest = digest
        self.timeout = round_timeout
        self.round_timeout = round_timeout
        self.say = say
        self.opened = False
        self.next_round = 0  # the round whose server message the workers read next (a stop message goes there)
        self.last_misfits: dict[int, int] = {}
        self.on_vectors: Callable[[int, dict[int, bytes], list[int]], None] | None = None
        """Called with (round, the payload each accepted rank's row came from, the missing ranks) after every
        exchange: the sealed links' transcript listens here."""

    def open(self, experiment: Experiment, start: Snapshot) -> Snapshot:
        exp = experiment
        self.exp = exp
        n = self.slots = exp.algorithm.per_round(exp.workers)  # processes: one per worker, or per client slot
        state = start.state
        self.next_round = state.round
        worker_streams = {k: v for k, v in start.streams.items() if k != "aggregator"}
        self.links.offer({
            "config": self.digest, "round": state.round, "streams": worker_streams, "momentum": state.momentum,
        })
        self.me: WorkerSlot = exp.algorithm.one_worker(
            exp, 0, start.streams, None if state.momentum is None else state.momentum[0],
        )
        self.me.warm_up()
        joined = self.links.joined(n)
        self.opened = True
        self.suspects = set(range(1, n)) - joined
        if self.suspects:
            self.say(f"ranks {sorted(self.suspects)} did not start within {JOIN_TIMEOUT_S:g} s; training without them")
        self.vector_attack = self.me.vector_attack
        self.reporting = wire.reporting(exp.stages)
        self.attack_state = start.streams["attack"]
        self.dim = exp.problem.dim
        self.itemsize = state.theta.element_size()
        return start

    def streams(self) -> dict[str, Tensor]:
        mine = self.me.streams()
        return {**mine, "attack": self.attack_state} if self.vector_attack else mine

    def exchange(self, theta: Tensor, t: int, rule: BoundRule) -> Received:
        links, exp = self.links, self.exp
        assert self.opened, "open() first"
        _test_hooks.maybe_hold(t)
        msg = wire.THETA + wire.tensor_bytes(theta)
        links.publish_theta(t, msg)
        self.next_round = t + 1
        # a suspect whose vector of the previous round did arrive (late) is back in step: wait for it again
        self.suspects = {r for r in self.suspects if not (t > 0 and links.arrived(t - 1, r))}
        sent, received = len(msg) * (self.slots - 1), 0
        v0 = self.me.vector(theta, t)
        plan = self.me.plan
        rows: dict[int, Tensor] = {} if v0 is None else {0: v0.clone()}
        used: dict[int, bytes] = {}
        phase1 = [r for r in plan.computing if r != 0]
        got = links.collect(t, phase1, self.suspects, self.timeout)
        row_bytes = self.dim * self.itemsize
        misfits: dict[int, int] = {}
        for r, data in got.items():
            received += len(data)
            if fits(len(data), row_bytes):  # anything else (only a Byzantine rank could send it) is missing
                rows[r] = wire.bytes_tensor(data, theta.dtype)
                used[r] = data
            else:
                misfits[r] = len(data)
        if plan.attacking:
            missing_honest = [r for r in plan.honest if r not in rows]
            if len(missing_honest) > exp.f:
                links.publish_honest(t, wire.STOP, [r for r in plan.attacking if r != 0])
                raise RoundAborted(self._named(plan, missing_honest + plan.attacking))
            arrived = [rows[r] for r in plan.honest if r in rows]
            honest = torch.stack(arrived) if arrived else theta.new_zeros(0, self.dim)
            shared = self.attack_state if self.me.shares_attack_stream else None
            hmsg = wire.honest_message(honest, rule.payload(), shared)
            others = [r for r in plan.attacking if r != 0]
            links.publish_honest(t, hmsg, others)
            sent += len(hmsg) * len(others)
            if 0 in plan.attacking:  # rank 0's own client is a Byzantine one this round (federated rounds)
                self.me.attack_gen.set_state(self.attack_state)
                rows[0] = self.me.attack_vector(honest, rule, t)
                self.attack_state = self.me.attack_gen.get_state()
            got = links.collect(t, others, self.suspects, self.timeout)
            state_bytes = self.attack_state.numel()
            bad_states: list[int] = []
            for r, data in got.items():
                received += len(data)
                if not fits(len(data), row_bytes, state_bytes):
                    misfits[r] = len(data)
                    continue
                state = wire.generator_state(data[row_bytes:]) if len(data) > row_bytes else None
                if len(data) > row_bytes and state is None:  # kept, it would break every resume: not used
                    bad_states.append(r)
                    continue
                rows[r] = wire.bytes_tensor(data[:row_bytes], theta.dtype)
                used[r] = data
                if state is not None:
                    self.attack_state = state
            for r in bad_states:
                self.links.refuse(t, r, f"rank {r} sent a round-{t} vector whose attack-stream state no random "
                                        "generator takes: not used")
        self._misfits(t, misfits, row_bytes)
        if self.reporting:  # the other computing ranks' worker-stage measurements, for rank 0's columns (claims)
            wire.absorb_reports(self.reporting, links.reports(t, [r for r in plan.computing if r != 0 and r in used]))
        expected = sorted(set(plan.computing) | set(plan.attacking))
        present = [r for r in expected if r in rows]
        missing = [r for r in expected if r not in rows]
        self.suspects = set(missing)
        if self.on_vectors is not None:
            if 0 in rows:
                used[0] = wire.tensor_bytes(rows[0])
            self.on_vectors(t, used, missing)
        vectors = torch.stack([rows[r] for r in present])
        if plan.clients is None:  # rank r is worker r
            return Received(vectors, present if missing else None, missing, sent, received)
        return Received(vectors, self._named(plan, present), self._named(plan, missing), sent, received,
                        state_rows=False)

    def _misfits(self, t: int, misfits: dict[int, int], row_bytes: int) -> None:
        """Record the rows of round t that were not of this model's length (a LoRA adapter of another rank or of
        other layers, a truncated vector …): each is a rejection of the links, and rank 0 says so on stderr when the
        set of (rank, length) changes — so what a rank sending misfits every round makes it print is bounded."""
        for r, size in misfits.items():
            self.links.refuse(t, r, misfit_reason(r, t, size, row_bytes, self.itemsize))
        if misfits and misfits != self.last_misfits:
            self.say(f"round {t}: rows not of the model's length (counted against f, like a missing worker): "
                     + "; ".join(misfit_reason(r, t, size, row_bytes, self.itemsize)
                                 for r, size in sorted(misfits.items())))
        self.last_misfits = misfits

    @staticmethod
    def _named(plan: SlotPlan, slots: list[int]) -> list[int]:
        """The workers (clients) that the given slots play this round."""
        return slots if plan.clients is None else [plan.clients[r] for r in slots]

    def close(self, error: BaseException | None) -> None:
        """Tell the workers to stop: the run is finished, or (``error``) it stopped early, with the reason."""
        try:
            reason = b"finished" if error is None else str(error).encode()
            self.links.stop(self.next_round, reason)
        except (dist.DistError, ConnectionError, RuntimeError, OSError):  # the links are gone: nobody is listening
            pass
        finally:
            self.links.close()


class WorkerLinks(Protocol):
    """How a worker rank reaches the parameter server (the store or a sealed TLS connection)."""

    def init(self) -> dict[str, Any]:
        """The start snapshot, with ``momentum`` this rank's row (or None)."""

    def ready(self) -> None:
        """Tell the server this rank is ready for round ``init['round']``."""

    def next_message(self, t: int) -> tuple[int, bytes | None]:
        """The server's next message from round t on: ``(t', msg)``, t' ≥ t the round it belongs to (t' > t: the
        rank fell behind and skips to t'), ``msg`` the message (``THETA`` + θ or ``STOP`` + reason) or None when
        only the new round is known."""

    def send_vector(self, t: int, payload: bytes, report: bytes | None = None) -> None:
        """This rank's vector of round t (with a Byzantine rank's attack-stream state appended), and its
        worker-stage report (:func:`~phalanx.distributed.wire.report_message`) if the run's stages make one."""

    def honest(self, t: int) -> bytes | None:
        """Round t's honest-vector message (for a Byzantine rank of a vector attack); None if the round is over."""


class StoreWorkerLinks:
    """A worker's links through the c10d store (see :mod:`phalanx.distributed.wire`)."""

    def __init__(self, store: dist.Store, rank: int) -> None:
        self.store = store
        self.rank = rank

    def init(self) -> dict[str, Any]:
        init: dict[str, Any] = wire.unpack(self.store.get("init"))
        if init["momentum"] is not None:
            init["momentum"] = init["momentum"][self.rank]
        return init

    def ready(self) -> None:
        wire.put(self.store, f"ready/{self.rank}", b"1")

    def next_message(self, t: int) -> tuple[int, bytes | None]:
        # one request: wait for the server's message of round t, read it with the server's current round
        latest_b, msg = self.store.multi_get(["latest", wire.key_server(t)])
        latest = int(latest_b)
        if latest > t or msg[:1] == wire.LAPSED:  # this rank fell behind (it slept, or was slow): catch up
            return max(t, latest), None
        return t, msg

    def send_vector(self, t: int, payload: bytes, report: bytes | None = None) -> None:
        if report is None:
            wire.put(self.store, wire.key_vector(t, self.rank), payload)
        else:  # one request, the report first: rank 0 finds it whenever it finds the vector
            wire.put_many(self.store, [wire.key_report(t, self.rank), wire.key_vector(t, self.rank)], [report, payload])

    def honest(self, t: int) -> bytes | None:
        return bytes(self.store.get(wire.key_honest(t)))


class ParameterServerWorker:
    """A worker rank of the parameter-server topology: send this rank's vector every round until told to stop."""

    def __init__(self, experiment: Experiment, links: WorkerLinks | dist.Store, rank: int, digest: str) -> None:
        self.exp = experiment
        self.links: WorkerLinks = StoreWorkerLinks(links, rank) if isinstance(links, dist.Store) else links
        self.rank = rank
        self.digest = digest

    def run(self) -> None:
        """Serve rounds until the server's stop message (or until the run's last round)."""
        exp, links, rank = self.exp, self.links, self.rank
        init = links.init()
        check_digest(init, self.digest, rank)
        me: WorkerSlot = exp.algorithm.one_worker(exp, rank, init["streams"], init["momentum"])
        me.warm_up()
        links.ready()
        dtype = exp.problem.initial_theta().dtype
        reporting = wire.reporting(exp.stages)
        t = int(init["round"])
        while t < exp.rounds:
            latest, msg = links.next_message(t)
            if latest > t:  # this rank fell behind (it slept, or was slow): catch up
                print(f"[phalanx rank {rank}] behind: skipping rounds {t}…{latest - 1}", file=sys.stderr, flush=True)
                for skipped in range(t, min(latest, exp.rounds)):
                    me.skip(skipped)
                t = latest
            if msg is None:
                continue
            if msg[:1] == wire.STOP:
                return
            theta = wire.bytes_tensor(msg[1:], dtype)
            _test_hooks.maybe_sleep(rank, t)
            v = me.vector(theta, t)
            if v is not None:
                if reporting:  # its worker stages' measurements, with the vector (wire.py's m/<t>/<r>)
                    links.send_vector(t, wire.tensor_bytes(v), _test_hooks.report(rank, wire.report_message(reporting)))
                else:
                    links.send_vector(t, wire.tensor_bytes(v))
            elif rank in me.plan.attacking:
                hmsg = links.honest(t)
                parsed = None if hmsg is None else wire.parse_honest(hmsg, dtype, exp.problem.dim)
                if parsed is not None:
                    honest, payload, attack_state = parsed
                    if attack_state is not None:  # the Byzantine slots change from round to round: the server's
                        me.attack_gen.set_state(attack_state)
                    v = me.attack_vector(honest, BoundRule.from_payload(exp.rule, payload), t)
                    state = _test_hooks.attack_state(rank, wire.tensor_bytes(me.attack_gen.get_state()))
                    links.send_vector(t, wire.tensor_bytes(v) + state)
            t += 1
