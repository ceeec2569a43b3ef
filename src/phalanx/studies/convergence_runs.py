r"""The computation of the convergence study (:mod:`phalanx.studies.convergence`, ``phalanx tension convergence``):
its preset, its cells and the GD run of each. The tables, the report and the plot are in
:mod:`phalanx.studies.convergence`.

Three kinds of cells:

1. **Theorem 4.5, the paper's construction** (:mod:`phalanx.analysis.theorem45`): for every rule of
   ``paper_rules`` (empty: every rule of the registry) and f of ``construction_fs``, the majority check (n − f
   identical rows against an adversary placing the f others) and ByzGD with the real rule on the paper's quadratics;
   the verdict (stalls at (f/(n − f))G²/(2μ), or escapes, and why), the last round beside the closed form.
2. **Phalanx's Proposition 3** (:func:`phalanx.analysis.convergence.construct`, translation- and scale-equivariant
   rules, η < 2/μ), for the rules of ``construction_rules`` whose worst case is in closed form.
3. **Real problems** (:mod:`phalanx.analysis.problems`): least squares, softmax regression, a tanh MLP on Dirichlet
   shards, full-batch GD; the floor F(θ_T) − F* or ‖∇F(θ_T)‖² beside εζ²(θ_T)/(2μ) or εζ²(θ_T) with a **proven** ε:
   the rule's own (``rule.epsilon(n)``), else its proven κ (Yang, Shi & Li, Theorem 3.2: an (f, κ)-robust rule is
   κ-accurate), else no bound. A measured ε is a lower bound and is never used as one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from phalanx import aggregators
from phalanx.analysis import convergence as cv
from phalanx.analysis import problems as pb
from phalanx.analysis import theorem45
from phalanx.analysis.kappa import proven_upper_bound
from phalanx.errors import ConfigError
from phalanx.studies.planner import f_matters
from phalanx.studies.raw import NAN_OK

PROBLEM_LABELS = {"least-squares": "lsq", "logistic": "logreg", "mlp": "mlp"}
PAPER = "theorem 4.5"
"""The ``problem`` of the paper's construction's cells."""
CONSTRUCTION = "construction"
"""The ``problem`` of Proposition 3's cells."""


@dataclass(frozen=True)
class Preset:
    """One setting of the study."""

    name: str
    description: str
    dataset: str = "digits"
    fallback_dataset: str | None = None
    seeds: tuple[int, ...] = (0, 1, 2)
    workers: int = 16
    rules: tuple[str, ...] = ("mean", "cwtm", "cwmed", "geomed", "krum")
    fs: tuple[int, ...] = (2, 5)
    alphas: tuple[float, ...] = (0.1, 1.0)
    problems: tuple[str, ...] = ("least-squares", "logistic", "mlp")
    rounds: int = 300
    lam: float = 0.1
    """ℓ2 regularisation of least squares and softmax regression (μ ≥ λ)."""
    mlp_lam: float = 1e-4
    hidden: int = 32
    mlp_lr: float = 0.5
    """The MLP's step size (the PL problems step with 1/L)."""
    construction_rules: tuple[str, ...] = ("mean", "cwtm", "cwmed", "geomed")
    """Proposition 3's rules (those of :data:`phalanx.analysis.convergence.CLOSED_FORM_SPLIT`)."""
    construction_fs: tuple[int, ...] = (1, 3, 5, 7)
    construction_steps: int = 60
    construction_lr: float = 0.2
    """ημ of both constructions."""
    paper_rules: tuple[str, ...] = ()
    """Theorem 4.5's rules (empty: every rule of the registry)."""


PRESETS: dict[str, Preset] = {
    "quick": Preset("quick", "Theorem 4.5's construction for every rule, Proposition 3's, and least squares, softmax "
                    "regression and a 64-32-10 MLP on digits (16 workers, Dirichlet α ∈ {0.1, 1}, f ∈ {2, 5}), 300 "
                    "full-batch GD rounds"),
    "full": Preset("full", "as quick with f ∈ {1 … 7}, α ∈ {0.1, 1, 10}, 1000 rounds", fs=(1, 2, 3, 4, 5, 6, 7),
                   alphas=(0.1, 1.0, 10.0), rounds=1000, seeds=(0, 1, 2, 3, 4)),
}


@dataclass(frozen=True)
class Cell:
    """One GD run: a real problem's (problem, α, rule, f, seed), or a construction's (problem :data:`PAPER` or
    :data:`CONSTRUCTION`, α = 0, seed 0)."""

    problem: str
    alpha: float
    rule: str
    f: int
    seed: int


@dataclass
class Outcome:
    """What a cell's GD run ended with."""

    floor: float
    """F(θ_T) − F* (PL problems, the constructions) or ‖∇F(θ_T)‖² (MLP)."""
    bound: float = field(metadata=NAN_OK)
    """εζ²(θ_T)/(2μ) or εζ²(θ_T) with a proven ε (NaN where none is proven); for a construction, the closed form's
    value at the last round."""
    epsilon: float = field(metadata=NAN_OK)
    """The proven ε (NaN: none is proven; ``runs.csv`` lets this, the bound and the ratio hold NaN)."""
    epsilon_source: str
    """``proven`` (the rule's ε), ``kappa`` (its proven κ, Theorem 3.2), ``none``; for Theorem 4.5, ``theorem``
    (ε is then f/(n − f), the theorem's constant)."""
    zeta2: float
    ratio: float = field(metadata=NAN_OK)
    """The rule's realised aggregation error at θ_T (ρ of Proposition 3; for Theorem 4.5 the largest deviation of the
    aggregate from the majority's gradient over the rounds)."""
    curve: list[float] = field(default_factory=list)
    """The floor's quantity at every round."""
    bound_curve: list[float] = field(default_factory=list)
    """The bound at every round (the closed form, for the constructions)."""
    tolerance: float = 0.0
    limit: float = 0.0
    verdict: str = ""
    """Theorem 4.5: :attr:`phalanx.analysis.theorem45.Check.verdict`."""


@functools.cache
def f_dependent(spec: str, n: int) -> bool:
    """Whether a rule's output depends on f — :func:`phalanx.studies.planner.f_matters` at f = 1 and the largest f
    it runs with at n. The mean, the median and the geometric median read f only to check n: they run once, and
    their f is shown as —."""
    fits = [f for f in range(1, (n - 1) // 2 + 1) if n >= aggregators.make(spec, f=f).min_workers()]
    return len(fits) < 2 or f_matters(spec, fits[0], fits[-1], n)


SUBSET_CAP = 1000
"""SMEA at an f whose C(n, f) exceeds this is left out of the default Theorem 4.5 rules (:func:`paper_skipped`)."""


def paper_rules(p: Preset) -> tuple[str, ...]:
    """Theorem 4.5's rules: ``paper_rules``, or every rule of the registry."""
    return p.paper_rules or tuple(aggregators.names("rule"))


def paper_skipped(p: Preset, spec: str, f: int) -> str | None:
    """Why a (rule, f) of the default Theorem 4.5 rules is not run, or None: SMEA enumerates the C(n, f) subsets of
    n − f rows in every call — C(16, 5) = 4 368 took 3 s a call on the loaded 2-core machine, C(16, 7) = 11 440 more
    than 10 min — and the check calls it about 130 times; tests/test_theorem45.py runs it at n = 9. A rule named in
    ``paper_rules`` always runs."""
    if not p.paper_rules and spec == "smea" and math.comb(p.workers, f) > SUBSET_CAP:
        return f"C({p.workers}, {f}) = {math.comb(p.workers, f)} subsets per call"
    return None


def check_preset(p: Preset) -> Preset:
    """Every bad value refused in one line naming it, before anything is computed."""
    n = p.workers
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        raise ConfigError("workers", n, "an integer >= 3")
    for f in (*p.fs, *p.construction_fs):
        if isinstance(f, bool) or not isinstance(f, int) or f < 0 or 2 * f >= n:
            raise ConfigError("f", f, f"an integer with 0 <= f < n/2 = {n / 2:g}", "no honest majority beyond")
    for a in p.alphas:
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < math.inf:
            raise ConfigError("alphas", a, "finite numbers > 0 (small: skewed; large: close to IID)")
    for prob in p.problems:
        if prob not in pb.MODELS:
            raise ConfigError("problems", prob, "one of " + ", ".join(pb.MODELS))
    for spec in (*p.rules, *p.construction_rules, *p.paper_rules):
        aggregators.make(spec, f=0)  # an unknown spec is its one-line error
    for spec in p.construction_rules:
        if spec not in cv.CLOSED_FORM_SPLIT:
            raise ConfigError("construction_rules", spec, "rules with a worst case in closed form: "
                              + ", ".join(cv.CLOSED_FORM_SPLIT), "Theorem 4.5 (paper_rules) covers every rule")
    for key in ("rounds", "construction_steps", "hidden"):
        v = getattr(p, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(key, v, "an integer >= 1")
    for key in ("lam", "mlp_lr"):
        v = getattr(p, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise ConfigError(key, v, "a finite number > 0" + (" (μ ≥ λ: without it the problem is not PL)"
                                                              if key == "lam" else ""))
    v = p.construction_lr
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 2:
        raise ConfigError("construction_lr", v, "a number in (0, 2) (ημ with μ = 1: GD converges)")
    v = p.mlp_lam
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
        raise ConfigError("mlp_lam", v, "a finite number >= 0")
    return p


def settings(specs: tuple[str, ...], fs: tuple[int, ...], n: int) -> list[tuple[str, int]]:
    """(rule, f) of the real problems: every f of ``fs`` for a rule whose output depends on f, else f = 0 once; the
    settings the rule cannot run with at n left out."""
    out: list[tuple[str, int]] = []
    for spec in specs:
        for f in (fs if f_dependent(spec, n) else (0,)):
            rule = aggregators.make(spec, f=f)
            if n >= rule.min_workers():
                out.append((spec, f))
    return out


def plan_cells(p: Preset) -> list[Cell]:
    """Theorem 4.5's cells (f ≥ 1, where the rule runs with ``workers``), Proposition 3's, then every real problem's
    (rules that cannot run with ``workers`` at an f left out; the report lists them)."""
    n = p.workers
    fs = [f for f in p.construction_fs if f >= 1]
    cells = [Cell(PAPER, 0.0, spec, f, 0) for spec in paper_rules(p) for f in fs
             if n >= aggregators.make(spec, f=f).min_workers() and paper_skipped(p, spec, f) is None]
    cells += [Cell(CONSTRUCTION, 0.0, spec, f, 0) for spec in p.construction_rules for f in p.construction_fs
              if n >= aggregators.make(spec, f=f).min_workers()]
    for prob in p.problems:
        for a in p.alphas:
            for spec, f in settings(p.rules, p.fs, n):
                cells.extend(Cell(prob, float(a), spec, f, s) for s in p.seeds)
    return cells


def rule_epsilon(spec: str, f: int, n: int) -> tuple[float, str]:
    """A proven ε of the rule: its own (``proven``), else its proven κ (``kappa``: Yang, Shi & Li, ICML 2025,
    Theorem 3.2), else NaN (``none``). Never a measured value: a measured ε is a lower bound."""
    rule = aggregators.make(spec, f=f)
    eps = rule.epsilon(n)
    if eps is not None:
        return float(eps), "proven"
    k = proven_upper_bound(rule, n) if n > 2 * f else None
    return (float(k), "kappa") if k is not None else (math.nan, "none")


def run_construction(p: Preset, cell: Cell) -> Outcome:
    """Proposition 3's GD run of one (rule, f), float64, μ = 1, from w₀ = 2·1."""
    rule = aggregators.make(cell.rule, f=cell.f)
    c = cv.construct(rule, p.workers, d=4, mu=1.0)
    eta, steps = p.construction_lr, p.construction_steps
    measured = cv.run(c, rule, eta, steps)
    exact = cv.closed_form(c, eta, steps)
    eps = c.epsilon if c.epsilon is not None else math.nan
    return Outcome(float(measured[-1]), float(exact[-1]), float(eps), "proven", c.zeta2, c.ratio, measured.tolist(),
                   exact.tolist(), cv.tolerance(c, rule, eta, steps), c.limit)


def run_paper(p: Preset, cell: Cell) -> Outcome:
    """Theorem 4.5's check of one (rule, f) (:func:`phalanx.analysis.theorem45.check`), ημ = ``construction_lr``,
    ``construction_steps`` rounds from w₀ = 0, G = 1."""
    rule = aggregators.make(cell.rule, f=cell.f)
    ch = theorem45.check(rule, p.workers, eta_mu=p.construction_lr, steps=p.construction_steps)
    inst = theorem45.Instance(p.workers, cell.f)
    curve = [] if ch.path is None else ch.path.gap.tolist()
    exact = [] if ch.exact is None else [inst.gap(w) for w in ch.exact]
    dev = math.nan if ch.path is None else float(ch.path.deviation.max())
    return Outcome(ch.final_gap, exact[-1] if exact else math.nan, cell.f / (p.workers - cell.f), "theorem", 1.0, dev,
                   curve, exact, ch.gap_tolerance, ch.limit_gap, ch.verdict)


def collect_all(p: Preset, cells: list[Cell], root: str | None = None) -> dict[Cell, Outcome]:
    """Every cell's outcome: the constructions', then the real problems' (one data split and problem per
    (problem, α, seed), shared by its rules), on one thread — the arrays are small (16 × 2410 at most), so intra-op
    threads only add synchronisation, which on a busy machine costs more than the work (the trimmed mean's kernel:
    0.2 ms a call on one thread, ~16 ms with two on a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _collect(p, cells, root)
    finally:
        torch.set_num_threads(threads)


def group_problem(p: Preset, x: torch.Tensor, y: torch.Tensor, prob: str, alpha: float,
                  seed: int) -> tuple[pb.Problem, pb.Curvature | None, float]:
    """The problem a (problem, α, seed) group of cells shares — its Dirichlet split of ``x``, ``y`` over
    ``workers`` — its curvature (None for the MLP) and the step size: 1/L for the PL problems, ``mlp_lr`` for the
    MLP. The study's runs and its estimate (:mod:`phalanx.studies.convergence_estimate`) build it the same way."""
    from phalanx.data.partition import partition

    parts = partition(y, p.workers, "dirichlet", alpha=alpha, seed=seed)
    lam = p.mlp_lam if prob == "mlp" else p.lam
    problem = pb.make_problem(prob, x, y, parts, lam=lam, hidden=p.hidden, seed=seed)
    curv = None if prob == "mlp" else pb.curvature(problem)
    return problem, curv, p.mlp_lr if curv is None else 1.0 / curv.L


def _collect(p: Preset, cells: list[Cell], root: str | None) -> dict[Cell, Outcome]:
    from phalanx import data

    out: dict[Cell, Outcome] = {}
    for cell in cells:
        if cell.problem == PAPER:
            out[cell] = run_paper(p, cell)
        elif cell.problem == CONSTRUCTION:
            out[cell] = run_construction(p, cell)
    eps_cache: dict[tuple[str, int], tuple[float, str]] = {}
    real = [c for c in cells if c.problem not in (PAPER, CONSTRUCTION)]
    if not real:
        return out
    ds = data.load(p.dataset, root=root)
    x, y = ds.train_x, ds.train_y
    groups: dict[tuple[str, float, int], list[Cell]] = {}
    for c in real:
        groups.setdefault((c.problem, c.alpha, c.seed), []).append(c)
    for (prob, alpha, seed), members in groups.items():
        problem, curv, eta = group_problem(p, x, y, prob, alpha, seed)
        for c in members:
            key = (c.rule, c.f)
            if key not in eps_cache:
                eps_cache[key] = rule_epsilon(c.rule, c.f, p.workers)
            eps, source = eps_cache[key]
            tr = pb.descend(problem, aggregators.make(c.rule, f=c.f), eta, p.rounds)
            if curv is None:
                curve, bounds = tr.grad_sq, eps * tr.zeta2
            else:
                curve, bounds = tr.value - curv.f_star, eps * tr.zeta2 / (2 * curv.mu)
            out[c] = Outcome(float(curve[-1]), float(bounds[-1]), eps, source, float(tr.zeta2[-1]),
                             float(tr.ratio[-1]), curve.tolist(), bounds.tolist())
    return out
