"""Clients' metrics aggregated robustly: the unweighted coordinate-wise median.

Flower's ``FedAvg`` averages the clients' ``MetricRecord`` values weighted by their ``num-examples`` (McMahan et al.,
AISTATS 2017, Algorithm 1). A Byzantine client controls both its metrics and its claimed number of examples, so one
reply could set the round's reported loss to anything. Here each key is the median of the values the clients sent
for it (non-finite values left out; a list-valued metric element-wise, over the lists of the most common length),
every client weighing the same — as the robust rules weigh the updates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import MetricRecord

__all__ = ["median_metrics"]


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and bool(np.isfinite(value))


def median_metrics(records: Iterable[MetricRecord], exclude: Iterable[str] = ()) -> MetricRecord:
    """The per-key median of ``records`` (keys in ``exclude`` left out; a key with no finite value is left out)."""
    skip = set(exclude)
    scalars: dict[str, list[float]] = {}
    lists: dict[str, list[list[float]]] = {}
    for record in records:
        for key, value in record.items():
            if key in skip:
                continue
            if isinstance(value, list):
                lists.setdefault(key, []).append([float(v) for v in value])
            elif _finite(value):
                scalars.setdefault(key, []).append(float(value))
    out = MetricRecord()
    for key, values in scalars.items():
        out[key] = float(np.median(values))
    for key, rows in lists.items():
        if key in out or not rows:
            continue
        length = Counter(len(r) for r in rows).most_common(1)[0][0]
        same = np.array([r for r in rows if len(r) == length], dtype=np.float64).reshape(-1, length)
        with np.errstate(all="ignore"):
            masked = np.where(np.isfinite(same), same, np.nan)
            if length and not np.isnan(masked).all(axis=0).any():
                out[key] = [float(v) for v in np.nanmedian(masked, axis=0)]
    return out
