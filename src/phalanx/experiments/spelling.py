"""The key the user wrote (issue 39, item 2): a config written as a tree is read into the flat keys
(:func:`phalanx.experiments.tree.to_flat`) and each value is checked once, by the declaration of its key (the
schema's type and range, the component's own check: the rule's ``f``, the model builder's parameters, the server
optimizer's); an error of that check names the key as the user wrote it — ``[rule].f``, ``[model].hidden``,
``[server.optimizer].beta1``, ``[stages.dp].noise`` — and a flat config's errors are exactly as before.

:class:`Written` is the map from each flat key a tree set to its tree spelling, made by the adapter
(:func:`phalanx.experiments.tree.read`). It travels with the flat table from the file to validation under the key
:data:`WRITTEN`, whose value a TOML file cannot hold (a :class:`Written`, not a string, number or table): a file that
writes the key ``"[written]"`` itself is refused as an unknown key, so no file can change how another key's error
reads. :func:`respelled` renames the parameter of a :class:`~phalanx.errors.ConfigError` (only its name: the value,
the allowed range and the hint are the check's own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from phalanx.errors import ConfigError

__all__ = ["WRITTEN", "Written", "attach", "detach", "respelled"]

WRITTEN = "[written]"
"""The key of a flat table under which its tree spelling travels (a :class:`Written`; popped by validation)."""


@dataclass(frozen=True)
class Written:
    """Flat key (``f``, ``model_params.hidden``, ``model_params``: the table a section's other keys fill) → the
    key the user wrote (``[rule].f``, ``[model].hidden``, ``[model]``)."""

    names: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, names: Mapping[str, str]) -> Written:
        return cls(tuple(sorted(names.items())))

    def spelling(self, parameter: str) -> str | None:
        """The spelling of ``parameter`` (a flat key or a path in a flat table: ``model_params.hidden.0``): its own,
        or its longest written prefix's followed by the rest; None where the user wrote it flat (or not at all)."""
        names = dict(self.names)
        if parameter in names:
            return names[parameter]
        prefixes = [k for k in names if parameter.startswith(k + ".")]
        if not prefixes:
            return None
        longest = max(prefixes, key=len)
        return names[longest] + parameter[len(longest):]

    def parameter_of(self, key: str) -> str | None:
        """The spelling of ``key``, a component's own parameter that its check names bare (the attack's ``z``):
        the one written table key ``*_params.<key>`` there is (None: none, or several)."""
        hits = [v for k, v in self.names if k.endswith(f"_params.{key}") and k.count(".") == 1]
        return hits[0] if len(hits) == 1 else None

    def without(self, flat: Iterable[str]) -> Written:
        """This map less the flat keys ``flat`` and everything under them (``--set model_params.x=…`` on a tree
        file: the user then wrote that key flat)."""
        gone = tuple(flat)
        return Written(tuple((k, v) for k, v in self.names if not any(k == g or k.startswith(g + ".") or
                                                                     g.startswith(k + ".") for g in gone)))


def attach(flat: dict[str, Any], written: Written) -> dict[str, Any]:
    """``flat`` carrying ``written`` (unchanged when ``written`` is empty: a flat file's table is as it was)."""
    return {**flat, WRITTEN: written} if written.names else flat


def detach(table: dict[str, Any]) -> tuple[dict[str, Any], Written]:
    """``table`` without the spelling it carries, and that spelling (empty when none, or when the key holds
    anything but a :class:`Written`: then the key stays, and validation refuses it as an unknown key)."""
    written = table.get(WRITTEN)
    if not isinstance(written, Written):
        return table, Written()
    return {k: v for k, v in table.items() if k != WRITTEN}, written


def respelled(exc: ConfigError, written: Written, flat_keys: Iterable[str] = ()) -> ConfigError:
    """``exc`` naming the key as the user wrote it: a flat key or path the tree set (:meth:`Written.spelling`); a
    component's check that names the unknown parameters (``mlp parameter=['hiden']``) or a bare parameter (the
    attack's ``z``) is renamed to the one written key it is. ``flat_keys``: the schema's keys (a bare name that
    is one of them is that key, never a component's parameter). Any other error, or a subclass of ConfigError (a
    module's own typed error), is returned as it is."""
    if type(exc) is not ConfigError or not written.names:
        return exc
    name = written.spelling(exc.parameter)
    if name is None and exc.parameter.endswith(" parameter") and isinstance(exc.value, list) and exc.value:
        name = written.parameter_of(str(exc.value[0]))
    if name is None and "." not in exc.parameter and exc.parameter not in set(flat_keys):
        name = written.parameter_of(exc.parameter)
    if name is None:
        return exc
    name = name if name.isprintable() else repr(name)  # a key holding a line break: the message stays one line
    return ConfigError(name, exc.value, exc.allowed, exc.hint)
