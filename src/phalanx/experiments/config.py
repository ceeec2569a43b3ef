"""The run configuration: one validated object, loaded from TOML, overridable with ``key=value`` strings.

The keys, their types and defaults are the schema (:class:`~phalanx.experiments.schema.RunConfig`), made from the
declaration of each key by the component that reads it (:func:`phalanx.experiments.concerns.checked`), whose ranges
:func:`phalanx.experiments.declare.check` checks once; validation (:func:`validate`, once, into a
:class:`~phalanx.experiments.validrun.ValidRun`) adds what ties keys
together, and builds the components the config names — round algorithm, rule, attack, server optimizer, stages —
once, each checking its own parameters, with the algorithm checking what ties them and each stage checking itself
against the run (:mod:`phalanx.experiments.components`). What an algorithm or a stage reads, defaults and allows is
declared by its class, not listed here.
"""

from __future__ import annotations

import re
import sys
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from phalanx import data, files, hub, models, signing
from phalanx.errors import ConfigError
from phalanx.experiments import components, concerns, declare, legacy, specs, spelling, tracking, tree, tree_override
from phalanx.experiments.components import processes
from phalanx.experiments.schema import (
    DISTRIBUTED_KEYS,
    LATER_KEYS,
    MAX_ROWS,
    RESULT_NEUTRAL_KEYS,
    Backend,
    Engine,
    Partition,
    RunConfig,
    Schedule,
)
from phalanx.experiments.specs import DataSpec, DeviceSpec, ModelSpec, Specs
from phalanx.experiments.validrun import ValidRun, name_of
from phalanx.models.norm import NORMS
from phalanx.plugins import accepted_params, check_params, is_spec
from phalanx.training import adapters, devices, losses
from phalanx.training.algorithms import builtin
from phalanx.training.algorithms.base import RoundAlgorithm
from phalanx.training.transport import TOPOLOGIES
from phalanx.validate import suggest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "DISTRIBUTED_KEYS", "LATER_KEYS", "RESULT_NEUTRAL_KEYS", "Backend", "Engine", "Partition", "RunConfig", "Schedule",
    "ValidRun", "load_grid", "load_toml", "make_config", "processes", "validate",
]

ALGORITHM_KEYS = builtin.own_keys()
"""Keys that only one built-in algorithm (or two of a kind) reads, as each declares them
(:attr:`~phalanx.training.algorithms.base.RoundAlgorithm.config_keys`: federated averaging's ``clients_per_round`` …,
gossip's ``graph`` …); :func:`check_relations` refuses them, set, with any other algorithm."""
DECENTRALIZED = builtin.decentralized()
"""The built-in algorithms that run over a graph (a model per node, no server), as they declare it."""
DEVICE_ALGORITHMS = builtin.on_device()
"""The built-in algorithms whose rounds run on a CUDA device (``device``), as they declare it; the others run on the
CPU ('auto' picks it)."""


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
        close = suggest(str(err["loc"][-1]), RunConfig.model_fields) if err["loc"] else None
        # the ~60 keys are not listed (a newcomer read an 817-character line with the hint at its very end)
        return ConfigError(loc, value, "one of the known keys (docs/config.md lists them)",
                           "unknown key" + (f"; {close}" if close else ""))
    allowed = _PLAIN.get(err["type"]) or err["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
    if err["type"] == "literal_error" and isinstance(value, str):  # a misspelt choice: partition = "diriclet"
        choices = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
        return ConfigError(loc, value, allowed, suggest(value, choices))
    return ConfigError(loc, value, allowed)


ROLE_NAMES = builtin.role_names()
"""``lr`` named by its role: ``client_lr`` (federated averaging: the clients' local rate), ``node_lr`` (gossip,
Anytime SGD: the nodes') and ``server_lr`` (distributed SGD, and an algorithm of one's own whose ``lr`` is the
server's). They are other spellings of ``lr``: a config keeps ``lr`` (so its run id and ``config.json`` are the ones
the old spelling gives). Federated averaging's ``server_lr`` is a key of its own (the server's step)."""


def _algorithms(data: dict[str, Any]) -> list[str]:
    """The algorithm names a table of keys (or a grid of them: a list) uses."""
    value = data.get("algorithm", "dsgd")
    return [a for a in (value if isinstance(value, list) else [value]) if isinstance(a, str)]


def lr_spellings(data: dict[str, Any]) -> tuple[str, ...]:
    """``lr`` and the role spellings of it that the algorithms of ``data`` accept (``--set lr=…`` replaces any)."""
    roles = (builtin.lr_spelling(a) for a in _algorithms(data))
    return ("lr", *dict.fromkeys(r for r in roles if r is not None))


def role_names(data: dict[str, Any]) -> dict[str, Any]:
    """``client_lr`` / ``node_lr`` / ``server_lr`` moved to ``lr`` when the run's algorithm names its ``lr`` so
    (:func:`~phalanx.training.algorithms.builtin.lr_spelling`); another algorithm's spelling is an error, and so is
    giving both spellings with different values. Federated averaging's ``server_lr`` stays its own key."""
    if not isinstance(data, dict) or not any(k in data for k in ROLE_NAMES):
        return data
    out = dict(data)
    algorithm = out.get("algorithm", "dsgd")
    own = builtin.lr_spelling(algorithm) if isinstance(algorithm, str) else None
    for key, algorithms_of in ROLE_NAMES.items():
        if key not in out or (key == "server_lr" and own != key):  # a key of its own (federated averaging's)
            continue
        value = out.pop(key)
        if key != own:
            raise ConfigError(key, value, f"unset with algorithm = {algorithm!r} ({key} is the learning rate of "
                              f"algorithm {' or '.join(repr(a) for a in algorithms_of)}; `lr` is this run's)")
        if "lr" in out and out["lr"] != value:
            raise ConfigError(key, value, f"= lr ({out['lr']!r}) or lr unset (they are one learning rate)")
        out["lr"] = value
    return out


def inline_dataset(table: dict[str, Any]) -> dict[str, Any]:
    """``dataset = "mylab.data:cancer(seed=1)"`` as ``dataset = "mylab.data:cancer"`` and the parameters in
    ``dataset_params`` (as the rules take theirs inline): one run, whichever way it was written."""
    spec = table.get("dataset")
    if not isinstance(spec, str) or "(" not in spec:
        return table
    name, merged = data.split_spec(spec, table.get("dataset_params"))  # a dataset_params that is no table: refused
    return {**table, "dataset": name, "dataset_params": merged}


def algorithm_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """The defaults the run's algorithm declares for keys ``data`` leaves unset
    (:attr:`~phalanx.training.algorithms.base.RoundAlgorithm.config_defaults`: Anytime SGD's ``momentum = 0``), and
    on the torchrun engine the first topology it runs on (a decentralized run: a rank per node of the graph)."""
    algorithm = data.get("algorithm", "dsgd")
    try:
        cls = builtin.algorithm_class(algorithm) if isinstance(algorithm, str) else None
    except ConfigError:  # refused below, where the algorithm is checked
        cls = None
    if cls is None:
        return data
    defaults = dict(cls.config_defaults)
    if data.get("engine") == "torchrun":
        defaults["topology"] = cls.topologies[0]
    return {**{k: v for k, v in defaults.items() if k not in data}, **data}


def validate(data: dict[str, Any] | RunConfig) -> ValidRun:
    """Validate a dict (or check a RunConfig object) once, into the value the run is made from
    (:class:`~phalanx.experiments.validrun.ValidRun`): types and ranges, the relations between keys, and the names
    against the registries — one :class:`ConfigError` naming the first bad parameter — and the components the
    config names, each built once and checked (:mod:`phalanx.experiments.components`), its run id, metric columns
    and process count. A RunConfig object (made directly, or received pickled or from a file) is checked as it is."""
    written = spelling.Written()
    given: dict[str, Any] = {}  # the values as the user gave them (a float key's 1 is shown as 1, not 1.0)
    try:
        if isinstance(data, RunConfig):
            cfg = data
        else:
            if not isinstance(data, dict):
                raise ConfigError("config", type(data).__name__, "a table of key = value")
            data, carried = spelling.detach(data)  # the spelling of a tree read before (load_grid, a grid's point)
            flat, written = tree.read(data)
            written = written if written.names else carried
            data = algorithm_defaults(role_names(legacy.client_keys(inline_dataset(flat))))
            given = data
            try:
                cfg = RunConfig(**data)
            except ValidationError as exc:  # a declared key before the refused one is out of range: it is first
                loc = exc.errors()[0]["loc"]
                declare.check(data, concerns.checked(), RunConfig.model_fields, before=str(loc[0]) if loc else "")
                raise _friendly(exc) from None
        # each declared key's range, by its declaration, once
        declare.check({**dict(iter(cfg)), **given}, concerns.checked(), RunConfig.model_fields)
        check_rows(cfg.rounds, cfg.eval_every)
        run = specs.read(cfg)  # the one reading of the config: every check and builder below takes its concern's
        check_relations(run)  # value
        parts = components.build(run, cfg if run.legacy_hooks else None)
        check_names(run.data, run.model)
        check_keys(cfg.sign_key, cfg.verify_key)
        check_device(run.device)
        tracking.check(*run.tracking)
    except ConfigError as exc:  # each value checked once, by its key's declaration: named as the user wrote it
        named = spelling.respelled(exc, written, RunConfig.model_fields)
        if named is exc:
            raise
        raise named from None
    return ValidRun(cfg, name_of(cfg.identity()), parts, run.columns, run.shape.processes, run)


def make_config(data: dict[str, Any]) -> RunConfig:
    """Validate a dict into a :class:`RunConfig` (:func:`validate`, keeping the config alone: a run made from it
    later is validated there; :func:`validate` gives the value that carries what validating built)."""
    return validate(data).cfg


_BN_STATISTICS = ("BatchNorm and Hybrid BN statistics are measured and pooled by federated rounds",
                  "BatchNorm / Hybrid BN statistics are pooled")
_FEDERATED_NORMS: dict[str, tuple[str, str]] = {
    "fedbn": ("FedBN keeps every client's BatchNorm layers between federated rounds",
              "FedBN's per-client BatchNorm layers are kept"),
    "batch": _BN_STATISTICS, "hybrid": _BN_STATISTICS,
}
"""The normalisations that only federated rounds in one process can train: why each needs ``algorithm = 'fedavg'``,
and what it keeps in one process (so not on the torchrun engine yet)."""


def _able(capability: str) -> str:
    """The built-in algorithms that declare ``capability`` (a class attribute), for a message: "'fedavg'"."""
    return " or ".join(repr(n) for n, c in builtin.BUILT_IN.items() if getattr(c, capability))


def check_rows(rounds: int, eval_every: int) -> None:
    """A bounded number of metric rows: round 0, every ``eval_every``-th and the last, at most :data:`MAX_ROWS`."""
    if -(-rounds // eval_every) + 1 > MAX_ROWS:  # round 0, every eval_every-th and the last
        most = (MAX_ROWS - 1) * eval_every
        raise ConfigError("rounds", rounds, f"<= {most:,} with eval_every = {eval_every} (at most "
                          f"{MAX_ROWS:,} metric rows a run: they are kept in memory and rewritten at every "
                          "checkpoint)", "raise eval_every, or run fewer rounds")


def check_relations(run: Specs | RunConfig) -> None:
    """The rules that tie keys together, as the algorithm's class declares them: a bounded number of metric rows
    (:func:`check_rows`), another algorithm's keys at their defaults, a normalisation the algorithm can train, a
    torchrun topology it runs on, NCCL only without a server — on the config read into its values
    (:func:`phalanx.experiments.specs.read`; a RunConfig is read here). (At least one honest worker, f against the
    population the rule sees, and the rule's requirement are written once:
    :func:`~phalanx.training.algorithms.base.check_honest`, ``check_population``.)"""
    if isinstance(run, RunConfig):
        check_rows(run.rounds, run.eval_every)
        run = specs.read(run)
    shape, spec, model, device = run.shape, run.algorithm, run.model, run.device
    check_rows(shape.rounds, shape.eval_every)
    cls: type[RoundAlgorithm] = spec.cls
    defaults = RunConfig.model_fields
    for key in ALGORITHM_KEYS:  # another algorithm's own keys keep their defaults
        owners = builtin.readers(key)
        if spec.algorithm in owners:
            continue
        if spec.own[key] != defaults[key].get_default(call_default_factory=True):
            readers = " or ".join(repr(o) for o in owners)
            raise ConfigError(key, spec.own[key], f"its default with algorithm = {spec.algorithm!r} (it is "
                              f"read by algorithm = {readers} only)")
    norm = model.norm
    if isinstance(norm, str) and norm not in NORMS:  # before any point is built: the key as written, and a guess
        raise ConfigError("model_params.norm", norm, " | ".join(repr(n) for n in NORMS), suggest(norm, NORMS))
    if norm != "fedbn" and shape.eval_clients != defaults["eval_clients"].get_default():
        raise ConfigError("eval_clients", shape.eval_clients, "its default (100) unless model_params.norm = 'fedbn' "
                          "(it picks the clients whose own models a FedBN run evaluates)")
    needs = _FEDERATED_NORMS.get(norm) if isinstance(norm, str) else None
    if needs is not None:  # (why the norm needs federated rounds, what it keeps in one process, who can)
        capability = "keeps_local_norms" if norm == "fedbn" else "pools_norm_stats"
        if not getattr(cls, capability):
            raise ConfigError("model_params.norm", norm, f"'group' or 'none' with algorithm = {spec.algorithm!r} "
                              f"({needs[0]}: algorithm = {_able(capability)})")
        if device.engine == "torchrun":
            raise ConfigError("model_params.norm", norm, "'group' or 'none' with engine = 'torchrun' "
                              f"({needs[1]} in one process so far: engine = 'simulated')")
    if hub.is_hf(model.name):  # LoRA adapters: the server step that aggregation 'update' needs
        optimizer, section, _ = legacy.optimizer(run.flat, cls.decentralized)
        adapters.check_step(model.params.get("aggregation", "factors"), spec.algorithm, optimizer,
                            spec.own["server_lr"], section.get("momentum", 0.0))
    check_topology(device, cls)
    check_transport(device)


def check_transport(device: DeviceSpec) -> None:
    """A sealed mesh carries its rows over TLS from the CPU (not NCCL), and NCCL needs the serverless topology."""
    if device.keys and device.engine == "torchrun" and device.backend == "nccl":
        raise ConfigError(
            "backend", device.backend, "'auto' or 'gloo' with keys (the sealed mesh carries the rows over TLS from the "
            "CPU, not through NCCL; docs/security.md)",
        )
    if device.backend == "nccl" and device.topology != "serverless":
        raise ConfigError(
            "backend", device.backend, f"'auto' or 'gloo' with topology = {device.topology!r} (its vectors go through "
            "the c10d TCPStore, which survives missing workers, or gloo links between graph neighbours; NCCL needs "
            "topology = 'serverless'; docs/distributed.md)",
        )


BUILT_IN_TOPOLOGIES = builtin.topologies()
"""The torchrun topologies the built-in algorithms run on, as they declare them (``server``, ``serverless``,
``gossip``)."""


def check_topology(cfg: DeviceSpec | RunConfig, cls: type[RoundAlgorithm]) -> None:
    """``topology``: a known name (built in, registered, an installed ``phalanx.torchrun_topologies`` entry point) or a
    ``module:attr`` spec; on the torchrun engine, a built-in one the algorithm runs on
    (:attr:`~phalanx.training.algorithms.base.RoundAlgorithm.topologies`). Whether a topology of one's own runs the
    algorithm is its own declaration, checked where it is built (``phalanx.distributed.topologies.check``, before
    any process starts)."""
    name = cfg.topology
    known = sorted({*BUILT_IN_TOPOLOGIES, *TOPOLOGIES.names()})
    if name not in known and not is_spec(name):
        raise ConfigError("topology", name, "one of " + ", ".join(known) + " or a 'module:attr' spec of a topology",
                          suggest(name, known))
    if cfg.engine == "torchrun" and name in BUILT_IN_TOPOLOGIES and name not in cls.topologies:
        raise ConfigError("topology", name, " or ".join(repr(t) for t in cls.topologies) + f" with algorithm "
                          f"= {cfg.algorithm!r} (the torchrun topologies its rounds run on; docs/distributed.md)")


def check_device(cfg: DeviceSpec | RunConfig) -> None:
    """``device``: a device spec, and one the run can use — a CUDA device for an algorithm that declares its rounds
    run on one (:attr:`~phalanx.training.algorithms.base.RoundAlgorithm.runs_on_device`), and on the torchrun engine
    only in the serverless topology (the server topology's vectors travel through the c10d TCPStore as CPU bytes),
    as ``cuda`` (rank r uses ``cuda:LOCAL_RANK``). Whether this machine has CUDA is checked where the run is built
    (``phalanx.experiments.build.resolve_device``): a grid is validated on a login node and trains on GPU nodes.
    ``cfg``: the run's :class:`~phalanx.experiments.specs.DeviceSpec` (a RunConfig is read into it)."""
    if isinstance(cfg, RunConfig):
        cfg = specs.read(cfg).device
    spec = devices.check(cfg.device)
    if spec in ("cpu", "auto"):
        return
    if not cfg.on_device:
        raise ConfigError("device", spec, f"'cpu' or 'auto' with algorithm = {cfg.algorithm!r} (its rounds run on "
                          "the CPU so far; 'auto' picks the CPU for it)")
    if cfg.engine == "torchrun" and cfg.topology != "serverless":
        raise ConfigError("device", spec, f"'cpu' or 'auto' with engine = 'torchrun', topology = {cfg.topology!r} (its "
                          "vectors travel through the c10d TCPStore as CPU bytes; GPUs: topology = 'serverless')")
    if cfg.engine == "torchrun" and spec != "cuda":
        raise ConfigError("device", spec, "'cuda' or 'auto' with engine = 'torchrun' (rank r uses cuda:LOCAL_RANK)")


def check_keys(sign_key: str | None, verify_key: str | None) -> None:
    """``sign_key`` / ``verify_key`` (the two keys it reads, not the config): existing files, and the signing extra
    installed — checked before a run trains, not when it finishes."""
    for key, path in (("sign_key", sign_key), ("verify_key", verify_key)):
        if path is not None:
            allowed = "an existing PEM key file (phalanx keygen KEY.pem PUB.pem)"
            try:
                found = Path(path).is_file()
            except OSError as exc:  # a name the file system refuses (too long), a directory it may not search
                raise ConfigError(key, path, allowed, exc.strerror or type(exc).__name__) from None
            if not found:
                raise ConfigError(key, path, allowed)
            signing.require()


def check_names(dataset: DataSpec, model: ModelSpec) -> None:
    """The data set, model and loss names (built-in, registered, ``module:attr`` or installed plug-ins) and the
    data set's and the model's parameters. (The components the config names — algorithm, aggregator spec, attack,
    server optimizer, stages — check theirs as they are built: :func:`phalanx.experiments.components.build`.)"""
    try:
        data.check_spec(dataset.name, dataset.params)
    except ConfigError as exc:
        if exc.parameter.startswith("dataset_params"):
            raise
        raise ConfigError("dataset", dataset.name, exc.allowed, exc.hint) from None
    build = models.builder(model.name)
    if model.norm == "fedbn" and "norm" not in (accepted_params(build) or ["norm"]):
        raise ConfigError("model_params.norm", "fedbn", f"a model with BatchNorm layers ('cnn', 'resnet20'): "
                          f"{model.name!r} has none")
    check_params(model.name, build, model.params, skip=("input_shape", "num_classes"))
    losses.get(model.loss)


def parse_value(text: str, key: str | None = None) -> Any:
    """Parse the value of ``--set key=value`` for ``key``.

    A list (``[…]``) is a grid axis, parsed as TOML. Otherwise the key's type decides: a string key keeps the text
    as it is (``--set attack=nan`` is the attack ``nan``; quotes are removed), a number or boolean key takes a TOML
    number or ``true``/``false`` (``workers=true`` stays text, which validation then refuses), a table takes a TOML
    inline table. An unknown key's value is parsed as TOML, else kept as text.
    """
    return _parse(text, key, key or "--set")


def _number(word: str) -> bool:
    """Whether ``word`` reads as a TOML number (an int or a float), so needs no quotes in a list."""
    return isinstance(_toml(word, None, "--set"), (int, float)) and word.lower() not in ("true", "false")


def _parse(text: str, key: str | None, name: str) -> Any:
    """:func:`parse_value`; a value that is TOML but that Python cannot hold (nested too deeply, an integer beyond
    64 bits) is a :class:`ConfigError` naming ``name``."""
    t = text.strip()
    kind = _kind(key)
    if t.startswith("["):
        value = _toml(t, None, name)
        if value is None:  # "[cwtm,krum]", the natural shell form: TOML wants each name in quotes
            shown = t if len(t) <= 60 else t[:57] + "..."
            words = [w.strip() for w in t.strip("[]").split(",")[:3] if w.strip()]
            if words and all(_number(w) for w in words):  # "[0,1": numbers need no quotes, only the brackets
                raise ConfigError(key_text(name), shown, "a TOML list (a grid axis)",
                                  f"close the brackets and put the whole argument in single quotes for the shell: "
                                  f"--set '{name}=[{', '.join(words)}]'")
            example = ", ".join(f'"{w}"' for w in words) or '"…"'
            raise ConfigError(key_text(name), shown, "a TOML list (a grid axis)",
                              f"put each name in quotes and the whole argument in single quotes for the shell: "
                              f"--set '{name}=[{example}]'")
        return value
    if kind == "str":
        return t[1:-1] if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"" else t
    value = _toml(t, t, name)
    if value is t and t.startswith("{"):  # {z=abc}: a table whose value is not TOML (a string needs quotes)
        raise ConfigError(key_text(name), t if len(t) <= 60 else t[:57] + "...", "a TOML inline table",
                          "strings in quotes, the whole argument in single quotes for the shell: "
                          f"--set '{name}={{z = 1.5, mode = \"x\"}}'")
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
    out = dict(tree.to_flat(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", item, "key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        if '"' in key or "'" in key:  # a quoted part: stages."mylab.stages:ClipAggregate".c, as TOML writes it
            parts = tree_override.toml_key_parts(key)
            if any("." in part for part in parts):
                out = _set_nested(out, parts, _parse(text, None, key), key)
                continue
            key = ".".join(parts)  # run."workers" is run.workers: quotes change only the spelling
        made = tree_override.flat_override(out, key, lambda flat, text=text, key=key: _parse(text, flat, key))
        if made is not None:  # a key of the config tree: rule.f=3, 'rule={spec="cwtm", f=3}'
            out = made
        elif "." in key:
            out = _set_nested(out, key.split("."), _parse(text, None, key), key)
        else:
            spellings = lr_spellings(out)
            if key in spellings:  # a learning rate set on the command line replaces the file's, whatever spelling
                for spelling in spellings:  # either uses (ROLE_NAMES)
                    out.pop(spelling, None)
            out[key] = _parse(text, key, key or "--set")
    return out


def _set_nested(table: dict[str, Any], parts: list[str], value: Any, key: str) -> dict[str, Any]:
    """``table`` with ``value`` set at the path ``parts`` (``attack_params.z``; ``tracking_params.mlflow.uri``),
    every table on the way copied, not changed."""
    outer, rest = parts[0], parts[1:]
    if not rest:
        return {**table, outer: value}
    current = table.get(outer)
    if current is not None and not isinstance(current, dict):
        inner = ".".join(rest)
        raise ConfigError(key_text(outer), current, f"a table (key = value, …) to set {inner!r} in",
                          f"--set {key}=… sets a key inside the table {outer}")
    return {**table, outer: _set_nested(dict(current or {}), rest, value, key)}


MAX_CONFIG_BYTES = 16 << 20
"""The largest config file read (16 MiB), refused from its size before a byte is read; the shipped configs are
about 1 kB (``configs/default.toml``: 1.4 kB), and a grid of a thousand values of each of ten keys is some 100 kB."""
_UTF8_BOM = b"\xef\xbb\xbf"
_OTHER_BOMS = {b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a dict (a clear error if it is missing, unreadable or malformed).

    The file is opened once (:func:`phalanx.files.read_regular`: a link is followed — the user named it — but a FIFO,
    a device or a directory is refused without blocking) and is at most :data:`MAX_CONFIG_BYTES`. It must be UTF-8,
    as TOML requires; a leading UTF-8 byte-order mark (as some Windows editors write) is
    skipped. Any other encoding is a :class:`ConfigError` naming the file and the first byte that is not UTF-8.
    """
    p = Path(path)
    try:
        found = p.is_file()
    except OSError as exc:  # a name the file system refuses (too long), a directory it may not search
        raise ConfigError("config", str(p), "a readable TOML file", exc.strerror or type(exc).__name__) from None
    if not found:
        raise ConfigError("config", str(p), "an existing TOML file")
    try:  # one descriptor: O_NONBLOCK (a FIFO swapped in does not block), fstat regular, sized before it is read
        raw = files.read_regular(p, MAX_CONFIG_BYTES, follow=True, error=_config_refused)
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
    except MemoryError:
        raise ConfigError("config", str(p), "a TOML file this process has the memory to parse") from None


def _config_refused(path: Path, problem: str) -> ConfigError:
    return ConfigError("config", str(path), f"a regular file of at most {MAX_CONFIG_BYTES:,} bytes", problem)


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.toml"
"""The built-in job (``make run``): digits, 20 workers, 4 Byzantine running ALIE, five rules."""


def load_grid(config: str | Path | None, overrides: list[str]) -> dict[str, Any]:
    """A config file (default: :data:`DEFAULT_CONFIG`) with ``key=value`` overrides applied; list values are grid
    axes (:func:`phalanx.experiments.grid.configs` expands and validates them)."""
    flat, written = tree.read(load_toml(config if config is not None else DEFAULT_CONFIG))
    out = apply_overrides(flat, overrides)
    set_flat = [k for k in (o.split("=", 1)[0].strip() for o in overrides)  # written flat on the command line
                if k.split(".")[0] not in tree.HEADS or ("." not in k and k in RunConfig.model_fields)]
    return spelling.attach(out, written.without(set_flat))
