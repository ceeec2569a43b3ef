r"""Where gradient descent with an ε-accurate rule stalls when nobody attacks: the bounds and their exact tightness.

Setting (docs/tension.md, "Convergence with no attack"). n honest workers hold objectives :math:`F_i`;
:math:`F = \frac1n\sum_i F_i` is L-smooth and :math:`F^* = \inf F`. The heterogeneity at w is

.. math:: \zeta^2(w) = \frac1n \sum_i \|\nabla F_i(w) - \nabla F(w)\|^2, \qquad \zeta^2 = \sup_w \zeta^2(w).

Gradient descent with a rule, :math:`w_{t+1} = w_t - \eta\, \mathrm{Agg}(\nabla F_1(w_t), \dots, \nabla F_n(w_t))`.
If the rule is ε-accurate (Yang, Shi & Li, ICML 2025, Definition 2.2) the aggregate is the true gradient plus a
bias :math:`e_t` with :math:`\|e_t\|^2 \le \varepsilon\, \zeta^2(w_t)`. The standard descent-lemma analysis of GD
with a biased gradient (η = 1/L) gives

.. math:: F(w_{t+1}) \le F(w_t) - \tfrac{1}{2L}\|\nabla F(w_t)\|^2 + \tfrac{1}{2L}\varepsilon\zeta^2,

hence (non-convex) :math:`\min_{t<T}\|\nabla F(w_t)\|^2 \le 2L(F(w_0) - F^*)/T + \varepsilon\zeta^2` and, when F is
μ-PL (:math:`\|\nabla F\|^2 \ge 2\mu(F - F^*)`),
:math:`F(w_T) - F^* \le (1 - \mu/L)^T (F(w_0) - F^*) + (1 - (1-\mu/L)^T)\,\varepsilon\zeta^2/(2\mu)`
(:func:`pl_upper`, :func:`nonconvex_upper`). Yang, Shi & Li prove lower bounds of this order for both classes
(their convergence theorems; the text of the paper consulted for this module — its abstract — does not give their
statements and constants, so the constants here are this derivation's, and docs/tension.md says so).

**Tightness, exactly** (:func:`construct`). Take :math:`F_i(w) = \frac\mu2\|w + x_i\|^2` (so L = μ) with
:math:`x` a worst-case input of the rule for ε. The gradient rows are :math:`\mu(w + x_i)`; a translation- and
scale-equivariant rule returns :math:`\mu(w + A)` with :math:`A = \mathrm{Agg}(x)`, so the bias is the same in every
round and GD is linear:

.. math:: w_t = -A + (1 - \eta\mu)^t (w_0 + A),\qquad
          F(w_t) - F^* = \tfrac\mu2 \|(\bar x - A) + (1-\eta\mu)^t (w_0 + A)\|^2 \to \tfrac{\rho\,\zeta^2}{2\mu},

with :math:`\zeta^2 = \mu^2 \frac1n\sum_i\|x_i - \bar x\|^2` (the same at every w) and ρ the aggregation error of x
(:func:`phalanx.analysis.aggregation_error`); likewise :math:`\|\nabla F(w_t)\|^2 \to \rho\,\zeta^2`. When x attains
the rule's ε (ρ = ε) both upper bounds are met with equality in the limit, for every step size η ∈ (0, 2/μ): they
cannot be improved. The configurations: per coordinate, k rows at s and n − k at 0, with k = f for the trimmed mean
(ρ = f/(n − f), the lower bound of every f-robust rule, Yang, Shi & Li Thm 3.1) and k = ⌊(n−1)/2⌋ for the median and
the geometric median (ρ = k/(n − k); for the geometric median this is below its ε = 1, whose even split needs a
tie-break Weiszfeld's method does not take); for any other rule, the construction of :func:`phalanx.analysis.epsilon`
with the largest ratio among those on which the rule's output moves with w (measured, and said so in
:attr:`Construction.source`: Krum's even split, ρ = 1, is broken by rounding and flips along the path, so its
construction is the 7/9 split). By Thm 3.1 every f-tolerant rule has inputs with ρ as close to f/(n − f) as one
likes, so GD with any translation- and scale-equivariant f-tolerant rule stalls, on some heterogeneous quadratic, at
F − F* ≥ (f/(n − f) − δ)ζ²/(2μ) and ‖∇F‖² ≥ (f/(n − f) − δ)ζ², for any δ > 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from phalanx import aggregators
from phalanx.aggregators.base import FLOAT_DTYPES, Aggregator, RuleTags
from phalanx.analysis.epsilon import aggregation_error, constructions
from phalanx.errors import ConfigError
from phalanx.validate import check_int, check_real

__all__ = [
    "CLOSED_FORM_SPLIT", "Construction", "check_problem", "closed_form", "construct", "nonconvex_bound",
    "nonconvex_upper", "pl_bound", "pl_upper", "run", "solver_accuracy", "tolerance",
]

CLOSED_FORM_SPLIT = {"cwtm": "f", "cwmed": "median", "geomed": "median", "mean": "median"}
"""Rules whose worst-case split is known in closed form: k = f rows at s (trimmed mean), or k = ⌊(n−1)/2⌋ (median,
geometric median: the majority point is their output; the mean: any split, ε = 0)."""


def pl_bound(eps: float, zeta2: float, mu: float) -> float:
    """εζ²/(2μ): where GD with an ε-accurate rule stalls on a μ-PL objective (the limit of :func:`pl_upper`)."""
    check_real("mu", mu, low=0.0, low_open=True)
    return eps * zeta2 / (2.0 * mu)


def nonconvex_bound(eps: float, zeta2: float) -> float:
    """εζ²: the floor of ‖∇F‖² of GD with an ε-accurate rule (the limit of :func:`nonconvex_upper`)."""
    return eps * zeta2


def check_problem(mu: float, L: float | None = None) -> tuple[float, float]:
    """μ > 0 and L ≥ μ (one-line :class:`ConfigError` naming the parameter otherwise); returns (μ, L)."""
    mu = check_real("mu", mu, low=0.0, low_open=True)
    big_l = mu if L is None else check_real("L", L, low=mu)
    return mu, big_l


def pl_upper(eps: float, zeta2: float, mu: float, L: float, gap0: float, steps: int) -> Tensor:
    """The derived upper bound on F(w_t) − F* of GD (η = 1/L), t = 0 … steps, on an L-smooth μ-PL objective:
    (1 − μ/L)ᵗ gap0 + (1 − (1 − μ/L)ᵗ) εζ²/(2μ) (module docstring)."""
    mu, big_l = check_problem(mu, L)
    steps = check_int("steps", steps, low=0)
    q = torch.full((steps + 1,), 1.0 - mu / big_l, dtype=torch.float64).pow(torch.arange(steps + 1))
    return q * gap0 + (1.0 - q) * pl_bound(eps, zeta2, mu)


def nonconvex_upper(eps: float, zeta2: float, L: float, gap0: float, steps: int) -> float:
    """The derived upper bound on min_{t<T} ‖∇F(w_t)‖² of GD (η = 1/L) after T = ``steps`` rounds on an L-smooth
    objective: 2L(F(w₀) − F*)/T + εζ² (module docstring)."""
    big_l = check_real("L", L, low=0.0, low_open=True)
    steps = check_int("steps", steps, low=1)
    return 2.0 * big_l * gap0 / steps + nonconvex_bound(eps, zeta2)


@dataclass(frozen=True)
class Construction:
    """The tightness instance of one rule: F_i(w) = (μ/2)‖w + x_i‖² with x the worst-case input (module docstring)."""

    rule: str
    n: int
    f: int
    mu: float
    x: Tensor
    """(n, d) float64: the worst-case input (the gradients at w = 0, divided by μ)."""
    a: Tensor
    """(d,) float64: the rule's output on x (in closed form for the rules of :data:`CLOSED_FORM_SPLIT`)."""
    ratio: float
    """ρ = ‖A − x̄‖² / ((1/n) Σ ‖x_i − x̄‖²), the aggregation error of x."""
    epsilon: float | None
    """The rule's ε from the literature (``rule.epsilon(n)``), if known."""
    source: str
    """How x was chosen: ``closed form`` or ``ε search`` (the largest ratio of the constructions on which the bias moves
    with w)."""
    what: str
    """The configuration, in words."""

    @property
    def zeta2(self) -> float:
        """ζ² = μ² (1/n) Σ ‖x_i − x̄‖² (the same at every w)."""
        xbar = self.x.mean(dim=0)
        return self.mu**2 * float((self.x - xbar).square().sum(dim=1).mean())

    @property
    def limit(self) -> float:
        """lim F(w_t) − F* = ρζ²/(2μ)."""
        return pl_bound(self.ratio, self.zeta2, self.mu)

    @property
    def gradient_floor(self) -> float:
        """lim ‖∇F(w_t)‖² = ρζ²."""
        return nonconvex_bound(self.ratio, self.zeta2)


def solver_accuracy(rule: Aggregator) -> float:
    """The relative accuracy of an iterative rule's output — the ``RuleTags.tol`` it declares above the default
    (the geometric median's Weiszfeld iterations: 1e-3) — or 0 for a rule in closed form (exact up to rounding)."""
    tol = aggregators.get_tags(rule).tol
    return tol if tol > RuleTags().tol else 0.0


def _check_rule(rule: Aggregator, n: int) -> str:
    spec = getattr(rule, "spec", rule.name)
    if n < rule.min_workers():
        raise ConfigError("n", n, f"n >= {rule.min_workers()} for {spec} ({rule.requirement})")
    tags = aggregators.get_tags(rule)
    if not (tags.translation and tags.scale):
        raise ConfigError("rule", spec, "a translation- and scale-equivariant rule (the construction's bias is then "
                          "the same in every round)", f"{spec} does not claim both: GD's limit has no closed form")
    return spec


def _moves_with_w(rule: Aggregator, x: Tensor, a: Tensor, mu: float, s: float) -> bool:
    """Agg(μ(w + x)) = μ(w + A) at the points w a GD path from w₀ = c·s·1 (|c| ≤ 3) can visit — the line through
    −A and s·1 — and at 32 seeded random points of size up to 3s (a stochastic rule, or one whose ties are broken by
    rounding, fails it somewhere)."""
    d = x.shape[1]
    atol = (solver_accuracy(rule) + 1e-9) * 10 * s * (1 + math.sqrt(d))
    gen = torch.Generator().manual_seed(0)
    line = [-a + c * (torch.full((d,), s, dtype=torch.float64) + a) for c in torch.linspace(-3.0, 3.0, 25).tolist()]
    points = line + [3 * s * (2 * torch.rand(d, generator=gen, dtype=torch.float64) - 1) for _ in range(32)]
    return all(torch.allclose(rule(mu * (w + x)) / mu - w, a, rtol=0.0, atol=atol) for w in points)


def _searched(rule: Aggregator, n: int, d: int, s: float,
              mu: float) -> tuple[float, str, Tensor, Tensor] | None:
    """The construction of :func:`phalanx.analysis.epsilon` (rescaled to ``s``) with the largest aggregation error
    among those on which the rule's output moves with w; None if there is none."""
    found = []
    for name, cand in constructions(n, d):
        x = cand * (s / cand.abs().max())
        a = rule(x).double()
        r = aggregation_error(a, x)
        if math.isfinite(r):
            found.append((r, name, x, a))
    found.sort(key=lambda item: -item[0])
    for item in found:
        if _moves_with_w(rule, item[2], item[3], mu, s):
            return item
    return None


def construct(rule: Aggregator, n: int, d: int = 4, *, mu: float = 1.0, scale: float = 1.0) -> Construction:
    """The tightness construction of ``rule`` with ``n`` workers in dimension ``d`` (module docstring).

    ``scale`` s is the spread of the centres (ζ² ∝ μ²s²); zero heterogeneity is refused (the bound is then 0: every
    rule is free). A rule that is not translation- and scale-equivariant, or whose output on the configuration does
    not move with w (a stochastic rule), is a :class:`ConfigError`: its bias changes from round to round.
    """
    n = check_int("n", n, low=2)
    d = check_int("d", d, low=1)
    f = int(getattr(rule, "f", 0))
    if 2 * f >= n:
        raise ConfigError("f", f, f"0 <= f < n/2 = {n / 2:g}", "no honest majority")
    mu, _ = check_problem(mu)
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale == 0:
        raise ConfigError("scale", scale, "a finite number > 0", "zero heterogeneity: the bound is 0, every rule is "
                          "free")
    s = check_real("scale", scale, low=0.0, low_open=True)
    spec = _check_rule(rule, n)
    eps = rule.epsilon(n)
    split = CLOSED_FORM_SPLIT.get(spec)
    if split is not None:
        k = f if split == "f" else (n - 1) // 2
        x = torch.zeros(n, d, dtype=torch.float64)
        x[:k] = s
        a = x.mean(dim=0) if spec == "mean" else torch.zeros(d, dtype=torch.float64)
        ratio = 0.0 if spec == "mean" else k / (n - k)
        source, what = "closed form", f"{k} rows at {s:g}·1, {n - k} at 0"
        got = rule(x)
        if not torch.allclose(got, a, rtol=0.0, atol=(solver_accuracy(rule) + 1e-12) * s * math.sqrt(d)):
            raise ConfigError("rule", spec, f"a rule whose output on {what} is its closed form",
                              f"got {got.tolist()}")
    else:
        found = _searched(rule, n, d, s, mu)
        if found is None:
            raise ConfigError("rule", spec, "a rule whose output on a construction moves with w",
                              "on every construction its bias changes from round to round (ties broken by rounding, "
                              "or random draws): GD's limit has no closed form")
        ratio, name, x, a = found
        what = f"{name}, scaled to {s:g} (the ε search's largest ratio on which the bias moves with w)"
        source = "ε search"
    if not _moves_with_w(rule, x, a, mu, s):  # a closed-form split whose output does not move with w
        raise ConfigError("rule", spec, "a rule whose output on the construction moves with w",
                          "its bias changes from round to round: GD's limit has no closed form")
    return Construction(spec, n, f, mu, x, a, float(ratio), eps, source, what)


def _check_run(c: Construction, eta: float, steps: int, w0: float) -> tuple[float, int, float]:
    eta = check_real("eta", eta, low=0.0, low_open=True, high=2.0 / c.mu, high_open=True)
    steps = check_int("steps", steps, low=1)
    w0 = check_real("w0", w0)
    return eta, steps, w0


def closed_form(c: Construction, eta: float, steps: int, w0: float = 2.0) -> Tensor:
    """F(w_t) − F*, t = 0 … steps, of GD from w₀ = ``w0``·s·1 in exact arithmetic: (μ/2)‖(x̄ − A) + qᵗ(w₀ + A)‖²,
    q = 1 − ημ (float64)."""
    eta, steps, w0 = _check_run(c, eta, steps, w0)
    s = float(c.x.abs().max()) or 1.0
    start = torch.full_like(c.a, w0 * s)
    q = torch.full((steps + 1, 1), 1.0 - eta * c.mu, dtype=torch.float64).pow(torch.arange(steps + 1)[:, None])
    r = (c.x.mean(dim=0) - c.a)[None, :] + q * (start + c.a)[None, :]
    return 0.5 * c.mu * r.square().sum(dim=1)


def run(c: Construction, rule: Aggregator, eta: float, steps: int, w0: float = 2.0,
        dtype: torch.dtype = torch.float64) -> Tensor:
    """F(w_t) − F*, t = 0 … steps, of GD run with the real rule in ``dtype`` on the construction: every round the
    rows μ(w_t + x_i) are aggregated by ``rule`` and w steps by −η times the aggregate. The suboptimality of each
    iterate is evaluated in float64 (what is compared with :func:`closed_form` is the iterates, not the evaluation)."""
    eta, steps, w0 = _check_run(c, eta, steps, w0)
    if dtype not in FLOAT_DTYPES:
        raise ConfigError("dtype", str(dtype), "one of " + ", ".join(str(t) for t in FLOAT_DTYPES))
    s = float(c.x.abs().max()) or 1.0
    x = c.x.to(dtype)
    mu = torch.tensor(c.mu, dtype=dtype)
    step = torch.tensor(eta, dtype=dtype)
    w = torch.full((c.x.shape[1],), w0 * s, dtype=dtype)
    xbar = c.x.mean(dim=0)
    out = torch.empty(steps + 1, dtype=torch.float64)
    out[0] = 0.5 * c.mu * float((w.double() + xbar).square().sum())
    for t in range(steps):
        w = w - step * rule(mu * (w[None, :] + x))
        out[t + 1] = 0.5 * c.mu * float((w.double() + xbar).square().sum())
    return out


def tolerance(c: Construction, rule: Aggregator, eta: float, steps: int, w0: float = 2.0,
              dtype: torch.dtype = torch.float64) -> float:
    """How far :func:`run` may be from :func:`closed_form` at the last round, from rounding alone.

    Per round and coordinate the rows have size at most M = μ(|w|max + |x|max) (|w| ≤ max(|w₀|, |A|) along the
    path, a convex combination of the two), the rule's output is off by at most γ·M with γ = (n + 4)u for a rule in
    closed form (a sum of at most n values, a division, the rounding of the rows; u the unit roundoff of ``dtype``)
    or the accuracy an iterative rule declares (:func:`solver_accuracy`) when it is larger, and the update
    w − η·a adds u(|w| + η|a|). The error of the iterate then obeys δ_{t+1} ≤ |q|δ_t + e with q = 1 − ημ, so
    δ_T ≤ e·S_T, S_T = Σ_{j<T} |q|ʲ ≤ min(T, 1/(1 − |q|)), plus the rounding of x and w₀ into ``dtype`` (u·|x|, δ₀).
    Then |ΔF| ≤ μ‖r‖δ√d + (μ/2)dδ² with ‖r‖ the largest exact residual along the path, so the tolerance holds at
    every round t ≤ ``steps``; it is twice that (a margin: the bound on products of roundings is first order)."""
    eta, steps, w0 = _check_run(c, eta, steps, w0)
    u = torch.finfo(dtype).eps / 2
    n, d = c.x.shape
    s = float(c.x.abs().max()) or 1.0
    wmax = max(abs(w0) * s, float(c.a.abs().max()))
    big_m = c.mu * (wmax + s)
    gamma = max((n + 4) * u, solver_accuracy(rule))
    per_round = eta * gamma * big_m + u * (wmax + eta * big_m)
    q = abs(1.0 - eta * c.mu)
    s_t = float(steps) if q >= 1.0 else min(float(steps), (1.0 - q**steps) / (1.0 - q))
    delta = per_round * s_t + u * (wmax + s) * (1.0 + eta * c.mu * s_t)
    r = float(closed_form(c, eta, steps, w0).max())
    resid = math.sqrt(2.0 * r / c.mu)
    return 2.0 * (c.mu * resid * delta * math.sqrt(d) + 0.5 * c.mu * d * delta**2)
