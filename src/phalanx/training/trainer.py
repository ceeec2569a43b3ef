"""Train one configuration: build data, model, rule and attack from a :class:`RunConfig`, run the rounds, evaluate.

Randomness: the config's one seed is split into named streams (partition, init, batches, attack, server), so
changing the attack does not change the data split or the initial model. Same config and seed → same result.

Persistence (when given a run directory): the resolved config, a manifest (versions, seed, data fingerprint),
``metrics.jsonl`` (one row per evaluated round, rewritten atomically), ``metrics.parquet`` at the end, and a
checkpoint (``checkpoint.safetensors``, atomic) every ``checkpoint_every`` rounds. A killed run resumes from its
last checkpoint: the random streams are restored with it, so the resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from phalanx import aggregators, attacks, data, models
from phalanx.errors import ConfigError
from phalanx.experiments import store
from phalanx.training.config import RunConfig
from phalanx.training.memory import tune_allocator
from phalanx.training.problem import Problem
from phalanx.training.round import RoundState, WorkerData, run_round
from phalanx.training.schedule import learning_rate

STREAMS = ("partition", "init", "batches", "attack", "server")


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for a named random stream, derived from the run's seed."""
    digest = hashlib.sha256(f"phalanx:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(seed: int, stream: str) -> torch.Generator:
    """A CPU generator for one named stream."""
    return torch.Generator().manual_seed(stream_seed(seed, stream))


@dataclass
class Setup:
    """Everything built from a config before the first round."""

    cfg: RunConfig
    dataset: data.Dataset
    worker_data: WorkerData
    problem: Problem
    rule: aggregators.Aggregator
    attack: attacks.Attack | attacks.DataAttack
    reference_batch: tuple[torch.Tensor, torch.Tensor] | None


def build(cfg: RunConfig, dataset: data.Dataset | None = None) -> Setup:
    """Load the data (unless given), split it, build the model, the rule and the attack."""
    ds = dataset if dataset is not None else data.load(cfg.dataset, root=cfg.data_root, download=cfg.download)
    shards = data.partition(
        ds.train_y, cfg.workers, cfg.partition, alpha=cfg.alpha, classes_per_worker=cfg.classes_per_worker,
        seed=stream_seed(cfg.seed, "partition") % (2**31),
    )
    model = models.make(
        cfg.model, ds.input_shape, ds.num_classes, generator=generator(cfg.seed, "init"), **cfg.model_params,
    )
    rule = aggregators.make(cfg.aggregator, f=cfg.f)
    attack = attacks.make(cfg.attack, **cfg.attack_params)
    reference = None
    if "reference" in rule.context_keys:  # FLTrust: the server's small trusted root data set (Cao et al. 2021)
        g = generator(cfg.seed, "server")
        idx = torch.randperm(ds.train_y.numel(), generator=g)[: min(100, ds.train_y.numel())]
        reference = (ds.train_x[idx], ds.train_y[idx])
    return Setup(
        cfg, ds, WorkerData(ds.train_x, ds.train_y, shards, ds.num_classes), Problem(model), rule, attack, reference,
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


Progress = Callable[[int, int, dict[str, Any] | None], None]


@dataclass
class Start:
    """Where a run begins: the state, the random streams' states, the metric rows so far, and whether it resumed."""

    state: RoundState
    gens: dict[str, torch.Tensor]
    rows: list[dict[str, Any]]
    resumed: bool


def start_run(setup: Setup, out: Path | None) -> Start:
    """A fresh start (θ₀, fresh ``batches`` / ``attack`` streams, the round-0 evaluation), or, when ``out`` holds a
    checkpoint, the state, streams and rows saved there (``out`` is prepared first: a directory of another config
    or data set is refused). Both engines start here."""
    cfg = setup.cfg
    state = RoundState(theta=setup.problem.initial_theta(), momentum=None, previous=None, round=0)
    gens = {name: generator(cfg.seed, name).get_state() for name in ("batches", "attack")}
    rows: list[dict[str, Any]] = []
    resumed = None
    if out is not None:
        store.prepare_run_dir(out, cfg, setup.dataset.fingerprint())
        resumed = store.load_checkpoint(out)
        if resumed is not None:
            state, saved, rows = resumed
            gens.update(saved)
    if state.round == 0:
        rows = [evaluate_row(setup, state, None, store.config_columns(cfg))]
    return Start(state, gens, rows, resumed is not None)


def train(
    cfg: RunConfig, run_dir: str | Path | None = None, *, dataset: data.Dataset | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Train one configuration; return the metric rows (one per evaluated round).

    With ``run_dir``, results and checkpoints are written there and an interrupted run resumes from its last
    checkpoint. ``progress(round, rounds, row_or_None)`` is called after every round. This is the simulated engine;
    a config with ``engine = "torchrun"`` is started with ``phalanx launch`` or torchrun (:func:`check_engine`).
    """
    check_engine(cfg)
    tune_allocator()
    setup = build(cfg, dataset)
    out = Path(run_dir) if run_dir is not None else None
    start = start_run(setup, out)
    state, rows = start.state, start.rows
    batch_gen, attack_gen = torch.Generator(), torch.Generator()
    batch_gen.set_state(start.gens["batches"])
    attack_gen.set_state(start.gens["attack"])
    columns = store.config_columns(cfg)
    while state.round < cfg.rounds:
        t = state.round
        measure = cfg.evaluates(t)
        state, result = run_round(
            state, setup.problem, setup.worker_data, setup.rule, setup.attack,
            workers=cfg.workers, byzantine=cfg.byzantine, f=cfg.f, batch_size=cfg.batch_size,
            lr=learning_rate(cfg, t), momentum=cfg.momentum, weight_decay=cfg.weight_decay,
            batch_gen=batch_gen, attack_gen=attack_gen, reference_batch=setup.reference_batch, measure=measure,
        )
        row = evaluate_row(setup, state, result, columns) if measure else None
        if row is not None:
            rows.append(row)
        if out is not None and cfg.checkpoints(state.round):
            store.save_checkpoint(out, state, {"batches": batch_gen.get_state(), "attack": attack_gen.get_state()},
                                  rows)
        if progress is not None:
            progress(state.round, cfg.rounds, row)
    if out is not None:
        store.finish_run(out, rows)
    return rows


def evaluate_row(setup: Setup, state: RoundState, result: Any, columns: dict[str, Any]) -> dict[str, Any]:
    """One metric row: θ's test accuracy and loss, the round's measurements (``result``) and the config columns."""
    acc, loss = setup.problem.evaluate(state.theta, setup.dataset.test_x, setup.dataset.test_y)
    row: dict[str, Any] = {
        "round": state.round, "test_accuracy": acc, "test_loss": loss,
        "agg_error": result.agg_error if result is not None else None,
        "byz_share": result.byz_share if result is not None else None,
        "detection_auc": result.detection_auc if result is not None else None,
    }
    row.update(columns)
    return row
