r"""The worst-input search behind :func:`phalanx.analysis.epsilon`: a certified lower bound on a rule's ε.

ε is a supremum over all inputs (Yang, Shi & Li, ICML 2025, Definition 2.2), so one input gives a lower bound and
only a search can approach it. The search has three phases, all scored by the rule itself (black box; a
coordinate-wise rule takes a whole batch in one call):

1. **Known constructions** (:func:`constructions`): per coordinate k equal values and n − k other equal values,
   k = 1 … ⌊n/2⌋ (the worst case of the trimmed mean and the median, Yang, Shi & Li, Section 3.4 / Eq. (10)), the
   same along one direction (vector rules), one far outlier, at the scales 1 and 10³; and, for a rule configured for
   f, the *selection* construction: one row, n − f − 2 rows around it (Krum's neighbourhood), f + 1 rows spread on
   the far side — the shape that the search found worst for Krum.
2. **Random inputs** from four families (Gaussian, heavy-tailed, two clusters, sparse), ``trials`` of them, seeded.
3. **CMA-ES restarts** (:mod:`phalanx.analysis.cmaes`): ``budget`` rule evaluations spread over restarts from the
   best construction, the best random input, adversarial starts (the selection construction with random radii, a
   perturbed two-cluster split) and random Gaussian inputs, with the population doubled at every round of starts
   (IPOP). A vector rule is searched in a 4-dimensional subspace and in all d dimensions, alternately (n points span
   at most n − 1 dimensions; fewer coordinates are easier to search); a coordinate-wise rule in one coordinate,
   repeated in every column (its ratio in d coordinates is a weighted average of the per-coordinate ratios, so one
   coordinate is its worst case). The last fifth of the budget refines the best input found.

Every candidate whose spread is below (10³·(n + d)·eps·max|x|)² scores 0: its ratio would measure rounding. The
search is deterministic given its seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from phalanx.analysis import cmaes
from phalanx.analysis.ratios import EPS, RESOLUTION, RuleCall

__all__ = ["Found", "constructions", "random_families", "search"]

BATCH = 256
"""Candidates scored per call of the batch scorer (constructions, random inputs)."""
REFINE_SHARE = 0.2
"""The share of the CMA-ES budget that refines the best input at the end."""
SUBSPACE = 4
"""The smaller dimension a vector rule is searched in (alternating with d)."""
FAMILY_SHARE = 0.5
"""The share of the budget spent on the selection construction's four parameters (vector rules, n ≥ 2f + 3)."""
FAMILY_PATIENCE = 20
"""Generations without progress after which a run over the construction's four parameters restarts."""
PATIENCE = 40
"""Generations without progress after which a CMA-ES run stops (the next start takes the budget)."""


def constructions(n: int, d: int, f: int | None = None) -> Iterator[tuple[str, Tensor]]:
    """The worst-case constructions the search tries first, each with its name (float64 ``(n, d)`` inputs): per
    coordinate k equal values and n − k other equal values (k = 1 … ⌊n/2⌋), the same along e₁, one far outlier, at
    the scales 1 and 10³; and with ``f`` (n ≥ 2f + 3) the selection construction (module docstring)."""
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
    if f is not None and n >= 2 * f + 3 and d >= 2:
        for twins in (True, False):
            for theta in ((2.0, 1.5, 5.0, 0.0), (2.0, 1.5, 5.0, 1.0)):
                yield (f"selection construction{' with twins' if twins else ''}, (a, b, L, r) = {theta}",
                       selection(torch.tensor([theta], dtype=torch.float64), n, f, d, twins)[0])


def simplex(m: int, dims: int) -> Tensor:
    """``(m, dims)`` unit vectors: the vertices of a regular simplex centred at 0 (every pair at the same distance)
    when m − 1 ≤ ``dims``, else the m equally spaced directions of a circle in the first two dimensions (on a line,
    ``dims`` = 1: ±1 alternately)."""
    if m == 1:
        return torch.zeros(1, dims, dtype=torch.float64)
    if dims == 1 and m > 2:
        return torch.tensor([[1.0 if i % 2 == 0 else -1.0] for i in range(m)], dtype=torch.float64)
    if m - 1 <= dims:
        v = torch.eye(m, dtype=torch.float64) - 1.0 / m  # centred vertices in the span orthogonal to 1
        basis = torch.linalg.eigh(v).eigenvectors[:, 1:]  # an orthonormal basis of that span (eigenvalue 1)
        pts = torch.zeros(m, dims, dtype=torch.float64)
        pts[:, : m - 1] = v @ basis
        return pts / pts.norm(dim=1, keepdim=True)
    ang = torch.arange(m, dtype=torch.float64) * (2 * math.pi / m)
    pts = torch.zeros(m, dims, dtype=torch.float64)
    pts[:, 0], pts[:, min(1, dims - 1)] = ang.cos(), ang.sin()
    return pts / pts.norm(dim=1, keepdim=True)


def selection(theta: Tensor, n: int, f: int, d: int, twins: bool = True) -> Tensor:
    """The selection construction for parameters ``theta`` ``(b, 4)`` = (a, b, L, r) → ``(b, n, d)`` inputs: one
    row at 0; its q = n − f − 2 neighbours at −a·e₁ + b·(the vertices of a regular simplex orthogonal to e₁), in
    pairs of twins (``twins``: ⌈q/2⌉ vertices) or one per vertex; f + 1 rows at −L·e₁ + r·(a regular simplex). Needs
    d ≥ 2; the four numbers are taken in absolute value."""
    a, b, big_l, r = theta.double().abs().T
    q = n - f - 2
    x = torch.zeros(theta.shape[0], n, d, dtype=torch.float64)
    near = simplex((q + 1) // 2 if twins else q, d - 1)
    if twins:
        near = near.repeat_interleave(2, dim=0)[:q]
    x[:, 1: 1 + q, 0] = -a[:, None]
    x[:, 1: 1 + q, 1:] = b[:, None, None] * near
    far = simplex(f + 1, d - 1).flip(1)  # in the other coordinates first, where there are enough
    x[:, 1 + q:, 0] = -big_l[:, None]
    x[:, 1 + q:, 1:] = r[:, None, None] * far
    return x


SELECTION_START = (2.0, 1.5, 5.0, 0.5)
"""(a, b, L, r) where the search of the selection construction's parameters starts."""


def random_families(gen: torch.Generator, n: int, d: int) -> list[tuple[str, Callable[[], Tensor]]]:
    """Four seeded families of random ``(n, d)`` inputs: Gaussian, heavy-tailed, two clusters, sparse."""

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


@dataclass
class Found:
    """The best input the search scored."""

    value: float
    """Its ratio, in float64 (the caller certifies it)."""
    x: Tensor
    name: str
    evaluations: int
    per_family: dict[str, float] = field(default_factory=dict)


class _Scorer:
    def __init__(self, call: RuleCall, n: int, d: int) -> None:
        self.call, self.n, self.d = call, n, d
        self.found = Found(-1.0, torch.zeros(n, d, dtype=torch.float64), "none", 0)

    def ratios(self, xb: Tensor) -> Tensor:
        """The ratio of every candidate of a ``(b, n, d)`` batch (0 below the spread floor, +inf for a non-finite
        output)."""
        outs = self.call.batch(xb)
        mean = xb.mean(dim=1)
        spread = (xb - mean[:, None]).square().sum(dim=2).mean(dim=1)
        err = (outs - mean).square().sum(dim=1)
        floor = (RESOLUTION * (self.n + self.d) * EPS * xb.abs().flatten(1).amax(dim=1)).square()
        r = torch.where(spread >= floor, err / spread.clamp_min(1e-300), torch.zeros((), dtype=err.dtype))
        r = torch.where(torch.isfinite(outs).all(dim=1), r, torch.full((), math.inf, dtype=r.dtype))
        r = torch.nan_to_num(r, nan=math.inf)
        # an input that is not finite is no input of the definition: never scored (its NaN output is not the rule's)
        return torch.where(torch.isfinite(xb).flatten(1).all(dim=1), r, torch.zeros((), dtype=r.dtype))

    def score(self, xb: Tensor, name: str | list[str], family: str) -> Tensor:
        scores = torch.cat([self.ratios(xb[lo: lo + BATCH]) for lo in range(0, xb.shape[0], BATCH)])
        self.found.evaluations += xb.shape[0]
        top = int(scores.argmax())
        v = float(scores[top])
        self.found.per_family[family] = max(self.found.per_family.get(family, 0.0), v)
        if v > self.found.value * (1 + 1e-12) + 1e-300:
            self.found.value, self.found.x = v, xb[top].clone()
            self.found.name = name if isinstance(name, str) else name[top]
        return scores


def _embed(z: Tensor, d: int, columnwise: bool) -> Tensor:
    """``(b, n, k)`` search coordinates → ``(b, n, d)`` inputs: repeated in every column (coordinate-wise rules) or
    padded with zeros."""
    b, n, k = z.shape
    if columnwise:
        return z[:, :, :1].expand(b, n, d).clone()
    if k == d:
        return z
    return torch.cat([z, torch.zeros(b, n, d - k, dtype=z.dtype)], dim=2)


def _scale(x: Tensor) -> float:
    s = float((x - x.mean(dim=0)).square().sum(dim=1).mean().sqrt())
    return s if s > 0 and math.isfinite(s) else max(1.0, float(x.abs().max()))


def search(rule_call: RuleCall, n: int, f: int, d: int, trials: int, budget: int, seed: int) -> Found:
    """Run the three phases (module docstring) on the rule behind ``rule_call`` and return the best input found."""
    scorer = _Scorer(rule_call, n, d)
    built = list(constructions(n, d, f))
    tops: dict[str, tuple[float, Tensor]] = {}
    for lo in range(0, len(built), BATCH):
        chunk = built[lo: lo + BATCH]
        xb = torch.stack([x for _, x in chunk])
        scores = scorer.score(xb, [name for name, _ in chunk], "constructions")
        _keep(tops, "construction", scores, xb)
    gen = torch.Generator().manual_seed(seed)
    families = random_families(gen, n, d)
    for t in range(trials):
        fam, draw = families[t % len(families)]
        x = draw()
        _keep(tops, "random input", scorer.score(x[None], f"random {fam} #{t}", fam), x[None])
    if budget > 0 and n >= 2 * f + 3 and d >= 2 and not rule_call.columnwise:
        _family(scorer, n, f, d, int(FAMILY_SHARE * budget), gen, tops)
    left = budget - (scorer.found.evaluations - len(built) - trials)
    if left > 0:
        _restarts(scorer, n, d, left, gen, tops)
    return scorer.found


def _keep(tops: dict[str, tuple[float, Tensor]], key: str, scores: Tensor, xb: Tensor) -> None:
    top = int(scores.argmax())
    if float(scores[top]) > tops.get(key, (-1.0, xb[top]))[0]:
        tops[key] = (float(scores[top]), xb[top].clone())


def _family(scorer: _Scorer, n: int, f: int, d: int, budget: int, gen: torch.Generator,
            tops: dict[str, tuple[float, Tensor]]) -> None:
    """The selection construction's four parameters: a quarter of ``budget`` on random parameters (half with twins,
    half without, :data:`SELECTION_START` first), then CMA-ES from the best of them — the best with twins, the best
    without, the second best with twins, … — each run until it stops (no progress for :data:`FAMILY_PATIENCE`
    generations), until the budget is spent."""
    low = torch.tensor([0.5, 0.5, 1.0, 0.0], dtype=torch.float64)
    width = torch.tensor([3.0, 3.0, 9.0, 2.0], dtype=torch.float64)
    draws = max(2, budget // 4)
    thetas = low + torch.rand(draws, 4, generator=gen, dtype=torch.float64) * width
    lists: list[list[tuple[float, Tensor, bool]]] = []
    for twins in (True, False):
        part = thetas[int(not twins):: 2]
        part[0] = torch.tensor(SELECTION_START, dtype=torch.float64)
        xb = selection(part, n, f, d, twins)
        scores = scorer.score(xb, f"the selection construction{' with twins' if twins else ''} (random parameters)",
                              "selection construction")
        _keep(tops, "selection construction", scores, xb)
        lists.append(sorted(((float(v), t, twins) for v, t in zip(scores, part)), key=lambda item: -item[0]))
    ranked = [item for pair in zip(*lists) for item in pair]  # the best with twins, the best without, …
    budget -= draws
    for _, start, twins in ranked:
        if budget < cmaes.default_popsize(4):
            break
        label = f"CMA-ES over the selection construction's (a, b, L, r){' with twins' if twins else ''}"

        def score(ts: Tensor, twins: bool = twins, label: str = label) -> Tensor:
            xb = selection(ts, n, f, d, twins)
            scores = scorer.score(xb, label, "selection construction")
            _keep(tops, "selection construction", scores, xb)
            return scores

        budget -= cmaes.maximise(score, start, 0.3 * float(start.abs().max()), budget, gen,
                                 patience=FAMILY_PATIENCE).evaluations


def _starts(n: int, d: int, gen: torch.Generator, tops: dict[str, tuple[float, Tensor]],
            round_: int) -> list[tuple[str, Tensor]]:
    """One round of CMA-ES starts: the best input of each earlier phase (first round only), a perturbed split and a
    random Gaussian input."""
    out = [(f"the best {k}", x) for k, (_, x) in sorted(tops.items(), key=lambda kv: -kv[1][0])] if round_ == 0 else []
    k = int(torch.randint(1, n // 2 + 1, (1,), generator=gen))
    split = 0.1 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    split[:k] += 1.0
    out.append((f"a perturbed split ({k} rows at 1)", split))
    out.append(("a random Gaussian input", torch.randn(n, d, generator=gen, dtype=torch.float64)))
    return out


def _restarts(scorer: _Scorer, n: int, d: int, budget: int, gen: torch.Generator,
              tops: dict[str, tuple[float, Tensor]]) -> None:
    """CMA-ES runs one after the other, each with what is left of the exploration budget until it stops on its own
    (its step collapsed, or no progress for :data:`PATIENCE` generations); the population doubles at every round of
    starts; the last :data:`REFINE_SHARE` of the budget refines the best input."""
    columnwise = scorer.call.columnwise
    dims = [1] if columnwise else sorted({min(SUBSPACE, d), d}, reverse=True)
    stop = scorer.found.evaluations + budget
    explore = stop - int(REFINE_SHARE * budget)
    round_, runs = 0, 0
    while scorer.found.evaluations < explore:
        before = scorer.found.evaluations
        for label, x in _starts(n, d, gen, tops, round_):
            left = explore - scorer.found.evaluations
            if left <= 0:
                break
            k = dims[runs % len(dims)]
            runs += 1
            _cma(scorer, x, k, d, left, gen, f"CMA-ES ({k}-d) from {label}", 0.3, 2**round_)
        round_ += 1
        if scorer.found.evaluations == before:  # what is left is below one population: refine instead
            break
    left = stop - scorer.found.evaluations
    if left > 0 and scorer.found.value >= 0:
        k = 1 if columnwise else d
        _cma(scorer, scorer.found.x, k, d, left, gen, "CMA-ES refining the best input", 0.05, 1)


def _cma(scorer: _Scorer, x: Tensor, k: int, d: int, budget: int, gen: torch.Generator, label: str,
         step: float, growth: int) -> None:
    columnwise = scorer.call.columnwise
    z0 = x[:, :k].clone()
    popsize = cmaes.default_popsize(z0.numel()) * growth

    def score(zb: Tensor) -> Tensor:
        return scorer.score(_embed(zb, d, columnwise), label, "search")

    if budget >= popsize:
        cmaes.maximise(score, z0, step * _scale(z0), budget, gen, popsize=popsize, patience=PATIENCE)
