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

__all__ = ["CALIBRATION_HEADER", "HEADER", "MAX_BYTES", "ROLES", "Planned", "check_bounds", "read",
           "read_calibration", "save", "write", "write_calibration"]

HEADER = ("problem", "attack", "T", "k", "norm_u", "seed", "learner", "regret", "bound")
CALIBRATION_HEADER = (*HEADER[:7], "role", "regret", "bound")
"""The calibration grid's points file (``--calibrate … --out``): a check's columns and the point's ``role``."""
ROLES = ("fit", "held-out")
"""A calibration point either fits the constants (its seed is one of ``--seeds``) or is held out from the fit and
checked against them (``--held-out-seeds``)."""
MAX_BYTES = 4 << 20
"""The largest points file read (4 MiB; the calibration, the largest documented, has 702 rows, 50 KB)."""

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


def write_calibration(rows: Sequence[tuple[Planned, str, float, float]]) -> str:
    """The calibration's CSV text (:data:`CALIBRATION_HEADER`): each row a planned point, its role (``fit`` or
    ``held-out``), its regret and its bound with the constants the ``fit`` rows gave."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CALIBRATION_HEADER)
    for p, role, regret, b in rows:
        if role not in ROLES:
            raise ConfigError("role", role, ", ".join(ROLES))
        w.writerow([*_key(p), role, repr(float(regret)), repr(float(b))])
    return buf.getvalue()


def _table(path: Path, header: tuple[str, ...]) -> dict[tuple[str, ...], tuple[str, str]]:
    """The file's rows by key (every column but the last two), after the shape checks (module docstring)."""
    def bad(allowed: str) -> ConfigError:
        return ConfigError("results", str(path), allowed)

    text = read_bounded_text(path, MAX_BYTES, "an existing file (a points.csv that --out wrote)")
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise bad(f"CSV ({exc})") from None
    if not rows or tuple(rows[0]) != header:
        raise bad("CSV with the header " + ",".join(header))
    table: dict[tuple[str, ...], tuple[str, str]] = {}
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise bad(f"{len(header)} columns on every row (row {i} has {len(row)})")
        key = tuple(row[:-2])
        if key in table:
            raise bad(f"one row per point (row {i} repeats {_show(key)})")
        table[key] = (row[-2], row[-1])
    return table


def _values(path: Path, table: dict[tuple[str, ...], tuple[str, str]], keys: Sequence[tuple[str, ...]],
            finite: bool) -> list[tuple[float, float]]:
    """(regret, bound) of every key, in order: the file holds exactly the planned keys, each with floats, the regret
    not NaN (nor ±inf when ``finite``)."""
    def bad(allowed: str) -> ConfigError:
        return ConfigError("results", str(path), allowed)

    extra = sorted(set(table) - set(keys))
    if extra:
        raise bad(f"rows of the planned points only (not {_show(extra[0])}: does the grid match?)")
    out: list[tuple[float, float]] = []
    for key in keys:
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
        if finite and math.isinf(regret):
            raise bad(f"a finite number in the column regret {where}")
        out.append((regret, b))
    return out


def check_bounds(path: Path, planned: Sequence[Planned], found: Sequence[float], constants: bounds.Constants,
                 g: float, epsilon: float, whose: str = "the committed constants") -> None:
    """Refuse the file ``path`` unless every bound ``found`` is B(T, k, ‖u‖) of ``constants`` (with ``g`` and
    ``epsilon``) for its planned point, to the last digit; ``whose`` names the constants in the message."""
    for p, b in zip(planned, found, strict=True):
        want = bounds.bound(p[2], p[3], p[4], constants, g, epsilon)
        if b != want:
            raise ConfigError("results", str(path), f"the bound of {whose}, {want!r}, in the column bound (point "
                                                     f"{','.join(_key(p))}): made with other constants or another ε?")


def read(path: Path, planned: Sequence[Planned], constants: bounds.Constants, g: float, epsilon: float) -> list[float]:
    """The regret of every ``planned`` point, in order, read from the points file ``path``; each row's bound must be
    the one ``constants`` give (B(T, k, ‖u‖) with ``g`` and ``epsilon``) to the last digit."""
    got = _values(path, _table(path, HEADER), [_key(p) for p in planned], finite=False)
    check_bounds(path, planned, [b for _, b in got], constants, g, epsilon)
    return [r for r, _ in got]


def read_calibration(path: Path, planned: Sequence[tuple[Planned, str]]) -> list[tuple[float, float]]:
    """(regret, bound) of every planned (point, role), in order, from the calibration's points file ``path``
    (:data:`CALIBRATION_HEADER`; every regret finite: a fit over ±inf means nothing). The bounds are not checked
    here: they are the constants' that the file's own ``fit`` rows give, which the caller fits and then holds the
    file to (:func:`check_bounds`)."""
    for _, role in planned:
        if role not in ROLES:
            raise ConfigError("role", role, ", ".join(ROLES))
    return _values(path, _table(path, CALIBRATION_HEADER), [(*_key(p), role) for p, role in planned], finite=True)


def save(out: Path, points_csv: str, report: str) -> Path:
    """``points.csv`` and ``report.md`` into the folder ``out`` (created), each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "points.csv", points_csv.encode())
    write_atomic(out / "report.md", report.encode())
    return out
