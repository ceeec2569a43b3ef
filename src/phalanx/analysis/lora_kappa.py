"""Measured (f, κ) of a rule in each LoRA aggregation mode, in the space of the layers' updates ΔW: a certified lower
bound beside what can be proven from the rule's own κ.

κ is Allouah et al.'s (AISTATS 2023) coefficient (:mod:`phalanx.analysis.kappa`): F is (f, κ)-robust when for every
input and every set S of n − f rows ‖F(x) − x̄_S‖² ≤ κ·(1/|S|) Σ_{i∈S} ‖xᵢ − x̄_S‖². Here the clients send LoRA factors
(:mod:`phalanx.aggregators.lora`) and the ratio is taken where the model moves: on the concatenation over adapted
layers of client i's update ΔWᵢ = BᵢAᵢ − BA and of the update the aggregate applies. One input gives a lower bound;
the search varies the clients' factor rows, and the best input is recomputed through the wrapped rule and its ratio
in rational arithmetic from the float64 ΔW rows and aggregate (:func:`~phalanx.analysis.ratios.exact_ratio`), so a
real input attains the reported value. It is **a measured lower bound**, never the value.

What is proven, per mode (``proven`` of :class:`ModeKappa`):

* ``shared`` (FFA-LoRA, Sun et al., ICLR 2024): the rows are ΔBᵢ, A is frozen with A Aᵀ = c²I, so ΔWᵢ = ΔBᵢA and
  the aggregate's ΔW* = F(ΔB)A. B ↦ BA is c times an isometry (‖ΔB A‖_F² = tr(ΔB A Aᵀ ΔBᵀ) = c²‖ΔB‖_F²), so with one
  c for every layer both sides of the inequality scale by c² and **κ carries over**: proven κ_F. The setting here
  has that (every A is two Hadamard rows, c = 1, and no head). A real model need not: ``phalanx.models.hf`` scales
  each layer's A by its own c_l, the layer applies (α/r)·ΔB A, and the head's coordinates (in the same rule call)
  are their own update (c = 1) — the map from the rule's rows to the updates is then *block-wise* scaled, c_b times
  an isometry on block b, and :func:`shared_bound` gives what carries over (:func:`shared_scales` reads the c_b of
  a model).

**Block-wise scaling** (Phalanx's own statement and proof, not a paper's). Let T map a row x = (x¹, …, x^L) to
(T₁x¹, …, T_Lx^L) with ‖T_b v‖ = c_b‖v‖ (c_b > 0) for every v, T linear — mode ``shared``'s map from B and the head
to the layers' updates and the head's. Write spread_S(x) = (1/|S|)Σ_{i∈S}‖xᵢ − x̄_S‖²; T commutes with the mean, so
spread_S(Tx) = Σ_b c_b² spread_S(xᵇ) and ‖T F(x) − mean_S Tx‖² = Σ_b c_b²‖Fᵇ(x) − x̄ᵇ_S‖².

1. *Any rule* that is (f, κ_F)-robust on the rows is (f, κ_F·c_max²/c_min²)-robust on the updates:
   Σ_b c_b²‖Fᵇ − x̄ᵇ_S‖² ≤ c_max²‖F − x̄_S‖² ≤ c_max² κ_F spread_S(x) ≤ (c_max²/c_min²) κ_F spread_S(Tx). The
   factor is needed for distance-based rules: Krum (and Multi-Krum, the geometric median …) compares rows by
   distances that weigh the blocks 1 : 1, while the updates weigh them c_b² — with c = (1, 3), honest rows on a
   regular simplex in block 1 and equal in block 2, and f = 2 equal Byzantine rows at the honest mean in block 1
   and δ off in block 2 (δ² < 2ρ², ρ the honest rows' distance to their mean), Krum picks a Byzantine row and the
   ratio on the updates is 9δ²/ρ², above Krum's κ_F = 10 at n = 7 for δ² > 10ρ²/9
   (``tests/test_lora_kappa.py::test_shared_mode_with_blockwise_scales_carries_kappa_times_the_scale_ratio``).
2. *A rule whose inequality holds block by block* — ‖Fᵇ(x) − x̄ᵇ_S‖² ≤ κ_F spread_S(xᵇ) for every block b with the
   same S, as for coordinate-wise rules whose κ is proven coordinate by coordinate (the trimmed mean and the median
   of Allouah et al., AISTATS 2023, Prop. 2 and 3: their proofs bound each coordinate and sum) — keeps κ_F:
   multiply block b's inequality by c_b² and sum.

The same holds for ε with S = every row.
* ``update`` before the truncation (FlexLoRA, Bai et al., NeurIPS 2024): the rule acts on each layer's rows ΔWᵢ, so
  each block obeys ‖ΔW*_l − mean_S ΔW_l‖² ≤ κ_F·spread_S(ΔW_l) with one S for all blocks; summing over the blocks
  gives the same inequality on the concatenation: proven κ_F (for every rule, Krum included: the definition holds per
  block whatever rows it selects there).
* ``update`` after the truncation (the update applied, B′A′ − BA with B′A′ = M_r the best rank-r approximation of
  M = BA + ΔW*, Eckart & Young 1936): per layer, for every honest j, BⱼAⱼ has rank ≤ r, so
  ‖M − M_r‖ ≤ ‖M − BⱼAⱼ‖ ≤ ‖ΔW* − mean_S ΔW‖ + ‖ΔWⱼ − mean_S ΔW‖; the j closest to the mean has
  ‖ΔWⱼ − mean_S ΔW‖² ≤ spread. With ‖ΔW* − mean_S ΔW‖² ≤ κ_F·spread, the applied update is within
  (2√κ_F + 1)·√spread of the honest mean: proven (1 + 2√κ_F)² per layer, hence on the concatenation.
* ``factors`` (FedIT): the rule's κ holds on the factor rows, not on the updates. Nothing is proven in ΔW space, and
  nothing can be: clients sending the factors (P, Q) and (−P, −Q) — or (sP, Q/s) — all make the *same* update (zero
  honest spread) while a coordinate-wise rule on the factors returns (λP, μQ) with λμ ≠ 1 and Krum can be made to pick
  a Byzantine row near one of them with another product: a positive error over a zero spread, κ = +∞
  (:func:`factor_constructions`, certified exactly: every number in it is dyadic, so the products are exact).

ε (Yang, Shi & Li, ICML 2025, Definition 2.2: the same ratio with S = every row, the error with no attack) is
measured the same way (``quantity="epsilon"``), and every argument above carries over with S = all rows (the
truncation's j is any row, each a client's own rank-r product): ε_F (the rule's ε, else its κ by their Theorem 3.2)
in ``shared`` and ``update``, (1 + 2√ε_F)² after the truncation, +∞ in ``factors`` (the ``sign`` construction: all
rows make one update).

A value above the proven bound by more than the rounding of the computation (:func:`slack`) is flagged
``above_proven``: a bug of the wrapper, the rule or the argument (the mutant wrapper that ignores f is caught so);
so is an infinite value where a bound is proven (a NaN output gave value = slack = ∞, and ∞ > bound + ∞ is False:
the κ search had the same hole). The line's far points lie on both sides, as the κ search's do.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.aggregators.lora import AdapterUpdates, LoraLayout, updates_of
from phalanx.analysis.kappa import FAR, NEAR, _local_search, line_splits, universal_lower_bound
from phalanx.analysis.ratios import EPS, RESOLUTION, ROUNDING, RuleCall, round_down
from phalanx.errors import ConfigError
from phalanx.validate import check_int

__all__ = ["MEASURED_MODES", "QUANTITIES", "ModeKappa", "factor_constructions", "lora_kappa", "proven", "setting",
           "shared_bound", "shared_scales",
           "table"]

MEASURED_MODES = ("factors", "update", "update-truncated", "shared")
"""The rows of the table: ``update`` is the rule's aggregate ΔW* before the rank-r truncation, ``update-truncated``
the update the server applies after it."""
LAYERS = ((3, 4), (5, 4))
"""(d_out, d_in) of the adapted layers of the small layout (d_in = 4: A's rows can be Hadamard rows, exact)."""
RANK = 2
QUANTITIES = ("kappa", "epsilon")
"""κ: the ratio's worst set S of n − f rows (Allouah et al.); ε: S = every row (Yang, Shi & Li, ICML 2025, Definition
2.2 — the no-attack error; the same arguments carry it over, with S = all rows)."""
_HADAMARD = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, -1.0]], dtype=torch.float64) / 2
"""Two orthonormal rows of the 4 × 4 Hadamard matrix over 2: mode ``shared``'s frozen A (c = 1, every entry dyadic)."""


@dataclass(frozen=True)
class Setting:
    """The small adapter layout, the current global factors θ (dyadic: k/4 with |k| ≤ 4) and mode ``shared``'s A."""

    layout: LoraLayout
    theta: Tensor
    shared_a: Tensor


def setting(seed: int = 0) -> Setting:
    """Two adapted layers (:data:`LAYERS`) of rank :data:`RANK`, θ drawn from ``seed``."""
    names, shapes = [], []
    for i, (d_out, d_in) in enumerate(LAYERS):
        names += [f"layer{i}.lora_A.default.weight", f"layer{i}.lora_B.default.weight"]
        shapes += [(RANK, d_in), (d_out, RANK)]
    layout = LoraLayout.of(names, shapes)
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randint(-4, 5, (layout.dim,), generator=gen).double() / 4
    return Setting(layout, theta, _HADAMARD.clone())


def proven(rule: Aggregator, mode: str, n: int, quantity: str = "kappa") -> float | None:
    """The κ (or ε) in ΔW space proven from the rule's own κ_F (ε_F, else κ_F: Yang, Shi & Li, ICML 2025, Theorem
    3.2) at ``n`` (module docstring): that constant for ``shared`` and ``update``, (1 + 2√·)² of it for
    ``update-truncated``, None for ``factors`` (none exists) or a rule with none proven."""
    if mode not in MEASURED_MODES:
        raise ConfigError("mode", mode, ", ".join(MEASURED_MODES))
    if quantity not in QUANTITIES:
        raise ConfigError("quantity", quantity, ", ".join(QUANTITIES))
    own = rule.kappa(n) if quantity == "kappa" else rule.epsilon(n)
    if own is None and quantity == "epsilon":
        own = rule.kappa(n)
    if own is None or mode == "factors":
        return None
    return (1.0 + 2.0 * math.sqrt(own)) ** 2 if mode == "update-truncated" else float(own)


def shared_bound(own: float, scales: Sequence[float], blockwise: bool) -> float:
    """The κ (or ε) on the updates in mode ``shared`` from the rule's own ``own`` when the map from the rule's rows
    to the updates is c_b times an isometry on block b (``scales``: the c_b > 0; module docstring, "Block-wise
    scaling", Phalanx's own statement): ``own`` for a rule whose inequality holds block by block (``blockwise``:
    coordinate-wise rules proven coordinate by coordinate), else ``own``·max c_b²/min c_b²."""
    cs = [float(c) for c in scales]
    if not cs or not all(math.isfinite(c) and c > 0 for c in cs):
        raise ConfigError("scales", cs, "one or more finite numbers > 0")
    return float(own) if blockwise else float(own) * (max(cs) / min(cs)) ** 2


def shared_scales(model: torch.nn.Module) -> dict[str, float]:
    """The c_b of a model in mode ``shared`` (``phalanx.models.hf``), per trainable tensor: a layer's B gets
    (α/r)·c_l, c_l² the mean of A Aᵀ's diagonal (A Aᵀ = c_l² I: ‖(α/r)ΔB A‖_F = (α/r)c_l‖ΔB‖_F); every other trainable
    tensor (the head) 1 — its coordinates are their own update."""
    modules = dict(model.named_modules())
    out: dict[str, float] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if ".lora_B." not in name:
            out[name] = 1.0
            continue
        layer, _, rest = name.partition(".lora_B.")
        adapter = rest.split(".")[0]
        module = modules[layer]
        a = module.lora_A[adapter].weight.detach().double()
        scaling = float(module.scaling[adapter])
        out[name] = scaling * math.sqrt(float((a @ a.T).diagonal().mean()))
    return out


def _wrapped(rule: Aggregator, mode: str, s: Setting) -> Aggregator:
    return AdapterUpdates(rule, s.layout) if mode.startswith("update") else rule


Updates = Callable[[Tensor], tuple[Tensor, Tensor]]
"""Client rows (n, d) ↦ (their updates ΔWᵢ concatenated over layers (n, D), the aggregate's update (D,)), float64."""


def _updates(wrapper: Aggregator, mode: str, s: Setting, seed: int) -> tuple[Updates, int]:
    """The map of a mode, and the width d of the client rows: factor rows (A and B) except in ``shared`` (B only)."""
    lay, theta = s.layout, s.theta
    if mode == "shared":
        a = s.shared_a
        widths = [d_out * RANK for d_out, _ in LAYERS]
        call = RuleCall(wrapper, seed)

        def shared(x: Tensor) -> tuple[Tensor, Tensor]:
            agg = call(x).double()
            rows, out, lo = [], [], 0
            for (d_out, _), w in zip(LAYERS, widths):
                rows.append((-x[:, lo: lo + w].reshape(-1, d_out, RANK) @ a).flatten(1))
                out.append((-agg[lo: lo + w].reshape(d_out, RANK) @ a).flatten())
                lo += w
            return torch.cat(rows, 1), torch.cat(out)

        return shared, sum(widths)

    def deltas(x: Tensor) -> Tensor:
        return torch.cat([updates_of(x, theta, blk) for blk in lay.blocks], 1)

    if mode == "update":
        inner = wrapper.rule if isinstance(wrapper, AdapterUpdates) else wrapper
        call = RuleCall(inner, seed)

        def update(x: Tensor) -> tuple[Tensor, Tensor]:  # the rule per block, as AdapterUpdates applies it
            return deltas(x), torch.cat([call(updates_of(x, theta, blk)).double() for blk in lay.blocks])

        return update, lay.dim
    if mode == "update-truncated":
        def truncated(x: Tensor) -> tuple[Tensor, Tensor]:
            ctx = {"generator": torch.Generator().manual_seed(seed)} if "generator" in wrapper.context_keys else {}
            return deltas(x), deltas(wrapper(x, theta=theta, **ctx).double()[None])[0]

        return truncated, lay.dim
    call = RuleCall(wrapper, seed)
    return (lambda x: (deltas(x), deltas(call(x).double()[None])[0])), lay.dim


def factor_constructions(n: int, f: int, s: Setting, gen: torch.Generator) -> Iterator[tuple[str, Tensor]]:
    """Client factor rows (θ − factors, the pseudo-gradient convention) whose updates are all one ΔW: the honest rows
    hold the factors ±(P, Q) (``sign``) or (2ᵏP, Q/2ᵏ) (``scale``), the Byzantine rows one of these or one honest row
    nudged by δ (for Krum: a tight pair near an honest row wins its score). Every number is dyadic and small, so
    every product, and a zero spread, is exact."""
    m = n - f
    lay = s.layout
    p = torch.randint(-4, 5, (lay.dim,), generator=gen).double() / 4

    def rows(factors: list[Tensor]) -> Tensor:
        return s.theta - torch.stack(factors)

    def scaled(v: Tensor, k: int) -> Tensor:
        out = v.clone()
        for blk in lay.blocks:
            out[blk.a: blk.a + blk.rank * blk.d_in] *= 2.0 ** (-k)
            out[blk.b: blk.b + blk.d_out * blk.rank] *= 2.0**k
        return out

    for byz in (1.0, -1.0):
        plus = (m + 1) // 2
        yield (f"sign: {plus} honest at (P, Q), {m - plus} at (−P, −Q), Byzantine at {byz:+g}·(P, Q)",
               rows([p] * plus + [-p] * (m - plus) + [byz * p] * f))
    honest = [scaled(p, k - m // 2) for k in range(m)]
    for j in range(m):
        for e in (-6, -3, 0):
            nudge = torch.randint(-1, 2, (lay.dim,), generator=gen).double() * 2.0**e
            yield (f"scale: honest at (2ᵏP, Q/2ᵏ), Byzantine at honest #{j} + δ, δ in {{0, ±2^{e}}}",
                   rows(honest + [honest[j] + nudge] * f))


def _line(n: int, m: int, d: int, u: Tensor, label: str) -> Iterator[tuple[str, Tensor]]:
    for k in line_splits(n, m):
        for t in (*NEAR, *FAR, *(-t for t in FAR)) if m < n else (0.0,):  # far points on both sides (as kappa's)
            x = torch.zeros(n, d, dtype=torch.float64)
            x[:k] = u
            x[m:] = t * u
            yield f"line along {label}: {k} honest at u, {m - k} at 0, Byzantine at {t:g}·u", x


def _b_direction(s: Setting, mode: str, d: int, gen: torch.Generator) -> Tensor:
    """A dyadic direction moving only B (ΔW is then linear in it: the line of :mod:`phalanx.analysis.kappa` carries
    over to ΔW space)."""
    u = torch.zeros(d, dtype=torch.float64)
    if mode == "shared":
        u = torch.randint(-2, 3, (d,), generator=gen).double() / 2
        u[0] = 1.0  # never the zero direction
        return u
    for blk in s.layout.blocks:
        w = blk.d_out * blk.rank
        u[blk.b: blk.b + w] = torch.randint(-2, 3, (w,), generator=gen).double() / 2
    return u


class _ModeSearch:
    """Scores client rows by their largest ratio in ΔW space over every set S of n − f rows (the duck type
    :func:`phalanx.analysis.kappa._local_search` drives)."""

    def __init__(self, updates: Updates, n: int, f: int, d: int, budget: int, base: float,
                 sets: list[tuple[int, ...]]) -> None:
        self.updates, self.n, self.m, self.d, self.budget, self.base = updates, n, n - f, d, budget, base
        self.sets = torch.tensor(sets, dtype=torch.long)
        self.used = 0
        self.best = -1.0
        self.best_x = torch.zeros(n, d, dtype=torch.float64)
        self.best_name = "none"

    def left(self) -> int:
        return self.budget - self.used

    def ratio(self, x: Tensor) -> tuple[float, int]:
        rows, agg = self.updates(x)
        if not bool(torch.isfinite(agg).all()):
            return math.inf, 0
        h = rows[self.sets]  # (c, m, D)
        mean = h.mean(dim=1)
        spread = (h - mean[:, None]).square().sum(dim=2).mean(dim=1)
        err = (agg - mean).square().sum(dim=1)
        floor = _floor(rows, x, self.base)
        r = torch.where(spread >= floor, err / spread.clamp_min(1e-300),
                        torch.where(err > floor, math.inf, 0.0).double())
        top = int(r.argmax())
        return float(r[top]), top

    def score(self, xb: Tensor, names: list[str], families: list[str]) -> Tensor:
        scores = torch.full((xb.shape[0],), -1.0, dtype=torch.float64)
        for i in range(min(xb.shape[0], self.left())):
            v, _ = self.ratio(xb[i])
            self.used += 1
            scores[i] = v
            if v > self.best * (1 + 1e-12) + 1e-300:
                self.best, self.best_x, self.best_name = v, xb[i].clone(), names[i]
        return scores


def _floor(rows: Tensor, x: Tensor, base: float) -> float:
    """A spread below this (RESOLUTION·(n + D)·eps·scale)² is rounding, not the rule's (ratios.spread_floor); the
    scale counts the rows, the client factors and ``base`` = max|BA| (the SVD of BA + ΔW* rounds at its scale)."""
    n, dim = rows.shape
    scale = max(float(rows.abs().max()), float(x.abs().max()), base, 1e-300)
    return (RESOLUTION * (n + dim) * EPS * scale) ** 2


def slack(agg: Tensor, rows: Tensor, honest: tuple[int, ...], value: float, scale: float) -> float:
    """How far float64 rounding can move the ratio (as :func:`phalanx.analysis.ratios.rounding_slack`, with the
    products and SVDs' scale ``scale`` ≥ max|ΔW|, max|BA|)."""
    n, dim = rows.shape
    h = rows[list(honest)]
    mean = h.mean(dim=0)
    spread = float((h - mean).square().sum(dim=1).mean())
    err = float((agg - mean).square().sum())
    if spread <= 0.0 or not math.isfinite(err):
        return math.inf
    delta = ROUNDING * (n + dim) * EPS * scale
    own = ROUNDING * (n + dim) * EPS * value
    return (2.0 * math.sqrt(err) * delta * math.sqrt(dim) + dim * delta * delta) / spread + own


@dataclass
class ModeKappa:
    """Result of :func:`lora_kappa`."""

    rule: str
    mode: str
    quantity: str
    n: int
    f: int
    value: float
    """The certified lower bound on κ in ΔW space (+inf: a positive error over an exactly zero honest spread, or a
    non-finite aggregate)."""
    construction: str
    input: Tensor
    honest: tuple[int, ...]
    proven: float | None
    lower_bound: float
    """f/(n − 2f) for κ, f/(n − f) for ε: no (f, κ)-robust rule does better (on any space)."""
    slack: float
    above_proven: bool
    evaluations: int

    @property
    def verdict(self) -> str:
        """``BUG: above the proven bound``, ``unbounded`` or ``certified``."""
        if self.above_proven:
            return "BUG: above the proven bound"
        return "unbounded" if math.isinf(self.value) else "certified"


def _base(s: Setting, mode: str) -> float:
    """max|BA| over the layers of θ (0 in ``shared``: there the map is linear in the rows)."""
    if mode == "shared":
        return 0.0
    return max(float((b @ a).abs().max()) for b, a in (s.layout.factors(s.theta, blk) for blk in s.layout.blocks))


def _certify(updates: Updates, x: Tensor, sets: list[tuple[int, ...]], base: float
             ) -> tuple[float, tuple[int, ...], float]:
    """The exact ratio at ``x`` (rows and aggregate recomputed through the wrapped rule), its set S and slack."""
    rows, agg = updates(x)
    scale = max(float(rows.abs().max()), float(x.abs().max()), base, 1e-300)
    if not bool(torch.isfinite(agg).all()):
        return math.inf, sets[0], math.inf
    best: tuple[Fraction | float, tuple[int, ...]] = (Fraction(0), sets[0])
    floor = _floor(rows, x, base)
    out = [Fraction(v) for v in agg.tolist()]
    for hs in sets:
        pts = [[Fraction(v) for v in rows[i].tolist()] for i in hs]
        mean = [sum(col, Fraction(0)) / len(pts) for col in zip(*pts)]
        spread = sum((sum(((a - b) ** 2 for a, b in zip(r, mean)), Fraction(0)) for r in pts), Fraction(0)) / len(pts)
        err = sum(((a - b) ** 2 for a, b in zip(out, mean)), Fraction(0))
        if spread == 0 or float(spread) < floor:
            q: Fraction | float = math.inf if float(err) > floor else Fraction(0)
        else:
            q = err / spread
        if q > best[0]:
            best = (q, hs)
    value = best[0] if isinstance(best[0], float) else round_down(best[0])
    return value, best[1], slack(agg, rows, best[1], value, scale) if math.isfinite(value) else 0.0


def lora_kappa(rule: Aggregator, mode: str, n: int = 7, budget: int = 400, seed: int = 0,
               wrapper: Aggregator | None = None, quantity: str = "kappa") -> ModeKappa:
    """A certified lower bound on the κ of ``rule`` (its f) wrapped for LoRA ``mode`` (:data:`MEASURED_MODES`), in
    the space of the layers' updates, on ``n`` clients and the small layout of :func:`setting`, with ``budget``
    evaluations: the structured inputs (:func:`factor_constructions` outside ``shared``, then the κ search's line
    along a B-only direction and along e₁), then the κ search's local search from the best ones.
    ``wrapper`` replaces the mode's wrapper (``AdapterUpdates(rule, layout)`` in ``update``, the rule otherwise) —
    for the mutants; the proven bound is still the one of ``rule``. ``quantity="epsilon"`` measures ε instead (the
    ratio at S = every row; lower bound f/(n − f), Theorem 3.1 of Yang, Shi & Li). Bad settings are one-line
    ConfigErrors before anything is built."""
    if mode not in MEASURED_MODES:
        raise ConfigError("mode", mode, ", ".join(MEASURED_MODES))
    if quantity not in QUANTITIES:
        raise ConfigError("quantity", quantity, ", ".join(QUANTITIES))
    check_int("n", n, low=1, high=12)
    check_int("budget", budget, low=1, high=100_000)
    check_int("seed", seed)
    f = rule.f
    if 2 * f >= n or n < rule.min_workers():
        raise ConfigError("n", n, f"n > 2f = {2 * f} and n >= {rule.min_workers()} ({rule.requirement})")
    s = setting(seed)
    updates, d = _updates(wrapper if wrapper is not None else _wrapped(rule, mode, s), mode, s, seed)
    base = _base(s, mode)
    sets = [tuple(range(n))] if quantity == "epsilon" else list(itertools.combinations(range(n), n - f))
    search = _ModeSearch(updates, n, f, d, budget, base, sets)
    gen = torch.Generator().manual_seed(seed)
    m = n - f
    e1 = torch.zeros(d, dtype=torch.float64)
    e1[0] = 1.0
    built: Iterator[tuple[str, Tensor]] = itertools.chain(
        factor_constructions(n, f, s, gen) if mode != "shared" else iter(()),
        _line(n, m, d, _b_direction(s, mode, d, gen), "a B-only direction"), _line(n, m, d, e1, "e₁"))
    tops: list[tuple[float, str, Tensor]] = []
    for name, x in built:
        if search.left() <= 0:
            break
        v = float(search.score(x[None], [name], ["structured"])[0])
        tops.append((v, name, x))
    tops.sort(key=lambda t: -t[0] if not math.isnan(t[0]) else 0.0)
    if search.left() > 0 and math.isfinite(search.best):
        share = search.left() // 3
        for v, name, x in tops[:2]:
            _local_search(search, x, v, share, gen, name)  # type: ignore[arg-type]
        _local_search(search, search.best_x, search.best, search.left(), gen, "the best input so far")  # type: ignore[arg-type]
    value, honest, sl = _certify(updates, search.best_x, sets, base)
    bound = proven(rule, mode, n, quantity)
    floor = universal_lower_bound(n, f) if quantity == "kappa" else f / (n - f)
    return ModeKappa(
        rule=getattr(rule, "spec", rule.name), mode=mode, quantity=quantity, n=n, f=f, value=value,
        construction=search.best_name, input=search.best_x.clone(), honest=honest, proven=bound, lower_bound=floor,
        slack=sl, above_proven=bound is not None and (not math.isfinite(value) or value > bound + sl),
        evaluations=search.used)


def table(rules: list[Aggregator], n: int = 7, budget: int = 400, seed: int = 0, quantity: str = "kappa"
          ) -> list[ModeKappa]:
    """:func:`lora_kappa` of every rule in every mode."""
    return [lora_kappa(r, mode, n, budget, seed, quantity=quantity) for r in rules for mode in MEASURED_MODES]
