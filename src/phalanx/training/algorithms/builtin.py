"""The built-in round algorithms by config name, and what the config derives from their declarations: which keys
each one reads, whose learning rate ``lr`` is, which run on a device, which run over a graph — read from the classes
(:class:`~phalanx.training.algorithms.base.RoundAlgorithm`'s declared attributes), not kept in lists elsewhere."""

from __future__ import annotations

from phalanx.training.algorithms.base import BUILT_IN as NAMES
from phalanx.training.algorithms.base import RoundAlgorithm
from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.algorithms.fedavg import FedAvg
from phalanx.training.algorithms.gossip import AnytimeGossip, Gossip

BUILT_IN: dict[str, type[RoundAlgorithm]] = {cls.name: cls for cls in (DSGD, FedAvg, Gossip, AnytimeGossip)}
"""``algorithm = NAME`` → its class, for the algorithms a config configures with its own keys."""
assert tuple(BUILT_IN) == NAMES, "base.BUILT_IN names the same algorithms, in the same order"


def readers(key: str) -> tuple[str, ...]:
    """The built-in algorithms that read config key ``key`` (:attr:`~RoundAlgorithm.config_keys`)."""
    return tuple(name for name, cls in BUILT_IN.items() if key in cls.config_keys)


def own_keys() -> tuple[str, ...]:
    """Every config key that some built-in algorithm declares as its own, in declaration order."""
    return tuple(dict.fromkeys(k for cls in BUILT_IN.values() for k in cls.config_keys))


def role_names() -> dict[str, tuple[str, ...]]:
    """``<role>_lr`` → the algorithms whose ``lr`` plays that role (every role but the server's, whose rate is
    ``lr`` itself)."""
    roles: dict[str, tuple[str, ...]] = {}
    for name, cls in BUILT_IN.items():
        if cls.lr_role != "server":
            key = f"{cls.lr_role}_lr"
            roles[key] = (*roles.get(key, ()), name)
    return roles


def on_device() -> tuple[str, ...]:
    """The built-in algorithms whose rounds run on a CUDA device (:attr:`~RoundAlgorithm.runs_on_device`)."""
    return tuple(name for name, cls in BUILT_IN.items() if cls.runs_on_device)


def decentralized() -> tuple[str, ...]:
    """The built-in algorithms with a model per node and no server (:attr:`~RoundAlgorithm.decentralized`)."""
    return tuple(name for name, cls in BUILT_IN.items() if cls.decentralized)


def columns(name: str) -> tuple[str, ...]:
    """The config keys a run of algorithm ``name`` repeats on its metric rows beside the common ones (none for an
    algorithm that is not built in)."""
    cls = BUILT_IN.get(name)
    return () if cls is None else cls.config_columns
