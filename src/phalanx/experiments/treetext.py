"""The config tree as text: its TOML (:func:`dumps`, what ``phalanx config show`` prints) and the declared keys of
every section as rows (:func:`declared`, what ``phalanx list sections`` prints), read from the declarations the
adapter (:mod:`phalanx.experiments.tree`) reads: :data:`~phalanx.experiments.tree.TABLE`, each built-in
algorithm's constructor, :func:`~phalanx.experiments.tree.lr_homes`, the built-in stages' flat keys — each key's
type, range, default and description from the declaration of the component that reads it
(:func:`phalanx.experiments.concerns.checked`)."""

from __future__ import annotations

import json
from typing import Any

from phalanx.errors import ConfigError
from phalanx.experiments import concerns, legacy, sections, specs, tree
from phalanx.training.algorithms import builtin

__all__ = ["declared", "dumps"]


Row = tuple[str, str, str, str, str, str, str, str]
"""``(section, key, flat key, for which component, type, allowed range, default, description)``."""


def declared() -> list[Row]:
    """Every section's declared keys as :data:`Row` s — read from the declarations (each section's
    :class:`~phalanx.experiments.declare.Section`: :data:`~phalanx.experiments.tree.TABLE` is made from them, with
    each key's type, range, default and description; each built-in algorithm's constructor,
    :func:`~phalanx.experiments.tree.lr_homes`, the built-in stages' flat keys): what ``phalanx list sections``
    prints."""
    rows: list[Row] = []
    of = {s.name: s for s in specs.declared()}
    keys = {k.flat: k for s in concerns.checked() for k in s.keys}

    def described(flat: str, otherwise: tuple[str, str, str, str] = ("", "", "", "")) -> tuple[str, str, str, str]:
        """A flat key's type, range, default and description, from the declaration of the component that reads it
        (:func:`~phalanx.experiments.concerns.checked`)."""
        return keys[flat].row() if flat in keys else otherwise

    for section in tree.SECTIONS:
        if section == "stages":
            rows += [("stages.dp", p, flat, "client-level DP", *described(flat)) for p, flat in legacy.DP.items()]
            rows += [("stages.crfl", "<p>", "server_projection_params.<p> (server_projection = 'crfl')", "CRFL",
                      "", "", "", ""),
                     ("stages.<name>", "<p>", "stages.<name>.<p>", "every other stage (phalanx list stages)",
                      "", "", "", "")]
            continue
        rows += [(section, k.key, k.flat, "all", *k.row()) for k in of[section].keys]
        if section == "algorithm":
            seen: dict[tuple[str, str], list[str]] = {}
            shown: dict[str, tuple[str, str]] = {}
            for name in builtin.BUILT_IN:
                for p in sections.algorithm_section(name):
                    shown.setdefault(p.name, (p.type, p.default))
                for key, flat in tree.algorithm_keys(name).items():
                    if key not in tree.TABLE[section]:
                        seen.setdefault((key, flat), []).append(name)
                home = tree.lr_homes(name)[0]
                if home is not None:
                    seen.setdefault(("lr", home), []).append(name)
            rows += [(section, key, flat, ", ".join(names),
                      *described(flat, (shown.get(key, ("", ""))[0], "its constructor's check",
                                        shown.get(key, ("", ""))[1], "")))
                     for (key, flat), names in seen.items()]
            rows.append((section, "<p>", "algorithm_params.<p>", "an algorithm of one's own (its constructor)",
                         "", "", "", ""))
        elif section == "server.optimizer":
            homes: dict[str, list[str]] = {}
            for name in builtin.BUILT_IN:
                home = tree.lr_homes(name)[1]
                if home is not None:
                    homes.setdefault(home, []).append(name)
            rows += [(section, "lr", flat, ", ".join(names), *described(flat)) for flat, names in homes.items()]
            rows += [(section, p, flat, "sgd", *described(flat)) for p, flat in legacy.SGD.items()]
            rows.append((section, "<p>", "server_optimizer_params.<p>", "the optimizer's own", "", "", "", ""))
        elif section == "attack":
            rows.append((section, "<p>", "attack_params.<p>", "its constructor's (phalanx list attacks)",
                         "", "", "", ""))
        elif section == "model":
            rows.append((section, "<p>", "model_params.<p>", "the builder's", "", "", "", ""))
    return rows


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError("config", value, "TOML values (a string, number, boolean, list or table)")


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) else json.dumps(key)


def dumps(table: dict[str, Any]) -> str:
    """A tree (:func:`~phalanx.experiments.tree.to_tree`) as TOML text: its top-level keys first, then one
    ``[section]`` table each (``[server.optimizer]``, ``[stages.<name>]``; a tie's ``[tie]`` with its flat keys and
    ``[tie.<section>]``)."""
    def tables(key: str, value: Any) -> list[tuple[str, Any]]:
        if key == "server":
            return [("server.optimizer", value.get("optimizer", {}))]
        if key == legacy.TREE:
            return [(f"stages.{_toml_key(s)}", p) for s, p in value.items()]
        if key == "tie":
            inner = [(k, v) for k, v in value.items() if k != legacy.TREE and tree._section_of(k, v)]
            rest = {k: v for k, v in value.items() if (k, v) not in inner}
            return [*([("tie", rest)] if rest else []),
                    *((f"tie.{name}", body) for k, v in inner for name, body in tables(k, v))]
        return [(key, value)]

    def heads(k: str, v: Any) -> bool:
        return tree._section_of(k, v) or (k == "tie" and isinstance(v, dict))

    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items() if not heads(k, v)]
    for key, value in table.items():
        if heads(key, value):
            for name, body in tables(key, value):
                lines += ["", f"[{name}]", *(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in body.items())]
    return "\n".join(lines) + "\n"
