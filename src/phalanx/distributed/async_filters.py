"""Kardam's, Zeno++'s and AFLGuard's filters on the real asynchronous server: each update judged as it arrives.

Damaskinos, El Mhamdi, Guerraoui, Patra & Taziki, "Asynchronous Byzantine Machine Learning (the case of SGD)",
ICML 2018 (the Lipschitz filter: an update g of worker p computed at θ is accepted iff its empirical Lipschitz
coefficient k = ‖g − ĝ‖ / ‖θ − θ̂‖ is at most the ((n − f)/n)-quantile of the workers' latest coefficients; assumes
n ≥ 3f + 1, a Lipschitz-smooth cost and bounded staleness); Xie, Koyejo & Gupta, "Zeno++: Robust Fully
Asynchronous SGD", ICML 2020 (the validation score ⟨v, g̃⟩ − ρ‖g̃‖² ≥ −ε of the normalised update g̃ against the
gradient v of the server's validation loss; assumes a smooth loss, bounded gradient variance and a validation set
drawn from the workers' distribution); Fang, Liu, Gong & Bentley, "AFLGuard: Byzantine-robust Asynchronous
Federated Learning", ACSAC 2022 (accept g iff ‖g − g₀‖ ≤ λ‖g₀‖, g₀ the server's own update on its trusted samples at
the current θ — here rank 0's gradient at the θₜ it published; no state). The math is the simulated algorithms'
own and lives there — this module
calls :meth:`~phalanx.training.algorithms.asynchronous.Asynchronous.screen`
(:meth:`~phalanx.training.algorithms.kardam.Kardam.screen`, :meth:`~phalanx.training.algorithms.zenopp.ZenoPP.screen`,
:meth:`~phalanx.training.algorithms.aflguard.AFLGuard.screen`)
with one update at a time, never a copy of it.

What differs from the simulated clock, and why:

* **Per update, as it arrives.** The simulated step screens its deliveries in delivery order and a rejected update
  stays in the buffer as a zero row; on processes the server judges each update when it arrives (after the
  buffer's own checks: :class:`~phalanx.distributed.async_buffer.Buffer`), and a rejected one is **dropped** —
  counted under the reason ``filtered`` per rank, said once per rank on rank 0's log, and never takes a buffer
  place: the step waits for an update the filter passes — or, when every live worker's update of the newest version
  was rejected, takes a zero step (:mod:`phalanx.distributed.async_zero`); it gives up after ``round_timeout`` only
  when nothing arrives.
* **n is the worker ranks.** Rank 0 only serves, so Kardam's quantile is over the n − 1 ranks that compute
  (``workers = n − 1``; the config checks 3f < n − 1 before launch).
* **The step of the judgement.** An update is judged at the version t the server has published when it arrives
  (Zeno++'s v is refreshed at the first judgement of step t when t is a multiple of ``refresh``; AFLGuard's g₀ is
  computed at θₜ for each judgement); one that arrives
  after the buffer filled is used in the next step, judged at t. An accepted update that a newer one of its worker
  then supersedes in the step (the buffer keeps each worker's freshest) was judged, and stays Kardam's reference,
  without being aggregated.

State: the ring of the last S + 1 published θ (Kardam's θ of an update's version), the filter's own state
(Kardam's references and the coefficients of every worker; Zeno++'s v and the step it was computed at, drawn from
the server's own ``validation_size`` training samples with its own ``validation`` stream) and its statistics
(:data:`~phalanx.training.algorithms.asynchronous.SCREEN`) travel in the algorithm's state (``Received.own``), so
the checkpoint holds them and a resumed server continues from them (the algorithm's ``load_state`` refuses a state
of another shape in one line).

Memory: the ring (S + 1 rows of d), Kardam's two references and one coefficient per rank — bounded by S, d and n,
whatever a worker sends. The keyed audit cannot recompute a filter's decision on an ordinary step (it would need
every θ of the run and the rejected updates, which the transcript does not hold — a zero step records both, and the
audit recomputes AFLGuard's decision there): :func:`unchecked` says so, and the audit counts those steps
(``filters_unchecked``), never passing them as checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from phalanx.training.algorithms.asynchronous import CLOCK_KEYS, RING, SCREENED, TOUCHED, screen_stats

if TYPE_CHECKING:
    from phalanx.training.experiment import Experiment

REASON = "filtered"
"""The drop reason of an update the algorithm's filter rejected (:data:`~phalanx.distributed.async_buffer.REASONS`)."""


class ProcessFilter:
    """The real server's filter (see the module's docstring): :meth:`publish` each version, :meth:`judge` each
    update that passed the buffer's checks; :attr:`own` is the state that goes into the checkpoint."""

    def __init__(self, exp: Experiment, own: dict[str, Tensor]) -> None:
        self.exp = exp
        self.algo: Any = exp.algorithm
        self.own = {k: v for k, v in own.items() if k not in ("stats",)}
        self.slots = int(getattr(self.algo, "max_staleness", 0)) + 1
        self.t = -1
        self.theta: Tensor | None = None
        self.stepped = -1

    def publish(self, t: int, theta: Tensor) -> None:
        """Version t is θ: it joins the ring (slot t mod (S + 1))."""
        ring = self.own[RING].clone()
        ring[t % self.slots] = theta.detach()
        self.own[RING] = ring
        self.t, self.theta = t, theta.detach()

    def judge(self, rank: int, version: int, row: Tensor) -> Tensor | None:
        """The row the algorithm passes on for worker ``rank``'s update of ``version`` (Zeno++: normalised), or None
        when its filter rejects it; the filter's state and statistics move on either way."""
        assert self.theta is not None, "publish before judge"
        ids = torch.tensor([rank], dtype=torch.int64)
        versions = torch.tensor([version], dtype=torch.int64)
        update = row.to(self.theta)[None]
        passed, keep, state = self.algo.screen(self.exp, self.own, self.theta, self.t, ids, update, versions,
                                               self.own[RING], workers=self.exp.workers - 1)
        byzantine = torch.tensor([rank >= self.exp.workers - self.exp.byzantine])
        self.own.update(state)
        old = self.own[SCREENED]
        stats = screen_stats(old, keep, byzantine)
        stats[1] += old[1] if self.stepped == self.t else 0.0  # (rejected_step: over the step's judgements)
        self.own[SCREENED], self.stepped = stats, self.t
        return passed[0] if bool(keep[0]) else None

    def state(self) -> dict[str, Tensor]:
        """What the checkpoint keeps of the filter: the ring, the filter's state, its statistics (not the clock's
        keys, which the server does not move)."""
        return {k: v for k, v in self.own.items() if k not in (*CLOCK_KEYS, TOUCHED)}


def unchecked(algorithm: Any) -> bool:
    """Whether the keyed audit leaves an asynchronous step's filtering unchecked (the algorithm screens: Kardam,
    Zeno++, AFLGuard — whose g₀ needs θₜ, which the transcript does not hold) — the audit counts such steps instead
    of passing them silently."""
    return bool(getattr(algorithm, "screens", False))


def rows_unchecked(algorithm: Any) -> bool:
    """Whether the filter changes the rows it passes on (Zeno++ normalises each update by its validation gradient,
    which the transcript does not hold), so the audit cannot recompute a step's rows from its signed updates."""
    return bool(getattr(algorithm, "screens", False)) and bool(getattr(algorithm, "reshapes", False))
