"""The components a run config names — its round algorithm, rule, attack and server optimizer — built once, when
the config is validated, and checked together.

Each component checks its own parameters when it is built (the registries' ``make``, a built-in algorithm's
:meth:`~phalanx.training.algorithms.base.RoundAlgorithm.from_config`); what ties them together — f against the
vectors the algorithm's rule sees each round, the rule's requirement on that number, an attack the algorithm can
run — is the algorithm's :meth:`~phalanx.training.algorithms.base.RoundAlgorithm.check_config`. Nothing here knows
any particular algorithm.

A run builds its components once: the objects that validating a config built are kept for it (the last config
validated in this process, :func:`keep`) and the experiment built from that config takes them (:func:`take`); a
config trained again, or validated elsewhere (a Slurm task reads its config from a file), builds its own.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from phalanx.aggregators.base import Aggregator
from phalanx.attacks.base import Attack, DataAttack
from phalanx.decentralized import gossip_attacks, robust_gossip
from phalanx.errors import ConfigError
from phalanx.experiments.schema import RunConfig
from phalanx.plugins import accepted_params
from phalanx.training import optim
from phalanx.training.algorithms import builtin
from phalanx.training.algorithms.base import RoundAlgorithm
from phalanx.training.crfl import CRFL
from phalanx.training.projection import ServerProjection
from phalanx.training.schedule import LRSchedule


@dataclass
class Components:
    """What a config names, as objects: the round ``algorithm`` with ``server_lr``, the learning rate of the loop's
    server step (the config's ``lr`` for distributed SGD, ``server_lr`` for federated averaging, 1 for gossip, whose
    nodes step themselves), the aggregation ``rule``, the ``attack`` and the server ``optimizer``."""

    algorithm: RoundAlgorithm
    server_lr: Callable[[int], float]
    rule: Aggregator
    attack: Attack | DataAttack
    optimizer: optim.ServerOptimizer
    projection: ServerProjection | None = None
    """The server projection (CRFL), or None."""
    shards: list[Tensor] | None = None
    """The workers' shards, when checking that the data splits as asked built them already (a grid of one run:
    :func:`phalanx.experiments.build.check_points`)."""
    model: nn.Module | None = None
    """The initial model, when checking that it builds on the data set built it already (likewise)."""
    built_on: object = None
    """The data set object that ``shards`` and ``model`` were built on (the run uses them only on that one)."""


def build(cfg: RunConfig) -> Components:
    """The components of ``cfg``, each checked as it is built (a one-line :class:`ConfigError` naming its key)."""
    cls = builtin.algorithm_class(cfg.algorithm)
    rule = robust_gossip.configured(cfg.aggregator, cfg.f, cfg.algorithm, cls.decentralized)  # gossip rules: a graph's
    configure = cls.from_config if cfg.algorithm in builtin.BUILT_IN else cls.from_params  # keys | algorithm_params
    algorithm, server_lr = configure(cfg, LRSchedule(cfg.lr, cfg.schedule, cfg.rounds, cfg.step_every))
    attack = gossip_attacks.configured(cfg.attack, cfg.attack_params, cfg.algorithm, cls.decentralized)
    return Components(algorithm, server_lr, rule, attack, server_optimizer(cfg),
                      server_projection(cfg, algorithm, attack))


def check(cfg: RunConfig, parts: Components) -> None:
    """What ties the components together, as the algorithm owns it
    (:meth:`~phalanx.training.algorithms.base.RoundAlgorithm.check_config`)."""
    parts.algorithm.check_config(cfg, parts.rule, parts.attack)


def server_optimizer(cfg: RunConfig) -> optim.ServerOptimizer:
    """The config's server optimizer: ``server_optimizer`` with ``server_optimizer_params``; SGD also takes
    ``server_momentum`` and ``server_weight_decay``."""
    params = dict(cfg.server_optimizer_params)
    if cfg.server_optimizer == "sgd":
        params.setdefault("momentum", cfg.server_momentum)
        params.setdefault("weight_decay", cfg.server_weight_decay)
    else:
        for key in ("server_momentum", "server_weight_decay"):
            if getattr(cfg, key) != 0.0:
                raise ConfigError(key, getattr(cfg, key), f"0 with server_optimizer = {cfg.server_optimizer!r} "
                                  "(its parameters go in server_optimizer_params)")
    if cfg.server_optimizer == optim.RobustOnline.name:  # parameter-free: the server's lr is its scale ε, T = rounds
        if builtin.algorithm_class(cfg.algorithm).lr_role == "server" and cfg.schedule != "constant":
            raise ConfigError("schedule", cfg.schedule, "'constant' with server_optimizer = 'robust-online' (lr is "
                              "the learner's scale, not a step size; docs/online.md)")
        params.setdefault("horizon", cfg.rounds)
    return optim.make(cfg.server_optimizer, **params)


PROJECTIONS: dict[str, type[ServerProjection]] = {CRFL.name: CRFL}
"""The server projections a config names (``server_projection``)."""


def server_projection(cfg: RunConfig, algorithm: RoundAlgorithm, attack: Attack | DataAttack,
                      ) -> ServerProjection | None:
    """The config's server projection (``server_projection`` with ``server_projection_params``), or None; refused
    with decentralized rounds (no server model). CRFL's certificate parameters default to the run's: R = the
    attackers (``byzantine``, at least 1), p = 1 / the vectors a round, τ = ``local_steps``, η = ``lr``, γ and q/n =
    the attack's ``boost`` and ``poison_fraction`` (1 without), the attacked rounds = 1 … ``stop_round`` (every
    round without)."""
    name, params = cfg.server_projection, dict(cfg.server_projection_params)
    if name is None:
        if params:
            raise ConfigError("server_projection_params", params, "empty unless server_projection is set")
        return None
    if name not in PROJECTIONS:
        raise ConfigError("server_projection", name, "one of " + ", ".join(repr(n) for n in PROJECTIONS) +
                          " or unset")
    if algorithm.decentralized:
        raise ConfigError("server_projection", name, f"unset with algorithm = {cfg.algorithm!r} (it clips and "
                          "perturbs the server's model; decentralized rounds have a model per node and no server)")
    if cfg.model_params.get("norm") == "fedbn":
        raise ConfigError("server_projection", name, "unset with model_params.norm = 'fedbn' (every client keeps its "
                          "own BatchNorm layers: there is no one global model to smooth and certify)")
    cls = PROJECTIONS[name]
    if cls is CRFL:
        own = attack.params() if hasattr(attack, "params") else {}
        if "local_steps" not in params and cfg.local_epochs is not None:
            raise ConfigError("server_projection_params.local_steps", None, "the local steps τ of the certificate, "
                              "set when the clients train for local_epochs")
        params.setdefault("attackers", max(1, cfg.byzantine))
        params.setdefault("weight", 1.0 / algorithm.per_round(cfg.workers))
        params.setdefault("local_steps", cfg.local_steps)
        params.setdefault("client_lr", cfg.lr)
        params.setdefault("scale", float(own.get("boost", 1.0)))
        params.setdefault("poison_fraction", float(own.get("poison_fraction", 1.0)))
        stop = own.get("stop_round")
        if "attack_rounds" not in params and isinstance(stop, int):
            params["attack_rounds"] = list(range(1, min(stop, cfg.rounds) + 1))
        given = params.get("attack_rounds")
        late = [a for a in given if isinstance(a, int) and a > cfg.rounds] if isinstance(given, list) else []
        if late:
            raise ConfigError("server_projection_params.attack_rounds", late, f"rounds in [1, rounds = {cfg.rounds}]")
    accepted = accepted_params(cls) or []
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(f"server_projection_params.{unknown[0]}", params[unknown[0]],
                          f"a parameter of {name}: {', '.join(accepted)}")
    try:
        return cls(**params)
    except ConfigError as exc:
        raise ConfigError(f"server_projection_params.{exc.parameter}", exc.value, exc.allowed, exc.hint) from None


def processes(cfg: RunConfig) -> int:
    """How many processes a torchrun run of ``cfg`` has, as its algorithm says
    (:meth:`~phalanx.training.algorithms.base.RoundAlgorithm.processes`: one per worker, or per client slot of a
    federated round — rank 0 is also the server)."""
    return builtin.algorithm_class(cfg.algorithm).processes(cfg)


_kept: tuple[weakref.ref[RunConfig], Components] | None = None


def keep(cfg: RunConfig, parts: Components) -> None:
    """Keep ``parts`` for the run of ``cfg`` (the config object itself), in place of any kept before: one config's
    components at a time, so that validating a large grid holds no more than one point's objects."""
    global _kept
    _kept = (weakref.ref(cfg), parts)


def kept(cfg: RunConfig) -> Components | None:
    """The components kept for ``cfg`` (this very object), still kept; None when there are none."""
    return _kept[1] if _kept is not None and _kept[0]() is cfg else None


def take(cfg: RunConfig) -> Components | None:
    """The components kept for ``cfg`` (this very object), handed over once; None when there are none."""
    global _kept
    if _kept is None or _kept[0]() is not cfg:
        return None
    parts, _kept = _kept[1], None
    return parts
