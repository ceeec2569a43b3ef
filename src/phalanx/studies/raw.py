"""A study's raw per-run results as a small CSV (``runs.csv``), and read back: the report made again from it, without
training (``phalanx experiment NAME --results FILE``, and the docs check of ``scripts/docs_check.py``).

One row per cell of the study's grid: the cell's fields (a frozen dataclass: table, row, α, lr, seed …), then what the
cell's run ended with — one float (``value``), or the float fields of a frozen dataclass (``loss``, ``accuracy``…),
written with ``repr`` so that a report made from the file is the report made from the runs, digit for digit.

Reading back matches the rows to the cells the study *plans* from its preset (the cell's fields as written), so a
file cannot add a cell, and a cell without its row is an error. A file is input from anyone: one that is too large,
not CSV, lacks a column, repeats or lacks a planned cell, or holds a value that is not a float is one
:class:`~phalanx.errors.ConfigError` naming ``results``, the file and the row, before any report is written.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Hashable
from pathlib import Path
from typing import Any, TypeVar

from phalanx.errors import ConfigError

C = TypeVar("C", bound=Hashable)

MAX_BYTES = 16 << 20
"""The largest raw-results file read (16 MiB; a documented study's is well under 1 MiB)."""


def _value_columns(value_type: type) -> list[str]:
    if value_type is float:
        return ["value"]
    if dataclasses.is_dataclass(value_type):
        return [f.name for f in dataclasses.fields(value_type)]
    raise TypeError(f"raw results hold floats or dataclasses of floats, not {value_type!r}")


def _key(cell: Any) -> tuple[str, ...]:
    return tuple(str(getattr(cell, f.name)) for f in dataclasses.fields(cell))


def write(cells: list[C], collected: dict[C, Any], value_type: type) -> str:
    """The raw results of ``cells`` as CSV text (cell fields, then the value's columns; floats by ``repr``)."""
    values = _value_columns(value_type)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if not cells:
        return ""
    w.writerow([f.name for f in dataclasses.fields(cells[0])] + values)  # type: ignore[arg-type]
    seen: set[tuple[str, ...]] = set()
    for c in cells:
        key = _key(c)
        if key in seen:
            continue
        seen.add(key)
        v = collected[c]
        row = [v] if value_type is float else [getattr(v, name) for name in values]
        w.writerow([*key, *(repr(float(x)) for x in row)])
    return buf.getvalue()


def read(path: Path, cells: list[C], value_type: type) -> dict[C, Any]:
    """What every planned cell ended with, read from the raw-results file ``path`` (module docstring: the checks)."""
    def bad(allowed: str) -> ConfigError:
        return ConfigError("results", str(path), allowed)

    if not path.is_file():
        raise bad("an existing file (a runs.csv a report wrote)")
    if path.stat().st_size > MAX_BYTES:
        raise bad(f"a file of at most {MAX_BYTES} bytes")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise bad(f"a UTF-8 text file ({type(exc).__name__})") from None
    if not cells:
        return {}
    names = [f.name for f in dataclasses.fields(cells[0])]  # type: ignore[arg-type]
    values = _value_columns(value_type)
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise bad(f"CSV ({exc})") from None
    if not rows or rows[0] != names + values:
        raise bad("CSV with the header " + ",".join(names + values))
    table: dict[tuple[str, ...], list[float]] = {}
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(names) + len(values):
            raise bad(f"{len(names) + len(values)} columns on every row (row {i} has {len(row)})")
        key = tuple(row[: len(names)])
        if key in table:
            raise bad(f"one row per cell (row {i} repeats {','.join(key)})")
        try:
            table[key] = [float(x) for x in row[len(names):]]
        except ValueError:
            raise bad(f"floats in the columns {','.join(values)} (row {i})") from None
    planned = {_key(c) for c in cells}
    extra = sorted(set(table) - planned)
    if extra:
        raise bad(f"rows of the planned cells only (not {','.join(extra[0])}: does the preset match?)")
    out: dict[C, Any] = {}
    for c in cells:
        got = table.get(_key(c))
        if got is None:
            raise bad(f"a row for every planned cell (none for {','.join(_key(c))}: does the preset match?)")
        out[c] = got[0] if value_type is float else value_type(*got)
    return out
