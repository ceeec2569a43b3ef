"""``phalanx launch``: train with the torchrun engine on this machine, one process per worker (per client slot of a
federated round); ``phalanx keys`` makes the identities of a keyed job (``phalanx audit``, which checks who was
heard, is in :mod:`phalanx.cli.audit`: it prints with the command line's tables)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

keys_app = typer.Typer(help="Identities of a keyed torchrun job: one key pair per rank and the allow-list.",
                       no_args_is_help=True)


@keys_app.command("init")
def keys_init(
    directory: Annotated[Path, typer.Argument(help="Where to write allow-list.json and rank-<r>.key.")],
    workers: Annotated[int, typer.Option("--workers", "-n", help="Ranks of the job (rank 0 is also the server).")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing allow-list and its keys.")] = False,
) -> None:
    """Make one Ed25519 key pair per rank: DIR/rank-<r>.key (private, 0600; give each machine only its own) and
    DIR/allow-list.json (public: every machine gets it)."""
    from rich.console import Console

    from phalanx.distributed.keys import ALLOW_LIST, init_keys, key_file

    allow = init_keys(directory, workers, force=force)
    Console().print(f"{allow.size} identities in {directory}: {directory / ALLOW_LIST} (public, for every machine) "
                    f"and {key_file(0)} … {key_file(allow.size - 1)} (private: each only where its rank runs)",
                    soft_wrap=True)


@keys_app.command("rotate")
def keys_rotate(
    directory: Annotated[Path, typer.Argument(help="A key directory made by `phalanx keys init`.")],
    rank: Annotated[int, typer.Option("--rank", help="The rank whose key is replaced.")],
) -> None:
    """Give one rank a new key pair; copy the new allow-list.json to every machine before the next launch."""
    from rich.console import Console

    from phalanx.distributed.keys import ALLOW_LIST, key_file, rotate_key

    rotate_key(directory, rank)
    Console().print(f"new key {directory / key_file(rank)}; {directory / ALLOW_LIST} updated (copy it to every "
                    "machine; the old key is no longer accepted)", soft_wrap=True)


def launch(
    config: Annotated[Path | None, typer.Argument(help="TOML config (default: the built-in job).")] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", "-n", min=1, help="Sets `workers` (the processes, with DSGD; the "
                                                        "client population, with fedavg).")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set f=2 (repeatable).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory (rank 0 writes OUT/<run id>).")] = Path(
        "runs/default"
    ),
    master_port: Annotated[
        int | None, typer.Option("--master-port", help="Port of the job's store (default: a free one).")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Stop the whole job after this many seconds.")
    ] = None,
    keys: Annotated[
        Path | None, typer.Option("--keys", help="Key directory (phalanx keys init): mutual TLS, signed vectors, "
                                                 "a transcript of who was heard (sets `keys`).")
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow ranks on several machines without keys (sets `insecure`).")
    ] = False,
    track: Annotated[
        list[str] | None, typer.Option("--track", help="Also send the run to a tracker: tensorboard, mlflow, wandb, "
                                                       "or NAME=URI (repeatable; docs/tracking.md).")
    ] = None,
) -> list[str]:
    """Train with engine = torchrun: one process per worker on this machine — per client slot (`clients_per_round`)
    with algorithm = "fedavg" (docs/distributed.md).

    The same config and overrides as `phalanx run`; a worker that crashes or goes silent does not stop training
    (topology = "server"). Several machines: start `torchrun … -m phalanx.distributed.worker CONFIG` on each.
    """
    from rich.console import Console

    from phalanx.distributed import launch as local
    from phalanx.distributed import topologies
    from phalanx.distributed.keys import load_identity
    from phalanx.experiments import grid, tracking
    from phalanx.experiments.build import check_points
    from phalanx.experiments.config import load_grid, processes
    from phalanx.experiments.signals import stop_on_signals

    console = Console(stderr=True)
    overrides = list(set_ or [])
    if workers is not None:
        overrides.append(f"workers={workers}")
    if keys is not None:
        overrides.append(f"keys={json.dumps(str(keys))}")
    if insecure:
        overrides.append("insecure=true")
    if track:
        overrides += tracking.track_overrides(load_grid(config, overrides), track)
    data = load_grid(config, [*overrides, "engine='torchrun'"])
    cfgs = grid.configs(data)  # every point validated before anything starts
    check_points(cfgs)
    for cfg in cfgs:  # every point's topology, and every rank's key, before any process starts
        topologies.check(cfg)
        if cfg.keys is not None:
            for rank in range(processes(cfg)):
                load_identity(cfg.keys, rank, processes(cfg))
    for point, cfg in enumerate(cfgs):
        console.print(
            f"[bold]phalanx launch[/bold] {point + 1}/{len(cfgs)}: {processes(cfg)} processes, topology "
            f"{cfg.topology}, {cfg.label()} → {out / grid.run_id(cfg)}"
        )
        procs = local.spawn(processes(cfg), local.worker_args(config, overrides, out, point if len(cfgs) > 1 else None),
                            master_port=master_port)
        with stop_on_signals():  # SIGINT / SIGTERM: every rank is stopped, one line, exit 130 / 143
            code = local.supervise(procs, timeout_s=timeout, say=lambda s: console.print(f"[yellow]{s}[/yellow]"))
        if code != 0:
            console.print(f"[red]rank 0 exited with status {code}[/red]")
            raise typer.Exit(code)
    return [grid.run_id(cfg) for cfg in cfgs]  # the run ids it trained: what its report covers
