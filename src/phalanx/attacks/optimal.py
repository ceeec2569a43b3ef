"""``optimal``: tune a base attack's factor against the server's actual aggregator (ByzFL's Optimal_ALIE/IPM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks._common import check_choice, check_int, check_real, coordinate_std, honest_mean, repeat_row
from phalanx.attacks.alie import alie_from_stats, alie_z_max
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register
from phalanx.attacks.scaling import negative_of
from phalanx.errors import ConfigError

__all__ = ["Optimal", "OptimalSearch"]

BASES = ("alie", "ipm", "signflip")
_DEFAULT_FACTOR = {"ipm": 0.1, "signflip": 1.0}


@dataclass(frozen=True)
class OptimalSearch:
    """What :meth:`Optimal.search` evaluated: every candidate factor and its objective, and the winner."""

    factor: float
    """The factor with the largest objective (the smallest such factor on ties)."""
    objective: float
    """``‖Agg(honest ∪ byz(factor)) − ḡ‖`` at that factor (``inf`` when the aggregate was not finite)."""
    factors: Tensor
    """All candidate factors, increasing, float64."""
    objectives: Tensor
    """The objective at each candidate, float64."""


@register
class Optimal(Attack):
    r"""A base attack whose factor is chosen, each round, to do the most damage to the server's aggregator.

    .. math::
        t^\star = \arg\max_{t \in T}\ \big\lVert \mathrm{Agg}\big(x_1, \dots, x_h, \underbrace{y(t), \dots, y(t)}_{b}
        \big) - \bar g \big\rVert_2,

    with :math:`y(t) = \bar g - t\sigma` for ``base="alie"`` and :math:`y(t) = -t\,\bar g` for ``"ipm"`` and
    ``"signflip"`` (the same family; they differ only in the default factor added to the grid), ``Agg =
    ctx.aggregator``. The candidates ``T`` are ``evaluations`` evenly spaced factors in ``[0, max_factor]`` plus the
    base attack's own default factor (ALIE's :math:`z_{\max}`, IPM's 0.1, sign flip's 1), so the result is never
    weaker than the base attack with its default against that aggregator. Ties go to the smallest factor; a
    non-finite aggregate counts as an infinite objective (the attack broke the rule). A grid rather than a local
    search: the objective is often not unimodal (Krum switches abruptly between honest and Byzantine rows).

    The objective is the one of ByzFL's ``Optimal_ALittleIsEnough`` / ``Optimal_InnerProductManipulation`` (an
    expanding/contracting line search from 0 with 20 evaluations); Phalanx evaluates an exhaustive grid instead.
    The aggregator is called once per candidate (at most ``evaluations + 1`` calls, ``evaluations`` ≤ 256).
    Without ``ctx.aggregator`` the call raises :class:`ConfigError` naming ``aggregator``.
    """

    name: ClassVar[str] = "optimal"
    reference: ClassVar[str] = (
        "ByzFL 0.0.11 Optimal_ALittleIsEnough / Optimal_InnerProductManipulation: the attack factor maximising "
        "||Agg(honest + byzantine) - mean(honest)||, here by grid search; base attacks: Baruch et al. NeurIPS 2019 "
        "(ALIE), Xie et al. UAI 2019 (IPM)"
    )
    threat: ClassVar[str] = "omniscient and adaptive: sees the honest vectors and calls the server's aggregator"
    needs_aggregator: ClassVar[bool] = True

    def __init__(self, base: str = "alie", max_factor: float = 10.0, evaluations: int = 32) -> None:
        self.base = check_choice("base", base, BASES)
        self.max_factor = check_real("max_factor", max_factor, low=0.0, low_open=True)
        self.evaluations = check_int("evaluations", evaluations, low=2, high=256)

    def default_factor(self, ctx: AttackContext) -> float:
        """The base attack's own factor in ``ctx`` (ALIE: :func:`~phalanx.attacks.alie.alie_z_max` of (h + b, b))."""
        if self.base == "alie":
            return alie_z_max(ctx.n_workers, ctx.n_byzantine)
        return _DEFAULT_FACTOR[self.base]

    def byzantine_vector(self, honest: Tensor, factor: float) -> Tensor:
        """``y(t)`` for factor ``t``, shape ``(d,)`` (the same arithmetic as the base attack)."""
        return self._vector(self._stats(honest), factor)

    def _stats(self, honest: Tensor) -> tuple[Tensor, Tensor | None]:
        return honest_mean(honest), (coordinate_std(honest) if self.base == "alie" else None)

    def _vector(self, stats: tuple[Tensor, Tensor | None], factor: float) -> Tensor:
        mean, std = stats
        if std is not None:
            return alie_from_stats(mean, std, factor)
        return negative_of(mean, factor)

    def candidates(self, ctx: AttackContext) -> Tensor:
        """The factors evaluated in ``ctx``, increasing, float64, without duplicates."""
        grid = torch.linspace(0.0, self.max_factor, self.evaluations, dtype=torch.float64)
        extra = torch.tensor([self.default_factor(ctx)], dtype=torch.float64)
        return torch.unique(torch.cat([grid, extra]), sorted=True)

    def search(self, ctx: AttackContext) -> OptimalSearch:
        """Evaluate every candidate factor against ``ctx.aggregator`` and return the result."""
        agg = ctx.aggregator
        if agg is None:
            raise ConfigError(
                "aggregator", None, "the server's rule in AttackContext.aggregator (the 'optimal' attack calls it)",
            )
        honest = ctx.honest.detach()
        stats = self._stats(honest)
        mean = stats[0].to(torch.float64)
        factors = self.candidates(ctx)
        objectives = torch.empty_like(factors)
        population = surrogate(honest, ctx.n_workers - ctx.n_byzantine)
        with torch.no_grad():
            for k, t in enumerate(factors.tolist()):
                byz = repeat_row(self._vector(stats, t), ctx.n_byzantine, honest)
                out = agg(torch.cat([population, byz], dim=0))
                dist = torch.linalg.vector_norm(out.detach().to(device=mean.device, dtype=torch.float64) - mean)
                objectives[k] = dist.cpu() if bool(torch.isfinite(dist)) else float("inf")  # factors: CPU
        best = int(torch.argmax(objectives))  # first maximum: the smallest factor on ties
        return OptimalSearch(float(factors[best]), float(objectives[best]), factors, objectives)

    def _run(self, ctx: AttackContext) -> Tensor:
        factor = self.search(ctx).factor
        return repeat_row(self.byzantine_vector(ctx.honest, factor), ctx.n_byzantine, ctx.honest)


def surrogate(honest: Tensor, rows: int) -> Tensor:
    """The honest population the rule is evaluated on: ``honest`` itself when it has ``rows`` rows (the omniscient
    attacker's), else its rows repeated cyclically to ``rows`` (the colluders' own honest computations standing in
    for the ``n − b`` honest workers they cannot see, so that the rule sees as many vectors as the server will)."""
    h = honest.shape[0]
    if h == rows:
        return honest
    return honest[torch.arange(rows, device=honest.device) % h]
