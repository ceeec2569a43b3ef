"""The no-attack aggregation error ε of a rule: what is proven, and a certified lower bound where nothing is.

Yang, Shi & Li (ICML 2025, Definition 2.2) call an aggregator ε-accurate when, for *all* inputs,

    ‖Agg(x) − x̄‖² ≤ ε · (1/n) Σᵢ ‖xᵢ − x̄‖²,       x̄ = (1/n) Σᵢ xᵢ.

Their Theorem 3.1: if an (f, κ)-robust aggregator is ε-accurate, ε ≥ f/(n − f) (:func:`lower_bound`); Theorem 3.2:
an (f, κ)-robust aggregator is κ-accurate (so a proven κ is a proven upper bound on ε); Table 2: the trimmed mean has
ε = f/(n − f) exactly (their Theorem 3.6), the coordinate-wise median ⌊(n−1)/2⌋/(n − ⌊(n−1)/2⌋), the geometric
median 1 (tight at even n). A rule carries its proven ε in ``rule.epsilon(n)`` and the statement that proves it in
``rule.epsilon_source``; every other ε in Phalanx is **measured**, and a measured ε is only a lower bound.

:func:`epsilon` measures it: the search of :mod:`phalanx.analysis.epsilon_search` (known constructions, seeded random
inputs, CMA-ES restarts from random and adversarial starts), then the value at the best input is **recomputed
exactly** — the rule's float64 output and the input as rational numbers, rounded down — so a real input attains it.
It is compared with the proven upper bound (the rule's ε, else its κ by Theorem 3.2): a measured value above it by
more than the float64 rounding of the computation is a bug of the rule or of its metadata (``above_upper``).

How strong the search is (:data:`SEARCH_TOLERANCE`): at the default budget, at n = 7 (Krum at f = 1 and 2,
Multi-Krum and MeaMed at f = 2), an independent search — scipy's differential evolution, a different algorithm with
its own budget — does not beat the reported value by more than that share
(``tests/test_epsilon.py::test_an_independent_search_does_not_beat_the_reported_value``). At the sizes the tables
report (n = 10, 16; Krum, Multi-Krum, MeaMed, MDA) ``scripts/epsilon_independent.py`` runs the same comparison
(docs/tension.md): nowhere beaten, but for Krum the independent search reaches only about half to two thirds of the
reported value, so that shows little; a value without a proof is a measured lower bound only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor

from phalanx.aggregators.base import Aggregator, check_positive
from phalanx.analysis import epsilon_search
from phalanx.analysis.ratios import EXACT_MAX, RuleCall, exact_ratio, proven_upper_bound, round_down, rounding_slack
from phalanx.errors import ConfigError
from phalanx.memory import MEMORY_SHARE, available_memory

SEARCH_TOLERANCE = 0.05
"""The relative margin by which an independent search may beat :func:`epsilon`'s value at the default budget on
small n (tested; module docstring)."""
DEFAULT_BUDGET = 2000
"""Rule evaluations of the CMA-ES restarts by default (on top of the constructions and the random inputs)."""


def lower_bound(n: int, f: int) -> float:
    """ε ≥ f/(n − f) for any (f, κ)-robust aggregator (Yang, Shi & Li, ICML 2025, Theorem 3.1)."""
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
    """The certified lower bound on ε: the ratio at :attr:`input`, recomputed exactly and rounded down (+inf: the
    rule's output was not finite, or not the rows' common value on rows with no spread)."""
    worst_input: str
    """Which construction or search produced :attr:`input`."""
    theory: float | None
    """The rule's proven ε (``rule.epsilon(n)``), None where nothing is proven."""
    lower_bound: float
    """f/(n − f): no (f, κ)-robust rule can do better (Theorem 3.1)."""
    trials: int
    per_family: dict[str, float] = field(default_factory=dict)
    theory_source: str = ""
    """The paper and statement that prove :attr:`theory` (``rule.epsilon_source``)."""
    upper: float | None = None
    """A proven upper bound on ε: :attr:`theory`, else the rule's proven κ (Theorem 3.2), else None."""
    upper_source: str = ""
    """Where :attr:`upper` comes from."""
    above_upper: bool = False
    """The value exceeds :attr:`upper` by more than :attr:`slack`: a bug of the rule or of its metadata."""
    slack: float = 0.0
    """How far float64 rounding inside the rule can move the value at :attr:`input`."""
    exact: bool = False
    """The value was recomputed in rational arithmetic (else in float64)."""
    input: Tensor | None = None
    """The ``(n, d)`` float64 input attaining :attr:`value`."""
    d: int = 8
    budget: int = DEFAULT_BUDGET
    evaluations: int = 0
    """Rule evaluations spent (constructions, random inputs and the search)."""
    seed: int = 0

    @property
    def verdict(self) -> str:
        """``BUG: above the proven bound``, ``unbounded`` or ``measured lower bound``."""
        if self.above_upper:
            return "BUG: above the proven bound"
        return "unbounded" if math.isinf(self.value) else "measured lower bound"


INPUT_COPIES = 4
"""``(n, d)`` float64 arrays alive at once while one input is aggregated (the input, its compute copy, a rule's
working copy and the next input)."""
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


def _upper(rule: Aggregator, n: int, theory: float | None) -> tuple[float | None, str]:
    if theory is not None:
        return theory, "the proven ε"
    k = proven_upper_bound(rule, n) if n > 2 * getattr(rule, "f", 0) else None
    if k is None:
        return None, ""
    return k, "the proven κ (Yang, Shi & Li, ICML 2025, Theorem 3.2: an (f, κ)-robust rule is κ-accurate)"


def epsilon(rule: Aggregator, n: int, d: int = 8, trials: int = 200, seed: int = 0,
            budget: int = DEFAULT_BUDGET) -> EpsilonEstimate:
    """A certified lower bound on a rule's no-attack aggregation error ε on ``n`` inputs of dimension ``d``, beside
    its proven ε and upper bound (module docstring).

    Parameters
    ----------
    rule: an aggregator (``phalanx.aggregators.make(spec, f)``).
    n: number of inputs (workers); must satisfy the rule's requirement.
    d: dimension of the inputs (n points span at most n − 1: ``d = n − 1`` reaches every configuration).
    trials: number of random inputs, spread over the random families.
    seed: seed of the random inputs and of the search (the result is deterministic given it).
    budget: rule evaluations of the CMA-ES restarts (0: constructions and random inputs only).

    Sizes whose measurement cannot fit in memory are refused before anything is allocated (:func:`check_memory`).
    """
    check_positive("n", n, integer=True)
    check_positive("d", d, integer=True)
    check_positive("trials", trials, integer=True, allow_zero=True)
    check_positive("budget", budget, integer=True, allow_zero=True)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", seed, "an integer")
    if n < rule.min_workers():
        raise ConfigError("n", n, f"n >= {rule.min_workers()} for {rule!r} ({rule.requirement})")
    check_memory(rule, n, d)
    f = int(getattr(rule, "f", 0))
    call = RuleCall(rule, seed)
    found = epsilon_search.search(call, n, f, d, trials, budget, seed)
    x = found.x
    value, exact, slack = found.value, False, 0.0
    if math.isfinite(value) and value > 0:
        out = call(x).double()
        rows = list(range(n))
        q = exact_ratio(out, x, rows) if n * d <= EXACT_MAX else None
        if q is not None:
            value, exact = round_down(q), True
        else:
            value = aggregation_error(out, x)
        slack = rounding_slack(out, x, rows, value)
    theory = rule.epsilon(n)
    upper, upper_source = _upper(rule, n, theory)
    return EpsilonEstimate(
        rule=getattr(rule, "spec", rule.name), n=n, f=f, value=max(0.0, value), worst_input=found.name,
        theory=theory, lower_bound=lower_bound(n, f) if f < n else float("inf"), trials=trials,
        per_family=dict(found.per_family), theory_source=getattr(rule, "epsilon_source", "") if theory is not None
        else "", upper=upper, upper_source=upper_source, above_upper=upper is not None and value > upper + slack,
        slack=slack, exact=exact, input=x.clone(), d=d, budget=budget, evaluations=found.evaluations, seed=seed,
    )
