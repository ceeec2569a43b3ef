"""The paper's Theorem 4.5 construction (phalanx.analysis.theorem45): its derived quantities, its closed form in the
three step-size regimes, every rule of the registry run on it, and mutants that ignore f rejected."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators import Aggregator
from phalanx.aggregators._numerics import pairwise_sqdist
from phalanx.aggregators.coordinatewise import CoordinateWiseTrimmedMean, coordinate_window_mean
from phalanx.aggregators.geomed import GeometricMedian
from phalanx.aggregators.krum import Krum, krum_order, krum_scores
from phalanx.analysis import theorem45 as t45
from phalanx.errors import ConfigError

N = 9
RULES = [name for name in aggregators.names("rule") if issubclass(aggregators.get_class(name), Aggregator)]


class TrimsNothing(CoordinateWiseTrimmedMean):
    """A mutant: the trimmed mean that ignores its f (trims 0 rows: the mean), keeping its metadata."""

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: Any) -> tuple[torch.Tensor, Any]:
        return coordinate_window_mean(x, "trimmed", 0, want_contributions)


class KrumIgnoringF(Krum):
    """A mutant: Krum scoring with n − 2 neighbours (as if f = 0) whatever f it is configured for."""

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: Any) -> tuple[torch.Tensor, Any]:
        dist = pairwise_sqdist(x)
        best = int(krum_order(krum_scores(dist, x.shape[0] - 2), dist)[0])
        return x[best].clone(), None


@pytest.mark.parametrize(("n", "f", "d"), [(9, 1, 1), (16, 5, 3), (7, 3, 2)])
def test_the_construction_satisfies_the_assumptions(n: int, f: int, d: int) -> None:
    inst = t45.Instance(n, f, G=0.7, d=d)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        w = torch.randn(d, generator=gen, dtype=torch.float64)
        rows = inst.gradients(w)
        assert torch.equal(rows[f], rows[-1]) and bool((rows[f:] == rows[f]).all())  # n − f identical gradients
        assert inst.heterogeneity(w) == pytest.approx(inst.G**2, rel=1e-12)  # Assumption 4.3 with equality
        assert torch.allclose(rows.mean(dim=0), inst.mu * (w - inst.w_star), atol=1e-12)  # μ = L = 2c, minimiser w*
        assert inst.gap(w) <= inst.grad_sq(w) / (2 * inst.mu) * (1 + 1e-12)  # Assumption 4.4 (PL)
    assert inst.gap(inst.w_star) == 0.0 and inst.gap(inst.u) == pytest.approx(inst.limit_gap, rel=1e-12)
    assert inst.grad_sq(inst.u) == pytest.approx(f / (n - f) * inst.G**2, rel=1e-12)
    assert inst.limit_gap == pytest.approx(inst.limit_grad / (2 * inst.mu))


@pytest.mark.parametrize("eta_mu", [0.2, 1.0, 1.9, 2.0, 2.3])
def test_the_closed_form_in_the_three_regimes(eta_mu: float) -> None:
    inst = t45.Instance(9, 2)
    eta = eta_mu / inst.mu
    steps = 120
    path = t45.closed_form(inst, eta, steps, w0=3.0)
    for t in range(steps):  # one step of ByzGD with the majority's gradient
        step = path[t] - eta * inst.majority(path[t])
        assert torch.allclose(path[t + 1], step, atol=1e-9 * (1 + path[t].abs().max()))
    gaps = torch.tensor([inst.gap(w) for w in path])
    grads = torch.tensor([inst.grad_sq(w) for w in path])
    c1 = 0.999 * inst.limit_grad  # any C₁ < (f/(n − f))G²: some late T has both quantities above it
    late = [t for t in range(60, steps + 1) if float(grads[:t].mean()) > c1 and float(gaps[t]) > c1 / (2 * inst.mu)]
    assert late, "Theorem 4.5's condition fails"
    if eta_mu < 2:  # (i): converges to u, where the theorem's constant is attained
        assert float(gaps[-1]) == pytest.approx(inst.limit_gap, rel=1e-3)
    elif eta_mu == 2:  # (ii): oscillates about u
        assert torch.allclose(path[2], path[0]) and not torch.allclose(path[1], path[0])
    else:  # (iii): diverges
        assert float(gaps[-1]) > 1e6 * float(gaps[0])


@pytest.mark.parametrize("name", RULES)
def test_every_rule_of_the_registry_on_the_paper_construction(name: str) -> None:
    for f in (1, 3):
        rule = aggregators.make(name, f=f)
        if N < rule.min_workers():
            continue
        c = t45.check(rule, N, steps=40)
        assert not c.verdict.startswith("BUG"), (name, f, c.verdict)
        if c.majority.holds:  # in the theorem's class: stalls exactly on the closed form, at the theorem's constant
            assert c.stalls and c.path is not None and c.path.followed
            assert c.final_gap == pytest.approx(c.limit_gap, rel=1e-2)  # 0.8⁴⁰ of the way left
        else:  # outside: the input found moves n − f identical rows — a certificate, recomputed here
            if not c.majority.error:
                x = c.majority.input
                out = aggregators.make(name, f=f)(x, **({"generator": torch.Generator().manual_seed(0)}
                                                        if "generator" in rule.context_keys else {}))
                assert float((out.double() - x[0]).abs().max()) > c.majority.tolerance
            assert c.verdict.startswith(("escapes", "stalls anyway"))
        if rule.kappa(N) is not None:  # a rule with a proven κ must be in the class
            assert c.majority.holds and c.verdict.startswith("stalls: in the theorem's class"), (name, f, c.verdict)
        else:  # no proven κ: at most the class's necessary condition, never "in the class"
            assert "in the theorem's class" not in c.verdict, (name, f, c.verdict)


def test_the_known_rules_stall_and_the_mean_escapes() -> None:
    for name in ("cwtm", "cwmed", "geomed", "krum"):
        assert t45.check(aggregators.make(name, f=2), N, steps=40).verdict.startswith("stalls: in the theorem's class")
    for name in ("multikrum", "meamed", "mda"):  # no proven κ here: only the necessary condition
        v = t45.check(aggregators.make(name, f=2), N, steps=40).verdict
        assert v.startswith("stalls: the class's necessary condition holds"), (name, v)
    c = t45.check(aggregators.make("mean", f=2), N, steps=200)
    assert c.verdict.startswith("escapes: not (f, κ)-robust") and c.final_gap < 1e-12  # it finds the true minimum


def test_any_step_size_stalls_with_a_robust_rule() -> None:
    rule = aggregators.make("krum", f=2)
    for eta_mu in (0.05, 1.0, 1.5, 2.0, 2.4):
        c = t45.check(rule, N, eta_mu=eta_mu, steps=30, w0=3.0)
        assert c.stalls and c.path is not None and c.path.followed, eta_mu


@pytest.mark.parametrize("f", [1, 2, 3])
def test_mutant_trimmed_mean_ignoring_f_is_rejected(f: int) -> None:
    mutant = TrimsNothing(f=f)
    assert mutant.kappa(N) is not None  # it still claims its κ: the check below must refuse the claim
    c = t45.check(mutant, N, steps=200)
    assert not c.majority.holds and c.verdict.startswith("escapes")
    assert c.final_gap < 1e-3 * c.limit_gap  # it does not stall: its run finds the true minimum


def test_mutant_krum_with_the_wrong_neighbour_count_is_rejected() -> None:
    mutant = KrumIgnoringF(f=3)
    assert mutant.kappa(N) is not None
    c = t45.check(mutant, N)
    assert not c.majority.holds and "not (f, κ)-robust for any κ" in c.verdict
    assert t45.check(Krum(f=3), N).verdict.startswith("stalls: in the theorem's class")  # the real Krum passes


def test_fltrust_is_outside_the_theorem_for_a_reason() -> None:
    c = t45.check(aggregators.make("fltrust", f=1), N)
    assert not c.majority.holds and "reference" in c.majority.error and c.verdict.startswith("escapes")


@pytest.mark.parametrize(("call", "parameter"), [
    (lambda: t45.Instance(8, 4), "f"),
    (lambda: t45.Instance(8, 0), "f"),
    (lambda: t45.Instance(8, 1, G=0.0), "G"),
    (lambda: t45.closed_form(t45.Instance(8, 1), 0.0, 5), "eta"),
    (lambda: t45.closed_form(t45.Instance(8, 1), 0.1, 0), "steps"),
    (lambda: t45.check(aggregators.make("krum", f=3), 8), "n"),
    (lambda: t45.check(aggregators.make("cwtm", f=0), 8), "f"),
])
def test_bad_input_is_one_line_naming_the_parameter(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.parameter == parameter and "\n" not in str(info.value)


def test_the_limit_is_the_papers_constant() -> None:
    for n, f in ((16, 1), (16, 7), (10, 4)):
        inst = t45.Instance(n, f, G=2.0)
        assert inst.limit_grad == pytest.approx(f / (n - f) * 4.0)
        assert math.isclose(inst.c, n * 2.0 / (2 * math.sqrt(f * (n - f))))


class TrimmedMeanExceptOnALine(CoordinateWiseTrimmedMean):
    """A mutant the majority check cannot see: the trimmed mean in d ≥ 2 (where the check places its rows) and the
    mean on a line (where ByzGD runs the paper's 1-d construction) — stateless, so its verdict must be BUG."""

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: Any) -> tuple[torch.Tensor, Any]:
        if x.shape[1] == 1:
            return coordinate_window_mean(x, "trimmed", 0, want_contributions)
        return super()._run(x, want_contributions, **context)


class TrimmedMeanThatForgets(CoordinateWiseTrimmedMean):
    """The same behaviour from state instead: fresh it is the trimmed mean; after its first call, the mean."""

    stateful = True

    def __init__(self, f: int = 0) -> None:
        super().__init__(f=f)
        self.calls = 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"calls": torch.tensor(self.calls)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.calls = int(state["calls"]) if "calls" in state else 0

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: Any) -> tuple[torch.Tensor, Any]:
        self.calls += 1
        if self.calls > 1:
            return coordinate_window_mean(x, "trimmed", 0, want_contributions)
        return super()._run(x, want_contributions, **context)


def test_a_run_that_leaves_the_closed_form_is_a_bug_unless_the_rule_keeps_state() -> None:
    """A BUG verdict is reachable (a stateless rule that keeps n − f identical rows where the check looks and not on
    ByzGD's line), and a stateful rule that does the same through its history is said to escape, not a bug."""
    bug = t45.check(TrimmedMeanExceptOnALine(f=3), N, steps=40)
    assert bug.majority.holds and not bug.stalls and bug.verdict.startswith("BUG")
    assert "the aggregate left the majority's gradient (round 0" in bug.verdict  # what was seen, and where
    stateful = t45.check(TrimmedMeanThatForgets(f=3), N, steps=40)
    assert stateful.majority.holds and not stateful.stalls and stateful.verdict.startswith("escapes: stateful")


class MajorityElseMean(Aggregator):
    """The reviewer's mutant: n − f identical rows give that row, anything else the plain mean — (f, κ)-robust for
    no κ, yet it passes the majority check (a necessary condition only)."""

    name = "majority-else-mean"
    requirement = "n > 2f"

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: Any) -> tuple[torch.Tensor, Any]:
        n = x.shape[0]
        for i in range(n):
            if int((x == x[i]).all(dim=1).sum()) >= n - self.f:
                return x[i].clone(), None
        return x.mean(dim=0), None


class LeakyGeoMed(GeometricMedian):
    """The reviewer's mutant: the geometric median leaking 9 % of the plain mean — its error grows linearly with the
    far rows (robust for no κ) though it still claims the geometric median's κ; 10 × its declared accuracy let it
    pass the majority check and stall 17 % below the theorem's limit."""

    name = "leaky-geomed"

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: Any) -> tuple[torch.Tensor, Any]:
        out, _ = super()._run(x, False, **context)
        return out + 0.09 * (x.mean(dim=0) - out), None


def test_the_majority_check_is_a_necessary_condition_not_membership_of_the_class() -> None:
    """A rule with no proven κ that passes the check is not said to be in the theorem's class: the mean-otherwise
    mutant passes it and is robust for no κ."""
    c = t45.check(MajorityElseMean(f=2), 7)
    assert c.majority.holds and c.stalls
    assert c.verdict.startswith("stalls: the class's necessary condition holds"), c.verdict
    assert "in the theorem's class" not in c.verdict and c.proven_kappa is None


def test_a_geometric_median_leaking_the_mean_fails_the_majority_check() -> None:
    """The tolerance was 10 × the declared accuracy × max|rows|: a geometric median leaking 9 % of the mean passed and
    stalled 17 % below the limit. At 2 × the leak is caught, while the real geometric median still stalls."""
    leaky = t45.check(LeakyGeoMed(f=1), 16)
    assert not leaky.majority.holds and leaky.verdict.startswith("escapes: not (f, κ)-robust"), leaky.verdict
    real = t45.check(GeometricMedian(f=1), 16)
    assert real.majority.holds and real.stalls and real.verdict.startswith("stalls: in the theorem's class")
