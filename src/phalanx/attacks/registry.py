"""Name → class registry of the attacks, :func:`make` and :func:`names`."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, TypeVar

from phalanx.attacks.base import Attack, DataAttack
from phalanx.errors import ConfigError

__all__ = ["get_class", "make", "names", "register"]

_ATTACKS: dict[str, type[Attack] | type[DataAttack]] = {}

C = TypeVar("C", type[Attack], type[DataAttack])


def register(cls: C) -> C:
    """Class decorator: make an attack known to :func:`make` under ``cls.name``."""
    if not (issubclass(cls, Attack) or issubclass(cls, DataAttack)):  # pragma: no cover - programming error
        raise TypeError(f"{cls!r} is neither an Attack nor a DataAttack")
    if cls.name in _ATTACKS:
        raise RuntimeError(f"attack name {cls.name!r} registered twice")
    _ATTACKS[cls.name] = cls
    return cls


def names(kind: str | None = None) -> list[str]:
    """Names :func:`make` accepts, sorted: ``kind="vector"``, ``kind="data"`` or both (default)."""
    if kind not in (None, "vector", "data"):
        raise ConfigError("kind", kind, "'vector', 'data' or None")
    return sorted(n for n, cls in _ATTACKS.items() if kind is None or cls.kind == kind)


def get_class(name: str) -> type[Attack] | type[DataAttack]:
    """The class registered under ``name``; a :class:`ConfigError` with close-match suggestions otherwise."""
    if isinstance(name, str) and name in _ATTACKS:
        return _ATTACKS[name]
    close = difflib.get_close_matches(name, list(_ATTACKS), n=3) if isinstance(name, str) else []
    hint = f"did you mean {', '.join(close)}?" if close else None
    raise ConfigError("attack", name, "one of " + ", ".join(names()), hint)


def make(name: str, **params: Any) -> Attack | DataAttack:
    """Build the attack registered under ``name`` with its parameters.

    >>> from phalanx import attacks
    >>> attacks.make("alie", z=1.5)
    ALIE(z=1.5)

    Unknown names and unknown parameters raise :class:`ConfigError` (with suggestions / the accepted parameters);
    bad parameter values raise it from the attack's constructor, naming the parameter and its allowed range.
    """
    cls = get_class(name)
    init = cls.__init__
    accepted = [] if init is object.__init__ else [p for p in inspect.signature(init).parameters if p != "self"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(
            f"{cls.name} parameter", unknown, f"parameters of {cls.name}: {', '.join(accepted) or 'none'}",
        )
    return cls(**params)
