r"""Where gradient descent with a robust rule stalls when nobody attacks, as a preset: the paper's lower-bound
construction (Theorem 4.5) for every rule, Phalanx's own exact tightness construction (Proposition 3) and real
heterogeneous problems beside the bounds — ``phalanx experiment convergence`` (also ``phalanx tension convergence``).

Yang, Shi & Li (ICML 2025), Section 4: ByzGD with an (f, κ)-robust rule and heterogeneity G² stalls — Theorem 4.5,
for every such rule and every step size, at (1/T)Σ‖∇F(w_t)‖² and 2μ(F(w_T) − F*) above any C₁ < (f/(n − f))G² — and
with an ε-accurate rule it gets within εG² (non-convex) or εG²/(2μ) (PL) — Theorem 4.6. The statements, the
constructions and Phalanx's re-derivation: :mod:`phalanx.analysis.theorem45`, :mod:`phalanx.analysis.convergence`,
docs/tension.md. The cells and their GD runs: :mod:`phalanx.studies.convergence_runs`; here the tables, the report
and the plot:

1. **Theorem 4.5** (the paper's construction, every rule of the registry): per (rule, f), whether n − f identical
   rows always give that row (the majority check), whether ByzGD with the real rule stalls at the closed form and at
   (f/(n − f))G²/(2μ), and for a rule that escapes, why.
2. **Proposition 3** (Phalanx's own: translation- and scale-equivariant rules, η < 2/μ, the rules whose worst case
   is in closed form): the measured suboptimality of every round beside its closed form, the difference against the
   rounding tolerance, the limit ρζ²/(2μ).
3. **Real problems**: the floor beside εζ²(θ_T)/(2μ) or εζ²(θ_T) with a *proven* ε (the rule's own, else its proven
   κ by Theorem 3.2, else no bound), mean ± 95 % Student-t half-width over the seeds, and the per-seed ratio
   floor/bound with its interval. At a fixed point of GD the aggregate is 0, so ‖∇F‖² = ‖Agg − ∇F‖² = ρζ² with ρ the
   realised error: "floor ≤ bound" is then ρ ≤ ε (the definition of ε) and, for the PL problems, the PL inequality —
   not a test of either theorem. What the rows measure is how far real data sit from the worst case.

No run directories are trained: every GD run is in process (float64, full batch) and takes seconds.
"""

from __future__ import annotations

import csv
import io
import math
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from phalanx import aggregators
from phalanx.analysis.ratios import proven_upper_bound
from phalanx.analysis.stats import MIN_SEEDS, Estimate, mean_ci
from phalanx.errors import ConfigError
from phalanx.studies.base import Report, Study, Timed
from phalanx.studies.convergence_runs import (
    CONSTRUCTION,
    PAPER,
    PRESETS,
    PROBLEM_LABELS,
    Cell,
    Outcome,
    Preset,
    check_preset,
    collect_all,
    f_dependent,
    paper_rules,
    paper_skipped,
    plan_cells,
    rule_epsilon,
    settings,
)
from phalanx.studies.registry import register
from phalanx.studies.reporting import family_note, holm_family, pick_preset, provenance, write_report_files

if TYPE_CHECKING:
    from phalanx.experiments.validrun import ValidRun

__all__ = [
    "PRESETS", "Cell", "ConvergenceStudy", "Outcome", "Preset", "Row", "Trend", "check_preset", "collect_all",
    "construction_table", "mean_ci", "paper_rules", "paper_table", "plan_cells", "rows", "rule_epsilon",
    "terminal_table", "trends",
]


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
    return str(f) if f_dependent(spec, n) else "—"


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
    seeds: tuple[int, ...] = ()
    """The seeds of :attr:`share`'s samples, in order (empty: not known; the verdict then names the sample's index)."""
    above_seeds: tuple[int, ...] = ()
    """The seeds whose floor is above their bound, decided seed by seed before any logarithm (a seed with a floor or a
    bound of 0 made the shares infinite and hid another seed above its bound: a review)."""

    @property
    def bounded(self) -> bool:
        """A proven ε (the rule's, or its κ by Theorem 3.2) gives this row a bound."""
        return self.epsilon_source in ("proven", "kappa") and self.epsilon > 0

    def verdict(self) -> str:
        if self.epsilon_source not in ("proven", "kappa"):
            return "no proven ε: no bound"
        if self.epsilon == 0:
            return "ε = 0: no bound"
        if self.above_seeds:  # the bound is proven for every seed: one seed above it is a counterexample
            return f"above the bound (seed {self.above_seeds[0]})"
        above = [i for i, v in enumerate(self.share.samples) if v > 0.0]  # floor > bound on that seed
        if above:  # the bound is proven for every seed: one seed above it is a counterexample, whatever the mean says
            i = above[0]
            which = f"seed {self.seeds[i]}" if i < len(self.seeds) else f"the seed at index {i}"
            return f"above the bound ({which})"
        why = self.share.why_no_verdict("ratio")
        if why is not None:
            return f"no verdict ({why})"
        decided = self.share.verdict("negative")  # on the Holm-adjusted p-value within the rows' family
        return {"holds": "below the bound", "contradicted": "above the bound"}.get(decided, decided)


def rows(p: Preset, collected: dict[Cell, Outcome]) -> list[Row]:
    """The real problems' rows, in the preset's order."""
    out = []
    for prob in p.problems:
        for a in p.alphas:
            for spec, f in settings(p.rules, p.fs, p.workers):
                got = [collected[Cell(prob, float(a), spec, f, s)] for s in p.seeds
                       if Cell(prob, float(a), spec, f, s) in collected]
                if not got:
                    continue
                share = [math.log(o.floor / o.bound) if o.bound > 0 and o.floor > 0 else math.inf for o in got
                         if math.isfinite(o.bound)]
                seeds = tuple(s for s in p.seeds if Cell(prob, float(a), spec, f, s) in collected
                              and math.isfinite(collected[Cell(prob, float(a), spec, f, s)].bound))
                above = tuple(s for s in p.seeds if (c := Cell(prob, float(a), spec, f, s)) in collected
                              and math.isfinite(collected[c].bound) and collected[c].floor > collected[c].bound)
                out.append(Row(prob, float(a), spec, f, mean_ci([o.floor for o in got]),
                               mean_ci([o.bound for o in got]),
                               mean_ci(share) if share and all(map(math.isfinite, share)) else
                               Estimate(math.inf, math.inf, math.inf, len(got)),
                               mean_ci([o.ratio for o in got]), got[0].epsilon, got[0].epsilon_source, seeds,
                               above))
    # the rows with a bound are read together: one Holm family (the others decide nothing)
    bounded = [i for i, r in enumerate(out) if r.bounded and math.isfinite(r.share.mean)]
    for i, r in zip(bounded, holm_family([out[i] for i in bounded], "share")):
        out[i] = r
    return out


def _cells(collected: dict[Cell, Outcome], problem: str) -> list[tuple[Cell, Outcome]]:
    return [(c, o) for c, o in collected.items() if c.problem == problem]


def _short(verdict: str) -> str:
    """A Theorem 4.5 verdict in a word or two (the report gives the reason)."""
    return verdict.split(":", 1)[0]


def _label(verdict: str, spec: str, f: int, n: int) -> str:
    """The table's verdict: ``stalls (class)`` where the rule has a proven κ at n (in the theorem's class), ``stalls
    (nec.)`` where it only passed the class's necessary condition (the majority check), else :func:`_short`. Decided
    from the rule, so results recorded before the verdicts said which read the same."""
    word = _short(verdict)
    if word != "stalls":
        return word
    return "stalls (class)" if proven_upper_bound(aggregators.make(spec, f=f), n) is not None else "stalls (nec.)"


def paper_table(p: Preset, collected: dict[Cell, Outcome]) -> str:
    """Theorem 4.5's construction, plain text within 80 columns: per (rule, f) the limit (f/(n − f))G²/(2μ), the run's
    F(w_T) − F*, its distance to the closed form, and the verdict."""
    lines = [f"Theorem 4.5 (Yang, Shi & Li): n = {p.workers}, n − f identical gradients, G = 1,",
             f"ημ = {p.construction_lr:g}, {p.construction_steps} rounds; limit = (f/(n−f))G²/(2μ)",
             "stalls (class): a proven κ; (nec.): only the check n − f equal rows need",
             f"{'rule':<18}{'f':>2} {'limit':>9} {'F(w_T)−F*':>10} {'|diff|':>8} {'tol':>8}  verdict"]
    for c, o in _cells(collected, PAPER):
        lines.append(f"{c.rule:<18}{c.f:>2} {o.limit:>9.5g} {o.floor:>10.4g} {abs(o.floor - o.bound):>8.1e} "
                     f"{o.tolerance:>8.1e}  {_label(o.verdict, c.rule, c.f, p.workers)}")
    return "\n".join(line.rstrip() for line in lines)


def construction_table(p: Preset, collected: dict[Cell, Outcome]) -> str:
    """Proposition 3's construction, plain text within 80 columns: per (rule, f) ρ, ε, the limit ρζ²/(2μ), the last
    round's measured and closed-form suboptimality, their difference and the rounding tolerance."""
    lines = [f"Proposition 3 (Phalanx's own: equivariant rules, η < 2/μ): n = {p.workers}, μ = L = 1,",
             f"ημ = {p.construction_lr:g}, {p.construction_steps} rounds, float64",
             f"{'rule':<10}{'f':>2} {'ρ':>7} {'ε':>7} {'limit':>9} {'measured':>10} {'closed form':>11} "
             f"{'|diff|':>8} {'tol':>8}"]
    for c, o in _cells(collected, CONSTRUCTION):
        eps = f"{o.epsilon:.4g}" if math.isfinite(o.epsilon) else "—"
        lines.append(f"{c.rule:<10}{c.f:>2} {o.ratio:>7.4f} {eps:>7} {o.limit:>9.5g} {o.floor:>10.6g} "
                     f"{o.bound:>11.6g} {abs(o.floor - o.bound):>8.1e} {o.tolerance:>8.1e}")
    return "\n".join(lines)


def _eps_label(r: Row) -> str:
    if r.epsilon_source == "kappa":
        return f"≤ {r.epsilon:.4g} (κ)"
    return f"{r.epsilon:.4g}" if r.epsilon_source == "proven" else "—"


def terminal_table(p: Preset, collected: dict[Cell, Outcome]) -> str:
    """The real problems, plain text within 80 columns."""
    seeds = len(p.seeds)
    lines = [f"Real problems: {p.dataset}, n = {p.workers}, {p.rounds} full-batch GD rounds. At the last round:",
             "floor = F − F* (lsq, logreg) or ‖∇F‖² (mlp); bound = εζ²/(2μ) or εζ², ε proven",
             "(the rule's, or ε ≤ κ: Thm 3.2; — none proven);",
             f"mean ± 95 % half-width over {seeds} seeds; floor/bound: its 95 % interval.",
             f"{'prob':<7}{'α':>4} {'rule':<7}{'f':>2} {'floor':>16} {'bound':>16}  floor/bound, 95 %"]
    for r in rows(p, collected):
        share = "—" if not r.bounded else (
            f"[{_c(math.exp(r.share.low), 2)}, {_c(math.exp(r.share.high), 2)}]" if r.share.k >= MIN_SEEDS
            else f"{_c(math.exp(r.share.mean), 2)} ({r.share.k} seeds)")
        bound = "0 (ε = 0)" if r.epsilon == 0 else _pm(r.bound) if r.bounded else "—"
        lines.append(f"{PROBLEM_LABELS[r.problem]:<7}{r.alpha:>4g} {r.rule:<7}{_f_label(r.rule, r.f, p.workers):>2} "
                     f"{_pm(r.floor):>16} {bound:>16}  {share}")
    return "\n".join(line.rstrip() for line in lines)


def _markdown_rows(p: Preset, collected: dict[Cell, Outcome]) -> list[str]:
    head = ["| problem | α | rule | f | ε (proven) | floor | bound | floor / bound, geometric mean [95 %] | realised "
            "error at T | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows(p, collected):
        eps = _eps_label(r)
        g = math.exp(r.share.mean) if math.isfinite(r.share.mean) else math.inf
        share = "—" if not r.bounded else (
            f"{_c(g)} [{_c(math.exp(r.share.low), 2)}, {_c(math.exp(r.share.high), 2)}]" if r.share.k >= MIN_SEEDS
            else f"{_c(g)} ({r.share.k} seeds)")
        head.append(f"| {r.problem} | {r.alpha:g} | {r.rule} | {_f_label(r.rule, r.f, p.workers)} | {eps} | "
                    f"{_pm(r.floor)} | {'0' if r.epsilon == 0 else _pm(r.bound) if r.bounded else '—'} | {share} | "
                    f"{_pm(r.ratio)} | "
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
                fs = sorted(f for s, f in settings(p.rules, p.fs, p.workers) if s == spec)
                if not f_dependent(spec, p.workers) or len(fs) < 2:
                    continue
                lo, hi = fs[0], fs[-1]
                logs = []
                for seed in p.seeds:
                    a_lo, a_hi = Cell(prob, float(a), spec, lo, seed), Cell(prob, float(a), spec, hi, seed)
                    if a_lo in collected and a_hi in collected and collected[a_lo].floor > 0 < collected[a_hi].floor:
                        logs.append(math.log(collected[a_hi].floor / collected[a_lo].floor))
                if logs:
                    out.append(Trend(prob, float(a), spec, lo, hi, mean_ci(logs)))
    return holm_family(out, "log_ratio")


def trend_table(p: Preset, collected: dict[Cell, Outcome]) -> str:
    """The f trends, plain text within 80 columns."""
    ts = trends(p, collected)
    lines = ["Does more f stall higher? floor(f_max)/floor(f_min) per seed: geometric mean",
             "[95 %]; holds: Holm-adjusted p < 0.05 with the ratio above 1.",
             f"{'prob':<7}{'α':>4} {'rule':<7}{'f':>6}  {'ratio [95 %]':<24}{'Holm p':>7} verdict"]
    for t in ts:
        e = t.log_ratio
        ratio = (f"{_c(math.exp(e.mean))} [{_c(math.exp(e.low), 2)}, {_c(math.exp(e.high), 2)}]" if e.k >= MIN_SEEDS
                 else f"{_c(math.exp(e.mean))} ({e.k} seeds)")
        lines.append(f"{PROBLEM_LABELS[t.problem]:<7}{t.alpha:>4g} {t.rule:<7}{f'{t.low_f}→{t.high_f}':>6}  "
                     f"{ratio:<24}{e.holm_text():>7} {t.verdict()}")
    note = family_note(t.log_ratio for t in ts)
    return "\n".join([*(line.rstrip() for line in lines), *textwrap.wrap(note, 80)])


def report_markdown(p: Preset, cells: list[Cell], collected: dict[Cell, Outcome], *, command: str,
                    seconds: float | None) -> str:
    """The whole report: setup, Theorem 4.5's construction, Proposition 3's, the real problems."""
    skipped = [(spec, f) for spec in p.rules for f in (p.fs if f_dependent(spec, p.workers) else (0,))
               if p.workers < aggregators.make(spec, f=f).min_workers()]
    wall = f", computed in {seconds / 60:.1f} min" if seconds is not None else ""
    cons = _cells(collected, CONSTRUCTION)
    exact = sum(abs(o.floor - o.bound) <= o.tolerance for _, o in cons)
    paper = _cells(collected, PAPER)
    counts: dict[str, int] = {}
    for c, o in paper:
        label = _label(o.verdict, c.rule, c.f, p.workers)
        counts[label] = counts.get(label, 0) + 1
    tally = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    reasons = [f"| {c.rule} | {c.f} | {o.verdict} |" for c, o in paper if _short(o.verdict) != "stalls"]
    left_out = [f"{spec} (f={f}: {why})" for spec in paper_rules(p) for f in p.construction_fs
                if f >= 1 and (why := paper_skipped(p, spec, f)) is not None]
    parts = [
        f"# Convergence with no attack — preset `{p.name}`", "",
        *provenance(command, None, len(cells), " full-batch GD runs in process")[:2],
        f"Runs: {len(cells)} full-batch GD runs in process{wall}", "",
        "## Theorem 4.5: the paper's construction, every rule", "",
        "Yang, Shi & Li (ICML 2025), Theorem 4.5: for ByzGD with any (f, κ)-robust aggregator there exist F₁ … Fₙ "
        "satisfying Assumptions 4.1–4.4 such that, for any w₀, any constant η > 0, any C₁ < (f/(n − f))G² and any "
        "K, some T > K has (1/T)Σ_{t<T}‖∇F(w_t)‖² > C₁ and F(w_T) − F* > C₁/(2μ). Its construction: f functions "
        "c·‖w‖², n − f functions c·(‖w‖² − 2⟨u, w⟩), c = nG/(2√(f(n − f))): the n − f majority gradients are "
        "identical, so an (f, κ)-robust rule returns them and ByzGD converges to u, where F − F* = "
        f"(f/(n − f))G²/(2μ). Here G = 1, d = 1, w₀ = 0, ημ = {p.construction_lr:g}, {p.construction_steps} rounds, "
        "float64, with every rule of the registry: first an adversary places the f rows against n − f identical "
        "ones (a rule that moves is (f, κ)-robust for no κ, and outside the theorem; one that keeps them passes "
        "a necessary condition only — it is in the class where a κ is proven), then ByzGD with the real "
        f"rule beside the closed form. Verdicts: {tally}.", "",
        "```text", paper_table(p, collected), "```", "",
        *(["Why a rule escapes (or stalls without being in the theorem's class):", "",
           "| rule | f | verdict |", "|---|---|---|", *reasons, ""] if reasons else []),
        *([f"Not run here: {', '.join(left_out)} — its cost is combinatorial in f; tests/test_theorem45.py runs "
           "it at n = 9.", ""] if left_out else []),
        "## Proposition 3: Phalanx's own tightness construction (equivariant rules, η < 2/μ)", "",
        "Under assumptions stronger than the paper's — a translation- and scale-equivariant rule and a step η < 2/μ — "
        "F_i(w) = ½‖w + x_i‖² with x a worst case of the rule for ε whose output follows from the rule's definition "
        "(the trimmed mean, the median, the geometric median, the mean), GD with the real rule in float64, ημ = "
        f"{p.construction_lr:g}, from w₀ = 2·1, {p.construction_steps} rounds. {exact} of {len(cons)} (rule, f) end "
        "within the rounding tolerance of the closed form (the tests check every round, in float32 too).", "",
        "```text", construction_table(p, collected), "```", "",
        "## Real problems", "",
        f"{p.dataset} training split over {p.workers} workers, Dirichlet(α) label skew, full-batch GD for {p.rounds} "
        f"rounds in float64: least squares on one-hot targets and softmax regression (λ = {p.lam:g}, step 1/L, μ = "
        f"λ_min of the Hessian for least squares, μ = λ for softmax regression) and a tanh MLP with {p.hidden} hidden "
        f"units (λ = {p.mlp_lam:g}, step {p.mlp_lr:g}). Floor: F(θ_T) − F* (PL problems) or ‖∇F(θ_T)‖² (MLP); "
        "bound: εζ²(θ_T)/(2μ) or εζ²(θ_T), ζ² measured at the last iterate, with a proven ε — the rule's own, else "
        "its proven κ (Theorem 3.2: an (f, κ)-robust rule is κ-accurate; shown ≤ κ), else none (—: a measured ε is "
        "a lower bound, never a bound); the realised error is ‖Agg − ∇F‖²/ζ² at θ_T (≤ ε by definition). At a fixed "
        "point of GD the aggregate is 0, so ‖∇F‖² = ρζ² exactly: *below the bound* then says ρ ≤ ε and, for the PL "
        "problems, the PL inequality — it tests neither theorem; floor / bound measures how far real data sit from "
        "the worst case. Mean ± 95 % Student-t half-width over the seeds "
        f"{list(p.seeds)}; floor / bound: per seed, its geometric mean and 95 % interval (Student-t on the log "
        "ratio: the ratios span orders of magnitude). *below the bound*: below 1 with a Holm-adjusted p < 0.05, "
        "the rows with a bound read as one family.",
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
                "realised_error", "tolerance", "verdict"])
    for c in cells:
        o = collected[c]
        w.writerow([c.problem, c.alpha, c.rule, c.f, c.seed, repr(o.floor), repr(o.bound), repr(o.epsilon),
                    o.epsilon_source, repr(o.zeta2), repr(o.ratio), repr(o.tolerance), o.verdict])
    return buf.getvalue()


def _panel_curves(p: Preset, collected: dict[Cell, Outcome], prob: str, alpha: float, f_big: int
                  ) -> dict[str, tuple[list[float], list[float]]]:
    """Per rule of a real problem's panel (its legend label): the seed-averaged floor quantity per round and its
    bound (``[]`` when ε = 0: no bound), at ``alpha`` and, for a rule whose f matters, ``f_big``."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for spec, f in settings(p.rules, p.fs, p.workers):
        if f_dependent(spec, p.workers) and f != f_big:
            continue
        got = [collected[c] for s in p.seeds if (c := Cell(prob, alpha, spec, f, s)) in collected]
        if not got:
            continue
        free = got[0].epsilon == 0
        label = spec + (f" f={f}" if f_dependent(spec, p.workers) else "") + (" (ε = 0: no bound)" if free else "")
        out[label] = (torch.tensor([o.curve for o in got]).mean(dim=0).tolist(),
                      [] if free else torch.tensor([o.bound_curve for o in got]).mean(dim=0).tolist())
    return out


def plot(p: Preset, collected: dict[Cell, Outcome], path: Path) -> Path:
    """A panel for the construction (the trimmed mean at every f: measured, closed form, limit) and one per real
    problem at the most heterogeneous α and the largest f (every rule's floor quantity per round, seed-averaged, with
    its bound dashed in the same colour)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from phalanx.experiments.coincide import axis_span, separate
    from phalanx.experiments.plots import rule_colours, save_figure, shade

    panels = 1 + len(p.problems)
    cols = 2 if panels > 1 else 1
    rows_ = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(8.4 * cols, 4.2 * rows_), squeeze=False)
    flat = [ax for row in axes for ax in row]
    ax = flat[0]
    cons = [(c, o) for c, o in _cells(collected, CONSTRUCTION) if c.rule == "cwtm"] or \
        _cells(collected, CONSTRUCTION)[:4]
    for i, (c, o) in enumerate(cons):  # one rule, f growing: shades of the rule's own colour, light to dark (viridis
        color = shade(rule_colours([c.rule])[c.rule], i / max(len(cons) - 1, 1))  # drew cwtm f=1 in krum's purple)
        t = range(len(o.curve))
        ax.plot(t, o.curve, color=color, lw=2.2, alpha=0.6, label=f"{c.rule} f={c.f}: GD, real rule")
        ax.plot(t, o.bound_curve, color="k", ls=":", lw=1)
        ax.axhline(o.limit, color=color, ls="--", lw=1)
    ax.plot([], [], color="k", ls=":", lw=1, label="closed form (on top)")
    ax.plot([], [], color="k", ls="--", lw=1, label="limit ρζ²/(2μ)")
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("F(w) − F*")
    ax.set_title(f"Proposition 3 (Phalanx's own), n = {p.workers}, ημ = {p.construction_lr:g}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: never over a curve
    alpha, f_big = min(p.alphas), max(p.fs)
    for ax, prob in zip(flat[1:], p.problems):
        drawn = _panel_curves(p, collected, prob, alpha, f_big)
        lines = {label: curve for label, (curve, _) in drawn.items()}
        bounds = [v for _, bound in drawn.values() if bound for v in bound]
        span = axis_span([*(v for c in lines.values() for v in c), *bounds], log=True)
        looks = separate(lines, log=True, linewidth=1.6, span=span, terms=len(p.seeds))  # cwmed lay under krum
        colours = rule_colours([label.split()[0] for label in drawn])  # each rule's colour in every figure
        for label, (curve, bound) in drawn.items():
            colour = colours[label.split()[0]]
            ax.plot(range(len(curve)), [max(v, 1e-300) for v in curve], color=colour, lw=looks[label].linewidth,
                    label=looks[label].label(label))
            if bound:
                ax.plot(range(len(bound)), bound, color=colour, ls="--", lw=1)
        ax.plot([], [], color="k", ls="--", lw=1, label="its bound εζ²/(2μ)" if prob != "mlp" else "its bound εζ²")
        ax.set_yscale("log")
        ax.set_xlabel("round")
        ax.set_ylabel("F(θ) − F*" if prob != "mlp" else "‖∇F(θ)‖²")
        ax.set_title(f"{prob}, α = {alpha:g}, f = {f_big} where f matters ({len(p.seeds)} seeds averaged)",
                     fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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
    help = ("Where GD with a robust rule stalls with no attack (Yang, Shi & Li, ICML 2025): the paper's Theorem 4.5 "
            "construction run with every rule of the registry (stalls at (f/(n−f))G²/(2μ), or escapes and why), "
            "Phalanx's own exact construction for equivariant rules (Proposition 3, closed form to the dtype's "
            "precision), and least squares, softmax regression and an MLP over Dirichlet splits, measured floors "
            "beside εζ²/(2μ) and εζ² with a proven ε, with 95 % intervals; table, plot, report. Every GD run is in "
            "process on one thread: --jobs and the executor options do not apply.")
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

    def plan(self, preset: Preset, overrides: dict[str, Any]) -> tuple[list[Cell], list[ValidRun]]:
        unknown = sorted(set(overrides) - {"data_root", "download"})
        if unknown:
            raise ConfigError("--set", unknown, "fields of the convergence preset: "
                              + ", ".join(Preset.__dataclass_fields__), "this study trains no run directories")
        self._preset = check_preset(preset)
        root = overrides.get("data_root")
        self._root = None if root is None else str(root)
        return plan_cells(preset), []

    raw_value = Outcome

    def raw_cells(self, preset: Preset, cells: list[Cell], configs: list[ValidRun]) -> tuple[list[Cell], list[str]]:
        """The cells, each named (no run directory) by ``gd_`` and a hash of the preset's fields bar its name,
        description and seeds (what a cell's GD run depends on besides the cell itself): a raw-results file made with
        other rounds, workers or data is refused."""
        import dataclasses
        import hashlib
        import json

        fields = {k: v for k, v in dataclasses.asdict(preset).items() if k not in ("name", "description", "seeds")}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=repr).encode()).hexdigest()[:10]
        return cells, [f"gd_{digest}"] * len(cells)

    def summary(self, preset: Preset, cells: list[Cell], runs: list[ValidRun], out: Path) -> str:
        return (f"[bold]{self.name} {preset.name}[/bold]: {preset.description}; dataset {preset.dataset}; "
                f"{len(cells)} full-batch GD runs in process (no run directories) → {out}")

    timing = "a few GD rounds of each (problem, rule, f) and each rule's first construction"
    smaller = ("fewer seeds (--seeds 2), fewer rounds (--set rounds=…), fewer f or α values (--set fs=[2], --set "
               "alphas=[1.0]){preset}; --jobs does not apply (its GD runs are in process "
               "on one thread), and Ctrl-C stops it but keeps nothing: its results are written at the end.")

    def estimate(self, preset: Preset, cells: list[Cell]) -> Timed | None:
        """:func:`phalanx.studies.convergence_estimate.estimate` of the planned cells (their GD runs are in process:
        the grid's estimate never sees them)."""
        from phalanx.studies import convergence_estimate

        return convergence_estimate.estimate(preset, cells, self._root)

    def collect(self, cells: list[Cell], configs: list[ValidRun], runs_dir: Path) -> dict[Cell, Outcome]:
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
        return Report(files, [paper_table(preset, collected), "", construction_table(preset, collected), "",
                              terminal_table(preset, collected), "", trend_table(preset, collected)])
