"""A little is enough (ALIE): hide inside the honest coordinate-wise spread (Baruch, Baruch & Goldberg, 2019)."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks._common import check_real, coordinate_std, honest_mean, repeat_row
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["ALIE", "alie_from_stats", "alie_vector", "alie_z_max"]

_REFERENCE = (
    "M. Baruch, G. Baruch, Y. Goldberg, 'A Little Is Enough: Circumventing Defenses For Distributed Learning', "
    "NeurIPS 2019"
)


def alie_z_max(n: int, m: int) -> float:
    r"""The paper's default shift :math:`z_{\max}` for ``n`` workers of which ``m`` are Byzantine.

    .. math::
        s = \lfloor n/2 + 1 \rfloor - m, \qquad z_{\max} = \Phi^{-1}\!\left(\frac{n - s}{n}\right),

    where ``s`` is the number of honest workers the attackers need on their side for a majority and
    :math:`\Phi^{-1}` the standard normal quantile (``torch.special.ndtri``). Baruch et al., NeurIPS 2019,
    Section 4, the convergence-prevention attack: first ``s``, then the largest ``z`` with
    :math:`\Phi(z) < (n - s)/n` (read from a z-table in the paper; the quantile here).

    When the Byzantine workers are a majority (``s <= 0``) no honest supporter is needed and the formula has no
    finite value; ``s`` is then taken as 1 (the largest finite shift the formula gives). Some implementations
    (e.g. Blades) use :math:`\Phi^{-1}((n - m - s)/(n - m))` instead, which gives a smaller ``z``.
    """
    if n < 1 or m < 0 or m > n:
        raise ValueError(f"need n >= 1 and 0 <= m <= n, got n={n}, m={m}")
    s = max(1, math.floor(n / 2 + 1) - m)
    p = torch.tensor((n - s) / n, dtype=torch.float64)
    return float(torch.special.ndtri(p))


def alie_from_stats(mean: Tensor, std: Tensor, z: float) -> Tensor:
    """``mean − z·std`` (the one formula, shared with ``optimal`` so both give bit-identical vectors)."""
    return mean - std * z


def alie_vector(honest: Tensor, z: float) -> Tensor:
    """``ḡ − z·σ``, shape ``(d,)``, from the honest rows."""
    return alie_from_stats(honest_mean(honest), coordinate_std(honest), z)


@register
class ALIE(Attack):
    r"""A little is enough: shift the honest mean by ``z`` coordinate-wise standard deviations.

    .. math::
        y_i = \bar g - z\,\sigma, \qquad \bar g_k = \frac1h\sum_j x_{jk}, \qquad
        \sigma_k = \sqrt{\tfrac{1}{h-1}\textstyle\sum_j (x_{jk} - \bar g_k)^2}

    (σ = 0 for ``h = 1``). By default ``z`` is the paper's :math:`z_{\max}` (:func:`alie_z_max`) for
    ``n = h + b`` workers of which ``m = b`` attack; a given ``z`` (any finite number) overrides it. Every Byzantine
    worker sends the same vector. Baruch, Baruch & Goldberg, NeurIPS 2019, Section 4 (convergence-prevention attack).

    The sign is immaterial for coordinate-wise defences; Phalanx subtracts (as Blades does), ByzFL's
    ``ALittleIsEnough`` adds ``τσ`` with τ = 1.5. σ uses the sample divisor ``h − 1`` (as ByzFL and ``torch.std``).
    """

    name: ClassVar[str] = "alie"
    reference: ClassVar[str] = _REFERENCE + ", Section 4 (convergence-prevention attack: s, z_max, mu - z sigma)"

    def __init__(self, z: float | None = None) -> None:
        self.z = None if z is None else check_real("z", z)

    def z_for(self, ctx: AttackContext) -> float:
        """The ``z`` this attack uses in ``ctx``: the given one, or :func:`alie_z_max` of ``(h + b, b)``."""
        if self.z is not None:
            return self.z
        return alie_z_max(ctx.n_workers, ctx.n_byzantine)

    def _run(self, ctx: AttackContext) -> Tensor:
        return repeat_row(alie_vector(ctx.honest, self.z_for(ctx)), ctx.n_byzantine, ctx.honest)
