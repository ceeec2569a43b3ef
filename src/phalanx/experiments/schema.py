"""The run configuration's schema: every key of one training run, its type, default and description, and which
keys name a run (its identity). Every key is declared by the component that reads it
(:func:`phalanx.experiments.concerns.checked`): the sections that no constructor declares (``[run]``, ``[data]``,
``[model]``, ``[engine]``, ``[rule]``, ``[server.optimizer]``, and ``[algorithm]``'s and ``[attack]``'s own) by
the values that read them (:mod:`phalanx.experiments.concerns`), the workers' optimisation (``batch_size``, ``lr``
…) by :class:`~phalanx.experiments.concerns.AlgorithmSpec`, a built-in algorithm's own keys by its class
(``FedAvg.config_section``: ``clients_per_round`` …; gossip's ``graph`` …), SGD's ``server_momentum`` and
``server_weight_decay`` by :class:`~phalanx.training.optim.SGD`, ``dp_noise``, ``dp_clip``, ``dp_delta`` by the
privacy stage (:class:`~phalanx.training.stages.privacy.ClientDP`); the stages' adapter's own three
(``server_projection``, ``server_projection_params``, ``stages``: :mod:`phalanx.experiments.legacy`), which have no
range, keep their fields here. The declared keys' fields here are made from those
declarations (:meth:`~phalanx.validate.Section.field`; :func:`~phalanx.experiments.declare.bind` checks each
annotation against the declared type) and their ranges are checked by them, once
(:func:`phalanx.experiments.declare.check`), not by pydantic: no field here has a range of its own
(``tests/test_sections_declared.py::test_the_schema_checks_no_range_of_its_own``). A plug-in's section (found by
its entry point before this module is made: :mod:`phalanx.experiments.section_registry`) has no line here: its
keys' fields are made from its declaration when this module is imported (:data:`SECTION_KEYS`), each a later key,
and a result-neutral section's keys join :data:`RESULT_NEUTRAL_KEYS`.
:mod:`phalanx.experiments.config` validates a table of keys into it (the relations between keys, the names
against the registries) and loads it from TOML.

``workers`` is n, all of them; ``byzantine`` is how many *actually* attack; ``f`` is how many the aggregator is
*configured* to tolerate. The three are kept apart everywhere: the gap between ``f`` and ``byzantine`` is what the
price-of-robustness experiments measure (Yang, Shi & Li, ICML 2025).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from phalanx.experiments import declare, section_registry
from phalanx.experiments.concerns import (
    ALGORITHM,
    ATTACK,
    DATA,
    ENGINE,
    MODEL,
    RULE,
    RUN,
    SERVER_OPTIMIZER,
    WORKERS,
    Backend,
    Engine,
    Knowledge,
    Partition,
    Schedule,
    checked,
)
from phalanx.training.algorithms import builtin
from phalanx.training.algorithms.base import RoundAlgorithm
from phalanx.training.algorithms.fedavg import FedAvg
from phalanx.training.algorithms.gossip import Gossip
from phalanx.training.optim import SGD
from phalanx.training.stages.privacy import ClientDP, resolved_source

FEDAVG, GOSSIP, SERVER_SGD, DP = (FedAvg.config_section, Gossip.config_section, SGD.config_section,
                                  ClientDP.config_section)
"""The declarations of the components' own flat keys that the fields below are made from (each component's
``config_section``: :func:`phalanx.experiments.concerns.checked`)."""

__all__ = ["DISTRIBUTED_KEYS", "LATER_KEYS", "MAX_ROWS", "RESULT_NEUTRAL_KEYS", "SECTION_KEYS", "Backend", "Engine",
           "Knowledge", "Partition", "RunConfig", "Schedule", "result_neutral_keys"]
DISTRIBUTED_KEYS = ("topology", "round_timeout", "backend", "keys", "insecure")
"""Keys that only the ``torchrun`` engine reads. A simulated run's resolved config leaves them out, so that they
change neither its results nor its run id / ``config.json`` (run directories written before they existed resume)."""
LATER_KEYS: tuple[str, ...] = (
    "server_optimizer", *SERVER_SGD.flat_keys(), "server_optimizer_params", "loss", "algorithm",
    "clients_per_round", "local_steps", "local_epochs", "server_lr", "prox_mu", "stats_batch", "stats_momentum",
    "graph", "graph_params", "gossip_weights", "eval_clients", "device", "keys", "insecure", "algorithm_params",
    "tracking", "tracking_params", "attack_knowledge",
    *DP.flat_keys(), "dataset_params", "server_projection", "server_projection_params", "stages",
)
"""Keys added after the first release: a resolved config leaves them out while they hold their default, so a config
that does not use them keeps its run id and ``config.json`` (run directories written before they existed resume).
SGD's and the privacy stage's flat keys are named by their declarations (``server_momentum``, ``server_weight_decay``;
``dp_noise``, ``dp_clip``, ``dp_delta``), so that each is named in code by its component and the adapter alone."""
MAX_ROWS = 1_000_000
"""The most metric rows one run may make (one per evaluated round, and round 0): a run keeps them in memory and
rewrites ``metrics.jsonl`` with all of them at every checkpoint (0.38 kB a row in the default job's: about 0.4 GB at
the bound)."""


def result_neutral_keys() -> tuple[str, ...]:
    """The flat keys declared result-neutral (:func:`phalanx.experiments.concerns.checked`): each key declared
    ``neutral``, and every key of a section declared ``result_neutral`` (a plug-in's ``[run_notes]``)."""
    return tuple(k.flat for s in checked() for k in s.keys if "." not in k.flat and (k.neutral or s.result_neutral))


RESULT_NEUTRAL_KEYS: tuple[str, ...] = result_neutral_keys()
"""Keys that change how a run gets its inputs, never its results: left out of a run's identity (its run id and the
check that a run directory holds the same configuration), so setting them does not orphan finished runs. ``device``
computes the same rounds with the same random draws elsewhere (equal up to floating-point rounding; the run's
manifest records where it ran), so a run started on one device resumes on another. ``tracking`` and
``tracking_params`` say where the metric rows are also sent (TensorBoard, MLflow, W&B): a run tracked or not is the
same run. Read from the declarations (each key's ``neutral``: ``download`` on ``[data]``, ``sign_key``,
``verify_key``, ``tracking``, ``tracking_params`` on ``[run]``, ``device``, ``keys``, ``insecure`` on
``[engine]``; a section's ``result_neutral``), not listed here."""


class RunConfig(BaseModel):
    """Everything that defines one training run. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    dataset: str = DATA.field("name")
    dataset_params: dict[str, Any] = DATA.field("params")
    data_root: str | None = DATA.field("data_root")
    download: bool = DATA.field("download")
    sign_key: str | None = RUN.field("sign_key")
    verify_key: str | None = RUN.field("verify_key")
    model: str = MODEL.field("name")
    model_params: dict[str, Any] = MODEL.field("params")
    workers: int = RUN.field("workers")
    byzantine: int = RUN.field("byzantine")
    f: int = RULE.field("f")
    aggregator: str = RULE.field("spec")
    attack: str = ATTACK.field("name")
    attack_params: dict[str, Any] = ATTACK.field("params")
    attack_knowledge: Knowledge = ATTACK.field("knowledge")
    partition: Partition = DATA.field("partition")
    alpha: float = DATA.field("alpha")
    classes_per_worker: int = DATA.field("classes_per_worker")
    rounds: int = RUN.field("rounds")
    batch_size: int = WORKERS.field("batch_size")
    lr: float = WORKERS.field("lr")
    momentum: float = WORKERS.field("momentum")
    weight_decay: float = WORKERS.field("weight_decay")
    schedule: Schedule = SERVER_OPTIMIZER.field("schedule")
    server_optimizer: str = SERVER_OPTIMIZER.field("name")
    server_momentum: float = SERVER_SGD.field("momentum")
    server_weight_decay: float = SERVER_SGD.field("weight_decay")
    loss: str = MODEL.field("loss")
    server_optimizer_params: dict[str, Any] = SERVER_OPTIMIZER.field("params")
    server_projection: str | None = Field(
        None, description="what the server does to its model after every step: 'crfl' (CRFL: clip θ to norm ρ and add "
        "N(0, σ²I) in every round but the last; the final row carries the smoothed classifier's accuracy, attack "
        "success and certified radius; Xie et al., ICML 2021; docs/aggregators.md); unset: nothing",
    )
    server_projection_params: dict[str, Any] = Field(
        default_factory=dict, description="the server projection's parameters (crfl: clip, noise, clip_growth, "
        "test_noise, samples, alpha, and the certificate's threat: attackers, weight, scale, local_steps, client_lr, "
        "poison_fraction, lipschitz, attack_rounds — defaults from the run)",
    )
    algorithm: str = ALGORITHM.field("name")
    algorithm_params: dict[str, Any] = ALGORITHM.field("params")
    graph: str = GOSSIP.field("graph")
    graph_params: dict[str, Any] = GOSSIP.field("graph_params")
    gossip_weights: str = GOSSIP.field("weights")
    clients_per_round: int | None = FEDAVG.field("clients_per_round")
    local_steps: int = FEDAVG.field("local_steps")
    local_epochs: float | None = FEDAVG.field("local_epochs")
    server_lr: float = FEDAVG.field("server_lr")
    prox_mu: float = FEDAVG.field("prox_mu")
    stats_batch: int = FEDAVG.field("stats_batch")
    stats_momentum: float = FEDAVG.field("stats_momentum")
    eval_clients: int = ALGORITHM.field("eval_clients")
    dp_noise: float | None = DP.field("noise")
    dp_clip: float | None = DP.field("clip")
    dp_delta: float = DP.field("delta")
    dp_noise_source: Literal["seed", "secret"] | None = DP.field("source")
    step_every: int = SERVER_OPTIMIZER.field("step_every")
    seed: int = RUN.field("seed")
    eval_every: int = RUN.field("eval_every")
    checkpoint_every: int = RUN.field("checkpoint_every")
    engine: Engine = ENGINE.field("name")
    topology: str = ENGINE.field("topology")
    round_timeout: float = ENGINE.field("round_timeout")
    device: str = ENGINE.field("device")
    backend: Backend = ENGINE.field("backend")
    keys: str | None = ENGINE.field("keys")
    insecure: bool = ENGINE.field("insecure")

    stages: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="stages of the round, each its own section: [stages.<name>] with its "
        "parameters (phalanx list stages; e.g. [stages.fail_closed] window = 5); the built-in crfl and dp are turned "
        "on by server_projection and dp_noise (docs/design.md, 'Stages')",
    )
    tracking: list[str] = RUN.field("tracking")
    tracking_params: dict[str, dict[str, Any]] = RUN.field("tracking_params")

    @field_validator("tracking", mode="before")
    @classmethod
    def _one_tracker(cls, value: Any) -> Any:
        """``tracking = "mlflow"`` is ``tracking = ["mlflow"]``."""
        return [value] if isinstance(value, str) else value

    @property
    def algorithm_class(self) -> type[RoundAlgorithm]:
        """The class of ``algorithm``, resolved once for this config (a built-in one, a registered name, a
        ``module:attr`` spec or an entry point); kept with the name it was resolved from, so that a copy with another
        ``algorithm`` resolves its own."""
        cached = self.__dict__.get("_algorithm_class")
        if cached is None or cached[0] != self.algorithm:
            cached = (self.algorithm, builtin.algorithm_class(self.algorithm))
            self.__dict__["_algorithm_class"] = cached  # beside the fields: not dumped, compared or pickled
        cls: type[RoundAlgorithm] = cached[1]
        return cls

    def __getstate__(self) -> dict[Any, Any]:
        """Pickled (to a sweep's worker process) without what this process resolved for it (the algorithm's class):
        the other process resolves its own."""
        state: dict[Any, Any] = super().__getstate__()
        fields = type(self).model_fields
        return {**state, "__dict__": {k: v for k, v in state["__dict__"].items() if k in fields}}

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if self.engine == "simulated":
            for key in DISTRIBUTED_KEYS:
                out.pop(key, None)
        for key in LATER_KEYS:
            if key in out and out[key] == type(self).model_fields[key].get_default(call_default_factory=True):
                out.pop(key)
        if out.get("dp_noise_source") == resolved_source(None, self.engine):  # its engine's default, spelled out:
            out.pop("dp_noise_source")  # the same run as unset, one run id
        return out

    def identity(self) -> dict[str, Any]:
        """The resolved config without the result-neutral keys: what names a run and what a resume must match."""
        out: dict[str, Any] = self.model_dump(mode="json")
        for key in RESULT_NEUTRAL_KEYS:
            out.pop(key, None)
        return out

    def described(self) -> dict[str, Any]:
        """The resolved config — the result-neutral keys included (``tracking``, ``device``, a result-neutral
        section's keys: ``[run_notes] title``), which :meth:`identity` leaves out: what a tracker is told of its run
        (:attr:`~phalanx.experiments.tracking.base.TrackedRun.params`, flattened) — all but :data:`UNTOLD_KEYS`: the
        trackers' own settings, whose URI may carry a credential (``https://user:token@host``), and where the key
        material is, are never sent to a tracking server."""
        out: dict[str, Any] = self.model_dump(mode="json", exclude=set(UNTOLD_KEYS))
        return out

    def label(self) -> str:
        """A short human label of the setting."""
        return (
            f"{self.aggregator} f={self.f} | {self.attack} b={self.byzantine} | {self.partition}"
            + (f" α={self.alpha:g}" if self.partition == "dirichlet" else "")
            + f" | seed={self.seed}"
        )



UNTOLD_KEYS = ("tracking_params", "sign_key", "verify_key", "keys")
"""Keys :meth:`RunConfig.described` leaves out: the trackers' own settings (a URI may hold a credential) and the paths
of the run's key material — neither says anything about the result, and a tracking server is not told them."""


def _section_fields() -> tuple[str, ...]:
    """Make the fields of the keys no field above has — a plug-in's section's (found by its entry point before
    this runs: :mod:`phalanx.experiments.section_registry`) — from their declarations (:meth:`Key.field`, the
    declared type as the annotation), and return their flat keys. A flat key declared twice (a plug-in's key that a
    built-in component, or the stages' adapter, already declares) is a one-line :class:`ConfigError`."""
    from pydantic.fields import FieldInfo

    from phalanx.errors import ConfigError

    seen: dict[str, str] = dict.fromkeys(("server_projection", "server_projection_params", "stages"), "[stages]")
    made: list[str] = []
    for section in checked():
        for key in section.keys:
            if "." in key.flat:
                continue
            if key.flat in seen:
                raise ConfigError(f"[{section.name}].{key.key}", key.flat, f"a flat key no other component declares "
                                  f"({seen[key.flat]} declares {key.flat})")
            seen[key.flat] = f"[{section.name}]"
            if key.flat not in RunConfig.__pydantic_fields__:
                RunConfig.__pydantic_fields__[key.flat] = FieldInfo.from_annotated_attribute(key.type, key.field())
                made.append(key.flat)
    if made:
        RunConfig.model_rebuild(force=True)
    return tuple(made)


SECTION_KEYS = _section_fields()
"""The flat keys whose fields were made from a plug-in's section (none without one): each is a later key (left out
of the identity while at its default, so every run id on disk stays), and a result-neutral section's never enters
it."""
LATER_KEYS = (*LATER_KEYS, *SECTION_KEYS)
declare.bind(RunConfig.model_fields, checked())
section_registry.REGISTRY.closed = True  # the fields are made: a section registered now would have none
