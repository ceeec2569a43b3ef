"""From a validated config to objects: the one place where names (``"cwtm"``, ``"alie"``, ``"digits"``) become an
:class:`~phalanx.training.Experiment`.

Randomness: the config's one seed is split into named streams (:mod:`phalanx.training.streams`): the data split
draws from ``partition``, the initial model from ``init``, so changing the attack changes neither.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import torch

from phalanx import data, models
from phalanx.attacks.base import DataAttack
from phalanx.data.population import Population
from phalanx.errors import ConfigError, PhalanxError
from phalanx.experiments import validrun
from phalanx.experiments.components import processes  # noqa: F401 - the process count of a config, as before
from phalanx.experiments.schema import RunConfig
from phalanx.experiments.specs import DataSpec, DeviceSpec, ModelSpec, Specs, read
from phalanx.experiments.validrun import ValidRun
from phalanx.memory import MEMORY_SHARE, available_memory
from phalanx.training import adapters, devices, losses
from phalanx.training.experiment import Experiment
from phalanx.training.streams import generator, stream_seed


def resolve_device(cfg: DeviceSpec | RunConfig, local_rank: int | None = None) -> torch.device:
    """The device a run of ``cfg`` computes on, here: ``device`` resolved once
    (:func:`phalanx.training.devices.resolve`; a :class:`ConfigError` naming ``device`` when this machine lacks it).
    ``"auto"`` picks CUDA when available and the run can use it (:func:`~phalanx.experiments.config.check_device`),
    else the CPU; on the torchrun engine ``"cuda"`` is the rank's ``cuda:LOCAL_RANK`` (``local_rank``), the device
    its NCCL all-gathers use. ``cfg``: the run's :class:`~phalanx.experiments.specs.DeviceSpec` (a RunConfig is read
    into it)."""
    if isinstance(cfg, RunConfig):
        cfg = read(cfg).device
    on_device = cfg.on_device
    if cfg.device == "auto" and (not on_device or (cfg.engine == "torchrun" and cfg.topology != "serverless")):
        return devices.CPU
    return devices.resolve(cfg.device, local_rank=local_rank if cfg.engine == "torchrun" else None)


def load_data(spec: DataSpec | RunConfig) -> data.Dataset | Population:
    """The config's data set: its loader with the config's root, download flag and ``dataset_params`` (``spec``:
    the run's :class:`~phalanx.experiments.specs.DataSpec`; a RunConfig is read into it)."""
    if isinstance(spec, RunConfig):
        spec = read(spec).data
    return data.load(spec.name, root=spec.root, download=spec.download, params=spec.params)


def from_config(
    run: ValidRun | RunConfig, dataset: data.Dataset | Population | None = None, *, local_rank: int | None = None,
) -> Experiment:
    """The experiment a validated run describes (the data set is loaded unless given), on the config's device
    (:func:`resolve_device`; ``local_rank``: a torchrun rank's ``LOCAL_RANK``), with the components validating it
    built (:func:`phalanx.experiments.validrun.components`). A RunConfig is validated here first
    (:func:`phalanx.experiments.config.validate`)."""
    if isinstance(run, RunConfig):
        from phalanx.experiments.config import validate  # config imports this module: validating is its job

        run = validate(run)
    cfg, specs = run.cfg, run.specs
    device = resolve_device(specs.device, local_rank)
    ds = dataset if dataset is not None else load_data(specs.data)
    check_batch_memory(specs, ds, device)
    parts = validrun.components(run)  # the objects validating it built, else (a second run) its own
    checked = parts.built_on is ds  # the one-run grid's check split the data and built the model on ds already
    shards = parts.shards if checked and parts.shards is not None else _split(specs.data, ds)
    model = parts.model if checked and parts.model is not None else _model(specs.model, ds)
    spec, cls = specs.algorithm.aggregator, specs.algorithm.cls
    return Experiment(
        model=model, loss=losses.get(cfg.loss), dataset=ds, rule=adapters.rule_for(parts.rule, model),
        workers=cfg.workers, byzantine=cfg.byzantine, attack=parts.attack, rounds=cfg.rounds, algorithm=parts.algorithm,
        optimizer=parts.optimizer, lr=parts.server_lr, shards=shards, seed=cfg.seed, eval_every=cfg.eval_every,
        rule_for=lambda f: adapters.rule_for(cls.make_rule(spec, f), model), columns=dict(run.columns),
        eval_clients=cfg.eval_clients, device=device, attack_knowledge=cfg.attack_knowledge, stages=parts.stages,
    )


def _split(cfg: DataSpec, ds: data.Dataset | Population) -> list[torch.Tensor] | None:
    """The workers' shards of ``ds`` as ``cfg`` (the run's :class:`~phalanx.experiments.specs.DataSpec`) splits it
    (drawn from the ``partition`` stream). ``natural``: each worker is one of the data set's users (all of them, or
    ``workers`` drawn from the stream); a data set without user ids is a ConfigError naming ``partition``. A client
    population: None (no shards: each client's data are its own), its size checked against ``workers``, and a split
    other than the default refused."""
    if isinstance(ds, Population):
        if not cfg.samples_population:
            raise ConfigError("algorithm", cfg.algorithm, f"one that samples a few clients a round and keeps nothing "
                              f"per client ('fedavg') with the population {ds.name!r}")
        if cfg.partition != "iid":
            raise ConfigError("partition", cfg.partition, f"'iid' (the default) with the population {ds.name!r}: "
                              "each client's data are its own, nothing is split")
        ds.check_size(cfg.workers)
        return None
    seed = stream_seed(cfg.seed, "partition") % (2**31)
    if cfg.partition == "natural":
        if not ds.has_users:
            raise ConfigError("partition", "natural", f"iid, dirichlet or pathological for dataset {cfg.name!r}: "
                              "'natural' needs a data set whose samples carry writer/speaker ids (femnist, "
                              "shakespeare, sent140, or data.from_hf(..., user=...))")
        return data.partition(ds.train_y, cfg.workers, "natural", seed=seed, users=ds.train_users)
    return data.partition(ds.train_y, cfg.workers, cfg.partition, alpha=cfg.alpha,
                          classes_per_worker=cfg.classes_per_worker, seed=seed)


ROW_BYTES_PER_PARAMETER = 32
"""What a simulated round holds per parameter and per worker at its peak, at least: 8 float32 copies of each
worker's row (its gradient and the activations vmap keeps for it, its momentum, the vector it sends, the rule's
working copies). Measured: 46–56 bytes per parameter and worker (DSGD, cwtm, the MLP with 300,010 parameters on
digits, 10 and 40 workers: peak resident memory), so this bound refuses no run that would fit."""


def check_model_memory(cfg: ModelSpec | RunConfig, ds: data.Dataset | Population) -> None:
    """Refuse (one line, before the model is built) a run whose model, times the rows its workers hold each round
    (:data:`ROW_BYTES_PER_PARAMETER` × the run's processes, plus the model itself), cannot fit in the memory this
    process can still get; counted on the ``meta`` device (:func:`phalanx.models.planned_parameters`). ``cfg``: the
    run's :class:`~phalanx.experiments.specs.ModelSpec` (a RunConfig is read into it)."""
    if isinstance(cfg, RunConfig):
        cfg = read(cfg).model
    d = models.planned_parameters(cfg.name, ds.input_shape, ds.num_classes, **cfg.params)
    avail = available_memory()
    if d is None or avail is None:
        return
    rows = cfg.processes + 1
    need = ROW_BYTES_PER_PARAMETER * d * rows
    if need > MEMORY_SHARE * avail:
        raise ConfigError(
            "model_params", cfg.params, f"a model that fits with {cfg.workers} workers: {cfg.name!r} with "
            f"these parameters has {d:,} parameters, and {rows - 1} workers' rows need at least ~{need / 1e9:.1f} GB; "
            f"{avail / 1e9:.1f} GB are available", "a smaller model, or fewer workers",
        )


DRAW_BYTES_PER_SAMPLE = 24
"""What drawing one sample of a batch holds in this process's memory whatever the device: its uniform draw
(float64), its position in the shard and its index (int64 each) — :func:`phalanx.training.shards.sample_batches`.
On the CPU the sample's float32 input and its label (int64, 8 bytes) are gathered there too."""


def check_batch_memory(specs: Specs, ds: data.Dataset | Population, device: torch.device | None = None) -> None:
    """Refuse (one line naming ``batch_size``, before anything is drawn) a batch size whose round's batches cannot
    fit in the memory this process can still get: each honest worker of a round (the run's processes less its
    Byzantine ones, at least one) draws ``batch_size`` samples at once, with replacement, each holding at least
    :data:`DRAW_BYTES_PER_SAMPLE` and — on the CPU ``device`` (None: not known here, not counted) — its float32
    input and label: a lower bound, as the model's is (:func:`check_model_memory`). ``batch_size = 10¹²`` passed
    validation and failed at the first round in the allocator, naming no key (a review)."""
    avail = available_memory()
    if avail is None:
        return
    rows = max(1, specs.shape.processes - specs.algorithm.byzantine)
    inputs = 1
    for side in ds.input_shape:
        inputs *= int(side)
    on_cpu = device is not None and device.type == "cpu"
    per_sample = DRAW_BYTES_PER_SAMPLE + (4 * inputs + 8 if on_cpu else 0)
    most = int(MEMORY_SHARE * avail) // (rows * per_sample)
    batch = specs.algorithm.batch_size
    if batch > most:
        held = f"a {tuple(ds.input_shape)} float32 input, its label and draw" if on_cpu else "its draw"
        raise ConfigError("batch_size", batch, f"1..{most:,}: each round {rows} honest worker(s) draw batch_size "
                          f"samples at once, at least {per_sample:,} bytes each in memory ({held}), and "
                          f"{avail / 1e9:.1f} GB are available")


def _model(cfg: ModelSpec, ds: data.Dataset | Population) -> torch.nn.Module:
    """The initial model of ``cfg`` (the run's :class:`~phalanx.experiments.specs.ModelSpec`) on ``ds``'s inputs
    (drawn from the ``init`` stream), once its memory is checked (:func:`check_model_memory`)."""
    check_model_memory(cfg, ds)
    return models.make(cfg.name, ds.input_shape, ds.num_classes, generator=generator(cfg.seed, "init"),
                       **cfg.params)


def check_points(
    runs: Sequence[ValidRun | RunConfig], load: Callable[[DataSpec], data.Dataset | Population] | None = None, *,
    here: bool = True,
) -> None:
    """What validating each config alone cannot see, checked for every point of a grid before the first run starts:
    its data set loads, it can be split among the workers as asked (enough samples for every worker), a data attack
    fits the data (:meth:`~phalanx.attacks.base.DataAttack.prepare`: a trigger no larger than the image), and the
    model builds with its parameters on the data set's inputs. Each distinct data split and model is checked once; a
    grid of one validated run keeps the split and the model in its components, for its run to train. With
    ``here`` (the runs train on this machine; not for a Slurm array, whose nodes may have GPUs that this login node
    lacks), its ``device`` exists here (:func:`resolve_device`).

    ``load`` gives a config's data set from its :class:`~phalanx.experiments.specs.DataSpec` (default
    :func:`load_data`; a sweep passes its per-process cache).
    A failure is a :class:`ConfigError` that says which point of the grid it is.
    """
    load = load or load_data
    splits: set[tuple[Any, ...]] = set()
    nets: set[tuple[Any, ...]] = set()
    cfgs = [r.cfg if isinstance(r, ValidRun) else r for r in runs]
    read_runs = [r.specs if isinstance(r, ValidRun) else read(r) for r in runs]  # each run's values, read once
    for i, (cfg, specs) in enumerate(zip(cfgs, read_runs)):
        try:
            device = resolve_device(specs.device) if here else None
            ds = load(specs.data)
            check_batch_memory(specs, ds, device)
            split = specs.data.split_key()
            one = runs[0] if len(runs) == 1 else None  # one run: it trains what is checked here
            parts = one.parts if isinstance(one, ValidRun) and not one._taken else None
            if split not in splits:
                shards = _split(specs.data, ds)
                splits.add(split)
                if parts is not None:
                    parts.shards, parts.built_on = shards, ds
            spec = specs.algorithm
            attack = parts.attack if parts is not None else spec.cls.make_attack(spec.attack, spec.attack_params)
            if isinstance(attack, DataAttack):  # a trigger larger than the image, a class not there
                attack.prepare(ds.train_x, ds.train_y, ds.num_classes)
            net = (specs.model.name, json.dumps(specs.model.params, sort_keys=True), ds.input_shape, ds.num_classes)
            if net not in nets:
                model = _model(specs.model, ds)
                nets.add(net)
                if parts is not None:
                    parts.model, parts.built_on = model, ds
        except ConfigError as exc:
            if type(exc) is not ConfigError:  # a more specific error (a data set not found) says enough itself
                raise
            where = f" (point {i + 1} of {len(cfgs)}: {cfg.label()})" if len(cfgs) > 1 else ""
            parameter = {"n_workers": "workers", "name": "dataset"}.get(exc.parameter, exc.parameter)
            raise ConfigError(parameter, exc.value, exc.allowed + where, exc.hint) from None
        except PhalanxError:  # typed, and naming its own cause: a bad data file (DataFormatError names the file)
            raise
        except (TypeError, ValueError, RuntimeError) as exc:  # a model builder that fails on these inputs
            where = f"point {i + 1} of {len(cfgs)}: " if len(cfgs) > 1 else ""
            raise ConfigError(
                "model_params", cfg.model_params, f"parameters with which {cfg.model!r} builds on {cfg.dataset} "
                f"({where}{type(exc).__name__}: {str(exc)[:200]})",
            ) from None


def check_engine(cfg: DeviceSpec | RunConfig, count: int | None = None) -> None:
    """Refuse a config of another engine: ``train`` runs every worker in this process (the simulated engine).
    ``cfg``: the run's :class:`~phalanx.experiments.specs.DeviceSpec` with its process ``count`` (a RunConfig is
    read into both)."""
    if isinstance(cfg, RunConfig):
        read_run = read(cfg)
        cfg, count = read_run.device, read_run.shape.processes
    if cfg.engine != "simulated":
        raise ConfigError(
            "engine", cfg.engine, "'simulated' in `phalanx run` / `phalanx sweep` / train()",
            "a torchrun run has one process per worker (per client slot in federated rounds): start it with "
            f"`phalanx launch CONFIG` or `torchrun --nproc-per-node {count} -m phalanx.distributed.worker "
            "CONFIG` "
            "(docs/distributed.md)",
        )
