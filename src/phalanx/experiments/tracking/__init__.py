"""Experiment trackers: a run's parameters and metric rows, live, in TensorBoard, MLflow or Weights & Biases.

A config names them — ``tracking = ["tensorboard", "mlflow"]`` (or one name), each one's parameters in
``tracking_params.<name>`` — or the command line does (``phalanx run --track mlflow``, ``--track
mlflow=http://host:5000``). Each run of a grid is one tracked run: its configuration as parameters, every metric row
as it is made (step = round), closed with how the run ended; a resumed run continues the same tracked run
(:mod:`phalanx.experiments.tracking.callback`). The trackers change no result (the keys are result-neutral: a run
tracked or not has one run id).

Trackers are a registry like every other kind of piece (:class:`phalanx.plugins.Registry`): the built-in names, a
``module:attr`` spec, or a ``phalanx.trackers`` entry point — a tracker of one's own is one file (a class with
``start``, ``log`` and ``finish``; :mod:`phalanx.experiments.tracking.base`). Their packages are optional extras,
imported only when a run is tracked; a missing one is a one-line error naming the extra, raised when the config is
validated.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phalanx.errors import ConfigError
from phalanx.experiments.schema import RunConfig
from phalanx.experiments.tracking.base import (
    ENDS,
    TrackedRun,
    Tracker,
    TrackerLike,
    flatten,
    numbers,
)
from phalanx.experiments.tracking.mlflow import MLflow
from phalanx.experiments.tracking.tensorboard import TensorBoard
from phalanx.experiments.tracking.wandb import WandB
from phalanx.plugins import Registry, check_params

__all__ = [
    "ENDS", "TRACKERS", "MLflow", "TensorBoard", "TrackedRun", "Tracker", "TrackerLike", "Tracking", "WandB",
    "build", "check", "flatten", "names", "numbers", "of", "register", "track_overrides",
]


def _accept(obj: Any, name: str) -> Any:
    """A tracker class: it has ``start``, ``log`` and ``finish``."""
    if not isinstance(obj, type) or not all(callable(getattr(obj, m, None)) for m in ("start", "log", "finish")):
        raise ConfigError("tracking", name, "a tracker: a class with start(run), log(step, metrics) and finish(end) "
                          "(docs/tracking.md)")
    return obj


TRACKERS: Registry[type[Any]] = Registry("tracking", "phalanx.trackers", _accept)
"""Tracker names → classes: the built-ins, ``@register``-ed ones, ``module:attr`` specs, ``phalanx.trackers`` entry
points."""
for _cls in (TensorBoard, MLflow, WandB):
    TRACKERS.register(_cls)
register = TRACKERS.register
names = TRACKERS.names
"""The trackers' names (the built-ins, registered ones, installed entry points)."""


def build(name: str, params: Mapping[str, Any] | None = None) -> TrackerLike:
    """The tracker ``name`` with its parameters (each checked against its constructor, then by the tracker), checked
    as it would be before a run: its package installed, a local location writable."""
    cls = TRACKERS.get(name, "tracking")
    params = dict(params or {})
    check_params(f"tracker {name!r}", cls, params)
    try:
        tracker = cls(**params)
    except ConfigError:
        raise
    except TypeError as exc:  # a user's constructor that refuses its arguments
        raise ConfigError(f"tracking_params.{name}", params, f"the parameters tracker {name!r} takes ({exc})") \
            from None
    checks = getattr(tracker, "check", None)
    if callable(checks):
        checks()
    return tracker


def check(names: Sequence[str], params: Mapping[str, Any]) -> None:
    """A config's ``tracking`` (``names``) and ``tracking_params`` (``params``: the two keys it reads, not the
    config), before any run: known names (one line with a suggestion otherwise), each named once, each table's
    parameters those its tracker takes, the packages installed (a one-line error naming the extra), a local location
    writable. A table for a tracker the config does not use is checked by name only."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError("tracking", list(names), "each tracker named once")
        seen.add(name)
        build(name, _params(params, name))
    for name in params:
        if name not in seen:
            TRACKERS.get(name, "tracking_params")


def _params(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    table = params.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"tracking_params.{name}", table, "a table of the tracker's parameters")
    return table


@dataclass
class Tracking:
    """The trackers of one run and what they are told: the run's ``params`` (flattened) and, optionally, its
    ``name`` (default: the run directory's name); ``timeout``: how long one call is waited for."""

    trackers: dict[str, TrackerLike]
    params: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    timeout: float | None = None
    """How long one call of a tracker is waited for before it is dropped (None:
    :data:`~phalanx.experiments.tracking.calls.CALL_TIMEOUT_S`)."""

    def __post_init__(self) -> None:
        timeout = self.timeout
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise ConfigError("tracking.timeout", timeout, "a finite number of seconds > 0, or None")

    @classmethod
    def of_names(cls, names: Sequence[str | TrackerLike], params: Mapping[str, Any] | None = None,
                 name: str | None = None) -> Tracking:
        """Trackers by name (with their defaults) or as objects, for a run built from objects."""
        trackers: dict[str, TrackerLike] = {}
        for item in names:
            tracker = build(item) if isinstance(item, str) else item
            key = item if isinstance(item, str) else getattr(item, "name", type(item).__name__)
            if key in trackers:  # (a second one of a name would replace the first, which would hear nothing)
                raise ConfigError("tracking", key, "each tracker named once (give a tracker object its own `name`)")
            trackers[key] = tracker
        return cls(trackers, flatten(params or {}), name)


def of(cfg: RunConfig, name: str | None = None) -> Tracking | None:
    """The config's trackers, built (None when it names none), told the whole validated config
    (:meth:`RunConfig.described`: the result-neutral keys included)."""
    return of_keys(cfg.tracking, cfg.tracking_params, cfg.described(), name)


def of_keys(names: list[str], params: dict[str, Any], config: dict[str, Any],
            name: str | None = None) -> Tracking | None:
    """The trackers a config's ``tracking`` (``names``) and ``tracking_params`` (``params``) name, built, for the
    run whose validated config is ``config`` (:meth:`RunConfig.described`; None when it names none)."""
    if not names:
        return None
    trackers = {n: build(n, _params(params, n)) for n in names}
    return Tracking(trackers, flatten(config), name)


def track_overrides(data: Mapping[str, Any], tracks: Sequence[str]) -> list[str]:
    """``--track NAME`` / ``--track NAME=URI`` (repeatable) as ``--set`` overrides of the config ``data``: the names
    added to its ``tracking``, each URI as ``tracking_params.NAME.uri`` (a tracker named by its ``module:attr`` spec:
    ``tracking_params."SPEC".uri``, the spec one key). NAME ends at the first ``=``: a URI may hold more."""
    current = data.get("tracking", [])
    names = [current] if isinstance(current, str) else list(current) if isinstance(current, list) else []
    out: list[str] = []
    for item in tracks:
        name, sep, uri = item.partition("=")
        name = name.strip()
        if not name:
            raise ConfigError("--track", item, "NAME or NAME=URI (tensorboard, mlflow, wandb)")
        if name not in names:
            names.append(name)
        if sep:  # a spec's dots and colon are one key part of --set's path: written quoted, as TOML does
            key = name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)
            out.append(f"tracking_params.{key}.uri={json.dumps(uri)}")
    return [f"tracking={json.dumps(names)}", *out]

