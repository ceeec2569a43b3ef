"""``--set`` of a tree key on a flat table (``--set rule.f=3``, ``--set 'rule={spec="cwtm", f=3}'``,
``--set attack.z=1.5``): the one place a command-line override spelled in the config's sections
(:mod:`phalanx.experiments.tree`) becomes the flat keys it stands for, whatever spelling the file used."""

from __future__ import annotations

import sys
from typing import Any

from phalanx.errors import ConfigError
from phalanx.experiments import legacy
from phalanx.experiments.schema import RunConfig
from phalanx.experiments.tree import OPEN, SECTIONS, _names, _refuse, _tied, section_keys, to_flat
from phalanx.training.algorithms import builtin

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["flat_override"]


def flat_override(table: dict[str, Any], key: str, parse: Any) -> dict[str, Any] | None:
    """``--set`` of a tree key on the flat ``table`` (None when ``key`` is not one): ``rule.f=3`` sets ``f``;
    ``rule={spec="cwtm", f=3}`` sets the section's keys; ``attack.z=1.5`` sets ``attack_params.z``. A value set
    so replaces the table's, whatever spelling the file used. ``parse(flat_key)`` parses the text for that key."""
    parts = key.split(".")
    section = ".".join(parts[:2]) if parts[0] == "server" else parts[0]
    rest = parts[2:] if parts[0] == "server" else parts[1:]
    if section not in SECTIONS or (section == legacy.TREE and not (len(rest) >= 2 and rest[0] in legacy.FLAT_STAGES)):
        return None
    if section in RunConfig.model_fields and not rest:
        value = parse(None)
        if not isinstance(value, dict):
            return None  # algorithm=fedavg: the flat key
    elif not rest:
        value = parse(None)
    else:
        value = None
    if value is not None:
        made = to_flat(_nest(section, value, table))
        return {**table, **{k: v for k, v in made.items() if k not in table or made[k] is not table[k]}}
    if section == legacy.TREE:
        flat = legacy.flat_keys(rest[0], {rest[1]: None})
        target = next(iter(flat))
    else:
        keys = section_keys(section, table)
        if keys is not None and rest[0] not in keys and section in RunConfig.model_fields and section not in OPEN:
            return None  # attack.b.c=2, b no parameter of the attack: the flat key's own refusal (not a table)
        if keys is not None and rest[0] in keys:
            target = keys[rest[0]]
        elif keys is None or section in OPEN:
            target = f"{({'algorithm': 'algorithm_params', 'attack': 'attack_params', **OPEN})[section]}.{rest[0]}"
        else:
            raise _refuse(section, rest[0], "…", keys)
        if rest[1:]:
            target = ".".join([target, *rest[1:]])
    outer, _, inner = target.partition(".")
    text_value = parse(target if not inner else None)
    if not inner:
        if target == "lr":  # the run's lr replaces the file's, whatever role spelling it used (client_lr …)
            spellings = {builtin.lr_spelling(n) for n in _names(_tied(table).get("algorithm"), "dsgd")}
            table = {k: v for k, v in table.items() if k not in spellings}
        return {**table, outer: text_value}
    current = table.get(outer) or {}
    if not isinstance(current, dict):
        raise ConfigError(outer, current, f"a table (key = value, …) to set {key!r} in")
    current = dict(current)
    node = current
    path = inner.split(".")
    for part in path[:-1]:
        inside = node.get(part) or {}
        if not isinstance(inside, dict):
            raise ConfigError(f"{outer}.{part}", inside, f"a table (key = value, …) to set {key!r} in")
        node[part] = dict(inside)
        node = node[part]
    node[path[-1]] = text_value
    return {**table, outer: current}


def _nest(section: str, value: Any, table: dict[str, Any]) -> dict[str, Any]:
    """``{section: value}`` as a one-section tree, with the run's components for the section's context."""
    context: dict[str, Any] = {k: table[k] for k in ("algorithm", "attack", "server_optimizer") if k in table}
    if section == "server.optimizer":
        return {**context, "server": {"optimizer": value}}
    if isinstance(value, dict) and section in context:
        value = {"name": context[section], **value}
        return {**{k: v for k, v in context.items() if k != section}, section: value}
    return {**context, section: value}


def toml_key_parts(key: str) -> list[str]:
    """The parts of a TOML dotted key, quoted parts unquoted (``stages."mylab.stages:Clip".c`` → ``["stages",
    "mylab.stages:Clip", "c"]``), read by TOML's own parser: one key of at most :data:`MAX_KEY_PARTS` parts and
    nothing else (a line break, a table header or a comment in it is refused before it is parsed)."""
    allowed = ('a TOML key: parts joined by ".", a part with other characters than letters, digits, "_" and "-" in '
               f'quotes (stages."mylab.stages:Clip".c=0.5), at most {MAX_KEY_PARTS} parts')
    if any(c in key for c in "\n\r[]#=") or len(key) > 4096:
        raise ConfigError("--set", key[:80], allowed)
    try:
        table: Any = tomllib.loads(f"{key} = 0")
    except (tomllib.TOMLDecodeError, RecursionError):
        raise ConfigError("--set", key[:80], allowed) from None
    parts = []
    while isinstance(table, dict) and len(table) == 1:
        (part, table), = table.items()
        parts.append(part)
    if table != 0 or not 1 <= len(parts) <= MAX_KEY_PARTS:
        raise ConfigError("--set", key[:80], allowed)
    return parts


MAX_KEY_PARTS = 32
"""The most parts a ``--set`` key may have (the deepest config key has 4: ``tracking_params.mlflow.uri`` …)."""
