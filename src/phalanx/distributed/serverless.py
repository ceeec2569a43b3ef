"""Server-free topology: every rank all-gathers the n vectors and runs the same aggregation.

Round t on every rank: its own momentum (worker r; a Byzantine rank of a vector attack contributes a placeholder),
``all_gather`` into the ``(n, d)`` matrix; for a vector attack the Byzantine ranks then compute their vectors from the
honest rows (the omniscient view is the gathered matrix itself) and a second ``all_gather`` distributes them; every
rank then calls :func:`~phalanx.training.round.aggregate_and_step` on the same matrix, so all hold the same θ
(the rules are deterministic; ranks on different hardware may differ in the last bits). Rank 0 writes the run
directory; the Byzantine ranks append their attack-stream state to their rows so that rank 0's checkpoints hold it.

What it assumes: every rank is alive. A collective waits at most ``round_timeout`` (the process group's timeout);
a rank that crashed or stayed silent longer makes it fail, and the run stops with
:class:`~phalanx.distributed.errors.WorkersLostError` after rank 0 wrote a checkpoint of the last finished round.
In this topology a Byzantine rank sends one vector to everyone (the all-gather cannot equivocate); a real
deployment would need a broadcast protocol to rule out a rank sending different vectors to different peers.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.distributed import _test_hooks, wire
from phalanx.distributed.env import RankEnv, resolve_backend
from phalanx.distributed.errors import TransportError, WorkersLostError
from phalanx.distributed.local import LocalWorker
from phalanx.distributed.recorder import Recorder, RoundLog
from phalanx.distributed.server import JOIN_TIMEOUT_S, collect, config_digest
from phalanx.errors import ConfigError
from phalanx.training.round import RoundState, aggregate_and_step
from phalanx.training.schedule import learning_rate
from phalanx.training.trainer import Setup


def run(setup: Setup, store: dist.Store, renv: RankEnv, rec: Recorder | None) -> None:
    """One rank of the server-free topology (``rec`` on rank 0 only)."""
    import time

    cfg = setup.cfg
    n, b = cfg.workers, cfg.byzantine
    h = n - b
    rank = renv.rank
    if rec is not None:
        state, gens = rec.start()
        wire.put(store, "init", wire.pack({
            "config": config_digest(setup), "round": state.round, "batches": gens["batches"],
            "attack": gens["attack"], "momentum": state.momentum, "theta": state.theta, "previous": state.previous,
        }))
    init: dict[str, Any] = wire.unpack(store.get("init"))
    if init["config"] != config_digest(setup):
        raise ConfigError("config", f"rank {rank}'s config", "the same resolved config on every rank")
    state = RoundState(theta=init["theta"], momentum=init["momentum"], previous=init["previous"], round=init["round"])
    me = LocalWorker(rank, setup, init["batches"], init["attack"],
                     None if state.momentum is None else state.momentum[rank])
    me.warm_up()
    wire.put(store, f"ready/{rank}", b"1")
    joined = collect(store, {r: f"ready/{r}" for r in range(n)}, set(), JOIN_TIMEOUT_S)
    if len(joined) < n:
        lost = sorted(set(range(n)) - set(joined))
        raise WorkersLostError(state.round, lost, cfg.f, JOIN_TIMEOUT_S, None, "the serverless topology needs every "
                               "rank; they did not start")
    backend = resolve_backend(cfg.backend)
    try:
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=n,
                                timeout=timedelta(seconds=cfg.round_timeout))
    except (RuntimeError, dist.DistError) as exc:
        raise TransportError(
            f"rank {rank}: the {backend} process group did not connect ({str(exc)[:200]}); on several machines set "
            f"{'NCCL' if backend == 'nccl' else 'GLOO'}_SOCKET_IFNAME to the network interface that carries "
            "MASTER_ADDR's network (docs/distributed.md)"
        ) from None
    device = torch.device("cuda", renv.local_rank) if backend == "nccl" else torch.device("cpu")
    vector_attack = b > 0 and not isinstance(setup.attack, DataAttack)
    is_byz = torch.zeros(n, dtype=torch.bool)
    is_byz[h:] = True
    dim, dtype = setup.problem.dim, state.theta.dtype
    row_bytes = dim * state.theta.element_size()
    attack_state: Tensor = init["attack"]
    try:
        for t in range(state.round, cfg.rounds):
            t0 = time.perf_counter()
            start_gens = {"batches": me.batch_gen.get_state(), "attack": attack_state}
            _test_hooks.maybe_sleep(rank, t)
            v = me.momentum_vector(state.theta)
            mine = torch.zeros(dim, dtype=dtype) if v is None else v
            try:
                m = _all_gather(mine, n, device)
                traffic = row_bytes * (n - 1)
                if vector_attack:
                    if me.vector_attack:
                        mine = me.attack_vector(m[:h], t)
                    # the Byzantine rows, each with its rank's attack-stream state appended (raw bytes viewed as
                    # the vectors' dtype): rank 0 checkpoints the stream it does not run itself
                    state_u8 = me.attack_gen.get_state()
                    gathered = _all_gather(torch.cat([mine, state_u8.view(dtype)]), n, device)
                    m = torch.cat([m[:h], gathered[h:, :dim]])
                    attack_state = gathered[n - 1, dim:].contiguous().view(torch.uint8).clone()
                    traffic += (row_bytes + state_u8.numel()) * (n - 1)
                else:
                    attack_state = me.attack_gen.get_state()  # a data attack's stream runs on every rank alike
                measure = cfg.evaluates(t)
                theta, agg, result = aggregate_and_step(
                    state.theta, m, is_byz, setup.rule, previous=state.previous, problem=setup.problem,
                    reference_batch=setup.reference_batch, lr=learning_rate(cfg, t), measure=measure,
                )
                new = RoundState(theta=theta, momentum=m, previous=agg, round=t + 1)
            except _CollectiveFailed as exc:
                path = rec.checkpoint(state, start_gens) if rec is not None else None
                raise WorkersLostError(
                    t, [], cfg.f, cfg.round_timeout, path,
                    f"the serverless topology needs every rank alive; a collective failed ({exc})",
                ) from None
            state = new
            if rec is not None:
                # payload this rank sent: its row (+ attack-stream state) to each of the n − 1 others, per all-gather
                rec.after_round(state, result, {"batches": me.batch_gen.get_state(), "attack": attack_state},
                                RoundLog(t, time.perf_counter() - t0, [], traffic, traffic), measure)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rec is not None:
        rec.finish()


class _CollectiveFailed(Exception):
    """A collective did not complete (a peer died, or was silent past the process group's timeout)."""


def _all_gather(row: Tensor, n: int, device: torch.device) -> Tensor:
    """``(n, d)``: every rank's row, in rank order (on the CPU).

    gloo reports a dead or silent peer as a plain ``RuntimeError`` (measured: "Timed out waiting … for send
    operation", "Connection closed by peer"), so any error of the collective call itself means a lost rank.
    """
    mine = row.to(device).contiguous()
    parts = [torch.empty_like(mine) for _ in range(n)]
    try:
        dist.all_gather(parts, mine)
    except (RuntimeError, dist.DistError) as exc:
        raise _CollectiveFailed(str(exc).splitlines()[0][:200]) from None
    return torch.stack(parts).cpu()

