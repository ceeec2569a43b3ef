"""A run config read once into per-concern values (issue 39, "a long way for a run's config"): the data, the model,
the device, the run's shape, the algorithm's section and the flat keys of earlier releases, each a frozen value that
the checks and builders downstream take instead of the whole :class:`~phalanx.experiments.schema.RunConfig`.

:func:`read` is the one function that reads a validated-by-schema config for the code after it: validation
(:func:`phalanx.experiments.config.validate`) calls it once and carries the result in the
:class:`~phalanx.experiments.validrun.ValidRun`; ``resolve_device``, ``load_data``, the data split, the model and its
memory check, the components and their plan take the value of their concern. So the config's way from
``phalanx run`` to the built algorithm, rule and transport is one descent (``scripts/seam_counts.py`` counts it;
``tests/test_seam_counts.py`` pins the bound and counts a builder that takes the config again).

A round algorithm's hooks (``from_config`` / ``from_params``, ``check_config``, ``processes``) receive the
algorithm's section, :class:`AlgorithmSpec`: the config keys an algorithm reads, by the same attribute names as on
the config. A class of one's own that overrides a hook in its own module predates the section and may read any key:
it receives the config itself, with a :class:`DeprecationWarning` (:func:`needs_config`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from phalanx.errors import ConfigError
from phalanx.experiments import legacy
from phalanx.experiments.concerns import (  # the values, each with the section it reads (declared there)
    AlgorithmSpec,
    DataSpec,
    DeviceSpec,
    ModelSpec,
    RunShape,
    declared,
)
from phalanx.experiments.schema import RunConfig
from phalanx.training import metric_rows
from phalanx.training.algorithms import builtin

__all__ = ["CONFIG_COLUMNS", "AlgorithmSpec", "DataSpec", "DeviceSpec", "ModelSpec", "RunShape", "Specs", "declared",
           "needs_config", "read"]


CONFIG_COLUMNS = (
    "dataset", "model", "workers", "byzantine", "f", "aggregator", "attack", "partition", "alpha", "rounds",
    "batch_size", "lr", "momentum", "schedule", "seed",
)
"""The config values repeated on every metric row (so rows from many runs can be queried together)."""

HOOKS = ("from_config", "from_params", "check_config", "processes")
"""The round algorithm's hooks that took the run config before the sections (the plug-in interface)."""

OWN_KEYS = builtin.own_keys()


@dataclass(frozen=True)
class Specs:
    """A run config read once (:func:`read`): each concern's value, the flat keys of earlier releases
    (:class:`~phalanx.experiments.legacy.Flat`), the metric ``columns`` and the ``tracking`` names with their
    parameters."""

    data: DataSpec
    model: ModelSpec
    device: DeviceSpec
    shape: RunShape
    algorithm: AlgorithmSpec
    flat: legacy.Flat
    columns: dict[str, Any]
    tracking: tuple[list[str], dict[str, Any]]
    legacy_hooks: bool
    """Whether the algorithm's class overrides a hook in a module of its own (:func:`needs_config`): then its hooks
    receive the config, and the code that calls them takes it too."""


def needs_config(cls: type) -> bool:
    """Whether ``cls`` (a round algorithm's class) overrides one of :data:`HOOKS` outside Phalanx: a class of one's
    own written for the hooks that took the run config, which may read any key of it. It keeps receiving the config,
    with a :class:`DeprecationWarning` (the hooks receive :class:`AlgorithmSpec`; it has the keys they read, by
    the same names)."""
    for hook in HOOKS:
        owner = next((k for k in cls.__mro__ if hook in k.__dict__), None)
        if owner is not None and not owner.__module__.startswith("phalanx."):
            warnings.warn(f"{cls.__name__}.{hook} overrides a hook of a round algorithm that receives the run config; "
                          "it receives the algorithm's section (phalanx.experiments.specs.AlgorithmSpec) in a later "
                          "release: read only the keys it has", DeprecationWarning, stacklevel=2)
            return True
    return False


def read(cfg: RunConfig) -> Specs:
    """``cfg`` read once into its per-concern values (the module's docstring). The values copy what they read (a
    table is a new dict): nothing downstream holds the config."""
    cls = cfg.algorithm_class
    algorithm = AlgorithmSpec(
        cfg.algorithm, cls, dict(cfg.algorithm_params), cfg.workers, cfg.byzantine, cfg.f, cfg.aggregator, cfg.attack,
        dict(cfg.attack_params), cfg.attack_knowledge, cfg.engine, cfg.topology, cfg.batch_size, cfg.lr, cfg.momentum,
        cfg.weight_decay, cfg.schedule, cfg.rounds, cfg.step_every, {k: getattr(cfg, k) for k in OWN_KEYS},
    )
    flat = legacy.read(cfg)
    legacy_hooks = needs_config(cls)
    n = int(cls.processes(cfg if legacy_hooks else algorithm))
    keys = CONFIG_COLUMNS + builtin.columns(cfg.algorithm) + legacy.row_columns(flat)
    columns = {k: getattr(cfg, k) for k in keys}
    if cfg.attack_knowledge != "omniscient":  # only where set: the rows of every other run are as before
        columns["attack_knowledge"] = cfg.attack_knowledge
    for key, value in columns.items():  # (every metric row repeats them: refused here, not at round 0)
        if isinstance(value, str) and len(value) > metric_rows.MAX_TEXT_CHARS:
            raise ConfigError(key, value, f"at most {metric_rows.MAX_TEXT_CHARS:,} characters (every metric row "
                              "repeats it)")
    model_params = dict(cfg.model_params)
    return Specs(
        data=DataSpec(cfg.dataset, dict(cfg.dataset_params), cfg.data_root, cfg.download, cfg.workers, cfg.partition,
                      cfg.alpha, cfg.classes_per_worker, cfg.seed, cfg.algorithm, cls.samples_population),
        model=ModelSpec(cfg.model, model_params, cfg.seed, cfg.loss, cfg.dataset, cfg.workers, n),
        device=DeviceSpec(cfg.device, cfg.engine, cfg.topology, cfg.backend, cfg.keys is not None, cfg.algorithm,
                          cls.runs_on_device),
        shape=RunShape(cfg.workers, cfg.byzantine, cfg.rounds, cfg.eval_every, cfg.eval_clients, cfg.lr,
                       model_params.get("norm"), n),
        algorithm=algorithm, flat=flat, columns=columns,
        tracking=(list(cfg.tracking), dict(cfg.tracking_params)), legacy_hooks=legacy_hooks,
    )
