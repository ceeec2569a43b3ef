"""What a tracker is: the four calls a run makes of it, what it is told about the run, and the checks every tracker
shares (its package installed, a local location that can be written).

A tracker receives one run: :meth:`Tracker.start` once (its parameters, where the run lives, what a previous session
of the same run kept), :meth:`Tracker.log` for every metric row (step = the row's round), :meth:`Tracker.finish` at
the end (how the run ended). No base class is required of a user's tracker: a class with those three methods, whose
constructor takes its ``tracking_params`` table as keywords (docs/tracking.md, "A tracker of one's own").
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Protocol, runtime_checkable

from phalanx.errors import ConfigError

ENDS = ("finished", "diverged", "failed", "interrupted")
"""How a run can end, as :meth:`Tracker.finish` is told: every round done, the model non-finite, an error, a signal
(Ctrl-C, a grid stopping, a Slurm job's time)."""


@dataclass(frozen=True)
class TrackedRun:
    """What a tracker is told about its run when it starts.

    ``name``: the run's name (its run id, the name of its run directory); ``params``: its configuration, flattened
    (``model_params.width``); ``run_dir``: its run directory (None: a run without one); ``home``: the directory a
    grid's runs share (the run directory's parent; None without a run directory); ``kept``: what this tracker's
    :meth:`Tracker.start` returned in an earlier session of the same run ({} for a fresh run, or the first session
    that tracks it); ``resumed``: whether the run resumes from a checkpoint."""

    name: str
    params: dict[str, Any]
    run_dir: Path | None = None
    home: Path | None = None
    kept: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False

    @property
    def group(self) -> str:
        """The name a grid's runs share (the output directory's name; ``"phalanx"`` without one)."""
        return self.home.resolve().name if self.home is not None else "phalanx"


@runtime_checkable
class TrackerLike(Protocol):
    """What the run calls of a tracker (a :class:`Tracker` subclass, or any class with these methods)."""

    def start(self, run: TrackedRun) -> Mapping[str, Any] | None: ...

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def finish(self, end: str) -> None: ...


class Tracker:
    """A tracker the run sends its parameters and metric rows to (subclass it, or provide the same methods).

    Class attributes: ``name`` (the name a config gives it), ``package`` (the module that must be importable),
    ``extra`` (Phalanx's optional extra that installs it: a missing package is a one-line error naming it) and
    ``summary`` (what it records, for ``phalanx list trackers``). The
    constructor takes the tracker's ``tracking_params`` table as keywords; ``uri`` is where it writes (its meaning is
    the tracker's)."""

    name: ClassVar[str] = ""
    package: ClassVar[str | None] = None
    extra: ClassVar[str | None] = None
    summary: ClassVar[str] = ""
    """What it records, in a few words (``phalanx list trackers``; default: the docstring's first line)."""

    def __init__(self, uri: str | None = None) -> None:
        self.uri = text_param(self.name, "uri", uri)

    def check(self) -> None:
        """Before any run trains: the package is installed, and a local ``uri`` can be written."""
        self.library()
        if self.uri is not None:
            writable(self.name, Path(self.uri))

    def library(self) -> ModuleType | None:
        """The tracker's package, imported (None when it needs none); a one-line :class:`ConfigError` naming the
        extra when it is not installed."""
        if self.package is None:
            return None
        return require(self.name, self.package, self.extra)

    def start(self, run: TrackedRun) -> Mapping[str, Any] | None:
        """Open (or, with ``run.kept``, continue) the tracked run; return what a later session needs to continue it
        (ids: kept in the run directory's ``tracking.json``). An error here refuses the run before it trains."""
        raise NotImplementedError

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """One metric row: its numbers by name, at ``step`` (the row's round)."""
        raise NotImplementedError

    def finish(self, end: str) -> None:
        """The run ended (one of :data:`ENDS`): close the tracked run, flushing what is buffered."""
        raise NotImplementedError


def require(name: str, package: str, extra: str | None) -> ModuleType:
    """Import ``package`` for the tracker ``name``; a one-line :class:`ConfigError` naming the extra if it is not
    installed (or fails to import)."""
    install = f"pip install 'phalanx[{extra}]'" if extra else f"pip install {package}"
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError("tracking", name, f"a tracker whose package is installed ({package} is not: {install})")
    try:
        return importlib.import_module(package)
    except Exception as exc:  # installed but broken (a version that does not import here)
        raise ConfigError("tracking", name, f"a tracker whose package imports ({package}: {exc!r}; {install})") \
            from None


def text_param(tracker: str, key: str, value: Any, choices: tuple[str, ...] = ()) -> str | None:
    """A string parameter of a tracker (None when unset), checked: a ConfigError naming ``tracking_params.<tracker>.
    <key>`` otherwise."""
    if value is None:
        return None
    where = f"tracking_params.{tracker}.{key}"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, value, "a non-empty string" + (f": one of {', '.join(choices)}" if choices else ""))
    if choices and value not in choices:
        raise ConfigError(where, value, "one of " + ", ".join(choices))
    return value


def writable(tracker: str, path: Path) -> None:
    """Refuse a local location that cannot be written, before anything runs: an existing file where a directory is
    wanted, or no permission to create it (the nearest existing folder above it is not a writable directory).
    Nothing is created."""
    where = f"tracking_params.{tracker}.uri"
    path = path.expanduser()
    try:
        if path.exists() and not path.is_dir():
            raise ConfigError(where, str(path), "a directory that can be written (it is a file)")
        nearest = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    except OSError as exc:
        raise ConfigError(where, str(path), "a directory that can be written", exc.strerror or type(exc).__name__) \
            from None
    if nearest is None or not nearest.is_dir():
        raise ConfigError(where, str(path), "a directory that can be written", f"{nearest} is not a directory")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise ConfigError(where, str(path), "a directory that can be written", f"no permission to write in {nearest}")


def flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested configuration as one level: ``{"model_params": {"width": 64}}`` → ``{"model_params.width": 64}``
    (lists kept as they are)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def numbers(row: Mapping[str, Any], skip: frozenset[str] = frozenset()) -> dict[str, float]:
    """The numbers of a metric row by name: every number but the round (booleans as 0 or 1; a non-finite value as it
    is); a list of numbers (one per worker) as ``name/0``, ``name/1``, …; text, None and ``skip`` (the config's
    columns, which are parameters) left out."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key == "round" or key in skip:
            continue
        if isinstance(value, bool | int | float):
            out[key] = float(value)
        elif isinstance(value, list | tuple) and value and all(
            isinstance(v, bool | int | float) and not isinstance(v, bool) for v in value
        ):
            out.update({f"{key}/{i}": float(v) for i, v in enumerate(value)})
    return out


def finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """The finite ones (for a tracker that refuses NaN and ±inf)."""
    return {k: v for k, v in metrics.items() if math.isfinite(v)}
