"""Min-Max / Min-Sum (Shejwalkar & Houmansadr), Fang et al.'s attack and the aggregator-tuned ``optimal``."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from phalanx import aggregators, attacks
from phalanx.attacks import AttackContext, MinMax, MinSum, Optimal
from phalanx.attacks.fang import fang_ranges
from phalanx.attacks.minmax import halving_search, perturbation
from phalanx.errors import ConfigError


def _ctx(honest: torch.Tensor, b: int, f: int = 1, aggregator: Any = None, seed: int = 0) -> AttackContext:
    return AttackContext(honest, b, f, aggregator, torch.Generator().manual_seed(seed))


def _honest(h: int, d: int, seed: int = 0, shift: float = 0.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(h, d, generator=g, dtype=torch.float64) + shift


# ---------------------------------------------------------------- Min-Max / Min-Sum

LINE = torch.tensor([[0.0], [2.0], [4.0]], dtype=torch.float64)  # mean 2, unit perturbation -1


def test_minmax_hand_case() -> None:
    # m = 2 - γ; distances² to 0, 2, 4: (2-γ)², γ², (2+γ)² <= max pairwise 16  ->  γ* = 2, m = 0.
    a = MinMax()
    gamma = a.gamma_for(_ctx(LINE, 2))
    assert gamma == pytest.approx(2.0, abs=2e-5) and gamma <= 2.0
    torch.testing.assert_close(a(_ctx(LINE, 2)), torch.zeros(2, 1, dtype=torch.float64), atol=2e-5, rtol=0)


def test_minsum_hand_case_uses_the_smallest_honest_sum() -> None:
    # Σ distances² = (2-γ)² + γ² + (2+γ)² = 8 + 3γ²; smallest honest sum: the middle row, 4 + 4 = 8  ->  γ* = 0.
    a = MinSum()
    assert a.gamma_for(_ctx(LINE, 1)) == 0.0
    torch.testing.assert_close(a(_ctx(LINE, 1)), torch.tensor([[2.0]], dtype=torch.float64))
    two = torch.tensor([[0.0], [2.0]], dtype=torch.float64)  # 2 + 2γ² <= 4  ->  γ* = 1
    assert a.gamma_for(_ctx(two, 1)) == pytest.approx(1.0, abs=2e-5)


def _minmax_exact(honest: torch.Tensor, p: torch.Tensor) -> float:
    mean = honest.mean(0)
    threshold = float(torch.cdist(honest, honest).max() ** 2)
    a = ((mean - honest) ** 2).sum(1)
    c = ((mean - honest) * p).sum(1)
    q = float((p * p).sum())
    roots = (-c + torch.sqrt(c * c - q * (a - threshold))) / q
    return float(roots.min())


@pytest.mark.parametrize("kind", ["unit", "std", "sign"])
def test_minmax_gamma_is_feasible_and_maximal(kind: str) -> None:
    honest = _honest(12, 30, seed=1)
    a = MinMax(perturbation=kind)
    gamma, mal = a.search(_ctx(honest, 3))
    p = perturbation(honest, kind)
    exact = _minmax_exact(honest, p)
    assert 0 < gamma <= exact + 1e-12
    assert exact - gamma <= 2e-5
    torch.testing.assert_close(mal, honest.mean(0) + gamma * p)
    threshold = float(torch.cdist(honest, honest).max() ** 2)
    assert float(((honest - mal) ** 2).sum(1).max()) <= threshold * (1 + 1e-12)
    beyond = honest.mean(0) + (gamma + 4e-5) * p
    assert float(((honest - beyond) ** 2).sum(1).max()) > threshold


@pytest.mark.parametrize("kind", ["unit", "std", "sign"])
def test_minsum_gamma_matches_its_closed_form(kind: str) -> None:
    honest = _honest(10, 25, seed=2)
    a = MinSum(perturbation=kind)
    gamma, mal = a.search(_ctx(honest, 2))
    p = perturbation(honest, kind)
    exact = float(torch.linalg.vector_norm(honest - honest.mean(0), dim=1).min() / torch.linalg.vector_norm(p))
    assert 0 <= exact - gamma <= 2e-5
    sums = (torch.cdist(honest, honest) ** 2).sum(1)
    assert float(((honest - mal) ** 2).sum()) <= float(sums.min()) * (1 + 1e-12)


def test_perturbation_directions() -> None:
    honest = torch.tensor([[1.0, -2.0, 0.0], [3.0, -4.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(perturbation(honest, "unit"), torch.tensor([-2.0, 3.0, 0.0]).double() / math.sqrt(13))
    torch.testing.assert_close(perturbation(honest, "std"), -torch.tensor([math.sqrt(2), math.sqrt(2), 0.0]).double())
    torch.testing.assert_close(perturbation(honest, "sign"), torch.tensor([-1.0, 1.0, 0.0]).double())
    zero_mean = torch.tensor([[1.0, -1.0], [-1.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(perturbation(zero_mean, "unit"), torch.zeros(2).double())
    # No direction to move in: the attack sends the mean.
    out = attacks.make("minmax")(_ctx(zero_mean, 1))
    torch.testing.assert_close(out, torch.zeros(1, 2).double())


def test_search_is_not_capped_by_a_small_gamma_init() -> None:
    honest = _honest(8, 10, seed=3) * 100.0  # γ* in the hundreds, far beyond 2·gamma_init
    small = MinMax(gamma_init=0.1).gamma_for(_ctx(honest, 1))
    big = MinMax(gamma_init=10.0).gamma_for(_ctx(honest, 1))
    exact = _minmax_exact(honest, perturbation(honest, "unit"))
    assert exact > 20.0
    assert small == pytest.approx(exact, abs=3e-5) and big == pytest.approx(exact, abs=3e-5)


def test_halving_search_on_an_interval() -> None:
    for limit in (0.0, 1e-3, 0.7, 5.0, 19.99, 1234.5):
        found = halving_search(lambda g, lim=limit: g <= lim, 10.0, 1e-6)
        assert found <= limit and limit - found <= 2e-6  # within 2τ: the stop rule is |γ_succ − γ| <= τ
    # The paper's search alone (γ_init infeasible) is exactly Algorithm 1.
    assert halving_search(lambda g: g <= 3.0, 10.0, 1e-5) == pytest.approx(3.0, abs=1e-5)


# ---------------------------------------------------------------- Fang

def test_fang_ranges_hand_case() -> None:
    honest = torch.tensor([[1.0, -1.0, 0.5, -3.0, 2.0], [3.0, -2.0, -0.5, -1.0, -4.0]], dtype=torch.float64)
    # means: 2 (>0), -1.5 (<0), 0, -2 (<0), -1 (<0)
    low, high, direction = fang_ranges(honest, 2.0)
    torch.testing.assert_close(direction, torch.tensor([1.0, -1.0, 0.0, -1.0, -1.0]).double())
    torch.testing.assert_close(low, torch.tensor([0.5, -1.0, 0.0, -1.0, 2.0]).double())
    torch.testing.assert_close(high, torch.tensor([1.0, -0.5, 0.0, -0.5, 4.0]).double())


def test_fang_values_lie_beyond_the_honest_range_against_the_mean() -> None:
    honest = _honest(11, 200, seed=4, shift=0.0)
    out = attacks.make("fang")(_ctx(honest, 4, seed=9))
    mean, wmax, wmin = honest.mean(0), honest.max(0).values, honest.min(0).values
    neg, pos = mean < 0, mean > 0
    assert neg.any() and pos.any()
    assert (out[:, neg] >= wmax[neg]).all()
    assert (out[:, pos] <= wmin[pos]).all()
    low, high, _ = fang_ranges(honest, 2.0)
    assert ((out >= low) & (out <= high)).all()
    assert not torch.equal(out[0], out[1])  # each Byzantine worker draws its own values


def test_fang_pushes_the_trimmed_mean_against_the_honest_mean() -> None:
    honest = _honest(12, 300, seed=5, shift=0.2)
    b = 3
    byz = attacks.make("fang")(_ctx(honest, b, f=b))
    out = aggregators.make("cwtm", f=b)(torch.cat([honest, byz]))
    mean = honest.mean(0)
    # The b Byzantine values are trimmed on one side, b honest extremes on the other: the output moves against ḡ.
    assert (out[mean > 0] <= mean[mean > 0] + 1e-12).all()
    assert (out[mean < 0] >= mean[mean < 0] - 1e-12).all()


# ---------------------------------------------------------------- optimal

def _objective(rule: Any, honest: torch.Tensor, byz: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(rule(torch.cat([honest, byz])) - honest.mean(0)))


def test_optimal_needs_the_aggregator() -> None:
    with pytest.raises(ConfigError, match="aggregator"):
        attacks.make("optimal")(_ctx(_honest(5, 3), 2))


@pytest.mark.parametrize("rule_name", ["cwtm", "krum"])
@pytest.mark.parametrize("base", ["alie", "ipm", "signflip"])
def test_optimal_is_at_least_its_base_attack(rule_name: str, base: str) -> None:
    h, b, f = 15, 4, 4
    honest = _honest(h, 40, seed=6, shift=0.3)
    rule = aggregators.make(rule_name, f=f)
    ctx = _ctx(honest, b, f=f, aggregator=rule)
    opt = Optimal(base=base, evaluations=24)
    result = opt.search(ctx)
    base_rows = attacks.make(base)(ctx)
    assert result.objective >= _objective(rule, honest, base_rows)
    assert _objective(rule, honest, opt(ctx)) == pytest.approx(result.objective, rel=1e-12)
    assert result.factors.shape == result.objectives.shape
    assert bool((result.factors[1:] > result.factors[:-1]).all())
    assert result.objective == float(result.objectives.max())


def test_optimal_grid_includes_the_base_default() -> None:
    honest = _honest(10, 5)
    ctx = _ctx(honest, 3, aggregator=aggregators.make("mean", f=0))
    factors = Optimal(base="alie", evaluations=5, max_factor=4.0).candidates(ctx)
    z = attacks.alie_z_max(13, 3)
    assert any(abs(float(t) - z) < 1e-15 for t in factors)
    assert factors.numel() == 6 and float(factors[0]) == 0.0 and float(factors[-1]) == 4.0
    factors = Optimal(base="signflip", evaluations=5, max_factor=4.0).candidates(ctx)
    assert factors.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # the default 1.0 is already on the grid


def test_optimal_against_the_mean_takes_the_largest_factor() -> None:
    # Mean of h honest rows and b rows -tḡ: ‖agg - ḡ‖ = b(1 + t)/n ‖ḡ‖, increasing in t.
    honest = _honest(6, 4, shift=1.0)
    ctx = _ctx(honest, 2, aggregator=aggregators.make("mean", f=0))
    result = Optimal(base="ipm", max_factor=3.0, evaluations=7).search(ctx)
    assert result.factor == 3.0
    assert result.objective == pytest.approx(2 * 4 / 8 * float(torch.linalg.vector_norm(honest.mean(0))), rel=1e-12)


def test_optimal_counts_a_non_finite_aggregate_as_a_win() -> None:
    honest = _honest(4, 3)

    def breaks_beyond_one(x: torch.Tensor) -> torch.Tensor:
        out = x.mean(0)
        return out if float(x[-1].abs().max()) < 1.0 else out * float("nan")

    ctx = _ctx(honest, 1, aggregator=breaks_beyond_one)
    result = Optimal(base="signflip", max_factor=10.0, evaluations=11).search(ctx)
    assert math.isinf(result.objective)
    assert result.factor == min(float(t) for t, o in zip(result.factors, result.objectives) if math.isinf(float(o)))
