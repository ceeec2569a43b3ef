"""What the worst-input searches of ε (:mod:`phalanx.analysis.epsilon`) and κ (:mod:`phalanx.analysis.kappa`)
share: the rule as a fixed function of its rows, evaluated on a batch of candidates, and the exact recomputation that
certifies a found ratio.

Both constants are "for all inputs" suprema of a ratio ‖F(x) − x̄_S‖² / ((1/|S|) Σ_{i∈S} ‖xᵢ − x̄_S‖²) (ε: S = every
row, Yang, Shi & Li, ICML 2025, Definition 2.2; κ: every S of n − f rows, Allouah et al., AISTATS 2023). One input
gives a lower bound; :func:`exact_ratio` recomputes it in rational arithmetic from the rule's float64 output, so the
reported value is attained by a real input (rounded down), and :func:`rounding_slack` says how far the rule's own
float64 rounding can move it.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.aggregators.chain import Chain
from phalanx.aggregators.coordinatewise import CoordinateWiseMedian, CoordinateWiseTrimmedMean, MeaMed
from phalanx.aggregators.mean import Mean
from phalanx.aggregators.pre.nnm import NNM

__all__ = [
    "COLUMNWISE",
    "EPS",
    "EXACT_MAX",
    "RESOLUTION",
    "ROUNDING",
    "RuleCall",
    "exact_ratio",
    "proven_upper_bound",
    "round_down",
    "rounding_slack",
    "spread_floor",
]

EPS = torch.finfo(torch.float64).eps
ROUNDING = 16.0
"""Rounding of a rule's output, per coordinate, in units of (n + d)·eps·max|x| (:func:`rounding_slack`)."""
RESOLUTION = 1e3
"""A candidate whose spread is below (RESOLUTION·(n + d)·eps·max|x|)² is not scored: its ratio would measure
rounding, not the rule."""
EXACT_MAX = 100_000
"""Largest n·d whose value is recomputed in rational arithmetic (above it: float64, ``exact`` False)."""
COLUMNWISE = (Mean, CoordinateWiseTrimmedMean, CoordinateWiseMedian, MeaMed)
"""Rules that aggregate every coordinate on its own, so a batch of inputs is one call on more columns."""


def exact_ratio(out: Tensor, x: Tensor, rows: tuple[int, ...] | list[int]) -> Fraction | None:
    """‖out − x̄_S‖² / ((1/|S|) Σ_{i∈S} ‖xᵢ − x̄_S‖²) for S = ``rows`` in rational arithmetic from the float64 values
    of ``out`` and ``x`` (every float is a rational, so nothing is rounded); None when the spread is 0 or the output
    is not finite."""
    o = out.double().tolist()
    if not all(math.isfinite(v) for v in o):
        return None
    pts = [[Fraction(v) for v in x[i].double().tolist()] for i in rows]
    m = len(pts)
    mean = [sum(col, Fraction(0)) / m for col in zip(*pts)]
    spread = sum((sum(((a - b) ** 2 for a, b in zip(r, mean)), Fraction(0)) for r in pts), Fraction(0)) / m
    if spread == 0:
        return None
    err = sum(((Fraction(a) - b) ** 2 for a, b in zip(o, mean)), Fraction(0))
    return err / spread


def round_down(q: Fraction) -> float:
    """The largest float64 not above ``q``."""
    v = float(q)
    return math.nextafter(v, 0.0) if Fraction(v) > q else v


def spread_floor(x: Tensor, n: int, d: int) -> float:
    """The smallest spread a ratio is scored at (:data:`RESOLUTION`): (RESOLUTION·(n + d)·eps·max|x|)²."""
    return float((RESOLUTION * (n + d) * EPS * x.double().abs().max()) ** 2)


def rounding_slack(out: Tensor, x: Tensor, rows: tuple[int, ...] | list[int], value: float) -> float:
    """How far float64 rounding inside a rule can move the ratio at this input: the output's error per coordinate
    is taken as δ = :data:`ROUNDING`·(n + d)·eps·max|x| (sums of n terms of size max|x|, norms of d terms), so the
    error ‖out − x̄_S‖² moves by at most 2√err·δ√d + dδ², and the ratio by that over the spread, plus its own
    relative rounding."""
    n, d = x.shape
    h = x.double()[list(rows)]
    mean = h.mean(dim=0)
    spread = float((h - mean).square().sum(dim=1).mean())
    err = float((out.double() - mean).square().sum())
    if spread <= 0.0 or not math.isfinite(err):
        return float("inf")
    delta = ROUNDING * (n + d) * EPS * float(x.double().abs().max())
    return (2.0 * math.sqrt(err) * delta * math.sqrt(d) + d * delta * delta) / spread + ROUNDING * (n + d) * EPS * value


def proven_upper_bound(rule: Aggregator, n: int) -> float | None:
    """The proven κ of ``rule`` at ``n``: its own ``kappa(n)``, else for ``nnm>RULE`` with NNM configured for the
    rule's f, 8f/(n − f)·(κ_RULE + 1) (Allouah et al., AISTATS 2023, the lemma on NNM); None where none is known."""
    own = rule.kappa(n)
    if own is not None:
        return own
    if isinstance(rule, Chain) and len(rule.pre) == 1 and type(rule.pre[0]) is NNM and rule.pre[0].f == rule.f:
        inner = rule.rule.kappa(n)
        f = rule.f
        if inner is not None and n > 2 * f:
            return 8.0 * f / (n - f) * (inner + 1.0)
    return None


class RuleCall:
    """A rule as a fixed function of its rows: a stochastic rule draws from a generator seeded with ``seed`` at every
    call, a stateful one starts from its initial state (so the same input always gives the same output)."""

    def __init__(self, rule: Aggregator, seed: int) -> None:
        self.rule, self.seed = rule, seed
        self.columnwise = type(rule) in COLUMNWISE

    def __call__(self, x: Tensor) -> Tensor:
        context: dict[str, Any] = {}
        if "generator" in self.rule.context_keys:
            context["generator"] = torch.Generator().manual_seed(self.seed)
        if self.rule.stateful:
            self.rule.load_state_dict({})
        return self.rule(x, **context)

    def batch(self, xb: Tensor) -> Tensor:
        """The outputs ``(b, d)`` float64 of a batch ``(b, n, d)`` of inputs (a coordinate-wise rule: one call)."""
        b, n, d = xb.shape
        if self.columnwise:
            return self(xb.permute(1, 0, 2).reshape(n, b * d)).reshape(b, d).double()
        return torch.stack([self(x) for x in xb]).double()
