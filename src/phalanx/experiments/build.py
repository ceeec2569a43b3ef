"""From a validated config to objects: the one place where names (``"cwtm"``, ``"alie"``, ``"digits"``) become an
:class:`~phalanx.training.Experiment`.

Randomness: the config's one seed is split into named streams (:mod:`phalanx.training.streams`): the data split
draws from ``partition``, the initial model from ``init``, so changing the attack changes neither.
"""

from __future__ import annotations

from typing import Any

from phalanx import aggregators, attacks, data, models
from phalanx.errors import ConfigError
from phalanx.experiments.config import RunConfig
from phalanx.training import optim
from phalanx.training.dsgd import DSGD
from phalanx.training.experiment import Experiment
from phalanx.training.schedule import LRSchedule
from phalanx.training.streams import generator, stream_seed

CONFIG_COLUMNS = (
    "dataset", "model", "workers", "byzantine", "f", "aggregator", "attack", "partition", "alpha", "rounds",
    "batch_size", "lr", "momentum", "schedule", "seed",
)
"""The config values repeated on every metric row (so rows from many runs can be queried together)."""


def config_columns(cfg: RunConfig) -> dict[str, Any]:
    """The values of :data:`CONFIG_COLUMNS` in ``cfg``."""
    return {k: getattr(cfg, k) for k in CONFIG_COLUMNS}


def from_config(cfg: RunConfig, dataset: data.Dataset | None = None) -> Experiment:
    """The experiment a config describes (the data set is loaded unless given)."""
    ds = dataset if dataset is not None else data.load(cfg.dataset, root=cfg.data_root, download=cfg.download)
    shards = data.partition(
        ds.train_y, cfg.workers, cfg.partition, alpha=cfg.alpha, classes_per_worker=cfg.classes_per_worker,
        seed=stream_seed(cfg.seed, "partition") % (2**31),
    )
    model = models.make(
        cfg.model, ds.input_shape, ds.num_classes, generator=generator(cfg.seed, "init"), **cfg.model_params,
    )
    spec = cfg.aggregator
    return Experiment(
        model=model, dataset=ds, rule=aggregators.make(spec, f=cfg.f), workers=cfg.workers, byzantine=cfg.byzantine,
        attack=attacks.make(cfg.attack, **cfg.attack_params), rounds=cfg.rounds,
        algorithm=DSGD(batch_size=cfg.batch_size, momentum=cfg.momentum, weight_decay=cfg.weight_decay),
        optimizer=optim.make(cfg.server_optimizer, momentum=cfg.server_momentum,
                             weight_decay=cfg.server_weight_decay),
        lr=LRSchedule(cfg.lr, cfg.schedule, cfg.rounds, cfg.step_every), shards=shards, seed=cfg.seed,
        eval_every=cfg.eval_every, rule_for=lambda f: aggregators.make(spec, f=f), columns=config_columns(cfg),
    )


def check_engine(cfg: RunConfig) -> None:
    """Refuse a config of another engine: ``train`` runs every worker in this process (the simulated engine)."""
    if cfg.engine != "simulated":
        raise ConfigError(
            "engine", cfg.engine, "'simulated' in `phalanx run` / `phalanx sweep` / train()",
            "a torchrun run has one process per worker: start it with `phalanx launch --workers "
            f"{cfg.workers} CONFIG` or `torchrun --nproc-per-node {cfg.workers} -m phalanx.distributed.worker CONFIG` "
            "(docs/distributed.md)",
        )
