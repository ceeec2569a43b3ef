"""The one line that says what a grid ran: the keys its runs share (a first-hour review found that neither the
terminal nor ``report.md`` named the data set, the model, n, b, f or the rounds — the tables show only the keys
that vary)."""

from __future__ import annotations

import json
from typing import Any

SHOWN = ("dataset", "model", "workers", "byzantine", "f", "aggregator", "attack", "partition", "alpha", "algorithm",
         "graph", "rounds", "batch_size", "lr", "momentum", "schedule", "local_steps", "clients_per_round")
"""The keys the line may name, in this order (each only where every run has the same value)."""


def setup_line(rows: list[dict[str, Any]]) -> str:
    """``Setup (every run): dataset = digits, model = mlp, …; seeds 0, 1, 2`` — the keys of :data:`SHOWN` that
    every row of ``rows`` (metric rows carrying their run's config keys) has with one value, and the seeds; empty
    for no rows. A key that varies is the tables' column, not this line's."""
    if not rows:
        return ""
    shared = []
    for key in SHOWN:
        values = {json.dumps(r.get(key), sort_keys=True) for r in rows}
        if len(values) == 1 and rows[0].get(key) is not None:
            shared.append(f"{key} = {rows[0][key]}")
    seeds = sorted({r["seed"] for r in rows if isinstance(r.get("seed"), int)})
    tail = f"; seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}" if seeds else ""
    return "Setup (every run): " + ", ".join(shared) + tail
