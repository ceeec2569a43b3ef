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
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from phalanx.distributed import _test_hooks, wire
from phalanx.distributed.env import RankEnv, resolve_backend
from phalanx.distributed.errors import TransportError
from phalanx.distributed.parameter_server import JOIN_TIMEOUT_S, check_digest, collect
from phalanx.errors import ConfigError, WorkersLostError
from phalanx.training.dsgd import OneWorker
from phalanx.training.server import BoundRule
from phalanx.training.state import Received, RoundAborted, RoundState, Snapshot
from phalanx.training.transport import Transport

if TYPE_CHECKING:
    from phalanx.training.experiment import Experiment


class AllGather(Transport):
    """One rank of the server-free topology (see the module's docstring)."""

    def __init__(self, store: dist.Store, renv: RankEnv, digest: str, round_timeout: float, backend: str) -> None:
        self.store = store
        self.renv = renv
        self.digest = digest
        self.timeout = round_timeout
        self.round_timeout = round_timeout
        self.backend = backend

    def open(self, experiment: Experiment, start: Snapshot) -> Snapshot:
        exp, store, rank = experiment, self.store, self.renv.rank
        self.exp = exp
        n = exp.workers
        start = shared_start(store, rank, self.digest, start)
        momentum = start.state.momentum
        me = exp.algorithm.one_worker(exp, rank, start.streams, None if momentum is None else momentum[rank])
        if not isinstance(me, OneWorker):  # federated rounds: the server samples the clients
            raise ConfigError("topology", "serverless", f"'server' with algorithm = {exp.algorithm.name!r}")
        self.me = me
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
        self.attack_state: Tensor = start.streams["attack"]
        return start

    def streams(self) -> dict[str, Tensor]:
        return {"batches": self.me.batch_gen.get_state(), "attack": self.attack_state}

    def exchange(self, theta: Tensor, t: int, rule: BoundRule) -> Received:
        exp, me = self.exp, self.me
        n, h, dim = exp.workers, exp.honest, exp.problem.dim
        dtype = theta.dtype
        row_bytes = dim * theta.element_size()
        _test_hooks.maybe_sleep(self.renv.rank, t)
        v = me.vector(theta, t)
        mine = theta.new_zeros(dim) if v is None else v
        try:
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
        if dist.is_initialized():
            dist.destroy_process_group()

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


def shared_start(store: dist.Store, rank: int, digest: str, start: Snapshot) -> Snapshot:
    """The run's start snapshot on every rank of a topology in which every rank runs the loop: rank 0 publishes
    its own (fresh or resumed; as CPU tensors, every rank moves them to its own device — the loop does) and the
    others read it, after checking that rank 0 runs the same configuration (``digest``)."""
    if rank == 0:
        cpu = start.to("cpu")
        s = cpu.state
        wire.put(store, "init", wire.pack({
            "config": digest, "round": s.round, "streams": cpu.streams, "optimizer": cpu.optimizer,
            "momentum": s.momentum, "theta": s.theta, "previous": s.previous,
        }))
    init: dict[str, Any] = wire.unpack(store.get("init"))
    check_digest(init, digest, rank)
    if rank == 0:
        return start
    state = RoundState(init["theta"], init["momentum"], init["previous"], init["round"])
    return Snapshot(state, init["streams"], init["optimizer"])


class _CollectiveFailed(Exception):
    """A collective did not complete (a peer died, or was silent past the process group's timeout)."""
