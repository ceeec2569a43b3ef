"""The studies ``phalanx experiment NAME`` knows: the built-ins (registered by their modules with :func:`register`),
installed plug-ins' entry points in the ``phalanx.studies`` group, and any ``module:attr`` spec of a
:class:`~phalanx.studies.base.Study` subclass (:mod:`phalanx.plugins`)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

from phalanx.errors import ConfigError
from phalanx.plugins import Registry
from phalanx.studies.base import Study

S = TypeVar("S", bound=type[Study[Any, Any, Any]])

_DECLARED = ("name", "help", "preset_type", "presets", "out")
_PRESET_FIELDS = ("name", "description", "dataset", "fallback_dataset", "seeds")


def _accept(obj: Any, name: str) -> type[Study[Any, Any, Any]]:
    """A concrete :class:`Study` subclass that declares what the command line needs (one clear error otherwise)."""
    if not (isinstance(obj, type) and issubclass(obj, Study)) or inspect.isabstract(obj):
        raise ConfigError("study", name, "a subclass of phalanx.studies.Study with plan, collect and report")
    missing = [a for a in _DECLARED if not hasattr(obj, a)]
    if missing:
        raise ConfigError("study", name, "a Study that declares " + ", ".join(_DECLARED),
                          "missing: " + ", ".join(missing))
    preset_type = obj.preset_type
    fields = {f.name for f in dataclasses.fields(preset_type)} if dataclasses.is_dataclass(preset_type) else set()
    lacking = [f for f in _PRESET_FIELDS if f not in fields]
    if lacking:
        raise ConfigError("study", name, "a Study whose preset_type is a dataclass with the fields "
                          + ", ".join(_PRESET_FIELDS), "missing: " + ", ".join(lacking))
    if obj.default_preset not in obj.presets:
        raise ConfigError("study", name, f"a Study whose presets include its default_preset {obj.default_preset!r}",
                          "presets: " + (", ".join(obj.presets) or "none"))
    return obj


_REGISTRY: Registry[type[Study[Any, Any, Any]]] = Registry("study", "phalanx.studies", _accept)


def register(cls: S) -> S:
    """Class decorator: make a study known to ``phalanx experiment`` under ``cls.name``."""
    _REGISTRY.register(cls)
    return cls


def names() -> list[str]:
    """The studies ``phalanx experiment`` lists: registered ones and installed entry points, sorted (a
    ``module:attr`` spec is accepted too)."""
    return _REGISTRY.names()


def resolve(name: str) -> type[Study[Any, Any, Any]]:
    """The class of a registered name, a ``phalanx.studies`` entry point or a ``module:attr`` spec; an unknown name
    is a :class:`~phalanx.errors.ConfigError` that lists the studies and suggests the closest."""
    return _REGISTRY.get(name, "study")
