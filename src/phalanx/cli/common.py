"""What every command group of the command line shares: the ``phalanx`` app and its sub-apps, the consoles
(stdout, and stderr for progress when ``--format`` asks for tables alone), number formatting and references."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from phalanx import __version__
from phalanx.cli import audit as audit_command
from phalanx.cli.output import PIPE_WIDTH, Tabular
from phalanx.distributed import cli as distributed_cli

if TYPE_CHECKING:
    pass



SEED_MAX = 2**63 - 1
"""The largest seed: a run's config keeps ``seed`` as a 64-bit TOML integer >= 0, and the analysis commands take the
same range (a negative seed was accepted by ``demo`` and ``epsilon``; one above 2⁶³ − 1 ended ``kappa`` in a
traceback)."""
SeedOption = Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="Random seed (0 … 2^63 − 1).")]

app = typer.Typer(
    name="phalanx", help="Byzantine-robust distributed learning: robust aggregators, attacks, price of robustness.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    suggest_commands=False,  # click suggests the closest command itself: typer's own made it say so twice
)
list_app = typer.Typer(help="List what Phalanx provides.", no_args_is_help=True)
app.add_typer(list_app, name="list")




def _console() -> Console:
    """The CLI's console. Rich wraps everything to 80 columns when standard output is not a terminal (a pipe, a log,
    a batch job): table headers shrank to "co…" and rows wrapped onto five lines. There — unless ``COLUMNS`` says
    how wide — tables keep their natural width and no line is wrapped."""
    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(width=PIPE_WIDTH)
    return out


console = _console()
_STDERR = Console(stderr=True, width=None if Console(stderr=True).is_terminal else PIPE_WIDTH)
"""Where a command's progress and notes go when ``--format`` asks for its tables alone on stdout."""

app.add_typer(distributed_cli.keys_app, name="keys")
app.command("audit")(audit_command.audit)


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "—"
    if v != v or v == float("inf"):
        return "∞" if v == float("inf") else "nan"
    return f"{v:.{digits}g}"


def _print_version(value: bool) -> None:
    if value:
        console.print(f"phalanx {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", is_eager=True,
                                          callback=_print_version)] = False,
) -> None:
    """Byzantine-robust distributed learning: robust aggregators, attacks, price of robustness."""


def _references(table: Tabular, rows: list[tuple[list[str], str]], fmt: str) -> None:
    """Fill ``table`` with ``rows`` (cells, reference), each row ending in its reference's number ``[k]``
    (identical references share one), and add the numbered references to its notes, printed below the table: a
    reference folded into a narrow column takes 5-10 lines at 80 columns, a list under the table one or two. In csv
    and json (data, without notes) the cell holds the reference itself."""
    numbers: dict[str, int] = {}
    for cells, reference in rows:
        k = numbers.setdefault(reference, len(numbers) + 1)
        table.add(*cells, reference if fmt in ("csv", "json") else f"[{k}]")
    table.notes[:0] = [f"[{k}] {ref}" for ref, k in numbers.items()]
