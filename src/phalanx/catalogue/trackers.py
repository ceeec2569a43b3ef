"""``phalanx list trackers``' rows without importing the trackers (their package imports the experiment machinery,
and torch with it): the built-in trackers declared here, checked against their classes by
``tests/test_list_trackers.py``; with a plug-in tracker installed the rows come from the registry's classes."""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any

from phalanx.catalogue import Group, extra_names


@dataclass(frozen=True)
class _Tracker:
    """A built-in tracker as ``phalanx list trackers`` shows it."""

    target: str
    """Its class, ``"module:Class"``."""
    package: str
    """The module its client library is (installed or not)."""
    extra: str
    """Phalanx's optional extra that installs it."""
    parameters: tuple[str, ...]
    """Its constructor's keyword parameters, as :func:`parameter` writes them (``uri: str | None = None``)."""
    summary: str
    """What it records (the class's ``summary``)."""


TRACKERS: dict[str, _Tracker] = {
    "mlflow": _Tracker("phalanx.experiments.tracking.mlflow:MLflow", "mlflow", "mlflow",
                       ("uri: str | None = None", "experiment: str | None = None"),
                       "one MLflow run per run: parameters, every metric row, how it ended"),
    "tensorboard": _Tracker("phalanx.experiments.tracking.tensorboard:TensorBoard", "tensorboard", "tensorboard",
                            ("uri: str | None = None",),
                            "event files: a scalar per metric and round, the config as hyper-parameters"),
    "wandb": _Tracker("phalanx.experiments.tracking.wandb:WandB", "wandb", "wandb",
                      ("uri: str | None = None", "project: str | None = None", "entity: str | None = None",
                       "mode: str | None = None", "group: str | None = None"),
                      "one W&B run per run (offline by default: no network)"),
}
"""The built-in trackers (:data:`phalanx.experiments.tracking.TRACKERS`)."""
TRACKER_GROUP = Group("phalanx.trackers", "phalanx.experiments.tracking")


def parameter(name: str, annotation: Any, default: Any) -> str:
    """One constructor parameter as the listing shows it: ``name: type = default`` (the type as written in the
    source; no ``= …`` for a required one)."""
    kind = "" if annotation is inspect.Parameter.empty else \
        f": {annotation if isinstance(annotation, str) else getattr(annotation, '__name__', annotation)}"
    return f"{name}{kind}" + ("" if default is inspect.Parameter.empty else f" = {default!r}")


def section(name: str, parameters: tuple[str, ...]) -> str:
    """A tracker's parameters, one a line, each with the key that sets it (``tracking_params.NAME.P``)."""
    return "\n".join(f"{p} (tracking_params.{name}.{p.split(':')[0].split('=')[0].strip()})"
                     for p in parameters) or "—"


def installed(package: str | None) -> str:
    """Whether ``package`` can be imported here (found, not imported)."""
    if not package:
        return "—"
    try:
        return "yes" if importlib.util.find_spec(package) is not None else "no"
    except (ImportError, ValueError):
        return "no"


def tracker_rows() -> list[list[str]] | None:
    """The rows (name, extra, installed, parameters, what it records); None when a plug-in tracker is installed,
    whose row only its class can give."""
    if extra_names(TRACKERS, TRACKER_GROUP):
        return None
    return [[name, f"phalanx[{t.extra}]", installed(t.package), section(name, t.parameters), t.summary]
            for name, t in sorted(TRACKERS.items())]
