"""The round-algorithm seam: what every round algorithm (DSGD, FedAvg, gossip, Anytime SGD, a user's own) declares
and provides, so that the experiment, the loop and its callbacks need to know nothing about any particular one.

An algorithm decides *what the workers compute* each round and *who the server is*; the transport decides where they
compute and how their vectors travel (:mod:`phalanx.training.transport`), and the loop runs the same round over any
pair of the two (:mod:`phalanx.training.loop`). An algorithm provides

* ``per_round(n)`` — how many vectors its rule aggregates each round (n; ``clients_per_round``; a gossip node's
  smallest closed neighbourhood), and ``population(n)`` — what that number is called in an error message;
* ``all_workers(run, streams, carried)`` — every worker in this process, one batched computation per round
  (:class:`WorkerSide`), and ``one_worker(run, rank, streams, carried)`` — one process's slot on a real engine
  (:class:`WorkerSlot`);
* ``make_server(run, generator)`` — what combines the round's vectors (by default the standard
  :class:`~phalanx.training.server.Server`: the run's rule, then the server optimizer steps θ);
* ``initial_state(run, theta)``, ``next_state(run, state, received)`` and ``load_state(run, own)`` — its own per-run
  state: an opaque mapping of tensors that the round state carries (``RoundState.own``), that the worker side may
  return with a round (``Received.own``) or the algorithm derive after the server's step, and that a checkpoint
  saves under ``algorithm.<key>`` — the loop, the checkpoint writer and the transports never look inside;
* ``evaluate(run, state)`` — its own test measurements when it has no single global model (a model per node, a
  model per client), or None for the model's plain test accuracy and loss;
* ``check(run)`` — its own checks on the run it is part of, raised before anything trains;
* ``stages(run)`` — the stages it brings to the run (:mod:`phalanx.training.stages`: federated averaging's pooling
  of BatchNorm statistics);
* ``make_rule(spec, f)`` / ``make_attack(name, params)`` — the rule and the attack a config names for it (a
  decentralized one takes the robust gossip rules and the graph attacks too);
* ``from_config(cfg, lr)`` / ``from_params(cfg, lr)`` — itself, as a run config describes it (a built-in algorithm
  from its config keys, one of one's own from ``algorithm_params``), with the schedule of the loop's server step;
* ``check_config(cfg, rule, attack)`` — the config's relations it owns (f and the rule's requirement against its
  population, its keys against the run's), checked once, when the config is validated;
* ``processes(cfg)`` — how many processes a torchrun run of it has;

and declares, as data (class attributes, not names listed elsewhere):

* ``name`` — its config name; ``missing_word`` — how a missing participant is named in messages ("ranks",
  "clients", "neighbours"); ``decentralized`` — a model per node, no server; ``topologies`` — the torchrun
  topologies it runs on (the first is the default); ``config_defaults`` — the defaults it gives the run's keys;
* ``runs_on_device`` — its rounds run on a CUDA device; ``pools_norm_stats`` — it measures and pools BatchNorm /
  Hybrid BN statistics; ``keeps_local_norms`` — it keeps every client's BatchNorm layers between rounds (FedBN);
  ``runs_worker_stages`` — its workers pass every update they send through the run's worker stages.

``run`` is the :class:`~phalanx.training.experiment.Experiment` the algorithm is part of, seen through :class:`Run`
(what an algorithm may read of it), so that neither this module nor any algorithm imports the experiment that
imports them.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, TypeVar

import torch
from torch import Tensor

from phalanx import aggregators, attacks
from phalanx.aggregators.base import Aggregator
from phalanx.attacks.base import KNOWLEDGE, Attack, DataAttack
from phalanx.decentralized.gossip_attacks import is_gossip_attack
from phalanx.decentralized.robust_gossip import is_gossip_rule
from phalanx.errors import ConfigError
from phalanx.plugins import Registry, check_params, import_modules, is_spec
from phalanx.training.problem import Problem
from phalanx.training.server import Server
from phalanx.training.shards import WorkerData
from phalanx.training.stages.base import Stage
from phalanx.training.state import Received, RoundState, SlotPlan
from phalanx.validate import Section, suggest

_S = TypeVar("_S", bound=Stage)


class Run(Protocol):
    """What a round algorithm reads of the run it is part of (:class:`~phalanx.training.experiment.Experiment` is
    one): the population, the rule and attack, the model with its data, the test set, the device and the seed."""

    workers: int
    byzantine: int
    attack: Attack | DataAttack
    rule: Aggregator
    problem: Problem
    data: WorkerData
    test_x: Tensor
    test_y: Tensor
    seed: int
    eval_clients: int
    dataset: Any
    reference_batch: tuple[Tensor, Tensor] | None
    rule_for: Callable[[int], Aggregator] | None
    device: str | torch.device
    """Where the rounds compute: a ``torch.device`` once the run is built (the field also takes a name)."""
    attack_knowledge: str
    """What a vector attack sees: ``"omniscient"`` (every honest vector) or ``"colluders"`` (the Byzantine workers'
    own honest computations only)."""

    @property
    def worker_stages(self) -> tuple[Any, ...]:
        """The run's worker-side stages (:class:`~phalanx.training.stages.base.WorkerStage`: client-level
        differential privacy, say), which every computing worker's update passes through before it leaves the worker
        (:class:`~phalanx.training.stages.base.WorkerStages`)."""
        ...

    def stage(self, kind: type[_S]) -> _S | None:
        """The run's first stage of class ``kind``, or None (federated averaging's clients measure the statistics
        that its norm-statistics stage pools, on that stage's layers)."""
        ...

    @property
    def f(self) -> int: ...

    @property
    def honest(self) -> int: ...


class WorkerSide(Protocol):
    """What a round algorithm's in-process worker side does: one round's vectors, and its streams' states."""

    def round(self, theta: Tensor, t: int, rule: Any) -> Received: ...

    def streams(self) -> dict[str, Tensor]: ...


class WorkerSlot(Protocol):
    """What a round algorithm's worker does in a run with a process per worker slot (``one_worker``): its vector of
    each round, its row of a vector attack, the round's :class:`~phalanx.training.state.SlotPlan`, and its
    streams. ``shares_attack_stream``: the attacking slots change from round to round, so the ``attack`` stream's
    state travels with the honest vectors (federated rounds); otherwise the Byzantine ranks keep their own."""

    plan: SlotPlan
    vector_attack: bool
    shares_attack_stream: bool
    attack_gen: torch.Generator

    def warm_up(self) -> None: ...

    def vector(self, theta: Tensor, t: int) -> Tensor | None: ...

    def attack_vector(self, honest: Tensor, rule: Callable[[Tensor], Tensor], t: int) -> Tensor: ...

    def skip(self, t: int) -> None: ...

    def streams(self) -> dict[str, Tensor]: ...


class RoundAlgorithm(ABC):
    """The base of every round algorithm (see the module's docstring)."""

    name: ClassVar[str] = "algorithm"
    """The config name (``algorithm = "…"``)."""
    missing_word: ClassVar[str] = "workers"
    """How a missing participant is named in messages."""
    decentralized: ClassVar[bool] = False
    """A model per node and no server (gossip): the state's θ is ``(n, d)``."""
    runs_on_device: ClassVar[bool] = False
    """Its rounds run on a CUDA device (``device``); the others run on the CPU (``"auto"`` picks it)."""
    pools_norm_stats: ClassVar[bool] = False
    """Its rounds measure and pool BatchNorm / Hybrid BN statistics (:mod:`phalanx.training.norm_stats`)."""
    keeps_local_norms: ClassVar[bool] = False
    """It keeps every client's BatchNorm layers between rounds (FedBN, :mod:`phalanx.training.algorithms.fedbn`)."""
    lr_role: ClassVar[str] = "server"
    """Whose learning rate the run's ``lr`` is: the server's (distributed SGD), the clients' (federated averaging:
    ``client_lr``), the nodes' (gossip: ``node_lr``). A config may spell it ``<role>_lr``."""
    config_section: ClassVar[Section] = Section("algorithm", ())
    """The declaration of its own flat config keys (:attr:`config_keys`): each one's type, default, allowed range
    and description (:class:`~phalanx.validate.Key`). The run config's field of each key is made from it, and its
    range is checked once, by it, when a config is validated (:func:`phalanx.experiments.declare.check`) — for
    every config, as the schema's own range was. A built-in algorithm's only: an algorithm of one's own takes its
    parameters from ``algorithm_params`` (its constructor checks them)."""
    config_keys: ClassVar[tuple[str, ...]] = ()
    """The run config's keys that this built-in algorithm reads and no other does (federated averaging's
    ``clients_per_round`` …, gossip's ``graph`` …; ``config_section.flat_keys()``): a config of another algorithm
    must leave them at their defaults. An algorithm of one's own takes its parameters from ``algorithm_params``
    instead."""
    section_keys: ClassVar[dict[str, str]] = {}
    """A built-in algorithm's constructor parameters that a config key of another name sets (gossip's ``weights``
    is ``gossip_weights``); every other parameter is set by the config key of its own name (its config section:
    :func:`phalanx.experiments.sections.algorithm_section`)."""
    config_columns: ClassVar[tuple[str, ...]] = ()
    """The config keys repeated on every metric row of its runs, beside the common ones (what a report groups by)."""
    config_defaults: ClassVar[dict[str, Any]] = {}
    """The defaults it gives the run's common keys where they differ from the config's (Anytime SGD:
    ``momentum = 0``); a config that sets the key keeps its value."""
    topologies: ClassVar[tuple[str, ...]] = ("server", "serverless")
    """The torchrun topologies its rounds run on (:mod:`phalanx.distributed.topologies`); a torchrun config's
    ``topology`` defaults to the first."""
    population_key: ClassVar[str] = "workers"
    """The config key that sets :meth:`per_round`'s number, named in the config's errors about it."""
    samples_population: ClassVar[bool] = False
    """Its rounds sample a few clients and keep nothing per client, so that it can run over a client population
    whose data are produced on demand (:mod:`phalanx.training.population`: federated averaging)."""
    runs_worker_stages: ClassVar[bool] = False
    """Its worker side passes every update it sends through the run's worker stages (``Run.worker_stages``:
    client-level differential privacy, say), and sends nothing else of a worker's; a run with a worker stage and an
    algorithm that does not is refused."""
    stops_attacks: ClassVar[bool] = False
    """Its worker side honours a data attack's ``stop_round`` (the attackers behave honestly from that round on:
    durability); an algorithm that does not refuses an attack with one."""
    knowledge: ClassVar[tuple[str, ...]] = ("omniscient",)
    """The ``attack_knowledge`` values its worker side implements: ``"colluders"`` needs the Byzantine workers to
    compute their own honest vectors and their attack to see only those (DSGD and FedAvg, in process)."""

    @abstractmethod
    def per_round(self, workers: int) -> int:
        """How many vectors the rule aggregates each round (at least, in a gossip round)."""

    def population(self, workers: int) -> str:
        """What :meth:`per_round`'s number is called in an error message."""
        return "workers" if self.per_round(workers) == workers else "clients_per_round"

    @abstractmethod
    def all_workers(self, run: Run, streams: dict[str, Tensor], carried: Tensor | None) -> WorkerSide:
        """Every worker in this process (the in-process transport); ``carried``: the workers' rows carried from the
        last round (momentum), or None."""

    @abstractmethod
    def one_worker(self, run: Run, rank: int, streams: dict[str, Tensor], carried: Tensor | None) -> WorkerSlot:
        """One process's slot ``rank`` (the torchrun engine)."""

    def make_server(self, run: Run, generator: torch.Generator) -> Any:
        """What combines the round's vectors: the standard :class:`~phalanx.training.server.Server` (the run's rule
        with its context — centre, reference gradient — drawing on ``generator``, the ``aggregator`` stream)."""
        return Server(run.rule, honest=run.honest, problem=run.problem, reference_batch=run.reference_batch,
                      generator=generator, rule_for=run.rule_for)

    def initial_state(self, run: Run, theta: Tensor) -> dict[str, Tensor]:
        """Its own state before the first round (θ₀ = ``theta``): named tensors, checkpointed under
        ``algorithm.<name>``; none by default."""
        return {}

    def next_state(self, run: Run, state: RoundState, got: Received) -> dict[str, Tensor]:
        """Its own state after a round: ``state`` is the round state after the server's step (θ stepped, ``own``
        still the state before the round), ``got`` what the round delivered. By default what the worker side
        returned (``got.own``), or the state as it was. Return new tensors, never the old ones changed in place (the
        old state may be a checkpoint being written)."""
        return got.own if got.own is not None else state.own

    def load_state(self, run: Run, own: dict[str, Tensor]) -> None:  # noqa: B027 - optional hook
        """Take ``own`` as its current state: at the start of a run (fresh, resumed or received from another rank)
        and after every round that replaced it; refuse (:class:`~phalanx.errors.ConfigError`) a state it cannot
        continue from."""

    def evaluate(self, run: Run, state: RoundState) -> dict[str, Any] | None:
        """Its own test measurements of ``state`` (``test_accuracy`` and ``test_loss`` among them), or None: the
        model's plain accuracy and loss at ``state.theta`` (and the attack's own measure)."""
        return None

    def stages(self, run: Run) -> tuple[Any, ...]:
        """The stages the algorithm brings to the run (:mod:`phalanx.training.stages`: federated averaging's pooling
        of BatchNorm statistics, say); none by default."""
        return ()

    def check(self, run: Run) -> None:  # noqa: B027 - optional hook
        """Refuse (:class:`~phalanx.errors.ConfigError`) a run this algorithm cannot train, before it trains."""

    @classmethod
    def make_rule(cls, spec: str, f: int) -> Aggregator:
        """The rule a config's ``aggregator = spec`` names for this algorithm, configured for ``f``: a rule of
        :func:`phalanx.aggregators.make` (a robust gossip rule, which runs at the nodes of a decentralized algorithm,
        is refused in one line naming ``aggregator``)."""
        if is_gossip_rule(spec):
            raise ConfigError("aggregator", spec, f"a rule of `phalanx list aggregators` with algorithm = {cls.name!r} "
                              f"({spec!r} is a robust gossip rule: it runs at the nodes of a decentralized algorithm, "
                              "'gossip' or 'anytime')")
        return aggregators.make(spec, f=f)

    @classmethod
    def make_attack(cls, name: str, params: dict[str, Any]) -> Attack | DataAttack:
        """The attack a config's ``attack = name`` (with ``attack_params``) names for this algorithm: one of
        :func:`phalanx.attacks.make` (a decentralized attack, which needs a graph, is refused in one line naming
        ``attack``)."""
        if is_gossip_attack(name):
            raise ConfigError("attack", name, f"an attack of `phalanx list attacks` with algorithm = {cls.name!r} "
                              f"({name!r} is a decentralized attack: it needs the graph of a decentralized algorithm, "
                              "'gossip' or 'anytime')")
        return attacks.make(name, **params)

    @classmethod
    def from_params(cls, cfg: Any, lr: Callable[[int], float]) -> tuple[RoundAlgorithm, Callable[[int], float]]:
        """An algorithm of one's own (a registered name or a ``module:attr`` spec — a subclass of a built-in one
        too) as a validated run config ``cfg`` describes it: the class built from ``algorithm_params`` (checked
        against its signature), with the config's ``lr`` (and its schedule) the loop's server step."""
        check_params(cfg.algorithm, cls, cfg.algorithm_params)
        return cls(**cfg.algorithm_params), lr

    @classmethod
    def from_config(cls, cfg: Any, lr: Callable[[int], float]) -> tuple[RoundAlgorithm, Callable[[int], float]]:
        """A built-in algorithm as a validated run config ``cfg`` describes it, from its config keys
        (:attr:`config_keys`), and the learning rate of the loop's server step; ``lr`` is the config's ``lr`` (with
        its schedule). By default as :meth:`from_params`."""
        return cls.from_params(cfg, lr)

    def check_config(self, cfg: Any, rule: Aggregator, attack: Attack | DataAttack) -> None:
        """Refuse (one-line :class:`~phalanx.errors.ConfigError` naming the config key) a config this algorithm
        cannot train with, once, when the config is validated: by default f < m/2 and m at least what ``rule``
        needs, for the m vectors it aggregates a round (:meth:`per_round`, set by :attr:`population_key`)."""
        check_knowledge(getattr(cfg, "attack_knowledge", "omniscient"), attack, self, getattr(cfg, "engine", None))
        check_stop(attack, self, "attack_params.stop_round")
        check_population(self, cfg.workers, cfg.byzantine, rule, self.population_key, repr(cfg.aggregator))

    @classmethod
    def processes(cls, cfg: Any) -> int:
        """How many processes a torchrun run of ``cfg`` has: one per worker (by default)."""
        return int(cfg.workers)


def check_honest(workers: int, byzantine: int) -> None:
    """At least one honest worker: ``byzantine < workers`` (every algorithm; a run of Byzantine workers only has
    nothing to learn from). Written once, run by a config's validation (:func:`phalanx.experiments.components.build`,
    before any component is built) and by an experiment of objects (:func:`check_population`)."""
    if byzantine >= workers:
        raise ConfigError("byzantine", byzantine, f"< workers = {workers} (at least one honest worker)",
                          f"e.g. --set byzantine={max(0, (workers - 1) // 3)} --set f={max(0, (workers - 1) // 3)}")


def check_population(algorithm: RoundAlgorithm, workers: int, byzantine: int, rule: Aggregator, key: str,
                     named: str) -> None:
    """The population's conditions, written once for a config (:meth:`RoundAlgorithm.check_config`, the key
    :attr:`~RoundAlgorithm.population_key`) and for an experiment of objects (``Experiment``, the name
    :meth:`~RoundAlgorithm.population`): at least one honest worker (:func:`check_honest`); for the m vectors
    the rule sees a round (:meth:`~RoundAlgorithm.per_round`), f < m/2 — no rule is robust beyond it (Guerraoui,
    Gupta & Pinot, *Robust Machine Learning*, 2024, Prop. 4.4: f ≥ n/2 makes honest and Byzantine halves
    indistinguishable) — and m at least what the rule requires (:meth:`Aggregator.min_workers`, e.g. Krum's
    n > 2f + 2). ``named`` is the rule as the message shows it (the config's spec, or the object's repr)."""
    check_honest(workers, byzantine)
    m = algorithm.per_round(workers)
    if 2 * rule.f >= m:
        sees = "" if key == "workers" else f"; the rule sees {m} updates a round"
        raise ConfigError("f", rule.f, f"< {key}/2 = {m / 2:g} (f ≥ n/2 is beyond any robust rule{sees})")
    if m < rule.min_workers():
        raise ConfigError(key, m, f">= {rule.min_workers()} for aggregator {named} with f={rule.f} "
                          f"({rule.requirement})")


def check_knowledge(knowledge: str, attack: Attack | DataAttack, algorithm: RoundAlgorithm,
                    engine: str | None = None) -> None:
    """Refuse (one line naming ``attack_knowledge``) a knowledge the run cannot give its attack: ``"colluders"``
    with an attack that reads no honest vector (a data attack, NaN, ±Inf, zero-centred noise: the distinction does
    not exist), an algorithm whose worker side does not implement it, or the torchrun engine (its transports send
    the attacking ranks the honest ranks' vectors)."""
    if knowledge not in KNOWLEDGE:
        raise ConfigError("attack_knowledge", knowledge, "one of " + ", ".join(KNOWLEDGE), suggest(knowledge,
                                                                                                   KNOWLEDGE))
    if knowledge == "omniscient":
        return
    if isinstance(attack, DataAttack) or not getattr(attack, "reads_honest", True):
        raise ConfigError("attack_knowledge", knowledge, f"'omniscient' with attack {attack.name!r} (it reads no "
                          "honest vector: what it knows changes nothing)")
    if knowledge not in algorithm.knowledge:
        raise ConfigError("attack_knowledge", knowledge, f"one of {', '.join(algorithm.knowledge)} with algorithm "
                          f"{algorithm.name!r}")
    if engine == "torchrun":
        raise ConfigError("attack_knowledge", knowledge, "'omniscient' with engine = 'torchrun' (its transports "
                          "hand the attacking ranks the honest ranks' vectors; colluders run in process so far)")


def check_stop(attack: Attack | DataAttack, algorithm: RoundAlgorithm, key: str = "stop_round") -> None:
    """Refuse a data attack's ``stop_round`` where the algorithm's worker side would not honour it."""
    stop = attack.stop_round if isinstance(attack, DataAttack) else None
    if stop is not None and not algorithm.stops_attacks:
        raise ConfigError(key, stop, f"None with algorithm {algorithm.name!r} (its workers do not stop attacking; "
                          "dsgd and fedavg do)")


def built_in_params(cfg: Any) -> None:
    """A built-in algorithm takes its config keys, not ``algorithm_params``: refuse them (one line)."""
    if cfg.algorithm_params:
        raise ConfigError("algorithm_params", cfg.algorithm_params, f"{{}} with algorithm = {cfg.algorithm!r} (a "
                          "built-in algorithm takes its own config keys)")


def _accept(obj: Any, name: str) -> Any:
    if not (isinstance(obj, type) and issubclass(obj, RoundAlgorithm)):
        raise ConfigError("algorithm", name, "a subclass of phalanx.training.algorithms.base.RoundAlgorithm")
    return obj


_REGISTRY: Registry[Any] = Registry("algorithm", "phalanx.algorithms", _accept)
BUILT_IN = ("dsgd", "fedavg", "gossip", "anytime")
"""The built-in round algorithms, which a config configures with its own keys (``batch_size``, ``momentum``,
``local_steps``, ``graph``, …); every other name is looked up in the registry and built from ``algorithm_params``."""


_found = False


def _discover() -> None:
    """Import every module of this package once (:func:`phalanx.plugins.import_modules`): a module that defines a
    ``@register``-ed algorithm registers it as it is imported, so a new built-in algorithm is one file here, with no
    import or entry point to add (tests/test_builtin_discovery.py). Lazy — on the first name looked up, not when this
    module is imported — as the algorithm modules import this one."""
    global _found
    if _found:
        return
    _found = True
    package = __package__ or "phalanx.training.algorithms"
    import_modules(package, importlib.import_module(package).__path__)


def register(cls: type[RoundAlgorithm]) -> type[RoundAlgorithm]:
    """Class decorator: make a round algorithm known to configs under ``cls.name``."""
    _REGISTRY.register(cls)
    return cls


def names() -> list[str]:
    """The names a config's ``algorithm`` accepts (and a ``module:attr`` spec)."""
    _discover()
    return sorted({*BUILT_IN, *_REGISTRY.names()})


def resolve(name: str) -> type[RoundAlgorithm]:
    """The class of a registered name, a ``module:attr`` spec or a ``phalanx.algorithms`` entry point."""
    _discover()
    if not is_spec(name) and name not in _REGISTRY:
        known = names()
        raise ConfigError("algorithm", name, "one of " + ", ".join(known) + " or a 'module:attr' spec of a "
                          "RoundAlgorithm subclass", suggest(name, known))
    cls: type[RoundAlgorithm] = _REGISTRY.get(name, "algorithm")
    return cls


def make(name: str, **params: Any) -> RoundAlgorithm:
    """A round algorithm that is not built in, from its name and constructor parameters (``algorithm_params``)."""
    cls = resolve(name)
    check_params(str(name), cls, params)
    return cls(**params)
