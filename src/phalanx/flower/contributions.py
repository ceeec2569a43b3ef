"""Each client's contribution to a round, kept in memory and optionally appended to a JSON-lines file.

One record per reply: ``round``, ``node_id``, ``status`` (``"used"``, ``"dropped: <why>"`` or ``"not aggregated:
<why>"``), ``reason`` (the same in one word: ``"used"``, ``"not-aggregated"``, or why the reply was dropped:
``"error"``, ``"malformed"``, ``"duplicate"``, ``"unsampled"``, ``"stale"``, ``"impostor"``, ``"adapter"``),
``update_norm`` ‖Δᵢ‖, ``distance_to_aggregate`` ‖Δᵢ − Agg(Δ₁…Δₙ)‖, ``share`` (the rule's weight on the client: its share
of the aggregate, from ``Aggregator.contributions``; None for a rule that does not report it) and ``num_examples`` (None
when the client did not send it, or when the reply was dropped by the one-vote check, which never reads it). Norms are
computed in float64; a NaN or infinite norm is kept as such in memory and written as ``null`` in the file (strict
JSON).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

__all__ = ["Contribution", "append_jsonl"]


class Contribution(TypedDict):
    """One client's reply in one round (see the module's docstring)."""

    round: int
    node_id: int | None
    status: str
    reason: str
    update_norm: float | None
    distance_to_aggregate: float | None
    share: float | None
    num_examples: float | None


def _strict(value: Any) -> Any:
    """A non-finite float, or an int outside ±2⁶⁴ (no node id or count is; json refuses 4,301 digits), as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and not -(2 ** 64) < value < 2 ** 64:
        return None
    return value


def append_jsonl(path: str | Path, records: Sequence[Contribution]) -> None:
    """Append ``records`` to ``path`` as JSON lines, in one write (a round's lines stay together)."""
    if not records:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({k: _strict(v) for k, v in r.items()}, allow_nan=False) + "\n" for r in records)
    with target.open("a", encoding="utf-8") as fh:
        fh.write(text)
