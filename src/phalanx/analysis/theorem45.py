r"""The paper's lower bound on gradient descent with a robust rule and no attack, and its construction, run with
Phalanx's rules: Yang, Shi & Li (ICML 2025), Theorem 4.5.

**The setting** (their Section 4). ByzGD (their Algorithm 1): :math:`w_{t+1} = w_t - \eta_t\,\mathrm{Agg}(\nabla
F_1(w_t), \dots, \nabla F_n(w_t))`, every worker honest, :math:`F = \frac1n\sum_i F_i`. Assumption 4.1 (bounded
loss): :math:`F(w) \ge F^*` for all w. Assumption 4.2 (L-smoothness): :math:`\|\nabla F(w) - \nabla F(w')\| \le
L\|w - w'\|`. Assumption 4.3 (bounded heterogeneity): :math:`\frac1n\sum_i\|\nabla F_i(w) - \nabla F(w)\|^2 \le
G^2` for all w. Assumption 4.4 (PL): :math:`F(w) - F^* \le \frac1{2\mu}\|\nabla F(w)\|^2` for all w.

**Theorem 4.5 (lower bound)**, as the paper states it: *for ByzGD with any (f, κ)-robust aggregator, there exist n
loss functions F₁(w), …, Fₙ(w) satisfying Assumptions 4.1, 4.2, 4.3 and 4.4, and satisfying the following
condition: for any initial point w₀, any positive constant learning rate ηₜ = η > 0, any constant
C₁ < (f/(n − f))·G² and any positive integer K > 0, there exists an integer T > K such that
(1/T) Σ_{t<T} ‖∇F(w_t)‖² > C₁ and F(w_T) − F* > C₁/(2μ).* No equivariance of the rule, no bound on η.

**The construction** (their proof sketch, in d dimensions along a unit vector u = 1/√d): f functions
:math:`F_i(w) = c\|w\|^2` and n − f functions :math:`F_i(w) = c(\|w\|^2 - 2\langle u, w\rangle)` with
:math:`c = nG/(2\sqrt{f(n-f)})`. What follows is derived here (:class:`Instance` computes each): the gradients are
2c·w (f rows) and 2c·(w − u) (n − f identical rows); F(w) = c‖w‖² − 2c((n − f)/n)⟨u, w⟩, so μ = L = 2c, the minimiser
is w* = ((n − f)/n)·u and F* = −c((n − f)/n)²; the heterogeneity is 4c²f(n − f)/n² = G² at every w. Any (f, κ)-robust
rule, with S the n − f identical rows (Definition 2.1: the error is at most κ times their spread, 0), returns
2c·(w − u) — **whatever the other f rows are** — so ByzGD is w_{t+1} − u = (1 − 2cη)(w_t − u) (the paper's
1 − nGη/√(f(n − f))), the same for every such rule (:func:`closed_form`). For 2cη < 2 it converges to u, where
‖∇F‖² = (2cf/n)² = (f/(n − f))·G² and F − F* = c(f/n)² = (f/(n − f))·G²/(2μ) (:attr:`Instance.limit_grad`,
:attr:`Instance.limit_gap`); for 2cη = 2 it oscillates about u, and for 2cη > 2 it diverges — the paper's three
step-size regimes.

**What Phalanx runs** (:func:`check`): for a rule configured for f,

1. the property the theorem rests on — n − f identical rows give that row whatever the f others are — searched by
   an adversary who places the f rows (:func:`majority_check`: all at one point at a sweep of distances, one near
   and the rest far on one side, split on two sides, random, each against a majority at 0 and at a random point). A
   rule that fails it is (f, κ)-robust for **no** κ (the input found is the certificate) and lies outside the
   theorem. Passing it is only a **necessary** condition of (f, κ)-robustness: a rule that keeps n − f identical
   rows and falls back to the plain mean otherwise passes it and is robust for no κ. A rule is said to be *in the
   theorem's class* only where a κ is proven for it (:func:`phalanx.analysis.ratios.proven_upper_bound`: the rule's
   ``kappa(n)``, or the NNM lemma);
2. ByzGD with the real rule on the construction (:func:`descend`; a stochastic rule draws from a seeded generator,
   a stateful one starts fresh, centered clipping gets the previous aggregate as its centre and FLTrust the
   gradient of F as its reference — what Phalanx's server passes): whether its aggregate is the majority's gradient
   in every round, and F(w_T) − F* and (1/T)Σ‖∇F(w_t)‖² beside the closed form and its limit.

A rule passes when both hold: it *stalls* exactly where the theorem says — "in the theorem's class" where a κ is
proven for it, "the class's necessary condition holds" where none is. Tolerances (:func:`output_tolerance`): twice
the rule's declared relative accuracy (:func:`phalanx.analysis.convergence.solver_accuracy`) or ten times the
float64 rounding of a sum of n rows, whichever is larger, times the rows' size. The rows' size includes the f
others': a solver's error scales with the whole input (the geometric median's Weiszfeld iterations are off by up to
8·10⁻⁴·max|rows| against n − f identical rows at 0 and far f others), so a tolerance relative to the majority's rows
alone would fail the real rule; a rule whose output leaks less than its declared accuracy cannot be told from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.analysis.convergence import solver_accuracy
from phalanx.analysis.ratios import RuleCall, proven_upper_bound
from phalanx.errors import ConfigError, PhalanxError
from phalanx.validate import check_int, check_real

__all__ = [
    "Check", "Instance", "MajorityCheck", "Path", "check", "closed_form", "descend", "majority_check",
    "output_tolerance",
]


@dataclass(frozen=True)
class Instance:
    """The construction of Theorem 4.5 for n workers, f of them in the minority, heterogeneity G, dimension d."""

    n: int
    f: int
    G: float = 1.0
    d: int = 1

    def __post_init__(self) -> None:
        check_int("n", self.n, low=3)
        check_int("f", self.f, low=1)
        if 2 * self.f >= self.n:
            raise ConfigError("f", self.f, f"1 <= f < n/2 = {self.n / 2:g}", "Theorem 4.5 needs f < n/2")
        check_real("G", self.G, low=0.0, low_open=True)
        check_int("d", self.d, low=1)

    @property
    def c(self) -> float:
        """c = nG/(2√(f(n − f)))."""
        return self.n * self.G / (2.0 * math.sqrt(self.f * (self.n - self.f)))

    @property
    def mu(self) -> float:
        """μ = L = 2c (F is a quadratic with Hessian 2c·I)."""
        return 2.0 * self.c

    @property
    def u(self) -> Tensor:
        """The unit vector 1/√d along which the construction lies."""
        return torch.full((self.d,), 1.0 / math.sqrt(self.d), dtype=torch.float64)

    @property
    def w_star(self) -> Tensor:
        """The minimiser ((n − f)/n)·u."""
        return (self.n - self.f) / self.n * self.u

    @property
    def f_star(self) -> float:
        """F* = −c((n − f)/n)²."""
        return -self.c * ((self.n - self.f) / self.n) ** 2

    @property
    def limit_grad(self) -> float:
        """(f/(n − f))·G²: where ‖∇F‖² stalls (the theorem's bound on C₁)."""
        return self.f / (self.n - self.f) * self.G**2

    @property
    def limit_gap(self) -> float:
        """(f/(n − f))·G²/(2μ): where F − F* stalls."""
        return self.limit_grad / (2.0 * self.mu)

    def gradients(self, w: Tensor) -> Tensor:
        """The n rows ∇F_i(w): 2c·w for the first f, 2c·(w − u) for the n − f others."""
        w = w.double()
        rows = (2.0 * self.c * w).expand(self.n, self.d).clone()
        rows[self.f:] -= 2.0 * self.c * self.u
        return rows

    def majority(self, w: Tensor) -> Tensor:
        """2c·(w − u): the majority's gradient, the output of every (f, κ)-robust rule."""
        return 2.0 * self.c * (w.double() - self.u)

    def gap(self, w: Tensor) -> float:
        """F(w) − F* = c‖w − w*‖²."""
        return self.c * float((w.double() - self.w_star).square().sum())

    def grad_sq(self, w: Tensor) -> float:
        """‖∇F(w)‖² = 4c²‖w − w*‖²."""
        return self.mu**2 * float((w.double() - self.w_star).square().sum())

    def heterogeneity(self, w: Tensor) -> float:
        """(1/n) Σ ‖∇F_i(w) − ∇F(w)‖² (G² at every w)."""
        g = self.gradients(w)
        return float((g - g.mean(dim=0)).square().sum(dim=1).mean())


def _check_run(eta: Any, steps: Any, w0: Any) -> tuple[float, int, float]:
    eta = check_real("eta", eta, low=0.0, low_open=True)
    steps = check_int("steps", steps, low=1)
    w0 = check_real("w0", w0)
    return eta, steps, w0


def closed_form(inst: Instance, eta: float, steps: int, w0: float = 0.0) -> Tensor:
    """The iterates w_t, t = 0 … steps (``(steps + 1, d)`` float64), of ByzGD with any (f, κ)-robust rule from
    w₀ = ``w0``·u: w_t = u + (1 − 2cη)ᵗ(w₀ − u) (module docstring), for every η > 0."""
    eta, steps, w0 = _check_run(eta, steps, w0)
    q = torch.full((steps + 1, 1), 1.0 - eta * inst.mu, dtype=torch.float64).pow(torch.arange(steps + 1)[:, None])
    return inst.u[None, :] + q * ((w0 - 1.0) * inst.u)[None, :]


SOLVER_MARGIN = 2.0
"""The factor on a rule's declared relative accuracy: the real geometric median is off by up to 0.8 of its declared
1e-3 (times max|rows|) against n − f identical rows; 10, as before, let a geometric median leaking 9 % of the mean
through (0.0085·max|rows| at n = 16, f = 1)."""
ROUNDING_MARGIN = 10.0
"""The factor on the float64 rounding of a sum of n rows, (n + 4)·eps."""


def output_tolerance(rule: Aggregator, rows: Tensor) -> float:
    """How far a rule's output may be from the majority's row and still be it: 2 × the rule's declared relative
    accuracy or 10 × the float64 rounding of a sum of n rows, whichever is larger, times max|rows| (all the rows: a
    solver's error, and the rounding of a computation over them, scale with the whole input)."""
    n = rows.shape[0]
    scale = float(rows.double().abs().max()) if rows.numel() else 1.0
    return max(ROUNDING_MARGIN * (n + 4) * torch.finfo(torch.float64).eps,
               SOLVER_MARGIN * solver_accuracy(rule)) * max(scale, 1e-300)


@dataclass
class MajorityCheck:
    """What :func:`majority_check` found."""

    deviation: float
    """The largest ‖Agg(x) − z‖∞ found, z the n − f identical rows."""
    tolerance: float
    """:func:`output_tolerance` at the input attaining it."""
    input: Tensor
    """That input (the first n − f rows are z)."""
    placement: str
    """How the adversary placed the f rows there."""
    evaluations: int
    error: str = ""
    """Why the rule could not be called on rows alone (FLTrust's reference), if so."""

    @property
    def holds(self) -> bool:
        """Every placement gave z back (to the tolerance)."""
        return not self.error and self.deviation <= self.tolerance


def _placements(n: int, f: int, d: int, gen: torch.Generator) -> list[tuple[str, Tensor]]:
    """The f rows as the adversary places them (``(f, d)`` each)."""
    u = torch.randn(d, generator=gen, dtype=torch.float64)
    u /= u.norm()
    out = [(f"all f at {t:g}·u", (t * u).expand(f, d).clone()) for t in (1e-3, 0.1, 1.0, 10.0, 1e3)]
    for near in (0.01, 0.1, 1.0):
        for far in (10.0, 100.0, 1e3):
            x = (far * u).expand(f, d).clone()
            x[0] = near * u
            if f > 1:
                x[1] = near * u
            out.append((f"two (or one) at {near:g}·u, the rest at {far:g}·u", x))
            x = (far * u).expand(f, d).clone()
            x[0] = near * u
            out.append((f"one at {near:g}·u, the rest at {far:g}·u", x))
    for t in (1.0, 100.0):
        x = (t * u).expand(f, d).clone()
        x[::2] = -t * u
        out.append((f"split at ±{t:g}·u", x))
    for i in range(12):
        scale = 10.0 ** float(torch.empty(1).uniform_(-2, 3, generator=gen))
        out.append((f"random #{i} (scale {scale:.3g})", scale * torch.randn(f, d, generator=gen, dtype=torch.float64)))
    return out


def majority_check(rule: Aggregator, n: int, d: int = 2, seed: int = 0) -> MajorityCheck:
    """Search the placements of the f rows (``rule.f``) that move the rule's output away from n − f identical rows
    (module docstring, step 1), with the majority at 0 and at a random point; the rule is called as a fixed function
    (a stochastic rule from a generator seeded with ``seed``, a stateful one fresh)."""
    f = int(getattr(rule, "f", 0))
    check_int("n", n, low=3)
    if not 1 <= f or 2 * f >= n:
        raise ConfigError("f", f, f"1 <= f < n/2 = {n / 2:g} (the rule's f)")
    if n < rule.min_workers():
        raise ConfigError("n", n, f"n >= {rule.min_workers()} for {getattr(rule, 'spec', rule.name)}")
    gen = torch.Generator().manual_seed(seed)
    call = RuleCall(rule, seed)
    z_random = torch.randn(d, generator=gen, dtype=torch.float64)
    worst = MajorityCheck(-1.0, 0.0, torch.zeros(n, d, dtype=torch.float64), "none", 0)
    for z_name, z in (("0", torch.zeros(d, dtype=torch.float64)), ("a random point", z_random)):
        for name, minority in _placements(n, f, d, gen):
            x = torch.cat([z.expand(n - f, d), z + minority])
            try:
                out = call(x).double()
            except PhalanxError as exc:
                worst.error = f"not a rule of the rows alone: {exc}"
                return worst
            worst.evaluations += 1
            dev = float((out - z).abs().max()) if bool(torch.isfinite(out).all()) else math.inf
            tol = output_tolerance(rule, x)
            if dev - tol > worst.deviation - worst.tolerance:
                worst.deviation, worst.tolerance, worst.input = dev, tol, x.clone()
                worst.placement = f"majority at {z_name}, {name}"
    return worst


@dataclass
class Path:
    """ByzGD with a real rule on the construction (:func:`descend`)."""

    w: Tensor
    """``(steps + 1, d)`` iterates."""
    gap: Tensor
    """F(w_t) − F*, t = 0 … steps."""
    grad_sq: Tensor
    """‖∇F(w_t)‖², t = 0 … steps."""
    deviation: Tensor
    """Per round, ‖Agg − 2c(w_t − u)‖∞ (the aggregate against the majority's gradient)."""
    tolerance: Tensor
    """Per round, :func:`output_tolerance` of the round's rows."""

    @property
    def followed(self) -> bool:
        """The aggregate was the majority's gradient in every round (to the tolerance)."""
        return bool((self.deviation <= self.tolerance).all())

    def average_grad_sq(self) -> float:
        """(1/T) Σ_{t<T} ‖∇F(w_t)‖², T = steps."""
        return float(self.grad_sq[:-1].mean())


def descend(inst: Instance, rule: Aggregator, eta: float, steps: int, w0: float = 0.0, seed: int = 0) -> Path:
    """ByzGD (the paper's Algorithm 1, constant η) with ``rule`` on the construction, float64, from w₀ = ``w0``·u,
    with the context Phalanx's server gives (module docstring, step 2)."""
    eta, steps, w0 = _check_run(eta, steps, w0)
    keys = rule.context_keys
    if rule.stateful:
        rule.load_state_dict({})
    gen = torch.Generator().manual_seed(seed)
    w = w0 * inst.u
    ws, devs, tols = [w.clone()], [], []
    previous: Tensor | None = None
    for _ in range(steps):
        rows = inst.gradients(w)
        context: dict[str, Any] = {}
        if "generator" in keys:
            context["generator"] = gen
        if "center" in keys and previous is not None:
            context["center"] = previous
        if "reference" in keys:
            context["reference"] = rows.mean(dim=0)  # a root set like all the workers' data: ∇F(w)
        if "ids" in keys:
            context["ids"] = torch.arange(inst.n)
        agg = rule(rows, **context).double()
        devs.append(float((agg - inst.majority(w)).abs().max()) if bool(torch.isfinite(agg).all()) else math.inf)
        tols.append(output_tolerance(rule, rows))
        previous = agg
        w = w - eta * agg
        ws.append(w.clone())
    path = torch.stack(ws)
    gap = torch.tensor([inst.gap(v) for v in path], dtype=torch.float64)
    return Path(path, gap, inst.mu**2 / inst.c * gap, torch.tensor(devs), torch.tensor(tols))


@dataclass
class Check:
    """One rule on the construction of Theorem 4.5 (:func:`check`)."""

    rule: str
    n: int
    f: int
    eta_mu: float
    """ημ of the run (2cη: the regime is (i) below 2, (ii) at 2, (iii) above)."""
    majority: MajorityCheck
    path: Path | None
    exact: Tensor | None
    """The closed form's iterates (:func:`closed_form`)."""
    limit_gap: float
    limit_grad: float
    gap_diff: float = math.nan
    """|F(w_T) − F* of the run − that of the closed form|."""
    gap_tolerance: float = math.nan
    notes: list[str] = field(default_factory=list)
    proven_kappa: float | None = None
    """The rule's proven κ at n (:func:`~phalanx.analysis.ratios.proven_upper_bound`): only then is it in the
    theorem's class; the majority check alone is a necessary condition."""
    stateful: bool = False
    """The rule keeps state across calls (FLDetector's history): the majority check tests it fresh, ByzGD as its
    state grows, so a run that leaves the closed form is the state's doing, not a bug."""

    @property
    def stalls(self) -> bool:
        """The run followed the majority's gradient every round and ended on the closed form."""
        return self.path is not None and self.path.followed and self.gap_diff <= self.gap_tolerance

    @property
    def verdict(self) -> str:
        """``stalls: in the theorem's class …`` (a proven κ, and it stalls where the theorem says), ``stalls: the
        class's necessary condition holds …`` (no proven κ: it kept n − f identical rows wherever the adversary
        placed the others, which (f, κ)-robustness needs but does not follow from, and stalls where the theorem
        says), ``escapes: …`` (outside the class: not (f, κ)-robust, or a stateful rule whose later rounds are not
        the fresh rule the majority check tested), or ``BUG: …`` (a stateless rule passes the majority check but
        its run leaves the closed form; what was seen)."""
        if self.majority.holds:
            if self.stalls:
                if self.proven_kappa is not None:
                    return (f"stalls: in the theorem's class (proven κ ≤ {self.proven_kappa:.4g}), on the closed "
                            "form")
                return ("stalls: the class's necessary condition holds (n − f identical rows kept; no proven κ), "
                        "on the closed form")
            if self.stateful:
                return ("escapes: stateful — a fresh rule keeps the n − f identical rows, but with the history of "
                        "the rounds before it does not (not a fixed function of its rows, outside the theorem)")
            return self._bug()
        why = self.majority.error or (f"not (f, κ)-robust for any κ: n − f identical rows moved by "
                                      f"{self.majority.deviation:.3g} ({self.majority.placement})")
        return f"{'stalls anyway' if self.stalls else 'escapes'}: {why}"

    def _bug(self) -> str:
        """What a stateless rule that passed the majority check did on ByzGD's rows."""
        kept = "n − f identical rows kept where the majority check looked"
        if self.path is None:
            return f"BUG: {kept}, yet ByzGD could not run"
        p = self.path
        off = p.deviation - p.tolerance
        if not p.followed:
            t = int(off.argmax())
            return (f"BUG: {kept}, yet on ByzGD's rows the aggregate left the majority's gradient (round {t}: by "
                    f"{float(p.deviation[t]):.3g}, tolerance {float(p.tolerance[t]):.3g})")
        return (f"BUG: {kept}, and the aggregate followed the majority's gradient every round, yet F(w_T) − F* is "
                f"off the closed form by {self.gap_diff:.3g} (tolerance {self.gap_tolerance:.3g})")

    @property
    def final_gap(self) -> float:
        return math.nan if self.path is None else float(self.path.gap[-1])


def check(rule: Aggregator, n: int, *, eta_mu: float = 0.2, steps: int = 60, d: int = 1, w0: float = 0.0,
          G: float = 1.0, seed: int = 0) -> Check:
    """The rule (configured for its f) on the construction of Theorem 4.5 with n workers (module docstring): the
    majority check, then ByzGD at step η = ``eta_mu``/μ for ``steps`` rounds from w₀ = ``w0``·u."""
    f = int(getattr(rule, "f", 0))
    inst = Instance(n, f, G, d)
    eta_mu = check_real("eta_mu", eta_mu, low=0.0, low_open=True)
    spec = getattr(rule, "spec", rule.name)
    maj = majority_check(rule, n, d=max(d, 2), seed=seed)
    out = Check(spec, n, f, eta_mu, maj, None, None, inst.limit_gap, inst.limit_grad,
                proven_kappa=proven_upper_bound(rule, n), stateful=bool(rule.stateful))
    eta = eta_mu / inst.mu
    try:
        path = descend(inst, rule, eta, steps, w0, seed)
    except PhalanxError as exc:
        out.notes.append(f"ByzGD could not run: {exc}")
        return out
    exact = closed_form(inst, eta, steps, w0)
    out.path, out.exact = path, exact
    exact_gap = inst.gap(exact[-1])
    out.gap_diff = abs(float(path.gap[-1]) - exact_gap)
    # per round the iterate may be off by η·(the output tolerance) more; the error contracts by |1 − ημ| a round
    q = abs(1.0 - eta_mu)
    rounds = float(steps) if q >= 1.0 else min(float(steps), 1.0 / (1.0 - q))
    delta = eta * float(path.tolerance.max()) * rounds * math.sqrt(d)
    resid = math.sqrt(max(exact_gap, 0.0) / inst.c)
    out.gap_tolerance = 2.0 * inst.c * (2.0 * resid * delta + delta * delta) + 1e-15 * max(1.0, exact_gap)
    return out
