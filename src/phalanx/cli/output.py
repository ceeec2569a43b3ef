"""How the command line prints a table: the terminal's rich table, or — with ``--format`` — Markdown, CSV or JSON
for a pipe, a file, a notebook or another program.

Every table-printing command builds a :class:`Tabular` (title, columns, rows of strings, notes printed under it)
and hands it to :func:`emit` (several: :func:`emit_all`); nothing else decides how it looks. Every format keeps
the notes — what a verdict means, how many runs diverged, which statement a bound is — since a number without them
can be misread (issue 38: csv and json dropped them): ``csv`` as ``# `` comment lines after the rows (as its title
line before them), ``json`` as a ``notes`` list; ``md`` prints the title in bold, the Markdown table and the notes.
``json`` has one shape for every command, one table or several: ``{"tables": [{"title", "columns", "rows",
"notes"}]}`` (docs/start.md; ``tests/test_cli.py::test_every_table_prints_as_csv_json_and_markdown``).

On the terminal nothing is ever cropped, cut or ellipsised (issue 38: at 80 columns ``+7.0`` printed as ``+7.``,
``any`` as ``an``, a header as ``cos``; at 60 a column vanished). The layout, for a terminal ``W`` cells wide (a pipe
without ``COLUMNS``: :data:`PIPE_WIDTH`, so every table keeps its natural width):

1. a column *folds* — its cells wrap at spaces — unless it holds names or numbers (``whole``, ``right``, or any
   column of a ``compact`` table but those in ``wrap``); a word is never split, a name or a number never wrapped;
2. :func:`widths` gives each column its natural width, then narrows the widest column that still can (a folding
   column down to its longest word, any column down to its header's longest word: headers fold at spaces) until
   the table fits ``W``;
3. a ``compact`` table that still does not fit tries again with one space between columns instead of two;
4. if even those least widths do not fit, the table is printed as one block per row — ``column  value`` on a line
   of its own, a blank line between rows, never wrapped or cropped (a line wider than the terminal overflows it).

``tests/test_table_widths.py`` checks, at widths 40, 60, 80, 120 and piped, over the ``list`` tables, ``report``,
``status``, ``tension plan`` and the plan, price-and-rescue and status tables, that every word of every cell and
header appears whole and that a table's lines fit the width; the cropping renderer it replaced fails it.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 100_000
"""The console's width when standard output is not a terminal: wider than any table, so none is cut or wrapped."""

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
    """A table as data: ``columns`` names, ``rows`` of cells (strings), ``notes`` printed under it (in csv as
    ``# `` comment lines, in json as a list), ``right``: the columns aligned right on the terminal, ``whole``: the
    columns never folded there (names one greps for)."""

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
    title_printed: bool = False
    """A study's Markdown table titled by the line of prose printed just above it (:func:`pieces`): the terminal
    does not print that title twice."""
    values: list[dict[str, Any]] = field(default_factory=list)
    """Per row, the numbers its cells print (``None`` where a cell shows ``—``), for ``--format json``'s
    ``"values"``: a program reads 0.0119, not ``"0.0119"`` or ``"< 1e-12"`` (a first-hour review). Empty: the
    table has none beyond its cells."""

    def add(self, *cells: object, values: dict[str, Any] | None = None) -> None:
        if len(cells) != len(self.columns):  # pragma: no cover - a programming error in a command
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(["" if c is None else str(c) for c in cells])
        if values is not None:
            self.values.append(values)


def _cell_md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(t: Tabular, fmt: str) -> str:
    """The table as text in ``fmt`` (``md``, ``csv`` or ``json``)."""
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(t.columns)
        writer.writerows(t.rows)
        return buf.getvalue() + "".join(f"# {line}\n" for note in t.notes for line in note.splitlines())
    if fmt == "json":
        doc: dict[str, Any] = {"title": t.title, "columns": list(t.columns),
                               "rows": [dict(zip(t.columns, r)) for r in t.rows], "notes": list(t.notes)}
        if t.values:
            doc["values"] = [{k: _finite(v) for k, v in row.items()} for row in t.values]
        return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"
    if fmt == "md":
        title = [f"**{_cell_md(t.title)}**", ""] if t.title.strip() else []  # an untitled table: no empty "****"
        lines = [*title, "| " + " | ".join(map(_cell_md, t.columns)) + " |",
                 "|" + "".join("---:|" if c in t.right else "---|" for c in t.columns)]
        lines += ["| " + " | ".join(map(_cell_md, r)) + " |" for r in t.rows]
        notes = [line for note in t.notes for line in ("", note)]  # each its own paragraph: [1] … [30] ran together
        return "\n".join(lines + notes) + "\n"
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
            typer.echo(render(t, fmt), nl=False)
            continue
        if fmt == "md" and i:
            typer.echo("")
        emit(t, fmt, console)


def emit(t: Tabular, fmt: str, console: Console) -> None:
    """Print ``t`` in ``fmt``: on the terminal a table that loses nothing (:func:`_terminal`) and its notes; in
    ``json`` and ``csv`` the one shape every command prints, one table as several (:func:`emit_all`: json
    ``{"tables": [{title, columns, rows}]}``, csv a ``# title`` line then the table — issue 38: a single table's csv
    had no title line); in ``md`` :func:`render`'s text as it is."""
    if fmt in ("json", "csv"):
        emit_all([t], fmt, console)
        return
    if fmt != "table":
        typer.echo(render(t, fmt), nl=False)
        return
    if t.rows:
        _terminal(t, console)
    for line in t.notes:
        console.print(line, soft_wrap=True, highlight=False, markup=False)


def _words(text: str) -> list[str]:
    return text.split() or [""]


def _longest_word(texts: Sequence[str]) -> int:
    return max(cell_len(w) for text in texts for w in _words(text))


def _longest_line(texts: Sequence[str]) -> int:
    return max(cell_len(line) for text in texts for line in (text.splitlines() or [""]))


def _folds(t: Tabular, c: str) -> bool:
    """Whether column ``c``'s cells may fold at spaces: never a name (``whole``), a number (``right``) or, in a
    ``compact`` table, any column but those in ``wrap``."""
    return not (c in t.whole or c in t.right or (t.compact and c not in t.wrap))


def widths(t: Tabular, room: int) -> list[int] | None:
    """Each column's width on a terminal ``room`` cells wide (the table's borders and padding taken off), or ``None``
    when even the narrowest layout that cuts nothing does not fit.

    A column's natural width ``N_c`` is its longest line, header included; its least width ``m_c`` is its longest
    cell line for a column that never folds (:func:`_folds`), else its longest cell word — and at least its header's
    longest word (a header folds at spaces in every column): a word is never split. If ``Σ N_c ≤ room`` every column
    keeps ``N_c``; else, while the sum exceeds ``room``, the widest column above its ``m_c`` loses one cell (the
    first such on a tie); if ``Σ m_c > room`` there is no such layout."""
    natural = [_longest_line([c, *(r[i] for r in t.rows)]) for i, c in enumerate(t.columns)]
    cells = [[r[i] for r in t.rows] for i in range(len(t.columns))]
    least = [max(_longest_word([c]), (_longest_word if _folds(t, c) else _longest_line)(cells[i] or [""]))
             for i, c in enumerate(t.columns)]
    if sum(least) > room:
        return None
    out = list(natural)
    excess = sum(out) - room
    while excess > 0:
        i = max((i for i in range(len(out)) if out[i] > least[i]), key=lambda i: out[i])
        out[i] -= 1
        excess -= 1
    return out


def _header(text: str, width: int) -> str:
    """A header folded at its spaces into ``width`` cells (never inside a word): a column that never folds would
    otherwise crop its header."""
    lines: list[str] = []
    for word in text.split():
        if lines and cell_len(lines[-1]) + 1 + cell_len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines) or text


def _rich_table(t: Tabular, title: Text | None, tight: bool = False) -> Table:
    if tight:  # a compact table with one space between columns: no padding, no edges
        return Table(title=title, box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    if t.compact:
        return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    return Table(title=title)


def _terminal(t: Tabular, console: Console) -> None:
    """``t`` on ``console`` with nothing cropped, cut or ellipsised: a rich table at the widths :func:`widths` gives
    (foldable text folds at spaces; names and numbers stay on one line) — a ``compact`` table that does not fit with
    two spaces between columns tries one — its title above it, on lines of its own, when one of the title's words is
    wider than the table; or, when no such table fits, one block per row (each ``column  value`` on a line of its
    own, never wrapped: a line wider than the terminal overflows it)."""
    for tight in (False, True) if t.compact else (False,):
        probe = _rich_table(t, None, tight)
        for c in t.columns:
            probe.add_column(c, width=1)
        overhead = Measurement.get(console, console.options.update_width(PIPE_WIDTH), probe).maximum - len(t.columns)
        cols = widths(t, console.width - overhead)
        if cols is not None:
            break
    if cols is None:
        _records(t, console)
        return
    inside = Text(t.title) if _longest_word([t.title]) <= sum(cols) + overhead else None
    if inside is None and t.title:
        console.print(t.title, overflow="ignore", crop=False, highlight=False, markup=False)
    table = _rich_table(t, inside, tight)
    for c, w in zip(t.columns, cols):
        folds = _folds(t, c)
        table.add_column(c if folds else _header(c, w), justify="right" if c in t.right else "left", width=w,
                         overflow="fold", no_wrap=not folds)
    for r in t.rows:
        table.add_row(*(Text(cell) for cell in r))
    console.print(table)


def _records(t: Tabular, console: Console) -> None:
    """The table too wide for the terminal even folded: its title, then every row as a block of ``column  value``
    lines (a cell's further lines under its first), each block after a blank line and one after the last, printed
    without wrapping or cropping."""
    say = functools.partial(console.print, soft_wrap=True, highlight=False, markup=False)
    label = max(cell_len(c) for c in t.columns)
    if t.title:
        say(t.title)
    for r in t.rows:
        say("")
        for c, cell in zip(t.columns, r):
            lines = cell.splitlines() or [""]
            say(c + " " * (label - cell_len(c)) + "  " + lines[0])
            for more in lines[1:]:
                say(" " * (label + 2) + more)
    say("")


_SEPARATOR = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$")
_PIPE = re.compile(r"(?<!\\)\|")


def _md_cells(line: str) -> list[str]:
    cells = _PIPE.split(line.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


def _title(line: str) -> str:
    return line.strip().lstrip("#").strip().strip("*").strip()


def pieces(items: Sequence[object]) -> list[object]:
    """A study's terminal output (:class:`phalanx.studies.base.Report`) in order, its tables as :class:`Tabular`: a
    rich ``Table`` becomes one table (its title, headers and cells as plain text); a string is read for Markdown pipe
    tables — a header row, a ``|---|`` separator, the rows — each titled by the nearest line of prose above it; every
    other line of text stays a string (one per line), any other renderable as it is."""
    out: list[object] = []
    for item in items:
        if isinstance(item, Table):
            columns = [_plain(c.header) for c in item.columns]
            t = Tabular(_plain(item.title) if item.title is not None else "", columns)
            for row in zip(*[list(c.cells) for c in item.columns], strict=True):
                t.add(*map(_plain, row))
            out.append(t)
            continue
        if not isinstance(item, str):
            out.append(item)
            continue
        lines = item.splitlines()
        i, title = 0, ""
        while i < len(lines):
            line = lines[i]
            if line.lstrip().startswith("|") and i + 1 < len(lines) and _SEPARATOR.match(lines[i + 1].strip()):
                t = Tabular(title, _md_cells(line), title_printed=bool(title))
                i += 2
                while i < len(lines) and lines[i].lstrip().startswith("|"):
                    cells = _md_cells(lines[i])
                    t.add(*(cells + [""] * (len(t.columns) - len(cells)))[:len(t.columns)])
                    i += 1
                out.append(t)
                title = ""
                continue
            out.append(line)
            if line.strip():
                title = _title(line)
            i += 1
    return out


def titled(items: Sequence[object], reference: str) -> list[object]:
    """:func:`pieces` of a study's terminal output, each table with no title of its own titled as the study's report
    (``reference``, its Markdown) titles the same table — the heading or line of prose above the row of the same
    headers there. Issue 38: backdoor's, privacy's and the neighbours' first tables printed untitled, so "92.2 ± 2.2"
    never said it was a 95 % half-width, which the report's heading above it does."""
    lines = reference.splitlines()
    cells = re.search(r"\b[Cc]ells: (.*?\.)(?= [A-Z(]|$)", reference, flags=re.M)
    got = pieces(items)
    for piece in got:
        if not isinstance(piece, Tabular) or piece.title:
            continue
        for i, line in enumerate(lines):
            if line.lstrip().startswith("|") and _md_cells(line) == list(piece.columns):
                above = [_title(x) for x in lines[:i] if x.strip() and not x.lstrip().startswith("|")]
                piece.title = above[-1] if above else ""
                break
        if cells and not piece.notes and any("±" in c for row in piece.rows for c in row):
            piece.notes.append(f"Cells: {cells.group(1)}")  # what ± is, as the report's setup says it
    return got


def tables_of(items: Sequence[object]) -> tuple[list[Tabular], list[str]]:
    """The tables in a study's terminal output, as :class:`Tabular` (:func:`pieces`), and the non-empty lines of
    text around them, in order. So every study's tables print in every ``--format`` from what its report already
    writes, with no second copy of each table."""
    got = pieces(items)
    return ([p for p in got if isinstance(p, Tabular)],
            [p for p in got if isinstance(p, str) and p.strip()])


def emit_terminal(items: Sequence[object], console: Console) -> None:
    """A study's terminal output on the terminal: its text as it is, each Markdown or rich table as a terminal table
    that keeps its columns (:func:`emit`: folded, or one block per row — never a pipe row wider than the terminal;
    issue 38: ``phalanx experiment corrupted-rounds`` printed 170-character ``| … |`` rows in 60 columns). A table
    titled by the prose line above it is printed without repeating that line."""
    for piece in pieces(items):  # items already in pieces (:func:`titled`) pass through as they are
        if isinstance(piece, Tabular):
            if piece.title_printed:
                piece.title = ""  # its title is the line of text just printed
            emit(piece, "table", console)
        elif isinstance(piece, str):
            console.print(piece, soft_wrap=True, highlight=False, markup=False)  # as it is, on the tables' stream
        else:
            console.print(piece)


def _plain(renderable: object) -> str:
    plain = getattr(renderable, "plain", None)
    return plain if isinstance(plain, str) else str(renderable)


def _finite(value: Any) -> Any:
    """A JSON value: a NaN or infinite float becomes the string ``"nan"``, ``"inf"`` or ``"-inf"`` (JSON has no NaN;
    Python's ``json`` would write ``NaN``, which strict readers refuse), so that it stays apart from ``null``, a
    value not measured (the table's ``—``); lists and tables inside are converted alike."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value
