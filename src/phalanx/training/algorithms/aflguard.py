"""AFLGuard: asynchronous SGD whose server accepts an update only when it is close to its own trusted update.

Fang, Liu, Gong & Bentley, "AFLGuard: Byzantine-robust Asynchronous Federated Learning", ACSAC 2022. The method as
Phalanx reads it: the server holds a small, clean *trusted* data set drawn from the learning task's distribution;
when a (possibly stale) client update g arrives, the server computes its own update g₀ on the trusted data at the
current global model θₜ and accepts g iff

    ‖g − g₀‖  ≤  λ ‖g₀‖,

then steps θ ← θ − η g with the accepted update; a rejected update is ignored. The paper proves (for a strongly
convex, smooth loss with bounded staleness, as its analysis assumes) that the error of the learned model is bounded
independently of the number of malicious clients; Phalanx does not restate that theorem (its constants and equation
numbers are not checked here) and tests only the filter's definition and its effect, with mutants
(tests/test_aflguard.py).

What Phalanx implements, per update g of a step at server version t: g₀ = ∇f₀(θₜ), the gradient of the loss on the
server's ``trusted_size`` training samples (drawn once with the run's seed from its ``trusted`` stream — the
server's own small data set, as Zeno++'s validation samples and FLTrust's root data; not the test set), computed
afresh every step at the θ the step's accepted updates are applied to; accept iff ‖g − g₀‖ ≤ λ‖g₀‖ in float64 (a
non-finite g is rejected). An update is one minibatch gradient (the clients' single local step of Phalanx's
asynchronous seam), so g and g₀ are the same kind of vector and λ compares like with like. The accepted rows go to
the run's rule over the buffer (``buffer_size = 1`` and the mean: the paper's update on each arrival); no staleness
weighting (the paper applies the accepted update as it is). Rejected updates become zero rows, counted in the
``screened`` statistics (:mod:`~phalanx.training.algorithms.asynchronous`).

On real processes (``engine = "torchrun"``, :mod:`phalanx.distributed.async_filters`) the same :meth:`AFLGuard.screen`
judges each update as it arrives: g₀ is computed by rank 0 at the θₜ it has published when the update arrives, on
the same trusted samples (the run's seed and ``trusted`` stream); a rejected update is dropped (reason
``filtered``), not a zero row. No state, so a resumed server recomputes the same g₀. The keyed audit cannot
recompute the decisions (the transcript holds neither θₜ nor the dropped updates, except a zero step's, whose
decisions it recomputes: :mod:`phalanx.distributed.async_zero`): it counts every step under
``filters_unchecked``; the rows (the updates as signed: no reshaping) and results it recomputes.

λ's default, 1.5, is Phalanx's choice (the paper studies λ's effect); λ → ∞ accepts everything (FedBuff's server
without the staleness scaling), a small λ rejects honest updates whose noise exceeds λ‖g₀‖.

Config: ``algorithm = "aflguard"``, ``algorithm_params = {lam = λ, trusted_size = m, buffer_size = K,
max_staleness = S, speeds = "...", byzantine_timing = "..."}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.algorithms.base import Run, register
from phalanx.training.algorithms.fedbuff import FedBuff
from phalanx.training.algorithms.zenopp import server_samples
from phalanx.validate import check_int, check_real


def accepted(updates: Tensor, reference: Tensor, lam: float) -> Tensor:
    """AFLGuard's test per row: ‖gᵢ − g₀‖ ≤ λ‖g₀‖ and gᵢ finite, in float64 (``(m,)`` bool on the CPU)."""
    u, r = updates.double(), reference.double()
    finite = torch.isfinite(u).all(dim=1)
    distance = torch.linalg.vector_norm(torch.where(finite[:, None], u, 0.0) - r, dim=1)
    return (finite & (distance <= lam * torch.linalg.vector_norm(r))).cpu()


@register
@dataclass(frozen=True)
class AFLGuard(FedBuff):
    """AFLGuard (see the module's docstring): FedBuff's buffer of ``buffer_size`` updates (1: each accepted update
    applied on arrival), each accepted iff within ``lam`` times the norm of the server's update on its
    ``trusted_size`` trusted samples at the current θ; no staleness weighting."""

    buffer_size: int = 1
    lam: float = 1.5
    trusted_size: int = 32
    name = "aflguard"
    screens = True
    screens_on_processes = True
    reference = "Fang, Liu, Gong & Bentley, AFLGuard: Byzantine-robust Asynchronous Federated Learning, ACSAC 2022"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_real("algorithm_params.lam", self.lam, low=0.0, low_open=True)
        check_int("algorithm_params.trusted_size", self.trusted_size, low=1)

    def check(self, run: Run) -> None:
        super().check(run)
        total = int(run.dataset.train_y.numel())
        if self.trusted_size > total:
            raise ConfigError("algorithm_params.trusted_size", self.trusted_size, f"<= the {total} training samples "
                              "the server's trusted set is drawn from")

    def assemble(self, run: Run, ids: Tensor, updates: Tensor, staleness: Tensor) -> tuple[Tensor, list[int], Tensor]:
        """Row i is gᵢ (zero for a rejected update): AFLGuard weights no update by its staleness."""
        return updates, ids.tolist(), ids >= run.workers - run.byzantine

    def trusted(self, run: Run) -> tuple[Tensor, Tensor]:
        """The server's trusted samples: ``trusted_size`` training samples drawn with the run's seed (its ``trusted``
        stream: no round stream is touched)."""
        return server_samples(run, self.trusted_size, "trusted")

    def server_update(self, run: Run, theta: Tensor) -> Tensor:
        """g₀ = ∇f₀(θ) on the trusted samples."""
        xb, yb = self.trusted(run)
        return run.problem.grads(theta.detach(), xb, yb)[0]

    def screen(self, run: Run, own: dict[str, Tensor], theta: Tensor, t: int, ids: Tensor, updates: Tensor,
               versions: Tensor, ring: Tensor, workers: int | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Every update of the step tested against the server's update at θₜ (no state: g₀ is recomputed from θₜ,
        so a resumed run recomputes the same g₀)."""
        return updates, accepted(updates, self.server_update(run, theta), self.lam), {}
