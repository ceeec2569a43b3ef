"""The config as a tree of sections (issue 39, item 2): ``[run]``, ``[algorithm]``, ``[rule]``, ``[attack]``,
``[server.optimizer]``, ``[stages.<name>]``, ``[data]``, ``[model]``, ``[engine]``, and a plug-in's own (each read
from the section registry, :mod:`phalanx.experiments.section_registry`: :data:`SECTIONS`) — and the one adapter
between it and the flat keys every earlier release wrote (:class:`~phalanx.experiments.schema.RunConfig`), both
ways.

A section's keys are declared once. Where a component has a constructor, the constructor is the declaration
(scikit-learn's rule, :mod:`phalanx.experiments.sections`): ``[algorithm]`` is the algorithm class's keyword
parameters (gossip's ``weights`` is the flat ``gossip_weights``; an algorithm that is not built in takes each as
``algorithm_params.<p>``), ``[attack]`` the attack class's (``attack_params.<p>``). The sections without one are
the table :data:`TABLE` (section key → flat key); ``[stages.<name>]`` is the stages' own tree, the built-in
``dp`` and ``crfl`` read from and written to their flat keys by :func:`phalanx.experiments.legacy.flat_keys`.
:data:`TABLE` is derived from the declarations of the values that read those sections
(:func:`phalanx.experiments.specs.declared`; :mod:`phalanx.experiments.declare`).

``lr`` means one thing per section: ``[algorithm].lr`` is the algorithm's own rate (federated averaging's clients',
gossip's nodes', SCAFFOLD's clients' η_l), ``[server.optimizer].lr`` the server's step (distributed SGD's ``lr``,
federated averaging's ``server_lr``, SCAFFOLD's η_g) — read from the algorithm's declared ``lr_role``
(:func:`lr_homes`).

**The run id is computed from the flat form**: :func:`to_flat` runs before validation (a table without sections
is returned as it is), so a tree names the run its flat spelling names (``tests/test_tree.py`` writes every run
``tests/test_compat.py`` pins as a tree and finds the same id). :func:`to_tree` is the inverse: ``to_flat(to_tree(t))
== t`` for every flat table ``t`` as validation reads it (the role spellings of ``lr`` as ``lr``, an algorithm of
one's own's client keys in ``algorithm_params``: the same run id) — tested on every shipped example.

:func:`read` is :func:`to_flat` with the record of where each flat key was written
(:class:`~phalanx.experiments.spelling.Written`), so that a value's one check names it as the user wrote it
(``[rule].f``); a grid's ``[tie]`` (the grid's, not a component's) may hold the sections' keys
(``[tie.algorithm] lr = […]``), read into the flat keys it ties.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Any

from phalanx import attacks
from phalanx.errors import ConfigError
from phalanx.experiments import declare, legacy, section_registry, sections, specs
from phalanx.experiments.schema import RunConfig
from phalanx.experiments.spelling import Written
from phalanx.plugins import accepted_params
from phalanx.training.algorithms import builtin
from phalanx.validate import suggest

__all__ = ["SECTIONS", "TABLE", "algorithm_keys", "is_tree", "lr_homes", "owners", "read",
           "section_keys", "to_flat", "to_tree"]

TABLE: Mapping[str, dict[str, str]] = declare.Tables(specs.declared)
"""The declared keys of each section that no constructor declares: section key → the flat key it is (derived from
the declarations at every look-up, :class:`~phalanx.experiments.declare.Tables`). ``params`` is the component's
whole parameter table (``[data.params]``); a section's other keys are its component's parameters where it has a
constructor (``[algorithm]``, ``[attack]``) or takes any (``[model]``: the builder's, ``[server.optimizer]``: the
optimizer's); each such key's name is checked once, by the component as it is built (:func:`_component_checks`),
and its refusal names the key as written."""
SECTIONS: Sequence[str] = section_registry.Names()
"""The sections, in the order :func:`to_tree` writes them: the registered ones, read from the registry at every
look-up (:mod:`phalanx.experiments.section_registry`: the built-in ones in their order, then each plug-in's)."""


class _Heads(Container[str]):
    """The first word of each section's name (``server`` of ``server.optimizer``), read from :data:`SECTIONS`."""

    def __contains__(self, word: object) -> bool:
        return word in {s.split(".")[0] for s in SECTIONS}


HEADS: Container[str] = _Heads()
"""The first word of each section's name (``server`` of ``server.optimizer``): a ``--set`` key it starts is a
tree key."""
OPEN = {"model": "model_params", "server.optimizer": "server_optimizer_params"}
"""The sections whose other keys are their component's parameters without a constructor to check them here."""
LR = ("lr", "server_lr")
"""The flat keys of the learning rates: in ``[algorithm]`` or ``[server.optimizer]`` by the algorithm's role."""
ROLE = "lr (by the algorithm's lr_role)"
STAGE_KEYS = (*legacy.PRIVACY, legacy.PROJECTION, legacy.PROJECTION_PARAMS, legacy.TREE)
"""The flat keys of ``[stages.<name>]``: the privacy stage's, the server projection's, and ``stages`` itself."""


def algorithm_keys(name: str) -> dict[str, str]:
    """``[algorithm]``'s keys for algorithm ``name`` (built in): its constructor's parameters (their flat keys), the
    flat keys it reads (``graph_params``) and :data:`TABLE`'s — not ``lr`` (:func:`lr_homes`)."""
    out = dict(TABLE["algorithm"])
    for p in sections.algorithm_section(name):
        if p.keys[0] in RunConfig.model_fields and p.keys[0] not in LR:
            out[p.name] = p.keys[0]
    cls = builtin.BUILT_IN[name]
    out.update({k: k for k in cls.config_keys if k not in LR and k not in out.values()})
    return out


def owners() -> dict[str, list[str]]:
    """Every flat key → the sections whose declaration sets it (one each, ``tests/test_tree.py``): :data:`TABLE`,
    ``[algorithm]`` over every built-in algorithm's constructor, ``[stages]`` and the learning rates' one row."""
    out: dict[str, list[str]] = {}
    declared = {section: set(keys.values()) for section, keys in TABLE.items()}
    declared["algorithm"] |= {k for name in builtin.BUILT_IN for k in algorithm_keys(name).values()}
    declared["server.optimizer"] |= set(legacy.SGD.values())
    declared["stages"] = set(STAGE_KEYS)
    declared[ROLE] = set(LR)
    for section, keys in declared.items():
        for key in sorted(keys):
            out.setdefault(key, []).append(section)
    return out


def _names(value: Any, default: str) -> list[str]:
    """The component names a (grid) value holds: ``"x"`` → ``["x"]``, a list → its strings."""
    value = default if value is None else value
    return [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]


def lr_homes(algorithm: str) -> tuple[str | None, str | None]:
    """``(the flat key of [algorithm].lr, the flat key of [server.optimizer].lr)`` for ``algorithm`` (None: the
    section has no ``lr``). A built-in algorithm whose ``lr`` is the server's (dsgd) has it in
    ``[server.optimizer]``; one whose ``lr`` is the clients' or nodes' has it in ``[algorithm]``, and the server's
    step is ``server_lr`` where it reads one (fedavg). An algorithm of one's own: its run ``lr`` is the server's
    unless its ``lr_role`` says otherwise, and a constructor ``lr`` of its own is ``algorithm_params.lr``."""
    cls = builtin.algorithm_class(algorithm)
    if algorithm in builtin.BUILT_IN:
        if cls.lr_role == "server":
            return None, "lr"
        return "lr", ("server_lr" if "server_lr" in cls.config_keys else None)
    if cls.lr_role != "server":
        return "lr", None
    return ("algorithm_params.lr" if "lr" in (accepted_params(cls) or ()) else None), "lr"


def section_keys(section: str, context: dict[str, Any]) -> dict[str, str] | None:
    """The declared keys of ``section`` for the run ``context`` (a flat table: its ``algorithm``, ``attack`` and
    ``server_optimizer``) → their flat keys (``attack_params.z``), or None where any key is the component's (a
    section in :data:`OPEN`, an attack or algorithm whose constructor ``inspect`` cannot read)."""
    if section == "algorithm":
        names = _names(context.get("algorithm"), "dsgd")
        if all(n in builtin.BUILT_IN for n in names):
            out: dict[str, str] = {}
            for n in names:
                out.update(algorithm_keys(n))
        else:
            if len(names) != 1:
                raise ConfigError("[algorithm].name", names, "one algorithm of one's own per grid, or built-in ones "
                                  "only (their sections differ)")
            takes = accepted_params(builtin.algorithm_class(names[0]))
            if takes is None:
                return None
            out = {**TABLE["algorithm"], **{p: f"algorithm_params.{p}" for p in takes
                                            if p not in TABLE["algorithm"]}}
        homes = {lr_homes(n)[0] for n in names}
        if len(homes) > 1:
            raise ConfigError("[algorithm].lr", names, "algorithms whose lr plays one role (write lr flat in a grid "
                              "over algorithms whose rates differ)")
        home = homes.pop() if homes else None
        if home is not None:
            out["lr"] = home
        return out
    if section == "attack":
        out = dict(TABLE["attack"])
        for name in _names(context.get("attack"), "none"):
            try:
                params = sections.attack_section(name)
                if accepted_params(attacks.get_class(name)) is None:  # **params: a wrapped class of one's own
                    return None
            except ConfigError:  # an unknown attack: refused, naming attack, where it is checked
                return None
            out.update({p.name: p.keys[0] for p in params if p.name not in out})
        return out
    if section == "server.optimizer":
        out = dict(TABLE[section])
        names = _names(context.get("algorithm"), "dsgd")
        homes = {lr_homes(n)[1] for n in names}
        if len(homes) > 1:
            raise ConfigError("[server.optimizer].lr", names, "algorithms whose server step is one key")
        home = homes.pop() if homes else None
        if home is not None:
            out["lr"] = home
        optimizers = _names(context.get("server_optimizer"), "sgd")
        if optimizers and all(o == "sgd" for o in optimizers):
            out.update({p: flat for p, flat in legacy.SGD.items()})
        return out
    return dict(TABLE[section])


def _owner_of(key: str) -> str | None:
    """The section whose declaration has ``key`` as one of its keys, for "belongs in [section]" hints."""
    for section in SECTIONS:
        if section == "stages":
            continue
        keys = dict(TABLE.get(section, {}))
        if section == "algorithm":
            for name in builtin.BUILT_IN:
                keys.update(algorithm_keys(name))
            keys["lr"] = "lr"
        if key in keys or (key in RunConfig.model_fields and key in keys.values()):
            return section
    return None


def _refuse(section: str, key: str, value: Any, keys: Iterable[str]) -> ConfigError:
    """A key ``section`` does not declare: where it belongs, or the closest of the section's keys (a key that would
    not print on one line shown as its repr, so that the error stays one line)."""
    allowed = ", ".join(keys)
    key = key if key.strip() and key.isprintable() else repr(key)
    owner = _owner_of(key)
    if key == "lr" and section in ("algorithm", "server.optimizer"):  # the other one has it (lr_homes)
        owner = "server.optimizer" if section == "algorithm" else "algorithm"
    if owner is not None and owner != section:
        return ConfigError(f"[{section}].{key}", value, f"a key of [{section}]: {allowed}",
                           f"{key} belongs in [{owner}]")
    close = suggest(key, keys)
    return ConfigError(f"[{section}].{key}", value, f"a key of [{section}]: {allowed}",
                       "unknown key" + (f"; {close}" if close else ""))


def _section_of(key: str, value: Any) -> bool:
    """Whether top-level ``key = value`` is a section (a table under a section's name) rather than a flat key."""
    head = "server" if key == "server" else key
    if head not in {s.split(".")[0] for s in SECTIONS}:
        return False
    return isinstance(value, dict) or head not in RunConfig.model_fields


def _tied(table: dict[str, Any]) -> dict[str, Any]:
    """``table`` with the components a grid's ``tie`` table names (``[tie] algorithm = ["gossip", "anytime"]``)
    where the table itself does not: the context a section's keys are read in."""
    tie = table.get("tie")
    if not isinstance(tie, dict):
        return table
    return {**{k: tie[k] for k in ("algorithm", "attack", "server_optimizer") if k in tie}, **table}


def is_tree(table: Any) -> bool:
    """Whether ``table`` has a section other than ``stages`` (or ``[stages.dp]`` / ``[stages.crfl]``)."""
    if not isinstance(table, dict):
        return False
    stages, tie = table.get(legacy.TREE), table.get("tie")
    return any(_section_of(k, v) for k, v in table.items() if k != legacy.TREE) or (
        isinstance(stages, dict) and any(s in legacy.FLAT_STAGES for s in stages)) or (
        isinstance(tie, dict) and any(_section_of(k, v) for k, v in tie.items() if k != legacy.TREE))


def _section_hint(name: str, value: Any) -> str | None:
    """What a value given to a section's name meant (``--set rule=cwtm``): the section's keys with their flat
    spellings, the first one as an example (None for a name no section has)."""
    from phalanx.experiments import section_registry

    section = next((s for s in section_registry.sections() if s.name == name), None)
    if section is None or not section.keys:
        return None
    first = section.keys[0]
    keys = ", ".join(k.key if k.key == k.flat else f"{k.key} (flat: {k.flat})" for k in section.keys[:8])
    return f"did you mean --set {name}.{first.key}={value} or --set {first.flat}={value}? [{name}]'s keys: {keys}"


def _sections(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The sections of ``table`` by name (``server`` opened to ``server.optimizer``)."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in table.items():
        if not _section_of(key, value) or key == legacy.TREE:
            continue
        if key == "server":
            if not isinstance(value, dict) or set(value) - {"optimizer"}:
                extra = sorted(set(value) - {"optimizer"}) if isinstance(value, dict) else value
                raise ConfigError("[server]", extra, "only the table [server.optimizer] (name, lr, schedule, …)")
            key, value = "server.optimizer", value.get("optimizer", {})
        if not isinstance(value, dict):
            raise ConfigError(f"[{key}]", value, f"a table of the keys of [{key}]", _section_hint(key, value))
        out[key] = value
    return out


def to_flat(table: Any) -> Any:
    """The flat table a tree is (what validation reads and the run id is computed from); a table with no section
    is returned as it is. A section key and the flat spelling of the same key in one table is a one-line
    :class:`ConfigError` naming both; an unknown key names its section, the closest of the section's keys and,
    when another section declares it, that section. List values (grid axes) are moved as they are."""
    return read(table)[0]


def read(table: Any) -> tuple[Any, Written]:
    """:func:`to_flat`, and the key the user wrote for each flat key the tree set (:class:`Written`: ``f`` →
    ``[rule].f``, ``model_params.hidden`` → ``[model].hidden``, ``dp_noise`` → ``[stages.dp].noise``), so that
    the check of a value names it so (:func:`phalanx.experiments.spelling.respelled`); empty for a flat table."""
    if not is_tree(table):
        return table, Written()
    found = _sections(table)
    rest = {k: v for k, v in table.items() if k not in found and not (k == "server" and "server.optimizer" in found)}
    tied: dict[str, str] = {}
    if isinstance(rest.get("tie"), dict):
        rest["tie"], tied = _flat_tie(rest["tie"], {**rest, **_named(found)})
    context = {**_tied(rest), **_named(found)}
    rule = found.get("rule", {})
    if "pre" in rule:
        if "spec" not in rule:
            raise ConfigError("[rule].pre", rule["pre"], "set with [rule].spec (the rule it runs before)")
        context["__pre__"] = rule["pre"]
    made: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for section in SECTIONS:
        if section in found:
            for key, value in found[section].items():
                _put(made, spelled, section, key, value, context)
    stages = rest.pop(legacy.TREE, None)
    if isinstance(stages, dict):
        kept = {}
        for stage, params in stages.items():
            if stage in legacy.FLAT_STAGES and isinstance(params, dict):
                for flat, value in legacy.flat_keys(stage, params).items():
                    _merge(made, spelled, flat, value, f"[stages.{stage}]")
            else:
                kept[stage] = params
        if kept:
            made[legacy.TREE] = kept
    elif stages is not None:
        made[legacy.TREE] = stages
    for flat, value in made.items():
        if flat in rest:
            if isinstance(value, dict) and isinstance(rest[flat], dict) and not set(value) & set(rest[flat]):
                continue
            raise ConfigError(spelled.get(flat, flat), value, f"unset or {flat} unset (one key, two spellings: "
                              f"{spelled.get(flat, flat)} and {flat})")
    out = dict(rest)
    for flat, value in made.items():
        out[flat] = {**rest[flat], **value} if flat in rest else value
    return out, _written({**spelled, **tied}, stages, made)


def _named(found: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The components the sections ``found`` name (``[algorithm] name``: ``algorithm``): the sections' context."""
    return {flat: found[s]["name"] for s, flat in (("algorithm", "algorithm"), ("attack", "attack"),
                                                    ("server.optimizer", "server_optimizer"))
            if "name" in found.get(s, {})}


def _flat_tie(tie: dict[str, Any], context: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``[tie]`` written with sections (``[tie.algorithm] name = ["gossip", "anytime"]``, ``lr = [0.8, 0.016]``:
    each a section's key whose list is the tied axis) as the flat keys the grid ties, and where each was written
    (``[tie.algorithm].lr``); its flat keys stay as they are. The tie is the grid's, not a component's: its keys are
    the sections', read in the run's context and the tie's own components."""
    found = _sections({k: v for k, v in tie.items() if k != legacy.TREE and _section_of(k, v)})
    if not found:
        return tie, {}
    if "pre" in found.get("rule", {}):
        raise ConfigError("[tie.rule].pre", found["rule"]["pre"], "unset (tie the spec with its pre-aggregation "
                          "written in: spec = ['nnm>cwtm', 'cwtm'])")
    made: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    context = {**{k: v for k, v in context.items() if k != "tie"}, **_named(found)}
    for section, keys in found.items():
        for key, value in keys.items():
            try:
                _put(made, spelled, section, key, value, context)
            except ConfigError as exc:  # the tie's key, not the run's section's
                raise ConfigError(exc.parameter.replace("[", "[tie.", 1), exc.value, exc.allowed, exc.hint) from None
    out = {k: v for k, v in tie.items() if k not in found and not (k == "server" and "server.optimizer" in found)}
    for flat, value in made.items():
        if flat in out:
            raise ConfigError(f"tie.{flat}", value, f"unset (one key, two spellings: {spelled[flat]} in [tie])")
        out[flat] = value
    return out, {flat: where.replace("[", "[tie.", 1) for flat, where in spelled.items()}


def _written(spelled: dict[str, str], stages: Any, made: dict[str, Any]) -> Written:
    """The adapter's record of where each flat key was written, as :class:`Written`: a table that a section's
    keys filled one by one (``model_params`` from ``[model] hidden``) is the section, one written whole
    (``[model].params``) has each of its keys; a built-in stage's flat key is its ``[stages.<name>].<p>``, and any
    other stage's section ``stages.<name>`` is ``[stages.<name>]`` (its parameter ``stages.<name>.<p>`` then reads
    ``[stages.<name>].<p>``, as every section's does)."""
    names = {}
    for flat, where in spelled.items():
        inner = [w for k, w in spelled.items() if k.startswith(flat + ".")]
        names[flat] = where.partition("].")[0] + "]" if where in inner else where
        if where.endswith("].params") and isinstance(made.get(flat), dict):
            names.update({f"{flat}.{p}": f"{where}.{p}" for p in made[flat] if f"{flat}.{p}" not in spelled})
    for stage, params in (stages.items() if isinstance(stages, dict) else ()):
        if stage in legacy.FLAT_STAGES and isinstance(params, dict):
            for p in params:
                names[legacy.DP.get(str(p), str(p)) if stage == "dp" else f"{legacy.PROJECTION_PARAMS}.{p}"] = \
                    f"[stages.{stage}].{p}"
            if stage != "dp":
                names[legacy.PROJECTION] = f"[stages.{stage}]"
        else:
            names[f"{legacy.TREE}.{stage}"] = f"[stages.{stage}]"
    return Written.of(names)


def _merge(made: dict[str, Any], spelled: dict[str, str], flat: str, value: Any, where: str) -> None:
    """Set ``flat`` (``attack_params.z``: a key of the table ``attack_params``) once."""
    outer, _, inner = flat.partition(".")
    if inner:
        table = made.setdefault(outer, {})
        if not isinstance(table, dict):
            raise ConfigError(spelled.get(outer, outer), table, f"a table (key = value, …) beside {where}")
        if inner in table:
            raise ConfigError(where, value, f"one spelling of {flat} (it is also set as {spelled.get(flat, flat)})")
        table[inner] = value
        spelled[outer] = spelled.get(outer, where)
        spelled[flat] = where
        return
    if flat in made:
        if isinstance(made[flat], dict) and isinstance(value, dict) and not set(made[flat]) & set(value):
            made[flat] = {**made[flat], **value}
            return
        raise ConfigError(where, value, f"one spelling of {flat} (it is also set as {spelled.get(flat, flat)})")
    made[flat] = value
    spelled[flat] = where


def _put(made: dict[str, Any], spelled: dict[str, str], section: str, key: str, value: Any,
         context: dict[str, Any]) -> None:
    """One key of a section into the flat table being made."""
    if section == "rule" and key == "pre":  # the pre-aggregation, written before the rule's spec
        return
    keys = section_keys(section, context)
    where = f"[{section}].{key}"
    if keys is None and key in TABLE[section]:  # the declared keys of a component inspect cannot read
        keys, anything = dict(TABLE[section]), True
    else:
        anything = keys is None
    if keys is not None and key in keys:
        flat = keys[key]
        if section == "rule" and key == "spec":
            pre = context.get("__pre__")
            value = _with_pre(value, pre)
        _merge(made, spelled, flat, value, where)
        return
    if anything or section in OPEN or _component_checks(section, context):
        params = {"algorithm": "algorithm_params", "attack": "attack_params", **OPEN}.get(section)
        if params is not None and _owner_of(key) in (None, section):
            _merge(made, spelled, f"{params}.{key}", value, where)
            return
    raise _refuse(section, key, value, [*(keys or {}), *(["pre"] if section == "rule" else [])])


def _component_checks(section: str, context: dict[str, Any]) -> bool:
    """Whether a key ``section`` does not declare is its component's parameter, whose name the component checks
    once, as it is built (``[attack]``'s: the attack's; ``[algorithm]``'s, for an algorithm of one's own: its
    constructor's ``algorithm_params``) — not here too (a built-in algorithm's keys are the flat keys: here)."""
    return section == "attack" or (section == "algorithm" and not all(
        n in builtin.BUILT_IN for n in _names(context.get("algorithm"), "dsgd")))


def _with_pre(spec: Any, pre: Any) -> Any:
    """``[rule] pre = "nnm"`` before ``spec`` (a name or a grid of names): ``nnm>spec``."""
    if pre is None:
        return spec
    if not isinstance(pre, str):
        raise ConfigError("[rule].pre", pre, "a pre-aggregation spec (a string: 'nnm', 'bucketing(s=2)>nnm')")
    return [f"{pre}>{s}" for s in spec] if isinstance(spec, list) else f"{pre}>{spec}"


def _normalised(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` as validation reads it before the schema: the run's algorithm's role spelling of ``lr``
    (``client_lr``, ``node_lr``, dsgd's ``server_lr``: :func:`~phalanx.training.algorithms.builtin.lr_spelling`) as
    ``lr``, an algorithm of one's own's client keys in ``algorithm_params`` (:func:`legacy.client_keys`) — each
    the same run id. Another algorithm's spelling, or two values, are left for validation to refuse
    (:func:`phalanx.experiments.config.role_names`)."""
    out = dict(legacy.client_keys(flat))
    algorithm = _tied(out).get("algorithm", "dsgd")
    own = builtin.lr_spelling(algorithm) if isinstance(algorithm, str) else None
    if own is not None and own in out and "lr" not in out:
        out["lr"] = out.pop(own)
    return out


def to_tree(flat: dict[str, Any]) -> dict[str, Any]:
    """The tree a flat table is: each key in the section that declares it (:func:`owners`), a component's
    ``*_params`` spread into its section (under ``params`` where a name would collide with a declared key), the
    built-in stages' flat keys as ``[stages.dp]`` / ``[stages.crfl]``; keys no section owns (a grid's ``tie``, an
    unknown key validation refuses) kept at the top. :func:`to_flat` of it is ``flat`` as validation reads it."""
    if not isinstance(flat, dict):
        raise ConfigError("config", type(flat).__name__, "a table of key = value")
    if is_tree(flat):
        flat = to_flat(flat)
    flat = _normalised(flat)
    tree: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    top: dict[str, Any] = {}
    homes: dict[str, tuple[str, str]] = {}
    context = _tied(flat)
    for section in SECTIONS:
        if section == "stages":
            continue
        keys = section_keys(section, context) or dict(TABLE[section])
        for key, target in keys.items():
            homes.setdefault(target, (section, key))
    params_of = {"algorithm_params": "algorithm", "attack_params": "attack", "model_params": "model",
                 "server_optimizer_params": "server.optimizer", "dataset_params": "data"}
    stages: dict[str, Any] = {}
    dp = {p: flat[k] for p, k in legacy.DP.items() if k in flat}
    if dp:
        stages["dp"] = dp
    if legacy.PROJECTION in flat:
        name = flat[legacy.PROJECTION]
        if not isinstance(name, str) or name not in legacy.FLAT_STAGES:
            raise ConfigError(legacy.PROJECTION, name, "one of " + ", ".join(repr(n) for n in legacy.FLAT_STAGES
                                                                              if n != "dp"))
        params = flat.get(legacy.PROJECTION_PARAMS, {})
        stages[name] = dict(params) if isinstance(params, dict) else params
    for key, value in flat.items():
        if key in STAGE_KEYS:
            if key == legacy.TREE and isinstance(value, dict):
                stages.update(value)
            elif key == legacy.PROJECTION_PARAMS and legacy.PROJECTION not in flat and value:
                top[key] = value  # refused by validation (params without the projection): kept to say so
            continue
        if key in params_of and isinstance(value, dict):
            section = params_of[key]
            declared = section_keys(section, context) or {}
            for p, v in value.items():
                home = declared.get(p)
                if home == f"{key}.{p}" or (home is None and p not in TABLE[section] and _owner_of(p) in
                                              (None, section) and section != "data"):
                    tree[section][p] = v
                else:
                    tree[section].setdefault("params", {})[p] = v
            continue
        if key in homes:
            section, name = homes[key]
            tree[section][name] = value
        elif key == "tie" and isinstance(value, dict):  # each tied key in its section: [tie.algorithm] lr = […]
            tie: dict[str, Any] = {}
            for k, v in value.items():
                section, name = homes.get(k, ("", k)) if k not in STAGE_KEYS else ("", k)
                where = tie.setdefault("server", {}).setdefault("optimizer", {}) if section == "server.optimizer" \
                    else tie.setdefault(section, {}) if section else tie
                where[name] = v
            top[key] = tie
        else:
            top[key] = value
    if stages:
        tree["stages"] = stages
    out: dict[str, Any] = {}
    for section in SECTIONS:
        if tree.get(section):
            if section == "server.optimizer":
                out["server"] = {"optimizer": tree[section]}
            else:
                out[section] = tree[section]
    return {**out, **top}
