"""The stages by name: every module of this package (found by itself — a new stage is one file here, with no list
to extend), a stage registered in this process (:func:`register`), a ``module:attr`` spec, or an installed package's
``phalanx.stages`` entry point (:class:`phalanx.plugins.Registry`) — and :func:`build`, a stage from its config
section, checked against the run. ``phalanx list stages`` reads a stage file of this package from its source without
importing it (:mod:`phalanx.catalogue.stage_files`: its literal ``name``, ``parameters``, ``reference``); only the
stages a legacy flat key turns on keep their cells in :mod:`phalanx.catalogue.rounds`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from phalanx.errors import ConfigError
from phalanx.plugins import Registry
from phalanx.training.stages.base import Plan, Stage

__all__ = ["build", "configurable", "from_config", "get", "names", "register"]

S = TypeVar("S", bound=type[Stage])


def _accept(obj: Any, name: str) -> Any:
    if not (isinstance(obj, type) and issubclass(obj, Stage)):
        raise ConfigError("stage", name, "a subclass of phalanx.training.stages.base.Stage (ServerStage or "
                          "WorkerStage)")
    return obj


_REGISTRY: Registry[Any] = Registry("stage", "phalanx.stages", _accept)
_found = False


def _discover() -> None:
    """Import every module of this package once and register the stages each defines (a class with its own
    ``name``)."""
    global _found
    if _found:
        return
    _found = True
    package = importlib.import_module(__package__ or "phalanx.training.stages")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name in ("base", "registry"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, Stage) and obj.__module__ == module.__name__
                    and "name" in vars(obj) and obj.name not in _REGISTRY.registered()):
                _REGISTRY.register(obj)


def register(cls: S) -> S:
    """Class decorator: make a stage of one's own known to configs under ``cls.name``."""
    _discover()
    _REGISTRY.register(cls)
    return cls


def names() -> list[str]:
    """Every stage name known (registered, discovered or an entry point), the ones round algorithms bring included."""
    _discover()
    return _REGISTRY.names()


def configurable() -> list[str]:
    """The stage names a config's ``[stages.<name>]`` turns on: every known one but those a round algorithm brings
    (:attr:`~phalanx.training.stages.base.Stage.brought_by`); a ``module:attr`` spec too."""
    return [n for n in names() if not _REGISTRY.get(n).brought_by]


def from_config(name: str, parameter: str) -> type[Stage]:
    """The class of the stage a config's ``[stages.<name>]`` names: a one-line :class:`ConfigError` naming
    ``parameter`` lists the stages a config turns on when ``name`` is unknown or one a round algorithm brings."""
    allowed = "one of " + ", ".join(configurable()) + " or a 'module:attr' spec"
    try:
        cls = get(name, parameter)
    except ConfigError as exc:
        raise ConfigError(parameter, name, allowed, exc.hint) from None
    if cls.brought_by:
        raise ConfigError(parameter, name, f"{allowed} ({name} is not set in a config: {cls.brought_by} brings it)")
    return cls


def get(name: str, parameter: str = "stages") -> type[Stage]:
    """The class of stage ``name`` (a one-line :class:`~phalanx.errors.ConfigError` naming ``parameter`` when
    unknown)."""
    _discover()
    cls: type[Stage] = _REGISTRY.get(name, parameter)
    return cls


def build(cls: type[Stage], section: Mapping[str, Any], plan: Plan, key: str,
          name_of: Callable[[str], str]) -> Stage:
    """The stage ``cls`` as a config describes it: :meth:`~Stage.configure` from ``section`` and the run ``plan``,
    then :meth:`~Stage.check`. ``key`` is how the config turned it on (its errors name it); ``name_of(p)`` names the
    config key of the section's parameter ``p`` in errors."""
    try:
        stage = cls.configure(dict(section), plan)
    except ConfigError as exc:
        raise ConfigError(name_of(exc.parameter), exc.value, exc.allowed, exc.hint) from None
    object.__setattr__(stage, "key", key)  # frozen dataclasses too: how the run named it, for its errors
    stage.check(plan)
    return stage
