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
* ``make_server(run, generator)`` — its own server, or None for the standard one (aggregate, then step θ);
* ``check(run)`` — its own checks on the run it is part of, raised before anything trains;

and declares, as data (class attributes, not names listed elsewhere):

* ``name`` — its config name; ``missing_word`` — how a missing participant is named in messages ("ranks",
  "clients", "neighbours"); ``decentralized`` — a model per node, no server;
* ``runs_on_device`` — its rounds run on a CUDA device; ``pools_norm_stats`` — it measures and pools BatchNorm /
  Hybrid BN statistics; ``keeps_local_norms`` — it keeps every client's BatchNorm layers between rounds (FedBN).

``run`` is the :class:`~phalanx.training.experiment.Experiment` the algorithm is part of (typed loosely here so that
this module, and the algorithms, do not import the experiment that imports them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.plugins import Registry, check_params, is_spec
from phalanx.training.state import Received, SlotPlan
from phalanx.validate import suggest


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
    """It keeps every client's BatchNorm layers between rounds (FedBN, :mod:`phalanx.training.fedbn`)."""

    @abstractmethod
    def per_round(self, workers: int) -> int:
        """How many vectors the rule aggregates each round (at least, in a gossip round)."""

    def population(self, workers: int) -> str:
        """What :meth:`per_round`'s number is called in an error message."""
        return "workers" if self.per_round(workers) == workers else "clients_per_round"

    @abstractmethod
    def all_workers(self, run: Any, streams: dict[str, Tensor], carried: Tensor | None) -> WorkerSide:
        """Every worker in this process (the in-process transport); ``carried``: the workers' rows carried from the
        last round (momentum), or None."""

    @abstractmethod
    def one_worker(self, run: Any, rank: int, streams: dict[str, Tensor], carried: Tensor | None) -> WorkerSlot:
        """One process's slot ``rank`` (the torchrun engine)."""

    def make_server(self, run: Any, generator: torch.Generator) -> Any:
        """Its own server (what combines the round's vectors), or None for the standard
        :class:`~phalanx.training.server.Server`."""
        return None

    def norm_stats_momentum(self) -> float:
        """How much of the round's pooled normalisation statistics is blended into the global ones."""
        return 0.1

    def check(self, run: Any) -> None:  # noqa: B027 - optional hook
        """Refuse (:class:`~phalanx.errors.ConfigError`) a run this algorithm cannot train, before it trains."""


def _accept(obj: Any, name: str) -> Any:
    if not (isinstance(obj, type) and issubclass(obj, RoundAlgorithm)):
        raise ConfigError("algorithm", name, "a subclass of phalanx.training.algorithm.RoundAlgorithm")
    return obj


_REGISTRY: Registry[Any] = Registry("algorithm", "phalanx.algorithms", _accept)
BUILT_IN = ("dsgd", "fedavg", "gossip", "anytime")
"""The built-in round algorithms, which a config configures with its own keys (``batch_size``, ``momentum``,
``local_steps``, ``graph``, …); every other name is looked up in the registry and built from ``algorithm_params``."""


def register(cls: type[RoundAlgorithm]) -> type[RoundAlgorithm]:
    """Class decorator: make a round algorithm known to configs under ``cls.name``."""
    _REGISTRY.register(cls)
    return cls


def names() -> list[str]:
    """The names a config's ``algorithm`` accepts (and a ``module:attr`` spec)."""
    return sorted({*BUILT_IN, *_REGISTRY.names()})


def resolve(name: str) -> type[RoundAlgorithm]:
    """The class of a registered name, a ``module:attr`` spec or a ``phalanx.algorithms`` entry point."""
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
