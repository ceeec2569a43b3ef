"""Centered clipping."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import row_distances
from phalanx.aggregators._rowops import row_norms, weighted_sum
from phalanx.aggregators.base import Aggregator, RuleTags, as_compute_dtype, check_positive
from phalanx.aggregators.coordinatewise import coordinate_window_mean
from phalanx.aggregators.registry import register
from phalanx.errors import ConfigError

_CENTERS = ("median", "zero")


@register
class CenteredClipping(Aggregator):
    r"""Centered clipping, ``cc``: clip every input around a centre v and average, L times.

    .. math:: v_{l+1} = v_l + \frac1n \sum_i (x_i - v_l)\,\min\!\Big(1, \frac{\tau}{\|x_i - v_l\|}\Big),
              \quad l = 0, \dots, L-1

    Reference: Karimireddy, He & Jaggi, "Learning from history for Byzantine robust optimization", ICML 2021,
    Eq. (3) (centered clipping). In the paper the centre :math:`v_0` is the previous round's aggregate (the server's
    momentum); here the rule is *stateless*: the caller passes that centre per call (``rule(x, center=v)``, as the
    training loop does), and without one the start is ``center="median"`` (the coordinate-wise median, robust) or
    ``"zero"`` (ByzFL's first call). ByzFL keeps the centre inside the object between calls, so the same object
    gives different answers to the same input — a known fault we avoid.

    Parameters: ``tau`` (clipping radius τ > 0, default 10), ``iterations`` (L ≥ 1, default 1 as in the paper's
    experiments), ``center`` (default start when no centre is passed). Bad rows (non-finite norm) are clipped to
    nothing: their clipping factor τ/∞ is 0. Requirement n > 2f (f does not enter the formula).

    Contributions: the output is :math:`a_0 v_0 + \sum_i a_i x_i` with :math:`a_0 + \sum_i a_i = 1`; the method
    returns the :math:`a_i` (their sum is below 1 by the centre's share :math:`a_0`).
    """

    subnormals_as_zero = True  # subnormal arithmetic made it tens of times slower on a CPU: flush to zero (_subnormals)
    name: ClassVar[str] = "cc"
    floor = "passes"
    reference: ClassVar[str] = (
        "Karimireddy, He & Jaggi, Learning from history for Byzantine robust optimization, ICML 2021 (Eq. 3)"
    )
    requirement = "n > 2f"
    context_keys = frozenset({"center"})
    # τ is an absolute radius (no scale equivariance); checked at τ = 1, where unit-scale rows are clipped (at the
    # default τ = 10 they are not, and the checks would see a plain mean).
    tags = RuleTags(translation=False, scale=False, check_params={"tau": 1.0})

    def __init__(self, f: int = 0, tau: float = 10.0, iterations: int = 1, center: str = "median") -> None:
        super().__init__(f)
        self.tau = float(check_positive("tau", tau))
        self.iterations = check_positive("iterations", iterations, integer=True)
        if center not in _CENTERS:
            raise ConfigError("center", center, "'median' or 'zero' (or pass a tensor per call: rule(x, center=v))")
        self.center = center

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _start(self, xc: Tensor, center: Tensor | None) -> Tensor:
        d = xc.shape[1]
        if center is None:
            if self.center == "zero":
                return torch.zeros(d, dtype=xc.dtype, device=xc.device)
            return coordinate_window_mean(xc, "median", 0, False)[0]
        if not isinstance(center, Tensor) or center.shape != (d,):
            shape = tuple(center.shape) if isinstance(center, Tensor) else type(center).__name__
            raise ConfigError("center", shape, f"a tensor of shape ({d},)")
        if not bool(torch.isfinite(center).all()):
            raise ConfigError(
                "center", "a tensor with NaN/Inf", "a finite tensor (the server's own previous aggregate)",
            )
        return center.to(device=xc.device, dtype=xc.dtype)

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        xc = as_compute_dtype(x)
        n = xc.shape[0]
        v = self._start(xc, context.get("center"))
        bad = row_norms(xc)[1]
        good = ~bad
        a = torch.zeros(n, dtype=torch.float64, device=x.device)  # weights of the inputs in v
        for _ in range(self.iterations):
            dist = row_distances(xc, v)
            scale = torch.where(good, (self.tau / dist.clamp_min(1e-30)).clamp(max=1.0), torch.zeros_like(dist)) / n
            # v ← (1 − Σ sᵢ) v + Σ sᵢ xᵢ
            keep = 1.0 - float(scale.detach().sum())
            v = keep * v + weighted_sum(scale, xc, bad)
            a = keep * a + scale
        return v.to(x.dtype), a
