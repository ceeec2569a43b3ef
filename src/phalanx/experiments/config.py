"""The run configuration: one validated object, loaded from TOML, overridable with ``key=value`` strings.

``workers`` is n, all of them; ``byzantine`` is how many *actually* attack; ``f`` is how many the aggregator is
*configured* to tolerate. The three are kept apart everywhere: the gap between ``f`` and ``byzantine`` is what the
price-of-robustness experiments measure (Yang, Shi & Li, ICML 2025).
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from phalanx import data, models, signing
from phalanx.decentralized import gossip, gossip_attacks, robust_gossip, topology
from phalanx.errors import ConfigError
from phalanx.plugins import accepted_params, check_params
from phalanx.training import devices, losses, optim
from phalanx.training.algorithms import base as algorithms
from phalanx.training.algorithms import builtin
from phalanx.training.algorithms.gossip import AnytimeGossip
from phalanx.training.algorithms.gossip_node import check_attack
from phalanx.validate import check_choice

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Schedule = Literal["constant", "step", "cosine"]
Partition = Literal["iid", "dirichlet", "pathological"]
ALGORITHM_KEYS = builtin.own_keys()
"""Keys that only one built-in algorithm (or two of a kind) reads, as each declares them
(:attr:`~phalanx.training.algorithms.base.RoundAlgorithm.config_keys`: federated averaging's ``clients_per_round`` …,
gossip's ``graph`` …); :func:`check_relations` refuses them, set, with any other algorithm."""
DECENTRALIZED = builtin.decentralized()
"""The built-in algorithms that run over a graph (a model per node, no server), as they declare it."""
Engine = Literal["simulated", "torchrun"]
Topology = Literal["server", "serverless", "gossip"]
Backend = Literal["auto", "gloo", "nccl"]
DISTRIBUTED_KEYS = ("topology", "round_timeout", "backend", "keys", "insecure")
"""Keys that only the ``torchrun`` engine reads. A simulated run's resolved config leaves them out, so that they
change neither its results nor its run id / ``config.json`` (run directories written before they existed resume)."""
LATER_KEYS = (
    "server_optimizer", "server_momentum", "server_weight_decay", "server_optimizer_params", "loss", "algorithm",
    "clients_per_round", "local_steps", "local_epochs", "server_lr", "prox_mu", "stats_batch", "stats_momentum",
    "graph", "graph_params", "gossip_weights", "eval_clients", "device", "keys", "insecure", "algorithm_params",
)
"""Keys added after the first release: a resolved config leaves them out while they hold their default, so a config
that does not use them keeps its run id and ``config.json`` (run directories written before they existed resume)."""
RESULT_NEUTRAL_KEYS = ("download", "sign_key", "verify_key", "device", "keys", "insecure")
"""Keys that change how a run gets its inputs, never its results: left out of a run's identity (its run id and the
check that a run directory holds the same configuration), so setting them does not orphan finished runs. ``device``
computes the same rounds with the same random draws elsewhere (equal up to floating-point rounding; the run's
manifest records where it ran), so a run started on one device resumes on another."""
DEVICE_ALGORITHMS = builtin.on_device()
"""The algorithms whose rounds run on a CUDA device (``device``), as they declare it; the others run on the CPU
('auto' picks it)."""


class RunConfig(BaseModel):
    """Everything that defines one training run. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    dataset: str = Field("digits", description="data set name (phalanx list datasets) or a 'module:attr' loader")
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
    workers: int = Field(20, ge=1, le=100_000, description="n, all workers")
    byzantine: int = Field(0, ge=0, description="workers that actually attack")
    f: int = Field(0, ge=0, description="Byzantine workers the aggregator is configured to tolerate")
    aggregator: str = Field("cwtm", description="aggregator spec, e.g. 'nnm>cwtm' (phalanx list aggregators)")
    attack: str = Field("none", description="attack name (phalanx list attacks)")
    attack_params: dict[str, Any] = Field(default_factory=dict, description="attack parameters")
    partition: Partition = Field("iid", description="how training data is split between workers")
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
        default_factory=dict, description="further parameters of the server optimizer (adam: beta1, beta2, tau)",
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
    step_every: int = Field(100, ge=1, description="'step' schedule: divide lr by 10 every this many rounds")
    seed: int = Field(0, ge=0, description="the one seed; split into named streams")
    eval_every: int = Field(20, ge=1, description="evaluate every this many rounds (and at the end)")
    checkpoint_every: int = Field(100, ge=1, description="write a checkpoint every this many rounds")
    engine: Engine = Field(
        "simulated", description="where workers run: 'simulated' (one process, vmap) or 'torchrun' (one process per "
        "worker, torch.distributed; start it with `phalanx launch` or torchrun, docs/distributed.md)",
    )
    topology: Topology = Field(
        "server", description="torchrun engine: 'server' (rank 0 aggregates and broadcasts θ; survives missing "
        "workers), 'serverless' (every rank aggregates the all-gathered vectors; needs every rank alive) or 'gossip' "
        "(algorithm = 'gossip', where it is implied: a rank per node, exchanging with its graph neighbours only)",
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


_PLAIN = {
    "int_type": "an integer", "int_parsing": "an integer", "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "string_type": "a string", "dict_type": "a table (key = value, …)",
}


def key_text(key: str) -> str:
    """A key as an error message shows it: as it is when it prints on one line, else quoted with escapes (its
    Python repr), so that a key holding a line break, a control character or only spaces keeps the message one
    line that visibly names it."""
    return key if key.strip() and key.isprintable() else repr(key)


def _friendly(exc: ValidationError) -> ConfigError:
    """The first validation error as one line: the parameter, the value it got, what is allowed."""
    err = exc.errors()[0]
    loc = ".".join(key_text(str(p)) for p in err["loc"]) or "config"
    value = err.get("input")
    if err["type"] == "extra_forbidden":
        known = ", ".join(RunConfig.model_fields)
        return ConfigError(loc, value, f"one of the known keys: {known}", "unknown key")
    allowed = _PLAIN.get(err["type"]) or err["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
    return ConfigError(loc, value, allowed)


ROLE_NAMES = builtin.role_names()
"""Learning rates named by role, for the algorithms whose ``lr`` is not the server's: a federated run's clients'
(local) rate, a decentralized run's nodes'. They are another spelling of ``lr``: a config keeps ``lr`` (so its run id
and ``config.json`` are the ones the old spelling gives)."""


def role_names(data: dict[str, Any]) -> dict[str, Any]:
    """``client_lr`` / ``node_lr`` moved to ``lr`` (the algorithm must be one whose ``lr`` plays that role; giving
    both spellings with different values is an error)."""
    if not isinstance(data, dict) or not any(k in data for k in ROLE_NAMES):
        return data
    out = dict(data)
    for key, algorithms_of in ROLE_NAMES.items():
        if key not in out:
            continue
        value = out.pop(key)
        algorithm = out.get("algorithm", "dsgd")
        if algorithm not in algorithms_of:
            raise ConfigError(key, value, f"unset with algorithm = {algorithm!r} ({key} is the learning rate of "
                              f"algorithm {' or '.join(repr(a) for a in algorithms_of)}; `lr` is this run's)")
        if "lr" in out and out["lr"] != value:
            raise ConfigError(key, value, f"= lr ({out['lr']!r}) or lr unset (they are one learning rate)")
        out["lr"] = value
    return out


def make_config(data: dict[str, Any]) -> RunConfig:
    """Validate a dict into a :class:`RunConfig`: types and ranges, the relations between keys, and the names
    against the registries — one :class:`ConfigError` naming the first bad parameter."""
    if not isinstance(data, dict):
        raise ConfigError("config", type(data).__name__, "a table of key = value")
    data = role_names(data)
    if isinstance(data, dict) and data.get("algorithm") == "anytime" and "momentum" not in data:
        data = {**data, "momentum": 0.0}  # Decentralized Anytime SGD has no momentum: its default, not an error
    if data.get("engine") == "torchrun" and data.get("algorithm") in DECENTRALIZED and "topology" not in data:
        data = {**data, "topology": "gossip"}  # a decentralized run on real processes: a rank per node of the graph
    try:
        cfg = RunConfig(**data)
    except ValidationError as exc:
        raise _friendly(exc) from None
    check_relations(cfg)
    check_names(cfg)
    check_keys(cfg)
    check_device(cfg)
    return cfg


_BN_STATISTICS = ("BatchNorm and Hybrid BN statistics are measured and pooled by federated rounds",
                  "BatchNorm / Hybrid BN statistics are pooled")
_FEDERATED_NORMS: dict[str, tuple[str, str]] = {
    "fedbn": ("FedBN keeps every client's BatchNorm layers between federated rounds",
              "FedBN's per-client BatchNorm layers are kept"),
    "batch": _BN_STATISTICS, "hybrid": _BN_STATISTICS,
}
"""The normalisations that only federated rounds in one process can train: why each needs ``algorithm = 'fedavg'``,
and what it keeps in one process (so not on the torchrun engine yet)."""


MAX_ROWS = 1_000_000
"""The most metric rows one run may make (one per evaluated round, and round 0): a run keeps them in memory and
rewrites ``metrics.jsonl`` with all of them at every checkpoint (0.38 kB a row in the default job's: about 0.4 GB at
the bound)."""


def check_relations(cfg: RunConfig) -> None:
    """The rules that tie keys together: at least one honest worker, f < n/2, NCCL only without a server."""
    n = cfg.workers
    if cfg.byzantine >= n:
        raise ConfigError("byzantine", cfg.byzantine, f"< workers = {n} (at least one honest worker)")
    if -(-cfg.rounds // cfg.eval_every) + 1 > MAX_ROWS:  # round 0, every eval_every-th and the last
        most = (MAX_ROWS - 1) * cfg.eval_every
        raise ConfigError("rounds", cfg.rounds, f"<= {most:,} with eval_every = {cfg.eval_every} (at most "
                          f"{MAX_ROWS:,} metric rows a run: they are kept in memory and rewritten at every "
                          "checkpoint)", "raise eval_every, or run fewer rounds")
    if 2 * cfg.f >= n and cfg.algorithm == "dsgd":
        raise ConfigError("f", cfg.f, f"< workers/2 = {n / 2:g} (f ≥ n/2 is beyond any robust rule)")
    defaults = RunConfig.model_fields
    for key in ALGORITHM_KEYS:  # another algorithm's own keys keep their defaults
        owners = builtin.readers(key)
        if cfg.algorithm in owners:
            continue
        if getattr(cfg, key) != defaults[key].get_default(call_default_factory=True):
            readers = " or ".join(repr(o) for o in owners)
            raise ConfigError(key, getattr(cfg, key), f"its default with algorithm = {cfg.algorithm!r} (it is "
                              f"read by algorithm = {readers} only)")
    if cfg.algorithm in DECENTRALIZED:
        if cfg.engine == "torchrun" and cfg.topology != "gossip":
            raise ConfigError("topology", cfg.topology, f"'gossip' with algorithm = {cfg.algorithm!r} on the torchrun "
                              "engine (a rank per node, exchanging with its graph neighbours; docs/decentralized.md)")
        for key in ("server_optimizer", "server_momentum", "server_weight_decay"):
            if getattr(cfg, key) != defaults[key].get_default(call_default_factory=True):
                raise ConfigError(key, getattr(cfg, key), f"its default with algorithm = {cfg.algorithm!r} (there is "
                                  "no server; lr, momentum and weight_decay are the nodes')")
        if cfg.algorithm == "anytime":
            AnytimeGossip.check_momentum(cfg.momentum)
    elif cfg.algorithm == "fedavg":
        c = cfg.clients_per_round or n
        if c > n:
            raise ConfigError("clients_per_round", c, f"<= workers = {n} (the client population)")
        if 2 * cfg.f >= c:
            raise ConfigError("f", cfg.f, f"< clients_per_round/2 = {c / 2:g} (the rule sees {c} updates a round)")
        if cfg.engine == "torchrun" and cfg.topology != "server":
            raise ConfigError("topology", cfg.topology, "'server' with algorithm = 'fedavg' (the server samples the "
                              "clients; a process per client slot)")
    norm = cfg.model_params.get("norm")
    if norm != "fedbn" and cfg.eval_clients != defaults["eval_clients"].get_default():
        raise ConfigError("eval_clients", cfg.eval_clients, "its default (100) unless model_params.norm = 'fedbn' (it "
                          "picks the clients whose own models a FedBN run evaluates)")
    needs = _FEDERATED_NORMS.get(norm) if isinstance(norm, str) else None
    if needs is not None:  # (why the norm needs federated rounds, what it keeps in one process)
        if cfg.algorithm != "fedavg":
            raise ConfigError("model_params.norm", norm, f"'group' or 'none' with algorithm = {cfg.algorithm!r} "
                              f"({needs[0]}: algorithm = 'fedavg')")
        if cfg.engine == "torchrun":
            raise ConfigError("model_params.norm", norm, "'group' or 'none' with engine = 'torchrun' "
                              f"({needs[1]} in one process so far: engine = 'simulated')")
    if cfg.engine == "torchrun" and cfg.topology == "gossip" and cfg.algorithm not in DECENTRALIZED:
        raise ConfigError("topology", cfg.topology, f"'server' or 'serverless' with algorithm = {cfg.algorithm!r} "
                          "(topology = 'gossip' runs the nodes of algorithm = 'gossip')")
    if cfg.keys is not None and cfg.engine == "torchrun" and cfg.backend == "nccl":
        raise ConfigError(
            "backend", cfg.backend, "'auto' or 'gloo' with keys (the sealed mesh carries the rows over TLS from the "
            "CPU, not through NCCL; docs/security.md)",
        )
    if cfg.backend == "nccl" and cfg.topology != "serverless":
        raise ConfigError(
            "backend", cfg.backend, f"'auto' or 'gloo' with topology = {cfg.topology!r} (its vectors go through the "
            "c10d TCPStore, which survives missing workers, or gloo links between graph neighbours; NCCL needs "
            "topology = 'serverless'; docs/distributed.md)",
        )


def check_device(cfg: RunConfig) -> None:
    """``device``: a device spec, and one the run can use — a CUDA device for the algorithms of
    :data:`DEVICE_ALGORITHMS`, and on the torchrun engine only in the serverless topology (the server topology's
    vectors travel through the c10d TCPStore as CPU bytes), as ``cuda`` (rank r uses ``cuda:LOCAL_RANK``). Whether
    this machine has CUDA is checked where the run is built (``phalanx.experiments.build.resolve_device``): a grid is
    validated on a login node and trains on GPU nodes."""
    spec = devices.check(cfg.device)
    if spec in ("cpu", "auto"):
        return
    if cfg.algorithm not in DEVICE_ALGORITHMS:
        raise ConfigError("device", spec, f"'cpu' or 'auto' with algorithm = {cfg.algorithm!r} (its rounds run on "
                          "the CPU so far; 'auto' picks the CPU for it)")
    if cfg.engine == "torchrun" and cfg.topology != "serverless":
        raise ConfigError("device", spec, f"'cpu' or 'auto' with engine = 'torchrun', topology = {cfg.topology!r} (its "
                          "vectors travel through the c10d TCPStore as CPU bytes; GPUs: topology = 'serverless')")
    if cfg.engine == "torchrun" and spec != "cuda":
        raise ConfigError("device", spec, "'cuda' or 'auto' with engine = 'torchrun' (rank r uses cuda:LOCAL_RANK)")


def processes(cfg: RunConfig) -> int:
    """How many processes a torchrun run has: one per worker (DSGD), or one per client slot of a federated round
    (``clients_per_round``; rank 0 is also the server)."""
    return cfg.workers if cfg.algorithm == "dsgd" else cfg.clients_per_round or cfg.workers


def check_keys(cfg: RunConfig) -> None:
    """``sign_key`` / ``verify_key``: existing files, and the signing extra installed — checked before a run trains,
    not when it finishes."""
    for key in ("sign_key", "verify_key"):
        path = getattr(cfg, key)
        if path is not None:
            allowed = "an existing PEM key file (phalanx keygen KEY.pem PUB.pem)"
            try:
                found = Path(path).is_file()
            except OSError as exc:  # a name the file system refuses (too long), a directory it may not search
                raise ConfigError(key, path, allowed, exc.strerror or type(exc).__name__) from None
            if not found:
                raise ConfigError(key, path, allowed)
            signing.require()


GRAPH_BYTES_PER_PAIR = 64
"""What building a decentralized run holds per pair of nodes at its peak: the dense adjacency (1 byte), the mixing
matrix W in float64 (8), the copies that building and checking W make, and the padded neighbourhood tables (for a
complete graph n × (n − 1) weights, indices and masks). Measured: 60 bytes per pair for the complete graph at
n = 4,000 (the densest case; peak resident memory of topology.make + Gossip + Neighbourhoods)."""


def check_graph_memory(n: int) -> None:
    """Refuse (one line, before anything is built) a decentralized run whose dense n × n graph and mixing matrices
    would not fit in the memory this process can still get (:func:`phalanx.analysis.epsilon.available_memory`)."""
    from phalanx.analysis.epsilon import MEMORY_SHARE, available_memory

    need = GRAPH_BYTES_PER_PAIR * n * n
    avail = available_memory()
    if avail is not None and need > MEMORY_SHARE * avail:
        largest = int((MEMORY_SHARE * avail / GRAPH_BYTES_PER_PAIR) ** 0.5)
        raise ConfigError(
            "workers", n, f"at most {largest:,} nodes for a decentralized run on this machine (its n × n graph and "
            f"mixing matrices need ~{need / 1e9:.1f} GB; {avail / 1e9:.1f} GB are available)",
            "fewer nodes, or a machine with more memory",
        )


def check_names(cfg: RunConfig) -> None:
    """Check the aggregator spec, attack, data set, model, loss and optimizer names (built-in, registered,
    ``module:attr`` or installed plug-ins), their parameters, and the aggregator's requirement on n."""
    if cfg.algorithm not in algorithms.BUILT_IN:  # a round algorithm of the user's own: its class and parameters
        check_params(cfg.algorithm, algorithms.resolve(cfg.algorithm), cfg.algorithm_params)
    elif cfg.algorithm_params:
        raise ConfigError("algorithm_params", cfg.algorithm_params, f"{{}} with algorithm = {cfg.algorithm!r} (a "
                          "built-in algorithm takes its own config keys)")
    rule = robust_gossip.configured(cfg.aggregator, cfg.f, cfg.algorithm)  # a robust gossip rule: gossip only
    if cfg.algorithm in DECENTRALIZED:  # every node's rule sees its closed neighbourhood N(i) ∪ {i}
        check_choice("gossip_weights", cfg.gossip_weights, gossip.weight_names())
        check_graph_memory(cfg.workers)  # before the graph is built: its matrices are dense n × n
        graph = topology.make(cfg.graph, cfg.workers, **cfg.graph_params)
        if cfg.graph == "attached" and cfg.byzantine not in (0, cfg.graph_params.get("byzantine")):
            raise ConfigError("graph_params.byzantine", cfg.graph_params.get("byzantine"), f"= byzantine "
                              f"({cfg.byzantine}): the attached nodes are the run's Byzantine ones (or byzantine = 0: "
                              "the same graph without an attack)")
        hood = int(graph.degrees.min()) + 1
        if 2 * cfg.f >= hood or hood < rule.min_workers():
            need = max(2 * cfg.f + 1, rule.min_workers())
            raise ConfigError(
                "graph", cfg.graph, f"a graph whose every node has >= {need - 1} neighbours for aggregator "
                f"{cfg.aggregator!r} with f={cfg.f} (the smallest closed neighbourhood of this one has {hood} nodes)",
                "a denser graph (torus, exponential, complete) or a smaller f",
            )
        m, what = hood, "graph"
    elif cfg.algorithm == "dsgd":
        m, what = cfg.workers, "workers"
    else:
        m, what = cfg.clients_per_round or cfg.workers, "clients_per_round"
    if m < rule.min_workers():
        raise ConfigError(
            what, m, f">= {rule.min_workers()} for aggregator {cfg.aggregator!r} with f={cfg.f} ({rule.requirement})",
        )
    attack = gossip_attacks.configured(cfg.attack, cfg.attack_params, cfg.algorithm)  # dissensus: gossip only
    if cfg.engine == "torchrun" and cfg.algorithm in DECENTRALIZED:
        check_attack(attack)  # a rank holds its neighbourhood only: spectral (uᵀX̃ of every node) is refused
    boost = float(getattr(attack, "boost", 1.0))
    if boost != 1.0 and cfg.algorithm == "dsgd":
        raise ConfigError("attack_params.boost", boost, "1 with algorithm = 'dsgd' (boosting scales a federated "
                          "client's update)")
    try:
        data.canonical(cfg.dataset)
    except ConfigError as exc:
        raise ConfigError("dataset", cfg.dataset, exc.allowed, exc.hint) from None
    build = models.builder(cfg.model)
    if cfg.model_params.get("norm") == "fedbn" and "norm" not in (accepted_params(build) or ["norm"]):
        raise ConfigError("model_params.norm", "fedbn", f"a model with BatchNorm layers ('cnn', 'resnet20'): "
                          f"{cfg.model!r} has none")
    check_params(cfg.model, build, cfg.model_params, skip=("input_shape", "num_classes"))
    losses.get(cfg.loss)
    server_optimizer(cfg)


def server_optimizer(cfg: RunConfig) -> optim.ServerOptimizer:
    """The config's server optimizer: ``server_optimizer`` with ``server_optimizer_params``; SGD also takes
    ``server_momentum`` and ``server_weight_decay``."""
    params = dict(cfg.server_optimizer_params)
    if cfg.server_optimizer == "sgd":
        params.setdefault("momentum", cfg.server_momentum)
        params.setdefault("weight_decay", cfg.server_weight_decay)
    else:
        for key in ("server_momentum", "server_weight_decay"):
            if getattr(cfg, key) != 0.0:
                raise ConfigError(key, getattr(cfg, key), f"0 with server_optimizer = {cfg.server_optimizer!r} "
                                  "(its parameters go in server_optimizer_params)")
    return optim.make(cfg.server_optimizer, **params)


def parse_value(text: str, key: str | None = None) -> Any:
    """Parse the value of ``--set key=value`` for ``key``.

    A list (``[…]``) is a grid axis, parsed as TOML. Otherwise the key's type decides: a string key keeps the text
    as it is (``--set attack=nan`` is the attack ``nan``; quotes are removed), a number or boolean key takes a TOML
    number or ``true``/``false`` (``workers=true`` stays text, which validation then refuses), a table takes a TOML
    inline table. An unknown key's value is parsed as TOML, else kept as text.
    """
    return _parse(text, key, key or "--set")


def _parse(text: str, key: str | None, name: str) -> Any:
    """:func:`parse_value`; a value that is TOML but that Python cannot hold (nested too deeply, an integer beyond
    64 bits) is a :class:`ConfigError` naming ``name``."""
    t = text.strip()
    kind = _kind(key)
    if t.startswith("["):
        value = _toml(t, None, name)
        if value is None:  # "[cwtm,krum]", the natural shell form: TOML wants each name in quotes
            shown = t if len(t) <= 60 else t[:57] + "..."
            example = ", ".join(f'"{w.strip()}"' for w in t.strip("[]").split(",")[:3] if w.strip()) or '"…"'
            raise ConfigError(key_text(name), shown, "a TOML list (a grid axis)",
                              f"put each name in quotes and the whole argument in single quotes for the shell: "
                              f"--set '{name}=[{example}]'")
        return value
    if kind == "str":
        return t[1:-1] if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"" else t
    value = _toml(t, t, name)
    if kind in ("int", "float") and isinstance(value, bool):
        return t
    return value


def _toml(text: str, default: Any, name: str) -> Any:
    try:
        doc = toml_loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return default
    except TomlLimitError as exc:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ConfigError(key_text(name), shown, exc.allowed) from None
    # One value, not a document: "5\nf = 3" is not the value 5 (with a stray key f dropped on the floor).
    return doc["v"] if set(doc) == {"v"} else default


INT64 = (-(2**63), 2**63 - 1)
"""TOML integers are 64-bit: "if an integer cannot be represented losslessly, an error must be thrown" (TOML 1.0)."""


class TomlLimitError(ValueError):
    """TOML text that is well-formed but beyond what a config may hold; ``allowed`` says what is."""

    def __init__(self, allowed: str) -> None:
        self.allowed = allowed
        super().__init__(allowed)


def toml_loads(text: str) -> dict[str, Any]:
    """``tomllib.loads`` with the limits its parser leaves to Python: arrays and tables nested too deeply for the
    recursive parser (``RecursionError``), integers of more digits than Python converts (``ValueError``) and
    integers beyond 64 bits, which TOML 1.0 requires a parser to refuse — each a :class:`TomlLimitError` (a
    ``tomllib.TOMLDecodeError`` for malformed text, as before)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except RecursionError:
        raise TomlLimitError("TOML whose arrays and inline tables are not nested that deeply") from None
    except ValueError:  # int() refuses more than sys.get_int_max_str_digits() digits
        raise TomlLimitError("TOML integers of at most 64 bits (this one has thousands of digits)") from None
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, int) and not isinstance(item, bool) and not INT64[0] <= item <= INT64[1]:
            raise TomlLimitError(f"TOML integers of at most 64 bits, in [{INT64[0]}, {INT64[1]}] (got {item})")
    return data


def _kind(key: str | None) -> str | None:
    """``"str"``, ``"int"``, ``"float"``, ``"bool"`` or ``"dict"`` for a RunConfig key (None: unknown or nested)."""
    field = RunConfig.model_fields.get(key or "")
    if field is None:
        return None
    ann = field.annotation
    args = set(typing.get_args(ann)) - {type(None)}
    if ann is str or typing.get_origin(ann) is Literal or (args and all(a is str for a in args)):
        return "str"
    for name, typ in (("bool", bool), ("int", int), ("float", float)):
        if ann is typ or typ in args:
            return name
    return "dict" if typing.get_origin(ann) is dict else None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides (``attack_params.z=1.5`` sets a nested key), each value parsed for its key's
    type (:func:`parse_value`)."""
    out = dict(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", item, "key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        if "." in key:
            outer, inner = key.split(".", 1)
            current = out.get(outer)
            if current is not None and not isinstance(current, dict):
                raise ConfigError(key_text(outer), current, f"a table (key = value, …) to set {inner!r} in",
                                  f"--set {key}=… sets a key inside the table {outer}")
            nested = dict(current or {})
            nested[inner] = _parse(text, None, key)
            out[outer] = nested
        else:
            if key in ("lr", *ROLE_NAMES):  # a learning rate set on the command line replaces the file's, whatever
                for spelling in ("lr", *ROLE_NAMES):  # spelling either uses (ROLE_NAMES)
                    out.pop(spelling, None)
            out[key] = _parse(text, key, key or "--set")
    return out


_UTF8_BOM = b"\xef\xbb\xbf"
_OTHER_BOMS = {b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a dict (a clear error if it is missing, unreadable or malformed).

    The file must be UTF-8, as TOML requires; a leading UTF-8 byte-order mark (as some Windows editors write) is
    skipped. Any other encoding is a :class:`ConfigError` naming the file and the first byte that is not UTF-8.
    """
    p = Path(path)
    try:
        found = p.is_file()
    except OSError as exc:  # a name the file system refuses (too long), a directory it may not search
        raise ConfigError("config", str(p), "a readable TOML file", exc.strerror or type(exc).__name__) from None
    if not found:
        raise ConfigError("config", str(p), "an existing TOML file")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError("config", str(p), "a readable TOML file", exc.strerror or type(exc).__name__) from None
    raw = raw.removeprefix(_UTF8_BOM)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        seen = next((enc for bom, enc in _OTHER_BOMS.items() if raw.startswith(bom)), None)
        what = f"it is {seen}" if seen else f"byte 0x{raw[exc.start]:02x} on line {line} is not UTF-8"
        raise ConfigError("config", str(p), "a UTF-8 text file (TOML is UTF-8)",
                          f"{what}: save it as UTF-8 in your editor") from None
    try:
        return toml_loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(p), f"valid TOML ({exc})") from None
    except TomlLimitError as exc:
        raise ConfigError("config", str(p), exc.allowed) from None


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.toml"
"""The built-in job (``make run``): digits, 20 workers, 4 Byzantine running ALIE, five rules."""


def load_grid(config: str | Path | None, overrides: list[str]) -> dict[str, Any]:
    """A config file (default: :data:`DEFAULT_CONFIG`) with ``key=value`` overrides applied; list values are grid
    axes (:func:`phalanx.experiments.grid.configs` expands and validates them)."""
    return apply_overrides(load_toml(config if config is not None else DEFAULT_CONFIG), overrides)
