"""Clients' metrics aggregated robustly: the unweighted coordinate-wise median, over enough clients.

Flower's ``FedAvg`` averages the clients' ``MetricRecord`` values weighted by their ``num-examples`` (McMahan et al.,
AISTATS 2017, Algorithm 1). A Byzantine client controls both its metrics and its claimed number of examples, so one
reply could set the round's reported loss to anything. Here each key is the median of the values the clients sent
for it (non-finite values left out; a list-valued metric element-wise, over the lists of the most common length),
every client weighing the same — as the robust rules weigh the updates — and a key is reported only when at least
``2f + 1`` clients sent a finite value for it, so that the f Byzantine ones can neither choose its value (a median
of at least 2f + 1 values lies between two honest ones) nor add keys of their own: one node's ``accuracy = 1.0``,
or 100,000 keys and a list of 2·10⁶ floats that Flower logs every round, went straight through before (a review of
the Flower strategy). A record of more than :data:`MAX_KEYS` keys or a list longer than :data:`MAX_LIST` is left
out whole, and a value that is no finite float (an integer of 400 digits, which in-process Flower passes through)
counts as missing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import MetricRecord

__all__ = ["median_metrics"]


MAX_KEYS = 256
"""The most keys a client's record may hold for its metrics to be read (an honest one: a handful)."""
MAX_LIST = 4096
"""The longest list-valued metric read (an honest one: a value per class or per step)."""


def _as_float(value: Any) -> float:
    """``value`` as a float, NaN when it is none (a bool, a string, an integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.nan


def median_metrics(records: Iterable[MetricRecord], exclude: Iterable[str] = (), at_least: int = 1) -> MetricRecord:
    """The per-key median of ``records`` over the keys that at least ``at_least`` records hold a finite value of
    (2f + 1 for f Byzantine clients; keys in ``exclude`` left out); a list-valued key element-wise, over the lists of
    the most common length, where each element has at least ``at_least`` finite values."""
    skip = set(exclude)
    scalars: dict[str, list[float]] = {}
    lists: dict[str, list[list[float]]] = {}
    for record in records:
        if len(record) > MAX_KEYS:
            continue
        for key, value in record.items():
            if key in skip:
                continue
            if isinstance(value, list):
                if len(value) <= MAX_LIST:
                    lists.setdefault(key, []).append([_as_float(v) for v in value])
            elif math.isfinite(x := _as_float(value)):
                scalars.setdefault(key, []).append(x)
    out = MetricRecord()
    for key, values in scalars.items():
        if len(values) >= at_least:
            out[key] = float(np.median(values))
    for key, rows in lists.items():
        if key in out or not rows:
            continue
        length = Counter(len(r) for r in rows).most_common(1)[0][0]
        same = np.array([r for r in rows if len(r) == length], dtype=np.float64).reshape(-1, length)
        with np.errstate(all="ignore"):
            masked = np.where(np.isfinite(same), same, np.nan)
            if length and (np.isfinite(masked).sum(axis=0) >= max(at_least, 1)).all():
                out[key] = [float(v) for v in np.nanmedian(masked, axis=0)]
    return out
