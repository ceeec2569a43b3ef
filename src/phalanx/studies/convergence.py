r"""Where gradient descent with a robust rule stalls when nobody attacks, as a preset: the exact tightness
construction and real heterogeneous problems beside the bounds — ``phalanx experiment convergence`` (also
``phalanx tension convergence``).

The second result of Yang, Shi & Li (ICML 2025): GD with an ε-accurate rule and heterogeneity ζ² cannot get closer
than F − F* ≈ εζ²/(2μ) on a μ-PL objective, or ‖∇F‖² ≈ εζ² on a non-convex one (the bounds and their derivation:
:mod:`phalanx.analysis.convergence`, docs/tension.md).

Two parts:

1. **The construction** (:func:`phalanx.analysis.convergence.construct`): for every rule of ``construction_rules``
   and f of ``construction_fs``, GD with the real rule on quadratics whose centres are the rule's worst case for ε;
   the measured suboptimality of every round beside its closed form, the difference against the rounding tolerance
   (:func:`~phalanx.analysis.convergence.tolerance`), the limit ρζ²/(2μ).
2. **Real problems** (:mod:`phalanx.analysis.problems`): least squares and softmax regression (strongly convex, so
   PL) and a one-hidden-layer tanh MLP (non-convex) on the ``workers`` Dirichlet(α) shards of the data set's training
   split, full-batch GD for ``rounds`` rounds with every rule of ``rules`` (at every f of ``fs`` where the rule depends
   on f). The *floor* is F(θ_T) − F* (PL) or ‖∇F(θ_T)‖² (MLP); the *bound* is εζ²(θ_T)/(2μ) or εζ²(θ_T), with ζ²
   measured at the last iterate — where GD stalls — and ε the rule's (from the literature, else measured by
   :func:`phalanx.analysis.epsilon`, and said so). Per (problem, α, rule, f): floor and bound, mean ± 95 % Student-t
   half-width over the seeds (same seed: same split, same MLP start), and the per-seed ratio floor/bound with its
   interval — how loose the worst case is on real data.

No run directories are trained: every GD run is in process (float64, full batch) and takes seconds.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from phalanx import aggregators
from phalanx.analysis import convergence as cv
from phalanx.analysis import problems as pb
from phalanx.analysis.epsilon import epsilon
from phalanx.analysis.stats import MIN_SEEDS, Estimate, mean_ci
from phalanx.errors import ConfigError
from phalanx.studies.base import Report, Study
from phalanx.studies.planner import f_matters
from phalanx.studies.registry import register
from phalanx.studies.reporting import pick_preset, provenance, write_report_files

if TYPE_CHECKING:
    from phalanx.experiments.config import RunConfig

PROBLEM_LABELS = {"least-squares": "lsq", "logistic": "logreg", "mlp": "mlp"}


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
    construction_rules: tuple[str, ...] = ("mean", "cwtm", "cwmed", "geomed", "krum", "multikrum", "meamed", "mda")
    construction_fs: tuple[int, ...] = (1, 3, 5, 7)
    construction_steps: int = 60
    construction_lr: float = 0.2
    """ημ of the construction (μ = 1)."""


PRESETS: dict[str, Preset] = {
    "quick": Preset("quick", "the construction, and least squares, softmax regression and a 64-32-10 MLP on digits "
                    "(16 workers, Dirichlet α ∈ {0.1, 1}, f ∈ {2, 5}), 300 full-batch GD rounds"),
    "full": Preset("full", "as quick with f ∈ {1 … 7}, α ∈ {0.1, 1, 10}, 1000 rounds", fs=(1, 2, 3, 4, 5, 6, 7),
                   alphas=(0.1, 1.0, 10.0), rounds=1000, seeds=(0, 1, 2, 3, 4)),
}


@dataclass(frozen=True)
class Cell:
    """One GD run: a real problem's (problem, α, rule, f, seed), or the construction's (problem ``construction``,
    α = 0, seed 0)."""

    problem: str
    alpha: float
    rule: str
    f: int
    seed: int


@dataclass
class Outcome:
    """What a cell's GD run ended with."""

    floor: float
    """F(θ_T) − F* (PL problems, the construction) or ‖∇F(θ_T)‖² (MLP)."""
    bound: float
    """εζ²(θ_T)/(2μ) or εζ²(θ_T); for the construction, the closed-form value of the last round."""
    epsilon: float
    epsilon_source: str
    zeta2: float
    ratio: float
    """The rule's realised aggregation error at θ_T (ρ of the construction)."""
    curve: list[float] = field(default_factory=list)
    """The floor's quantity at every round."""
    bound_curve: list[float] = field(default_factory=list)
    """The bound at every round (the closed form, for the construction)."""
    tolerance: float = 0.0
    limit: float = 0.0


@functools.cache
def _f_dependent(spec: str, n: int) -> bool:
    """Whether a rule's output depends on f — :func:`phalanx.studies.planner.f_matters` at f = 1 and the largest f
    it runs with at n. The mean, the median and the geometric median read f only to check n: they run once, and
    their f is shown as —."""
    fits = [f for f in range(1, (n - 1) // 2 + 1) if n >= aggregators.make(spec, f=f).min_workers()]
    return len(fits) < 2 or f_matters(spec, fits[0], fits[-1], n)


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
    for spec in (*p.rules, *p.construction_rules):
        aggregators.make(spec, f=0)  # an unknown spec is its one-line error
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


def _settings(specs: tuple[str, ...], fs: tuple[int, ...], n: int) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for spec in specs:
        for f in (fs if _f_dependent(spec, n) else (0,)):
            rule = aggregators.make(spec, f=f)
            if n >= rule.min_workers():
                out.append((spec, f))
    return out


def plan_cells(p: Preset) -> list[Cell]:
    """The construction's cells, then every real problem's (rules that cannot run with ``workers`` at an f left out;
    the report lists them)."""
    n = p.workers
    cells = [Cell("construction", 0.0, spec, f, 0) for spec in p.construction_rules for f in p.construction_fs
             if n >= aggregators.make(spec, f=f).min_workers()]
    for prob in p.problems:
        for a in p.alphas:
            for spec, f in _settings(p.rules, p.fs, n):
                cells.extend(Cell(prob, float(a), spec, f, s) for s in p.seeds)
    return cells


def rule_epsilon(spec: str, f: int, n: int) -> tuple[float, str]:
    """The rule's ε: from the literature (``rule.epsilon(n)``), else measured by the ε search (100 random trials)."""
    rule = aggregators.make(spec, f=f)
    eps = rule.epsilon(n)
    if eps is not None:
        return float(eps), "theory"
    return float(epsilon(rule, n, d=8, trials=100, seed=0).value), "measured"


def run_construction(p: Preset, cell: Cell) -> Outcome:
    """The construction's GD run of one (rule, f), float64, μ = 1, from w₀ = 2·1."""
    rule = aggregators.make(cell.rule, f=cell.f)
    c = cv.construct(rule, p.workers, d=4, mu=1.0)
    eta, steps = p.construction_lr, p.construction_steps
    measured = cv.run(c, rule, eta, steps)
    exact = cv.closed_form(c, eta, steps)
    eps = c.epsilon if c.epsilon is not None else c.ratio
    return Outcome(float(measured[-1]), float(exact[-1]), float(eps), "theory" if c.epsilon is not None else
                   c.source, c.zeta2, c.ratio, measured.tolist(), exact.tolist(),
                   cv.tolerance(c, rule, eta, steps), c.limit)


def collect_all(p: Preset, cells: list[Cell], root: str | None = None) -> dict[Cell, Outcome]:
    """Every cell's outcome: the construction's, then the real problems' (one data split and problem per
    (problem, α, seed), shared by its rules), on one thread — the arrays are small (16 × 2410 at most), so intra-op
    threads only add synchronisation, which on a busy machine costs more than the work (the trimmed mean's kernel:
    0.2 ms a call on one thread, ~16 ms with two on a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _collect(p, cells, root)
    finally:
        torch.set_num_threads(threads)


def _collect(p: Preset, cells: list[Cell], root: str | None) -> dict[Cell, Outcome]:
    from phalanx import data
    from phalanx.data.partition import partition

    out: dict[Cell, Outcome] = {}
    for cell in cells:
        if cell.problem == "construction":
            out[cell] = run_construction(p, cell)
    eps_cache: dict[tuple[str, int], tuple[float, str]] = {}
    real = [c for c in cells if c.problem != "construction"]
    if not real:
        return out
    ds = data.load(p.dataset, root=root)
    x, y = ds.train_x, ds.train_y
    groups: dict[tuple[str, float, int], list[Cell]] = {}
    for c in real:
        groups.setdefault((c.problem, c.alpha, c.seed), []).append(c)
    for (prob, alpha, seed), members in groups.items():
        parts = partition(y, p.workers, "dirichlet", alpha=alpha, seed=seed)
        lam = p.mlp_lam if prob == "mlp" else p.lam
        problem = pb.make_problem(prob, x, y, parts, lam=lam, hidden=p.hidden, seed=seed)
        curv = None if prob == "mlp" else pb.curvature(problem)
        eta = p.mlp_lr if curv is None else 1.0 / curv.L
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


# ------------------------------------------------------------------------------------------------ tables and report


def _c(v: float, digits: int = 3) -> str:
    """Compact: plain between 0.01 and 1000 (3 significant digits), else ``2.66e-4`` (no padded exponent)."""
    if not math.isfinite(v):
        return "∞" if v > 0 else ("−∞" if v < 0 else "nan")
    if v == 0 or 0.01 <= abs(v) < 1000:
        text = f"{v:.{digits}g}"
        return f"{v:.0f}" if "e" in text else text  # 170, not 1.7e+02
    mant, exp = f"{v:.{digits - 1}e}".split("e")
    return f"{mant}e{int(exp)}"


def _pm(e: Estimate) -> str:
    if e.k < MIN_SEEDS:
        return f"{_c(e.mean)} ({e.k} seeds)"
    return f"{_c(e.mean)} ± {_c(e.half_width, 2)}"


def _f_label(spec: str, f: int, n: int) -> str:
    return str(f) if _f_dependent(spec, n) else "—"


@dataclass(frozen=True)
class Row:
    """One (problem, α, rule, f) of the real problems over its seeds."""

    problem: str
    alpha: float
    rule: str
    f: int
    floor: Estimate
    bound: Estimate
    share: Estimate
    """log(floor / bound), per seed (a ratio across orders of magnitude: its interval on the log scale, shown
    exponentiated — the geometric mean and a 95 % interval that stays positive)."""
    ratio: Estimate
    """The realised aggregation error at θ_T."""
    epsilon: float
    epsilon_source: str

    def verdict(self) -> str:
        if self.epsilon == 0:
            return "ε = 0: no bound"
        why = self.share.why_no_verdict("ratio")
        if why is not None:
            return f"no verdict ({why})"
        if self.share.high < 0:
            return "below the bound"
        return "above the bound" if self.share.low > 0 else "inconclusive"


def rows(p: Preset, collected: dict[Cell, Outcome]) -> list[Row]:
    """The real problems' rows, in the preset's order."""
    out = []
    for prob in p.problems:
        for a in p.alphas:
            for spec, f in _settings(p.rules, p.fs, p.workers):
                got = [collected[Cell(prob, float(a), spec, f, s)] for s in p.seeds
                       if Cell(prob, float(a), spec, f, s) in collected]
                if not got:
                    continue
                share = [math.log(o.floor / o.bound) if o.bound > 0 and o.floor > 0 else math.inf for o in got]
                out.append(Row(prob, float(a), spec, f, mean_ci([o.floor for o in got]),
                               mean_ci([o.bound for o in got]),
                               mean_ci(share) if all(map(math.isfinite, share)) else Estimate(math.inf, math.inf,
                                                                                               math.inf, len(got)),
                               mean_ci([o.ratio for o in got]), got[0].epsilon, got[0].epsilon_source))
    return out


def _construction_cells(p: Preset, collected: dict[Cell, Outcome]) -> list[tuple[Cell, Outcome]]:
    return [(c, o) for c, o in collected.items() if c.problem == "construction"]


def construction_table(p: Preset, collected: dict[Cell, Outcome]) -> str:
    """The construction, plain text within 80 columns: per (rule, f) ρ, ε, the limit ρζ²/(2μ), the last round's
    measured and closed-form suboptimality, their difference and the rounding tolerance."""
    lines = [f"Tightness construction: n = {p.workers}, μ = L = 1, ημ = {p.construction_lr:g}, "
             f"{p.construction_steps} rounds, float64",
             f"{'rule':<10}{'f':>2} {'ρ':>7} {'ε':>7} {'limit':>9} {'measured':>10} {'closed form':>11} "
             f"{'|diff|':>8} {'tol':>8}"]
    for c, o in _construction_cells(p, collected):
        eps = f"{o.epsilon:.4g}" if o.epsilon_source == "theory" else "—"
        lines.append(f"{c.rule:<10}{c.f:>2} {o.ratio:>7.4f} {eps:>7} {o.limit:>9.5g} {o.floor:>10.6g} "
                     f"{o.bound:>11.6g} {abs(o.floor - o.bound):>8.1e} {o.tolerance:>8.1e}")
    return "\n".join(lines)


def terminal_table(p: Preset, collected: dict[Cell, Outcome]) -> str:
    """The real problems, plain text within 80 columns."""
    seeds = len(p.seeds)
    lines = [f"Real problems: {p.dataset}, n = {p.workers}, {p.rounds} full-batch GD rounds. At the last round:",
             "floor = F − F* (lsq, logreg) or ‖∇F‖² (mlp); bound = εζ²/(2μ) or εζ²;",
             f"mean ± 95 % half-width over {seeds} seeds; floor/bound: its 95 % interval.",
             f"{'prob':<7}{'α':>4} {'rule':<7}{'f':>2} {'floor':>16} {'bound':>16}  floor/bound, 95 %"]
    for r in rows(p, collected):
        share = "—" if r.epsilon == 0 else (
            f"[{_c(math.exp(r.share.low), 2)}, {_c(math.exp(r.share.high), 2)}]" if r.share.k >= MIN_SEEDS
            else f"{_c(math.exp(r.share.mean), 2)} ({r.share.k} seeds)")
        bound = "0 (ε = 0)" if r.epsilon == 0 else _pm(r.bound)
        lines.append(f"{PROBLEM_LABELS[r.problem]:<7}{r.alpha:>4g} {r.rule:<7}{_f_label(r.rule, r.f, p.workers):>2} "
                     f"{_pm(r.floor):>16} {bound:>16}  {share}")
    return "\n".join(line.rstrip() for line in lines)


def _markdown_rows(p: Preset, collected: dict[Cell, Outcome]) -> list[str]:
    head = ["| problem | α | rule | f | ε | floor | bound | floor / bound, geometric mean [95 %] | realised error at T "
            "| verdict |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows(p, collected):
        eps = f"{r.epsilon:.4g}" + (" (measured)" if r.epsilon_source == "measured" else "")
        g = math.exp(r.share.mean)
        share = "—" if r.epsilon == 0 else (
            f"{_c(g)} [{_c(math.exp(r.share.low), 2)}, {_c(math.exp(r.share.high), 2)}]" if r.share.k >= MIN_SEEDS
            else f"{_c(g)} ({r.share.k} seeds)")
        head.append(f"| {r.problem} | {r.alpha:g} | {r.rule} | {_f_label(r.rule, r.f, p.workers)} | {eps} | "
                    f"{_pm(r.floor)} | {'0' if r.epsilon == 0 else _pm(r.bound)} | {share} | {_pm(r.ratio)} | "
                    f"{r.verdict()} |")
    return head


@dataclass(frozen=True)
class Trend:
    """Does a rule configured for more f stall higher? Per (problem, α, rule) with an f-dependent output: the per-seed
    log(floor at the largest f / floor at the smallest f) — paired, the same split and start — with its interval."""

    problem: str
    alpha: float
    rule: str
    low_f: int
    high_f: int
    log_ratio: Estimate

    def verdict(self) -> str:
        return self.log_ratio.verdict("positive")


def trends(p: Preset, collected: dict[Cell, Outcome]) -> list[Trend]:
    """The f trend of every f-dependent rule of the preset run at two f or more."""
    out = []
    for prob in p.problems:
        for a in p.alphas:
            for spec in p.rules:
                fs = sorted(f for s, f in _settings(p.rules, p.fs, p.workers) if s == spec)
                if not _f_dependent(spec, p.workers) or len(fs) < 2:
                    continue
                lo, hi = fs[0], fs[-1]
                logs = []
                for seed in p.seeds:
                    a_lo, a_hi = Cell(prob, float(a), spec, lo, seed), Cell(prob, float(a), spec, hi, seed)
                    if a_lo in collected and a_hi in collected and collected[a_lo].floor > 0 < collected[a_hi].floor:
                        logs.append(math.log(collected[a_hi].floor / collected[a_lo].floor))
                if logs:
                    out.append(Trend(prob, float(a), spec, lo, hi, mean_ci(logs)))
    return out


def trend_table(p: Preset, collected: dict[Cell, Outcome]) -> str:
    """The f trends, plain text within 80 columns."""
    lines = ["Does more f stall higher? floor(f_max)/floor(f_min) per seed: geometric mean",
             "[95 %]; holds: the whole interval above 1.",
             f"{'prob':<7}{'α':>4} {'rule':<7}{'f':>6}  {'ratio [95 %]':<28} verdict"]
    for t in trends(p, collected):
        e = t.log_ratio
        ratio = (f"{_c(math.exp(e.mean))} [{_c(math.exp(e.low), 2)}, {_c(math.exp(e.high), 2)}]" if e.k >= MIN_SEEDS
                 else f"{_c(math.exp(e.mean))} ({e.k} seeds)")
        lines.append(f"{PROBLEM_LABELS[t.problem]:<7}{t.alpha:>4g} {t.rule:<7}{f'{t.low_f}→{t.high_f}':>6}  "
                     f"{ratio:<28} {t.verdict()}")
    return "\n".join(line.rstrip() for line in lines)


def report_markdown(p: Preset, cells: list[Cell], collected: dict[Cell, Outcome], *, command: str,
                    seconds: float | None) -> str:
    """The whole report: setup, the construction, the real problems."""
    skipped = [(spec, f) for spec in p.rules for f in (p.fs if _f_dependent(spec, p.workers) else (0,))
               if p.workers < aggregators.make(spec, f=f).min_workers()]
    wall = f", computed in {seconds / 60:.1f} min" if seconds is not None else ""
    cons = _construction_cells(p, collected)
    exact = sum(abs(o.floor - o.bound) <= o.tolerance for _, o in cons)
    parts = [
        f"# Convergence with no attack — preset `{p.name}`", "",
        *provenance(command, None, len(cells), " full-batch GD runs in process")[:2],
        f"Runs: {len(cells)} full-batch GD runs in process{wall}", "",
        "## The tightness construction", "",
        f"F_i(w) = ½‖w + x_i‖² with x each rule's worst case for ε (closed form for the trimmed mean, the median, the "
        f"geometric median; else the ε search's construction), GD with the real rule in float64, ημ = "
        f"{p.construction_lr:g}, from w₀ = 2·1, {p.construction_steps} rounds. {exact} of {len(cons)} (rule, f) end "
        "within the rounding tolerance of the closed form (the tests check every round, in float32 too).", "",
        "```text", construction_table(p, collected), "```", "",
        "## Real problems", "",
        f"{p.dataset} training split over {p.workers} workers, Dirichlet(α) label skew, full-batch GD for {p.rounds} "
        f"rounds in float64: least squares on one-hot targets and softmax regression (λ = {p.lam:g}, step 1/L, μ = "
        f"λ_min of the Hessian for least squares, μ = λ for softmax regression) and a tanh MLP with {p.hidden} hidden "
        f"units (λ = {p.mlp_lam:g}, step {p.mlp_lr:g}). Floor: F(θ_T) − F* (PL problems) or ‖∇F(θ_T)‖² (MLP); "
        "bound: εζ²(θ_T)/(2μ) or εζ²(θ_T), ζ² measured at the last iterate; the realised error is "
        "‖Agg − ∇F‖²/ζ² at θ_T (≤ ε by definition). Mean ± 95 % Student-t half-width over the seeds "
        f"{list(p.seeds)}; floor / bound: per seed, its geometric mean and 95 % interval (Student-t on the log "
        "ratio: the ratios span orders of magnitude). *below the bound*: the whole interval is below 1.",
        "", *_markdown_rows(p, collected), "",
        "### Does a rule configured for more f stall higher?", "",
        "Paired by seed (same split, same start): floor at the largest f over floor at the smallest, geometric mean "
        "and 95 % interval; *holds* when the whole interval is above 1.", "",
        "```text", trend_table(p, collected), "```", "",
        *([f"Not run (the rule's requirement fails with n = {p.workers}): "
           + ", ".join(f"{s} (f={f})" for s, f in skipped), ""] if skipped else []),
    ]
    return "\n".join(parts)


def cells_csv(cells: list[Cell], collected: dict[Cell, Outcome]) -> str:
    """Every cell's outcome, one line per cell."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["problem", "alpha", "rule", "f", "seed", "floor", "bound", "epsilon", "epsilon_source", "zeta2",
                "realised_error", "tolerance"])
    for c in cells:
        o = collected[c]
        w.writerow([c.problem, c.alpha, c.rule, c.f, c.seed, repr(o.floor), repr(o.bound), repr(o.epsilon),
                    o.epsilon_source, repr(o.zeta2), repr(o.ratio), repr(o.tolerance)])
    return buf.getvalue()


def plot(p: Preset, collected: dict[Cell, Outcome], path: Path) -> Path:
    """A panel for the construction (the trimmed mean at every f: measured, closed form, limit) and one per real
    problem at the most heterogeneous α and the largest f (every rule's floor quantity per round, seed-averaged, with
    its bound dashed in the same colour)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from phalanx.experiments.plots import save_figure

    panels = 1 + len(p.problems)
    cols = 2 if panels > 1 else 1
    rows_ = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(6.2 * cols, 4.2 * rows_), squeeze=False)
    flat = [ax for row in axes for ax in row]
    ax = flat[0]
    cons = [(c, o) for c, o in _construction_cells(p, collected) if c.rule == "cwtm"] or \
        _construction_cells(p, collected)[:4]
    for i, (c, o) in enumerate(cons):
        color = f"C{i}"
        t = range(len(o.curve))
        ax.plot(t, o.curve, color=color, lw=2.2, alpha=0.6, label=f"{c.rule} f={c.f}: GD, real rule")
        ax.plot(t, o.bound_curve, color="k", ls=":", lw=1)
        ax.axhline(o.limit, color=color, ls="--", lw=1)
    ax.plot([], [], color="k", ls=":", lw=1, label="closed form (on top)")
    ax.plot([], [], color="grey", ls="--", lw=1, label="limit ρζ²/(2μ)")
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("F(w) − F*")
    ax.set_title(f"Tightness construction, n = {p.workers}, ημ = {p.construction_lr:g}")
    ax.legend(fontsize=7)
    alpha, f_big = min(p.alphas), max(p.fs)
    for ax, prob in zip(flat[1:], p.problems):
        i = 0
        for spec, f in _settings(p.rules, p.fs, p.workers):
            if _f_dependent(spec, p.workers) and f != f_big:
                continue
            got = [collected[Cell(prob, alpha, spec, f, s)] for s in p.seeds if Cell(prob, alpha, spec, f, s) in
                   collected]
            if not got:
                continue
            curve = torch.tensor([o.curve for o in got]).mean(dim=0)
            color = f"C{i}"
            free = got[0].epsilon == 0
            label = spec + (f" f={f}" if _f_dependent(spec, p.workers) else "") + (" (ε = 0: no bound)" if free
                                                                                    else "")
            ax.plot(range(len(curve)), curve.clamp_min(1e-300).tolist(), color=color, lw=1.6, label=label)
            if not free:
                bound = torch.tensor([o.bound_curve for o in got]).mean(dim=0)
                ax.plot(range(len(bound)), bound.tolist(), color=color, ls="--", lw=1)
            i += 1
        ax.plot([], [], color="grey", ls="--", lw=1, label="its bound εζ²/(2μ)" if prob != "mlp" else "its bound εζ²")
        ax.set_yscale("log")
        ax.set_xlabel("round")
        ax.set_ylabel("F(θ) − F*" if prob != "mlp" else "‖∇F(θ)‖²")
        ax.set_title(f"{prob}, α = {alpha:g}, f = {f_big} where f matters ({len(p.seeds)} seeds averaged)",
                     fontsize=10)
        ax.legend(fontsize=7)
    for ax in flat[panels:]:
        ax.set_visible(False)
    for ax in flat[:panels]:
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"GD with a robust rule, no attack ({p.dataset}, n = {p.workers}): measured (solid) and bounds "
                 "(dashed)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


@register
class ConvergenceStudy(Study[Preset, Cell, Outcome]):
    """The study (module docstring): ``phalanx experiment convergence``. Its cells are computed in :meth:`collect`
    (no run directories to train)."""

    name = "convergence"
    help = ("Where GD with a robust rule stalls with no attack (Yang, Shi & Li, ICML 2025): the exact tightness "
            "construction (every rule's worst case for ε, closed form to the dtype's precision) and least squares, "
            "softmax regression and an MLP over Dirichlet splits, measured floors beside εζ²/(2μ) and εζ², with "
            "95 % intervals; table, plot, report. Every GD run is in process on one thread: --jobs and the executor "
            "options do not apply.")
    preset_type = Preset
    presets = PRESETS
    out = "runs/convergence-quick"
    preset_help = "quick (minutes on 2 cores) or full (f = 1 … 7, α up to 10, 1000 rounds, 5 seeds)."
    set_example = "rounds=100"

    def __init__(self) -> None:
        self.seconds: float | None = None
        self._preset: Preset | None = None
        self._root: str | None = None

    def preset(self, name: str, **changes: Any) -> Preset:
        p = pick_preset(self.presets, name, changes, ("rules", "fs", "alphas", "problems"))
        return check_preset(p)

    def plan(self, preset: Preset, overrides: dict[str, Any]) -> tuple[list[Cell], list[RunConfig]]:
        unknown = sorted(set(overrides) - {"data_root", "download"})
        if unknown:
            raise ConfigError("--set", unknown, "fields of the convergence preset: "
                              + ", ".join(Preset.__dataclass_fields__), "this study trains no run directories")
        self._preset = check_preset(preset)
        root = overrides.get("data_root")
        self._root = None if root is None else str(root)
        return plan_cells(preset), []

    def summary(self, preset: Preset, cells: list[Cell], runs: list[RunConfig], out: Path) -> str:
        return (f"[bold]{self.name} {preset.name}[/bold]: {preset.description}; dataset {preset.dataset}; "
                f"{len(cells)} full-batch GD runs in process (no run directories) → {out}")

    def collect(self, cells: list[Cell], configs: list[RunConfig], runs_dir: Path) -> dict[Cell, Outcome]:
        if self._preset is None:
            raise ConfigError("preset", None, "a preset planned first (plan, then collect)")
        t0 = time.perf_counter()
        out = collect_all(self._preset, cells, self._root)
        self.seconds = time.perf_counter() - t0
        return out

    def report(
        self, preset: Preset, cells: list[Cell], collected: dict[Cell, Outcome], out: Path, *, command: str,
        wall_seconds: float | None, runs: int, overrides: dict[str, Any],
    ) -> Report:
        text = report_markdown(preset, cells, collected, command=command, seconds=self.seconds)
        files = write_report_files(out, text, cells_csv(cells, collected), "convergence.png",
                                   "suboptimality per round, bounds dashed", lambda path: plot(preset, collected, path))
        return Report(files, [construction_table(preset, collected), "", terminal_table(preset, collected), "",
                              trend_table(preset, collected)])
