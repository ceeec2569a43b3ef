"""The theory table of the price of robustness (Yang, Shi & Li, ICML 2025), with measured ε beside it.

For n workers and every f = 0 … ⌊(n−1)/2⌋, each rule's ε (no-attack aggregation error factor) and κ
((f, κ)-robustness, Allouah et al. AISTATS 2023) from its metadata, next to the lower bound ε ≥ f/(n−f) that no
f-robust rule can beat (their Thm 3.1), and — when asked — the ε measured by :func:`phalanx.analysis.epsilon`.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx import aggregators
from phalanx.analysis.epsilon import epsilon, lower_bound
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


def theory_table(
    n: int, rules: tuple[str, ...] | list[str] = DEFAULT_RULES, *, measure: bool = False, d: int = 8,
    trials: int = 100, seed: int = 0,
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
                rows.append(TheoryRow(spec, f, lb, None, None, note=str(exc)))
                continue
            if n < rule.min_workers():
                rows.append(TheoryRow(spec, f, lb, None, None, note=f"needs {rule.requirement}"))
                continue
            row = TheoryRow(spec, f, lb, rule.epsilon(n), rule.kappa(n))
            if measure:
                est = epsilon(rule, n, d=d, trials=trials, seed=seed)
                row.measured, row.worst_input = est.value, est.worst_input
            rows.append(row)
    return rows


def _cell(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def to_markdown(rows: list[TheoryRow], n: int) -> str:
    """The table as Markdown."""
    measured = any(r.measured is not None for r in rows)
    head = ["rule", "f", "lower bound f/(n−f)", "ε (theory)", "κ (theory)"] + (["ε (measured)"] if measured else [])
    out = [f"Price of robustness at n = {n} (ε: no-attack aggregation error factor)", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.rule, str(r.f), _cell(r.lower_bound), _cell(r.epsilon), _cell(r.kappa)]
        if measured:
            cells.append(_cell(r.measured) if r.note is None else r.note)
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def to_csv(rows: list[TheoryRow]) -> str:
    """The table as CSV."""
    lines = ["rule,f,lower_bound,epsilon,kappa,measured,worst_input,note"]
    for r in rows:
        vals = [r.rule, r.f, r.lower_bound, r.epsilon, r.kappa, r.measured, r.worst_input, r.note]
        lines.append(",".join("" if v is None else f'"{v}"' if isinstance(v, str) else str(v) for v in vals))
    return "\n".join(lines) + "\n"
