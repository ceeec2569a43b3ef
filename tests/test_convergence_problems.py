"""The real problems of the convergence study (phalanx.analysis.problems): worker gradients equal autograd's, μ and
L are valid constants, GD with the mean is exact GD, and at a fixed point of GD with a rule ‖∇F‖² equals the rule's
realised aggregation error times ζ² — the identity the bounds rest on."""

from __future__ import annotations

import math

import pytest
import torch

from phalanx import aggregators, data
from phalanx.analysis import problems as pb
from phalanx.data.partition import partition
from phalanx.errors import ConfigError

EPS = torch.finfo(torch.float64).eps


@pytest.fixture(scope="module")
def pool() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    ds = data.load("digits")
    x, y = ds.train_x[:400], ds.train_y[:400]
    return x, y, partition(y, 8, "dirichlet", alpha=0.5, seed=3)


@pytest.mark.parametrize("model", pb.MODELS)
def test_worker_gradients_are_autograds(pool, model: str) -> None:  # type: ignore[no-untyped-def]
    x, y, parts = pool
    p = pb.make_problem(model, x, y, parts, lam=0.05, hidden=6, seed=1)
    theta = p.theta0 + 0.3 * torch.randn(p.params, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    g, value = p.worker_gradients(theta)
    t = theta.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(p.losses(t), t, grad_outputs=p.weights, is_grads_batched=True)
    auto = auto + p.lam * theta
    # sums of at most N terms: error ≤ N·u·(largest term), with margin 8
    assert float((g - auto).abs().max()) <= 8 * x.shape[0] * EPS * max(1.0, float(auto.abs().max()))
    assert value == pytest.approx(p.value(theta), rel=8 * x.shape[0] * EPS)
    assert g.shape == (len(parts), p.params)


@pytest.mark.parametrize("model", ["least-squares", "logistic"])
def test_mu_and_L_are_valid_constants_and_F_star_is_the_minimum(pool, model: str) -> None:  # type: ignore[no-untyped-def]
    x, y, parts = pool
    p = pb.make_problem(model, x, y, parts, lam=0.1)
    c = pb.curvature(p)
    assert 0 < c.mu <= c.L
    g, _ = p.worker_gradients(c.theta_star)
    assert float(g.mean(dim=0).norm()) <= 1e-10
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        a = c.theta_star + torch.randn(p.params, generator=gen, dtype=torch.float64)
        b = c.theta_star + torch.randn(p.params, generator=gen, dtype=torch.float64)
        ga, fa = p.worker_gradients(a)
        gb, _ = p.worker_gradients(b)
        grad_a = ga.mean(dim=0)
        assert fa - c.f_star >= -1e-12
        assert fa - c.f_star <= float(grad_a.square().sum()) / (2 * c.mu) * (1 + 1e-9)  # PL
        assert float((grad_a - gb.mean(dim=0)).norm()) <= c.L * float((a - b).norm()) * (1 + 1e-9)  # L-smooth


def test_gd_with_the_mean_is_exact_gd_at_the_linear_rate(pool) -> None:  # type: ignore[no-untyped-def]
    x, y, parts = pool
    p = pb.make_problem("least-squares", x, y, parts, lam=0.1)
    c = pb.curvature(p)
    tr = pb.descend(p, aggregators.make("mean", f=0), 1.0 / c.L, 60)
    gap = tr.value - c.f_star
    rate = (1 - c.mu / c.L) ** torch.arange(61, dtype=torch.float64)
    assert bool((gap <= rate * gap[0] * (1 + 1e-9) + 1e-12).all())
    assert float(tr.ratio.abs().max()) <= 1e-20


@pytest.mark.parametrize("spec", ["cwtm", "cwmed"])
def test_at_the_fixed_point_the_gradient_floor_is_the_realised_error_times_zeta2(  # type: ignore[no-untyped-def]
    pool, spec: str,
) -> None:
    x, y, parts = pool
    p = pb.make_problem("least-squares", x, y, parts, lam=1.0)
    c = pb.curvature(p)
    tr = pb.descend(p, aggregators.make(spec, f=2), 1.0 / c.L, 400)
    floor, predicted = float(tr.grad_sq[-1]), float(tr.ratio[-1] * tr.zeta2[-1])
    assert floor > 1e-6  # a real stall, far above rounding
    assert floor == pytest.approx(predicted, rel=1e-6)
    eps = aggregators.make(spec, f=2).epsilon(8)
    assert eps is not None and float(tr.ratio[-1]) <= eps
    assert float(tr.value[-1]) - c.f_star <= eps * float(tr.zeta2[-1]) / (2 * c.mu)


@pytest.mark.parametrize(("call", "parameter"), [
    (lambda x, y, parts: pb.make_problem("svm", x, y, parts, lam=0.1), "model"),
    (lambda x, y, parts: pb.make_problem("logistic", x, y, parts, lam=0.0), "lam"),
    (lambda x, y, parts: pb.make_problem("least-squares", x, y, parts, lam=-1.0), "lam"),
    (lambda x, y, parts: pb.make_problem("mlp", x, y, [parts[0], parts[0]], lam=0.0), "parts"),
    (lambda x, y, parts: pb.make_problem("mlp", x, y, [], lam=0.0), "parts"),
    (lambda x, y, parts: pb.curvature(pb.make_problem("mlp", x, y, parts, lam=0.0)), "model"),
    (lambda x, y, parts: pb.descend(pb.make_problem("mlp", x, y, parts, lam=0.0), aggregators.make("mean", f=0),
                                    0.0, 3), "eta"),
    (lambda x, y, parts: pb.descend(pb.make_problem("mlp", x, y, parts, lam=0.0), aggregators.make("cwtm", f=4),
                                    0.1, 3), "workers"),
])
def test_bad_input_is_one_line(pool, call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        call(*pool)
    assert info.value.parameter == parameter and "\n" not in str(info.value)


def test_a_diverging_run_stops_with_nan_not_an_exception(pool) -> None:  # type: ignore[no-untyped-def]
    x, y, parts = pool
    p = pb.make_problem("least-squares", x, y, parts, lam=0.1)
    tr = pb.descend(p, aggregators.make("mean", f=0), 1e6, 400)
    assert not math.isfinite(float(tr.value[-1]))
