"""Parameter-server topology: rank 0 aggregates and sends θ; workers that crash or go silent do not stop training.

Transport: the c10d ``TCPStore`` (part of torch.distributed). It was chosen over gloo point-to-point by measurement
(torch 2.13, gloo, 2 CPU processes): a receive that times out waiting for a sleeping peer raises
"Application timeout caused pair closure" and the pair to that peer is unusable afterwards, so a silent worker would
be lost for good; collectives block on a dead rank. The store lives in rank 0 (``phalanx launch``) or in torchrun's
agent, so a dead worker only means keys that never appear.

Round t on rank 0 (the server, which is also worker 0):

1. publish ``s/t`` = θ_t; compute its own momentum (worker 0);
2. wait at most ``round_timeout`` for the vectors ``v/t/r`` of the computing workers (honest, and the Byzantine
   workers of a data attack); workers that missed the previous round ("suspects") are not waited for, only picked up
   if their vector is already there — a suspect is waited for again once its (late) vector of the previous round
   has arrived, so a worker that was only slow rejoins;
3. vector attacks: publish the honest vectors that arrived as ``h/t`` (the omniscient attacker's view, sent
   explicitly) and wait at most ``round_timeout`` more for the Byzantine ranks' vectors;
4. m workers missing: if m ≤ f, aggregate the n − m received vectors with the rule configured for f − m (each
   missing worker is one the adversary could have controlled, so at most f − m of the received ones are
   Byzantine, and n − m > 2(f − m) still holds); if m > f, write a checkpoint of the state at the start of round t,
   tell the workers to stop, and raise :class:`~phalanx.distributed.errors.WorkersLostError`;
5. step θ with :func:`~phalanx.training.round.aggregate_and_step` (the simulated engine's function).
"""

from __future__ import annotations

import hashlib
import json
import queue
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from phalanx import aggregators
from phalanx.attacks.base import DataAttack
from phalanx.distributed import _test_hooks, wire
from phalanx.distributed.errors import WorkersLostError
from phalanx.distributed.local import LocalWorker
from phalanx.distributed.recorder import Recorder, RoundLog, empty_momentum
from phalanx.errors import PhalanxError
from phalanx.training.round import RoundState, aggregate_and_step
from phalanx.training.schedule import learning_rate
from phalanx.training.trainer import Setup

JOIN_TIMEOUT_S = 120.0
"""How long rank 0 waits for every worker to start (import, load data, build the model) before round 0; a worker
not there by then is missing from round 0 on (and counts against f)."""


def config_digest(setup: Setup) -> str:
    """A hash of the resolved config: every rank must run the same one."""
    return hashlib.sha256(json.dumps(setup.cfg.identity(), sort_keys=True).encode()).hexdigest()


def collect(store: dist.Store, keys: dict[int, str], suspects: set[int], timeout: float) -> dict[int, bytes]:
    """The values of ``keys`` (rank → key) present within ``timeout`` seconds.

    Waits for the keys of ranks not in ``suspects``; suspects' keys are only taken if they are already there. When
    everything waited for arrives in time (the normal round) this is one request — ``multi_get`` under a timeout
    (every store request costs a round trip, ~0.2 ms between processes on the 2-core development machine); after a
    timeout, each key is checked and the present ones are read.
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
    to the store, in a background thread: n + 2 requests per round that used to sit on the round's critical path.

    ``v/`` and ``h/`` keys are deleted; ``s/<t>`` becomes the tombstone ``LAPSED`` (a worker that far behind gets an
    answer at once, reads ``latest`` and skips ahead).
    """

    def __init__(self, store: dist.Store, n: int) -> None:
        self.store = store.clone()  # type: ignore[attr-defined]  # a new connection (missing from the stubs)
        self.n = n
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
                for key in (wire.key_honest(old), *(wire.key_vector(old, r) for r in range(self.n))):
                    self.store.delete_key(key)
            except (dist.DistError, ConnectionError, RuntimeError):  # the store went away: the job is ending
                return

    def close(self) -> None:
        """Finish the queued work and stop the thread."""
        self.rounds.put(None)
        self.thread.join(timeout=10.0)


class _Rules:
    """The configured rule, and the rule for f' = f − m when m workers are missing (made once per f')."""

    def __init__(self, setup: Setup) -> None:
        self.spec = setup.cfg.aggregator
        self.f = setup.cfg.f
        self.cache: dict[int, aggregators.Aggregator] = {self.f: setup.rule}

    def get(self, missing: int, received: int) -> aggregators.Aggregator | str:
        """The rule for ``missing`` absent workers, or why there is none ("" when more than f are missing)."""
        f_eff = self.f - missing
        if f_eff < 0:
            return ""  # the plain case: more than f missing (WorkersLostError says so)
        if f_eff not in self.cache:
            try:
                self.cache[f_eff] = aggregators.make(self.spec, f=f_eff)
            except PhalanxError as exc:
                return f"aggregator {self.spec!r} with f={f_eff}: {exc}"
        rule = self.cache[f_eff]
        if received < rule.min_workers():
            return f"aggregator {self.spec!r} with f={f_eff} needs {rule.min_workers()} vectors, got {received}"
        return rule


def serve(setup: Setup, store: dist.Store, rec: Recorder) -> None:
    """Rank 0 of the parameter-server topology: run every round, write the run directory."""
    cfg = setup.cfg
    n, b, f = cfg.workers, cfg.byzantine, cfg.f
    h = n - b
    dim = setup.problem.dim
    state, gens = rec.start()
    wire.put(store, "init", wire.pack({
        "config": config_digest(setup), "round": state.round, "batches": gens["batches"], "attack": gens["attack"],
        "momentum": state.momentum,
    }))
    wire.put(store, "latest", str(state.round))
    me = LocalWorker(
        0, setup, gens["batches"], gens["attack"], None if state.momentum is None else state.momentum[0],
    )
    me.warm_up()
    joined = collect(store, {r: f"ready/{r}" for r in range(1, n)}, set(), JOIN_TIMEOUT_S)
    suspects = set(range(1, n)) - set(joined)
    if suspects:
        rec._say(f"ranks {sorted(suspects)} did not start within {JOIN_TIMEOUT_S:g} s; training without them")
    vector_attack = b > 0 and not isinstance(setup.attack, DataAttack)
    attack_state = gens["attack"]
    phase1 = {r: r for r in range(1, me.computing)}
    phase2 = list(range(h, n)) if vector_attack else []
    rules = _Rules(setup)
    buf = state.momentum
    last_missing: list[int] = []
    itemsize = state.theta.element_size()
    janitor = Janitor(store, n)
    try:
        for t in range(state.round, cfg.rounds):
            t0 = time.perf_counter()
            start_gens = {"batches": me.batch_gen.get_state(),
                          "attack": attack_state if vector_attack else me.attack_gen.get_state()}
            msg = wire.THETA + wire.tensor_bytes(state.theta)
            wire.put_many(store, [wire.key_server(t), "latest"], [msg, str(t).encode()])
            janitor.round_started(t)
            # a suspect whose vector of the previous round did arrive (late) is back in step: wait for it again
            suspects = {r for r in suspects if not (t > 0 and store.check([wire.key_vector(t - 1, r)]))}
            sent, received = len(msg) * (n - 1), 0
            rows: dict[int, Tensor] = {}
            v0 = me.momentum_vector(state.theta)
            assert v0 is not None
            rows[0] = v0.clone()
            got = collect(store, {r: wire.key_vector(t, r) for r in phase1}, suspects, cfg.round_timeout)
            for r, data in got.items():
                received += len(data)
                if len(data) == dim * itemsize:  # anything else (only a Byzantine rank could send it) is dropped
                    rows[r] = wire.bytes_tensor(data, state.theta.dtype)
            if vector_attack:
                missing_honest = [r for r in range(h) if r not in rows]
                if len(missing_honest) > f:
                    wire.put(store, wire.key_honest(t), wire.STOP)
                    _abort(store, rec, state, start_gens, t, missing_honest + phase2, cfg.round_timeout, f)
                honest = torch.stack([rows[r] for r in range(h) if r in rows])
                hmsg = wire.HONEST + wire.tensor_bytes(honest)
                wire.put(store, wire.key_honest(t), hmsg)
                sent += len(hmsg) * len(phase2)
                got = collect(store, {r: wire.key_vector(t, r) for r in phase2}, suspects, cfg.round_timeout)
                for r, data in got.items():
                    received += len(data)
                    if len(data) >= dim * itemsize:
                        rows[r] = wire.bytes_tensor(data[: dim * itemsize], state.theta.dtype)
                        tail = data[dim * itemsize :]
                        if len(tail) == attack_state.numel():
                            attack_state = wire.bytes_tensor(tail, torch.uint8)
            present = sorted(rows)
            missing = [r for r in range(n) if r not in rows]
            suspects = set(missing)
            rule = rules.get(len(missing), len(present))
            if isinstance(rule, str):
                _abort(store, rec, state, start_gens, t, missing, cfg.round_timeout, f, rule)
            assert not isinstance(rule, str)
            vectors = torch.stack([rows[r] for r in present])
            is_byz = torch.tensor([r >= h for r in present], dtype=torch.bool)
            measure = cfg.evaluates(t)
            theta, agg, result = aggregate_and_step(
                state.theta, vectors, is_byz, rule, previous=state.previous, problem=setup.problem,
                reference_batch=setup.reference_batch, lr=learning_rate(cfg, t), measure=measure,
            )
            if buf is None:
                buf = empty_momentum(n, state.theta)
            buf[present] = vectors
            state = RoundState(theta=theta, momentum=buf, previous=agg, round=t + 1)
            end_gens = {"batches": me.batch_gen.get_state(),
                        "attack": attack_state if vector_attack else me.attack_gen.get_state()}
            log = RoundLog(t, time.perf_counter() - t0, missing, sent, received)
            if missing != last_missing:  # say it when the set of missing ranks changes, not every round
                rec._say(f"round {t}: ranks {missing} missing; aggregating {len(present)} vectors with "
                         f"f={f - len(missing)}" if missing else f"round {t}: every rank is back")
                last_missing = missing
            rec.after_round(state, result, end_gens, log, measure)
    finally:
        janitor.close()
    wire.put(store, wire.key_server(cfg.rounds), wire.STOP + b"finished")
    wire.put(store, "latest", str(cfg.rounds))
    rec.finish()


def _abort(
    store: dist.Store, rec: Recorder, state: RoundState, gens: dict[str, Tensor], t: int, missing: list[int],
    timeout: float, f: int, detail: str = "",
) -> None:
    """Checkpoint the state at the start of round t, tell the workers to stop, raise :class:`WorkersLostError`."""
    path = rec.checkpoint(state, gens)
    err = WorkersLostError(t, sorted(set(missing)), f, timeout, path, detail)
    wire.put(store, wire.key_server(t + 1), wire.STOP + str(err).encode())
    wire.put(store, "latest", str(t + 1))
    raise err


def work(setup: Setup, store: dist.Store, rank: int) -> None:
    """A worker rank of the parameter-server topology: send this rank's vector every round until told to stop."""
    from phalanx.errors import ConfigError

    cfg = setup.cfg
    init: dict[str, Any] = wire.unpack(store.get("init"))
    if init["config"] != config_digest(setup):
        raise ConfigError(
            "config", f"rank {rank}'s config", "the same resolved config on every rank (rank 0's differs)",
            "start every rank with the same CONFIG and --set overrides",
        )
    momentum = init["momentum"]
    me = LocalWorker(rank, setup, init["batches"], init["attack"], None if momentum is None else momentum[rank])
    me.warm_up()
    wire.put(store, f"ready/{rank}", b"1")
    dtype = setup.problem.initial_theta().dtype
    t = int(init["round"])
    while t < cfg.rounds:
        # one request: wait for the server's message of round t, read it with the server's current round
        latest_b, msg = store.multi_get(["latest", wire.key_server(t)])
        latest = int(latest_b)
        if latest > t or msg[:1] == wire.LAPSED:  # this rank fell behind (it slept, or was slow): catch up
            print(f"[phalanx rank {rank}] behind: skipping rounds {t}…{latest - 1}", file=sys.stderr, flush=True)
            for _ in range(t, min(latest, cfg.rounds)):
                me.skip()
            t = max(t, latest)
            continue
        if msg[:1] == wire.STOP:
            return
        theta = wire.bytes_tensor(msg[1:], dtype)
        _test_hooks.maybe_sleep(rank, t)
        v = me.momentum_vector(theta)
        if v is not None:
            wire.put(store, wire.key_vector(t, rank), wire.tensor_bytes(v))
        else:
            hmsg = store.get(wire.key_honest(t))
            if hmsg[:1] == wire.HONEST:
                honest = wire.bytes_tensor(hmsg[1:], dtype, (-1, setup.problem.dim))
                v = me.attack_vector(honest, t)
                payload = wire.tensor_bytes(v) + wire.tensor_bytes(me.attack_gen.get_state())
                wire.put(store, wire.key_vector(t, rank), payload)
        t += 1
