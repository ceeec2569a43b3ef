r"""A black-box maximiser for the worst-input searches: CMA-ES with restarts.

The searches of :mod:`phalanx.analysis.epsilon` (and :mod:`phalanx.analysis.kappa`) maximise a ratio over the
inputs of a rule that is neither differentiable nor smooth: Krum's selection, a trimmed mean's order statistics, a
clustering's assignment make it piecewise, and its maximum sits where several pieces meet (several Krum scores tie).
A (1 + λ) evolution strategy with isotropic steps stalls there: moving along such a ridge needs correlated moves of
several rows. The covariance matrix adaptation evolution strategy learns those correlations from the steps that
paid.

This is the (μ/μ_w, λ)-CMA-ES of Hansen's tutorial (N. Hansen, "The CMA Evolution Strategy: A Tutorial",
arXiv:1604.00772, 2016, Algorithm in Appendix A: weighted recombination, cumulative step-size adaptation, rank-one
and rank-μ covariance updates, the default parameters of its Table 1), on a flattened ``shape`` of float64 numbers,
maximising instead of minimising. It stops when its budget is spent, when the step size has collapsed
(σ·max √λᵢ(C) < 1e-12 relative to the mean's size), when the covariance is ill-conditioned (condition > 1e14) or
after ``patience`` generations without a better candidate;
:func:`maximise` then returns the best point it evaluated. Restarts with a doubled population (IPOP-CMA-ES: Auger &
Hansen, "A Restart CMA Evolution Strategy With Increasing Population Size", CEC 2005) are the caller's: each start
is a call.

Every candidate is scored by the caller's ``score`` on a batch (``(λ, *shape)`` → ``(λ,)`` float64; ``-inf`` for a
candidate that cannot be scored), so the number of rule evaluations is exactly the number of candidates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from phalanx.errors import ConfigError

__all__ = ["Result", "default_popsize", "maximise"]


@dataclass
class Result:
    """What one CMA-ES run found."""

    value: float
    """The best score evaluated (``-inf`` if no candidate could be scored)."""
    x: Tensor
    """The candidate that scored it (the start when none scored better)."""
    evaluations: int
    """Candidates scored."""


def default_popsize(dim: int) -> int:
    """λ = 4 + ⌊3 ln N⌋ (Hansen's Table 1) for N numbers."""
    return 4 + int(3 * math.log(max(1, dim)))


def maximise(score: Callable[[Tensor], Tensor], x0: Tensor, sigma: float, budget: int, gen: torch.Generator,
             popsize: int | None = None, start_score: float | None = None, patience: int | None = None) -> Result:
    """Maximise ``score`` from ``x0`` (float64, any shape) with initial step ``sigma`` for at most ``budget``
    candidates (module docstring). ``start_score``: the score of ``x0`` when the caller knows it (it is then the
    value to beat; otherwise ``x0`` is not scored). ``patience``: stop after that many generations without a better
    candidate (None: never for that reason)."""
    if not (isinstance(sigma, float) and math.isfinite(sigma) and sigma > 0):
        raise ConfigError("sigma", sigma, "a finite float > 0")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ConfigError("budget", budget, "an integer >= 0")
    shape = x0.shape
    n = x0.numel()
    lam = default_popsize(n) if popsize is None else max(2, int(popsize))
    mu = lam // 2
    w = math.log(mu + 0.5) - torch.log(torch.arange(1, mu + 1, dtype=torch.float64))
    w = w / w.sum()
    mueff = 1.0 / float(w.square().sum())
    cc = (4 + mueff / n) / (n + 4 + 2 * mueff / n)
    cs = (mueff + 2) / (n + mueff + 5)
    c1 = 2 / ((n + 1.3) ** 2 + mueff)
    cmu = min(1 - c1, 2 * (mueff - 2 + 1 / mueff) / ((n + 2) ** 2 + mueff))
    damps = 1 + 2 * max(0.0, math.sqrt((mueff - 1) / (n + 1)) - 1) + cs
    chi_n = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n * n))
    mean = x0.double().flatten().clone()
    pc = torch.zeros(n, dtype=torch.float64)
    ps = torch.zeros(n, dtype=torch.float64)
    basis = torch.eye(n, dtype=torch.float64)
    diag = torch.ones(n, dtype=torch.float64)
    cov = torch.eye(n, dtype=torch.float64)
    best = Result(-math.inf if start_score is None else start_score, x0.double().clone(), 0)
    generation = last_gain = 0
    while best.evaluations + lam <= budget:
        z = torch.randn(lam, n, generator=gen, dtype=torch.float64)
        y = (z * diag) @ basis.T
        cand = mean + sigma * y
        scores = score(cand.reshape(lam, *shape)).double()
        best.evaluations += lam
        scores = torch.where(torch.isnan(scores), torch.full_like(scores, -math.inf), scores)
        order = torch.argsort(scores, descending=True, stable=True)
        top = int(order[0])
        if float(scores[top]) > best.value:
            if float(scores[top]) > best.value + 1e-9 * abs(best.value):
                last_gain = generation
            best.value, best.x = float(scores[top]), cand[top].reshape(shape).clone()
        ysel = y[order[:mu]]
        yw = (w[:, None] * ysel).sum(dim=0)
        mean = mean + sigma * yw
        inv_sqrt = basis @ torch.diag(1.0 / diag) @ basis.T
        ps = (1 - cs) * ps + math.sqrt(cs * (2 - cs) * mueff) * (inv_sqrt @ yw)
        generation += 1
        hsig = float(ps.norm()) / math.sqrt(1 - (1 - cs) ** (2 * generation)) / chi_n < 1.4 + 2 / (n + 1)
        pc = (1 - cc) * pc + (math.sqrt(cc * (2 - cc) * mueff) * yw if hsig else 0.0)
        rank_mu = ysel.T @ (w[:, None] * ysel)
        cov = ((1 - c1 - cmu) * cov + c1 * (torch.outer(pc, pc) + (0.0 if hsig else cc * (2 - cc)) * cov)
               + cmu * rank_mu)
        sigma *= math.exp((cs / damps) * (float(ps.norm()) / chi_n - 1))
        cov = (cov + cov.T) / 2
        values, basis = torch.linalg.eigh(cov)
        diag = values.clamp_min(1e-300).sqrt()
        size = max(1.0, float(mean.abs().max()))
        if not math.isfinite(sigma) or sigma * float(diag.max()) < 1e-12 * size:
            break
        if float(diag.max()) ** 2 > 1e14 * float(diag.min()) ** 2:
            break
        if patience is not None and generation - last_gain >= patience:
            break
    return best
