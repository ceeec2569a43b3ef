"""Grids: every list-valued key of a config expands into one run per combination."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from phalanx.errors import ConfigError
from phalanx.experiments.config import RunConfig, make_config

# Keys whose values are lists by nature (never expanded).
_LIST_KEYS: frozenset[str] = frozenset()


def expand(data: dict[str, Any]) -> list[dict[str, Any]]:
    """All combinations of the list-valued keys, in a stable order (the first key varies slowest)."""
    keys = [k for k, v in data.items() if isinstance(v, list) and k not in _LIST_KEYS]
    if not keys:
        return [dict(data)]
    for k in keys:
        if not data[k]:
            raise ConfigError(k, [], "a non-empty list (each value is one point of the grid)")
    out = []
    for combo in itertools.product(*(data[k] for k in keys)):
        point = dict(data)
        point.update(zip(keys, combo))
        out.append(point)
    return out


def configs(data: dict[str, Any]) -> list[RunConfig]:
    """Validate every point of the grid before anything runs (a bad point is an error up front)."""
    return [make_config(point) for point in expand(data)]


def run_id(cfg: RunConfig) -> str:
    """A short, stable directory name for a configuration: readable prefix + hash of the full config."""
    payload = json.dumps(cfg.identity(), sort_keys=True).encode()
    digest = hashlib.sha256(payload).hexdigest()[:10]
    agg = "".join(c if c.isalnum() else "-" for c in cfg.aggregator)
    return f"{agg}_{cfg.attack}_f{cfg.f}_b{cfg.byzantine}_s{cfg.seed}_{digest}"
