"""``phalanx launch``: train with the torchrun engine on this machine, one process per worker (per client slot of a
federated round)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


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
) -> None:
    """Train with engine = torchrun: one process per worker on this machine — per client slot (`clients_per_round`)
    with algorithm = "fedavg" (docs/distributed.md).

    The same config and overrides as `phalanx run`; a worker that crashes or goes silent does not stop training
    (topology = "server"). Several machines: start `torchrun … -m phalanx.distributed.worker CONFIG` on each.
    """
    from rich.console import Console

    from phalanx.distributed import launch as local
    from phalanx.experiments import grid
    from phalanx.experiments.build import check_points
    from phalanx.experiments.config import load_grid, processes
    from phalanx.experiments.signals import stop_on_signals

    console = Console(stderr=True)
    overrides = list(set_ or [])
    if workers is not None:
        overrides.append(f"workers={workers}")
    data = load_grid(config, [*overrides, "engine='torchrun'"])
    cfgs = grid.configs(data)  # every point validated before anything starts
    check_points(cfgs)
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
