"""The stage seam: a round of the one loop as a pipeline of stages, each a class with one interface.

A round (:mod:`phalanx.training.loop`) is fixed points at which the run's stages act, in the order the experiment
lists them::

    worker side   every computing worker's update, before it leaves the worker   WorkerStage.update
                  (DSGD: the gradient before momentum; FedAvg: the pseudo-gradient θ − θᵢ)
    server side   the aggregate, after the rule                                   ServerStage.aggregated
                  the step                                                        the server optimizer
                  θ after the step                                                ServerStage.stepped
    evaluation    the metric row's columns                                        Stage.columns

Every stage, on either side, has the same interface:

* **its config section** — the constructor's keyword parameters (scikit-learn's convention: the constructor *is*
  the configuration), each described in :attr:`Stage.parameters`, validated by the constructor itself with one-line
  :class:`~phalanx.errors.ConfigError`\\ s; :meth:`Stage.configure` builds it from a config's section and the run's
  :class:`Plan` (defaults taken from the run);
* **one validation** against the run it is part of, :meth:`Stage.check` (the algorithm, the rule, the model's
  normalisation), run when a config is validated and when an :class:`~phalanx.training.experiment.Experiment` is
  built from objects — written once;
* **its state** (:meth:`Stage.state_dict` / :meth:`Stage.load_state_dict`), saved in checkpoints under
  :meth:`Stage.prefix` (``stage.<name>.`` unless the stage keeps a key checkpoints already had);
* **its random streams** (:attr:`Stage.streams`): named streams of the run's seed (:mod:`phalanx.training.streams`),
  checkpointed as ``rng.<stream>``, restored on resume;
* **its metric columns** (:meth:`Stage.column_names`, :meth:`Stage.columns`) on every evaluation row.

The loop and the evaluation iterate over ``experiment.stages`` and never name a feature; a new stage is one module
in this package (found by :mod:`phalanx.training.stages.registry`), with no other edit.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.plugins import accepted_params
from phalanx.training.server import RoundResult
from phalanx.training.state import Received
from phalanx.training.streams import generator, restored, secret_generator

__all__ = ["Evaluation", "Plan", "ServerRound", "ServerStage", "Stage", "WorkerStage", "WorkerStages",
           "WorkerUpdate"]

STATE_PREFIX = "stage."
"""The checkpoint prefix of a stage's state: ``stage.<name>.<key>``."""


@dataclass(frozen=True)
class Plan:
    """What a stage's configuration and check read of the run it is part of — the same whether the run is a validated
    config (before anything large is built) or an :class:`~phalanx.training.experiment.Experiment` built from
    objects.

    ``algorithm``, ``rule`` and ``attack`` are the built components; ``server_lr`` the schedule of the loop's server
    step; ``lr`` the config's learning rate (a default some stages take: CRFL's η; None for objects); ``norm`` the
    model's normalisation layers: ``"stats"`` (BatchNorm / Hybrid BN, statistics held by the server), ``"fedbn"``
    (every client keeps its own) or None, named in errors as ``norm_key`` = ``norm_value``.
    """

    algorithm: Any
    rule: Any
    attack: Any
    workers: int
    byzantine: int
    rounds: int
    server_lr: Callable[[int], float]
    lr: float | None = None
    norm: str | None = None
    norm_key: str = "model"
    norm_value: Any = None

    @property
    def f(self) -> int:
        """The number of Byzantine workers the rule is configured to tolerate."""
        return int(self.rule.f)


@dataclass(frozen=True)
class Evaluation:
    """What a stage's columns read at an evaluation: the run (an :class:`~phalanx.training.experiment.Experiment`),
    the round just finished (0 before the first), θ, and whether θ is the one global model (not a model per node or
    per client)."""

    run: Any
    round: int
    theta: Tensor
    global_model: bool

    @property
    def final(self) -> bool:
        """Whether this is the run's last evaluation (after its last round)."""
        return bool(self.round == self.run.rounds)


class Stage(ABC):  # noqa: B024 - every method is an optional hook with a default
    """The one interface of every stage (see the module's docstring)."""

    name: ClassVar[str] = "stage"
    """Its name: in configs (``[stages.<name>]``), in ``phalanx list stages``, in its checkpoint prefix."""
    side: ClassVar[str] = "server"
    """``"server"`` or ``"worker"``."""
    reference: ClassVar[str] = ""
    """The paper it implements (authors, title, venue, year, the algorithm or equation)."""
    streams: ClassVar[tuple[str, ...]] = ()
    """The named random streams it draws from (:mod:`phalanx.training.streams`)."""
    parameters: ClassVar[Mapping[str, str]] = {}
    """Its config section: every constructor parameter, with its type, range and meaning (the constructor checks
    them and holds the defaults)."""
    brought_by: ClassVar[str] = ""
    """Who adds it to a run when no config names it (a round algorithm), for ``phalanx list stages``; empty for a
    stage a config turns on."""
    state_prefix: ClassVar[str | None] = None
    """Its state's checkpoint prefix when not ``stage.<name>.`` (a key checkpoints had before the stage existed)."""
    key: str = ""
    """How the run turned it on, for its errors (``dp_noise``, ``server_projection``, ``stages.<name>``); set by
    :func:`~phalanx.training.stages.registry.build`."""

    @classmethod
    def configure(cls, section: Mapping[str, Any], plan: Plan) -> Stage:
        """The stage a config's ``section`` describes in ``plan``'s run; by default its constructor with the section
        (an unknown parameter is one line listing the known ones)."""
        accepted = accepted_params(cls)
        unknown = sorted(set(section) - set(accepted or section))
        if unknown:
            raise ConfigError(unknown[0], section[unknown[0]], f"a parameter of {cls.name}: "
                              f"{', '.join(accepted or []) or 'none'}")
        return cls(**section)

    def check(self, plan: Plan) -> None:  # noqa: B027 - optional hook
        """Refuse (one-line :class:`~phalanx.errors.ConfigError` naming :meth:`parameter`) a run this stage cannot
        be part of."""

    def secret_streams(self) -> tuple[str, ...]:
        """Those of its :attr:`streams` drawn from a per-session secret instead of the run's seed
        (:func:`~phalanx.training.streams.secret_generator`): never seeded from the seed, never checkpointed, never
        sent to another process; none by default (client-level DP's ``dp`` with secret noise)."""
        return ()

    def parameter(self, default: str) -> str:
        """The name its errors give it: how the run turned it on, else ``default`` (the API's name)."""
        return self.key or default

    def prefix(self) -> str:
        """The checkpoint prefix of its state."""
        return self.state_prefix if self.state_prefix is not None else f"{STATE_PREFIX}{self.name}."

    def state_dict(self) -> dict[str, Tensor]:
        """Its state as named tensors (new ones, not views of what the next round changes); none by default."""
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Take a state :meth:`state_dict` made (``{}``: the fresh state); refuse one it cannot continue from."""
        if state:
            raise ConfigError(f"{self.name} state", sorted(state), f"no state ({self.name} keeps none)")

    def column_names(self) -> tuple[str, ...]:
        """The metric columns :meth:`columns` fills on every evaluation row."""
        return ()

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        """Its metric columns at an evaluation (None where it measures nothing in that row)."""
        return dict.fromkeys(self.column_names())

    def params(self) -> dict[str, Any]:
        """The configuration (constructor arguments), for logs and manifests."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{k}={v!r}" for k, v in self.params().items()) + ")"


@dataclass(frozen=True)
class ServerRound:
    """What the server-side stages see of round ``round`` (0-based) of ``rounds``: the received vectors, the round's
    measurements (with the rule's contributions, every round when a stage asks for them), the f the rule is
    configured for, the run's ``workers`` (n), and the run's server-side stage streams by name."""

    round: int
    rounds: int
    received: Received
    result: RoundResult | None
    f: int
    workers: int
    generators: Mapping[str, torch.Generator]

    def ids(self) -> Tensor:
        """The worker of each received row (every worker in order, or the round's sampled clients)."""
        rows = self.received.rows
        return torch.arange(self.received.vectors.shape[0]) if rows is None else torch.tensor(rows, dtype=torch.int64)


class ServerStage(Stage):
    """A stage at the server: on the aggregate before the step, on θ after it."""

    side: ClassVar[str] = "server"
    needs_contributions: ClassVar[bool] = False
    """It reads the rule's contributions every round (the server then measures every round, not only at
    evaluations)."""
    reads_ids: ClassVar[bool] = False
    """What it does to the run (the aggregate, θ, whether the run goes on, what it names) depends on which clients
    sent the round's rows (``ServerRound.ids``). Client-level DP then reports no amplification by a secret sample
    (:meth:`phalanx.training.stages.privacy.ClientDP.columns`). A stage that reads ids for a diagnostic column only,
    leaving the run as it is, leaves this False."""

    def aggregated(self, agg: Tensor, r: ServerRound) -> Tensor:
        """The aggregate the step takes (a new tensor); by default ``agg`` as it is."""
        return agg

    def stepped(self, theta: Tensor, r: ServerRound) -> Tensor:
        """θ after the step of round ``r.round`` (a new tensor); by default as it is."""
        return theta


@dataclass(frozen=True)
class WorkerUpdate:
    """One call of the worker-side stages: the round has ``workers`` computing workers in all (in this process or
    not), the rows are those at ``positions`` of them (all, one process's own, or none in a round it computes
    nothing), and ``generators`` are the worker-side stage streams by name."""

    workers: int
    positions: slice
    generators: Mapping[str, torch.Generator]


class WorkerStage(Stage):
    """A stage at every computing worker, on each update before it leaves the worker (a vector attack's rows are
    not an update: the attack makes them). It is called every round, with no rows where a process computes none, so
    that its streams advance alike in every process.

    **Its measurements under** ``phalanx launch``: a worker process's stage measures only its own rows, and the
    metric rows are rank 0's. A stage whose columns count the workers' updates declares :attr:`reports` numbers
    (:meth:`report`: what this process measured of its last round); each worker process sends them to rank 0 with its
    update, and rank 0's stage merges those of the processes whose rows the server used (:meth:`absorb`). A report
    is its sender's *claim* — a Byzantine worker may report anything within the stage's bounds — so it only ever
    fills metric columns, labelled as reported, and is never read by a decision (a rule, a stage's hook, a stop)."""

    side: ClassVar[str] = "worker"
    privatizes: ClassVar[bool] = False
    """Whether it makes the update differentially private (client-level DP): it then acts first among the worker
    stages in every spelling of a run, so that no other stage sees a raw update (:class:`Experiment` refuses it
    elsewhere)."""
    reports: ClassVar[int] = 0
    """How many float64 numbers :meth:`report` holds (0: the stage reports nothing to rank 0)."""

    def update(self, rows: Tensor, u: WorkerUpdate) -> Tensor:
        """The rows as they leave their workers (in place or new); by default as they are."""
        return rows

    def report(self) -> tuple[float, ...] | None:
        """This process's measurements of its last round, :attr:`reports` numbers (None: it computed no row)."""
        return None

    def absorb(self, reported: Sequence[tuple[float, ...] | None]) -> None:
        """Rank 0, after its own :meth:`update` of the round: the reports of the other processes whose rows the server
        used this round (each :attr:`reports` float64s, or None for a process that computed no row), to merge into
        the columns. Each is a claim: one out of the stage's bounds is dropped, never raised on."""

    def check(self, plan: Plan) -> None:
        """The algorithm's workers must pass every update they send through the worker stages."""
        algorithm = plan.algorithm
        if not getattr(type(algorithm), "runs_worker_stages", False):
            raise ConfigError(self.parameter("stages"), self.name, f"a stage the workers of {type(algorithm).__name__} "
                              "run (they do not pass every update they send through the worker stages: dsgd and "
                              "fedavg do)")


class WorkerStages:
    """The run's worker-side stages as one worker side runs them: their streams (restored from the start snapshot's
    states, else seeded from the run's seed; a secret stream, :meth:`Stage.secret_streams`, from a fresh secret of
    this process, whatever the snapshot holds) and every update through each stage in order."""

    def __init__(self, stages: Iterable[Stage], streams: Mapping[str, Tensor], seed: int) -> None:
        self.stages = tuple(s for s in stages if isinstance(s, WorkerStage))
        self.secret = frozenset(name for s in self.stages for name in s.secret_streams())
        self.generators = {name: secret_generator() if name in self.secret else restored(streams[name])
                           if name in streams else generator(seed, name) for s in self.stages for name in s.streams}

    def __bool__(self) -> bool:
        return bool(self.stages)

    def update(self, rows: Tensor, workers: int, positions: slice = slice(None)) -> Tensor:
        """``rows`` (the computing workers at ``positions`` of the round's ``workers``) through every stage."""
        u = WorkerUpdate(workers, positions, self.generators)
        for stage in self.stages:
            rows = stage.update(rows, u)
        return rows

    def streams(self) -> dict[str, Tensor]:
        """The stages' stream states now (for a checkpoint), the secret ones left out."""
        return {name: g.get_state() for name, g in self.generators.items() if name not in self.secret}
