"""How a config section is declared (issue 39, item 2: "each section declared by the component that reads it —
its parameters, types, ranges, defaults — generated help and errors from that declaration").

A :class:`Section` is a name (``run``, ``server.optimizer``) and its :class:`Key` s: each the key written in the
section, the flat key of earlier releases it is (what the run id is computed from: ``[rule].spec`` is
``aggregator``; a path ``dataset_params.x`` is a key of a component's table), its type, its default, its allowed
range and a one-line description. The sections without a constructor to read them from are declared on the value
that reads them (:mod:`phalanx.experiments.specs`: ``RunShape.section`` is ``[run]``, ``DataSpec.section``
``[data]`` …), and everything else is derived from that one declaration:

- the flat schema's field (:meth:`Key.field`: its default and description; its type is the field's annotation,
  which :func:`bind` checks against the declaration when the schema is made);
- the range check, made once per run by :func:`check` — the only place a declared range is checked, in the words
  pydantic used when the range lived on the schema (``greater than or equal to 1``), so every message reads as
  before;
- the adapter's table (section key → flat key, :data:`phalanx.experiments.tree.TABLE`), its errors (a key the
  section does not declare) and ``phalanx list sections`` (:meth:`Key.row`).

A range is a closed or open bound on each side (``ge``/``gt``, ``le``/``lt``): the interval of a number,
``x ≥ 1`` is ``ge=1``.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx.errors import ConfigError

__all__ = ["Key", "Section", "Tables", "bind", "check"]

_MISSING = object()

_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
"""What a value of a table key (``dataset_params.x``, which the schema does not type) must be, as the schema's
own type errors say it."""


@dataclass(frozen=True)
class Key:
    """One key of a section: ``key`` (as written in the section), ``flat`` (the flat key, or a path into a
    component's table), ``type`` (the Python type, as the schema's field annotates it), ``default``, the range
    (``ge``, ``gt``, ``le``, ``lt``: None where unbounded) and ``doc`` (one line)."""

    key: str
    flat: str
    type: Any
    default: Any
    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

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
    """A section's declaration: its ``name`` (``run``, ``server.optimizer``), its :class:`Key` s in order, and
    ``doc``, what reads it."""

    name: str
    keys: tuple[Key, ...]
    doc: str = ""
    by_key: dict[str, Key] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_key", {k.key: k for k in self.keys})

    def table(self) -> dict[str, str]:
        """Section key → flat key (the adapter's table)."""
        return {k.key: k.flat for k in self.keys}

    def field(self, key: str) -> Any:
        """The flat schema's field of the key ``key`` (:meth:`Key.field`)."""
        return self.by_key[key].field()

    def with_key(self, key: Key) -> Section:
        """This section with one more key (a plug-in's or a test's: the same declaration, one key longer)."""
        return Section(self.name, (*self.keys, key), self.doc)


class Tables(Mapping[str, dict[str, str]]):
    """Section name → its table (section key → flat key), read from ``declared()`` (the sections) at every
    look-up: a declaration replaced (a plug-in's, a test's) is the one read, and there is no second list."""

    def __init__(self, declared: Callable[[], Iterable[Section]]) -> None:
        self._declared = declared

    def _sections(self) -> dict[str, Section]:
        return {s.name: s for s in self._declared()}

    def __getitem__(self, section: str) -> dict[str, str]:
        return self._sections()[section].table()

    def __iter__(self) -> Iterator[str]:
        return iter(self._sections())

    def __len__(self) -> int:
        return len(self._sections())


def bind(fields: Mapping[str, Any], sections: Iterable[Section]) -> None:
    """Check that the flat schema's fields (``RunConfig.model_fields``) are the declared keys: each declared flat
    key that is no path has a field annotated with the declared type. The schema's annotation is what a type
    checker reads; this makes it the declaration's, not a second one (a :class:`TypeError` when the module is
    imported: a programming error, never a user's)."""
    for section in sections:
        for key in section.keys:
            if "." in key.flat:
                continue
            found = fields.get(key.flat)
            if found is None or found.annotation != key.type:
                raise TypeError(f"[{section.name}].{key.key}: the schema's field {key.flat!r} is "
                                f"{getattr(found, 'annotation', 'missing')}, declared {key.type}")


def check(values: Mapping[str, Any], sections: Iterable[Section], order: Iterable[str] = (),
          before: str | None = None) -> None:
    """Every declared key's range, once (the one check of each: the module's docstring) on the flat values
    ``values`` (key → value, typed by the schema: a value as the user gave it, so that the error shows it as given).
    The first key out of range is a one-line :class:`ConfigError` naming its flat key, in the schema's field
    ``order`` (the order pydantic reported its range errors in, when it checked them); ``before``: only the keys
    before that field (the schema refused it: a key before it is reported first, as it was)."""
    fields = list(order) or list(values)
    end = _position(before, fields) if before is not None else len(fields) + 1
    declared = {k.flat: k for s in sections for k in s.keys}
    for flat, key in sorted(declared.items(), key=lambda item: _position(item[0], fields)):
        if _position(flat, fields) >= end:
            break
        outer, _, inner = flat.partition(".")
        value = values.get(outer, _MISSING)
        if inner:
            value = value.get(inner, _MISSING) if isinstance(value, dict) else _MISSING
        if value is _MISSING:
            continue
        allowed = key.refusal(value)
        if allowed is not None:
            raise ConfigError(flat, value, allowed)


def _position(flat: str, fields: list[str]) -> int:
    outer = flat.partition(".")[0]
    return fields.index(outer) if outer in fields else len(fields)
