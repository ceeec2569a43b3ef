"""Server-free topology: every rank all-gathers the n vectors and runs the same aggregation.

Every rank runs the training loop (:class:`~phalanx.training.loop.Loop`) over :class:`AllGather`. Round t: each rank
computes its own vector (worker r; a Byzantine rank of a vector attack contributes a placeholder) and ``all_gather``
builds the ``(n, d)`` matrix; for a vector attack the Byzantine ranks then compute their vectors from the honest
rows (the omniscient view is the gathered matrix itself; the server's context is every rank's own, since every rank
runs the same server) and a second ``all_gather`` distributes them; every rank then aggregates the same matrix and
steps, so all hold the same θ (the rules are deterministic, the aggregator stream is in step on every rank; ranks on
different hardware may differ in the last bits). Rank 0 writes the run directory; the Byzantine ranks append their
attack-stream state to their rows so that rank 0's checkpoints hold it.

What it assumes: every rank is alive. A collective waits at most ``round_timeout`` (the process group's timeout);
a rank that crashed or stayed silent longer makes it fail, and the run stops with
:class:`~phalanx.errors.WorkersLostError` after rank 0 wrote a checkpoint of the last finished round. In this
topology a Byzantine rank sends one vector to everyone (the all-gather cannot equivocate); a real deployment would
need a broadcast protocol to rule out a rank sending different vectors to different peers.

**Sealed** (``keys`` set): the rows travel over the sealed mesh (:mod:`phalanx.distributed.mesh`) instead of gloo and
the store: rank 0 sends the start snapshot over TLS; in round t every rank sends every other its signed row
(phase :data:`GATHER`: ``view ‖ vector``), and under a vector attack each Byzantine rank then sends its signed row
(phase :data:`BYZANTINE`: ``vector ‖ attack-stream state``). ``view`` is the SHA-256 of the row digests this rank
used in round t − 1 (of the start snapshot it received, in a session's first round): every rank checks that each
peer aggregated exactly what it did, so a rank that sent different rows to different peers stops the run instead
of splitting the ranks' models unnoticed; the run's last round, which no next row checks, ends with every rank
sending every other its view of that round (phase :data:`VIEW`), compared the same way. A row that did not arrive
within ``round_timeout``, was rejected (no signature, a signature that does not verify, a second row, a wrong length
or view), or whose sender's connection ended is a **failed collective**, exactly as a gloo failure:
:class:`RoundAborted`, the run stops with a checkpoint of the start of the round (rank 0) and
:class:`~phalanx.errors.WorkersLostError`. Not "missing": the ranks would need to agree on which rows are missing to
stay identical, and nothing here makes them agree. Bit for bit the run without keys. Rank 0's transcript
(``on_rows``) records every row it used, with its digest and signature.

**Worker-stage reports** (a run whose worker stages report, :func:`~phalanx.distributed.wire.reporting`): every rank
measures its own row only, so each rank's row carries its report (:func:`~phalanx.distributed.wire.report_message`)
to every other — over gloo after the vector in a fixed slot (:func:`~phalanx.distributed.wire.slot`), over the mesh
enclosed ahead of the vector under the row's signature (``view ‖ enclose(report, vector)``: a report changed on the
path never verifies, and the view compares it too). Every rank hands its stages the other ranks' reports in rank order
(:func:`~phalanx.distributed.wire.absorb_reports`), after its own update, as the parameter server's rank 0 does:
every honest rank gathered the same rows and the same reports, so every honest rank computes the same metric row —
rank 0's is the one written. A report is its sender's claim: bounded by the stage, dropped when out of bounds (short,
of another tag), it only fills metric columns and never changes a vector. The rows' format is marked in the start
snapshot's config digest (:func:`~phalanx.distributed.wire.marked`): a rank of an earlier release, whose rows carry
no report, is refused at the start in one line, as a rank running another config, either way round. Over gloo the
byte counts are the vectors' (the reports are not counted, as on the server topology); over the mesh they stay the
signed rows', report included.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from phalanx import waits
from phalanx.distributed import _test_hooks, wire
from phalanx.distributed.channel import Kind
from phalanx.distributed.env import RankEnv, resolve_backend
from phalanx.distributed.errors import TransportError
from phalanx.distributed.mesh import EVERYONE, Mesh
from phalanx.distributed.parameter_server import JOIN_TIMEOUT_S, check_digest, collect
from phalanx.distributed.sealed import Accepted
from phalanx.errors import ConfigError, WorkersLostError
from phalanx.training.algorithms.dsgd import OneWorker
from phalanx.training.server import BoundRule
from phalanx.training.stages.base import WorkerStage
from phalanx.training.state import Received, RoundAborted, RoundState, Snapshot
from phalanx.training.transport import Transport

if TYPE_CHECKING:
    from phalanx.training.experiment import Experiment

GATHER, BYZANTINE, VIEW = 0, 1, 2
"""The phases of a sealed round: every rank's row; the Byzantine ranks' rows of a vector attack; in the run's last
round, every rank's view (the digest of the rows it aggregated)."""
VIEW_BYTES = 32


class AllGather(Transport):
    """One rank of the server-free topology (see the module's docstring); over the sealed mesh when ``mesh`` is
    given (then ``store`` is unused)."""

    def __init__(self, store: dist.Store | None, renv: RankEnv, digest: str, round_timeout: float, backend: str,
                 mesh: Mesh | None = None) -> None:
        self.store = store
        self.renv = renv
        self.digest = digest
        self.timeout = round_timeout
        self.round_timeout = round_timeout
        self.backend = backend
        self.mesh = mesh
        self.reporting: list[WorkerStage] = []
        """The run's reporting worker stages (set when the run opens; none until then)."""
        self.on_rows: Callable[[int, list[dict[str, Any]], list[int]], None] | None = None
        """Sealed: called after every exchange with (round, every row used — rank, phase, SHA-256, signature —, the
        missing ranks): rank 0's transcript listens here."""

    def open(self, experiment: Experiment, start: Snapshot) -> Snapshot:
        if self.mesh is not None:
            return self._open_sealed(experiment, start, self.mesh)
        exp, store, rank = experiment, self.store, self.renv.rank
        assert store is not None
        self.exp = exp
        n = exp.workers
        start = shared_start(store, rank, wire.marked(self.digest, exp.stages), start)
        momentum = start.state.momentum
        me = exp.algorithm.one_worker(exp, rank, start.streams, None if momentum is None else momentum[rank])
        if not isinstance(me, OneWorker):  # federated rounds: the server samples the clients
            raise ConfigError("topology", "serverless", f"'server' with algorithm = {exp.algorithm.name!r}")
        self.me = me
        self.reporting = wire.reporting(exp.stages)
        self.attack_state: Tensor = start.streams["attack"]
        self.device = torch.device("cpu")
        if start.state.round >= exp.rounds:  # a finished run: no round to exchange, so no process group to form
            return start  # (a rank that formed one and left at once could break another's connect)
        self.me.warm_up()
        wire.put(store, f"ready/{rank}", b"1")
        joined = collect(store, {r: f"ready/{r}" for r in range(n)}, set(), JOIN_TIMEOUT_S)
        if len(joined) < n:
            lost = sorted(set(range(n)) - set(joined))
            raise WorkersLostError(start.state.round, lost, exp.f, JOIN_TIMEOUT_S, None,
                                   "the serverless topology needs every rank; they did not start")
        backend = resolve_backend(self.backend)
        try:
            dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=n,
                                    timeout=timedelta(seconds=self.timeout))
        except (RuntimeError, dist.DistError) as exc:
            raise TransportError(
                f"rank {rank}: the {backend} process group did not connect ({str(exc)[:200]}); on several machines "
                f"set {'NCCL' if backend == 'nccl' else 'GLOO'}_SOCKET_IFNAME to the network interface that carries "
                "MASTER_ADDR's network (docs/distributed.md)"
            ) from None
        self.device = torch.device("cuda", self.renv.local_rank) if backend == "nccl" else torch.device("cpu")
        return start

    def streams(self) -> dict[str, Tensor]:
        return {**self.me.streams(), "attack": self.attack_state}  # batches (and dp noise) from this rank's worker

    def exchange(self, theta: Tensor, t: int, rule: BoundRule) -> Received:
        if self.mesh is not None:
            return self._exchange_sealed(self.mesh, theta, t, rule)
        exp, me = self.exp, self.me
        n, h, dim = exp.workers, exp.honest, exp.problem.dim
        dtype = theta.dtype
        row_bytes = dim * theta.element_size()
        _test_hooks.maybe_sleep(self.renv.rank, t)
        v = me.vector(theta, t)
        mine = theta.new_zeros(dim) if v is None else v
        try:
            if self.reporting:  # this rank's report in a slot after its vector (the module's docstring)
                size = wire.slot(self.reporting, theta.element_size())
                report = wire.in_slot(_test_hooks.report(self.renv.rank, wire.report_message(self.reporting)), size)
                gathered = self._all_gather(torch.cat([mine, wire.bytes_tensor(report, dtype).to(mine.device)]))
                m = gathered[:, :dim].contiguous()
                slots = {r: wire.disclose(wire.tensor_bytes(gathered[r, dim:])) for r in range(n)}
                self._absorb({r: got[0] for r, got in slots.items() if got is not None})
            else:
                m = self._all_gather(mine)
            traffic = row_bytes * (n - 1)
            if me.vector_attack:
                if me.sends_attack:
                    mine = me.attack_vector(m[:h], rule, t)
                # the Byzantine rows, each with its rank's attack-stream state appended (raw bytes viewed as the
                # vectors' dtype): rank 0 checkpoints the stream it does not run itself
                state_u8 = me.attack_gen.get_state()
                gathered = self._all_gather(torch.cat([mine, state_u8.view(dtype).to(mine.device)]))
                m = torch.cat([m[:h], gathered[h:, :dim]])
                self.attack_state = gathered[n - 1, dim:].cpu().contiguous().view(torch.uint8).clone()
                traffic += (row_bytes + state_u8.numel()) * (n - 1)
            else:
                self.attack_state = me.attack_gen.get_state()  # a data attack's stream runs on every rank alike
        except _CollectiveFailed as exc:
            detail = f"the serverless topology needs every rank alive; a collective failed ({exc})"
            raise RoundAborted([], detail) from None
        # payload this rank sent: its row (+ attack-stream state) to each of the n − 1 others, per all-gather
        return Received(m, sent=traffic, received=traffic)

    def close(self, error: BaseException | None) -> None:
        if self.mesh is not None:
            self.mesh.close(timeout=min(self.timeout, 10.0))
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- sealed ----------------------------------------------------------------------------------------------------

    def _open_sealed(self, exp: Experiment, start: Snapshot, mesh: Mesh) -> Snapshot:
        """The start snapshot from rank 0 over TLS, then every rank's connection to every other (a barrier: the
        serverless topology needs every rank)."""
        self.exp = exp
        rank, n = self.renv.rank, exp.workers
        self.box = RowBox(start.state.round)
        mesh.sink = self.box
        for p, why in dict(mesh.dead).items():  # (a connection that ended before the box was there)
            self.box.gone(p, why)
        lost = "the serverless topology needs every rank; they did not start"
        if rank == 0:
            joined = mesh.wait_joins(set(range(1, n)), JOIN_TIMEOUT_S)
            if len(joined) < n - 1:
                missing = sorted(set(range(1, n)) - joined)
                raise WorkersLostError(start.state.round, missing, exp.f, JOIN_TIMEOUT_S, None, lost)
            init_bytes = mesh.offer(_start_message(start, wire.marked(self.digest, exp.stages)))
        else:
            init = mesh.receive_init(2 * JOIN_TIMEOUT_S)
            check_digest(init, wire.marked(self.digest, exp.stages), rank)
            assert mesh.init_bytes is not None
            init_bytes = mesh.init_bytes
            start = received_start(init)
            # the box was opened at this rank's own fresh start (round 0): a resumed run goes on from rank 0's
            # round, and a peer's row of that round must not be refused as one "which has not begun"
            self.box.advance(start.state.round)
        self.view = hashlib.sha256(init_bytes).digest()
        momentum = start.state.momentum
        me = exp.algorithm.one_worker(exp, rank, start.streams, None if momentum is None else momentum[rank])
        if not isinstance(me, OneWorker):  # federated rounds: the server samples the clients
            raise ConfigError("topology", "serverless", f"'server' with algorithm = {exp.algorithm.name!r}")
        self.me = me
        self.reporting = wire.reporting(exp.stages)
        me.warm_up()
        others = set(range(n)) - {rank}
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        failed = mesh.connect(others, deadline)
        heard = mesh.wait_incoming(others, deadline)
        if failed or heard != others:
            why = "; ".join(f"rank {p}: {why}" for p, why in sorted(failed.items()))
            silent = sorted(others - heard)
            raise WorkersLostError(start.state.round, sorted(set(failed) | set(silent)), exp.f, JOIN_TIMEOUT_S, None,
                                   f"{lost} (or did not connect: {why or f'no connection from ranks {silent}'})")
        mesh.ready.set()
        self.device = torch.device("cpu")
        self.attack_state = start.streams["attack"]
        return start

    def _exchange_sealed(self, mesh: Mesh, theta: Tensor, t: int, rule: BoundRule) -> Received:
        exp, me, rank = self.exp, self.me, self.renv.rank
        n, h, dim = exp.workers, exp.honest, exp.problem.dim
        dtype = theta.dtype
        row_bytes = dim * theta.element_size()
        if rank == 0:
            _test_hooks.maybe_hold(t)
        _test_hooks.maybe_sleep(rank, t)
        mesh.round = t
        self.box.advance(t)
        others = [r for r in range(n) if r != rank]
        v = me.vector(theta, t)
        mine = (theta.new_zeros(dim) if v is None else v).detach().to("cpu", dtype)
        body = self.view + wire.tensor_bytes(mine)
        if self.reporting:  # this rank's report ahead of its vector, under the row's signature
            report = _test_hooks.report(rank, wire.report_message(self.reporting))
            body = self.view + wire.enclose(report, wire.tensor_bytes(mine))
        vectors: dict[int, bytearray] = {}
        reports: dict[int, bytes] = {}
        used: dict[tuple[int, int], Accepted] = {}
        sent = received = 0
        try:
            used[(rank, GATHER)] = self._send(mesh, others, GATHER, t, body)
            sent += len(body) * len(others)
            got = self.box.wait(t, GATHER, others, self.timeout)
            for r, acc in got.items():
                vectors[r] = acc.body[VIEW_BYTES:]
                if self.reporting:  # (the report cut off exactly: one of any length leaves the vector whole)
                    parts = wire.disclose(vectors[r])
                    if parts is None:
                        raise _CollectiveFailed(self._refuse(mesh, r, f"rank {r}'s round-{t} row carries a report "
                                                             "that is not enclosed (a length over its body)"))
                    reports[r], vectors[r] = parts
                    if len(vectors[r]) != row_bytes:
                        raise _CollectiveFailed(self._refuse(mesh, r, f"rank {r}'s round-{t} row has a vector of "
                                                             f"{len(vectors[r])} bytes, not {row_bytes}"))
                elif len(acc.body) != VIEW_BYTES + row_bytes:
                    raise _CollectiveFailed(self._refuse(mesh, r, f"rank {r}'s round-{t} row has {len(acc.body)} "
                                                         f"bytes, not {VIEW_BYTES + row_bytes}"))
                if bytes(acc.body[:VIEW_BYTES]) != self.view:
                    raise _CollectiveFailed(self._refuse(
                        mesh, r, f"rank {r} aggregated other rows in round {t - 1} (or started from another "
                        f"snapshot) than rank {rank}: a rank sent different rows to different peers"))
                used[(r, GATHER)] = acc
                received += len(acc.body)
            rows = [mine if r == rank else wire.bytes_tensor(vectors[r], dtype) for r in range(n)]
            m = torch.stack(rows)
            if self.reporting:
                self._absorb(reports)
            if me.vector_attack:
                if me.sends_attack:
                    mine = me.attack_vector(m[:h], rule, t).detach().to("cpu", dtype)
                state_u8 = me.attack_gen.get_state()
                byzantine = list(range(h, n))
                if rank in byzantine:
                    mine_body = wire.tensor_bytes(mine) + wire.tensor_bytes(state_u8)
                    used[(rank, BYZANTINE)] = self._send(mesh, others, BYZANTINE, t, mine_body)
                    sent += len(mine_body) * len(others)
                got = self.box.wait(t, BYZANTINE, [r for r in byzantine if r != rank], self.timeout)
                for r, acc in got.items():
                    if len(acc.body) != row_bytes + state_u8.numel():
                        raise _CollectiveFailed(self._refuse(mesh, r, f"rank {r}'s round-{t} Byzantine row has "
                                                             f"{len(acc.body)} bytes, not "
                                                             f"{row_bytes + state_u8.numel()}"))
                    if wire.generator_state(acc.body[row_bytes:]) is None:  # kept, it would break every resume
                        raise _CollectiveFailed(self._refuse(mesh, r, f"rank {r}'s round-{t} Byzantine row carries "
                                                             "an attack-stream state no random generator takes"))
                    used[(r, BYZANTINE)] = acc
                    received += len(acc.body)
                byz = [used[(r, BYZANTINE)].body for r in byzantine]
                m = torch.cat([m[:h], torch.stack([wire.bytes_tensor(b[:row_bytes], dtype) for b in byz])])
                self.attack_state = wire.bytes_tensor(byz[-1][row_bytes:], torch.uint8)
            else:
                self.attack_state = me.attack_gen.get_state()  # a data attack's stream runs on every rank alike
            order = sorted(used, key=lambda k: (k[1], k[0]))
            self.view = hashlib.sha256(b"".join(bytes.fromhex(used[k].sha256) for k in order)).digest()
            if t == exp.rounds - 1:  # no next round carries this view: compare it now
                self._confirm_view(mesh, others, t)
        except _CollectiveFailed as exc:
            detail = f"the serverless topology needs every rank alive; a collective failed ({exc})"
            raise RoundAborted([], detail) from None
        if self.on_rows is not None:
            self.on_rows(t, [{"rank": r, "phase": p, "sha256": used[(r, p)].sha256,
                              "signature": used[(r, p)].signature} for r, p in sorted(used)], [])
        return Received(m.to(theta.device), sent=sent, received=received)

    def _confirm_view(self, mesh: Mesh, others: list[int], t: int) -> None:
        """The run's last round: every rank sends every other the digest of the rows it aggregated (phase
        :data:`VIEW`, signed) and checks theirs against its own — a rank that sent different rows to different peers
        in the last round is caught like in any other (the round is given up), not after the run."""
        mesh.send(others, Kind.ROW, VIEW, t, self.view)
        for r, acc in self.box.wait(t, VIEW, others, self.timeout).items():
            if bytes(acc.body) != self.view:
                raise _CollectiveFailed(self._refuse(
                    mesh, r, f"rank {r} aggregated other rows in round {t} (the last) than rank {self.renv.rank}: a "
                    "rank sent different rows to different peers"))

    def _absorb(self, reports: dict[int, bytes]) -> None:
        """This rank's worker stages take the other ranks' reports of the round (claims, in rank order)."""
        wire.absorb_reports(self.reporting, {r: p for r, p in reports.items() if r != self.renv.rank})

    @staticmethod
    def _send(mesh: Mesh, others: list[int], phase: int, t: int, body: bytes) -> Accepted:
        """Sign ``body`` and send it to every other rank; this rank's own row as an :class:`Accepted`."""
        digest, sigs = mesh.send(others, Kind.ROW, phase, t, body)
        return Accepted(bytearray(body), digest.hex(), sigs[EVERYONE].hex())

    @staticmethod
    def _refuse(mesh: Mesh, rank: int, reason: str) -> str:
        """Record a rejection of a row that verified but cannot be used; the reason."""
        mesh.reject(rank, reason)
        return reason

    def _all_gather(self, row: Tensor) -> Tensor:
        """``(n, d)``: every rank's row, in rank order, on the device of ``row`` (the rank's ``device``; the
        collective itself runs on the backend's: ``cuda:LOCAL_RANK`` for NCCL, the CPU for gloo).

        gloo reports a dead or silent peer as a plain ``RuntimeError`` (measured: "Timed out waiting … for send
        operation", "Connection closed by peer"), so any error of the collective call itself means a lost rank.
        """
        mine = row.to(self.device).contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.exp.workers)]
        try:
            dist.all_gather(parts, mine)
        except (RuntimeError, dist.DistError) as exc:
            raise _CollectiveFailed(str(exc).splitlines()[0][:200]) from None
        return torch.stack(parts).to(row.device)


def _start_message(start: Snapshot, digest: str) -> dict[str, Any]:
    """What rank 0 sends every rank at the start (CPU tensors: every rank moves them to its own device)."""
    cpu = start.to("cpu")
    s = cpu.state
    return {"config": digest, "round": s.round, "streams": cpu.streams, "optimizer": cpu.optimizer,
            "momentum": s.momentum, "theta": s.theta, "previous": s.previous, "own": s.own, "rule": cpu.rule,
            "stages": cpu.stages}


def received_start(init: dict[str, Any]) -> Snapshot:
    """The start snapshot a rank other than 0 rebuilds from rank 0's :func:`_start_message`."""
    state = RoundState(init["theta"], init["momentum"], init["previous"], init["round"], own=init["own"])
    return Snapshot(state, init["streams"], init["optimizer"], rule=init.get("rule", {}), stages=init.get("stages", {}))


def shared_start(store: dist.Store, rank: int, digest: str, start: Snapshot) -> Snapshot:
    """The run's start snapshot on every rank of a topology in which every rank runs the loop: rank 0 publishes
    its own (fresh or resumed; as CPU tensors, every rank moves them to its own device — the loop does) and the
    others read it, after checking that rank 0 runs the same configuration (``digest``)."""
    if rank == 0:
        wire.put(store, "init", wire.pack(_start_message(start, digest)))
    init: dict[str, Any] = wire.unpack(store.get("init"))
    check_digest(init, digest, rank)
    if rank == 0:
        return start
    return received_start(init)


class _CollectiveFailed(Exception):
    """A collective did not complete (a peer died, or was silent past the process group's timeout)."""


class RowBox:
    """What a sealed serverless rank received (the mesh's :class:`~phalanx.distributed.mesh.Sink`): each peer's
    row per (round, phase), the rows refused, the peers gone; :meth:`wait` is the collective's receiving half."""

    def __init__(self, round_: int) -> None:
        self.cond = threading.Condition()
        self.rows: dict[tuple[int, int, int], Accepted] = {}
        self.seen: set[tuple[int, int, int]] = set()
        self.refusals: dict[tuple[int, int, int], str] = {}
        self.left: dict[int, str] = {}
        self.floor = round_

    def signed(self, sender: int, kind: Kind, phase: int, t: int, body: bytearray, digest: bytes,
               signature: bytes) -> str | None:
        if kind != Kind.ROW or phase not in (GATHER, BYZANTINE, VIEW):
            return f"rank {sender} sent a {kind.name} frame of phase {phase}, which the serverless topology never sends"
        key = (t, phase, sender)
        with self.cond:
            if key in self.seen or key in self.refusals:  # the first row of a (round, phase) counts
                return f"rank {sender} sent a second row in round {t} (phase {phase})"
            if t < self.floor:
                return f"rank {sender} sent a row of round {t}, which is over"
            if t > self.floor + 1:  # a peer is at most one round ahead (it needs this rank's row to finish one)
                return f"rank {sender} sent a row of round {t}, which has not begun"
            self.rows[key] = Accepted(body, digest.hex(), signature.hex())
            self.seen.add(key)
            self.cond.notify_all()
        return None

    def refused(self, sender: int, kind: Kind, phase: int, t: int, reason: str) -> None:
        with self.cond:
            self.refusals.setdefault((t, phase, sender), reason)
            self.cond.notify_all()

    def gone(self, sender: int, why: str) -> None:
        with self.cond:
            self.left.setdefault(sender, why)
            self.cond.notify_all()

    def advance(self, t: int) -> None:
        """This rank is in round t: rows of earlier rounds go."""
        with self.cond:
            self.floor = t
            for key in [k for k in self.rows if k[0] < t]:
                del self.rows[key]
            for key in [k for k in self.refusals if k[0] < t]:
                del self.refusals[key]
            self.seen = {k for k in self.seen if k[0] >= t}

    def wait(self, t: int, phase: int, senders: list[int], timeout: float) -> dict[int, Accepted]:
        """Round t's rows of ``phase`` from every one of ``senders``, waiting at most ``timeout`` seconds;
        :class:`_CollectiveFailed` at once when a sender's row was refused or its connection ended, or naming the
        first sender whose row did not come in time."""
        keys = {s: (t, phase, s) for s in senders}

        def failed() -> bool:
            return any(k in self.refusals or (k not in self.rows and s in self.left) for s, k in keys.items())

        with self.cond:
            waits.wait_for(self.cond, lambda: failed() or all(k in self.rows for k in keys.values()), timeout)
            for s, key in keys.items():
                if key in self.refusals:
                    raise _CollectiveFailed(f"rank {s}'s row of round {t} was rejected: {self.refusals[key]}")
            for s, key in keys.items():
                if key not in self.rows and s in self.left:
                    raise _CollectiveFailed(f"rank {s} left before its row of round {t} came ({self.left[s]})")
            for s, key in keys.items():
                if key not in self.rows:
                    raise _CollectiveFailed(f"no row of rank {s} in round {t} within round_timeout")
            return {s: self.rows.pop(key) for s, key in keys.items()}
