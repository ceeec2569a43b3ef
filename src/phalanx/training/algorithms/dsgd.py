"""Distributed SGD with worker momentum — the round algorithm of Karimireddy, He & Jaggi (ICML 2021) and Allouah et
al. (AISTATS 2023), as a worker side that every transport drives.

Round t:

1. every honest worker i draws a batch from its own shard and computes gᵢ = ∇ℓ(θ; batch) + λθ;
2. it updates its momentum mᵢ ← β mᵢ + (1 − β) gᵢ (m₀ = g₀) and sends mᵢ;
3. Byzantine workers send what their attack says: a vector attack sees the honest vectors of the round (omniscient)
   and the server's rule bound to the server's context — or, with ``attack_knowledge = "colluders"``, only the
   momentum rows the Byzantine workers compute honestly on their own shards (kept from round to round as an honest
   worker keeps its own); a data attack (label flipping, a backdoor) makes the worker compute an honest-looking
   momentum on poisoned batches (until its ``stop_round``, if it has one);
   with worker-side stages (``Run.worker_stages``, :mod:`phalanx.training.stages`) every computing worker first
   passes gᵢ through them — client-level differential privacy clips it to norm C and adds N(0, σ²C²·I), DP-SGD's
   clip-and-noise per client — so that its momentum, and everything after, is post-processing of what they made;
4. the server aggregates the n vectors and its optimizer steps θ (:mod:`phalanx.training.server`,
   :mod:`phalanx.training.optim`).

Byzantine workers are the last ``byzantine`` indices. The worker side exists in two shapes: :class:`AllWorkers` —
all n workers in one process, one batched gradient call (the in-process transport) — and :class:`OneWorker` — the
worker of one process of a distributed run. Both draw from the same shared streams in the same order, so worker r
gets the same batch in either shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.attacks.base import Attack, AttackContext, DataAttack
from phalanx.errors import ConfigError
from phalanx.training.algorithms.base import RoundAlgorithm, built_in_params
from phalanx.training.problem import Problem
from phalanx.training.shards import WorkerData, sample_batch_of, sample_batches
from phalanx.training.stages.base import WorkerStages
from phalanx.training.state import Received, SlotPlan
from phalanx.training.streams import restored
from phalanx.validate import check_int, check_real

if TYPE_CHECKING:
    from phalanx.training.algorithms.base import Run


@dataclass(frozen=True)
class DSGD(RoundAlgorithm):
    """Distributed SGD with worker momentum: ``batch_size`` samples per worker per round, momentum β, L2 penalty λ."""

    batch_size: int = 32
    momentum: float = 0.9
    weight_decay: float = 0.0
    name = "dsgd"
    missing_word = "ranks"
    runs_on_device = True
    knowledge: ClassVar[tuple[str, ...]] = ("omniscient", "colluders")
    stops_attacks = True
    runs_worker_stages = True

    def __post_init__(self) -> None:
        check_int("batch_size", self.batch_size, low=1)
        check_real("momentum", self.momentum, low=0.0, high=1.0, high_open=True)
        check_real("weight_decay", self.weight_decay, low=0.0)

    def per_round(self, workers: int) -> int:
        """How many vectors the server aggregates each round: every worker's."""
        return workers

    def all_workers(self, exp: Run, streams: dict[str, Tensor], momentum: Tensor | None) -> AllWorkers:
        """The n workers of ``exp`` in this process, from the given stream states and momentum rows."""
        return AllWorkers(self, exp, streams, momentum)

    def one_worker(self, exp: Run, rank: int, streams: dict[str, Tensor], momentum: Tensor | None) -> OneWorker:
        """Worker ``rank`` of ``exp`` alone (``momentum``: its own row, ``(d,)``, or None)."""
        return OneWorker(self, exp, rank, streams, momentum)

    @classmethod
    def from_config(cls, cfg: Any, lr: Callable[[int], float]) -> tuple[DSGD, Callable[[int], float]]:
        """From ``batch_size``, ``momentum`` (the workers') and ``weight_decay``; ``lr`` is the server's."""
        built_in_params(cfg)
        return cls(batch_size=cfg.batch_size, momentum=cfg.momentum, weight_decay=cfg.weight_decay), lr

    def check_config(self, cfg: Any, rule: Aggregator, attack: Attack | DataAttack) -> None:
        """The population's checks, and no boosted attack (:meth:`check`), named as the config's key."""
        super().check_config(cfg, rule, attack)
        boost = float(attack.boost)
        if boost != 1.0:
            raise ConfigError("attack_params.boost", boost, "1 with algorithm = 'dsgd' (boosting scales a federated "
                              "client's update)")
        if isinstance(attack, DataAttack) and attack.shapes_update:
            raise ConfigError("attack", attack.name, "an attack that does not shape a federated client's update with "
                              "algorithm = 'dsgd' (use algorithm = 'fedavg')")

    def check(self, run: Run) -> None:
        """A DSGD worker's vector is carried into its momentum: boosting it (a federated attack's knob) is refused."""
        boost = float(run.attack.boost)
        if boost != 1.0:
            raise ConfigError("boost", boost, "1 with distributed SGD (boosting scales a federated client's update; a "
                              "DSGD worker's vector is carried into its momentum)")
        if isinstance(run.attack, DataAttack) and run.attack.shapes_update:
            raise ConfigError("attack", run.attack.name, "an attack that does not shape a federated client's update "
                              "with distributed SGD (a DSGD worker's vector is carried into its momentum)")


def computing_workers(attack: Attack | DataAttack, workers: int, byzantine: int, knowledge: str = "omniscient") -> int:
    """How many workers compute a gradient each round: the honest ones, plus the Byzantine ones of a data attack or
    of colluders (``knowledge = "colluders"``: they compute their honest vectors, which their attack then sees).

    They are workers ``0 … computing−1``; the rows of a vector attack's Byzantine workers come from the attack.
    """
    return workers if isinstance(attack, DataAttack) or knowledge == "colluders" else workers - byzantine


def worker_batches(
    data: WorkerData, attack: Attack | DataAttack, *, workers: int, byzantine: int, batch_size: int,
    batch_gen: torch.Generator, attack_gen: torch.Generator, computing: int | None = None, round: int = 0,
) -> tuple[Tensor, Tensor]:
    """The batches of every computing worker of the round, ``(x (C, B, ...), y (C, B))`` (``computing``: C, by
    default :func:`computing_workers`).

    One draw of the ``batches`` stream for all ``C`` computing workers (:func:`sample_batches`); a data attack that
    is active in ``round`` then poisons the Byzantine workers' batches, one ``attack`` stream draw per Byzantine
    worker in index order.
    """
    if computing is None:
        computing = computing_workers(attack, workers, byzantine)
    xb, yb = sample_batches(data, computing, batch_size, batch_gen)
    if isinstance(attack, DataAttack) and byzantine and attack.active(round):
        xb, yb = poison_rows(attack, xb, yb, workers - byzantine, data.num_classes, attack_gen)
    return xb, yb


def poison_rows(
    attack: DataAttack, xb: Tensor, yb: Tensor, first: int, num_classes: int, attack_gen: torch.Generator,
    attackers: list[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """The batches ``(W, B, ...)`` with rows ``first …`` (the Byzantine workers') poisoned by a data attack, one
    ``attack`` stream draw per row in order; the rows before ``first`` as they are. ``attackers``: which Byzantine
    worker (``0 … b−1``) each poisoned row is (default ``0, 1, …``; a federated round's sampled ones)."""
    if first >= xb.shape[0]:
        return xb, yb
    who = attackers if attackers is not None else list(range(xb.shape[0] - first))
    poisoned = [attack.transform(xb[i], yb[i], num_classes, attack_gen, attacker=who[i - first])
                for i in range(first, xb.shape[0])]
    return (torch.cat([xb[:first], torch.stack([x for x, _ in poisoned])]),
            torch.cat([yb[:first], torch.stack([y for _, y in poisoned])]))


def local_momentum(
    theta: Tensor, problem: Problem, xb: Tensor, yb: Tensor, rows: Tensor | None, *, momentum: float,
    weight_decay: float,
) -> Tensor:
    """Gradients gᵢ = ∇ℓ(θ; batchᵢ) + λθ of the given workers and their momentum mᵢ ← β mᵢ + (1 − β) gᵢ.

    ``rows`` holds those workers' momentum ``(W, d)`` and is updated in place (and returned); ``None`` in the first
    round, where m₀ = g₀ (the gradients are returned).
    """
    if rows is None:
        first = torch.empty(xb.shape[0], problem.dim, dtype=theta.dtype, device=theta.device)
        return problem.accumulate_grads(theta, xb, yb, first, 1.0, weight_decay)
    # m ← β m + (1 − β) g, fused with the gradient (no (W, d) matrix of flat gradients is built)
    return problem.accumulate_grads(theta, xb, yb, rows, 1.0 - momentum, weight_decay)


def staged_momentum(
    theta: Tensor, problem: Problem, xb: Tensor, yb: Tensor, rows: Tensor | None, *, momentum: float,
    weight_decay: float, stages: WorkerStages, workers: int, positions: slice = slice(None),
) -> Tensor:
    """:func:`local_momentum` with worker-side stages: g̃ᵢ = stages(gᵢ) (client-level DP: clip_C(gᵢ) + N(0, σ²C²·I)),
    then mᵢ ← β mᵢ + (1 − β) g̃ᵢ (m₀ = g̃₀). The round has ``workers`` computing workers; these are those at
    ``positions`` (a stage draws for all of them: :class:`~phalanx.training.stages.base.WorkerStages`)."""
    g = torch.empty(xb.shape[0], problem.dim, dtype=theta.dtype, device=theta.device)
    problem.accumulate_grads(theta, xb, yb, g, 1.0, weight_decay)
    g = stages.update(g, workers, positions)
    if rows is None:
        return g
    return rows.mul_(momentum).add_(g, alpha=1.0 - momentum)


def byzantine_vectors(
    attack: Attack, honest: Tensor, *, byzantine: int, f: int, rule: Callable[[Tensor], Tensor],
    attack_gen: torch.Generator, round: int, workers: int | None = None, knowledge: str = "omniscient",
    screen: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The ``(byzantine, d)`` vectors of a vector attack, given the honest vectors it may see and the server's rule
    (bound to the server's context). With ``knowledge = "colluders"``, ``honest`` holds the Byzantine workers' own
    honest computations and ``workers`` the number of vectors the server receives; ``screen``: an asynchronous
    server's filter as an oracle (:class:`~phalanx.attacks.base.AttackContext`)."""
    ctx = AttackContext(
        honest=honest, n_byzantine=byzantine, f=f, aggregator=rule, generator=attack_gen, round=round,
        workers=workers if knowledge == "colluders" else None, knowledge=knowledge, screen=screen,
    )
    return attack(ctx)


class _Workers:
    """What both shapes share: the experiment's sizes and the two worker-side streams."""

    def __init__(self, algo: DSGD, exp: Run, streams: dict[str, Tensor]) -> None:
        self.algo = algo
        self.exp = exp
        self.n, self.b, self.f = exp.workers, exp.byzantine, exp.f
        self.honest_n = self.n - self.b
        self.vector_attack = self.b > 0 and not isinstance(exp.attack, DataAttack)
        self.colluders = self.vector_attack and exp.attack_knowledge == "colluders"
        self.computing = computing_workers(exp.attack, self.n, self.b, exp.attack_knowledge if self.b else
                                           "omniscient")
        self.batch_gen = restored(streams["batches"])
        self.attack_gen = restored(streams["attack"])
        self.stages = WorkerStages(exp.worker_stages, streams, exp.seed)

    def streams(self) -> dict[str, Tensor]:
        """The worker-side streams' states now (and the worker stages' own: ``dp`` with differential privacy)."""
        return {"batches": self.batch_gen.get_state(), "attack": self.attack_gen.get_state(), **self.stages.streams()}

    def _momentum(self, theta: Tensor, xb: Tensor, yb: Tensor, rows: Tensor | None, positions: slice) -> Tensor:
        """The new momentum of the workers at ``positions`` of the computing ones (:func:`local_momentum`, or
        :func:`staged_momentum` with worker-side stages)."""
        algo, exp = self.algo, self.exp
        if not self.stages:
            return local_momentum(theta, exp.problem, xb, yb, rows, momentum=algo.momentum,
                                  weight_decay=algo.weight_decay)
        return staged_momentum(theta, exp.problem, xb, yb, rows, momentum=algo.momentum,
                               weight_decay=algo.weight_decay, stages=self.stages, workers=self.computing,
                               positions=positions)

    def _draw_noise(self, theta: Tensor) -> None:
        """A round in which this process computes no update: the worker stages' streams advance as where it does."""
        if self.stages:
            self.stages.update(theta.new_zeros(0, self.exp.problem.dim), self.computing, slice(0, 0))

    def _attack(self, honest: Tensor, rule: Callable[[Tensor], Tensor], t: int) -> Tensor:
        assert isinstance(self.exp.attack, Attack)
        return byzantine_vectors(self.exp.attack, honest, byzantine=self.b, f=self.f, rule=rule,
                                 attack_gen=self.attack_gen, round=t, workers=self.n,
                                 knowledge=self.exp.attack_knowledge)


class AllWorkers(_Workers):
    """All n workers in one process: one batched gradient call per round, one ``(n, d)`` momentum buffer."""

    def __init__(self, algo: DSGD, exp: Run, streams: dict[str, Tensor], momentum: Tensor | None) -> None:
        super().__init__(algo, exp, streams)
        self.buffer = momentum

    def round(self, theta: Tensor, t: int, rule: Callable[[Tensor], Tensor]) -> Received:
        """The n vectors of round t, ``(n, d)``: the momentum rows of the computing workers, then the vector
        attack's rows. The buffer is updated in place and delivered (the same tensor every round)."""
        exp, algo = self.exp, self.algo
        xb, yb = worker_batches(
            exp.data, exp.attack, workers=self.n, byzantine=self.b, batch_size=algo.batch_size,
            batch_gen=self.batch_gen, attack_gen=self.attack_gen, computing=self.computing, round=t,
        )
        if self.buffer is None:  # m₀ = g₀; one (n, d) buffer from now on, updated in place
            g = self._momentum(theta, xb, yb, None, slice(None))
            self.buffer = torch.empty(self.n, g.shape[1], dtype=g.dtype, device=g.device)
            self.buffer[: self.computing] = g
        else:
            self._momentum(theta, xb, yb, self.buffer[: self.computing], slice(None))
        m = self.buffer
        if self.colluders:  # the attack sees the Byzantine workers' own honest rows, kept as their momentum
            sent = torch.cat([m[: self.honest_n], self._attack(m[self.honest_n :], rule, t)])
            return Received(sent, carry=m)
        if self.vector_attack:
            m[self.honest_n :] = self._attack(m[: self.honest_n], rule, t)
        return Received(m)


class OneWorker(_Workers):
    """Worker ``rank`` alone, as one process of a distributed run runs it.

    Its :class:`~phalanx.training.state.SlotPlan` is the same every round (rank r is worker r). It draws the round's
    batch positions for *all* computing workers from the shared ``batches`` stream and gathers
    only its own row's samples, so its batch is the one :class:`AllWorkers` gives worker ``rank`` and every
    process's stream stays in step. A Byzantine rank of a vector attack runs the attack on the honest vectors it is
    sent and keeps its own row of the ``(b, d)`` output, as :class:`AllWorkers` would.
    """

    def __init__(
        self, algo: DSGD, exp: Run, rank: int, streams: dict[str, Tensor], momentum: Tensor | None,
    ) -> None:
        super().__init__(algo, exp, streams)
        if self.colluders:
            raise ConfigError("attack_knowledge", "colluders", "'omniscient' with a process per worker (the "
                              "attacking ranks are sent the honest ranks' vectors; colluders run in process so far)")
        self.rank = rank
        self.is_byzantine = rank >= self.honest_n
        self.sends_attack = self.is_byzantine and self.vector_attack
        self.shares_attack_stream = False  # the Byzantine ranks are the same every round: each keeps its own
        self.row = None if momentum is None else momentum.reshape(1, -1).to(exp.device).clone()
        self.plan = SlotPlan(
            honest=list(range(self.honest_n)), computing=list(range(self.computing)),
            attacking=list(range(self.honest_n, self.n)) if self.vector_attack else [],
        )

    def warm_up(self) -> None:
        """One throw-away gradient call on one sample (no random stream is touched): the first ``torch.func`` call
        of a process costs seconds of lazy set-up, which must not count against a round's timeout."""
        data, problem = self.exp.data, self.exp.problem
        problem.grads(problem.initial_theta(), data.x[:1][None], data.y[:1][None])

    def _batch(self, t: int) -> tuple[Tensor, Tensor]:
        """This rank's batch ``(x (1, B, ...), y (1, B))``; the shared streams advance as on every rank.

        Under a data attack every rank builds all the batches (:func:`worker_batches`), so that the ``attack``
        stream, drawn once per Byzantine worker in index order, stays in step; otherwise only this rank's samples
        are gathered (:func:`sample_batch_of`).
        """
        exp = self.exp
        if isinstance(exp.attack, DataAttack) and self.b:
            xb, yb = worker_batches(
                exp.data, exp.attack, workers=self.n, byzantine=self.b, batch_size=self.algo.batch_size,
                batch_gen=self.batch_gen, attack_gen=self.attack_gen, round=t,
            )
            row = min(self.rank, xb.shape[0] - 1)  # a vector-attack rank has no row; it only draws
            return xb[row : row + 1], yb[row : row + 1]
        return sample_batch_of(exp.data, self.computing, self.algo.batch_size, self.batch_gen,
                               min(self.rank, self.computing - 1))

    def vector(self, theta: Tensor, t: int) -> Tensor | None:
        """Draw this round's batch; an honest (or data-attack) rank returns its new momentum ``(d,)``, a vector-attack
        Byzantine rank None (it computes nothing, but draws, to stay in step)."""
        xb, yb = self._batch(t)
        if self.rank >= self.computing:
            self._draw_noise(theta)
            return None
        self.row = self._momentum(theta, xb, yb, self.row, slice(self.rank, self.rank + 1))
        return self.row[0]

    def attack_vector(self, honest: Tensor, rule: Callable[[Tensor], Tensor], t: int) -> Tensor:
        """This Byzantine rank's vector of round t: its row of the attack's output on the honest vectors."""
        return self._attack(honest, rule, t)[self.rank - self.honest_n]

    def skip(self, t: int) -> None:
        """A round this rank missed: draw its batch and noise (the shared streams stay in step), compute nothing."""
        self._batch(t)
        self._draw_noise(torch.zeros(1, device=self.exp.device))


