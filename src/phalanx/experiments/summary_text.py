"""What a grid's report says around its summary table: the one line naming the keys every run shares (a first-hour
review found that neither the terminal nor ``report.md`` named the data set, the model, n, b, f or the rounds — the
tables show only the keys that vary), and the order of the table's rows (grouped by setting, best first within
one: sorted by accuracy alone, rows with no attack and under an attack were interleaved)."""

from __future__ import annotations

import json
from typing import Any

NO_ATTACKS = ("honest", "none")
"""The attacks whose runs measure the price of robustness (:func:`phalanx.experiments.report.tradeoff`), the first
both the mean and a rule have preferred, and listed first in the summary's groups: ``honest`` (the would-be
Byzantine workers compute real gradients on their own data: an all-honest run of n workers, Yang, Shi & Li's "nobody
attacks"), else ``none`` (they replay copies of honest rows, so the rule sees b duplicated rows: a rule that favours
rows with a near neighbour, Krum, picks a copy, and its price is then not the all-honest one; the table says so)."""

SHOWN = ("dataset", "model", "workers", "byzantine", "f", "aggregator", "attack", "partition", "alpha", "algorithm",
         "graph", "rounds", "batch_size", "lr", "momentum", "schedule", "local_steps", "clients_per_round")
"""The keys the line may name, in this order (each only where every run has the same value)."""


def setup_line(rows: list[dict[str, Any]]) -> str:
    """``Setup (every run): dataset = digits, model = mlp, …; seeds 0, 1, 2`` — the keys of :data:`SHOWN` that
    every row of ``rows`` (metric rows carrying their run's config keys) has with one value, and the seeds; empty
    when there is nothing to say. A key that varies is the tables' column, not this line's."""
    if not rows:
        return ""
    shared = []
    for key in SHOWN:
        values = {json.dumps(r.get(key), sort_keys=True) for r in rows}
        if len(values) == 1 and rows[0].get(key) is not None:
            shared.append(f"{key} = {rows[0][key]}")
    seeds = sorted({r["seed"] for r in rows if isinstance(r.get("seed"), int)})
    said = [", ".join(shared)] if shared else []
    if seeds:
        said.append(f"seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}")
    return "Setup (every run): " + "; ".join(said) if said else ""


def _sortable(key: str, value: Any) -> tuple[int, float, str]:
    """A value's place in its key's order: numbers by size, the no-attack baselines first, other text by name."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, float(value), "")
    if key == "attack" and value in NO_ATTACKS:
        return (0, float(NO_ATTACKS.index(value)), "")
    return (2, 0.0, json.dumps(value, sort_keys=True))


def summary_order(summary: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    """The summary's rows grouped by the varying keys other than the rule (``keys``), each group best first."""
    group = [k for k in keys if k != "aggregator"]
    return sorted(summary, key=lambda s: (*(_sortable(k, s.get(k)) for k in group), -s["final_accuracy"]))
