"""An experiment, built from objects: model and loss, data and its split, rule, attack, round algorithm, server
optimizer, schedule. A TOML config is one way to build it (``phalanx.experiments.from_config``, the only place
where names become objects); the Python API builds it directly::

    from phalanx import aggregators, attacks, data, models
    from phalanx.training import Experiment, run

    ds = data.load("digits")
    exp = Experiment(
        model=models.make("mlp", ds.input_shape, ds.num_classes), dataset=ds, workers=10, byzantine=2,
        rule=aggregators.make("cwtm", f=2), attack=attacks.make("alie"), rounds=100,
    )
    rows = run(exp)      # one metric row per evaluated round

``workers`` is n, ``byzantine`` how many of them actually attack (the last indices), and ``rule.f`` what the rule
is configured to tolerate — three separate numbers (Yang, Shi & Li, ICML 2025, measure the gap between the last
two).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor, nn

from phalanx.aggregators.base import Aggregator
from phalanx.attacks.base import Attack, DataAttack
from phalanx.attacks.none import NoAttack
from phalanx.data.partition import partition
from phalanx.data.population import Population
from phalanx.errors import ConfigError
from phalanx.training import devices, metric_rows
from phalanx.training.algorithms.base import RoundAlgorithm, check_knowledge, check_population, check_stop
from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.algorithms.fedbn import local_norms
from phalanx.training.norm_stats import NormStats
from phalanx.training.optim import SGD, ServerOptimizer
from phalanx.training.population import PopulationData
from phalanx.training.problem import Loss, Problem
from phalanx.training.schedule import LRSchedule
from phalanx.training.shards import WorkerData
from phalanx.training.stages.base import Plan, ServerStage, Stage, WorkerStage
from phalanx.training.streams import RESERVED, generator, stream_seed
from phalanx.validate import check_int

S = TypeVar("S", bound=Stage)

ROOT_SAMPLES = 100
"""Size of the server's trusted root set for rules that need a reference gradient (FLTrust: Cao et al., NDSS
2021, use 100 root samples)."""


class TrainTest(Protocol):
    """What an experiment needs of a data set (``phalanx.data.Dataset`` has it)."""

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int


@dataclass(eq=False)
class Experiment:
    """One training run, as objects.

    Attributes
    ----------
    model: the ``nn.Module`` to train (or a :class:`~phalanx.training.problem.Problem` already wrapping one).
    dataset: training and test tensors (``train_x``, ``train_y``, ``test_x``, ``test_y``, ``num_classes``).
    rule: the server's aggregator (``rule.f`` is the f it tolerates).
    workers: n, all workers. byzantine: how many actually attack (the last indices).
    attack: what they do (default: nothing — they send honest rows).
    rounds: training rounds (server steps).
    algorithm: the round (default :class:`~phalanx.training.algorithms.dsgd.DSGD`).
    optimizer: the server optimizer (default plain SGD). lr: a learning rate, a schedule or any ``t ↦ ηₜ``.
    shards: each worker's sample indices (default: an IID split drawn from the ``partition`` stream).
    loss: ``loss(logits, y)``, mean over the batch (default cross-entropy). seed: the run's one seed.
    eval_every: measure and evaluate every this many rounds (and after the last).
    rule_for: builds the rule for another f (when workers go missing); default ``rule.with_f``.
    columns: values repeated on every metric row (a config's keys).
    eval_clients: a FedBN model (no global model): how many honest clients' own models are evaluated — all of
    them, or this many evenly spaced ones (:mod:`phalanx.training.algorithms.fedbn`).
    attack_knowledge: what a vector attack sees — ``"omniscient"`` (every honest vector of the round) or
    ``"colluders"`` (the Byzantine workers' own honest computations only; distributed SGD and federated averaging,
    in process).
    device: where the rounds compute (:mod:`phalanx.training.devices`: ``"cpu"``, ``"cuda"``, ``"cuda:N"``,
    ``"auto"`` or a ``torch.device``), resolved to a ``torch.device`` when the experiment is built. The model is
    moved there (in place), and so are the data set's training and test tensors, once (``data.x``, ``data.y``,
    ``test_x``, ``test_y``; ``dataset`` itself is left as given); random draws stay on the CPU. A CUDA device needs
    distributed SGD or federated averaging (decentralized rounds run on the CPU so far; ``"auto"`` picks it).
    stages: the round's stages beside the rule, the attack and the optimizer (:mod:`phalanx.training.stages`):
    worker-side ones on every update before it leaves its worker (client-level differential privacy,
    :class:`~phalanx.training.stages.privacy.ClientDP`), server-side ones on the aggregate and on θ after the step
    (CRFL, :class:`~phalanx.training.stages.crfl.CRFL`; fail closed,
    :class:`~phalanx.training.stages.fail_closed.FailClosed`), each checked against the run when it is built. The
    algorithm may bring its own (federated averaging's pooling of BatchNorm statistics): ``self.stages`` then lists
    every stage of the run, in the order they act.
    privacy: a worker stage placed first — the earlier spelling of client-level differential privacy
    (``privacy=ClientDP(...)``), kept; ``stages=[ClientDP(...), …]`` is the same run, and so is a config's
    ``dp_noise``. A stage that makes the update private (:attr:`~phalanx.training.stages.base.WorkerStage.privatizes`)
    acts first among the worker stages in every spelling: ``stages=[UpdateClip(...), ClientDP(...)]`` is refused
    (update_clip would see, and publish, the raw update).
    projection: a server stage added after ``stages`` — the earlier spelling of CRFL (``projection=CRFL(...)``),
    kept; ``stages=[CRFL(...)]`` is the same run.
    """

    model: nn.Module | Problem
    dataset: TrainTest
    rule: Aggregator
    workers: int
    byzantine: int = 0
    attack: Attack | DataAttack = field(default_factory=NoAttack)
    rounds: int = 100
    algorithm: RoundAlgorithm = field(default_factory=DSGD)
    optimizer: ServerOptimizer = field(default_factory=SGD)
    lr: float | Callable[[int], float] = 0.1
    shards: list[Tensor] | None = None
    loss: Loss | None = None
    seed: int = 0
    eval_every: int = 20
    rule_for: Callable[[int], Aggregator] | None = None
    columns: dict[str, Any] = field(default_factory=dict)
    eval_clients: int = 100
    device: str | torch.device = "cpu"
    attack_knowledge: str = "omniscient"
    privacy: WorkerStage | None = None
    projection: ServerStage | None = None
    stages: Sequence[Stage] = ()

    def __post_init__(self) -> None:
        for name in ("workers", "rounds", "eval_every", "eval_clients"):
            check_int(name, getattr(self, name), low=1)
        check_int("byzantine", self.byzantine, low=0)
        check_int("seed", self.seed, low=0)
        n = self.workers
        if not callable(self.rule) or not hasattr(self.rule, "f"):
            raise ConfigError("rule", self.rule, "an aggregator (phalanx.aggregators.make(...))")
        algo = self.algorithm
        if not isinstance(algo, RoundAlgorithm):
            raise ConfigError("algorithm", algo,
                              "a round algorithm (a phalanx.training.algorithms.base.RoundAlgorithm)")
        check_population(algo, n, self.byzantine, self.rule, algo.population(n), self.rule_named)
        if getattr(self.rule, "stateful", False) and algo.decentralized:
            raise ConfigError("aggregator", self.rule_named, f"a rule that keeps no state across rounds with "
                              f"{type(algo).__name__} (every node aggregates its own neighbours: there is no one "
                              "server to keep the rule's history)")
        if isinstance(self.dataset, Population):
            self._check_population(self.dataset)
        check_knowledge(self.attack_knowledge, self.attack, algo)
        check_stop(self.attack, algo)
        algo.check(self)
        on_device = algo.runs_on_device
        self.device = device = devices.resolve("cpu" if self.device == "auto" and not on_device else self.device)
        if device.type != "cpu" and not on_device:
            rounds = "decentralized rounds" if algo.decentralized else "its rounds"
            raise ConfigError("device", str(device),
                              f"'cpu' with {type(algo).__name__} ({rounds} run on the CPU so far)")
        self.problem = self.model if isinstance(self.model, Problem) else Problem(self.model, loss=self.loss)
        _move(self.problem, device)
        if NormStats.of(self.problem.model) is not None and not algo.pools_norm_stats:
            raise ConfigError("model", "a model with BatchNorm / Hybrid BN layers (FedNorm2d)", "a model without them "
                              f"with {type(algo).__name__} (their statistics are measured and pooled by federated "
                              "rounds: algorithm FedAvg)")
        if local_norms(self.problem) is not None and not algo.keeps_local_norms:
            raise ConfigError("model", "a FedBN model (FedNorm2d layers in 'fedbn' mode)", "a model without them with "
                              f"{type(self.algorithm).__name__} (every client keeps its BatchNorm layers between "
                              "federated rounds: algorithm FedAvg)")
        if isinstance(self.dataset, Population) and local_norms(self.problem) is not None:
            raise ConfigError("model", "a FedBN model (FedNorm2d layers in 'fedbn' mode)", "a model without them with "
                              "a client population (FedBN keeps a BatchNorm row per client: O(N))")
        if isinstance(self.lr, int | float) and not isinstance(self.lr, bool):
            self.lr = LRSchedule(float(self.lr), "constant", self.rounds)
        if not callable(self.lr):
            raise ConfigError("lr", self.lr, "a number > 0, an LRSchedule or a function of the round")
        self.stages = self._stages()
        ds = self.dataset
        self.data: WorkerData
        if isinstance(ds, Population):  # each client's data are its own, produced when it is sampled
            self.data = PopulationData(ds, n, device)
        else:
            if self.shards is None:
                self.shards = partition(ds.train_y, n, "iid", seed=stream_seed(self.seed, "partition") % (2**31))
            if len(self.shards) != n:
                raise ConfigError("shards", f"{len(self.shards)} shards", f"one per worker ({n})")
            self.data = WorkerData(ds.train_x.to(device), ds.train_y.to(device), list(self.shards), ds.num_classes)
        self.test_x, self.test_y = ds.test_x.to(device), ds.test_y.to(device)
        """The test set on the device (evaluation reads these, not ``dataset``'s)."""
        if isinstance(self.attack, DataAttack):  # a trigger larger than the image, a rare sub-population picked
            self.attack.prepare(ds.train_x, ds.train_y, ds.num_classes)
        self.reference_batch = self._root_batch() if "reference" in self.rule.context_keys else None

    def _check_population(self, population: Population) -> None:
        """A client population (:mod:`phalanx.training.population`) needs a round that samples a few clients and
        keeps nothing per client (federated averaging), no shards, and a population that has the ``workers``
        clients; refused in one line before anything per client is built."""
        algo = self.algorithm
        if not algo.samples_population:
            raise ConfigError("algorithm", type(algo).__name__, "one that samples a few clients a round and keeps "
                              "nothing per client (FedAvg) with a client population")
        if self.shards is not None:
            raise ConfigError("shards", f"{len(self.shards)} shards", "None with a client population (each client's "
                              "data are its own)")
        population.check_size(self.workers)

    def _stages(self) -> tuple[Stage, ...]:
        """Every stage of the run in the order they act: ``privacy`` (the earlier spelling: first, as a config's
        ``dp_noise`` is), ``stages``, then ``projection`` (the earlier spelling), then the algorithm's own; each of
        its kind, with its own name and streams, checked against the run
        (:meth:`~phalanx.training.stages.base.Stage.check`), a worker stage that privatizes the update before every
        other worker stage."""
        self.given_stages = tuple(self.stages)
        """The stages given as ``stages`` (the identity of a run directory of objects names them)."""
        given: list[tuple[str, Any, type]] = [("privacy", self.privacy, WorkerStage)]
        given += [("stages", s, Stage) for s in self.given_stages] + [("projection", self.projection, ServerStage)]
        out: list[Stage] = []
        for key, stage, kind in given:
            if stage is None:
                continue
            if not isinstance(stage, Stage) or not isinstance(stage, kind):
                raise ConfigError(key, stage, f"a {kind.__name__} (phalanx.training.stages) or None")
            out.append(stage)
        out += self.algorithm.stages(self)
        _private_first(out)
        plan = self.plan()
        names: set[str] = set()
        streams: set[str] = set(RESERVED)
        columns = {**dict.fromkeys(self.columns, "the config"), **dict.fromkeys(metric_rows.CORE, "the metric row")}
        for stage in out:
            if stage.name in names or streams & set(stage.streams):
                raise ConfigError("stages", repr(stage), "stages of distinct names, each drawing from streams of its "
                                  f"own (not {', '.join(sorted(streams))})")
            shared = sorted(set(stage.column_names()) & set(columns))
            if shared:  # one stage's column would overwrite another's on every evaluation row
                raise ConfigError("stages", repr(stage), f"stages whose metric columns are distinct ({shared[0]} is "
                                  f"also {columns[shared[0]]}'s)")
            names.add(stage.name)
            streams.update(stage.streams)
            columns.update(dict.fromkeys(stage.column_names(), stage.name))
            stage.check(plan)
        return tuple(out)

    def plan(self) -> Plan:
        """What a stage's check reads of this run (:class:`~phalanx.training.stages.base.Plan`)."""
        norm, value = None, None
        if NormStats.of(self.problem.model) is not None:
            norm, value = "stats", "a model with BatchNorm / Hybrid BN layers"
        elif local_norms(self.problem) is not None:
            norm, value = "fedbn", "a FedBN model (FedNorm2d layers in 'fedbn' mode)"
        assert callable(self.lr)
        return Plan(self.algorithm, self.rule, self.attack, self.workers, self.byzantine, self.rounds, self.lr, None,
                    norm, "model", value)

    @property
    def server_stages(self) -> tuple[ServerStage, ...]:
        """The run's server-side stages, in order."""
        return tuple(s for s in self.stages if isinstance(s, ServerStage))

    @property
    def worker_stages(self) -> tuple[WorkerStage, ...]:
        """The run's worker-side stages, in order."""
        return tuple(s for s in self.stages if isinstance(s, WorkerStage))

    def stage(self, kind: type[S]) -> S | None:
        """The run's first stage of class ``kind`` (a subclass too), or None."""
        return next((s for s in self.stages if isinstance(s, kind)), None)

    @property
    def rule_named(self) -> str:
        """The rule as the user named it: the config's ``aggregator`` spec (``"nnm>fldetector"``) for a run built
        from a config, else the rule object's repr (an API run passes the object)."""
        spec = self.columns.get("aggregator")
        return spec if isinstance(spec, str) else repr(self.rule)

    @property
    def f(self) -> int:
        """The number of Byzantine workers the rule is configured to tolerate."""
        return int(self.rule.f)

    @property
    def honest(self) -> int:
        """The number of honest workers, ``workers − byzantine``."""
        return self.workers - self.byzantine

    def learning_rate(self, t: int) -> float:
        """ηₜ of round t."""
        assert callable(self.lr)
        return float(self.lr(t))

    def evaluates(self, t: int) -> bool:
        """Whether round ``t`` (counted from 0) ends with an evaluation: every ``eval_every`` rounds and the last."""
        return (t + 1) % self.eval_every == 0 or t + 1 == self.rounds

    def _root_batch(self) -> tuple[Tensor, Tensor]:
        """The server's trusted root samples (FLTrust), drawn once from the ``server`` stream."""
        ds = self.dataset
        g = generator(self.seed, "server")
        idx = torch.randperm(ds.train_y.numel(), generator=g)[: min(ROOT_SAMPLES, ds.train_y.numel())]
        return ds.train_x[idx].to(self.device), ds.train_y[idx].to(self.device)

    def describe(self) -> dict[str, Any]:
        """What the run is, as JSON-friendly values (the identity of a run directory built from objects)."""
        return {
            "model": type(self.problem.model).__name__, "parameters": self.problem.dim, "rule": repr(self.rule),
            "attack": repr(self.attack), "workers": self.workers, "byzantine": self.byzantine, "f": self.f,
            "rounds": self.rounds, "algorithm": repr(self.algorithm), "optimizer": repr(self.optimizer),
            "lr": repr(self.lr), "seed": self.seed, "eval_every": self.eval_every,
            **({"eval_clients": self.eval_clients} if local_norms(self.problem) is not None else {}),
            **({"privacy": repr(self.privacy)} if self.privacy is not None else {}),
            **({"projection": repr(self.projection)} if self.projection is not None else {}),
            **({"stages": [repr(s) for s in self.given_stages]} if self.given_stages else {}), **self.columns,
        }


def _move(problem: Problem, device: torch.device) -> None:
    """Move the problem's model (parameters and buffers) to ``device`` in place; nothing is touched when they are all
    there already, so a CPU run is exactly as before. ``Module.to`` replaces the buffer tensors: the problem takes
    the new ones."""
    model = problem.model
    if all(t.device == device for t in (*model.parameters(), *model.buffers())):
        return
    model.to(device)
    problem.buffers = dict(model.named_buffers())


def _private_first(stages: Sequence[Stage]) -> None:
    """Refuse a worker stage that privatizes the update (client-level DP) after another worker stage: that one would
    see each raw update, and its columns (update_clip's largest norm) would publish what it measured of it."""
    workers = [s for s in stages if isinstance(s, WorkerStage)]
    for i, stage in enumerate(workers):
        if stage.privatizes and i > 0:
            raise ConfigError("stages", repr(stage), f"first among the worker stages ({workers[0].name} would see "
                              "every raw update before its noise, and publish what it measured of it; "
                              "Experiment(privacy=...) puts it first)")
