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

**Columns** (measured by the worker side of *this process*): ``update_clip_clipped``, how many of the last round's
rows had a norm above C, and ``update_clip_max_norm``, the largest norm before clipping (∞ for a non-finite row). In
the simulated engine every computing worker is in this process, so the columns cover them all; under ``phalanx
launch`` the metric rows are rank 0's, so they cover only the rows rank 0 computed itself (one worker's, measured
with ``topology = "server"`` and 4 processes), and are None where a process computed no row in the last round (and
before the first round). A worker stage has no channel to send its measurements to the server's rows. No state,
no random stream: a resumed run is the uninterrupted one bit for bit (the columns are the last round's, recomputed
every round).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.training.stages.base import Evaluation, WorkerStage, WorkerUpdate
from phalanx.validate import check_real

COLUMNS = ("update_clip_clipped", "update_clip_max_norm")
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

    def __init__(self, c: float = 1.0) -> None:
        self.c = check_real("c", c, low=0.0, low_open=True)
        self.last: tuple[int, float] | None = None

    def params(self) -> dict[str, Any]:
        return {"c": self.c}

    def update(self, rows: Tensor, u: WorkerUpdate) -> Tensor:
        """Scale each row of finite norm above C to norm C, in place (returned); record the round's count and
        largest norm before clipping (∞ for a non-finite row; None with no rows)."""
        if rows.shape[0] == 0:
            self.last = None
            return rows
        norms = torch.linalg.vector_norm(rows.detach(), dim=1, dtype=torch.float64)
        over = torch.isfinite(norms) & (norms > self.c)
        scale = torch.where(over, self.c / norms.clamp_min(self.c), torch.ones_like(norms))
        rows.mul_(scale.to(device=rows.device, dtype=rows.dtype)[:, None])
        self.last = (int(over.sum()), float(torch.nan_to_num(norms, nan=math.inf).max()))  # a NaN norm counts as ∞
        return rows

    def column_names(self) -> tuple[str, ...]:
        return COLUMNS

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        """The last round's clipped rows and largest norm before clipping, in this process (None without rows)."""
        return dict.fromkeys(COLUMNS) if self.last is None else dict(zip(COLUMNS, self.last))
