"""The theory table of the price of robustness (Yang, Shi & Li, ICML 2025), with measured lower bounds beside it.

For n workers and every f = 0 … ⌊(n−1)/2⌋, each rule's **proven** ε (no-attack aggregation error factor: the rule's
``epsilon(n)``, with the statement that proves it in ``epsilon_source``) and κ ((f, κ)-robustness, Allouah et al.
AISTATS 2023), next to the lower bound ε ≥ f/(n−f) that no (f, κ)-robust rule can beat (their Theorem 3.1). Where
no ε is proven, the rule's proven κ bounds it from above (their Theorem 3.2: an (f, κ)-robust rule is κ-accurate),
shown as ``≤ κ``. When asked, the **measured lower bounds**: ε by :func:`phalanx.analysis.epsilon` and κ by
:func:`phalanx.analysis.kappa` (beside κ ≥ f/(n−2f), which binds every rule), each certified by recomputing the rule
at the input found, shown as ``≥ value``. The κ column is the proven bound
(:func:`~phalanx.analysis.kappa.proven_upper_bound`: the rule's own, or NNM's composition bound for ``nnm>RULE``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from phalanx import aggregators
from phalanx.analysis.epsilon import DEFAULT_BUDGET, epsilon, lower_bound
from phalanx.analysis.kappa import kappa, proven_upper_bound, universal_lower_bound
from phalanx.errors import ConfigError, PhalanxError

DEFAULT_RULES = ("cwtm", "cwmed", "geomed", "krum", "multikrum", "meamed", "nnm>cwtm")


@dataclass
class TheoryRow:
    """One (rule, f) line of the table."""

    rule: str
    f: int
    lower_bound: float
    epsilon: float | None
    kappa: float | None
    measured: float | None = None
    worst_input: str | None = None
    note: str | None = None
    kappa_measured: float | None = None
    """The certified lower bound on κ the search found (:func:`phalanx.analysis.kappa`)."""
    kappa_unbounded: bool = False
    """The search found the ratio growing without bound (the rule is (f, κ)-robust for no κ)."""
    kappa_bound: float | None = None
    """f/(n − 2f): the κ of no rule is smaller."""
    kappa_rounding: bool = False
    epsilon_rounding: bool = False
    """The measured ε is within the rule's float64 rounding of 0 (:attr:`EpsilonEstimate.slack`): shown as such."""
    """The measured κ is at the level of float64 rounding (no error found above it)."""
    epsilon_source: str = ""
    """The statement that proves :attr:`epsilon`."""
    epsilon_upper: float | None = None
    """Where no ε is proven: the proven κ, an upper bound on ε (Theorem 3.2)."""
    kappa_source: str = ""
    """The statement that proves :attr:`kappa`."""
    above_upper: bool = False
    """The measured ε is above the proven ε or κ: a bug of the rule or its metadata."""
    kappa_bug: str = ""
    """The κ search's ``BUG: …`` verdict (above the proven κ, or a non-finite output), else empty."""


def theory_table(
    n: int, rules: tuple[str, ...] | list[str] = DEFAULT_RULES, *, measure: bool = False, d: int = 8,
    trials: int = 100, seed: int = 0, kappa_budget: int = 300, budget: int = DEFAULT_BUDGET,
    progress: Callable[[str, int], None] | None = None,
) -> list[TheoryRow]:
    """Rows for every rule and every f = 0 … ⌊(n−1)/2⌋ (rules that cannot run with that f are noted, not dropped).
    With ``measure``, ``progress(rule, f)`` is called after each of the :func:`cells` (rule, f) is done — measured,
    or noted as not measurable — so a caller can say how far the searches are (they take minutes)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError("workers", n, "an integer >= 2")
    rows: list[TheoryRow] = []
    for spec in rules:  # an unknown spec is an error up front, before any rule is measured
        aggregators.make(spec, f=0)
    for spec in rules:
        for f in range(0, (n - 1) // 2 + 1):
            lb = lower_bound(n, f)
            try:
                rule = aggregators.make(spec, f=f)
            except PhalanxError as exc:
                rows.append(TheoryRow(spec, f, lb, None, None, note=str(exc), kappa_bound=universal_lower_bound(n, f)))
                if measure and progress is not None:
                    progress(spec, f)
                continue
            if n < rule.min_workers():
                rows.append(TheoryRow(spec, f, lb, None, None, note=f"needs {rule.requirement}",
                                      kappa_bound=universal_lower_bound(n, f)))
                if measure and progress is not None:
                    progress(spec, f)
                continue
            eps, kap = rule.epsilon(n), proven_upper_bound(rule, n)
            row = TheoryRow(spec, f, lb, eps, kap, kappa_bound=universal_lower_bound(n, f),
                            epsilon_source=rule.epsilon_source if eps is not None else "",
                            epsilon_upper=kap if eps is None else None, kappa_source=kappa_source(rule, n, kap))
            if measure:
                try:
                    est = epsilon(rule, n, d=d, trials=trials, seed=seed, budget=budget)
                    k = kappa(rule, n, d=d, budget=kappa_budget, seed=seed)
                except PhalanxError as exc:  # a rule that needs more than the rows per call (FLTrust's reference)
                    what = getattr(exc, "parameter", None)
                    row.note = f"not measured: needs {what} per call" if what else f"not measured: {exc}"
                else:
                    row.measured, row.worst_input, row.above_upper = est.value, est.worst_input, est.above_upper
                    row.epsilon_rounding = 0.0 < est.value <= est.slack
                    row.kappa_measured, row.kappa_unbounded, row.kappa_rounding = k.value, k.unbounded, k.rounding
                    row.kappa_bug = k.verdict if k.above_upper else ""
                if progress is not None:
                    progress(spec, f)
            rows.append(row)
    return rows


def cells(n: int, rules: tuple[str, ...] | list[str]) -> int:
    """How many (rule, f) pairs :func:`theory_table` goes through: every rule × f = 0 … ⌊(n−1)/2⌋."""
    return len(rules) * ((n - 1) // 2 + 1)


PROBE_SHARE = 0.1
"""The share of a (rule, f)'s searches — its random inputs, CMA-ES and κ evaluations — that :func:`cell_costs` times
once per rule."""


@dataclass
class CostEstimate:
    """What :func:`cell_costs` predicts: ``costs[i]`` seconds for the i-th (rule, f) of :func:`theory_table`, in its
    order (0 for a pair the table notes as not measurable), and ``probed``: each measurable rule's predicted seconds
    for one pair (its probe's time divided by ``share``)."""

    costs: list[float]
    probed: dict[str, float]
    share: float = PROBE_SHARE

    @property
    def seconds(self) -> float:
        return sum(self.costs)

    @property
    def slowest(self) -> str | None:
        """The rule whose probe took longest (None: no rule was measurable)."""
        return max(self.probed, key=lambda r: self.probed[r], default=None)


def _measurable(spec: str, f: int, n: int) -> aggregators.Aggregator | None:
    """The rule ``spec`` with ``f``, or None where :func:`theory_table` notes the pair instead of measuring it."""
    try:
        rule = aggregators.make(spec, f=f)
    except PhalanxError:
        return None
    return None if n < rule.min_workers() else rule


def cell_costs(
    n: int, rules: tuple[str, ...] | list[str], *, d: int = 8, trials: int = 100, seed: int = 0,
    kappa_budget: int = 300, budget: int = DEFAULT_BUDGET, share: float = PROBE_SHARE,
    clock: Callable[[], float] = time.perf_counter,
) -> CostEstimate:
    """The seconds each (rule, f) of ``theory_table(n, rules, measure=True, …)`` should take here, now: for each rule,
    one pair (its middle measurable f) measured with ``share`` of every budget — ⌈share·trials⌉ random inputs,
    ⌈share·budget⌉ CMA-ES and ⌈share·kappa_budget⌉ κ evaluations — timed by ``clock`` and divided by ``share``.

    A rule's evaluations cost the same at every f to within noise (at n = 16, d = 8: 0.57–0.72 s a pair for geomed,
    0.54–0.68 s for multikrum, 0.07 s for cwtm), but the rules differ tenfold, so the first pairs alone — cwtm's —
    predicted a tenth of the whole (issue 38: an ETA of 37 s for 5 min 14 s). Time is not quite proportional to the
    budgets (a share of 0.1 took an eighth to a seventh of a whole pair here): the estimate is an order of magnitude
    on the high side, which the progress line corrects once pairs are done (:mod:`phalanx.cli.analysis`). The
    probes cost about ``share`` / (⌊(n−1)/2⌋ + 1) of the whole."""
    for spec in rules:
        aggregators.make(spec, f=0)  # an unknown spec: the one-line error before anything is timed
    fs = range(0, (n - 1) // 2 + 1)
    costs: list[float] = []
    probed: dict[str, float] = {}
    for spec in rules:
        runnable = [f for f in fs if _measurable(spec, f, n) is not None]
        per = 0.0
        rule = _measurable(spec, runnable[len(runnable) // 2], n) if runnable else None
        if rule is not None:
            start = clock()
            try:
                epsilon(rule, n, d=d, trials=math.ceil(share * trials), seed=seed, budget=math.ceil(share * budget))
                kappa(rule, n, d=d, budget=max(1, math.ceil(share * kappa_budget)), seed=seed)
            except PhalanxError:  # not measurable (the table says why): it costs nothing
                runnable = []
            else:
                per = (clock() - start) / share
                probed[spec] = per
        costs += [per if f in runnable else 0.0 for f in fs]
    return CostEstimate(costs, probed, share)


def kappa_source(rule: aggregators.Aggregator, n: int, kap: float | None) -> str:
    """The statement behind a proven κ: the rule's ``kappa_source``, or NNM's composition lemma for ``nnm>RULE``."""
    if kap is None:
        return ""
    own = getattr(rule, "kappa_source", "")
    if own and rule.kappa(n) is not None:
        return str(own)
    inner = getattr(getattr(rule, "rule", None), "kappa_source", "")
    return ("Allouah et al., AISTATS 2023, the lemma on NNM: 8f/(n − f)·(κ + 1) with the rule's κ from "
            + (inner or "its own metadata"))


def _cell(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def epsilon_cell(r: TheoryRow) -> str:
    """The proven ε of a row as a table shows it: the value, ``≤ κ`` (Theorem 3.2) where only κ is proven, or a
    dash."""
    if r.epsilon is not None:
        return f"{r.epsilon:.4g}"
    return f"≤ {r.epsilon_upper:.4g} (κ)" if r.epsilon_upper is not None else "—"


def measured_cell(r: TheoryRow) -> str:
    """The measured ε of a row: ``≥ value`` (a certified lower bound), ``BUG …`` above a proven bound, the note, or
    a dash."""
    if r.note is not None:
        return r.note
    if r.measured is None:
        return "—"
    if r.measured == float("inf"):
        return "unbounded"
    if r.epsilon_rounding:
        return "0 (rounding)"
    text = f"≥ {r.measured:.4g}"
    return text + " BUG: above the proven bound" if r.above_upper else text


def sources(rows: list[TheoryRow]) -> list[str]:
    """The statements behind the proven values of the rows, one line per rule: ``rule: ε — …; κ — …``."""
    seen: dict[str, str] = {}
    for r in rows:
        parts = []
        if r.epsilon_source:
            parts.append(f"ε — {r.epsilon_source}")
        elif r.epsilon_upper is not None:
            parts.append("ε ≤ κ — Yang, Shi & Li, ICML 2025, Theorem 3.2 (an (f, κ)-robust rule is κ-accurate)")
        if r.kappa_source:
            parts.append(f"κ — {r.kappa_source}")
        if parts and r.rule not in seen:
            seen[r.rule] = f"{r.rule}: " + "; ".join(parts)
    return list(seen.values())


def kappa_cell(r: TheoryRow) -> str:
    """The measured κ of a row as a table shows it: ``≥ value``, ``unbounded``, ``0 (rounding)``, a dash, or the
    search's ``BUG: …`` verdict."""
    if r.kappa_bug:
        return r.kappa_bug
    if r.kappa_unbounded:
        return "unbounded"
    if r.kappa_rounding:
        return "0 (rounding)"
    return "—" if r.kappa_measured is None else f"≥ {r.kappa_measured:.4g}"


def to_markdown(rows: list[TheoryRow], n: int) -> str:
    """The table as Markdown."""
    measured = any(r.measured is not None for r in rows)
    head = ["rule", "f", "lower bound f/(n−f)", "ε (proven)"]
    head += (["ε (measured lower bound)", "κ bound f/(n−2f)", "κ (proven)", "κ (measured lower bound)"] if measured
             else ["κ (proven)"])
    out = [f"Price of robustness at n = {n} (ε: no-attack aggregation error factor; proven values with the statement "
           "that proves them below; measured values are certified lower bounds, ≥)", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.rule, str(r.f), _cell(r.lower_bound), epsilon_cell(r)]
        if measured:
            cells += [measured_cell(r), _cell(r.kappa_bound), _cell(r.kappa), kappa_cell(r)]
        else:
            cells.append(_cell(r.kappa))
        out.append("| " + " | ".join(cells) + " |")
    refs = sources(rows)
    if refs:
        out += ["", "Proven values:", *(f"- {line}" for line in refs)]
    return "\n".join(out) + "\n"


def to_csv(rows: list[TheoryRow]) -> str:
    """The table as CSV (``measured`` and ``kappa_measured`` are certified lower bounds)."""
    lines = ["rule,f,lower_bound,epsilon,kappa,measured,worst_input,note,kappa_measured,kappa_unbounded,kappa_bound,"
             "epsilon_source,epsilon_upper,kappa_source,above_upper"]
    for r in rows:
        vals = [r.rule, r.f, r.lower_bound, r.epsilon, r.kappa, r.measured, r.worst_input, r.note, r.kappa_measured,
                r.kappa_unbounded if r.kappa_measured is not None else None, r.kappa_bound, r.epsilon_source or None,
                r.epsilon_upper, r.kappa_source or None, r.above_upper if r.measured is not None else None]
        lines.append(",".join("" if v is None else f'"{v}"' if isinstance(v, str) else str(v) for v in vals))
    return "\n".join(lines) + "\n"
