"""The theory table of the price of robustness (Yang, Shi & Li, ICML 2025), with measured ε beside it.

For n workers and every f = 0 … ⌊(n−1)/2⌋, each rule's ε (no-attack aggregation error factor) and κ
((f, κ)-robustness, Allouah et al. AISTATS 2023) from its metadata, next to the lower bound ε ≥ f/(n−f) that no
f-robust rule can beat (their Thm 3.1), and — when asked — the ε measured by :func:`phalanx.analysis.epsilon` and
the certified lower bound on κ found by :func:`phalanx.analysis.kappa` (beside κ ≥ f/(n−2f), which binds every rule).
The κ column is the proven bound (:func:`~phalanx.analysis.kappa.proven_upper_bound`: the rule's own, or NNM's
composition bound for ``nnm>RULE``).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx import aggregators
from phalanx.analysis.epsilon import epsilon, lower_bound
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
    kappa_rounding: bool = False
    """The measured κ is at the level of float64 rounding (no error found above it)."""
    """f/(n − 2f): the κ of no rule is smaller."""


def theory_table(
    n: int, rules: tuple[str, ...] | list[str] = DEFAULT_RULES, *, measure: bool = False, d: int = 8,
    trials: int = 100, seed: int = 0, kappa_budget: int = 300,
) -> list[TheoryRow]:
    """Rows for every rule and every f = 0 … ⌊(n−1)/2⌋ (rules that cannot run with that f are noted, not dropped)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError("workers", n, "an integer >= 2")
    rows: list[TheoryRow] = []
    for spec in rules:
        aggregators.make(spec, f=0)  # an unknown spec is an error up front
        for f in range(0, (n - 1) // 2 + 1):
            lb = lower_bound(n, f)
            try:
                rule = aggregators.make(spec, f=f)
            except PhalanxError as exc:
                rows.append(TheoryRow(spec, f, lb, None, None, note=str(exc), kappa_bound=universal_lower_bound(n, f)))
                continue
            if n < rule.min_workers():
                rows.append(TheoryRow(spec, f, lb, None, None, note=f"needs {rule.requirement}",
                                      kappa_bound=universal_lower_bound(n, f)))
                continue
            row = TheoryRow(spec, f, lb, rule.epsilon(n), proven_upper_bound(rule, n),
                            kappa_bound=universal_lower_bound(n, f))
            if measure:
                try:
                    est = epsilon(rule, n, d=d, trials=trials, seed=seed)
                    k = kappa(rule, n, d=d, budget=kappa_budget, seed=seed)
                except PhalanxError as exc:  # a rule that needs more than the rows per call (FLTrust's reference)
                    what = getattr(exc, "parameter", None)
                    row.note = f"not measured: needs {what} per call" if what else f"not measured: {exc}"
                else:
                    row.measured, row.worst_input = est.value, est.worst_input
                    row.kappa_measured, row.kappa_unbounded, row.kappa_rounding = k.value, k.unbounded, k.rounding
            rows.append(row)
    return rows


def _cell(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def kappa_cell(r: TheoryRow) -> str:
    """The measured κ of a row as a table shows it: ``≥ value``, ``unbounded``, ``0 (rounding)`` or a dash."""
    if r.kappa_unbounded:
        return "unbounded"
    if r.kappa_rounding:
        return "0 (rounding)"
    return "—" if r.kappa_measured is None else f"≥ {r.kappa_measured:.4g}"


def to_markdown(rows: list[TheoryRow], n: int) -> str:
    """The table as Markdown."""
    measured = any(r.measured is not None for r in rows)
    head = ["rule", "f", "lower bound f/(n−f)", "ε (theory)"]
    head += ["ε (measured)", "κ bound f/(n−2f)", "κ (theory)", "κ (measured)"] if measured else ["κ (theory)"]
    out = [f"Price of robustness at n = {n} (ε: no-attack aggregation error factor)", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.rule, str(r.f), _cell(r.lower_bound), _cell(r.epsilon)]
        if measured:
            cells += [_cell(r.measured) if r.note is None else r.note, _cell(r.kappa_bound), _cell(r.kappa),
                      kappa_cell(r)]
        else:
            cells.append(_cell(r.kappa))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def to_csv(rows: list[TheoryRow]) -> str:
    """The table as CSV."""
    lines = ["rule,f,lower_bound,epsilon,kappa,measured,worst_input,note,kappa_measured,kappa_unbounded,kappa_bound"]
    for r in rows:
        vals = [r.rule, r.f, r.lower_bound, r.epsilon, r.kappa, r.measured, r.worst_input, r.note, r.kappa_measured,
                r.kappa_unbounded if r.kappa_measured is not None else None, r.kappa_bound]
        lines.append(",".join("" if v is None else f'"{v}"' if isinstance(v, str) else str(v) for v in vals))
    return "\n".join(lines) + "\n"
