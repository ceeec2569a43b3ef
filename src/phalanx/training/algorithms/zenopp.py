"""Zeno++: fully asynchronous SGD with a validation-score test on each update, on the simulated clock.

Xie, Koyejo & Gupta, "Zeno++: Robust Fully Asynchronous SGD", ICML 2020. The paper's statement (its abstract): the
key idea "is to estimate the descent of the loss value after the candidate gradient is applied, where large descent
values indicate that the update results in optimization progress"; it proves convergence for non-convex problems
with "arbitrarily stale worker updates, and [...] an unbounded number of Byzantine workers", assuming a smooth loss,
bounded variance of the gradients, and a server validation set drawn from the same distribution as the workers'
data (the assumptions as Phalanx reads them; the equation numbers in the paper are not checked here). Its test,
for a candidate g at the server's θ with learning rate γ, is the first-order estimate of the
descent on the server's validation loss f_r,

    Score_{γ,ρ}(g, θ) = γ ⟨∇f_r(θ), g⟩ − ρ ‖g‖²  ≥  −γ ε,

after normalising g to the validation gradient's magnitude (g ← ‖v‖/‖g‖ · g, v = ∇f_r); the validation gradient is
updated *lazily* (recomputed only every few steps, so v may be stale), and an accepted g is applied: θ ← θ − γ g.

What Phalanx implements, per update g of a step at server version t: v = ∇f_r(θ_{t₀}) on the server's validation
samples (``validation_size`` training samples drawn once with the run's seed — the server's own small data set, as
FLTrust's root data; not the test set), recomputed at t₀ = the latest multiple of ``refresh`` (``refresh = 1``: every
step); g̃ = ‖v‖/‖g‖ · g (0 for g = 0); accept iff

    ⟨v, g̃⟩ − ρ ‖g̃‖²  ≥  −ε,

the paper's test divided by γ (our ρ is the paper's ρ/γ, our ε its ε: so the test does not depend on the run's
learning rate schedule). With ‖g̃‖ = ‖v‖ it reads cos(v, g) ≥ ρ − ε/‖v‖²: ρ > 0 demands a *sufficient* descent
direction, ε > 0 lets a slightly ascending one through. The accepted g̃ rows go to the run's rule over the buffer
(``buffer_size = 1`` and the mean: the paper's update on each arrival). A non-finite update is rejected.

Kept: the score with ρ and ε, the normalisation, the lazy validation gradient. Dropped: a fresh validation minibatch
at each refresh (the same samples every time, so that a step is a function of the seed and the checkpoint), and the
unbounded staleness — the clock's ``max_staleness`` bound still drops older updates (set it large to approach the
paper's setting).

Config: ``algorithm = "zenopp"``, ``algorithm_params = {rho = ρ, epsilon = ε, refresh = k, validation_size = m,
buffer_size = K, max_staleness = S, speeds = "...", byzantine_timing = "..."}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.algorithms.base import Run, register
from phalanx.training.algorithms.fedbuff import FedBuff
from phalanx.training.streams import generator
from phalanx.validate import check_int, check_real

V, AT = "zeno_v", "zeno_at"


def server_samples(run: Run, size: int, stream: str) -> tuple[Tensor, Tensor]:
    """``size`` training samples the server holds as its own small data set, drawn once with the run's seed from the
    named ``stream`` (no round stream is touched): Zeno++'s validation samples, AFLGuard's trusted ones; one batch,
    shaped ``(1, size, …)``."""
    idx = torch.randperm(int(run.data.y.numel()), generator=generator(run.seed, stream))
    idx = idx[:size].to(run.data.y.device)
    return run.data.x[idx][None], run.data.y[idx][None]


def normalised(updates: Tensor, v: Tensor) -> Tensor:
    """g̃ = ‖v‖/‖g‖ · g per row (0 for a zero row; NaN rows stay non-finite)."""
    norms = torch.linalg.vector_norm(updates, dim=1, keepdim=True)
    scale = torch.where(norms > 0, torch.linalg.vector_norm(v) / norms, torch.zeros_like(norms))
    return updates * scale


def scores(updates: Tensor, v: Tensor, rho: float) -> Tensor:
    """⟨v, g̃⟩ − ρ ‖g̃‖² per (already normalised) row, float64."""
    u, w = updates.double(), v.double()
    return u @ w - rho * (u * u).sum(dim=1)


@register
@dataclass(frozen=True)
class ZenoPP(FedBuff):
    """Zeno++ (see the module's docstring): FedBuff's buffer of ``buffer_size`` updates (1: each update applied on
    arrival), each normalised and tested by its validation score (``rho``, ``epsilon``), v refreshed every
    ``refresh`` steps on ``validation_size`` server samples; no staleness weighting."""

    buffer_size: int = 1
    rho: float = 0.001
    epsilon: float = 0.0
    refresh: int = 1
    validation_size: int = 32
    name = "zenopp"
    screens = True
    screens_on_processes = True
    reshapes = True
    """Its filter passes on another row than the update (g̃, normalised by v): a keyed audit cannot recompute the
    rows from the signed updates (:func:`phalanx.distributed.async_filters.rows_unchecked`)."""
    reference = "Xie, Koyejo & Gupta, Zeno++: Robust Fully Asynchronous SGD, ICML 2020 (validation score, rho, eps)"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_real("algorithm_params.rho", self.rho, low=0.0)
        check_real("algorithm_params.epsilon", self.epsilon, low=0.0)
        check_int("algorithm_params.refresh", self.refresh, low=1)
        check_int("algorithm_params.validation_size", self.validation_size, low=1)

    def check(self, run: Run) -> None:
        super().check(run)
        total = int(run.dataset.train_y.numel())
        if self.validation_size > total:
            raise ConfigError("algorithm_params.validation_size", self.validation_size, f"<= the {total} training "
                              "samples the server's validation set is drawn from")

    def assemble(self, run: Run, ids: Tensor, updates: Tensor, staleness: Tensor) -> tuple[Tensor, list[int], Tensor]:
        """Row i is g̃ᵢ (zero for a rejected update): Zeno++ weights no update by its staleness."""
        return updates, ids.tolist(), ids >= run.workers - run.byzantine

    def validation(self, run: Run) -> tuple[Tensor, Tensor]:
        """The server's validation samples: ``validation_size`` training samples drawn with the run's seed (its
        ``validation`` stream: no round stream is touched)."""
        return server_samples(run, self.validation_size, "validation")

    def gradient(self, run: Run, theta: Tensor) -> Tensor:
        """v = ∇f_r(θ) on the validation samples."""
        xb, yb = self.validation(run)
        return run.problem.grads(theta.detach(), xb, yb)[0]

    def screen_state(self, run: Run, theta: Tensor) -> dict[str, Tensor]:
        return {V: self.gradient(run, theta), AT: torch.zeros((), dtype=torch.int64)}

    def check_screen_state(self, run: Run, own: dict[str, Tensor]) -> None:
        v, at = own.get(V), own.get(AT)
        if (v is None or tuple(v.shape) != (run.problem.dim,) or not bool(torch.isfinite(v).all()) or at is None
                or at.numel() != 1):
            raise ConfigError("start", "a Zeno++ state without its finite validation gradient",
                              f"a finite validation gradient of shape ({run.problem.dim},) and its version")

    def screen(self, run: Run, own: dict[str, Tensor], theta: Tensor, t: int, ids: Tensor, updates: Tensor,
               versions: Tensor, ring: Tensor, workers: int | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The lazy validation gradient, then every update's normalised score against it."""
        v, at = own[V], own[AT]
        if t % self.refresh == 0 and int(at) != t:
            v, at = self.gradient(run, theta), torch.tensor(t, dtype=torch.int64)
        g = normalised(updates, v)
        finite = torch.isfinite(g).all(dim=1)
        ok = finite & (scores(torch.where(finite[:, None], g, 0.0), v, self.rho) >= -self.epsilon)
        return g, ok.cpu(), {V: v, AT: at}
