"""The components a run config names — its round algorithm, rule, attack, server optimizer and stages — built once,
when the config is validated, and checked together.

The algorithm's class is resolved once per config (:attr:`RunConfig.algorithm_class`); the algorithm builds its own
rule and attack (:meth:`~phalanx.training.algorithms.base.RoundAlgorithm.make_rule`, ``make_attack``: a
decentralized one takes the robust gossip rules and the graph attacks too). Each component checks its own
parameters when it is built; what ties them — f against the vectors the algorithm's rule sees each round, the
rule's requirement on that number, an attack the algorithm can run — is the algorithm's
:meth:`~phalanx.training.algorithms.base.RoundAlgorithm.check_config`; each stage and the server optimizer check
themselves against the run's :class:`~phalanx.training.stages.base.Plan` (:meth:`Stage.check`). The flat keys that
turn stages on are read by :mod:`phalanx.experiments.legacy` alone. Nothing here knows any particular algorithm or
stage.

A run builds its components once: validating a config keeps what it built in the validated-run value
(:class:`phalanx.experiments.validrun.ValidRun`, not on the config, not in a module-wide cache), and the experiment
built from that value takes it (:func:`phalanx.experiments.validrun.components`); a value trained again, or a config
validated elsewhere (a Slurm task reads its config from a file, a sweep's worker process receives it pickled),
builds its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from phalanx.aggregators.base import Aggregator
from phalanx.attacks.base import Attack, DataAttack
from phalanx.experiments import legacy
from phalanx.experiments.schema import RunConfig
from phalanx.experiments.specs import RunShape, Specs, read
from phalanx.training import optim
from phalanx.training.algorithms import builtin
from phalanx.training.algorithms.base import RoundAlgorithm, check_honest
from phalanx.training.projection import ServerProjection
from phalanx.training.schedule import LRSchedule
from phalanx.training.stages import registry
from phalanx.training.stages.base import Plan, Stage

NORMS = {"batch": "stats", "hybrid": "stats", "fedbn": "fedbn"}
"""``model_params.norm`` → what the stages' checks know of it (:attr:`Plan.norm`)."""


@dataclass
class Components:
    """What a config names, as objects: the round ``algorithm`` with ``server_lr``, the learning rate of the loop's
    server step (the config's ``lr`` for distributed SGD, ``server_lr`` for federated averaging, 1 for gossip, whose
    nodes step themselves), the aggregation ``rule``, the ``attack``, the server ``optimizer`` and the ``stages``
    (in the order they act)."""

    algorithm: RoundAlgorithm
    server_lr: Callable[[int], float]
    rule: Aggregator
    attack: Attack | DataAttack
    optimizer: optim.ServerOptimizer
    stages: tuple[Stage, ...] = field(default_factory=tuple)
    shards: list[Tensor] | None = None
    """The workers' shards, when checking that the data splits as asked built them already (a grid of one run:
    :func:`phalanx.experiments.build.check_points`)."""
    model: nn.Module | None = None
    """The initial model, when checking that it builds on the data set built it already (likewise)."""
    built_on: object = None
    """The data set object that ``shards`` and ``model`` were built on (the run uses them only on that one)."""


def plan(shape: RunShape, algorithm: RoundAlgorithm, rule: Aggregator, attack: Attack | DataAttack,
         server_lr: Callable[[int], float]) -> Plan:
    """What the stages' configuration and checks read of the run whose shape is ``shape``, before anything large is
    built."""
    norm = shape.norm
    kind = NORMS.get(norm) if isinstance(norm, str) else None
    return Plan(algorithm, rule, attack, shape.workers, shape.byzantine, shape.rounds, server_lr, shape.lr, kind,
                "model_params.norm", norm)


def projections() -> list[str]:
    """The stages ``server_projection`` may name: every registered server projection."""
    return [n for n in registry.names() if issubclass(registry.get(n), ServerProjection)]


def build(specs: Specs | RunConfig, cfg: RunConfig | None = None) -> Components:
    """The components of a config read into ``specs`` (:func:`phalanx.experiments.specs.read`; a RunConfig is read
    here), each checked as it is built (a one-line :class:`ConfigError` naming its key), and what ties them
    (:meth:`~phalanx.training.algorithms.base.RoundAlgorithm.check_config`). The algorithm's hooks receive its
    section (:class:`~phalanx.experiments.specs.AlgorithmSpec`), or ``cfg`` itself for a class of one's own whose
    hooks predate the sections (:attr:`Specs.legacy_hooks`: the caller passes it then)."""
    if isinstance(specs, RunConfig):
        cfg = specs
        specs = read(cfg)
    spec = specs.algorithm
    view: Any = cfg if specs.legacy_hooks and cfg is not None else spec  # what the algorithm's hooks receive
    check_honest(spec.workers, spec.byzantine)
    cls = spec.cls
    rule = cls.make_rule(spec.aggregator, spec.f)
    configure = cls.from_config if spec.algorithm in builtin.BUILT_IN else cls.from_params  # keys | algorithm_params
    algorithm, server_lr = configure(view, LRSchedule(spec.lr, spec.schedule, spec.rounds, spec.step_every))
    attack = cls.make_attack(spec.attack, spec.attack_params)
    algorithm.check_config(view, rule, attack)
    run = plan(specs.shape, algorithm, rule, attack, server_lr)
    name, section, name_of = legacy.optimizer(specs.flat, cls.decentralized)
    optimizer = optim.build(name, section, run, name_of)
    stages = tuple(registry.build(registry.from_config(s.name, s.key), s.params, run, s.key, s.name_of)
                   for s in legacy.stage_sections(specs.flat, projections))
    return Components(algorithm, server_lr, rule, attack, optimizer, stages)


def processes(cfg: RunConfig) -> int:
    """How many processes a torchrun run of ``cfg`` has, as its algorithm says
    (:meth:`~phalanx.training.algorithms.base.RoundAlgorithm.processes`: one per worker, or per client slot of a
    federated round — rank 0 is also the server): :attr:`phalanx.experiments.specs.RunShape.processes`."""
    return read(cfg).shape.processes

