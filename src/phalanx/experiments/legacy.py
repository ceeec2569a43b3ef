"""The one adapter of the flat keys of earlier releases: what they turn on, as the sections the components read.

A run config is flat (:class:`~phalanx.experiments.schema.RunConfig`): keys added by each feature at the top level
(``dp_noise``, ``server_projection``, ``server_momentum`` …). The components do not read them: each reads its own
section — a stage its constructor's parameters (:mod:`phalanx.training.stages`), the server optimizer its own —
and this module is the only reader of the flat keys that turn those sections on. It is frozen: a new stage is
configured as ``[stages.<name>]`` (:data:`TREE`) and edits nothing here. The flat keys keep naming runs exactly as
before (the run id is computed from them, ``tests/test_compat.py``), and every error about a section's parameter
names the flat key the user wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from phalanx.errors import ConfigError
from phalanx.experiments.schema import RunConfig
from phalanx.plugins import accepted_params
from phalanx.training import optim
from phalanx.training.algorithms import builtin
from phalanx.training.stages.privacy import ClientDP, resolved_source

__all__ = ["TREE", "Flat", "Section", "client_keys", "flat_keys", "optimizer", "read", "row_columns", "stage_sections"]

TREE = "stages"
"""The config key of the stages' own sections: ``[stages.<name>]`` with the stage's parameters."""

PROJECTION = "server_projection"
PROJECTION_PARAMS = "server_projection_params"
"""The flat key of the server projection's parameters (``[stages.crfl]``'s section, :mod:`phalanx.experiments.tree`)."""
DP = ClientDP.config_section.table()
"""The flat key of each parameter of the privacy stage's section (``noise``: ``dp_noise``, ``clip``, ``delta``),
as the stage declares them (``ClientDP.config_section``, :mod:`phalanx.training.stages.privacy`)."""
PRIVACY = tuple(DP.values())
ROW_PRIVACY = ("dp_noise", "dp_clip", "dp_delta")
"""The privacy keys a DP run's metric rows repeat (its numbers; not ``dp_noise_source``, added later: the rows of a
DP run are what they were)."""
SGD = optim.SGD.config_section.table()
"""The flat key of each parameter of the SGD server optimizer's section that has one (``momentum``:
``server_momentum``, ``weight_decay``), as the optimizer declares them (``SGD.config_section``)."""
SERVER = ("server_optimizer", *SGD.values())
FLAT_STAGES = {"crfl": PROJECTION, "dp": "dp_noise"}
"""The built-in stages that flat keys turn on (a ``[stages.<name>]`` section of theirs is refused: one run, one
spelling, one run id)."""


@dataclass(frozen=True)
class Section:
    """One stage a config turns on: its ``name`` (a stage of :mod:`phalanx.training.stages.registry`), its
    ``params``, the ``key`` that turned it on and ``name_of(p)``, the config key of its parameter ``p``."""

    name: str
    params: dict[str, Any]
    key: str
    name_of: Callable[[str], str]


@dataclass(frozen=True)
class Flat:
    """The flat keys of earlier releases that turn stages and the server optimizer on, as a run config gives them
    (:func:`read`), with the run's ``algorithm`` (named in their errors) and its ``[stages.<name>]`` sections."""

    algorithm: str
    server_projection: str | None
    server_projection_params: dict[str, Any]
    dp_noise: float | None
    dp_clip: float | None
    dp_delta: float
    server_optimizer: str
    server_optimizer_params: dict[str, Any]
    server_momentum: float
    server_weight_decay: float
    stages: dict[str, Any]
    dp_noise_source: str | None = None
    engine: str = "simulated"


def read(cfg: RunConfig) -> Flat:
    """The flat keys of ``cfg`` this module maps onto sections, read once (the checks are where they are mapped:
    :func:`optimizer`, :func:`stage_sections`)."""
    return Flat(cfg.algorithm, cfg.server_projection, dict(cfg.server_projection_params), cfg.dp_noise, cfg.dp_clip,
                cfg.dp_delta, cfg.server_optimizer, dict(cfg.server_optimizer_params), cfg.server_momentum,
                cfg.server_weight_decay, dict(getattr(cfg, TREE)), cfg.dp_noise_source, cfg.engine)


def _flat(cfg: Flat | RunConfig) -> Flat:
    return read(cfg) if isinstance(cfg, RunConfig) else cfg


def _default(key: str) -> Any:
    return RunConfig.model_fields[key].get_default(call_default_factory=True)


def client_keys(table: dict[str, Any]) -> dict[str, Any]:
    """The flat keys of the built-in algorithms (``clients_per_round``, ``local_steps``, ``local_epochs``,
    ``prox_mu``, ``stats_batch``, ``stats_momentum``: :func:`~phalanx.training.algorithms.builtin.own_keys`) moved
    into ``algorithm_params`` when the run's algorithm is not built in and its constructor takes a parameter of that
    name (SCAFFOLD, a subclass of federated averaging, takes all of them): ``clients_per_round = 10`` means the
    same for every algorithm that has it. The moved spelling *is* the ``algorithm_params`` one, so the run id is
    the one ``algorithm_params`` gives (``tests/test_compat.py`` pins it). A key at its default is left where it is
    (it configures nothing: the built-in defaults and the constructor's coincide, as the tests check for SCAFFOLD);
    a key given both ways with two values is refused, naming both."""
    algorithm = table.get("algorithm") if isinstance(table, dict) else None
    if not isinstance(algorithm, str) or algorithm in builtin.BUILT_IN:
        return table
    moved = {k: table[k] for k in builtin.own_keys() if k in table and table[k] != _default(k)}
    if not moved:
        return table
    try:
        cls = builtin.algorithm_class(algorithm)
    except ConfigError:  # an unknown name: refused where the algorithm is checked, with its own message
        return table
    takes = set(accepted_params(cls) or ())
    moved = {k: v for k, v in moved.items() if k in takes}
    params = table.get("algorithm_params", {})
    if not moved or not isinstance(params, dict):  # a non-table algorithm_params: refused by the schema
        return table
    for key, value in moved.items():
        if key in params and params[key] != value:
            raise ConfigError(key, value, f"{params[key]!r} (as algorithm_params.{key}) or unset (one parameter of "
                              f"algorithm {algorithm!r}, two spellings)")
    rest = {k: v for k, v in table.items() if k not in moved}
    return {**rest, "algorithm_params": {**params, **moved}}


def stage_sections(cfg: Flat | RunConfig, projections: Callable[[], list[str]]) -> list[Section]:
    """The stages ``cfg`` (its flat keys: :func:`read`) turns on, in the order they act: the server projection
    (``server_projection`` with ``server_projection_params``: one of ``projections()``), client-level differential
    privacy (``dp_noise``, ``dp_clip``, ``dp_delta``, ``dp_noise_source``: unset, the engine's default), then every
    ``[stages.<name>]`` section in the order written."""
    cfg = _flat(cfg)
    out: list[Section] = []
    name, params = cfg.server_projection, dict(cfg.server_projection_params)
    if name is None:
        if params:
            raise ConfigError("server_projection_params", params, "empty unless server_projection is set")
    else:
        known = projections()
        if name not in known:
            raise ConfigError(PROJECTION, name, "one of " + ", ".join(repr(n) for n in known) + " or unset")
        out.append(Section(name, params, PROJECTION, _under("server_projection_params")))
    if cfg.dp_noise is None:
        if cfg.dp_clip is not None:
            raise ConfigError("dp_noise", None, "a noise multiplier > 0 with dp_clip set (clipping alone gives no "
                              "differential privacy)")
        if cfg.dp_delta != _default("dp_delta"):
            raise ConfigError("dp_delta", cfg.dp_delta, "its default (1e-05) unless dp_noise is set")
        if cfg.dp_noise_source is not None:
            raise ConfigError("dp_noise_source", cfg.dp_noise_source, "unset unless dp_noise is set")
    else:
        if cfg.dp_clip is None:
            raise ConfigError("dp_clip", None, "a clipping norm > 0 with dp_noise set (the noise is σ times it)")
        source = resolved_source(cfg.dp_noise_source, cfg.engine)  # unset: the engine's (torchrun: secret)
        out.append(Section("dp", {"clip": cfg.dp_clip, "noise": cfg.dp_noise, "delta": cfg.dp_delta,
                                  "source": source}, "dp_noise", lambda p: DP.get(p, p)))
    for stage, section in cfg.stages.items():
        if stage in FLAT_STAGES:
            raise ConfigError(f"{TREE}.{stage}", section, f"unset: {stage} is turned on by {FLAT_STAGES[stage]} "
                              "(one spelling per run, so that its run id is the one it always had)")
        out.append(Section(stage, dict(section), f"{TREE}.{stage}", _under(f"{TREE}.{stage}")))
    return out


def flat_keys(stage: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The flat keys that turn on the built-in stage ``stage`` with its section ``params`` — :func:`stage_sections`
    read backwards, for code that writes configs (a study's grid): ``flat_keys("dp", {"noise": σ, "clip": C})`` is
    ``{"dp_noise": σ, "dp_clip": C}``; ``"crfl"`` (any server projection) is ``server_projection`` with its params.
    The flat spelling is the one a run id is computed from, so a study that writes its stage's section through here
    names its runs as it always did."""
    if stage == "dp":
        unknown = sorted(set(params) - set(DP))
        if unknown:
            raise ConfigError(unknown[0], params[unknown[0]], f"a parameter of dp: {', '.join(DP)}")
        return {DP[p]: v for p, v in params.items()}
    if stage == "crfl":
        return {PROJECTION: stage, "server_projection_params": dict(params)}
    raise ConfigError("stage", stage, "a stage with flat keys: " + ", ".join(repr(n) for n in FLAT_STAGES))


def _under(prefix: str) -> Callable[[str], str]:
    """``p`` ↦ ``prefix.p``: the config key of a section's parameter."""
    return lambda p: f"{prefix}.{p}"


def row_columns(cfg: Flat | RunConfig) -> tuple[str, ...]:
    """The flat keys a run repeats on its metric rows because of a stage they turn on: the privacy keys."""
    return ROW_PRIVACY if _flat(cfg).dp_noise is not None else ()


def optimizer(cfg: Flat | RunConfig, decentralized: bool) -> tuple[str, dict[str, Any], Callable[[str], str]]:
    """The server optimizer's name, its section of parameters and the config key of each (for its errors):
    ``server_optimizer`` with ``server_optimizer_params`` (``p`` is ``server_optimizer_params.p``); SGD also takes
    ``momentum`` and ``weight_decay`` from the flat ``server_momentum`` and ``server_weight_decay`` (:data:`SGD`).
    A decentralized algorithm has no server: the server's keys keep their defaults."""
    cfg = _flat(cfg)
    if decentralized:
        for key in SERVER:
            if getattr(cfg, key) != _default(key):
                raise ConfigError(key, getattr(cfg, key), f"its default with algorithm = {cfg.algorithm!r} (there is "
                                  "no server; lr, momentum and weight_decay are the nodes')")
    given = dict(cfg.server_optimizer_params)
    params = dict(given)
    keys = {p: f"server_optimizer_params.{p}" for p in given}
    for p, key in SGD.items():
        if cfg.server_optimizer == "sgd":
            if p not in given:
                params[p], keys[p] = getattr(cfg, key), key
        elif getattr(cfg, key) != 0.0:
            raise ConfigError(key, getattr(cfg, key), f"0 with server_optimizer = {cfg.server_optimizer!r} "
                              "(its parameters go in server_optimizer_params)")
    return cfg.server_optimizer, params, lambda p: keys.get(p, p)
