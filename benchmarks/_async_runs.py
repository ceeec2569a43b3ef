"""What the asynchronous tables of docs/async.md read from a folder of finished runs (shared by
``async_availability.py`` and ``async_concurrency.py``): each run's evaluation rows grouped by a config value, and a
run's rows up to a server step and at a simulated time. Nothing is timed: the numbers are functions of the configs
and seeds."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

Rows = list[dict[str, Any]]


def read(runs: Path, key: Callable[[dict[str, Any]], Hashable]) -> dict[Any, list[Rows]]:
    """Each ``key(config)``'s runs under ``runs`` (every ``metrics.jsonl`` with its ``config.json``), each run as its
    rows that carry the simulated clock (``sim_time``)."""
    out: dict[Any, list[Rows]] = defaultdict(list)
    for metrics in sorted(runs.glob("**/metrics.jsonl")):
        cfg = json.loads((metrics.parent / "config.json").read_text())
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        out[key(cfg)].append([r for r in rows if "sim_time" in r])
    return out


def up_to(rows: Rows, step: int) -> Rows:
    """The evaluated rows of steps 1 … ``step`` (the last one is step ``step``'s), else a one-line exit."""
    upto = [r for r in rows if 0 < r["round"] <= step and r["staleness_mean"] is not None]
    if not upto or upto[-1]["round"] != step:
        raise SystemExit(f"a run has no evaluation at step {step} (eval_every must divide it, rounds reach it)")
    return upto


def accuracy_at(rows: Rows, time: float) -> float | None:
    """The test accuracy of the last evaluation at or before simulated ``time`` (round 0: time 0, θ₀); None when the
    run ended before ``time``."""
    before = [r for r in rows if (r["sim_time"] or 0.0) <= time]
    return before[-1]["test_accuracy"] if before and rows[-1]["sim_time"] >= time else None
