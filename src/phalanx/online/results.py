r"""The regret check's raw results (``points.csv``) and its report (``report.md``), and the report made again from
the committed raw results without running a game (``python -m phalanx.online.check … --results FILE``; the docs check
of ``scripts/docs_check.py``, ``results:``).

``points.csv`` holds one row per (cell, seed, learner) the grid ran, in the order the check ran them: ``problem``,
``attack``, ``T``, ``k``, ``norm_u`` (‖u‖), ``seed``, ``learner``, the true regret ``regret`` = R_T(u) and the bound
``bound`` = B(T, k, ‖u‖) of :func:`phalanx.online.bound.bound` with the constants the check used — floats by
``repr``, so a report made from the file is the report made from the run, digit for digit.

Reading back matches the rows to the points the command's grid *plans* (the same ``--problems … --learners``), so a
file cannot add, drop or repeat a point. A file is input from anyone: one that is too large, not UTF-8, not CSV, of
another header or column count, with a row the grid does not plan, a regret that is NaN or not a float, or a bound
other than the one the fixed constants give for its cell (a file made with other constants or another ε) is one
:class:`~phalanx.errors.ConfigError` naming ``results`` and the file, before anything is printed or written. The
checks are those of :mod:`phalanx.studies.raw` (which the ``online`` layer may not import), for this one table.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from phalanx.errors import ConfigError
from phalanx.files import write_atomic
from phalanx.online import bound as bounds
from phalanx.validate import read_bounded_text

__all__ = ["HEADER", "MAX_BYTES", "Planned", "read", "save", "write"]

HEADER = ("problem", "attack", "T", "k", "norm_u", "seed", "learner", "regret", "bound")
MAX_BYTES = 4 << 20
"""The largest points file read (4 MiB; grid A, the largest documented, has 504 rows of about 100 bytes)."""

Planned = tuple[str, str, int, int, float, int, str]
"""(problem, attack, T, k, ‖u‖, seed, learner): one point a grid plans."""


def _key(p: Planned) -> tuple[str, ...]:
    problem, attack, T, k, nu, seed, learner = p
    return (problem, attack, str(int(T)), str(int(k)), repr(float(nu)), str(int(seed)), learner)


def _show(key: tuple[str, ...]) -> str:
    """A row's key from the file, for a one-line message: escaped (no line break of the file's) and cut at 200."""
    return ",".join(key).encode("unicode_escape").decode("ascii")[:200]


def write(rows: Sequence[tuple[Planned, float, float]]) -> str:
    """The CSV text of ``rows``: each a planned point, its regret and its bound (module docstring)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    for p, regret, b in rows:
        w.writerow([*_key(p), repr(float(regret)), repr(float(b))])
    return buf.getvalue()


def read(path: Path, planned: Sequence[Planned], constants: bounds.Constants, g: float, epsilon: float) -> list[float]:
    """The regret of every ``planned`` point, in order, read from the points file ``path``; each row's bound must be
    the one ``constants`` give (B(T, k, ‖u‖) with ``g`` and ``epsilon``) to the last digit."""
    def bad(allowed: str) -> ConfigError:
        return ConfigError("results", str(path), allowed)

    text = read_bounded_text(path, MAX_BYTES, "an existing file (a points.csv that --out wrote)")
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise bad(f"CSV ({exc})") from None
    if not rows or tuple(rows[0]) != HEADER:
        raise bad("CSV with the header " + ",".join(HEADER))
    table: dict[tuple[str, ...], tuple[str, str]] = {}
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(HEADER):
            raise bad(f"{len(HEADER)} columns on every row (row {i} has {len(row)})")
        key = tuple(row[:7])
        if key in table:
            raise bad(f"one row per point (row {i} repeats {_show(key)})")
        table[key] = (row[7], row[8])
    keys = [_key(p) for p in planned]
    extra = sorted(set(table) - set(keys))
    if extra:
        raise bad(f"rows of the planned points only (not {_show(extra[0])}: does the grid match?)")
    out: list[float] = []
    for p, key in zip(planned, keys):
        got = table.get(key)
        if got is None:
            raise bad(f"a row for every planned point (none for {','.join(key)}: does the grid match?)")
        where = f"(point {','.join(key)})"
        try:
            regret, b = float(got[0]), float(got[1])
        except ValueError:
            raise bad(f"floats in the columns regret and bound {where}") from None
        if math.isnan(regret):
            raise bad(f"a number, not NaN, in the column regret {where}")
        want = bounds.bound(p[2], p[3], p[4], constants, g, epsilon)
        if b != want:
            raise bad(f"the bound of the committed constants, {want!r}, in the column bound {where}: made with "
                      f"other constants or another ε?")
        out.append(regret)
    return out


def save(out: Path, points_csv: str, report: str) -> Path:
    """``points.csv`` and ``report.md`` into the folder ``out`` (created), each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "points.csv", points_csv.encode())
    write_atomic(out / "report.md", report.encode())
    return out
