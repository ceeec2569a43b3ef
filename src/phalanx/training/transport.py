"""Transports: how a round's vectors move from the workers to the aggregation.

The loop (:mod:`phalanx.training.loop`) runs the same round over any transport: it builds the server's context,
asks the transport for the round's vectors, aggregates them and steps the model. A transport decides *where* the
workers compute and how their vectors travel:

* :class:`InProcess` — every worker in this process, stacked: one batched gradient call for all of them;
* the parameter server over the c10d store and the serverless all-gather of the torchrun engine
  (:mod:`phalanx.distributed`), where a worker is a process and a missing one is counted against f.

Contract: :meth:`Transport.open` is called once with the start snapshot (fresh or resumed) and returns the
snapshot every process starts from (a process that holds no run directory receives it); :meth:`exchange` delivers
round t's vectors for θ, giving an adaptive attack the server's rule bound to the server's context; it raises
:class:`~phalanx.training.state.RoundAborted` when the round cannot be completed; :meth:`streams` gives the
worker-side stream states for a checkpoint; :meth:`close` ends the run (``error``: why it stopped early).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from torch import Tensor

from phalanx.plugins import Registry
from phalanx.training.algorithms.base import WorkerSide, WorkerSlot
from phalanx.training.server import BoundRule
from phalanx.training.state import Received, Snapshot

__all__ = ["InProcess", "Transport", "WorkerSide", "WorkerSlot"]

if TYPE_CHECKING:
    from phalanx.training.experiment import Experiment


class Transport(ABC):
    """How a round's vectors reach the aggregation (see the module's docstring for the contract)."""

    round_timeout: float | None = None
    """How long the transport waits for a round's vectors before counting a worker missing (None: it never does)."""

    @abstractmethod
    def open(self, experiment: Experiment, start: Snapshot) -> Snapshot:
        """Get the workers ready to run from ``start``; return the snapshot this process starts from."""

    @abstractmethod
    def exchange(self, theta: Tensor, t: int, rule: BoundRule) -> Received:
        """The vectors of round t at θ (``rule``: the server's rule and context, for adaptive attacks)."""

    @abstractmethod
    def streams(self) -> dict[str, Tensor]:
        """The worker-side random streams' states (``batches``, ``attack``) after the last exchange."""

    def close(self, error: BaseException | None) -> None:  # noqa: B027 - optional hook
        """End of the run (``error``: the exception that stops it early, else None)."""


class InProcess(Transport):
    """Every worker in this process: all n vectors of a round come from one batched computation.

    The vectors it delivers are the workers' ``(n, d)`` momentum buffer itself, updated in place every round (no
    copy of n × d floats per round); it never gives a round up. A subclass that may give a round up after the
    exchange (dropping workers, say) delivers a copy, so that the state at the start of that round stays intact
    for the checkpoint the loop then writes.
    """

    def __init__(self) -> None:
        self.workers: WorkerSide | None = None

    def open(self, experiment: Experiment, start: Snapshot) -> Snapshot:
        self.workers = experiment.algorithm.all_workers(experiment, start.streams, start.state.momentum)
        return start

    def exchange(self, theta: Tensor, t: int, rule: BoundRule) -> Received:
        assert self.workers is not None, "open() first"
        return self.workers.round(theta, t, rule)

    def streams(self) -> dict[str, Tensor]:
        assert self.workers is not None, "open() first"
        return self.workers.streams()


TOPOLOGIES: Registry[Any] = Registry("topology", "phalanx.torchrun_topologies", legacy_group="phalanx.topologies")
"""The torchrun topologies — how the processes of a run carry its vectors — by name: the built-in ones and a
user's own, registered by :func:`phalanx.distributed.topologies.register` (which checks what it registers) or as
``phalanx.torchrun_topologies`` entry points (the old shared group ``phalanx.topologies`` still read, with a
deprecation warning). Kept here, below both the config (which checks a ``topology`` name) and the
distributed package (which builds the topology)."""
