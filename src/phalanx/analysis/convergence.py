r"""Where gradient descent with an ε-accurate rule stalls when nobody attacks: the paper's upper bound, re-derived, and
Phalanx's own exact tightness construction for the rules whose worst case is known in closed form.

Setting (Yang, Shi & Li, ICML 2025, Section 4; docs/tension.md, "Convergence with no attack"). n honest workers hold
objectives :math:`F_i`; :math:`F = \frac1n\sum_i F_i` is L-smooth (their Assumption 4.2) and bounded below by
:math:`F^*` (4.1); the heterogeneity (4.3) is

.. math:: \zeta^2(w) = \frac1n \sum_i \|\nabla F_i(w) - \nabla F(w)\|^2 \le G^2 .

Gradient descent with a rule (their Algorithm 1, ByzGD, with no Byzantine worker),
:math:`w_{t+1} = w_t - \eta\, \mathrm{Agg}(\nabla F_1(w_t), \dots, \nabla F_n(w_t))`.

**The paper's upper bound, Theorem 4.6**: if Agg is ε-accurate (Definition 2.2),
(1/T) Σ_{t<T} ‖∇F(w_t)‖² ≤ 2L[F(w₀) − F*]/T + εG², and under PL (Assumption 4.4)
F(w_T) − F* ≤ (1 − μ/L)^T [F(w₀) − F*] + εG²/(2μ). **Phalanx re-derives it** (Propositions 1 and 2 of
docs/tension.md; the step η = 1/L): the aggregate is the true gradient plus a bias :math:`e_t` with
:math:`\|e_t\|^2 \le \varepsilon\, \zeta^2(w_t)`, and the descent lemma gives

.. math:: F(w_{t+1}) \le F(w_t) - \tfrac{1}{2L}\|\nabla F(w_t)\|^2 + \tfrac{1}{2L}\varepsilon\zeta^2,

hence :math:`\min_{t<T}\|\nabla F(w_t)\|^2 \le 2L(F(w_0) - F^*)/T + \varepsilon\zeta^2` and, when F is μ-PL,
:math:`F(w_T) - F^* \le (1 - \mu/L)^T (F(w_0) - F^*) + (1 - (1-\mu/L)^T)\,\varepsilon\zeta^2/(2\mu)`
(:func:`pl_upper`, :func:`nonconvex_upper`).

**The paper's lower bound, Theorem 4.5**, holds for every (f, κ)-robust rule and every step size; its construction
is :mod:`phalanx.analysis.theorem45`, run for every rule of the registry.

**Phalanx's own tightness result — Proposition 3, under stronger assumptions** (:func:`construct`): the rule is
translation- and scale-equivariant and η ∈ (0, 2/μ). Take :math:`F_i(w) = \frac\mu2\|w + x_i\|^2` (so L = μ) with
x an input of the rule. The gradient rows are :math:`\mu(w + x_i)`; an equivariant rule returns :math:`\mu(w + A)`
with :math:`A = \mathrm{Agg}(x)`, the same bias in every round, and GD is linear:

.. math:: w_t = -A + (1 - \eta\mu)^t (w_0 + A),\qquad
          F(w_t) - F^* = \tfrac\mu2 \|(\bar x - A) + (1-\eta\mu)^t (w_0 + A)\|^2 \to \tfrac{\rho\,\zeta^2}{2\mu},

with :math:`\zeta^2 = \mu^2 \frac1n\sum_i\|x_i - \bar x\|^2` (the same at every w) and ρ the aggregation error of x;
likewise :math:`\|\nabla F(w_t)\|^2 \to \rho\,\zeta^2`. When x attains the rule's proven ε (ρ = ε) both upper bounds
are met with equality in the limit. Phalanx builds it only where the worst case and the rule's output on it follow
from the rule's **definition** (:data:`CLOSED_FORM_SPLIT`): per coordinate k rows at s and n − k at 0, with k = f
for the trimmed mean (it trims the k rows: A = 0, ρ = f/(n − f), its ε by Theorem 3.6) and k = ⌊(n−1)/2⌋ for the
median and the geometric median (the majority point: A = 0; for the geometric median ρ is below its ε = 1, whose
even split needs a tie-break Weiszfeld's method does not take); the mean: A = x̄, ρ = 0. The run with the real rule
is then checked against A derived, not computed from the rule: a rule whose output is not A is refused. Any other
rule has no closed form here (an ε of its own is at best a measured lower bound, and an A computed from its output
would make the comparison hold by construction): :func:`construct` refuses it and points to Theorem 4.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from phalanx import aggregators
from phalanx.aggregators.base import FLOAT_DTYPES, Aggregator, RuleTags
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
    """Phalanx's Proposition 3 instance of one rule: F_i(w) = (μ/2)‖w + x_i‖² with x its worst-case input in closed
    form (module docstring)."""

    rule: str
    n: int
    f: int
    mu: float
    x: Tensor
    """(n, d) float64: the worst-case input (the gradients at w = 0, divided by μ)."""
    a: Tensor
    """(d,) float64: the rule's output on x, derived from its definition (not computed from the rule)."""
    ratio: float
    """ρ = ‖A − x̄‖² / ((1/n) Σ ‖x_i − x̄‖²), the aggregation error of x."""
    epsilon: float | None
    """The rule's proven ε (``rule.epsilon(n)``)."""
    source: str
    """``closed form``: x and A follow from the rule's definition."""
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


def construct(rule: Aggregator, n: int, d: int = 4, *, mu: float = 1.0, scale: float = 1.0) -> Construction:
    """Phalanx's Proposition 3 instance of ``rule`` with ``n`` workers in dimension ``d`` (module docstring), for the
    rules of :data:`CLOSED_FORM_SPLIT`.

    ``scale`` s is the spread of the centres (ζ² ∝ μ²s²); zero heterogeneity is refused (the bound is then 0: every
    rule is free). A rule without a closed-form worst case, one that is not translation- and scale-equivariant, or
    one whose output on the configuration is not its closed form (a rule that ignores f) is a :class:`ConfigError`.
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
    split = CLOSED_FORM_SPLIT.get(spec)
    if split is None:
        raise ConfigError("rule", spec, "one of " + ", ".join(CLOSED_FORM_SPLIT) + " (a worst case and an output on "
                          "it known from the rule's definition)", "for any (f, κ)-robust rule use the paper's "
                          "Theorem 4.5 construction: phalanx.analysis.theorem45.check")
    k = f if split == "f" else (n - 1) // 2
    x = torch.zeros(n, d, dtype=torch.float64)
    x[:k] = s
    a = x.mean(dim=0) if spec == "mean" else torch.zeros(d, dtype=torch.float64)
    ratio = 0.0 if spec == "mean" else k / (n - k)
    what = f"{k} rows at {s:g}·1, {n - k} at 0"
    got = rule(x)
    if not torch.allclose(got, a, rtol=0.0, atol=(solver_accuracy(rule) + 1e-12) * s * math.sqrt(d)):
        raise ConfigError("rule", spec, f"a rule whose output on {what} is its closed form {a.tolist()}",
                          f"got {got.tolist()}")
    return Construction(spec, n, f, mu, x, a, float(ratio), rule.epsilon(n), "closed form", what)


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
