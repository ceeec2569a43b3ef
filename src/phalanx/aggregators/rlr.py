"""Robust learning rate: flip the server's step where too few updates agree in sign (Ozdayi, Kantarcioglu & Gel,
AAAI 2021)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import COLUMN_CHUNK
from phalanx.aggregators._rowops import row_norms, weighted_sum
from phalanx.aggregators.base import Aggregator, RuleTags, as_compute_dtype, check_positive
from phalanx.aggregators.registry import register

__all__ = ["RobustLR", "sign_agreement"]


def sign_agreement(x: Tensor, good: Tensor) -> Tensor:
    r"""``|Σᵢ sgn(xᵢₖ)|`` over the ``good`` rows, coordinate by coordinate: an exact integer count (float64 ``(d,)``).

    Column chunk by column chunk, so no ``(n, d)`` copy of the signs is held at once.
    """
    keep = good.to(x.device)[:, None]
    acc = torch.float32 if x.shape[0] < 2**24 else torch.float64  # integer counts stay exact
    out = torch.empty(x.shape[1], dtype=torch.float64, device=x.device)
    for s in range(0, x.shape[1], COLUMN_CHUNK):
        block = torch.where(keep, torch.sign(x[:, s : s + COLUMN_CHUNK]), 0)
        out[s : s + COLUMN_CHUNK] = block.sum(dim=0, dtype=acc).abs().to(torch.float64)
    return out


@register
class RobustLR(Aggregator):
    r"""RLR: the mean of the updates, with the server's learning rate negated on every coordinate where fewer than
    :math:`\theta` of them agree in sign.

    Ozdayi, Kantarcioglu & Gel, "Defending against backdoors in federated learning with robust learning rate",
    AAAI 2021 (arXiv 2007.03767), §"Robust learning rate". With the agents' updates :math:`\Delta_i` (FedAvg's
    pseudo-gradients) the server's per-coordinate learning rate is

    .. math::

        \eta_{\theta,k} = \begin{cases} \eta & \text{if } \big|\sum_i \mathrm{sgn}(\Delta_{i,k})\big| \ge \theta \\
        -\eta & \text{otherwise,} \end{cases} \qquad
        w_{t+1} = w_t + \eta_\theta \odot \frac{1}{n} \sum_i \Delta_i ,

    so the rule's output is :math:`s \odot \bar\Delta` with :math:`s_k = \pm 1` and the server's optimizer applies
    :math:`\eta` (the paper weights the mean by the agents' data sizes; here every row counts once, as in every
    other rule). A backdoor's coordinates, pushed by a few agents against the indifference of the others, have low
    agreement and are stepped *away* from; coordinates the honest majority agrees on are stepped as usual.

    ``threshold`` θ: an integer count (the paper tunes it; it should exceed the number of corrupt agents, so that
    their signs alone never pass it). Default ``f + 1``. The output is the mean of FedAvg-style updates: a sum over
    clients needs no robust rule's assumption, but it is only meaningful for pseudo-gradients or gradients whose
    signs the clients share.

    Robustness conventions (ours): bad rows (NaN/Inf or an overflowing norm) are left out of both the sign count
    and the mean; with no good row the output is the zero vector. Contributions: ``1/m`` on each of the ``m`` good
    rows (the weights of the mean before the sign flip). ε and κ: not known; ``None``.
    """

    name: ClassVar[str] = "rlr"
    reference: ClassVar[str] = (
        "M. S. Ozdayi, M. Kantarcioglu, Y. R. Gel, 'Defending against backdoors in federated learning with robust "
        "learning rate', AAAI 2021 (arXiv 2007.03767)"
    )
    requirement = "n >= max(2f + 1, θ); θ = f + 1 by default (more agreeing signs than the f Byzantine rows can cast)"
    # Signs are measured from the origin; a positive scale keeps them, and n identical rows agree everywhere.
    tags = RuleTags(translation=False)

    def __init__(self, f: int = 0, threshold: int | None = None) -> None:
        super().__init__(f)
        self.threshold = None if threshold is None else int(check_positive("threshold", threshold, integer=True))

    @property
    def theta(self) -> int:
        """The agreement threshold in force: ``threshold``, or ``f + 1``."""
        return self.f + 1 if self.threshold is None else self.threshold

    def min_workers(self) -> int:
        return max(2 * self.f + 1, self.theta)

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        d = x.shape[1]
        xc = as_compute_dtype(x)
        bad = row_norms(xc)[1]
        good = ~bad
        m = int(good.sum())
        share = good.to(torch.float64) / max(m, 1)
        if m == 0:
            return x.new_zeros(d), (share if want_contributions else None)
        mean = weighted_sum(share, xc, bad)
        agree = sign_agreement(xc, good) >= self.theta
        out = torch.where(agree, mean, -mean)
        return out.to(x.dtype), (share if want_contributions else None)
