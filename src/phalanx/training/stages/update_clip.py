"""Update clipping at the worker, a worker stage: every computing worker scales its update to norm at most C before
it leaves the worker, and sends nothing else different.

For a worker's update u (a DSGD worker's stochastic gradient gᵢ = ∇ℓ(θ; batchᵢ) + λθ *before* its momentum; a
FedAvg client's pseudo-gradient θ − θᵢ after its local steps — :mod:`phalanx.training.stages.base`)::

    ũ = u · min(1, C / ‖u‖₂)        so that ‖ũ‖₂ ≤ C

— the client-side clipping of DP-FedAvg (McMahan, Ramage, Talwar & Zhang, "Learning differentially private recurrent
language models", ICLR 2018, Algorithm 1, ``ClipFn``) without its noise, i.e. the norm bounding of Sun, Kairouz,
Suresh & McMahan ("Can you really backdoor federated learning?", arXiv 1911.07963, 2019, §3) done by each client
instead of by the server. Its use for robustness: an analysis that assumes the honest vectors' norms bounded (Krum's
moment condition, Blanchard et al., NeurIPS 2017, Proposition 1: E‖G‖^r bounded for r = 2, 3, 4) then has the bound
C by construction, not by hope — at the price of the bias a clipped gradient has when ‖∇ℓ‖ > C.

**Who is bound.** Every worker that *computes* an update: the honest ones, and the Byzantine workers of a data
attack (label flip …), which follow the protocol on poisoned data — so their updates too have norm ≤ C. A *vector*
attack's rows are whatever the attack makes: nothing at the worker binds an attacker who does not run the protocol
(that is the server's rule's job). A row with a non-finite norm (a diverged honest worker) is left as it is: the run's
divergence check reports it; scaling it by C/∞ = 0 would turn its ∞ into NaN and hide where it came from.

**Columns**: ``update_clip_clipped``, how many of the last round's rows had a norm above C, and
``update_clip_max_norm``, the largest norm before clipping (∞ for a non-finite row); None before the first round and
in a round no row was computed. In the simulated engine every computing worker is in this process, so the columns
cover them all, measured here. Under ``phalanx launch`` (topology ``server``) every worker process measures its own
row and sends rank 0 its report — ``(clipped, max_norm)`` of its last round, with its update (the stage seam's
:meth:`~phalanx.training.stages.base.WorkerStage.report`; :mod:`phalanx.distributed.wire`) — and rank 0 adds the
reports of the ranks whose rows the server used to its own row's: the columns then count every computing worker,
as the simulated run does. ``update_clip_reported`` says how many of those were *reported* by another process (0 in
the simulated engine): a report is its sender's claim — a Byzantine worker of a data attack may report any count —
so these columns are never read by a decision; a report out of the stage's bounds (a count that is not an integer in
[0, n], a NaN or negative norm, a count > 0 with a norm ≤ C or a count of 0 with a finite norm > C) is dropped, so
the columns stay within ``[0, n²]`` and ``[0, ∞]``. Keyed server jobs carry the report signed with the vector, and
serverless jobs (keyed or not) in every rank's row, where every rank adds the others' (docs/design.md, "Where a worker
stage's columns come from"; ``tests/test_stage_reports_engines.py``). No state, no random stream:
a resumed run is the uninterrupted one bit for bit (the columns are the last round's, recomputed every round).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.training.stages.base import Evaluation, WorkerStage, WorkerUpdate
from phalanx.validate import check_real

COLUMNS = ("update_clip_clipped", "update_clip_max_norm", "update_clip_reported")
"""The metric columns it fills."""


class UpdateClip(WorkerStage):
    """Clip every computing worker's update to norm ``c`` (C > 0) before it leaves the worker (the module's
    docstring)."""

    name: ClassVar[str] = "update_clip"
    reference: ClassVar[str] = ("H. B. McMahan, D. Ramage, K. Talwar, L. Zhang, 'Learning differentially private "
                                "recurrent language models', ICLR 2018, Algorithm 1 (ClipFn at the client, without "
                                "the noise); Sun et al., 'Can you really backdoor federated learning?', 2019, §3")
    parameters: ClassVar[Mapping[str, str]] = {
        "c": "C > 0: every computing worker's update is scaled to norm at most C before it is sent",
    }

    reports: ClassVar[int] = 2
    """Its report to rank 0 under ``phalanx launch``: (rows clipped, largest norm) of a process's last round."""

    def __init__(self, c: float = 1.0) -> None:
        self.c = check_real("c", c, low=0.0, low_open=True)
        self.last: tuple[int, float] | None = None
        self.reported = 0  # how many other processes' reports went into ``last`` (rank 0 under phalanx launch)
        self.workers = 0  # the last round's computing workers: no report may count more

    def params(self) -> dict[str, Any]:
        return {"c": self.c}

    def update(self, rows: Tensor, u: WorkerUpdate) -> Tensor:
        """Scale each row of finite norm above C to norm C, in place (returned); record the round's count and
        largest norm before clipping (∞ for a non-finite row; None with no rows)."""
        self.workers, self.reported = u.workers, 0
        if rows.shape[0] == 0:
            self.last = None
            return rows
        norms = torch.linalg.vector_norm(rows.detach(), dim=1, dtype=torch.float64)
        over = torch.isfinite(norms) & (norms > self.c)
        scale = torch.where(over, self.c / norms.clamp_min(self.c), torch.ones_like(norms))
        rows.mul_(scale.to(device=rows.device, dtype=rows.dtype)[:, None])
        self.last = (int(over.sum()), float(torch.nan_to_num(norms, nan=math.inf).max()))  # a NaN norm counts as ∞
        return rows

    def report(self) -> tuple[float, ...] | None:
        """This process's last round: (rows clipped, largest norm before clipping); None without rows."""
        return None if self.last is None else (float(self.last[0]), self.last[1])

    def plausible(self, claim: tuple[float, ...]) -> bool:
        """Whether a report is within the stage's bounds: a count k, an integer in [0, n], and a norm ν in [0, ∞]
        that agrees with it (k > 0 needs ν > C; k = 0 needs ν ≤ C or ν = ∞, a non-finite row not being clipped)."""
        k, top = claim
        if not (math.isfinite(k) and k == int(k) and 0 <= k <= self.workers) or math.isnan(top) or top < 0:
            return False
        return top > self.c if k > 0 else (top <= self.c or math.isinf(top))

    def absorb(self, reported: Sequence[tuple[float, ...] | None]) -> None:
        """Add the other processes' plausible reports (:meth:`plausible`; any other is dropped) to this round's
        count and largest norm; :attr:`reported` counts them."""
        for claim in reported:
            if claim is None or not self.plausible(claim):
                continue
            k, top = int(claim[0]), float(claim[1])
            self.last = (k, top) if self.last is None else (self.last[0] + k, max(self.last[1], top))
            self.reported += 1

    def column_names(self) -> tuple[str, ...]:
        return COLUMNS

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        """The last round's clipped rows and largest norm before clipping — this process's, and under ``phalanx
        launch`` at rank 0 the other processes' reports — and how many were reported (None without rows)."""
        return dict.fromkeys(COLUMNS) if self.last is None else dict(zip(COLUMNS, (*self.last, self.reported)))
