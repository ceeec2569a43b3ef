"""The one vocabulary for checking a component's parameters at construction: each check returns the value or raises
:class:`~phalanx.errors.ConfigError` naming the parameter, the value and the allowed range (``"tau=-1 is invalid:
allowed a finite number > 0"``). Used by rules, attacks, data splits, models' registries and the training objects.

A config key's declaration, :class:`Key` (its flat key, type, default, range and description) and a
:class:`Section` of them, is here too, below every layer, so that the component that reads a key declares it
wherever it lives — a round algorithm (federated averaging's ``clients_per_round``), a stage (client-level
differential privacy's ``dp_noise``), the SGD server optimizer (``server_momentum``) or a value of
:mod:`phalanx.experiments.concerns` (``[run]``'s ``workers``). How the declarations make the schema and check each
range once: :mod:`phalanx.experiments.declare`."""

from __future__ import annotations

import difflib
import math
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from phalanx.errors import ConfigError

__all__ = ["Key", "Section", "check_choice", "check_int", "check_real", "close_matches", "read_bounded_text", "suggest"]


def _describe_range(kind: str, low: float | None, low_open: bool, high: float | None, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return f"a finite {kind}" + (" " + " and ".join(parts) if parts else "")


def check_real(
    name: str, value: Any, *, low: float | None = None, low_open: bool = False, high: float | None = None,
    high_open: bool = False,
) -> float:
    """A finite real number inside an (optionally half-open) interval, returned as a float (booleans refused)."""
    allowed = _describe_range("number", low, low_open, high, high_open)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(name, value, allowed)
    try:
        v = float(value)
    except OverflowError:  # an integer beyond the float range
        raise ConfigError(name, value, allowed) from None
    if not math.isfinite(v):
        raise ConfigError(name, value, allowed)
    if low is not None and (v < low or (low_open and v == low)):
        raise ConfigError(name, value, allowed)
    if high is not None and (v > high or (high_open and v == high)):
        raise ConfigError(name, value, allowed)
    return v


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None, hint: str = "") -> int:
    """An integer in ``[low, high]`` (either bound optional; booleans refused), returned as an int."""
    if low is not None and high is not None:
        allowed = f"an integer in {low}..{high}"
    else:
        allowed = "an integer" + (f" >= {low}" if low is not None else "") + (f" <= {high}" if high is not None else "")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(name, value, allowed)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(name, value, allowed, hint or None)
    return int(value)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """One of a fixed set of strings (a close spelling is suggested)."""
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        raise ConfigError(name, value, "one of " + ", ".join(repr(c) for c in options), suggest(value, options))
    return value


def close_matches(value: Any, choices: Iterable[str], n: int = 3) -> list[str]:
    """The choices closest to ``value`` in spelling (at most ``n``)."""
    return difflib.get_close_matches(str(value), list(choices), n=n)


def suggest(value: Any, choices: Iterable[str], n: int = 3) -> str | None:
    """``"did you mean …?"`` for the choices closest to ``value``, or None."""
    close = close_matches(value, choices, n)
    return f"did you mean {', '.join(dict.fromkeys(close))}?" if close else None


# --- a config key's declaration (issue 39, item 2) ------------------------------------------------------------

_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
"""What a value of a table key (``dataset_params.x``, which the schema does not type) must be, as the schema's
own type errors say it."""


@dataclass(frozen=True)
class Key:
    """One key of a section: ``key`` (as written in the section), ``flat`` (the flat key, or a path into a
    component's table), ``type`` (the Python type, as the schema's field annotates it), ``default``, the range
    (``ge``, ``gt``, ``le``, ``lt``: None where unbounded), ``doc`` (one line), ``max_len``: the most characters
    of a string, items of a list or keys of a table (None: unbounded), and ``neutral``: its value changes how a run
    gets its inputs or is recorded, never its results, so it never enters the run's identity (its run id)."""

    key: str
    flat: str
    type: Any
    default: Any
    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    max_len: int | None = None
    neutral: bool = False

    def field(self) -> Any:
        """The flat schema's field of this key (pydantic ``Field``): its default (a table or list default is a
        fresh one per config) and its description. The range is not the field's: :func:`check` checks it."""
        from pydantic import Field

        if isinstance(self.default, (dict, list)):
            return Field(default_factory=type(self.default), description=self.doc)
        return Field(self.default, description=self.doc)

    def refusal(self, value: Any) -> str | None:
        """What is allowed, when ``value`` is out of this key's range (None: in range) — pydantic's words."""
        if self.flat.count(".") and not _typed(value, self.type):
            return _TYPE_WORDS.get(self.type, getattr(self.type, "__name__", str(self.type)))
        if self.max_len is not None and isinstance(value, (str, list, dict)) and len(value) > self.max_len:
            return f"at most {self.max_len} {'characters' if isinstance(value, str) else 'items'}"
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        for bound, ok, words in (
            (self.gt, lambda b: value > b, "greater than"), (self.ge, lambda b: value >= b, "greater than or equal to"),
            (self.lt, lambda b: value < b, "less than"), (self.le, lambda b: value <= b, "less than or equal to"),
        ):
            if bound is not None and not ok(bound):
                return f"{words} {bound}"
        return None

    def allowed(self) -> str:
        """The range as help text (``≥ 1, ≤ 10000000``; ``any``: unbounded)."""
        parts = [f"{sign} {b}" for sign, b in ((">", self.gt), ("≥", self.ge), ("<", self.lt), ("≤", self.le))
                 if b is not None]
        if self.max_len is not None:
            parts.append(f"length ≤ {self.max_len}")
        return ", ".join(parts) or "any"

    def type_text(self) -> str:
        """The type as help text: ``int``, ``str | None``, ``'iid' | 'dirichlet'``."""
        return _type_text(self.type)

    def row(self) -> tuple[str, str, str, str]:
        """``(type, allowed, default, doc)``: what ``phalanx list sections`` prints beside the key."""
        return self.type_text(), self.allowed(), repr(self.default), self.doc


def _typed(value: Any, kind: Any) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return not isinstance(kind, type) or isinstance(value, kind)


def _type_text(kind: Any) -> str:
    args = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if args and typing.get_origin(kind) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(_type_text(a) for a in args)
    if kind is type(None):
        return "None"
    if args:
        return str(kind).replace("typing.", "")
    return getattr(kind, "__name__", str(kind))


@dataclass(frozen=True)
class Section:
    """A section's declaration: its ``name`` (``run``, ``server.optimizer``), its :class:`Key` s in order,
    ``doc``, what reads it, and ``result_neutral``: its keys change how a run is recorded, never its results, so
    none of them enters the run's identity (its run id; :data:`phalanx.experiments.schema.RESULT_NEUTRAL_KEYS`)."""

    name: str
    keys: tuple[Key, ...]
    doc: str = ""
    result_neutral: bool = False
    by_key: dict[str, Key] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_key", {k.key: k for k in self.keys})

    def table(self) -> dict[str, str]:
        """Section key → flat key (the adapter's table)."""
        return {k.key: k.flat for k in self.keys}

    def field(self, key: str) -> Any:
        """The flat schema's field of the key ``key`` (:meth:`Key.field`)."""
        return self.by_key[key].field()

    def flat_keys(self) -> tuple[str, ...]:
        """The flat keys of its keys, in order (a round algorithm's ``config_keys``)."""
        return tuple(k.flat for k in self.keys)

    def renamed(self) -> dict[str, str]:
        """Section key → flat key, of the keys whose flat key is another name (gossip's ``weights`` is
        ``gossip_weights``)."""
        return {k.key: k.flat for k in self.keys if k.key != k.flat}

    def with_key(self, key: Key) -> Section:
        """This section with one more key (a plug-in's or a test's: the same declaration, one key longer)."""
        return Section(self.name, (*self.keys, key), self.doc, self.result_neutral)


def read_bounded_text(path: Path, max_bytes: int, existing: str, key: str = "results") -> str:
    """The UTF-8 text of the input file ``path``, refused in one line naming ``key`` and the file — missing (the
    allowed value ``existing`` says what was expected), larger than ``max_bytes`` (checked before a byte is read) or
    not UTF-8."""
    if not path.is_file():
        raise ConfigError(key, str(path), existing)
    if path.stat().st_size > max_bytes:
        raise ConfigError(key, str(path), f"a file of at most {max_bytes} bytes")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(key, str(path), f"a UTF-8 text file ({type(exc).__name__})") from None
