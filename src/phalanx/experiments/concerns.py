"""The values a run config is read into, one per concern — the data (:class:`DataSpec`), the model
(:class:`ModelSpec`), the device (:class:`DeviceSpec`), the run's shape (:class:`RunShape`), the algorithm's section
(:class:`AlgorithmSpec`) — each with the config section it reads, declared on it (issue 39, item 2: "each section
declared by the component that reads it"): ``DataSpec.section`` is ``[data]``, ``RunShape.section`` ``[run]``,
``AlgorithmSpec.sections`` ``[algorithm]``, ``[rule]``, ``[attack]`` and ``[server.optimizer]`` (their keys that
no constructor declares). A :class:`~phalanx.experiments.declare.Section` gives each key its flat key, type,
range, default and description; the schema's fields (:class:`~phalanx.experiments.schema.RunConfig`), the tree's
table, ``phalanx list sections`` and the range checks are made from it (:mod:`phalanx.experiments.declare`).
:func:`checked` adds the keys the components declare on their own classes (a built-in algorithm's, SGD's, the
privacy stage's ``config_section``) and the workers' optimisation (:data:`WORKERS`): every key of the schema but the
stages' adapter's three, each declared once, each range checked by its declaration alone.

Each value registers its section where it is declared (``@register``, :mod:`phalanx.experiments.section_registry`),
in the tree's order; a plug-in's section is registered the same way in its own module, found by its entry point, and
:func:`declared` reads them all from the registry — there is no list of sections to extend.

This module is below the schema (the schema is made from it): the reading of a config into these values is
:func:`phalanx.experiments.specs.read`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from phalanx.experiments.declare import Key, Section
from phalanx.experiments.section_registry import REGISTRY, register
from phalanx.training.algorithms import builtin
from phalanx.training.optim import SGD
from phalanx.training.stages.privacy import ClientDP

if TYPE_CHECKING:
    from phalanx.training.algorithms.base import RoundAlgorithm

__all__ = [
    "ALGORITHM",
    "ATTACK",
    "DATA",
    "ENGINE",
    "MODEL",
    "RULE",
    "RUN",
    "SERVER_OPTIMIZER",
    "STAGES",
    "WORKERS",
    "AlgorithmSpec",
    "Backend",
    "DataSpec",
    "DeviceSpec",
    "Engine",
    "Knowledge",
    "ModelSpec",
    "Partition",
    "RunShape",
    "Schedule",
    "checked",
    "declared",
]

Schedule = Literal["constant", "step", "cosine"]
Partition = Literal["iid", "dirichlet", "pathological", "natural"]
Engine = Literal["simulated", "torchrun"]
Backend = Literal["auto", "gloo", "nccl"]
Knowledge = Literal["omniscient", "colluders"]


RUN = Section("run", (
    Key("workers", "workers", int, 20, "n, all workers (a client population: up to 10⁷)", ge=1, le=10_000_000),
    Key("byzantine", "byzantine", int, 0, "workers that actually attack", ge=0),
    Key("rounds", "rounds", int, 200, "training rounds (server steps)", ge=1),
    Key("seed", "seed", int, 0, "the one seed; split into named streams", ge=0),
    Key("eval_every", "eval_every", int, 20, "evaluate every this many rounds (and at the end)", ge=1),
    Key("checkpoint_every", "checkpoint_every", int, 100, "write a checkpoint every this many rounds", ge=1),
    Key("sign_key", "sign_key", str | None, None, "sign every finished run directory with this PEM private key "
        "(phalanx keygen; needs phalanx[signing]; docs/reliability.md)", neutral=True),
    Key("verify_key", "verify_key", str | None, None, "check a run directory's signature with this PEM public key "
        "when it resumes and before a finished run's results are used (a finished run must be signed)", neutral=True),
    Key("tracking", "tracking", list[str], [], "experiment trackers that also receive the run: its config as "
        "parameters and every metric row as it is made — 'tensorboard', 'mlflow', 'wandb' (a list, or one name), a "
        "plug-in's name or a 'module:attr' spec (docs/tracking.md); changes no result", neutral=True),
    Key("tracking_params", "tracking_params", dict[str, dict[str, Any]], {}, "each tracker's parameters, by its name: "
        "uri (TensorBoard: the log directory; MLflow: a local store or a server URI; W&B: the directory), and "
        "experiment (MLflow), project, entity, mode, group (W&B) (docs/tracking.md)", neutral=True),
), "the run's size, clock, seed and records (RunShape)")
"""``[run]``: what :class:`RunShape` reads, and the run's records (signing, tracking)."""


@register
@dataclass(frozen=True)
class RunShape:
    """The run's size and clock: ``workers``, ``byzantine``, ``rounds``, ``eval_every``, ``eval_clients``,
    ``lr`` (the config's learning rate) and the model's normalisation ``norm``; ``processes``: how many processes a
    torchrun run of it has, as its algorithm says."""

    section: ClassVar[Section] = RUN

    workers: int
    byzantine: int
    rounds: int
    eval_every: int
    eval_clients: int
    lr: float
    norm: Any
    processes: int


ALGORITHM = Section("algorithm", (
    Key("name", "algorithm", str, "dsgd", "the round: 'dsgd' (every worker one gradient step, worker momentum), "
        "'fedavg' (sampled clients, local steps, pseudo-gradient updates; docs/federated.md), 'gossip' (no server: "
        "decentralized SGD over `graph`; docs/decentralized.md), 'anytime' (Decentralized Anytime SGD over `graph`: "
        "gradients at the running weighted average of the iterates; momentum = 0), or your own: a 'module:attr' spec "
        "of a RoundAlgorithm subclass or a plug-in's name (docs/extending.md)"),
    Key("params", "algorithm_params", dict[str, Any], {}, "the constructor parameters of a round algorithm of your own "
        "(the built-in ones take their config keys)"),
    Key("eval_clients", "eval_clients", int, 100, "fedavg, norm = 'fedbn' (no global model): evaluate every honest "
        "client's own model, or this many evenly spaced ones when there are more", ge=1),
), "the round algorithm (AlgorithmSpec); its other keys are its constructor's (phalanx list algorithms)")
"""``[algorithm]``'s keys that no constructor declares (the rest: :mod:`phalanx.experiments.sections`)."""
RULE = Section("rule", (
    Key("spec", "aggregator", str, "cwtm", "aggregator spec, e.g. 'nnm>cwtm' (phalanx list aggregators)"),
    Key("f", "f", int, 0, "Byzantine workers the aggregator is configured to tolerate", ge=0),
), "the robust rule the algorithm builds (AlgorithmSpec.aggregator, .f)")
"""``[rule]``: what the algorithm reads to build its rule (``[rule] pre`` is written before ``spec``)."""
ATTACK = Section("attack", (
    Key("name", "attack", str, "none", "attack name (phalanx list attacks)"),
    Key("params", "attack_params", dict[str, Any], {}, "attack parameters"),
    Key("knowledge", "attack_knowledge", Knowledge, "omniscient", "what a vector attack sees: 'omniscient' (every "
        "honest vector of the round) or 'colluders' (only the Byzantine workers' own honest computations, on their "
        "own shards; dsgd and fedavg, simulated engine; docs/attacks.md)"),
), "the attack the algorithm builds (AlgorithmSpec.attack …); its other keys are its constructor's")
"""``[attack]``'s keys that no constructor declares (the rest: :func:`phalanx.experiments.sections.attack_section`)."""
SERVER_OPTIMIZER = Section("server.optimizer", (
    Key("name", "server_optimizer", str, "sgd", "the server optimizer that applies the aggregate (sgd)"),
    Key("params", "server_optimizer_params", dict[str, Any], {}, "further parameters of the server optimizer (adam: "
        "beta1, beta2, tau; robust-online: corruptions, gradient_bound)"),
    Key("schedule", "schedule", Schedule, "constant", "learning-rate schedule"),
    Key("step_every", "step_every", int, 100, "'step' schedule: divide lr by 10 every this many rounds", ge=1),
), "the server's step (AlgorithmSpec.schedule, .step_every; the optimizer: legacy.optimizer)")
"""``[server.optimizer]``'s keys that the optimizer's constructor does not declare (its ``lr``: the algorithm's
``lr_role``; SGD's ``momentum``, ``weight_decay``: :data:`phalanx.experiments.legacy.SGD`)."""


WORKERS = Section("algorithm", (
    Key("batch_size", "batch_size", int, 32, "samples per worker per round", ge=1),
    Key("lr", "lr", float, 0.1, "the learning rate (initial): the server's with dsgd, the clients' with fedavg (also "
        "spelled client_lr; server_lr is the server's), the nodes' with gossip and anytime (also spelled node_lr)",
        gt=0),
    Key("momentum", "momentum", float, 0.9, "worker momentum β: mᵢ ← β mᵢ + (1 − β) gᵢ", ge=0, lt=1),
    Key("weight_decay", "weight_decay", float, 0.0, "L2 penalty added to every worker's gradient", ge=0),
), "the workers' optimisation, which every built-in algorithm's constructor takes (AlgorithmSpec.batch_size, .lr, "
   ".momentum, .weight_decay); in the tree, each is its algorithm's constructor parameter, lr by its role")
"""The keys every built-in round algorithm reads (no constructor of one declares them for all): not a table of the
tree's own — ``[algorithm]`` has them as its algorithm's constructor parameters (:func:`phalanx.experiments.tree.
algorithm_keys`), ``lr`` in ``[algorithm]`` or ``[server.optimizer]`` by the algorithm's ``lr_role``
(:func:`phalanx.experiments.tree.lr_homes`), and an algorithm of one's own takes any of them as
``algorithm_params.<p>``."""


@register
@dataclass(frozen=True)
class AlgorithmSpec:
    """The round algorithm's section: its name and class, its ``algorithm_params``, and the config keys a round
    algorithm's hooks read — the population and the rule (``workers``, ``byzantine``, ``f``, ``aggregator``), the
    attack, the engine, the workers' optimisation, the schedule and the built-in algorithms' own keys
    (:func:`~phalanx.training.algorithms.builtin.own_keys`) — by their config names."""

    sections: ClassVar[tuple[Section, ...]] = (ALGORITHM, RULE, ATTACK, SERVER_OPTIMIZER)
    """Its keys' sections: ``[algorithm]``, ``[rule]``, ``[attack]``, ``[server.optimizer]``."""
    workers_section: ClassVar[Section] = WORKERS
    """The workers' optimisation (:data:`WORKERS`): ``batch_size``, ``lr``, ``momentum``, ``weight_decay``."""

    algorithm: str
    cls: type[RoundAlgorithm]
    algorithm_params: dict[str, Any]
    workers: int
    byzantine: int
    f: int
    aggregator: str
    attack: str
    attack_params: dict[str, Any]
    attack_knowledge: str
    engine: str
    topology: str
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    schedule: Schedule
    rounds: int
    step_every: int
    own: dict[str, Any] = field(default_factory=dict)
    """The built-in algorithms' own keys (``clients_per_round``, ``graph`` …), read as attributes too."""

    def __getattr__(self, name: str) -> Any:
        own = self.__dict__.get("own", {})
        if name in own:
            return own[name]
        raise AttributeError(name)


STAGES = register(Section("stages", (), "the round's stages, each its own [stages.<name>] table (phalanx list "
                            "stages)"))
"""``[stages.<name>]``: the stages' own tables, read by the stages' adapter (:mod:`phalanx.experiments.legacy`)
and each stage's ``configure``; registered here for its place in the tree, between ``[server.optimizer]`` and
``[data]``."""


DATA = Section("data", (
    Key("name", "dataset", str, "digits", "data set name (phalanx list datasets) or a 'module:attr' loader"),
    Key("params", "dataset_params", dict[str, Any], {}, "the data set loader's own parameters (a registered or "
        "'module:attr' loader's; or inline: dataset = 'mylab.data:cancer(seed=1)')"),
    Key("data_root", "data_root", str | None, None, "directory holding the data set files"),
    Key("download", "download", bool, False, "download the data set (torchvision's mirrors, MD5-checked) when it is "
        "found nowhere; off by default: nothing touches the network unless asked", neutral=True),
    Key("partition", "partition", Partition, "iid", "how training data is split between workers ('natural': each "
        "writer / speaker of a data set with user ids is one worker; docs/data.md)"),
    Key("alpha", "alpha", float, 1.0, "Dirichlet concentration (partition = 'dirichlet')", gt=0),
    Key("classes_per_worker", "classes_per_worker", int, 2, "classes per worker (partition = 'pathological')", ge=1),
), "loading and splitting the data (DataSpec)")
"""``[data]``: what :class:`DataSpec` reads."""


@register
@dataclass(frozen=True)
class DataSpec:
    """What loading and splitting the data read: the data set's ``name`` with its ``params``, ``root`` and
    ``download`` flag; the split (``workers``, ``partition``, ``alpha``, ``classes_per_worker``, the ``seed`` its
    stream is drawn from); the ``algorithm`` and whether it ``samples_population`` (a client population needs one
    that does)."""

    section: ClassVar[Section] = DATA

    name: str
    params: dict[str, Any]
    root: str | None
    download: bool
    workers: int
    partition: str
    alpha: float
    classes_per_worker: int
    seed: int
    algorithm: str
    samples_population: bool

    def key(self) -> tuple[str, str, str | None]:
        """The data set itself (not its split), as a key: equal loads, equal keys."""
        from phalanx import data

        return data.canonical(self.name), json.dumps(self.params, sort_keys=True, default=repr), self.root

    def split_key(self) -> tuple[Any, ...]:
        """The data split, as a key (equal splits, equal keys)."""
        return (self.name, json.dumps(self.params, sort_keys=True, default=repr), self.root, self.workers,
                self.partition, self.alpha, self.classes_per_worker, self.seed)


MODEL = Section("model", (
    Key("name", "model", str, "mlp", "model name (phalanx list models) or a 'module:attr' builder"),
    Key("params", "model_params", dict[str, Any], {}, "extra model parameters"),
    Key("loss", "loss", str, "cross_entropy", "loss(logits, y), the batch mean: a name or a 'module:attr' spec"),
), "building the model (ModelSpec); its other keys are the builder's parameters")
"""``[model]``: what :class:`ModelSpec` reads (a key it does not declare is the builder's: ``model_params.<p>``)."""


@register
@dataclass(frozen=True)
class ModelSpec:
    """What building the model reads: its ``name`` and ``params``, the ``seed`` of its ``init`` stream, the
    ``loss``, the ``dataset`` named in its errors, and the rows its workers hold (``workers``, ``processes``) for the
    memory check."""

    section: ClassVar[Section] = MODEL

    name: str
    params: dict[str, Any]
    seed: int
    loss: str
    dataset: str
    workers: int
    processes: int

    @property
    def norm(self) -> Any:
        """``model_params.norm``, as given (None when unset)."""
        return self.params.get("norm")


ENGINE = Section("engine", (
    Key("name", "engine", Engine, "simulated", "where workers run: 'simulated' (one process, vmap) or 'torchrun' (one "
        "process per worker, torch.distributed; start it with `phalanx launch` or torchrun, docs/distributed.md)"),
    Key("topology", "topology", str, "server", "torchrun engine: 'server' (rank 0 aggregates and broadcasts θ; "
        "survives missing workers), 'serverless' (every rank aggregates the all-gathered vectors; needs every rank "
        "alive), 'gossip' (algorithm = 'gossip', where it is implied: a rank per node, exchanging with its graph "
        "neighbours only), or a topology of one's own (a registered name or a 'module:attr' spec; docs/extending.md); "
        "the default is the first topology the algorithm runs on"),
    Key("round_timeout", "round_timeout", float, 30.0, "torchrun engine: seconds the server waits for the vectors of "
        "a round; workers still missing then count against f", gt=0, le=86_400),
    Key("device", "device", str, "cpu", "where the simulated engine (and a torchrun rank) computes: 'cpu', 'cuda', "
        "'cuda:N' or 'auto' (cuda when available, else cpu); random draws stay on the CPU (docs/cluster.md, GPUs)",
        neutral=True),
    Key("backend", "backend", Backend, "auto", "torchrun engine, serverless topology: torch.distributed backend "
        "('auto': nccl when CUDA is available, else gloo)"),
    Key("keys", "keys", str | None, None, "torchrun engine: a key directory (phalanx keys init DIR --workers N): "
        "mutual TLS between the ranks of every topology (worker and server; the serverless and gossip mesh), every "
        "vector signed, who was heard recorded in the run's transcript (phalanx audit; docs/security.md)",
        neutral=True),
    Key("insecure", "insecure", bool, False, "torchrun engine: allow ranks on several machines without keys (nothing "
        "then checks who is speaking; docs/security.md)", neutral=True),
), "where the run computes and how its processes talk (DeviceSpec)")
"""``[engine]``: what :class:`DeviceSpec` reads (and the torchrun engine's transport)."""


@register
@dataclass(frozen=True)
class DeviceSpec:
    """Where a run computes and how its processes talk: ``device``, ``engine``, ``topology``, ``backend``, whether
    it has ``keys`` (a sealed mesh), and whether its ``algorithm`` runs ``on_device``."""

    section: ClassVar[Section] = ENGINE

    device: str
    engine: str
    topology: str
    backend: str
    keys: bool
    algorithm: str
    on_device: bool


def declared() -> tuple[Section, ...]:
    """The declared sections, read from the values that declare them (each time: a declaration replaced — a
    plug-in's, a test's — is the one read), in the order they were registered
    (:mod:`phalanx.experiments.section_registry`): the built-in ones, as this module declares them — ``[run]``,
    ``[algorithm]``, ``[rule]``, ``[attack]``, ``[server.optimizer]``, ``[data]``, ``[model]``, ``[engine]`` — then
    each plug-in's (an entry point of ``phalanx.sections``)."""
    return REGISTRY.declared()


def checked() -> tuple[Section, ...]:
    """Every declaration of a flat key, each key declared once, by the component that reads it (each time: a
    declaration replaced is the one read): the tree's sections (:func:`declared`), the workers' optimisation
    (``AlgorithmSpec.workers_section``), each built-in round algorithm's own keys (its ``config_section``:
    federated averaging's ``clients_per_round`` …, gossip's ``graph`` …), the SGD server optimizer's
    (``server_momentum``, ``server_weight_decay``) and client-level differential privacy's (``dp_noise``,
    ``dp_clip``, ``dp_delta``). The run config's fields are made from them (checked by
    :func:`phalanx.experiments.declare.bind`) and their ranges are the only ones checked
    (:func:`phalanx.experiments.declare.check`): the schema has none of its own."""
    own: list[Section] = []
    for cls in builtin.BUILT_IN.values():  # Anytime SGD's is gossip's (inherited); distributed SGD has none
        if cls.config_section.keys and not any(s is cls.config_section for s in own):
            own.append(cls.config_section)
    return (*declared(), AlgorithmSpec.workers_section, *own, SGD.config_section, ClientDP.config_section)
