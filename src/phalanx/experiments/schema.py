"""The run configuration's schema: every key of one training run, its type, range, default and description, and
which keys name a run (its identity). :mod:`phalanx.experiments.config` validates a table of keys into it (the
relations between keys, the names against the registries) and loads it from TOML.

``workers`` is n, all of them; ``byzantine`` is how many *actually* attack; ``f`` is how many the aggregator is
*configured* to tolerate. The three are kept apart everywhere: the gap between ``f`` and ``byzantine`` is what the
price-of-robustness experiments measure (Yang, Shi & Li, ICML 2025).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from phalanx.training.algorithms import builtin
from phalanx.training.algorithms.base import RoundAlgorithm

Schedule = Literal["constant", "step", "cosine"]
Partition = Literal["iid", "dirichlet", "pathological", "natural"]
Engine = Literal["simulated", "torchrun"]
Backend = Literal["auto", "gloo", "nccl"]
Knowledge = Literal["omniscient", "colluders"]
DISTRIBUTED_KEYS = ("topology", "round_timeout", "backend", "keys", "insecure")
"""Keys that only the ``torchrun`` engine reads. A simulated run's resolved config leaves them out, so that they
change neither its results nor its run id / ``config.json`` (run directories written before they existed resume)."""
LATER_KEYS = (
    "server_optimizer", "server_momentum", "server_weight_decay", "server_optimizer_params", "loss", "algorithm",
    "clients_per_round", "local_steps", "local_epochs", "server_lr", "prox_mu", "stats_batch", "stats_momentum",
    "graph", "graph_params", "gossip_weights", "eval_clients", "device", "keys", "insecure", "algorithm_params",
    "tracking", "tracking_params", "attack_knowledge",
    "dp_clip", "dp_noise", "dp_delta", "dataset_params", "server_projection", "server_projection_params", "stages",
)
"""Keys added after the first release: a resolved config leaves them out while they hold their default, so a config
that does not use them keeps its run id and ``config.json`` (run directories written before they existed resume)."""
MAX_ROWS = 1_000_000
"""The most metric rows one run may make (one per evaluated round, and round 0): a run keeps them in memory and
rewrites ``metrics.jsonl`` with all of them at every checkpoint (0.38 kB a row in the default job's: about 0.4 GB at
the bound)."""


RESULT_NEUTRAL_KEYS = (
    "download", "sign_key", "verify_key", "device", "keys", "insecure", "tracking", "tracking_params",
)
"""Keys that change how a run gets its inputs, never its results: left out of a run's identity (its run id and the
check that a run directory holds the same configuration), so setting them does not orphan finished runs. ``device``
computes the same rounds with the same random draws elsewhere (equal up to floating-point rounding; the run's
manifest records where it ran), so a run started on one device resumes on another. ``tracking`` and
``tracking_params`` say where the metric rows are also sent (TensorBoard, MLflow, W&B): a run tracked or not is the
same run."""


class RunConfig(BaseModel):
    """Everything that defines one training run. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    dataset: str = Field("digits", description="data set name (phalanx list datasets) or a 'module:attr' loader")
    dataset_params: dict[str, Any] = Field(
        default_factory=dict, description="the data set loader's own parameters (a registered or 'module:attr' "
        "loader's; or inline: dataset = 'mylab.data:cancer(seed=1)')",
    )
    data_root: str | None = Field(None, description="directory holding the data set files")
    download: bool = Field(
        False, description="download the data set (torchvision's mirrors, MD5-checked) when it is found nowhere; "
        "off by default: nothing touches the network unless asked",
    )
    sign_key: str | None = Field(
        None, description="sign every finished run directory with this PEM private key (phalanx keygen; needs "
        "phalanx[signing]; docs/reliability.md)",
    )
    verify_key: str | None = Field(
        None, description="check a run directory's signature with this PEM public key when it resumes and before a "
        "finished run's results are used (a finished run must be signed)",
    )
    model: str = Field("mlp", description="model name (phalanx list models) or a 'module:attr' builder")
    model_params: dict[str, Any] = Field(default_factory=dict, description="extra model parameters")
    workers: int = Field(20, ge=1, le=10_000_000, description="n, all workers (a client population: up to 10⁷)")
    byzantine: int = Field(0, ge=0, description="workers that actually attack")
    f: int = Field(0, ge=0, description="Byzantine workers the aggregator is configured to tolerate")
    aggregator: str = Field("cwtm", description="aggregator spec, e.g. 'nnm>cwtm' (phalanx list aggregators)")
    attack: str = Field("none", description="attack name (phalanx list attacks)")
    attack_params: dict[str, Any] = Field(default_factory=dict, description="attack parameters")
    attack_knowledge: Knowledge = Field(
        "omniscient", description="what a vector attack sees: 'omniscient' (every honest vector of the round) or "
        "'colluders' (only the Byzantine workers' own honest computations, on their own shards; dsgd and fedavg, "
        "simulated engine; docs/attacks.md)",
    )
    partition: Partition = Field("iid", description="how training data is split between workers ('natural': each "
                                 "writer / speaker of a data set with user ids is one worker; docs/data.md)")
    alpha: float = Field(1.0, gt=0, description="Dirichlet concentration (partition = 'dirichlet')")
    classes_per_worker: int = Field(2, ge=1, description="classes per worker (partition = 'pathological')")
    rounds: int = Field(200, ge=1, description="training rounds (server steps)")
    batch_size: int = Field(32, ge=1, description="samples per worker per round")
    lr: float = Field(0.1, gt=0, description="the learning rate (initial): the server's with dsgd, the clients' with "
                      "fedavg (also spelled client_lr; server_lr is the server's), the nodes' with gossip and anytime "
                      "(also spelled node_lr)")
    momentum: float = Field(0.9, ge=0, lt=1, description="worker momentum β: mᵢ ← β mᵢ + (1 − β) gᵢ")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty added to every worker's gradient")
    schedule: Schedule = Field("constant", description="learning-rate schedule")
    server_optimizer: str = Field("sgd", description="the server optimizer that applies the aggregate (sgd)")
    server_momentum: float = Field(
        0.0, ge=0, lt=1, description="server momentum μ: u ← μ u + Agg, θ ← θ − η u (0: plain θ ← θ − η Agg)",
    )
    server_weight_decay: float = Field(0.0, ge=0, description="L2 penalty λ the server adds to the aggregate")
    loss: str = Field("cross_entropy", description="loss(logits, y), the batch mean: a name or a 'module:attr' spec")
    server_optimizer_params: dict[str, Any] = Field(
        default_factory=dict, description="further parameters of the server optimizer (adam: beta1, beta2, tau; "
        "robust-online: corruptions, gradient_bound)",
    )
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
    algorithm: str = Field(
        "dsgd", description="the round: 'dsgd' (every worker one gradient step, worker momentum), 'fedavg' (sampled "
        "clients, local steps, pseudo-gradient updates; docs/federated.md), 'gossip' (no server: decentralized SGD "
        "over `graph`; docs/decentralized.md), 'anytime' (Decentralized Anytime SGD over `graph`: gradients at the "
        "running weighted average of the iterates; momentum = 0), or your own: a 'module:attr' spec of a "
        "RoundAlgorithm subclass or a plug-in's name (docs/extending.md)",
    )
    algorithm_params: dict[str, Any] = Field(
        default_factory=dict, description="the constructor parameters of a round algorithm of your own (the built-in "
        "ones take their config keys)",
    )
    graph: str = Field("ring", description="gossip: the communication graph (ring, torus, complete, star, "
                       "erdos_renyi, exponential, hypercube, or a 'module:attr' builder) over the `workers` nodes")
    graph_params: dict[str, Any] = Field(default_factory=dict, description="gossip: the graph's parameters "
                                         "(erdos_renyi: p, seed; torus: rows, cols)")
    gossip_weights: str = Field("metropolis_hastings", description="gossip: the mixing matrix of plain gossip "
                                "(aggregator = 'mean'): metropolis_hastings or uniform_neighbour")
    clients_per_round: int | None = Field(
        None, ge=1, description="fedavg: clients sampled per round (default: all `workers`, the population)",
    )
    local_steps: int = Field(1, ge=1, description="fedavg: local SGD steps per sampled client and round")
    local_epochs: float | None = Field(
        None, gt=0, description="fedavg: local passes over the client's shard (instead of local_steps)",
    )
    server_lr: float = Field(1.0, gt=0, description="fedavg: the server's step size on the aggregated update")
    prox_mu: float = Field(0.0, ge=0, description="fedavg: FedProx's proximal term μ (Li et al., MLSys 2020)")
    stats_batch: int = Field(
        64, ge=1, description="fedavg, a model with norm = 'batch' | 'hybrid': samples each sampled client measures "
        "the normalisation statistics on",
    )
    stats_momentum: float = Field(
        0.1, gt=0, le=1, description="fedavg, norm = 'batch' | 'hybrid': weight of the round's pooled statistics "
        "in the global ones (Hybrid BN's authors: 0.002 over 500 rounds)",
    )
    eval_clients: int = Field(
        100, ge=1, description="fedavg, norm = 'fedbn' (no global model): evaluate every honest client's own model, "
        "or this many evenly spaced ones when there are more",
    )
    dp_noise: float | None = Field(
        None, gt=0, description="client-level differential privacy: the noise multiplier σ — every computing worker "
        "clips its update to norm dp_clip = C and adds N(0, σ²C²·I) itself (dsgd: its gradient, before momentum; "
        "fedavg: its pseudo-gradient); the metric rows carry the budget ε (dp_epsilon, dp_epsilon_local); needs "
        "phalanx[privacy]; off by default (docs/privacy.md)",
    )
    dp_clip: float | None = Field(None, gt=0, description="differential privacy: the clipping norm C of every "
                                  "worker's update (set with dp_noise)")
    dp_delta: float = Field(1e-5, gt=0, lt=1, description="differential privacy: the δ of the reported (ε, δ)")
    step_every: int = Field(100, ge=1, description="'step' schedule: divide lr by 10 every this many rounds")
    seed: int = Field(0, ge=0, description="the one seed; split into named streams")
    eval_every: int = Field(20, ge=1, description="evaluate every this many rounds (and at the end)")
    checkpoint_every: int = Field(100, ge=1, description="write a checkpoint every this many rounds")
    engine: Engine = Field(
        "simulated", description="where workers run: 'simulated' (one process, vmap) or 'torchrun' (one process per "
        "worker, torch.distributed; start it with `phalanx launch` or torchrun, docs/distributed.md)",
    )
    topology: str = Field(
        "server", description="torchrun engine: 'server' (rank 0 aggregates and broadcasts θ; survives missing "
        "workers), 'serverless' (every rank aggregates the all-gathered vectors; needs every rank alive), 'gossip' "
        "(algorithm = 'gossip', where it is implied: a rank per node, exchanging with its graph neighbours only), or "
        "a topology of one's own (a registered name or a 'module:attr' spec; docs/extending.md); the default is the "
        "first topology the algorithm runs on",
    )
    round_timeout: float = Field(
        30.0, gt=0, le=86_400, description="torchrun engine: seconds the server waits for the vectors of a round; "
        "workers still missing then count against f",
    )
    device: str = Field(
        "cpu", description="where the simulated engine (and a torchrun rank) computes: 'cpu', 'cuda', 'cuda:N' or "
        "'auto' (cuda when available, else cpu); random draws stay on the CPU (docs/cluster.md, GPUs)",
    )
    backend: Backend = Field(
        "auto", description="torchrun engine, serverless topology: torch.distributed backend ('auto': nccl when CUDA "
        "is available, else gloo)",
    )
    keys: str | None = Field(
        None, description="torchrun engine: a key directory (phalanx keys init DIR --workers N): mutual TLS between "
        "the ranks of every topology (worker and server; the serverless and gossip mesh), every vector signed, who "
        "was heard recorded in the run's transcript (phalanx audit; docs/security.md)",
    )
    insecure: bool = Field(
        False, description="torchrun engine: allow ranks on several machines without keys (nothing then checks "
        "who is speaking; docs/security.md)",
    )

    stages: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="stages of the round, each its own section: [stages.<name>] with its "
        "parameters (phalanx list stages; e.g. [stages.fail_closed] window = 5); the built-in crfl and dp are turned "
        "on by server_projection and dp_noise (docs/design.md, 'Stages')",
    )
    tracking: list[str] = Field(
        default_factory=list, description="experiment trackers that also receive the run: its config as parameters "
        "and every metric row as it is made — 'tensorboard', 'mlflow', 'wandb' (a list, or one name), a plug-in's "
        "name or a 'module:attr' spec (docs/tracking.md); changes no result",
    )
    tracking_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="each tracker's parameters, by its name: uri (TensorBoard: the log "
        "directory; MLflow: a local store or a server URI; W&B: the directory), and experiment (MLflow), project, "
        "entity, mode, group (W&B) (docs/tracking.md)",
    )

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
        return out

    def identity(self) -> dict[str, Any]:
        """The resolved config without the result-neutral keys: what names a run and what a resume must match."""
        out: dict[str, Any] = self.model_dump(mode="json")
        for key in RESULT_NEUTRAL_KEYS:
            out.pop(key, None)
        return out

    def label(self) -> str:
        """A short human label of the setting."""
        return (
            f"{self.aggregator} f={self.f} | {self.attack} b={self.byzantine} | {self.partition}"
            + (f" α={self.alpha:g}" if self.partition == "dirichlet" else "")
            + f" | seed={self.seed}"
        )

