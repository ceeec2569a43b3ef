"""Grids: every list-valued key of a config expands into one run per combination.

Keys that must vary *together* go in a ``tie`` table of equal-length lists — one axis of the grid whose i-th point
takes the i-th value of each (``[tie] local_steps = [1, 5, 20]`` and ``rounds = [400, 80, 20]``: three points with
the same number of local gradient steps, not nine).
"""

from __future__ import annotations

import itertools
import math
import typing
from typing import Any

from phalanx.errors import ConfigError
from phalanx.experiments import concerns, spelling, tree
from phalanx.experiments.config import RunConfig, key_text, validate
from phalanx.experiments.validrun import RUN_ID_MAX, ValidRun, run_id

__all__ = ["MAX_POINTS", "RUN_ID_MAX", "configs", "expand", "run_id", "runs"]



def _list_keys() -> frozenset[str]:
    """Keys whose values are lists by nature (never expanded): each flat key declared as a list (``tracking``, a
    plug-in's section's ``tags``: :func:`phalanx.experiments.concerns.checked`)."""
    return frozenset(k.flat for s in concerns.checked() for k in s.keys
                     if "." not in k.flat and typing.get_origin(k.type) is list)


MAX_POINTS = 100_000
"""The most points a grid may have: each is validated and gets a run directory before the first run starts. Measured:
2.4 kB of memory and 0.9 ms a point to expand and validate (10,000 points: 24 MB, 8.7 s), so the bound is about
0.24 GB and a minute and a half; a grid of 4·10⁸ points grew to 3.9 GB before printing anything."""


def _tied(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The points of the ``tie`` axis: the i-th value of every tied key ([{}] when there is none)."""
    tie = data.get("tie")
    if tie is None:
        return [{}]
    if not isinstance(tie, dict) or not tie:
        raise ConfigError("tie", tie, "a table of keys whose lists vary together, e.g. [tie] local_steps = [1, 5] and "
                          "rounds = [100, 20]")
    lengths = {k: len(v) if isinstance(v, list) else -1 for k, v in tie.items()}
    if any(n < 1 for n in lengths.values()) or len(set(lengths.values())) != 1:
        raise ConfigError("tie", lengths, "non-empty lists of one length (the i-th values go together)")
    clash = sorted(set(tie) & set(data))
    if clash:
        raise ConfigError("tie", clash, "keys that are not also set outside the tie table")
    n = next(iter(lengths.values()))
    return [{k: v[i] for k, v in tie.items()} for i in range(n)]


def expand(data: dict[str, Any]) -> list[dict[str, Any]]:
    """All combinations of the list-valued keys, in a stable order (the first key varies slowest; the ``tie`` axis
    varies slowest of all). A config tree is read as its flat keys first (:func:`phalanx.experiments.tree.to_flat`:
    a section's list is an axis too)."""
    data, carried = spelling.detach(data)
    data, written = tree.read(data)
    written = written if written.names else carried  # each point carries it to validation (spelling.py)
    data = spelling.attach(data, written)
    tied = _tied(data)
    data = {k: v for k, v in data.items() if k != "tie"}
    lists = _list_keys()
    keys = [k for k, v in data.items() if isinstance(v, list) and k not in lists]
    for k in keys:
        if not data[k]:
            raise ConfigError(written.spelling(k) or key_text(k), [], "a non-empty list (each value is one point of "
                              "the grid)")
    points = len(tied) * math.prod(len(data[k]) for k in keys)
    if points > MAX_POINTS:  # counted before a point is built
        sizes = " × ".join(f"{len(data[k])} {k}" for k in keys) + (f" × {len(tied)} tied" if len(tied) > 1 else "")
        raise ConfigError("grid", f"{points:,} points ({sizes})", f"at most {MAX_POINTS:,} points (each is validated "
                          "and gets a run directory before the first run starts)", "split it into several grids")
    out = []
    for together in tied:
        for combo in itertools.product(*(data[k] for k in keys)):
            point = dict(data)
            point.update(zip(keys, combo))
            point.update(together)
            out.append(point)
    return out


def runs(data: dict[str, Any]) -> list[ValidRun]:
    """Validate every point of the grid, once, before anything runs (a bad point is an error up front)."""
    return [validate(point) for point in expand(data)]


def configs(data: dict[str, Any]) -> list[RunConfig]:
    """The configs of :func:`runs` (a run made from one of them later is validated there)."""
    return [run.cfg for run in runs(data)]
