"""Fang et al.'s full-knowledge attack on trimmed mean and median (USENIX Security 2020)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks._common import check_real, uniform, work_dtype
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["Fang", "fang_ranges"]


def fang_ranges(honest: Tensor, b: float) -> tuple[Tensor, Tensor, Tensor]:
    r"""Per coordinate, the interval the Byzantine values are drawn from: ``(low, high, direction)``.

    With :math:`s_j = \mathrm{sign}(\bar g_j)`, :math:`w_{\max,j} = \max_i x_{ij}`, :math:`w_{\min,j} = \min_i x_{ij}`:

    * :math:`s_j < 0`: :math:`[w_{\max,j},\ b\,w_{\max,j}]` if :math:`w_{\max,j} > 0`, else
      :math:`[w_{\max,j},\ w_{\max,j}/b]` — at or above every honest value;
    * :math:`s_j > 0`: :math:`[w_{\min,j}/b,\ w_{\min,j}]` if :math:`w_{\min,j} > 0`, else
      :math:`[b\,w_{\min,j},\ w_{\min,j}]` — at or below every honest value;
    * :math:`s_j = 0`: the single point :math:`\bar g_j` (no direction to reverse).
    """
    x = honest.detach().to(work_dtype(honest))
    mean = x.mean(dim=0)
    wmax = x.max(dim=0).values
    wmin = x.min(dim=0).values
    up_high = torch.where(wmax > 0, wmax * b, wmax / b)
    down_low = torch.where(wmin > 0, wmin / b, wmin * b)
    direction = torch.sign(mean)
    low = torch.where(direction < 0, wmax, torch.where(direction > 0, down_low, mean))
    high = torch.where(direction < 0, up_high, torch.where(direction > 0, wmin, mean))
    return low, high, direction


@register
class Fang(Attack):
    r"""Fang et al.'s full-knowledge attack on coordinate-wise trimmed mean and median.

    Per coordinate the attackers push the aggregate against the direction the honest vectors would move it: where
    the honest mean is negative they send values above the honest maximum, where it is positive values below the
    honest minimum, each drawn uniformly (independently per worker and coordinate, from ``ctx.generator``) from
    the interval of :func:`fang_ranges` with the paper's ``b = 2``:

    .. math::
        y_{ij} \sim \mathcal U[w_{\max,j},\ b\,w_{\max,j}] \text{ (or } [w_{\max,j},\ w_{\max,j}/b]
        \text{ if } w_{\max,j} \le 0) \quad \text{when } s_j = -1, \\
        y_{ij} \sim \mathcal U[w_{\min,j}/b,\ w_{\min,j}] \text{ (or } [b\,w_{\min,j},\ w_{\min,j}]
        \text{ if } w_{\min,j} \le 0) \quad \text{when } s_j = +1.

    Fang, Cao, Jia & Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning", USENIX Security
    2020, Section 4 (attacking trimmed mean, full knowledge; the same attack is used against median). The paper
    states it on local *models* with :math:`s_j` the direction in which parameter ``j`` would change; Phalanx applies
    it to the vectors the workers send, with :math:`s_j = \mathrm{sign}(\bar g_j)` — the rule Shejwalkar &
    Houmansadr's and Blades' implementations use on updates. ``b`` here is the paper's range factor (> 1), not the
    number of Byzantine workers.
    """

    name: ClassVar[str] = "fang"
    reference: ClassVar[str] = (
        "M. Fang, X. Cao, J. Jia, N. Gong, 'Local Model Poisoning Attacks to Byzantine-Robust Federated Learning', "
        "USENIX Security 2020, Section 4 (full-knowledge attack on trimmed mean / median)"
    )
    stochastic: ClassVar[bool] = True

    def __init__(self, b: float = 2.0) -> None:
        self.b = check_real("b", b, low=1.0, low_open=True)

    def _run(self, ctx: AttackContext) -> Tensor:
        low, high, _ = fang_ranges(ctx.honest, self.b)
        u = uniform((ctx.n_byzantine, ctx.dim), ctx.generator, ctx.honest)
        return low + u * (high - low)
