"""A study's raw per-run results as a small CSV (``runs.csv``), and read back: the report made again from it, without
training (``phalanx experiment NAME --results FILE``, and the docs check of ``scripts/docs_check.py``).

One row per cell of the study's grid: the cell's fields (a frozen dataclass: table, row, α, lr, seed …), the run id
of the cell's configuration (``run``: :func:`phalanx.experiments.grid.run_id`, a hash of everything that names the
run; a study without run directories names its in-process runs by a hash of its preset), then what the cell's run
ended with — one float (``value``), or the fields of a dataclass (``loss``, ``accuracy``…), each written by its
annotated type so that a report made from the file is the report made from the runs, digit for digit: a float by
``repr`` (``inf`` allowed), ``None`` as the empty string, a bool as ``True`` / ``False``, an int in decimal, a
string as it is, and a tuple or list (a curve) as JSON with ``repr`` floats.

Reading back matches the rows to the cells the study *plans* from its preset (the cell's fields as written) *and*
to their configurations (the ``run`` column), so a file cannot add a cell, a cell without its row is an error, and a
file of the same grid run with other settings (another preset's rounds, another data set) is refused. A file is input
from anyone: one that is too large, not CSV, lacks a column, repeats or lacks a planned cell, names another run, or
holds a value not of its field's type — NaN where a number must be (a field may allow NaN only by its metadata
``{"raw_nan": True}``: a bound that is not proven), a number outside its field's range (metadata :func:`within`: a
share in [0, 1], a count that is finite), a nested list too deep — is one
:class:`~phalanx.errors.ConfigError` naming ``results``, the file and the cell, before any report is written.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
import sys
import types
import typing
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from phalanx.errors import ConfigError
from phalanx.validate import read_bounded_text

if TYPE_CHECKING:
    from phalanx.experiments.schema import RunConfig
    from phalanx.experiments.validrun import ValidRun

C = TypeVar("C", bound=Hashable)

MAX_BYTES = 16 << 20
"""The largest raw-results file read (16 MiB; the largest committed one, the convergence quick preset's with its
per-round curves, is 1.7 MB)."""
MAX_TEXT = 1000
"""The longest string a string field may hold (a label: ``proven``; a verdict: a sentence, 210 characters at most in
the convergence quick preset)."""
NAN_OK = {"raw_nan": True}
"""A value field's metadata that lets it hold NaN (``field(metadata=raw.NAN_OK)``); every other float refuses it."""


def within(low: float, high: float) -> dict[str, Any]:
    """A value field's metadata that bounds its numbers to ``low <= x <= high`` when read (``field(metadata=
    raw.within(0, 1))``: a share; ``within(0, sys.float_info.max)``: a finite count) — every number of a curve too;
    NaN and ±inf outside the bounds are refused. What a hostile file can make a report print and plot is then what
    a run can give."""
    return {"raw_range": (float(low), float(high))}


SHARE = within(0, 1)
"""A share (an accuracy, a success rate, a fraction of inputs): in [0, 1]."""
FINITE = within(0, sys.float_info.max)
"""A finite non-negative number (a radius, a simulated time, a round and its accuracy in a curve)."""
NON_NEGATIVE = within(0, math.inf)
"""A non-negative number that a diverged run may leave infinite (a loss, a privacy budget, a consensus distance)."""


class Share(float):
    """The ``raw_value`` of a study whose value is one float that is a share (a final accuracy): read as a plain float
    in [0, 1] (:data:`SHARE`)."""


_SCALARS: dict[type, tuple[float, float] | None] = {float: None, Share: SHARE["raw_range"]}
"""The one-float values and their bounds."""


_INTEGER = re.compile(r"-?[0-9]+")
"""An int column's text: an optional minus and ASCII digits (``--5``, ``-`` and ``٣`` are not integers)."""


class _Bad(ValueError):
    """A cell's text is not of its field's type (the message says what it must be)."""


@dataclasses.dataclass(frozen=True)
class _Column:
    name: str
    hint: Any
    nan_ok: bool
    range: tuple[float, float] | None = None


def _columns(value_type: type) -> list[_Column]:
    if value_type in _SCALARS:
        return [_Column("value", float, False, _SCALARS[value_type])]
    if dataclasses.is_dataclass(value_type):
        hints = typing.get_type_hints(value_type)
        return [_Column(f.name, hints[f.name], bool(f.metadata.get("raw_nan")), f.metadata.get("raw_range"))
                for f in dataclasses.fields(value_type)]
    raise TypeError(f"raw results hold floats or dataclasses, not {value_type!r}")


def _optional(hint: Any) -> Any | None:
    """``X`` for ``X | None``, else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


def _to_json(x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return [_to_json(v) for v in x]
    if isinstance(x, bool) or isinstance(x, (int, str)) or x is None:
        return x
    return float(x)


def _encode(x: Any, hint: Any) -> str:
    inner = _optional(hint)
    if inner is not None:
        return "" if x is None else _encode(x, inner)
    if hint is float:
        return repr(float(x))
    if hint is bool:
        return repr(bool(x))
    if hint is int:
        return str(int(x))
    if hint is str:
        return str(x)
    if typing.get_origin(hint) in (tuple, list):
        return json.dumps(_to_json(x), separators=(",", ":"))
    raise TypeError(f"raw results cannot hold a value of type {hint!r}")


def _number(v: float, nan_ok: bool) -> float:
    if math.isnan(v) and not nan_ok:
        raise _Bad("a number, not NaN")
    return v


def _from_json(v: Any, hint: Any, nan_ok: bool) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    inner = _optional(hint)
    if inner is not None:
        return None if v is None else _from_json(v, inner, nan_ok)
    if hint is float and isinstance(v, (int, float)) and not isinstance(v, bool):
        return _number(float(v), nan_ok)
    if hint is int and isinstance(v, int) and not isinstance(v, bool):
        return v
    if hint is bool and isinstance(v, bool):
        return v
    if origin in (tuple, list) and isinstance(v, list):
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            items = [_from_json(x, args[0], nan_ok) for x in v]
        elif len(v) == len(args):
            items = [_from_json(x, a, nan_ok) for x, a in zip(v, args)]
        else:
            raise _Bad(f"a list of {len(args)} items")
        return items if origin is list else tuple(items)
    raise _Bad(f"JSON of the type {hint}")


def _decode(text: str, hint: Any, nan_ok: bool) -> Any:
    inner = _optional(hint)
    if inner is not None:
        return None if text == "" else _decode(text, inner, nan_ok)
    if hint is float:
        try:
            v = float(text)
        except ValueError:
            raise _Bad("a float") from None
        return _number(v, nan_ok)
    if hint is bool:
        if text not in ("True", "False"):
            raise _Bad("True or False")
        return text == "True"
    if hint is int:
        if not (_INTEGER.fullmatch(text) and len(text) <= 20):
            raise _Bad("an integer")
        return int(text)
    if hint is str:
        if len(text) > MAX_TEXT or not text.isprintable():
            raise _Bad(f"printable text of at most {MAX_TEXT} characters")
        return text
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        raise _Bad(f"JSON of the type {hint}") from None
    try:
        return _from_json(parsed, hint, nan_ok)
    except RecursionError:
        raise _Bad(f"JSON of the type {hint}") from None


def _check_range(v: Any, bounds: tuple[float, float] | None) -> None:
    """``v`` (a decoded value: a number, None, a curve) within ``bounds``, or :class:`_Bad`."""
    if bounds is None or v is None or isinstance(v, (bool, str)):
        return
    if isinstance(v, (tuple, list)):
        for x in v:
            _check_range(x, bounds)
        return
    low, high = bounds
    if not low <= v <= high:
        raise _Bad(f"a number in [{low:g}, {high:g}]")


def _key(cell: Any) -> tuple[str, ...]:
    return tuple(str(getattr(cell, f.name)) for f in dataclasses.fields(cell))


def run_ids(runs: Sequence[ValidRun | RunConfig]) -> list[str]:
    """The ``run`` column of cells run as ``runs`` (in order): each run's id (a study of its own may still plan
    configs: their ids are computed)."""
    from phalanx.experiments.validrun import ValidRun as Valid
    from phalanx.experiments.validrun import run_id

    return [r.run_id if isinstance(r, Valid) else run_id(r) for r in runs]


def write(cells: list[C], runs: Sequence[str], collected: dict[C, Any], value_type: type) -> str:
    """The raw results of ``cells`` (whose runs are named ``runs``, in order: :func:`run_ids`) as CSV text: the
    cell's fields, ``run``, then the value's columns (module docstring: how each type is written)."""
    columns = _columns(value_type)
    if not cells:
        return ""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([f.name for f in dataclasses.fields(cells[0])] + ["run"] + [c.name for c in columns])  # type: ignore[arg-type]
    seen: set[tuple[str, ...]] = set()
    for c, run in zip(cells, runs, strict=True):
        key = _key(c)
        if key in seen:
            continue
        seen.add(key)
        v = collected[c]
        row = [v] if value_type in _SCALARS else [getattr(v, col.name) for col in columns]
        w.writerow([*key, run, *(_encode(x, col.hint) for x, col in zip(row, columns))])
    return buf.getvalue()


def read(path: Path, cells: list[C], runs: Sequence[str], value_type: type) -> dict[C, Any]:
    """What every planned cell (whose runs are named ``runs``, in order) ended with, read from the raw-results file
    ``path`` (module docstring: the checks)."""
    def bad(allowed: str) -> ConfigError:
        return ConfigError("results", str(path), allowed)

    text = read_bounded_text(path, MAX_BYTES, "an existing file (a runs.csv a report wrote)")
    if not cells:
        return {}
    names = [f.name for f in dataclasses.fields(cells[0])]  # type: ignore[arg-type]
    columns = _columns(value_type)
    header = names + ["run"] + [c.name for c in columns]
    csv.field_size_limit(max(csv.field_size_limit(), MAX_BYTES))  # a long curve is one field; the file is bounded
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise bad(f"CSV ({exc})") from None
    if not rows or rows[0] != header:
        raise bad("CSV with the header " + ",".join(header))
    table: dict[tuple[str, ...], tuple[str, list[str]]] = {}
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise bad(f"{len(header)} columns on every row (row {i} has {len(row)})")
        key = tuple(row[: len(names)])
        if key in table:
            raise bad(f"one row per cell (row {i} repeats {','.join(key)})")
        table[key] = (row[len(names)], row[len(names) + 1:])
    planned = {_key(c) for c in cells}
    extra = sorted(set(table) - planned)
    if extra:
        raise bad(f"rows of the planned cells only (not {','.join(extra[0])}: does the preset match?)")
    out: dict[C, Any] = {}
    for c, run in zip(cells, runs, strict=True):
        got = table.get(_key(c))
        if got is None:
            raise bad(f"a row for every planned cell (none for {','.join(_key(c))}: does the preset match?)")
        if got[0] != run:
            raise bad(f"the run id of the planned configuration ({run}, not {got[0][:40]!r} for "
                      f"{','.join(_key(c))}: were the runs made with other settings?)")
        values = []
        for col, cell_text in zip(columns, got[1]):
            try:
                value = _decode(cell_text, col.hint, col.nan_ok)
                _check_range(value, col.range)
                values.append(value)
            except _Bad as exc:
                raise bad(f"{exc} in the column {col.name} (cell {','.join(_key(c))})") from None
        out[c] = values[0] if value_type in _SCALARS else value_type(*values)
    return out
