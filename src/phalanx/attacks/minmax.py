"""Min-Max and Min-Sum (Shejwalkar & Houmansadr, NDSS 2021): the largest step away from the honest mean that
still looks as close to the honest vectors as they are to each other."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks._common import (
    check_choice,
    check_real,
    coordinate_std,
    honest_mean,
    repeat_row,
    work_dtype,
)
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["MinMax", "MinSum", "halving_search", "perturbation"]

_REFERENCE = (
    "V. Shejwalkar, A. Houmansadr, 'Manipulating the Byzantine: Optimizing Model Poisoning Attacks and Defenses "
    "for Federated Learning', NDSS 2021"
)
PERTURBATIONS = ("unit", "std", "sign")
_MAX_DOUBLINGS = 64
_MAX_HALVINGS = 200


def perturbation(honest: Tensor, kind: str) -> Tensor:
    r"""The perturbation direction :math:`\nabla^p` (shape ``(d,)``) of Shejwalkar & Houmansadr (NDSS 2021).

    ``"unit"``: inverse unit vector :math:`-\bar g/\lVert\bar g\rVert` (0 when :math:`\bar g = 0`);
    ``"std"``: inverse coordinate-wise standard deviation :math:`-\sigma` (sample divisor, 0 for one row);
    ``"sign"``: inverse sign :math:`-\mathrm{sign}(\bar g)`.
    """
    check_choice("perturbation", kind, PERTURBATIONS)
    mean = honest_mean(honest)
    if kind == "unit":
        norm = torch.linalg.vector_norm(mean.to(torch.float64))
        if not bool(norm > 0):
            return torch.zeros_like(mean)
        return -(mean.to(torch.float64) / norm).to(mean.dtype)
    if kind == "std":
        return -coordinate_std(honest)
    return -torch.sign(mean)


def halving_search(feasible: Callable[[float], bool], gamma_init: float, tol: float) -> float:
    r"""The largest ``γ ≥ 0`` with ``feasible(γ)``, for a feasible set that is an interval ``[0, γ*]``.

    Shejwalkar & Houmansadr, NDSS 2021, Algorithm 1: start at ``γ = γ_init`` with step ``γ_init``; on success
    record :math:`\gamma_{succ} = \gamma` and move up by half the step, on failure move down by half the step;
    halve the step; stop when :math:`|\gamma_{succ} - \gamma| \le \tau`. That search never goes beyond
    ``2 γ_init``, so Phalanx first doubles ``γ_init`` while it is feasible (a bracketing phase; when ``γ_init`` is
    infeasible the search is exactly the paper's). The result is feasible and within about ``τ`` of ``γ*``.
    """
    gamma = gamma_init
    doublings = 0
    while doublings < _MAX_DOUBLINGS and feasible(gamma):
        gamma *= 2.0
        doublings += 1
    succ, step = 0.0, gamma
    for _ in range(_MAX_HALVINGS):
        if abs(succ - gamma) <= tol:
            break
        if feasible(gamma):
            succ = gamma
            gamma += step / 2.0
        else:
            gamma -= step / 2.0
        step /= 2.0
    return succ


class _ShejwalkarAttack(Attack):
    """Shared parameters, the quadratic forms and the search of Min-Max and Min-Sum."""

    reference: ClassVar[str] = _REFERENCE

    def __init__(self, perturbation: str = "unit", gamma_init: float = 10.0, tol: float = 1e-5) -> None:
        self.perturbation = check_choice("perturbation", perturbation, PERTURBATIONS)
        self.gamma_init = check_real("gamma_init", gamma_init, low=0.0, low_open=True)
        self.tol = check_real("tol", tol, low=0.0, low_open=True)

    def _feasible(self, a: Tensor, c: Tensor, q: float, sqdist: Tensor) -> Callable[[float], bool]:
        raise NotImplementedError

    def search(self, ctx: AttackContext) -> tuple[float, Tensor]:
        """Return ``(γ, malicious vector ḡ + γ·∇p)`` for this round (the vector in the compute dtype)."""
        x = ctx.honest.detach().to(work_dtype(ctx.honest))
        mean = x.mean(dim=0)
        p = perturbation(ctx.honest, self.perturbation)
        xc = x - mean
        # ‖ḡ + γp − x_i‖² = a_i + 2γ c_i + γ² q with a_i = ‖x_i − ḡ‖², c_i = −⟨p, x_i − ḡ⟩, q = ‖p‖²:
        # every candidate γ is checked in O(h), without forming a (h, d) difference.
        a = (xc * xc).sum(dim=1, dtype=torch.float64)
        c = -(xc * p).sum(dim=1, dtype=torch.float64)
        q = float((p * p).sum(dtype=torch.float64))
        if q == 0.0:
            return 0.0, mean
        gram = (xc @ xc.T).to(torch.float64)
        sqdist = (a[:, None] + a[None, :] - 2.0 * gram).clamp_min(0.0)
        sqdist.fill_diagonal_(0.0)
        gamma = halving_search(self._feasible(a, c, q, sqdist), self.gamma_init, self.tol)
        return gamma, mean + p * gamma

    def gamma_for(self, ctx: AttackContext) -> float:
        """The step ``γ`` the search finds in ``ctx``."""
        return self.search(ctx)[0]

    def _run(self, ctx: AttackContext) -> Tensor:
        return repeat_row(self.search(ctx)[1], ctx.n_byzantine, ctx.honest)


@register
class MinMax(_ShejwalkarAttack):
    r"""Min-Max: the farthest point along :math:`\nabla^p` whose largest distance to an honest vector is at most the
    largest distance between two honest vectors.

    .. math::
        y = \bar g + \gamma^\star \nabla^p, \qquad
        \gamma^\star = \arg\max_{\gamma \ge 0}\ \Big\{ \max_i \lVert \bar g + \gamma\nabla^p - x_i\rVert^2
        \le \max_{i,j} \lVert x_i - x_j\rVert^2 \Big\}

    (Shejwalkar & Houmansadr, NDSS 2021, Eq. 4 and Algorithm 1), ``∇p`` from :func:`perturbation`
    (default ``"unit"``, the inverse unit vector), γ found by :func:`halving_search` from ``gamma_init = 10``
    (the authors' code) to tolerance ``tol = 1e-5``. All Byzantine workers send the same vector. AGR-agnostic: it
    needs the honest vectors, not the server's rule.
    """

    name: ClassVar[str] = "minmax"
    reference: ClassVar[str] = _REFERENCE + ", Eq. 4 (Min-Max) and Algorithm 1"

    def _feasible(self, a: Tensor, c: Tensor, q: float, sqdist: Tensor) -> Callable[[float], bool]:
        threshold = float(sqdist.max())

        def ok(gamma: float) -> bool:
            return float((a + 2.0 * gamma * c + gamma * gamma * q).max()) <= threshold

        return ok


@register
class MinSum(_ShejwalkarAttack):
    r"""Min-Sum: the farthest point along :math:`\nabla^p` whose sum of squared distances to the honest vectors is
    at most that of every honest vector to the others.

    .. math::
        y = \bar g + \gamma^\star \nabla^p, \qquad
        \gamma^\star = \arg\max_{\gamma \ge 0}\ \Big\{ \sum_i \lVert \bar g + \gamma\nabla^p - x_i\rVert^2
        \le \min_i \sum_j \lVert x_i - x_j\rVert^2 \Big\}

    (Shejwalkar & Houmansadr, NDSS 2021, Eq. 5 and Algorithm 1). The bound is the smallest honest
    sum — "upper bounded by the sum of squared distances of *any* benign gradient from the other benign gradients",
    as the authors' code computes it (``min(scores)``). Since :math:`\sum_i (x_i - \bar g) = 0` the left side is
    :math:`\sum_i \lVert x_i - \bar g\rVert^2 + h\gamma^2\lVert\nabla^p\rVert^2`, so
    :math:`\gamma^\star = \min_i \lVert x_i - \bar g\rVert / \lVert\nabla^p\rVert`; the search finds it to ``tol``.
    """

    name: ClassVar[str] = "minsum"
    reference: ClassVar[str] = _REFERENCE + ", Eq. 5 (Min-Sum) and Algorithm 1"

    def _feasible(self, a: Tensor, c: Tensor, q: float, sqdist: Tensor) -> Callable[[float], bool]:
        # Σ_j ‖x_i − x_j‖² = h·a_i + Σ_j a_j exactly (the rows' deviations from ḡ add up to 0).
        h = a.shape[0]
        sum_a, sum_c = float(a.sum()), float(c.sum())
        threshold = h * float(a.min()) + sum_a

        def ok(gamma: float) -> bool:
            return sum_a + 2.0 * gamma * sum_c + h * gamma * gamma * q <= threshold

        return ok
