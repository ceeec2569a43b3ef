"""Attacks that carry no information about the honest vectors: Gaussian noise, +∞ and NaN."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks._common import check_choice, check_real, honest_mean, standard_normal
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["Gaussian", "Infinity", "NotANumber"]


@register
class Gaussian(Attack):
    r"""Gaussian noise: each Byzantine worker sends its own independent Gaussian vector.

    .. math:: y_i = c + \mu\,\mathbf 1 + \sigma\,z_i, \qquad z_i \sim \mathcal N(0, I_d) \ \text{i.i.d.},

    with centre :math:`c = 0` (``center="zero"``, the default: pure noise, as ByzFL's ``Gaussian`` with
    ``mu = 0, sigma = 1``) or :math:`c = \bar g` (``center="mean"``: the honest mean plus noise, a noisy but
    unbiased worker). Defaults ``mu = 0``, ``sigma = 1``. Every row is different; the samples come from
    ``ctx.generator`` (drawn on the CPU in float64, so the same seed gives the same vectors on any device).

    Reference: the Gaussian attack of Blanchard et al., NeurIPS 2017 (Section 5, "Gaussian Byzantine workers":
    mean zero and standard deviation 200 there — ``attack_params.sigma = 200``), and of ByzFL (whose default,
    σ = 1, is the default here).
    """

    name: ClassVar[str] = "gaussian"
    reference: ClassVar[str] = (
        "P. Blanchard, E. M. El Mhamdi, R. Guerraoui, J. Stainer, 'Machine Learning with Adversaries: Byzantine "
        "Tolerant Gradient Descent', NeurIPS 2017 (Section 5, Gaussian Byzantine workers: sigma = 200 there); ByzFL "
        "Gaussian (sigma = 1, the default)"
    )
    threat: ClassVar[str] = "none needed (center='zero'); honest mean (center='mean')"
    stochastic: ClassVar[bool] = True
    solo = True

    def __init__(self, sigma: float = 1.0, mu: float = 0.0, center: str = "zero") -> None:
        self.sigma = check_real("sigma", sigma, low=0.0)
        self.mu = check_real("mu", mu)
        self.center = check_choice("center", center, ("zero", "mean"))
        self.reads_honest = self.center == "mean"

    def _run(self, ctx: AttackContext) -> Tensor:
        noise = standard_normal((ctx.n_byzantine, ctx.dim), ctx.generator, ctx.honest)
        out = noise * self.sigma + self.mu
        if self.center == "mean":
            out = out + honest_mean(ctx.honest)
        return out


@register
class Infinity(Attack):
    r"""Infinity: every coordinate of every Byzantine vector is :math:`+\infty`.

    The simplest garbage a faulty or malicious worker can send (ByzFL's ``Inf``); a rule that averages any of it
    returns ±∞ or NaN. Phalanx's robust rules treat such a row as infinitely far from every other row.
    """

    name: ClassVar[str] = "inf"
    reference: ClassVar[str] = "ByzFL Inf attack (LPD-EPFL, ByzFL 0.0.11); garbage-value Byzantine worker"
    threat: ClassVar[str] = "none needed"
    finite: ClassVar[bool] = False
    reads_honest = False
    solo = True

    def _run(self, ctx: AttackContext) -> Tensor:
        return torch.full((ctx.n_byzantine, ctx.dim), float("inf"), dtype=ctx.honest.dtype, device=ctx.honest.device)


@register
class NotANumber(Attack):
    r"""NaN: every coordinate of every Byzantine vector is NaN — a crashed or buggy worker, or one that tests
    whether the server's rule survives garbage (which rules of other libraries do not: docs/benchmarks.md).
    """

    name: ClassVar[str] = "nan"
    reference: ClassVar[str] = "garbage-value Byzantine worker (NaN everywhere)"
    threat: ClassVar[str] = "none needed"
    finite: ClassVar[bool] = False
    reads_honest = False
    solo = True

    def _run(self, ctx: AttackContext) -> Tensor:
        return torch.full((ctx.n_byzantine, ctx.dim), float("nan"), dtype=ctx.honest.dtype, device=ctx.honest.device)
