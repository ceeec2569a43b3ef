"""How a config section is declared (issue 39, item 2: "each section declared by the component that reads it —
its parameters, types, ranges, defaults — generated help and errors from that declaration").

A :class:`Section` is a name (``run``, ``server.optimizer``) and its :class:`Key` s: each the key written in the
section, the flat key of earlier releases it is (what the run id is computed from: ``[rule].spec`` is
``aggregator``; a path ``dataset_params.x`` is a key of a component's table), its type, its default, its allowed
range and a one-line description. The sections without a constructor to read them from are declared on the value
that reads them (:mod:`phalanx.experiments.specs`: ``RunShape.section`` is ``[run]``, ``DataSpec.section``
``[data]`` …); a key that a component reads is declared on the component's class — a built-in round algorithm's own
keys (``FedAvg.config_section``: ``clients_per_round`` …), the stage the flat keys turn on (``ClientDP.config_section``:
``dp_noise`` …), the SGD server optimizer's (``SGD.config_section``: ``server_momentum`` …) — and the keys every
built-in algorithm's constructor takes on :class:`~phalanx.experiments.concerns.AlgorithmSpec` (``batch_size``,
``lr`` …). :func:`phalanx.experiments.concerns.checked` gathers them all, and everything else is derived from that
one declaration of each key (:class:`Key` and :class:`Section` live in :mod:`phalanx.validate`, below every layer
that declares one; re-exported here):

- the flat schema's field (:meth:`Key.field`: its default and description; its type is the field's annotation,
  which :func:`bind` checks against the declaration when the schema is made);
- the range check, made once per run by :func:`check` — the only place a config key's range is checked (the schema
  has none of its own: ``tests/test_sections_declared.py``), in the words pydantic used when the range lived on the
  schema (``greater than or equal to 1``), so every message reads as before;
- the adapter's table (section key → flat key, :data:`phalanx.experiments.tree.TABLE`), its errors (a key the
  section does not declare) and ``phalanx list sections`` (:meth:`Key.row`).

A range is a closed or open bound on each side (``ge``/``gt``, ``le``/``lt``): the interval of a number,
``x ≥ 1`` is ``ge=1``; ``max_len`` bounds a string's characters or a list's items.

Each section is registered where it is declared (:mod:`phalanx.experiments.section_registry`): a plug-in's section
is one module and its ``phalanx.sections`` entry point, with no list to extend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from phalanx.errors import ConfigError
from phalanx.validate import Key, Section

__all__ = ["Key", "Section", "Tables", "bind", "check"]

_MISSING = object()


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
