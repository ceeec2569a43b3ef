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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from phalanx.aggregators.base import Aggregator
from phalanx.analysis import privacy as accounting
from phalanx.attacks.base import Attack, DataAttack
from phalanx.attacks.none import NoAttack
from phalanx.data.partition import partition
from phalanx.errors import ConfigError
from phalanx.training import devices
from phalanx.training.algorithms.base import RoundAlgorithm, check_knowledge, check_stop
from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.algorithms.fedbn import local_norms
from phalanx.training.optim import SGD, ServerOptimizer
from phalanx.training.privacy import ClientDP
from phalanx.training.problem import Loss, Problem
from phalanx.training.projection import ServerProjection
from phalanx.training.schedule import LRSchedule
from phalanx.training.shards import WorkerData
from phalanx.training.streams import generator, stream_seed
from phalanx.validate import check_int

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
    privacy: client-level differential privacy (:class:`~phalanx.training.privacy.ClientDP`: every computing worker
    clips its update to norm C and adds N(0, σ²C²·I)), or None; the metric rows then carry the budget ε
    (``dp_epsilon``, ``dp_epsilon_local``: :mod:`phalanx.analysis.privacy`). Distributed SGD and federated averaging
    (models without BatchNorm statistics) support it.
    projection: what the server does to θ after its optimizer's step, every round
    (:class:`~phalanx.training.projection.ServerProjection`: CRFL's clipping and parameter noise,
    :class:`~phalanx.training.crfl.CRFL`, whose final metric row carries the smoothed accuracy and certified radius),
    or None. It needs one server model: decentralized rounds and FedBN refuse it.
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
    privacy: ClientDP | None = None
    projection: ServerProjection | None = None

    def __post_init__(self) -> None:
        for name in ("workers", "rounds", "eval_every", "eval_clients"):
            check_int(name, getattr(self, name), low=1)
        check_int("byzantine", self.byzantine, low=0)
        check_int("seed", self.seed, low=0)
        n = self.workers
        if self.byzantine >= n:
            raise ConfigError("byzantine", self.byzantine, f"< workers = {n} (at least one honest worker)")
        if not callable(self.rule) or not hasattr(self.rule, "f"):
            raise ConfigError("rule", self.rule, "an aggregator (phalanx.aggregators.make(...))")
        algo = self.algorithm
        if not isinstance(algo, RoundAlgorithm):
            raise ConfigError("algorithm", algo,
                              "a round algorithm (a phalanx.training.algorithms.base.RoundAlgorithm)")
        m = algo.per_round(n)  # the vectors the rule aggregates each round (at least, in a gossip round)
        what = algo.population(n)
        if 2 * self.rule.f >= m:
            raise ConfigError("f", self.rule.f, f"< {what}/2 = {m / 2:g} (f ≥ n/2 is beyond any robust rule)")
        if m < self.rule.min_workers():
            raise ConfigError(what, m, f">= {self.rule.min_workers()} for {self.rule!r} ({self.rule.requirement})")
        if getattr(self.rule, "stateful", False) and algo.decentralized:
            raise ConfigError("aggregator", repr(self.rule), f"a rule that keeps no state across rounds with "
                              f"{type(algo).__name__} (every node aggregates its own neighbours: there is no one "
                              "server to keep the rule's history)")
        check_knowledge(self.attack_knowledge, self.attack, algo)
        check_stop(self.attack, algo)
        algo.check(self)
        self._check_privacy()
        on_device = algo.runs_on_device
        self.device = device = devices.resolve("cpu" if self.device == "auto" and not on_device else self.device)
        if device.type != "cpu" and not on_device:
            rounds = "decentralized rounds" if algo.decentralized else "its rounds"
            raise ConfigError("device", str(device),
                              f"'cpu' with {type(algo).__name__} ({rounds} run on the CPU so far)")
        self.problem = self.model if isinstance(self.model, Problem) else Problem(self.model, loss=self.loss)
        _move(self.problem, device)
        if self.problem.norm_stats is not None and not algo.pools_norm_stats:
            raise ConfigError("model", "a model with BatchNorm / Hybrid BN layers (FedNorm2d)", "a model without them "
                              f"with {type(algo).__name__} (their statistics are measured and pooled by federated "
                              "rounds: algorithm FedAvg)")
        if local_norms(self.problem) is not None and not algo.keeps_local_norms:
            raise ConfigError("model", "a FedBN model (FedNorm2d layers in 'fedbn' mode)", "a model without them with "
                              f"{type(self.algorithm).__name__} (every client keeps its BatchNorm layers between "
                              "federated rounds: algorithm FedAvg)")
        ds = self.dataset
        if self.shards is None:
            self.shards = partition(ds.train_y, n, "iid", seed=stream_seed(self.seed, "partition") % (2**31))
        if len(self.shards) != n:
            raise ConfigError("shards", f"{len(self.shards)} shards", f"one per worker ({n})")
        self.data = WorkerData(ds.train_x.to(device), ds.train_y.to(device), list(self.shards), ds.num_classes)
        self.test_x, self.test_y = ds.test_x.to(device), ds.test_y.to(device)
        """The test set on the device (evaluation reads these, not ``dataset``'s)."""
        if isinstance(self.attack, DataAttack):  # a trigger larger than the image, a rare sub-population picked
            self.attack.prepare(ds.train_x, ds.train_y, ds.num_classes)
        if isinstance(self.lr, int | float) and not isinstance(self.lr, bool):
            self.lr = LRSchedule(float(self.lr), "constant", self.rounds)
        if not callable(self.lr):
            raise ConfigError("lr", self.lr, "a number > 0, an LRSchedule or a function of the round")
        self.reference_batch = self._root_batch() if "reference" in self.rule.context_keys else None
        self._check_projection()
        if self.privacy is not None and (self.problem.norm_stats is not None or local_norms(self.problem) is not None):
            raise ConfigError("model", "a model with BatchNorm / Hybrid BN / FedBN layers", "a model without them with "
                              "differential privacy (the clients' normalisation statistics would leave them without "
                              "noise)")

    def _check_projection(self) -> None:
        """A server projection acts on the one server model: not with decentralized rounds (a model per node) or
        FedBN (a model per client)."""
        proj = self.projection
        if proj is None:
            return
        if not isinstance(proj, ServerProjection):
            raise ConfigError("projection", proj, "a phalanx.training.projection.ServerProjection (CRFL) or None")
        algo = type(self.algorithm).__name__
        if self.algorithm.decentralized:
            raise ConfigError("projection", repr(proj), f"None with {algo} (it clips and perturbs the server's model; "
                              "decentralized rounds have a model per node and no server)")
        if local_norms(self.problem) is not None:
            raise ConfigError("projection", repr(proj), "None with a FedBN model (every client keeps its own "
                              "BatchNorm layers: there is no one global model to smooth and certify)")

    def _check_privacy(self) -> None:
        """Client-level DP needs an algorithm whose workers apply it, and the accountant (an optional extra)."""
        if self.privacy is None:
            return
        if not isinstance(self.privacy, ClientDP):
            raise ConfigError("privacy", self.privacy, "a phalanx.training.privacy.ClientDP or None")
        if not type(self.algorithm).supports_privacy:
            raise ConfigError("privacy", repr(self.privacy), f"None with {type(self.algorithm).__name__} (client-level "
                              "differential privacy is applied by distributed SGD and federated averaging)")
        accounting.require()

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
            **({"projection": repr(self.projection)} if self.projection is not None else {}), **self.columns,
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
