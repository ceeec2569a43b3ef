"""The run configuration: one validated object, loaded from TOML, overridable with ``key=value`` strings.

``workers`` is n, all of them; ``byzantine`` is how many *actually* attack; ``f`` is how many the aggregator is
*configured* to tolerate. The three are kept apart everywhere: the gap between ``f`` and ``byzantine`` is what the
price-of-robustness experiments measure (Yang, Shi & Li, ICML 2025).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from phalanx import aggregators, attacks, data, models
from phalanx.errors import ConfigError
from phalanx.training import optim

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Schedule = Literal["constant", "step", "cosine"]
Partition = Literal["iid", "dirichlet", "pathological"]
Engine = Literal["simulated", "torchrun"]
Topology = Literal["server", "serverless"]
Backend = Literal["auto", "gloo", "nccl"]
DISTRIBUTED_KEYS = ("topology", "round_timeout", "backend")
"""Keys that only the ``torchrun`` engine reads. A simulated run's resolved config leaves them out, so that they
change neither its results nor its run id / ``config.json`` (run directories written before they existed resume)."""
LATER_KEYS = ("server_optimizer", "server_momentum", "server_weight_decay")
"""Keys added after the first release: a resolved config leaves them out while they hold their default, so a config
that does not use them keeps its run id and ``config.json`` (run directories written before they existed resume)."""
RESULT_NEUTRAL_KEYS = ("download",)
"""Keys that change how a run gets its inputs, never its results: left out of a run's identity (its run id and the
check that a run directory holds the same configuration), so setting them does not orphan finished runs."""


class RunConfig(BaseModel):
    """Everything that defines one training run. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field("digits", description="data set name (phalanx list datasets)")
    data_root: str | None = Field(None, description="directory holding the data set files")
    download: bool = Field(
        False, description="download the data set (torchvision's mirrors, MD5-checked) when it is found nowhere; "
        "off by default: nothing touches the network unless asked",
    )
    model: str = Field("mlp", description="model name (phalanx list models)")
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
    lr: float = Field(0.1, gt=0, description="server learning rate (initial)")
    momentum: float = Field(0.9, ge=0, lt=1, description="worker momentum β: mᵢ ← β mᵢ + (1 − β) gᵢ")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty added to every worker's gradient")
    schedule: Schedule = Field("constant", description="learning-rate schedule")
    server_optimizer: str = Field("sgd", description="the server optimizer that applies the aggregate (sgd)")
    server_momentum: float = Field(
        0.0, ge=0, lt=1, description="server momentum μ: u ← μ u + Agg, θ ← θ − η u (0: plain θ ← θ − η Agg)",
    )
    server_weight_decay: float = Field(0.0, ge=0, description="L2 penalty λ the server adds to the aggregate")
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
        "workers) or 'serverless' (every rank aggregates the all-gathered vectors; needs every rank alive)",
    )
    round_timeout: float = Field(
        30.0, gt=0, le=86_400, description="torchrun engine: seconds the server waits for the vectors of a round; "
        "workers still missing then count against f",
    )
    backend: Backend = Field(
        "auto", description="torchrun engine, serverless topology: torch.distributed backend ('auto': nccl when CUDA "
        "is available, else gloo)",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if self.engine == "simulated":
            for key in DISTRIBUTED_KEYS:
                out.pop(key, None)
        for key in LATER_KEYS:
            if key in out and out[key] == type(self).model_fields[key].default:
                out.pop(key)
        return out

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        n = self.workers
        if self.byzantine >= n:
            raise ValueError(f"byzantine={self.byzantine} must be < workers={n} (at least one honest worker)")
        if 2 * self.f >= n:
            raise ValueError(f"f={self.f} must be < workers/2 = {n / 2} (f ≥ n/2 is beyond any robust rule)")
        if self.backend == "nccl" and self.topology == "server":
            raise ValueError(
                "backend='nccl' needs topology='serverless' (the server topology sends vectors through the c10d "
                "TCPStore, which survives missing workers; docs/distributed.md)"
            )
        return self

    def evaluates(self, t: int) -> bool:
        """Whether round ``t`` (counted from 0) ends with an evaluation: every ``eval_every`` rounds and the last."""
        return (t + 1) % self.eval_every == 0 or t + 1 == self.rounds

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


def _friendly(exc: ValidationError) -> ConfigError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "config"
    value = err.get("input")
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        known = ", ".join(RunConfig.model_fields)
        return ConfigError(loc, value, f"one of the known keys: {known}", "unknown key")
    return ConfigError(loc, value, msg)


def make_config(data: dict[str, Any]) -> RunConfig:
    """Validate a dict into a :class:`RunConfig` (and check names against the registries)."""
    try:
        cfg = RunConfig(**data)
    except ValidationError as exc:
        raise _friendly(exc) from None
    check_names(cfg)
    return cfg


def check_names(cfg: RunConfig) -> None:
    """Check the aggregator spec, attack, data set, model and optimizer names, and the aggregator's requirement on n."""
    rule = aggregators.make(cfg.aggregator, f=cfg.f)
    if cfg.workers < rule.min_workers():
        raise ConfigError(
            "workers", cfg.workers, f">= {rule.min_workers()} for aggregator {cfg.aggregator!r} with f={cfg.f} "
            f"({rule.requirement})",
        )
    attacks.make(cfg.attack, **cfg.attack_params)
    try:
        data.canonical(cfg.dataset)
    except ConfigError as exc:
        raise ConfigError("dataset", cfg.dataset, exc.allowed, exc.hint) from None
    if cfg.model not in models.names():
        raise ConfigError("model", cfg.model, "one of " + ", ".join(models.names()))
    optim.make(cfg.server_optimizer, momentum=cfg.server_momentum, weight_decay=cfg.server_weight_decay)


def parse_value(text: str) -> Any:
    """Parse the value of ``--set key=value`` as TOML (numbers, booleans, lists, quoted strings) or a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides (``attack_params.z=1.5`` sets a nested key)."""
    out = dict(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", item, "key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        value = parse_value(text.strip())
        if "." in key:
            outer, inner = key.split(".", 1)
            nested = dict(out.get(outer) or {})
            nested[inner] = value
            out[outer] = nested
        else:
            out[key] = value
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a dict (a clear error if it is missing or malformed)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("config", str(p), "an existing TOML file")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(p), f"valid TOML ({exc})") from None


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.toml"
"""The built-in job (``make run``): digits, 20 workers, 4 Byzantine running ALIE, five rules."""


def load_grid(config: str | Path | None, overrides: list[str]) -> dict[str, Any]:
    """A config file (default: :data:`DEFAULT_CONFIG`) with ``key=value`` overrides applied; list values are grid
    axes (:func:`phalanx.experiments.grid.configs` expands and validates them)."""
    return apply_overrides(load_toml(config if config is not None else DEFAULT_CONFIG), overrides)
