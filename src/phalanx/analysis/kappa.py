"""Measured (f, κ)-robustness coefficient of a rule: a certified lower bound, beside the proven upper bound.

Allouah, Farhadkhani, Guerraoui, Gupta, Pinot & Stephan ("Fixing by Mixing: A Recipe for Optimal Byzantine ML under
Heterogeneity", AISTATS 2023) call a rule F *(f, κ)-robust* when, for all inputs x₁ … xₙ ∈ ℝᵈ and every set
S ⊆ [n] of |S| = n − f rows,

    ‖F(x) − x̄_S‖² ≤ κ · (1/|S|) Σ_{i∈S} ‖xᵢ − x̄_S‖²,       x̄_S = (1/|S|) Σ_{i∈S} xᵢ.

They prove upper bounds on κ for the classical rules (their Table 1, carried by each rule's ``kappa(n)``): the
coordinate-wise trimmed mean (6f/(n−2f))(1 + f/(n−2f)), the coordinate-wise median and the geometric median
4(1 + f/(n−2f))², Krum 6(1 + f/(n−2f)); nearest-neighbour mixing in front of an (f, κ)-robust rule gives
(f, 8f/(n−f)·(κ + 1)) (their Lemma on NNM, :func:`proven_upper_bound`); and no rule does better than
κ ≥ f/(n−2f) (:func:`universal_lower_bound`; the companion paper, Allouah et al., "Robust Distributed Learning:
Tight Error Bounds and Breakdown Point under Data Heterogeneity", NeurIPS 2023, uses the same definition).

The definition is a "for all", so **one** input and one set S give a lower bound on κ: the ratio of the two sides.
:func:`kappa` searches for the input that maximises it:

1. *Structured inputs* known to be worst for the families of rules: on a line, k honest rows at u and n − f − k at
   0 with the f Byzantine rows at one point t·u for a sweep of distances t, the far ones on both sides (u = e₁, and
   u ∝ 1 for coordinate-wise rules) — it contains the construction behind κ ≥ f/(n−2f) and the far-away attack
   that the mean cannot survive;
   ALIE-like placements (the Byzantine rows at the honest mean plus z honest standard deviations, coordinate by
   coordinate: Baruch, Baruch & Goldberg, NeurIPS 2019); mimicry (the Byzantine rows copy, or extrapolate, the honest
   row farthest from the honest mean).
2. *Random restarts with a black-box local search* (rules are not all differentiable): from the best structured
   inputs and from random ones, a (1 + λ) evolution strategy with an adaptive step — Gaussian moves of all rows, of
   the honest or the Byzantine rows only, of one row, and jumps of the colluding Byzantine point.

Each candidate is scored against several sets S (every one of the C(n, f) sets when there are at most
:data:`SUBSETS_MAX`, otherwise the construction's honest rows and the n − f rows farthest from the output, by
distance and along the direction to the mean), in float64 and vectorised over a batch of candidates; a
coordinate-wise rule aggregates the whole batch in one call (its columns are independent, so a batch is more
columns). The reported value is then **recomputed exactly** at the best input — the rule's float64 output and the
input as rational numbers (:func:`exact_ratio`), rounded down — so it is certified: a real input attains it.

A measured value above the proven upper bound (by more than the float64 rounding of the computation,
:func:`rounding_slack`) is a bug of the rule, its bound or its metadata, and is flagged (``above_upper``); so is a
non-finite output of a rule that has a proven κ (verdict ``BUG: non-finite output``). A rule
whose ratio grows without bound as the Byzantine rows move away — the mean — is reported ``unbounded``
(:data:`FAR`: on the line, on either side, the ratio at the farthest distance t of the Byzantine point passes t —
measured in ‖u‖, the separation of the honest rows — and grew at least linearly in t over the last two decades).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.analysis.epsilon import check_memory
from phalanx.analysis.ratios import (
    EPS,
    EXACT_MAX,
    RESOLUTION,
    RuleCall,
    exact_ratio,
    proven_upper_bound,
    round_down,
    rounding_slack,
    spread_floor,
)
from phalanx.errors import ConfigError
from phalanx.validate import check_int

__all__ = [
    "FAR", "NEAR", "SUBSETS_MAX", "KappaEstimate", "check_setting", "exact_ratio", "kappa", "proven_upper_bound",
    "robustness_ratio", "rounding_slack", "universal_lower_bound",
]

NEAR = (-4.0, -2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
"""Distances t (in units of the honest rows' separation) of the colluding Byzantine point t·u on the line."""
FAR = (1e2, 1e3, 1e4, 1e5, 1e6)
"""The far distances of the same sweep, swept on both sides (t·u and −t·u); the ratio at the last two decades decides
``unbounded``."""
SUBSETS_MAX = 512
"""Every set S of n − f rows is scored when there are at most this many; else the heuristic sets only."""
BATCH_ELEMENTS = 1 << 21
"""Largest number of float64 entries of a batch of candidates (and of its per-set copies) held at once."""
PROPOSALS = 16
"""Candidates per step of the local search."""


def universal_lower_bound(n: int, f: int) -> float:
    """κ ≥ f/(n − 2f) for every (f, κ)-robust rule (Allouah et al., AISTATS 2023): with f rows at 1 and n − f at 0
    (one dimension), the n − f zeros force F = 0 and the set of the f ones and n − 2f zeros then gives f/(n − 2f)."""
    if isinstance(n, bool) or not isinstance(n, int) or isinstance(f, bool) or not isinstance(f, int):
        raise ConfigError("f", f, "an integer with 0 <= f < n/2")
    if f < 0 or 2 * f >= n:
        raise ConfigError("f", f, f"0 <= f < n/2 = {n / 2:g} (with n = {n})")
    return f / (n - 2 * f)


def check_setting(n: Any, f: Any, d: Any, budget: Any, seed: Any = 0) -> None:
    """The one-line :class:`ConfigError` for a bad n (≥ 1), f (0 ≤ f < n/2), d (≥ 1), budget (≥ 1) or seed (an
    integer), raised before anything is built."""
    check_int("n", n, low=1)
    check_int("f", f, low=0)
    if 2 * f >= n:
        raise ConfigError("f", f, f"0 <= f < n/2 = {n / 2:g} (with n = {n})")
    check_int("d", d, low=1)
    check_int("budget", budget, low=1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", seed, "an integer")


def robustness_ratio(out: Tensor, x: Tensor, honest: tuple[int, ...] | list[int], floor: float = 0.0) -> float:
    """‖out − x̄_S‖² / ((1/|S|) Σ_{i∈S} ‖xᵢ − x̄_S‖²) in float64 for the rows ``honest`` = S (0/0 counts as 0; a
    non-finite output or a positive error over a zero spread as +inf). With ``floor`` (:func:`spread_floor`), a set
    whose spread is below it counts as 0, as the search scores it: its ratio would measure the rule's rounding or
    its iterations' tolerance (Weiszfeld's geometric median at 4 equal honest rows), not the rule."""
    h = x.double()[list(honest)]
    mean = h.mean(dim=0)
    spread = float((h - mean).square().sum(dim=1).mean())
    err = float((out.double() - mean).square().sum())
    if err != err or err == float("inf"):
        return float("inf")
    if floor > 0.0 and spread < floor:
        return 0.0
    if spread == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / spread


@dataclass
class KappaEstimate:
    """Result of :func:`kappa`."""

    rule: str
    n: int
    f: int
    d: int
    value: float
    """The certified lower bound on κ: the ratio at :attr:`input` for the set :attr:`honest` (+inf: the rule's output
    was not finite there)."""
    worst_input: str
    """Which construction or search produced the input."""
    input: Tensor
    """The ``(n, d)`` float64 input attaining :attr:`value`."""
    honest: tuple[int, ...]
    """The set S of the ratio (its row indices, increasing)."""
    lower_bound: float
    """f/(n − 2f): no (f, κ)-robust rule has a smaller κ."""
    upper_bound: float | None
    """The proven κ (:func:`proven_upper_bound`), None where none is known."""
    unbounded: bool
    """The ratio grows without bound as the Byzantine rows move away (the rule is (f, κ)-robust for no κ)."""
    above_upper: bool
    """The value exceeds the proven upper bound by more than :attr:`slack`, or the rule's output was not finite
    (:attr:`output_finite`) though it has a proven κ: a bug."""
    slack: float
    """The float64 rounding allowed at the input (:func:`rounding_slack`)."""
    exact: bool
    """The value was recomputed in rational arithmetic (else in float64)."""
    rounding: bool
    """The value is at most :attr:`slack`: the rule's own float64 rounding, not an error of the rule (the search
    found no input with more; with f = 0 the mean and the trimmed mean are exact up to rounding)."""
    evaluations: int
    """Rule evaluations spent (a batch of b candidates counts b)."""
    seed: int
    per_family: dict[str, float] = field(default_factory=dict)
    """The best ratio the search found in each family of inputs."""
    by_distance: dict[float, float] = field(default_factory=dict)
    """The best ratio on the line at each far distance of the Byzantine point (:data:`FAR`)."""

    output_finite: bool = True
    """The rule's output at :attr:`input` is finite (a NaN or an infinity from a rule with a proven κ is a bug, not a
    ratio that grows)."""

    unbounded_tested: bool = True
    """Whether the budget reached the far points of the line that decide :attr:`unbounded` (the last three
    distances of one split whose honest rows spread); when not, a finite value says nothing of whether the ratio is
    bounded."""

    @property
    def verdict(self) -> str:
        """``unbounded``, ``BUG: above the proven bound``, ``BUG: non-finite output``, ``rounding`` or
        ``certified``."""
        if self.above_upper:
            return "BUG: above the proven bound" if self.output_finite else "BUG: non-finite output"
        if self.unbounded:
            return "unbounded"
        return "rounding" if self.rounding else "certified"


LINE_SPLITS = 33
"""At most this many splits k of the honest rows on the line (all of them when n − f + 1 ≤ this)."""


def line_splits(n: int, m: int) -> list[int]:
    """The splits k (honest rows at u) the line tries: every k = 0 … m for small m, else 0, 1, m − 1, m, f, m − f,
    m/2 and an even spread (k = 0 first: with it, f rows at t·u and n − f at 0 give the universal bound)."""
    if m + 1 <= LINE_SPLITS:
        return list(range(m + 1))
    f = n - m
    picks = {0, 1, m - 1, m, min(f, m), max(0, m - f), m // 2}
    picks |= {round(i * m / (LINE_SPLITS - 8)) for i in range(LINE_SPLITS - 7)}
    return sorted(picks)


Far = tuple[str, int, float]
"""A far point of the line: (its axis u, the split k, the distance t)."""


def _line(n: int, m: int, d: int, u: Tensor, axis: str) -> Iterator[tuple[str, str, Tensor, Far | None]]:
    distances = (*NEAR, *FAR, *(-t for t in FAR)) if m < n else (0.0,)
    for k in line_splits(n, m):
        for t in distances:
            x = torch.zeros(n, d, dtype=torch.float64)
            x[:k] = u
            x[m:] = t * u
            yield (f"line: {k} honest at u, {m - k} at 0, Byzantine at {t:g}·u", "line", x,
                   (axis, k, t) if abs(t) in FAR else None)


def _constructions(n: int, m: int, d: int, gen: torch.Generator, columnwise: bool
                   ) -> Iterator[tuple[str, str, Tensor, Far | None]]:
    e1 = torch.zeros(d, dtype=torch.float64)
    e1[0] = 1.0
    yield from _line(n, m, d, e1, "e1")
    if d > 1 and columnwise:
        yield from _line(n, m, d, torch.ones(d, dtype=torch.float64), "ones")
    if m == n:
        return
    for draw in range(2):
        h = torch.randn(m, d, generator=gen, dtype=torch.float64)
        mu, sd = h.mean(dim=0), h.std(dim=0)
        for z in (-10.0, -5.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0):
            x = torch.cat([h, (mu + z * sd).expand(n - m, d)])
            yield f"alie #{draw}: Byzantine at mean {z:+g}·std", "alie", x, None
        far = int((h - mu).square().sum(dim=1).argmax())
        for lam in (1.0, 1.5, 2.0, 3.0, 5.0):
            x = torch.cat([h, (mu + lam * (h[far] - mu)).expand(n - m, d)])
            yield f"mimic #{draw}: Byzantine at mean + {lam:g}·(farthest − mean)", "mimic", x, None


def _count_at_most(n: int, m: int, cap: int) -> int:
    """C(n, m), or ``cap + 1`` as soon as it is known to exceed ``cap`` (no huge integer for a large n)."""
    c, r = 1, min(m, n - m)
    for i in range(r):
        c = c * (n - i) // (i + 1)
        if c > cap:
            return cap + 1
    return c


def _subsets(n: int, m: int) -> Tensor | None:
    if _count_at_most(n, m, SUBSETS_MAX) > SUBSETS_MAX:
        return None
    return torch.tensor(list(itertools.combinations(range(n), m)), dtype=torch.long)


class _Search:
    """The scoring of candidates, their budget and the best one found."""

    def __init__(self, rule: Aggregator, n: int, f: int, d: int, budget: int, seed: int) -> None:
        self.rule, self.n, self.m, self.d, self.budget, self.seed = rule, n, n - f, d, budget, seed
        self.call = RuleCall(rule, seed)
        self.columnwise = self.call.columnwise
        self.all_sets = _subsets(n, self.m)
        self.used = 0
        self.best = -1.0
        self.best_x = torch.zeros(n, d, dtype=torch.float64)
        self.best_name = "none"
        self.per_family: dict[str, float] = {}
        self.nonfinite = False
        """Whether any output of the rule during the search was not finite (a rule returning NaN only sometimes
        gave a finite output when its best input was called again: a review)."""

    def left(self) -> int:
        return self.budget - self.used

    def outputs(self, xb: Tensor) -> Tensor:
        return self.call.batch(xb)

    def sets(self, xb: Tensor, outs: Tensor) -> Tensor:
        """``(b, c, m)`` row indices of the sets S each candidate is scored against."""
        b = xb.shape[0]
        first = torch.arange(self.m).expand(b, 1, self.m)
        if self.all_sets is not None:
            return self.all_sets.expand(b, -1, -1)
        rel = xb - outs[:, None, :]
        by_dist = rel.square().sum(dim=2).argsort(dim=1, descending=True, stable=True)[:, : self.m]
        toward = xb.mean(dim=1) - outs
        by_proj = (rel @ toward[:, :, None])[:, :, 0].argsort(dim=1, descending=True, stable=True)[:, : self.m]
        return torch.cat([first, by_dist[:, None], by_proj[:, None]], dim=1)

    def ratios(self, xb: Tensor, outs: Tensor) -> tuple[Tensor, Tensor]:
        """The best ratio of each candidate over its sets, and that set's index."""
        b, n, d = xb.shape
        sets = self.sets(xb, outs)
        c = sets.shape[1]
        best = torch.zeros(b, dtype=torch.float64)
        which = torch.zeros(b, dtype=torch.long)
        scale = xb.abs().flatten(1).amax(dim=1)
        floor = (RESOLUTION * (n + d) * EPS * scale).square()
        finite = torch.isfinite(outs).all(dim=1)
        self.nonfinite |= not bool(finite.all())
        step = max(1, BATCH_ELEMENTS // max(1, b * self.m * d))
        rows = torch.arange(b)[:, None, None]
        for lo in range(0, c, step):
            idx = sets[:, lo: lo + step]
            h = xb[rows, idx]  # (b, c', m, d)
            mean = h.mean(dim=2)
            spread = (h - mean[:, :, None]).square().sum(dim=3).mean(dim=2)
            err = (outs[:, None] - mean).square().sum(dim=2)
            r = torch.where(spread >= floor[:, None], err / spread.clamp_min(1e-300), torch.zeros((), dtype=err.dtype))
            r = torch.where(finite[:, None], r, torch.full((), float("inf"), dtype=r.dtype))
            top, arg = r.max(dim=1)
            better = top > best
            best = torch.where(better, top, best)
            which = torch.where(better, arg + lo, which)
        return best, which

    def score(self, xb: Tensor, names: list[str], families: list[str]) -> Tensor:
        """Score a batch (at most :meth:`left` candidates are evaluated; the rest score -1)."""
        k = min(xb.shape[0], self.left())
        scores = torch.full((xb.shape[0],), -1.0, dtype=torch.float64)
        if k <= 0:
            return scores
        per = max(1, BATCH_ELEMENTS // max(1, self.n * self.d * (SUBSETS_MAX if self.all_sets is not None else 3)))
        for lo in range(0, k, per):
            chunk = xb[lo: min(k, lo + per)]
            r, _ = self.ratios(chunk, self.outputs(chunk))
            scores[lo: lo + chunk.shape[0]] = r
            self.used += chunk.shape[0]
        for i in range(k):
            v = float(scores[i])
            fam = families[i]
            self.per_family[fam] = max(self.per_family.get(fam, 0.0), v)
            if v > self.best * (1 + 1e-12) + 1e-300:
                self.best, self.best_x, self.best_name = v, xb[i].clone(), names[i]
        return scores


def _local_search(search: _Search, start: Tensor, start_score: float, evaluations: int, gen: torch.Generator,
                  label: str) -> None:
    """A (1 + λ) evolution strategy from ``start`` for about ``evaluations`` rule evaluations."""
    n, m, d = search.n, search.m, search.d
    x, cur = start.clone(), start_score
    sigma = 0.5
    stop = search.used + evaluations
    kinds = 5 if m < n else 3
    while search.used < stop and search.left() > 0:
        p = min(PROPOSALS, stop - search.used, search.left())
        h = x[:m]
        scale = float((h - h.mean(dim=0)).square().sum(dim=1).mean().sqrt())
        if not scale > 0.0:
            scale = max(1.0, float(x.abs().max()))
        props = x.expand(p, n, d).clone()
        kind = torch.randint(0, kinds, (p,), generator=gen)
        noise = torch.randn(p, n, d, generator=gen, dtype=torch.float64) * (sigma * scale)
        mask = torch.ones(p, n, 1, dtype=torch.float64)
        one = torch.randint(0, n, (p,), generator=gen)
        for j in range(p):
            kj = int(kind[j])
            if kj == 1:  # one row
                mask[j] = 0.0
                mask[j, int(one[j])] = 1.0
            elif kj == 2:  # the honest rows
                mask[j, m:] = 0.0
            elif kj == 3:  # the Byzantine rows
                mask[j, :m] = 0.0
        props = props + noise * mask
        for j in range(p):
            if int(kind[j]) == 4:  # the colluding Byzantine point jumps
                direction = torch.randn(d, generator=gen, dtype=torch.float64)
                direction /= direction.norm().clamp_min(1e-300)
                reach = 10.0 ** float(torch.empty(1, dtype=torch.float64).uniform_(-1.0, 2.0, generator=gen))
                props[j, m:] = h.mean(dim=0) + reach * scale * direction
        scores = search.score(props, [f"local search from {label}"] * p, ["search"] * p)
        top = int(scores.argmax())
        if float(scores[top]) > cur * (1 + 1e-9):
            x, cur = props[top].clone(), float(scores[top])
            sigma = min(4.0, sigma * 1.5)
        else:
            sigma *= 0.7
            if sigma < 1e-4:
                sigma = 0.5


def _random_start(n: int, m: int, d: int, gen: torch.Generator) -> Tensor:
    h = torch.randn(m, d, generator=gen, dtype=torch.float64) * torch.rand(m, 1, generator=gen, dtype=torch.float64)
    k = int(torch.randint(0, m + 1, (1,), generator=gen))
    h[:k] += torch.randn(d, generator=gen, dtype=torch.float64)
    byz = h.mean(dim=0) + torch.randn(d, generator=gen, dtype=torch.float64) * 3.0
    return torch.cat([h, byz.expand(n - m, d)])


def _growth(far: dict[Far, float], m: int) -> tuple[bool, bool]:
    """From the far points of the line: (tested, unbounded). A split (axis, k) with 0 < k < m (the m honest rows
    not all at one point: they spread) is tested on one side (the Byzantine point at +t·u, or at −t·u) when its
    ratio at the last three distances of that side was scored and is positive at the first of them; the ratio is
    unbounded when on some tested split and side it reaches the last distance and grows by at least the distances'
    ratio over the last two decades (it grows without bound as the Byzantine rows move away). Boundedness is tested
    only when both sides were (a rule that trims only the largest values is unbounded towards −u alone)."""
    last = FAR[-3:]
    sides: set[float] = set()
    unbounded = False
    for axis, k in {(a, k) for a, k, _ in far if 0 < k < m}:
        for side in (1.0, -1.0):
            r = [far.get((axis, k, side * t)) for t in last]
            if any(v is None for v in r) or not r[0]:
                continue
            sides.add(side)
            unbounded |= r[-1] >= FAR[-1] and r[-1] >= (last[-1] / last[0]) * r[0]  # type: ignore[operator]
    return len(sides) == 2, unbounded


def _finish(search: _Search, rule: Aggregator, n: int, f: int, d: int, seed: int, spec: str,
            by_distance: dict[float, float], far_points: dict[Far, float]) -> KappaEstimate:
    x = search.best_x
    out = search.call(x).double()
    m = n - f
    candidates = search.all_sets if search.all_sets is not None else search.sets(x[None], out[None])[0]
    floor = spread_floor(x, n, d)
    scored = [(robustness_ratio(out, x, tuple(s.tolist()), floor), tuple(int(i) for i in s.tolist()))
              for s in candidates]
    value, honest = max(scored, key=lambda t: t[0]) if scored else (0.0, tuple(range(m)))
    honest = tuple(sorted(honest))
    exact = False
    if math.isfinite(value) and n * d <= EXACT_MAX:
        q = exact_ratio(out, x, honest)
        if q is not None:
            value, exact = round_down(q), True
    upper = proven_upper_bound(rule, n)
    slack = rounding_slack(out, x, honest, value) if math.isfinite(value) else float("inf")
    tested, grows = _growth(far_points, m)
    unbounded = not math.isfinite(value) or grows
    finite_out = bool(torch.isfinite(out).all()) and not search.nonfinite
    # a rule with a proven (finite) κ: an infinite ratio, a non-finite output at any point of the search, or a ratio
    # that grows without bound contradicts it whatever the slack (inf > upper + inf is False)
    above = upper is not None and (unbounded or not finite_out or not math.isfinite(value) or value > upper + slack)
    return KappaEstimate(
        rule=spec, n=n, f=f, d=d, value=value, worst_input=search.best_name, input=x.clone(), honest=honest,
        lower_bound=universal_lower_bound(n, f), upper_bound=upper, unbounded=unbounded, above_upper=above,
        slack=slack, exact=exact, rounding=value <= slack, evaluations=search.used, seed=seed,
        per_family=dict(search.per_family), by_distance=by_distance, output_finite=finite_out,
        unbounded_tested=unbounded or tested,
    )


def kappa(rule: Aggregator, n: int, d: int = 8, budget: int = 2000, seed: int = 0,
          on_progress: Callable[[int, int], None] | None = None) -> KappaEstimate:
    """Search for the input that maximises ‖F(x) − x̄_S‖² / ((1/|S|) Σ_{i∈S} ‖xᵢ − x̄_S‖²) for ``rule`` (configured for
    its f) on ``n`` rows of dimension ``d``, with ``budget`` rule evaluations; return the certified lower bound on
    κ beside f/(n − 2f) and the proven upper bound.

    Parameters
    ----------
    rule: an aggregator (``phalanx.aggregators.make(spec, f)``); its ``f`` is the f of the (f, κ)-robustness.
    n: number of rows; must satisfy the rule's requirement and n > 2f.
    d: dimension of the inputs.
    budget: rule evaluations (the structured inputs first, the local search with the rest).
    seed: seed of the random inputs and moves (the result is deterministic given it).
    on_progress: called with (evaluations used, budget) after each phase.

    Bad settings are one-line :class:`ConfigError` s before anything is allocated (:func:`check_setting`, the rule's
    smallest n, :func:`~phalanx.analysis.epsilon.check_memory`).
    """
    f = getattr(rule, "f", 0)
    check_setting(n, f, d, budget, seed)
    if n < rule.min_workers():
        raise ConfigError("n", n, f"n >= {rule.min_workers()} for {getattr(rule, 'spec', rule.name)} "
                          f"({rule.requirement})")
    check_memory(rule, n, d)
    spec = getattr(rule, "spec", rule.name)
    if "reference" in rule.context_keys:  # FLTrust: its output depends on the server's gradient, not the rows alone
        raise ConfigError("reference", spec, "a rule of the rows alone (the search varies the rows; this rule also "
                          "takes the server's reference gradient per call, which κ's definition does not have)")
    gen = torch.Generator().manual_seed(seed)
    search = _Search(rule, n, f, d, budget, seed)
    m = n - f
    by_distance: dict[float, float] = {}
    far: dict[Far, float] = {}
    built = _constructions(n, m, d, gen, search.columnwise)  # lazily: only what the budget reaches is made
    tops: dict[str, tuple[float, Tensor]] = {}
    per = max(1, min(256, BATCH_ELEMENTS // (n * d)))
    while search.left() > 0:
        chunk = list(itertools.islice(built, min(per, search.left())))
        if not chunk:
            break
        scores = search.score(torch.stack([c[2] for c in chunk]), [c[0] for c in chunk], [c[1] for c in chunk])
        for (_, fam, x, key), s in zip(chunk, scores.tolist()):
            if key is not None:
                far[key] = s
                by_distance[key[2]] = max(by_distance.get(key[2], 0.0), s)
            if s > tops.get(fam, (-1.0, x))[0]:
                tops[fam] = (s, x)
    if on_progress is not None:
        on_progress(search.used, budget)
    used_before = search.used
    starts = [(f"the best {fam} input", s, x) for fam, (s, x) in sorted(tops.items(), key=lambda kv: -kv[1][0])][:3]
    for r in range(max(1, 4 - len(starts))):
        x = _random_start(n, m, d, gen)
        s = float(search.score(x[None], [f"random start #{r}"], ["random"])[0])
        starts.append((f"random start #{r}", s, x))
    explore = (search.left() * 3) // 5  # each start its share; the rest refines the best input found
    for i, (label, s, x) in enumerate(starts):
        share = (explore - (search.used - used_before)) // (len(starts) - i)
        if share > 0:
            _local_search(search, x, s, share, gen, label)
    if search.left() > 0 and search.best >= 0.0:
        _local_search(search, search.best_x, search.best, search.left(), gen, "the best input so far")
    if on_progress is not None:
        on_progress(search.used, budget)
    return _finish(search, rule, n, f, d, seed, spec, by_distance, far)
