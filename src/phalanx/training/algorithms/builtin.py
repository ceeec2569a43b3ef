"""The built-in round algorithms by config name, and what the config derives from their declarations: which keys
each one reads, whose learning rate ``lr`` is, which run on a device, which run over a graph — read from the classes
(:class:`~phalanx.training.algorithms.base.RoundAlgorithm`'s declared attributes), not kept in lists elsewhere."""

from __future__ import annotations

from phalanx.errors import ConfigError
from phalanx.training.algorithms.base import BUILT_IN as NAMES
from phalanx.training.algorithms.base import RoundAlgorithm, resolve
from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.algorithms.fedavg import FedAvg
from phalanx.training.algorithms.gossip import AnytimeGossip, Gossip

# Every other built-in algorithm (FedBuff, BASGD, Kardam, Zeno++, AFLGuard, SCAFFOLD, …) is one module of this package
# with @register, found by base.resolve() itself (base._discover): nothing to import here.

BUILT_IN: dict[str, type[RoundAlgorithm]] = {cls.name: cls for cls in (DSGD, FedAvg, Gossip, AnytimeGossip)}
"""``algorithm = NAME`` → its class, for the algorithms a config configures with its own keys."""
assert tuple(BUILT_IN) == NAMES, "base.BUILT_IN names the same algorithms, in the same order"


def algorithm_class(name: str) -> type[RoundAlgorithm]:
    """The class of ``algorithm = name``: a built-in one, or a registered name, ``module:attr`` spec or entry point
    (a one-line :class:`~phalanx.errors.ConfigError` naming ``algorithm`` otherwise)."""
    return BUILT_IN.get(name) or resolve(name)


def readers(key: str) -> tuple[str, ...]:
    """The built-in algorithms that read config key ``key`` (:attr:`~RoundAlgorithm.config_keys`)."""
    return tuple(name for name, cls in BUILT_IN.items() if key in cls.config_keys)


def own_keys() -> tuple[str, ...]:
    """Every config key that some built-in algorithm declares as its own, in declaration order."""
    return tuple(dict.fromkeys(k for cls in BUILT_IN.values() for k in cls.config_keys))


def role_names() -> dict[str, tuple[str, ...]]:
    """``<role>_lr`` → the built-in algorithms whose ``lr`` plays that role: ``client_lr`` (federated averaging),
    ``node_lr`` (gossip, Anytime SGD) and ``server_lr`` (distributed SGD — but not federated averaging, whose
    ``server_lr`` is a key of its own: the server's step beside the clients' ``lr``)."""
    roles: dict[str, tuple[str, ...]] = {}
    for name, cls in BUILT_IN.items():
        key = f"{cls.lr_role}_lr"
        if key not in cls.config_keys:
            roles[key] = (*roles.get(key, ()), name)
    return roles


def lr_spelling(name: str) -> str | None:
    """The role spelling ``<role>_lr`` of ``lr`` that algorithm ``name`` accepts (a built-in one, or one of one's
    own: its declared :attr:`~RoundAlgorithm.lr_role`), or None when that spelling is a key of its own."""
    try:
        cls = algorithm_class(name)
    except ConfigError:  # an unknown name: refused where the algorithm is checked, with its own message
        return None
    key = f"{cls.lr_role}_lr"
    own = cls.config_keys if name in BUILT_IN else ()  # one of one's own takes algorithm_params, not config keys
    return None if key in own else key


def on_device() -> tuple[str, ...]:
    """The built-in algorithms whose rounds run on a CUDA device (:attr:`~RoundAlgorithm.runs_on_device`)."""
    return tuple(name for name, cls in BUILT_IN.items() if cls.runs_on_device)


def topologies() -> tuple[str, ...]:
    """The torchrun topologies the built-in algorithms run on (:attr:`~RoundAlgorithm.topologies`), in order."""
    return tuple(dict.fromkeys(t for cls in BUILT_IN.values() for t in cls.topologies))


def decentralized() -> tuple[str, ...]:
    """The built-in algorithms with a model per node and no server (:attr:`~RoundAlgorithm.decentralized`)."""
    return tuple(name for name, cls in BUILT_IN.items() if cls.decentralized)


def columns(name: str) -> tuple[str, ...]:
    """The config keys a run of algorithm ``name`` repeats on its metric rows beside the common ones (none for an
    algorithm that is not built in)."""
    cls = BUILT_IN.get(name)
    return () if cls is None else cls.config_columns
