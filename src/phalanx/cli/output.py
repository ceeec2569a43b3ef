"""How the command line prints a table: the terminal's rich table, or — with ``--format`` — Markdown, CSV or JSON
for a pipe, a file, a notebook or another program.

Every table-printing command builds a :class:`Tabular` (title, columns, rows of strings, notes printed under it)
and hands it to :func:`emit`; nothing else decides how it looks. ``csv`` and ``json`` print the table alone (its
notes are words for a reader, not data); ``md`` prints the title in bold, the Markdown table and the notes.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

FORMATS = ("table", "md", "csv", "json")
"""The values of ``--format``; ``markdown`` is also read as ``md``."""

FormatOption = Annotated[str, typer.Option("--format", help="table (the terminal's), md, csv or json.")]
"""The ``--format`` option every table-printing command takes."""


def check_format(fmt: str) -> str:
    """``fmt`` as one of :data:`FORMATS` (``markdown`` → ``md``), or a one-line error naming ``--format``."""
    value = "md" if fmt == "markdown" else fmt
    if value not in FORMATS:
        raise typer.BadParameter(f"--format={fmt!r}: allowed {', '.join(FORMATS)}")
    return value


@dataclass
class Tabular:
    """A table as data: ``columns`` names, ``rows`` of cells (strings), ``notes`` printed under it (not in csv or
    json), ``right``: the columns aligned right on the terminal, ``whole``: the columns never folded there (names
    one greps for)."""

    title: str
    columns: Sequence[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    right: Sequence[str] = ()
    whole: Sequence[str] = ()
    compact: bool = False
    """On the terminal: no vertical rules and no padding at the edges (a wide table of numbers that fits 80 columns);
    every column but those in ``wrap`` kept on one line."""
    wrap: Sequence[str] = ()

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.columns):  # pragma: no cover - a programming error in a command
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(["" if c is None else str(c) for c in cells])


def _cell_md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(t: Tabular, fmt: str) -> str:
    """The table as text in ``fmt`` (``md``, ``csv`` or ``json``)."""
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(t.columns)
        writer.writerows(t.rows)
        return buf.getvalue()
    if fmt == "json":
        return json.dumps({"title": t.title, "columns": list(t.columns),
                           "rows": [dict(zip(t.columns, r)) for r in t.rows]}, ensure_ascii=False, indent=1) + "\n"
    if fmt == "md":
        lines = [f"**{_cell_md(t.title)}**", "", "| " + " | ".join(map(_cell_md, t.columns)) + " |",
                 "|" + "".join("---:|" if c in t.right else "---|" for c in t.columns)]
        lines += ["| " + " | ".join(map(_cell_md, r)) + " |" for r in t.rows]
        return "\n".join(lines + (["", *t.notes] if t.notes else [])) + "\n"
    raise ValueError(fmt)  # pragma: no cover


def emit_all(tables: Sequence[Tabular], fmt: str, console: Console) -> None:
    """Several tables of one command: on the terminal and in ``md`` one after the other; in ``json`` one object
    ``{"tables": [...]}``; in ``csv`` one block per table, each after a ``# title`` line and a blank line between."""
    if fmt == "json":
        typer.echo(json.dumps({"tables": [json.loads(render(t, "json")) for t in tables]}, ensure_ascii=False,
                              indent=1))
        return
    for i, t in enumerate(tables):
        if fmt == "csv":
            typer.echo(("\n" if i else "") + f"# {t.title}")
        elif fmt == "md" and i:
            typer.echo("")
        emit(t, fmt, console)


def emit(t: Tabular, fmt: str, console: Console) -> None:
    """Print ``t`` in ``fmt``: a rich table (and its notes) on the terminal, else :func:`render`'s text as it is."""
    if fmt != "table":
        typer.echo(render(t, fmt), nl=False)
        return
    table = (Table(title=t.title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True) if t.compact
             else Table(title=t.title))
    for c in t.columns:
        whole = c in t.whole or (t.compact and c not in t.wrap)
        table.add_column(c, justify="right" if c in t.right else "left", overflow="fold", no_wrap=whole)
    for r in t.rows:
        table.add_row(*r)
    if t.rows:
        console.print(table)
    for line in t.notes:
        console.print(line, soft_wrap=True, highlight=False, markup=False)


_SEPARATOR = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$")
_PIPE = re.compile(r"(?<!\\)\|")


def _md_cells(line: str) -> list[str]:
    cells = _PIPE.split(line.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


def _title(line: str) -> str:
    return line.strip().lstrip("#").strip().strip("*").strip()


def tables_of(items: Sequence[object]) -> tuple[list[Tabular], list[str]]:
    """The tables in a study's terminal output (:class:`phalanx.studies.base.Report`), as :class:`Tabular`, and the
    text around them: a rich ``Table`` becomes one table (its title, headers and cells as plain text); a string is
    read for Markdown pipe tables — a header row, a ``|---|`` separator, the rows — each titled by the nearest line of
    prose above it; the rest of the text is returned as lines, in order. So every study's tables print in every
    ``--format`` from what its report already writes, with no second copy of each table."""
    tables: list[Tabular] = []
    text: list[str] = []
    for item in items:
        if isinstance(item, Table):
            columns = [_plain(c.header) for c in item.columns]
            t = Tabular(_plain(item.title) if item.title is not None else "", columns)
            for row in zip(*[list(c.cells) for c in item.columns], strict=True):
                t.add(*map(_plain, row))
            tables.append(t)
            continue
        lines = str(item).splitlines()
        i, title = 0, ""
        while i < len(lines):
            line = lines[i]
            if line.lstrip().startswith("|") and i + 1 < len(lines) and _SEPARATOR.match(lines[i + 1].strip()):
                t = Tabular(title, _md_cells(line))
                i += 2
                while i < len(lines) and lines[i].lstrip().startswith("|"):
                    cells = _md_cells(lines[i])
                    t.add(*(cells + [""] * (len(t.columns) - len(cells)))[:len(t.columns)])
                    i += 1
                tables.append(t)
                title = ""
                continue
            if line.strip():
                text.append(line)
                title = _title(line)
            i += 1
    return tables, text


def _plain(renderable: object) -> str:
    plain = getattr(renderable, "plain", None)
    return plain if isinstance(plain, str) else str(renderable)
