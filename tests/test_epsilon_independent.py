"""scripts/epsilon_independent.py: the table of our ε search beside an independent one (issue 34 item 1), on a tiny
case; its certification agrees with the project's exact ratio; and two weakened versions of our search — the old
constructions-only estimate, and the search with budget 0 — are reported "beaten" (the mutants of the check)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from _scripts import load_script
from phalanx import aggregators
from phalanx.aggregators import Aggregator
from phalanx.analysis import aggregation_error
from phalanx.analysis.epsilon_search import constructions
from phalanx.analysis.ratios import exact_ratio, round_down

pytest.importorskip("scipy")
script = load_script("scripts/epsilon_independent.py", "epsilon_independent")


def test_the_certified_value_is_the_projects_exact_ratio() -> None:
    x = np.random.default_rng(3).normal(size=(7, 3))
    for spec in ("krum", "meamed"):
        out = aggregators.make(spec, f=2)(torch.from_numpy(x))
        q = exact_ratio(out, torch.from_numpy(x), list(range(7)))
        assert q is not None and script.certified(spec, 2, x) == round_down(q)
    assert script.certified("krum", 1, np.ones((5, 2))) == 0.0  # no spread: no value


def test_the_table_at_n_5(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [script.compare(spec, 5, 1, de_evals=600, nm_evals=400, seeds=[0]) for spec in ("krum", "meamed")]
    for r in rows:
        assert r.verdict == "ours holds" and 0 < r.theirs <= r.ours * (1 + 0.05), r
    assert rows[1].ours == pytest.approx(0.25)  # MeaMed averages n − f values per coordinate: f/(n − f)
    lines = script.table(rows)
    assert lines[0].startswith("| rule | n | f | ours | independent best |") and len(lines) == 4
    assert lines[2].startswith("| krum | 5 | 1 | ") and lines[2].endswith("| ours holds |")


def _constructions_only(spec: str, n: int, f: int, d: int) -> float:
    """The mutant: the old estimate, the known constructions alone (no selection construction, no search)."""
    rule = aggregators.make(spec, f=f)
    return max(aggregation_error(rule(x), x) for _, x in constructions(n, d))


def test_a_constructions_only_search_is_beaten() -> None:
    row = script.compare("krum", 5, 1, de_evals=600, nm_evals=400, seeds=[0], ours_search=_constructions_only)
    assert row.verdict == "beaten" and row.ratio > 1.05, row


def test_a_search_without_its_budget_is_beaten(capsys: pytest.CaptureFixture[str]) -> None:
    assert script.main(["--cases", "krum:10:2", "--de-evals", "1000", "--nm-evals", "0", "--seeds", "0",
                        "--ours-budget", "0"]) == 0
    out = capsys.readouterr().out
    assert "| krum | 10 | 2 | 1 |" in out and out.splitlines()[2].endswith("| beaten |")
    assert "0 of 1 hold" in out



def _worst_excess(make: Callable[[int, int], Aggregator]) -> float:
    """The largest ratio / (f/(n − f)) over random inputs — Gaussian rows at random scales, and f or f + 1 rows
    shifted far (two clusters) — for n = 7 … 10 and f = 1, 2."""
    gen = torch.Generator().manual_seed(7)
    worst = 0.0
    for t in range(60):
        n, f = 7 + t % 4, 1 + t % 2
        x = torch.randn(n, 3, generator=gen, dtype=torch.float64)
        x = x * torch.rand(n, 1, generator=gen, dtype=torch.float64) * 10 ** (t % 5)
        if t % 3:
            x[: f + t % 3 - 1] += 5.0 * 10 ** (t % 5)
        worst = max(worst, aggregation_error(make(n, f)(x), x) / (f / (n - f)))
    return worst


@pytest.mark.parametrize("spec", ["multikrum", "meamed", "mda"])
def test_no_rule_averaging_n_minus_f_values_exceeds_f_over_n_minus_f(spec: str) -> None:
    """Each averages n − f values (rows, or per coordinate), so ε ≤ f/(n − f) (docs/tension.md, Cauchy–Schwarz with
    Σ yᵢ = 0): no random input goes above it."""
    assert _worst_excess(lambda n, f: aggregators.make(spec, f=f)) <= 1 + 1e-9


def test_a_multikrum_averaging_fewer_rows_exceeds_it() -> None:
    """The mutant: Multi-Krum averaging n − f − 1 rows pays (f + 1)/(n − f − 1) on f + 1 far rows — above the bound."""
    from phalanx.aggregators.krum import MultiKrum

    assert _worst_excess(lambda n, f: MultiKrum(f=f, m=n - f - 1)) > 1.1
