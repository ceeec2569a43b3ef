"""``phalanx audit``: check who was heard in a keyed run (its transcript, signatures and journals), printed as
lines or, with ``--format``, as tables (:func:`audit_tables`). The check itself is
:func:`phalanx.distributed.audit.audit`; this module is its command line, kept in the command-line package because
it prints with the tables of :mod:`phalanx.cli.output` (the distributed layer sits below the command line and may
not import it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from phalanx.cli.output import Tabular, check_format, emit_all

if TYPE_CHECKING:
    from phalanx.distributed.audit import AuditReport


def audit(
    run_dir: Annotated[Path, typer.Argument(help="A run directory of a keyed torchrun run (any topology).")],
    allow_list: Annotated[
        Path | None, typer.Option("--allow-list", help="Check against this allow-list (default: the run "
                                                       "directory's copy).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="table (the terminal's), md, csv or json.")] = "table",
) -> None:
    """Check who was heard: the transcript signed by rank 0's key and bound to this run (its config.json, n, f, the
    rounds it reached, the allow-list); every round's accepted and missing ranks are together every rank, each once,
    missing ≤ f (server, serverless); every accepted vector signed by its rank's key for this run, round and phase;
    every gossip journal by its node. Exit 0 if all hold, else one line per problem and exit 1. With --format md,
    csv or json: the same as four tables on stdout, the exit code the same."""
    from rich.console import Console

    from phalanx.distributed.audit import audit as check

    fmt = check_format(fmt)  # phalanx.cli.output.FormatOption's values
    console = Console()
    report = check(run_dir, allow_list)
    if fmt != "table":
        emit_all(audit_tables(run_dir, report), fmt, console)
        if not report.ok:
            raise typer.Exit(1)
        return
    rejected = sum(report.rejected.values())
    console.print(f"{run_dir}: {report.rounds} rounds, {report.accepted} accepted vectors, each signature checked "
                  f"against {report.allow_list}; {report.rounds_with_missing} rounds with missing ranks (the most in "
                  f"one round: {report.most_missing}); {rejected} rejected messages or connections", soft_wrap=True,
                  markup=False)
    for kind, count in sorted(report.rejected.items(), key=lambda kv: -kv[1]):
        console.print(f"  rejected ×{count}: {kind}", soft_wrap=True, markup=False, highlight=False)
    if any(at != 0 for at in report.rejected_at):  # the mesh: every rank reports what it refused to rank 0
        per_rank = ", ".join(f"rank {at}: {count}" for at, count in sorted(report.rejected_at.items()))
        console.print(f"  rejected by the rank that refused them: {per_rank}", soft_wrap=True)
    if report.results_unchecked:  # a pass must not read as more than it checked
        console.print(f"  {report.results_unchecked} steps' results not recomputed (the rule has context or state: "
                      "their signed updates, staleness and rows were checked, not the rule's output)", soft_wrap=True)
    if report.filters_unchecked:  # Kardam's, Zeno++'s decisions: not recomputed (the transcript lacks every θ)
        console.print(f"  {report.filters_unchecked} steps' filtering unchecked (the algorithm's filter decisions "
                      "were not recomputed: which updates it dropped is rank 0's word)", soft_wrap=True)
    if report.uncontributed:  # its nonce drawn by rank 0 alone (an older transcript's session)
        console.print(f"  {report.uncontributed} sessions' nonce not contributed (drawn by rank 0 alone: a "
                      "transcript written before the ranks' share)", soft_wrap=True)
    if report.ok:
        console.print("audit passed" + (f" ({report.results_unchecked} steps' results unchecked)"
                                        if report.results_unchecked else "")
                      + (f" ({report.filters_unchecked} steps' filtering unchecked)"
                         if report.filters_unchecked else ""), soft_wrap=True)
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
    problems = len(report.problems) + report.more_problems
    summary = Tabular(f"Audit of {run_dir}", ("rounds", "accepted vectors", "allow-list", "rounds with missing ranks",
                                              "most missing", "rejected", "results unchecked", "problems",
                                              "result"))
    summary.add(report.rounds, report.accepted, report.allow_list, report.rounds_with_missing, report.most_missing,
                sum(report.rejected.values()), report.results_unchecked, problems, "passed" if report.ok else "failed")
    kinds = Tabular("Rejected messages or connections, by kind", ("kind", "count"))
    for kind, count in sorted(report.rejected.items(), key=lambda kv: -kv[1]):
        kinds.add(kind, count)
    ranks = Tabular("Rejected, by the rank that refused them", ("rank", "count"))
    for at, count in sorted(report.rejected_at.items()):
        ranks.add(at, count)
    found = Tabular("Problems", ("problem",), [[p] for p in report.problems])
    return [summary, kinds, ranks, found]
