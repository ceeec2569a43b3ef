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

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

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


def constructions(n: int, d: int) -> Iterator[tuple[str, Tensor]]:
    """The worst-case constructions :func:`epsilon` tries first, each with its name (float64 ``(n, d)`` inputs):
    per coordinate k equal values and n − k other equal values (k = 1 … ⌊n/2⌋), the same along e₁, one far outlier,
    at the scales 1 and 10³."""
    return _constructions(n, d)


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


INPUT_COPIES = 4
"""``(n, d)`` float64 arrays alive at once while one input is aggregated (the input, its compute copy, a rule's
working copy and the next input)."""
MEMORY_SHARE = 0.8
"""The share of the available memory a measurement may plan to use (the rest is the margin)."""


def available_memory() -> int | None:
    """Bytes of memory this process can still get: ``MemAvailable`` of ``/proc/meminfo`` (else the free physical
    pages), lowered to what the control group's limit leaves; None where neither is known."""
    avail: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        avail = None
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


def _pairwise_factor(rule: Aggregator) -> int:
    """The largest ``pairwise_matrices`` a rule's components declare (0: none builds an ``(n, n)`` matrix; a
    user's component that declares nothing counts as 0)."""
    parts = [*getattr(rule, "pre", []), getattr(rule, "rule", rule)]
    return max(int(getattr(p, "pairwise_matrices", 0)) for p in parts)


def memory_needed(rule: Aggregator, n: int, d: int) -> int:
    """Bytes :func:`epsilon` needs at its peak for ``n`` inputs of dimension ``d`` (an estimate, float64):
    :data:`INPUT_COPIES` ``(n, d)`` arrays, plus the ``(n, n)`` matrices of a distance-based component."""
    return 8 * (INPUT_COPIES * n * d + _pairwise_factor(rule) * n * n)


def _gb(size: float) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.0f} MB"


def check_memory(rule: Aggregator, n: int, d: int, available: int | None = None) -> None:
    """A :class:`ConfigError` naming ``n`` (or ``d``) and its largest value here when the measurement cannot fit in
    :data:`MEMORY_SHARE` of the available memory (``available``: bytes; default :func:`available_memory`), instead
    of an allocation that fails — or swaps the machine to a halt — halfway."""
    avail = available_memory() if available is None else available
    if avail is None:
        return
    need = memory_needed(rule, n, d)
    budget = MEMORY_SHARE * avail
    if need <= budget:
        return
    k = _pairwise_factor(rule)
    spec = getattr(rule, "spec", rule.name)
    what = f"{k} (n, n) and {INPUT_COPIES} (n, d) float64 arrays" if k else f"{INPUT_COPIES} (n, d) float64 arrays"
    hint = f"the measurement needs about {_gb(need)} ({what}) and {_gb(avail)} of memory is available"
    a, b = 8 * k, 8 * INPUT_COPIES * d
    if k or n >= d:  # the largest n that fits: a·n² + b·n <= budget
        n_max = int((-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)) if a else int(budget // b)
        raise ConfigError("n", n, f"n <= {n_max} for {spec} with d = {d} on this machine", hint + "; use a smaller n")
    d_max = max(0, int((budget - a * n * n) // (8 * INPUT_COPIES * n)))
    raise ConfigError("d", d, f"d <= {d_max} for {spec} with n = {n} on this machine", hint + "; use a smaller d")


def epsilon(rule: Aggregator, n: int, d: int = 8, trials: int = 200, seed: int = 0) -> EpsilonEstimate:
    """Estimate a rule's no-attack aggregation error factor ε on ``n`` inputs of dimension ``d``.

    Parameters
    ----------
    rule: an aggregator (``phalanx.aggregators.make(spec, f)``).
    n: number of inputs (workers); must satisfy the rule's requirement.
    d: dimension of the random inputs (constructions use it too).
    trials: number of random inputs, spread over the random families.
    seed: seed of the random inputs (the result is deterministic given it).

    Sizes whose measurement cannot fit in memory are refused before anything is allocated (:func:`check_memory`).
    """
    check_positive("n", n, integer=True)
    check_positive("d", d, integer=True)
    check_positive("trials", trials, integer=True, allow_zero=True)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", seed, "an integer")
    if n < rule.min_workers():
        raise ConfigError("n", n, f"n >= {rule.min_workers()} for {rule!r} ({rule.requirement})")
    check_memory(rule, n, d)
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
