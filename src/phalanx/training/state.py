"""What a run carries from round to round, what a round's transport delivers, and how a round is given up."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor


@dataclass
class RoundState:
    """The model and the server's view of the workers after ``round`` rounds.

    ``momentum`` holds every worker's last vector, ``(n, d)`` — for distributed SGD with worker momentum, the
    workers' momentum rows, then the Byzantine rows sent last; ``None`` before the first round. The in-process
    transport updates it in place (one buffer for the whole run): a state must not be used after the next round.
    ``previous`` is the last aggregate the server stepped with (the centre of centered clipping); ``own`` the round
    algorithm's own per-run state, an opaque mapping of tensors that only the algorithm reads
    (:meth:`~phalanx.training.algorithms.base.RoundAlgorithm.initial_state`; FedBN's table of every client's BatchNorm
    rows, say) and that a checkpoint saves under the prefix ``algorithm.``.
    """

    theta: Tensor
    momentum: Tensor | None
    previous: Tensor | None
    round: int = 0
    own: dict[str, Tensor] = field(default_factory=dict)

    def to(self, device: str | torch.device) -> RoundState:
        """This state with its tensors on ``device``: itself when they are all there already (no copy; the in-process
        transport keeps updating the same momentum buffer), else a state of moved copies."""
        dev = torch.device(device)
        if all(t is None or t.device == dev for t in (self.theta, self.momentum, self.previous, *self.own.values())):
            return self

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(dev)

        return replace(self, theta=self.theta.to(dev), momentum=move(self.momentum), previous=move(self.previous),
                       own={k: t.to(dev) for k, t in self.own.items()})


@dataclass
class Snapshot:
    """Everything a run needs to go on from the end of a round: what a checkpoint holds.

    ``streams`` are the states of the per-round random streams (``batches``, ``attack``, ``aggregator``, and the
    stages' own), ``optimizer`` the server optimizer's ``state_dict()``, ``rows`` the metric rows so far,
    ``resumed`` whether it was read back from a checkpoint, ``rule`` the state a rule that keeps state across rounds
    carries (its ``state_dict()``, saved as ``rule.<key>``; empty for every other rule, and in checkpoints written
    before it existed), ``stages`` the run's stages' states under their checkpoint keys (each stage's
    :meth:`~phalanx.training.stages.base.Stage.prefix` and its own key: ``stage.<name>.<key>``, or a key checkpoints
    had before the stage existed, ``norm_stats``).
    """

    state: RoundState
    streams: dict[str, Tensor]
    optimizer: dict[str, Tensor] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    resumed: bool = False
    rule: dict[str, Tensor] = field(default_factory=dict)
    stages: dict[str, Tensor] = field(default_factory=dict)

    def to(self, device: str | torch.device) -> Snapshot:
        """This snapshot with the round state, the optimizer's, the rule's and the stages' state on ``device`` (itself
        when they are there already). The streams' states stay as they are: the random streams are CPU generators on
        every device (:mod:`phalanx.training.devices`)."""
        dev = torch.device(device)
        state = self.state.to(dev)
        held = (*self.optimizer.values(), *self.rule.values(), *self.stages.values())
        if state is self.state and all(t.device == dev for t in held):
            return self
        return replace(self, state=state, optimizer={k: t.to(dev) for k, t in self.optimizer.items()},
                       rule={k: t.to(dev) for k, t in self.rule.items()},
                       stages={k: t.to(dev) for k, t in self.stages.items()})


@dataclass
class Received:
    """The vectors one round delivered to the aggregation.

    ``vectors`` is ``(m, d)``; ``rows`` names the worker of each row (``None``: all n workers in index order, the
    normal DSGD round; a federated round names its sampled clients); ``missing`` the workers whose vector did not
    arrive. ``sent`` / ``received`` count the payload
    bytes the aggregating process moved (0 in process).
    """

    vectors: Tensor
    rows: list[int] | None = None
    missing: list[int] = field(default_factory=list)
    sent: int = 0
    received: int = 0
    state_rows: bool = True
    """Whether the vectors are the workers' state to carry into the next round and the checkpoint (DSGD's momentum
    rows); federated clients keep nothing between rounds."""
    carry: Tensor | None = None
    """The worker-side state rows to carry into the next round and the checkpoint when they are not the vectors
    (a gossip node's momentum; its vectors are its local steps)."""
    messages: dict[int, Tensor] | None = None
    """Decentralized rounds: what the Byzantine neighbours of honest node i sent it, ``(bᵢ, d)`` (they may send
    each neighbour something else)."""
    stats: Tensor | None = None
    """The normalisation statistics the clients of the round measured on the broadcast model, a row per vector
    (``(m, 2·channels)``, :mod:`phalanx.training.norm_stats`); None for a model without BatchNorm / Hybrid BN."""
    own: dict[str, Tensor] | None = None
    """The round algorithm's own state after the round, when the round changed it (new tensors: FedBN's table with
    the sampled honest clients' rows rewritten, say); None: unchanged."""


@dataclass(frozen=True)
class SlotPlan:
    """Who does what in one round of a run with a process per worker slot (the parameter-server topology).

    Ranks are process slots; ``clients`` names the worker (client) each slot plays this round (``None``: slot r is
    worker r, every round — distributed SGD). ``honest``: the slots whose vectors are honest (what an omniscient
    attack sees); ``computing``: the slots that send a vector they computed (honest ones, and a data attack's
    Byzantine ones); ``attacking``: the slots that send a vector attack's rows after seeing the honest vectors.
    """

    honest: list[int]
    computing: list[int]
    attacking: list[int]
    clients: list[int] | None = None


class RoundAborted(Exception):
    """A round cannot be completed (too many workers missing, a collective failed): the loop checkpoints the state
    at the start of the round and raises :class:`~phalanx.errors.WorkersLostError`. ``missing``: the workers whose
    vectors did not arrive; ``detail``: why, in words."""

    def __init__(self, missing: list[int], detail: str = "") -> None:
        super().__init__(detail)
        self.missing = missing
        self.detail = detail
