"""One rank's own worker: its batches, its momentum and, if it is Byzantine, its attack.

Rank r is worker r of the simulated engine. It draws the round's batch positions for *all* computing workers from
the shared ``batches`` stream (one ``(C, B)`` draw, as :func:`~phalanx.training.round.sample_batches` does) and
gathers only its own row's samples, so its batch is the one the simulated engine would have given worker r, and
every rank's stream stays in step. A Byzantine rank of a vector attack runs the attack's call on the honest vectors
the server sends it, with the shared ``attack`` stream, and keeps its own row of the output: every Byzantine rank
computes the same ``(b, d)`` block and sends one row of it, as in the simulated engine.
"""

from __future__ import annotations

import torch
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.training.round import (
    byzantine_vectors,
    computing_workers,
    local_momentum,
    sample_batch_of,
    worker_batches,
)
from phalanx.training.trainer import Setup


class LocalWorker:
    """Worker ``rank`` of a run: the phases of :mod:`phalanx.training.round` for this one worker."""

    def __init__(
        self, rank: int, setup: Setup, batch_state: Tensor, attack_state: Tensor, momentum_row: Tensor | None,
    ) -> None:
        cfg = setup.cfg
        self.rank = rank
        self.setup = setup
        self.honest_n = cfg.workers - cfg.byzantine
        self.computing = computing_workers(setup.attack, cfg.workers, cfg.byzantine)
        self.is_byzantine = rank >= self.honest_n
        self.vector_attack = self.is_byzantine and not isinstance(setup.attack, DataAttack)
        self.batch_gen = torch.Generator()
        self.batch_gen.set_state(batch_state)
        self.attack_gen = torch.Generator()
        self.attack_gen.set_state(attack_state)
        self.row = None if momentum_row is None else momentum_row.reshape(1, -1).clone()

    def warm_up(self) -> None:
        """One throw-away gradient call on a sample of the data (no random stream is touched).

        The first ``torch.func`` call of a process costs seconds (lazy imports); paying it before the ranks report
        ready keeps it out of round 0, where it would count against ``round_timeout``.
        """
        data = self.setup.worker_data
        theta = self.setup.problem.initial_theta()
        self.setup.problem.grads(theta, data.x[:1][None], data.y[:1][None])

    def _batches(self) -> tuple[Tensor, Tensor]:
        """This rank's batch ``(x (1, B, ...), y (1, B))`` of the round; the shared streams advance as on every rank.

        A data attack poisons the Byzantine workers' batches with one ``attack`` stream draw each, in index order,
        so every rank builds them all (:func:`worker_batches`) to keep that stream in step; otherwise only this
        rank's samples are gathered (:func:`sample_batch_of`).
        """
        cfg = self.setup.cfg
        data = self.setup.worker_data
        if isinstance(self.setup.attack, DataAttack) and cfg.byzantine:
            xb, yb = worker_batches(
                data, self.setup.attack, workers=cfg.workers, byzantine=cfg.byzantine,
                batch_size=cfg.batch_size, batch_gen=self.batch_gen, attack_gen=self.attack_gen,
            )
            row = min(self.rank, xb.shape[0] - 1)  # a vector-attack rank has no row; it only draws
            return xb[row : row + 1], yb[row : row + 1]
        return sample_batch_of(data, self.computing, cfg.batch_size, self.batch_gen, min(self.rank, self.computing - 1))

    def momentum_vector(self, theta: Tensor) -> Tensor | None:
        """Draw this round's batches; an honest (or data-attack) rank returns its new momentum ``(d,)``.

        A vector-attack Byzantine rank computes nothing here (it returns None) but still draws, to stay in step.
        """
        xb, yb = self._batches()
        if self.rank >= self.computing:
            return None
        cfg = self.setup.cfg
        self.row = local_momentum(
            theta, self.setup.problem, xb, yb, self.row, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
        )
        return self.row[0]

    def attack_vector(self, honest: Tensor, t: int) -> Tensor:
        """This Byzantine rank's vector of round t: its row of the attack's output on the honest vectors."""
        cfg = self.setup.cfg
        assert not isinstance(self.setup.attack, DataAttack)
        out = byzantine_vectors(
            self.setup.attack, honest, byzantine=cfg.byzantine, f=cfg.f, rule=self.setup.rule,
            attack_gen=self.attack_gen, round=t,
        )
        return out[self.rank - self.honest_n]

    def skip(self) -> None:
        """A round this rank missed: draw its batches (the shared streams stay in step), compute nothing."""
        self._batches()
