"""``phalanx launch``: train with the torchrun engine on this machine, one process per worker (per client slot of a
federated round); ``phalanx keys`` makes the identities of a keyed job; ``phalanx audit`` checks who was heard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from phalanx.cli.output import Tabular
    from phalanx.distributed.audit import AuditReport

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


def audit(
    run_dir: Annotated[Path, typer.Argument(help="A run directory of a keyed torchrun run (any topology).")],
    allow_list: Annotated[
        Path | None, typer.Option("--allow-list", help="Check against this allow-list (default: the run "
                                                       "directory's copy).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="table (the terminal's), md, csv or json.")] = "table",
) -> None:
    """Check who was heard: the transcript signed by rank 0's key and bound to this run (its config.json, n, f, the
    rounds it reached, the allow-list); every round's accepted and missing ranks together every rank, each once,
    missing ≤ f (server, serverless); every accepted vector signed by its rank's key for this run, round and phase;
    every gossip journal by its node. Exit 0 if all hold, else one line per problem and exit 1. With --format md,
    csv or json: the same as four tables on stdout (:func:`audit_tables`), the exit code the same."""
    from rich.console import Console

    from phalanx.cli.output import check_format, emit_all
    from phalanx.distributed.audit import audit as check

    fmt = check_format(fmt)  # phalanx.cli.output.FormatOption's values (not imported here: phalanx.cli imports us)
    console = Console()
    report = check(run_dir, allow_list)
    if fmt != "table":
        emit_all(audit_tables(run_dir, report), fmt, console)
        if not report.ok:
            raise typer.Exit(1)
        return
    rejected = sum(report.rejected.values())
    console.print(f"{run_dir}: {report.rounds} rounds, {report.accepted} accepted vectors, each signature checked "
                  f"against {report.allow_list}; {report.rounds_with_missing} rounds with missing ranks (at most "
                  f"{report.most_missing}); {rejected} rejected messages or connections", soft_wrap=True,
                  markup=False)
    for kind, count in sorted(report.rejected.items(), key=lambda kv: -kv[1]):
        console.print(f"  rejected ×{count}: {kind}", soft_wrap=True, markup=False, highlight=False)
    if any(at != 0 for at in report.rejected_at):  # the mesh: every rank reports what it refused to rank 0
        per_rank = ", ".join(f"rank {at}: {count}" for at, count in sorted(report.rejected_at.items()))
        console.print(f"  rejected by the rank that refused them: {per_rank}", soft_wrap=True)
    if report.ok:
        console.print("audit passed", soft_wrap=True)
        return
    for problem in report.problems:
        console.print(problem, style="red", soft_wrap=True, markup=False, highlight=False)
    if report.more_problems:
        console.print(f"[red]… and {report.more_problems} more[/red]", soft_wrap=True)
    total = len(report.problems) + report.more_problems
    console.print(f"[red]audit failed: {total} problem{'s' if total != 1 else ''}[/red]", soft_wrap=True)
    raise typer.Exit(1)


def audit_tables(run_dir: Path, report: AuditReport) -> list[Tabular]:
    """What ``phalanx audit`` found, as tables for ``--format``: the summary (one row: the counts, the problems'
    total, ``passed`` or ``failed``), the rejections by kind, by the rank that refused them, and the problems (those
    kept: the summary counts all). Every cell is text the audit bounded (a kind, a problem line); md, csv and json
    escape it."""
    from phalanx.cli.output import Tabular

    problems = len(report.problems) + report.more_problems
    summary = Tabular(f"Audit of {run_dir}", ("rounds", "accepted vectors", "allow-list", "rounds with missing ranks",
                                              "most missing", "rejected", "problems", "result"))
    summary.add(report.rounds, report.accepted, report.allow_list, report.rounds_with_missing, report.most_missing,
                sum(report.rejected.values()), problems, "passed" if report.ok else "failed")
    kinds = Tabular("Rejected messages or connections, by kind", ("kind", "count"))
    for kind, count in sorted(report.rejected.items(), key=lambda kv: -kv[1]):
        kinds.add(kind, count)
    ranks = Tabular("Rejected, by the rank that refused them", ("rank", "count"))
    for at, count in sorted(report.rejected_at.items()):
        ranks.add(at, count)
    found = Tabular("Problems", ("problem",), [[p] for p in report.problems])
    return [summary, kinds, ranks, found]


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
) -> None:
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
