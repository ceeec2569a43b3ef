"""The entry point of one rank: ``python -m phalanx.distributed.worker CONFIG [--set k=v …] [--out DIR]``.

Started by ``phalanx launch`` (one machine) or by torchrun (one or many machines), which set ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. Every rank reads the same CONFIG and overrides
(``engine = "torchrun"`` is implied), builds the same experiment (``phalanx.experiments.from_config``),
and the world size must equal ``workers``. Rank 0 writes the run directory ``OUT/<run id>`` (the same name and
files as ``phalanx run``), which is also where a stopped run resumes from.

Exit status: 0 done (workers also exit 0 when the server tells them to stop), 2 configuration error,
3 too many workers missing (:class:`~phalanx.distributed.errors.WorkersLostError`, checkpoint written),
4 the server went away (a worker rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from phalanx.distributed import rendezvous, topologies, wire
from phalanx.distributed.env import RankEnv, open_store
from phalanx.distributed.journal import journal_limit
from phalanx.distributed.keys import Identity, load_identity
from phalanx.distributed.mesh import Mesh
from phalanx.distributed.parameter_server import JOIN_TIMEOUT_S, config_digest
from phalanx.distributed.recording import DistributedLog, RankLog
from phalanx.distributed.sealed import ATTACK_STATE_BYTES, warn_unsealed
from phalanx.distributed.topologies import WORKER_WAIT_S
from phalanx.distributed.transcript import Transcript
from phalanx.errors import ConfigError, PhalanxError, WorkersLostError
from phalanx.experiments import grid, tracking
from phalanx.experiments.build import from_config
from phalanx.experiments.config import RunConfig, ValidRun, load_grid, processes
from phalanx.experiments.rundir import RunDirectory
from phalanx.experiments.wiring import Recording, run_experiment
from phalanx.training.algorithms.asynchronous import Asynchronous
from phalanx.training.experiment import Experiment
from phalanx.training.loop import Callback
from phalanx.training.memory import tune_allocator
from phalanx.training.stages.privacy import run_note


def resolve_config(config: str | None, overrides: list[str], point: int | None = None) -> RunConfig:
    """The one run config of this job (:func:`resolve_run`'s config)."""
    return resolve_run(config, overrides, point).cfg


def resolve_run(config: str | None, overrides: list[str], point: int | None = None) -> ValidRun:
    """The one run of this job, validated once: CONFIG (TOML, default: the built-in job) + overrides, engine =
    torchrun.

    A config with list-valued keys is a grid; ``point`` picks one of its runs (``phalanx launch`` runs them in turn).
    """
    data = load_grid(config, [*overrides, "engine='torchrun'"])
    cfgs = grid.runs(data)
    if point is None:
        if len(cfgs) != 1:
            raise ConfigError(
                "config", f"a grid of {len(cfgs)} runs", "exactly one run per job (no list-valued keys)",
                "pick one point with --set, or use `phalanx launch`, which runs the points one after another",
            )
        return cfgs[0]
    if not 0 <= point < len(cfgs):
        raise ConfigError("--point", point, f"0 … {len(cfgs) - 1}")
    return cfgs[point]


def run_rank(run: ValidRun, out: Path | None) -> None:
    """Run this process's rank of the job described by the torchrun environment.

    The config's topology (:mod:`phalanx.distributed.topologies`) says what the rank runs: a training loop over its
    transport — rank 0 always, and every rank of a topology whose ranks all run it (serverless, gossip) — or its
    part of another rank's rounds (a parameter-server worker). Rank 0 measures the run and holds its directory,
    wired exactly as a simulated run is (:func:`phalanx.experiments.wiring.run_experiment`). With keys, the ranks
    talk over sealed links or the sealed mesh (:func:`open_mesh`) and rank 0 keeps the run's transcript: no store
    carries a vector, a model or the start snapshot.
    """
    renv = RankEnv.from_environ()
    cfg = run.cfg
    if renv.world_size != run.processes:  # as validating the run counted them
        what = "workers" if run.processes == cfg.workers else "clients_per_round"  # the key that sets the number
        raise ConfigError(
            "WORLD_SIZE", renv.world_size, f"{what} = {run.processes} (one process per worker, or per client slot "
            "of a federated round; rank 0 is also the server)", f"launch as many processes, or --set {what}=N",
        )
    topology = topologies.check(cfg)  # registered, and one that runs the config's algorithm
    identity = check_identity(cfg, renv)  # before anything is built: a key problem is one line, at once
    tune_allocator()
    exp = from_config(run, local_rank=renv.local_rank)  # device = "cuda": this rank's cuda:LOCAL_RANK
    digest = config_digest(cfg.identity())
    mesh = None if identity is None or not topology.meshed else open_mesh(cfg, renv, exp, identity, digest)
    log = RankLog()
    part = topology.start(topologies.Rank(cfg, exp, renv, digest, identity, mesh, log))
    if part is None:  # this rank served its part of another rank's rounds
        return
    measured = renv.rank == 0
    if measured:
        if part.links is None and part.banner is None:
            warn_unsealed(log.say)
        elif mesh is not None and identity is not None:
            log.say(f"sealed mesh: mutual TLS between the {renv.world_size} ranks ({cfg.topology}), rank 0 on "
                    f"{mesh.address[0]}:{mesh.address[1]}, allow-list {identity.allow.path}")
        elif part.banner is not None:
            log.say(part.banner)
        said = run_note(exp.stages)
        if said is not None:
            log.say(said)

    def recorders(directory: RunDirectory) -> list[Callback]:
        """What rank 0 writes beside the run directory: distributed.json, and with keys the transcript."""
        cbs: list[Callback] = [DistributedLog(directory.path / "distributed.json", cfg.topology, renv.world_size,
                                              directory.checkpoints)]
        if part.links is not None and identity is not None:
            transcript = Transcript(directory.path, part.links, identity, digest, renv.world_size, exp.f,
                                    directory.checkpoints, topology=cfg.topology,
                                    dim=exp.problem.dim if isinstance(exp.algorithm, Asynchronous) else None)
            if part.hear is not None:
                part.hear(transcript)
            directory.metadata = transcript.binding  # each checkpoint names the transcript's sessions (F4)
            cbs.append(transcript)
        return cbs

    recording = None
    if measured and out is not None:
        recording = Recording(out / run.run_id, cfg.identity(), cfg.checkpoint_every, sign_key=cfg.sign_key,
                              verify_key=cfg.verify_key)
    run_experiment(exp, part.transport, recording, measured=measured, first=part.first, measures=part.measures,
                   recorders=recorders, callbacks=[log] if measured else [],
                   say=lambda text: log.say(text + " (the other ranks are told to stop)"),
                   tracking=tracking.of(cfg, run.run_id) if measured else None)


def monitor_limit(cfg: RunConfig, n: int, row_limit: int) -> int:
    """The most bytes of a gossip node's monitoring message to rank 0 (its rows after a gathering round, signed):
    three rows — θ, momentum, previous — each within ``row_limit``, its journal of the rounds since it last
    reported (at most the gap between gathering rounds, :meth:`~phalanx.distributed.neighbours.Neighbours.gathers`),
    and 1 MiB for the pickle around them. Rank 0 keeps such messages for the gathering rounds ahead of it, so this
    bounds what a Byzantine node can make it hold (it was 8 rows + 16 MiB a frame: an attacker's review)."""
    gap = min(cfg.eval_every, cfg.checkpoint_every, cfg.rounds)
    return 3 * row_limit + journal_limit(n, gap) + (1 << 20)


def open_mesh(cfg: RunConfig, renv: RankEnv, exp: Experiment, identity: Identity, digest: str) -> Mesh:
    """This rank's end of the sealed mesh (:mod:`phalanx.distributed.mesh`), listening, and — a rank other than 0 —
    introduced to rank 0.

    Under ``phalanx launch`` rank 0 listens on ``MASTER_ADDR:MASTER_PORT`` and no c10d store exists; under torchrun's
    agent, which holds that port, it listens on ``MASTER_ADDR:PHALANX_SEALED_PORT`` when that is set (no store is
    read), else on a free port of :func:`~phalanx.distributed.rendezvous.bind_host`, published as ``[host, port]`` in
    the agent's store (read back as untrusted input: a forged one is one line, or leads the ranks to a listener that
    cannot prove rank 0's key). The other ranks listen on ``bind_host`` (``PHALANX_SEALED_ADDR``, default
    ``MASTER_ADDR`` on one machine) with a free port, which they tell rank 0 over TLS.
    """
    n = processes(cfg)
    row = exp.problem.dim * exp.problem.initial_theta().element_size()
    row_limit = 2 * row + ATTACK_STATE_BYTES + 64  # the longest row: an anytime pair, a Byzantine row + its state
    if wire.reporting(exp.stages):  # a serverless row's enclosed worker-stage report (serverless.py)
        row_limit += 2 + wire.REPORT_BYTES
    fixed = rendezvous.port_override() if renv.agent_store else None
    store = open_store(renv, WORKER_WAIT_S) if renv.agent_store and fixed is None else None
    host = rendezvous.bind_host(renv)
    if renv.rank == 0:
        if not renv.agent_store:
            listen = (rendezvous.check_bind_address("MASTER_ADDR", renv.master_addr), renv.master_port)
        elif fixed is not None:
            listen = (rendezvous.check_bind_address("MASTER_ADDR", renv.master_addr), fixed)
        else:
            listen = (host, 0)
    else:
        listen = (host, 0)
    mesh = Mesh(identity, cfg.topology, digest, n, listen, row_limit=row_limit,
                init_limit=8 * n * row_limit + (64 << 20), monitor_limit=monitor_limit(cfg, n, row_limit))
    print(f"[phalanx rank {renv.rank}] sealed mesh: listening on {mesh.address[0]}:{mesh.address[1]}",
          file=sys.stderr, flush=True)
    if renv.rank == 0:
        if store is not None:
            store.set(rendezvous.ADDRESS_KEY, json.dumps(list(mesh.address)))
        return mesh
    if store is not None:
        server = rendezvous.read_address(store, JOIN_TIMEOUT_S)
    else:
        server = (renv.master_addr, renv.master_port if fixed is None else fixed)
    mesh.join(*server)
    return mesh


def check_identity(cfg: RunConfig, renv: RankEnv) -> Identity | None:
    """This rank's identity when the config names a key directory; without keys, a job across machines is refused
    unless ``insecure = true`` (nothing would check who is speaking)."""
    if cfg.keys is not None:
        return load_identity(cfg.keys, renv.rank, renv.world_size)
    if renv.several_machines and not cfg.insecure:
        raise ConfigError(
            "keys", None, "a key directory (phalanx keys init DIR --workers N) when the ranks run on several machines",
            "without keys anyone who reaches the store can speak for any rank; --set insecure=true to run anyway",
        )
    return None


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run this rank, map errors to one clear line and an exit status."""
    parser = argparse.ArgumentParser(prog="python -m phalanx.distributed.worker", description=__doc__.split("\n")[0])
    parser.add_argument("config", nargs="?", default=None, help="TOML config (default: the built-in job)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="override a key: --set f=2")
    parser.add_argument("--out", type=Path, default=Path("runs/default"), help="output directory (rank 0 writes)")
    parser.add_argument("--no-out", action="store_true", help="write nothing (benchmarks)")
    parser.add_argument("--point", type=int, default=None, help="index of the run in a grid config")
    args = parser.parse_args(argv)
    rank = "?"
    try:
        rank = os.environ.get("RANK", "?")
        run_rank(resolve_run(args.config, args.overrides, args.point), None if args.no_out else args.out)
    except WorkersLostError as exc:
        print(f"[phalanx rank {rank}] error: {exc}", file=sys.stderr, flush=True)
        return 3
    except PhalanxError as exc:
        print(f"[phalanx rank {rank}] error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:
        if rank != "0" and isinstance(exc, dist.DistError | ConnectionError):
            print(f"[phalanx rank {rank}] the server went away ({str(exc)[:160]}); stopping", file=sys.stderr,
                  flush=True)
            return 4
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
