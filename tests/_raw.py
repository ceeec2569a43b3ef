"""Shared by the raw-results tests: a study's report made from its ``runs.csv`` against the report made from its
runs (:func:`assert_rebuilt`), and made-up values of any raw type for the round-trip and hostile-file tests."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

from phalanx import studies
from phalanx.studies import raw

TEXT = (".md", ".csv", ".txt", ".json")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in TEXT and p.name != "runs.csv"}


def assert_rebuilt(name: str, out: Path, seeds: int, sets: list[str]) -> None:
    """The study ``name``'s ``out/runs.csv`` (written by ``phalanx experiment NAME --seeds SEEDS --set …`` into
    ``out``) holds exactly what its runs ended with, and the report made from it is the report made from the runs:
    every text file byte for byte (both with no wall time: a report from a file trained nothing)."""
    study = studies.resolve(name)()
    p, overrides = study.configure("quick", seeds, sets)
    cells, cfgs = study.plan(p, overrides)
    raw_cells, ids = study.raw_cells(p, cells, cfgs)
    ran = study.collect(cells, cfgs, out / "runs")
    back = raw.read(out / "runs.csv", raw_cells, ids, study.raw_value)
    assert (out / "runs.csv").read_text() == raw.write(raw_cells, ids, back, study.raw_value)
    assert raw.write(raw_cells, ids, ran, study.raw_value) == raw.write(raw_cells, ids, back, study.raw_value)
    made = []
    for label, collected in (("runs", ran), ("file", back)):
        folder = out.parent / f"{out.name}-from-{label}"
        folder.mkdir()
        if hasattr(study, "seconds"):
            study.seconds = None  # the convergence study times its in-process runs; a file's report has no time
        study.report(p, cells, collected, folder, command="c", wall_seconds=None, runs=len(study.runs(cfgs)),
                     overrides=overrides)
        made.append(_files(folder))
    assert made[0] == made[1] and "report.md" in made[0]


def fake(hint: Any, i: int) -> Any:
    """A value of the raw type ``hint`` for the ``i``-th cell (awkward digits, ``inf`` in a curve, ``None`` on odd
    cells where the type allows it)."""
    if typing.get_origin(hint) in (typing.Union, __import__("types").UnionType):
        inner = next(a for a in typing.get_args(hint) if a is not type(None))
        return None if i % 2 else fake(inner, i)
    if hint is float:
        return 0.1 + i / 7
    if hint is bool:
        return i % 3 == 0
    if hint is int:
        return i
    if hint is str:
        return "proven"
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list:
        return [fake(args[0], i), fake(args[0], i + 1), math.inf]
    if typing.get_origin(hint) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return (fake(args[0], i), fake(args[0], i + 1))
        return tuple(fake(a, i + k) for k, a in enumerate(args))
    raise TypeError(hint)


def _inside(v: Any, bounds: tuple[float, float] | None) -> Any:
    """``v`` (a made-up number, a curve of them, or None) moved into a field's ``raw.within`` bounds (its digits kept
    awkward; an infinite number of a curve where the bounds are finite: the lower bound)."""
    if isinstance(v, (tuple, list)):
        return type(v)(_inside(x, bounds) for x in v)
    if bounds is None or not isinstance(v, float):
        return v
    low, high = bounds
    if low <= v <= high:
        return v
    return low if math.isinf(v) else low + math.fmod(v - low, min(high - low, 1.0))


def fake_values(value_type: type, cells: list[Any]) -> dict[Any, Any]:
    """A made-up value of ``value_type`` for every cell (within each field's ``raw.within`` bounds)."""
    if value_type is float:
        return {c: fake(float, i) for i, c in enumerate(cells)}
    if value_type is raw.Share:
        return {c: _inside(fake(float, i), raw.SHARE["raw_range"]) for i, c in enumerate(cells)}
    hints = typing.get_type_hints(value_type)
    return {c: value_type(*(_inside(fake(hints[f.name], i + k), f.metadata.get("raw_range"))
                            for k, f in enumerate(dataclasses.fields(value_type))))
            for i, c in enumerate(cells)}
