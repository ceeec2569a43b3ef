"""Phalanx's own tightness construction of the no-attack convergence bounds (phalanx.analysis.convergence,
Proposition 3: equivariant rules, η < 2/μ): GD with the real rules on F_i(w) = (μ/2)‖w + x_i‖², x a worst case for
ε in closed form, follows its closed form to the dtype's precision, and its limit is εζ²/(2μ) (PL) and εζ²
(‖∇F‖²) exactly; rules without a closed form, and a rule that ignores f, are refused."""

from __future__ import annotations

import math

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators import Aggregator
from phalanx.aggregators.coordinatewise import CoordinateWiseTrimmedMean, coordinate_window_mean
from phalanx.analysis import convergence as cv
from phalanx.analysis.epsilon import aggregation_error
from phalanx.errors import ConfigError

N = 16
EQUIVARIANT = [name for name in aggregators.names() if issubclass(aggregators.get_class(name), Aggregator)
               and aggregators.get_tags(name).translation and aggregators.get_tags(name).scale]
WITH_EPSILON = [name for name in EQUIVARIANT if aggregators.make(name, f=1).epsilon(N) is not None]
CLOSED = sorted(cv.CLOSED_FORM_SPLIT)


N_PATH = 9
"""The every-round test's n: small enough that a rule whose cost grows combinatorially in n (SMEA enumerates the
subsets of n − f rows) stays cheap; the limits are tested at N = 16."""


def _cases() -> list[tuple[str, int]]:
    out = []
    for name in CLOSED:
        for f in (0, 1, 2, 4):
            rule = aggregators.make(name, f=f)
            if N_PATH >= rule.min_workers():
                out.append((name, f))
    return out


def test_the_rules_with_a_proven_epsilon_are_all_constructed() -> None:
    assert set(WITH_EPSILON) == set(CLOSED) == {"mean", "cwtm", "cwmed", "geomed"}


@pytest.mark.parametrize("name", sorted(set(EQUIVARIANT) - set(CLOSED)))
def test_no_closed_form_is_made_up_from_the_rule_under_test(name: str) -> None:
    # an A computed from the rule's own output would make "measured = closed form" hold by construction
    rule = aggregators.make(name, f=1)
    with pytest.raises(ConfigError, match=r"Theorem 4\.5") as info:
        cv.construct(rule, 9 if rule.min_workers() <= 9 else rule.min_workers())
    assert info.value.parameter == "rule"


class TrimsNothing(CoordinateWiseTrimmedMean):
    """A mutant: the trimmed mean that ignores its f (the mean), keeping its name and metadata."""

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: object) -> tuple[torch.Tensor, object]:
        return coordinate_window_mean(x, "trimmed", 0, want_contributions)


def test_mutant_trimmed_mean_ignoring_f_is_refused() -> None:
    with pytest.raises(ConfigError, match="closed form"):
        cv.construct(TrimsNothing(f=3), N)
    assert cv.construct(CoordinateWiseTrimmedMean(f=3), N).ratio == pytest.approx(3 / 13)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("name", "f"), _cases())
def test_gd_follows_the_closed_form_at_every_round(name: str, f: int, dtype: torch.dtype) -> None:
    rule = aggregators.make(name, f=f)
    c = cv.construct(rule, N_PATH, d=3, mu=0.7, scale=1.5)
    eta, steps = 0.3, 120
    measured = cv.run(c, rule, eta, steps, w0=2.0, dtype=dtype)
    exact = cv.closed_form(c, eta, steps, w0=2.0)
    tol = cv.tolerance(c, rule, eta, steps, w0=2.0, dtype=dtype)
    assert float((measured - exact).abs().max()) <= tol
    # the tolerance is rounding (or the solver's declared accuracy), not a fraction of the answer
    if cv.solver_accuracy(rule) == 0.0:
        assert tol <= 1e3 * torch.finfo(dtype).eps * max(float(exact.max()), 1.0)


@pytest.mark.parametrize("name", WITH_EPSILON)
@pytest.mark.parametrize("f", [0, 1, 4, 7])
def test_the_limit_is_the_bound_with_the_rules_epsilon(name: str, f: int) -> None:
    rule = aggregators.make(name, f=f)
    c = cv.construct(rule, N, d=2, mu=2.0, scale=0.5)
    assert c.source == "closed form"
    assert c.ratio == pytest.approx(aggregation_error(c.a, c.x), rel=1e-12, abs=1e-15)
    eps = rule.epsilon(N)
    assert eps is not None
    if name == "geomed":  # ε = 1 needs an even split with an adversarial tie-break: the construction reaches k/(n−k)
        assert c.ratio == pytest.approx(7 / 9) and c.ratio < eps
    else:
        assert c.ratio == pytest.approx(eps, rel=1e-12, abs=1e-15)
    if name == "cwtm":
        assert c.ratio == pytest.approx(f / (N - f))
    assert c.limit == pytest.approx(cv.pl_bound(c.ratio, c.zeta2, c.mu))
    assert c.gradient_floor == pytest.approx(2 * c.mu * c.limit)
    # GD's limit does not depend on the step size: ημ = 1 lands on it in one step, ημ = 1.9 oscillates into it
    for eta in (0.5, 0.95):
        path = cv.closed_form(c, eta, 400)
        assert float(path[-1]) == pytest.approx(c.limit, rel=1e-9, abs=1e-15)


def test_the_derived_upper_bounds_meet_the_construction() -> None:
    rule = aggregators.make("cwtm", f=3)
    c = cv.construct(rule, N, d=4, mu=1.0)
    path = cv.closed_form(c, 1.0, 50)  # η = 1/L with L = μ
    upper = cv.pl_upper(c.ratio, c.zeta2, c.mu, c.mu, float(path[0]), 50)
    assert bool((path <= upper * (1 + 1e-12)).all())
    assert float(path[-1]) == pytest.approx(float(upper[-1]))
    assert cv.nonconvex_upper(c.ratio, c.zeta2, 1.0, float(path[0]), 10**9) == pytest.approx(c.gradient_floor)


@pytest.mark.parametrize(("call", "parameter"), [
    (lambda: cv.construct(aggregators.make("cwtm", f=8), N), "f"),
    (lambda: cv.construct(aggregators.make("krum", f=7), N), "n"),
    (lambda: cv.construct(aggregators.make("cwtm", f=1), N, mu=0.0), "mu"),
    (lambda: cv.construct(aggregators.make("cwtm", f=1), N, mu=-1.0), "mu"),
    (lambda: cv.construct(aggregators.make("cwtm", f=1), N, scale=0.0), "scale"),
    (lambda: cv.construct(aggregators.make("cc", f=1), N), "rule"),
    (lambda: cv.check_problem(1.0, 0.5), "L"),
    (lambda: cv.closed_form(cv.construct(aggregators.make("cwtm", f=1), N, mu=1.0), 2.0, 10), "eta"),
    (lambda: cv.closed_form(cv.construct(aggregators.make("cwtm", f=1), N), 0.5, 0), "steps"),
])
def test_bad_input_is_one_line_naming_the_parameter(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.parameter == parameter
    assert "\n" not in str(info.value)


def test_zero_heterogeneity_says_the_rules_are_free() -> None:
    with pytest.raises(ConfigError, match="every rule is free"):
        cv.construct(aggregators.make("cwtm", f=1), N, scale=0.0)


def test_no_honest_majority_is_refused_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match="f < n/2"):
        cv.construct(aggregators.make("mean", f=8), N)
    assert math.isfinite(cv.construct(aggregators.make("mean", f=7), N).limit)
