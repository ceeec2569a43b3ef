"""Empirical no-attack aggregation error ε of a rule.

Yang, Shi & Li (ICML 2025, Definition 2.2) call an aggregator ε-accurate when, for *all* inputs,

    ‖Agg(x) − x̄‖² ≤ ε · (1/n) Σᵢ ‖xᵢ − x̄‖²,       x̄ = (1/n) Σᵢ xᵢ,

and prove (Thm 3.1) that any aggregator tolerating f Byzantine workers has ε ≥ f/(n − f). ε is what a rule costs
when nobody attacks: gradient descent with it stalls in a neighbourhood of size ~εG² (their Thm 4.5/4.6).

:func:`epsilon` measures a lower estimate of a rule's ε: the largest ratio over (1) the known worst-case
constructions — per coordinate, k equal values and n − k other equal values, for every k (tight for the trimmed mean
and the median), two clusters, one far outlier — and (2) random inputs from several families, seeded. The estimate
can only approach the true ε from below: a rule whose estimate exceeds its claimed ε is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator, check_positive
from phalanx.errors import ConfigError


def lower_bound(n: int, f: int) -> float:
    """ε ≥ f/(n − f) for any aggregator that tolerates f of n Byzantine workers (Yang, Shi & Li, Thm 3.1)."""
    if f < 0 or n <= f:
        raise ConfigError("f", f, f"0 <= f < n={n}")
    return f / (n - f)


def aggregation_error(out: Tensor, x: Tensor) -> float:
    """The ratio ‖out − x̄‖² / ((1/n) Σᵢ ‖xᵢ − x̄‖²) for one input (0/0 counts as 0; NaN output as +inf)."""
    xd = x.double()
    mean = xd.mean(dim=0)
    spread = float((xd - mean).square().sum(dim=1).mean())
    err = float((out.double() - mean).square().sum())
    if err != err:
        return float("inf")
    if spread == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / spread


@dataclass
class EpsilonEstimate:
    """Result of :func:`epsilon`."""

    rule: str
    n: int
    f: int
    value: float
    """The largest ratio found (an estimate of ε from below)."""
    worst_input: str
    """Which construction or random family produced it."""
    theory: float | None
    """The rule's ε from the literature (``rule.epsilon(n)``), if known."""
    lower_bound: float
    """f/(n − f): no rule tolerating f workers can do better."""
    trials: int
    per_family: dict[str, float] = field(default_factory=dict)


def _constructions(n: int, d: int) -> Iterator[tuple[str, Tensor]]:
    # Scales matter for rules that are not scale-equivariant (clipping radii, thresholds).
    for scale in (1.0, 1e3):
        for k in range(1, n // 2 + 1):
            x = torch.zeros(n, d, dtype=torch.float64)
            x[:k] = scale  # per coordinate: k equal values and n − k other equal values (tight for TM and median)
            yield f"{k} rows at {scale:g}·1, {n - k} at 0", x
        for k in range(1, n // 2 + 1):
            x = torch.zeros(n, d, dtype=torch.float64)
            x[:k, 0] = scale  # the same along one direction only (vector rules: Krum, GM, ...)
            yield f"{k} rows at {scale:g}·e1, {n - k} at 0", x
        x = torch.zeros(n, d, dtype=torch.float64)
        x[0] = scale
        yield f"one outlier at {scale:g}·1", x


def _random_families(gen: torch.Generator, n: int, d: int) -> list[tuple[str, Callable[[], Tensor]]]:
    def gaussian() -> Tensor:
        return torch.randn(n, d, generator=gen, dtype=torch.float64)

    def heavy_tailed() -> Tensor:
        g = torch.randn(n, d, generator=gen, dtype=torch.float64)
        chi = torch.randn(n, 3, generator=gen, dtype=torch.float64).square().sum(dim=1, keepdim=True) / 3
        return g / chi.sqrt()

    def clusters() -> Tensor:
        k = int(torch.randint(1, n // 2 + 1, (1,), generator=gen))
        x = 0.05 * torch.randn(n, d, generator=gen, dtype=torch.float64)
        x[:k] += torch.randn(d, generator=gen, dtype=torch.float64)
        return x

    def sparse() -> Tensor:
        mask = torch.rand(n, d, generator=gen, dtype=torch.float64) < 0.3
        return torch.randn(n, d, generator=gen, dtype=torch.float64) * mask

    return [("gaussian", gaussian), ("heavy-tailed", heavy_tailed), ("clusters", clusters), ("sparse", sparse)]


def epsilon(rule: Aggregator, n: int, d: int = 8, trials: int = 200, seed: int = 0) -> EpsilonEstimate:
    """Estimate a rule's no-attack aggregation error factor ε on ``n`` inputs of dimension ``d``.

    Parameters
    ----------
    rule: an aggregator (``phalanx.aggregators.make(spec, f)``).
    n: number of inputs (workers); must satisfy the rule's requirement.
    d: dimension of the random inputs (constructions use it too).
    trials: number of random inputs, spread over the random families.
    seed: seed of the random inputs (the result is deterministic given it).
    """
    check_positive("n", n, integer=True)
    check_positive("d", d, integer=True)
    check_positive("trials", trials, integer=True, allow_zero=True)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", seed, "an integer")
    if n < rule.min_workers():
        raise ConfigError("n", n, f"n >= {rule.min_workers()} for {rule!r} ({rule.requirement})")
    best, where = 0.0, "none"
    per_family: dict[str, float] = {}

    def consider(name: str, family: str, x: Tensor) -> None:
        nonlocal best, where
        ratio = aggregation_error(rule(x), x)
        per_family[family] = max(per_family.get(family, 0.0), ratio)
        if ratio > best * (1 + 1e-9) + 1e-12:  # ignore rounding-level differences
            best, where = ratio, name

    for name, x in _constructions(n, d):
        consider(name, "constructions", x)
    gen = torch.Generator().manual_seed(seed)
    families = _random_families(gen, n, d)
    for t in range(trials):
        fam, draw = families[t % len(families)]
        consider(f"random {fam} #{t}", fam, draw())
    f = getattr(rule, "f", 0)
    return EpsilonEstimate(
        rule=getattr(rule, "spec", rule.name), n=n, f=f, value=best, worst_input=where, theory=rule.epsilon(n),
        lower_bound=lower_bound(n, f) if f < n else float("inf"), trials=trials, per_family=per_family,
    )
