"""The DSGD budget against an exact ε computed without dp-accounting (docs/privacy.md, "the mechanism's ε").

With every worker every round (q = 1), a client's T releases are T adaptive Gaussian mechanisms of noise σC on an
update of replace-one sensitivity 2C, i.e. exactly μ-GDP with μ = √T / (σ/2) (Dong, Roth & Su, "Gaussian differential
privacy", JRSS-B 2022, Cor. 3.3). Its exact ε(δ) is the root of δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Balle & Wang,
"Improving the Gaussian mechanism for differential privacy", ICML 2018, Thm 8), computed here with scipy's normal
log-CDF and a root finder. The reported ε is the RDP accountant's conversion, an upper bound on it: it must lie in
[exact, 1.10 × exact]. An accountant on the add/remove sensitivity (z = σ) under-reports and one on twice the
replace-one sensitivity (z = σ/4) over-reports; both are rejected below."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from scipy.stats import norm

from phalanx.analysis import privacy as accounting

pytest.importorskip("dp_accounting")

DELTA = 1e-5
CASES = [(0.5, 150), (1.0, 150), (1.5, 150), (2.0, 100), (4.0, 500), (8.0, 10)]
"""(σ, T): the privacy study's quick preset (σ = 0.5, 1, 1.5 over 150 rounds) and three others."""


exact_epsilon = accounting.exact_gdp_epsilon


def _outside(budget: Callable[..., accounting.Budget]) -> list[tuple[float, int, float, float]]:
    bad = []
    for sigma, rounds in CASES:
        reported = budget(sigma, DELTA, rounds, 20, 20).epsilon
        exact = exact_epsilon(math.sqrt(rounds) / (sigma / 2), DELTA)
        if not exact * (1 - 1e-9) <= reported <= 1.10 * exact:
            bad.append((sigma, rounds, reported, exact))
    return bad


def test_the_exact_gdp_epsilon_of_a_known_case() -> None:
    """μ = 1 at δ = 1e-5 is ε ≈ 4.377: the root found satisfies the equation itself, evaluated with the plain
    (not log) normal CDF, and ε grows with μ."""
    e = exact_epsilon(1.0, DELTA)
    assert e == pytest.approx(4.377, abs=1e-3)
    assert norm.cdf(-e + 0.5) - math.exp(e) * norm.cdf(-e - 0.5) == pytest.approx(DELTA, rel=1e-6)
    assert exact_epsilon(2.0, DELTA) > e > exact_epsilon(0.5, DELTA) > 0


def test_the_reported_dsgd_budget_is_an_upper_bound_within_10_percent_of_the_exact_epsilon() -> None:
    assert _outside(accounting.budget) == []


@pytest.mark.parametrize(("mutant", "low"), [(lambda noise: noise, True), (lambda noise: noise / 4, False)],
                         ids=["z=sigma-under-reports", "z=sigma/4-over-reports"])
def test_an_accountant_on_the_wrong_sensitivity_is_rejected(
        mutant: Callable[[float], float], low: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accounting, "multiplier", mutant)
    accounting.budget.cache_clear()
    try:
        bad = _outside(accounting.budget)
    finally:
        accounting.budget.cache_clear()
    assert len(bad) == len(CASES)
    assert all((reported < exact) == low for _, _, reported, exact in bad)
