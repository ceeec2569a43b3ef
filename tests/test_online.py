"""phalanx.online: the base learner's invariants, the reduction's identity, the implicit step, state round trips,
bad input, and robust-online as a server optimizer (trains from a config, resumes bit for bit). The regret check of
Zhang & Cutkosky (ICML 2025) and its mutants: tests/test_online_check.py."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, store, train
from phalanx.online import CoinBetting, HalfLine, RobustMagnitude, UnitBallOGD, parameter_free, robust
from phalanx.training.optim import RobustOnline, make

EPS64 = torch.finfo(torch.float64).eps


def _run(learner: Any, grads: list[torch.Tensor]) -> list[torch.Tensor]:
    played = []
    for g in grads:
        played.append(learner.predict())
        learner.update(g)
    return played


def _grads(T: int, d: int, seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(d, generator=gen, dtype=torch.float64) for _ in range(T)]


# --- the base learner and the half-line -------------------------------------------------------------------------

def test_coin_betting_loss_is_initial_minus_final_wealth() -> None:
    """Σ g_t w_t / H = ε − W_T exactly in exact arithmetic (the definition of wealth); float64 error ≤ T·eps·scale."""
    cb, H, T = CoinBetting(2.0, epsilon=0.5), 2.0, 500
    gen = torch.Generator().manual_seed(0)
    loss = 0.0
    for g in (torch.rand(T, generator=gen, dtype=torch.float64) * 4 - 2).tolist():
        w = cb.predict()
        loss += g / H * w
        cb.update(g)
        assert cb.wealth > 0 and abs(cb.fraction) <= 0.5
    assert loss == pytest.approx(0.5 - cb.wealth, abs=8 * T * EPS64 * max(1.0, cb.wealth))


def test_coin_betting_is_parameter_free_on_a_constant_gradient() -> None:
    """Against g_t = −1 its wealth grows exponentially (ONS fraction → 1/2), so its regret against any u is
    eventually negative — the comparator adaptivity a fixed-step OGD lacks."""
    cb = CoinBetting(1.0, epsilon=1.0)
    for _ in range(200):
        cb.update(-1.0)
    assert cb.fraction == 0.5 and cb.wealth > 1.4**150


def test_half_line_plays_nonnegative_and_never_loses_more_than_its_inner_learner() -> None:
    inner, ref = CoinBetting(1.0), CoinBetting(1.0)
    half = HalfLine(inner)
    gen = torch.Generator().manual_seed(1)
    for g in (torch.rand(300, generator=gen, dtype=torch.float64) * 2 - 1).tolist():
        y, yt = half.predict(), inner.predict()
        assert y >= 0 and y == max(yt, 0.0)
        for u in (0.0, 0.5, 3.0):  # ℓ(y − u) ≤ ℓ̃(ỹ − u) for every u ≥ 0 (the lemma in phalanx.online.betting)
            fed = 0.0 if yt < 0.0 < g else g
            assert g * (y - u) <= fed * (yt - u) + 1e-15
        half.update(g)
        ref.update(g)


# --- the reduction ----------------------------------------------------------------------------------------------

def test_unit_ball_ogd_stays_in_the_ball_within_its_regret_bound() -> None:
    d, T = 4, 400
    ogd = UnitBallOGD(d)
    grads = _grads(T, d, 2)
    played = _run(ogd, grads)
    assert all(float(x.norm()) <= 1 + 4 * EPS64 for x in played)
    u = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    reg = sum(float(g @ (x - u)) for g, x in zip(grads, played))
    assert reg <= 2 * math.sqrt(2) * math.sqrt(sum(float(g @ g) for g in grads))


def test_direction_magnitude_regret_is_the_sum_of_its_parts() -> None:
    """R_T(u) = R¹ᴰ_T(‖u‖) + ‖u‖·R^ball_T(u/‖u‖): an identity; its float64 error is ≤ T·eps·(sizes)."""
    d, T, G = 3, 300, 10.0
    learner = parameter_free(d, G)
    grads = _grads(T, d, 3)
    u = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    nu = float(u.norm())
    total = one = ball = 0.0
    for g in grads:
        x, y = learner.direction.predict(), learner.magnitude.predict()
        w = learner.predict()
        total += float(g @ (w - u))
        one += float(g @ x) * (y - nu)
        ball += float(g @ (x - u / nu))
        learner.update(g)
    size = sum(float(g.norm()) for g in grads) * (nu + max(1.0, abs(learner.magnitude.predict())))
    assert total == pytest.approx(one + nu * ball, abs=16 * EPS64 * size)


# --- the robust magnitude learner -------------------------------------------------------------------------------

def test_implicit_step_solves_its_equation_to_float64_resolution() -> None:
    m = RobustMagnitude(1.0, 4, 1000, epsilon=1.0)
    gen = torch.Generator().manual_seed(4)
    for g in (torch.rand(300, generator=gen, dtype=torch.float64) * 2 - 1.5).tolist():
        m.update(g)
        x, y, w = m.x.predict(), m.y.predict() if m.y else 0.0, m.predict()
        scale = abs(x) + y * m.weight
        assert abs(w + y * m.r_prime(w) - x) <= 8 * EPS64 * max(scale, 1.0)
        assert abs(m.r_prime(w)) <= m.weight * (1 + 4 * EPS64)


def test_regulariser_gradient_is_finite_for_huge_points() -> None:
    m = RobustMagnitude(1.0, 2, 10_000)
    m.log_s = 5000.0  # Σ|w_s|^p far beyond the float64 range, kept as a logarithm
    assert math.isfinite(m.r_prime(1e300)) and 0 <= m.r_prime(1e300) <= m.weight


def test_no_budget_is_the_plain_learner_bit_for_bit() -> None:
    grads = _grads(200, 3, 5)
    a, b = robust(3, 2.0, 0, 200), parameter_free(3, 2.0)
    assert all(torch.equal(p, q) for p, q in zip(_run(a, grads), _run(b, grads)))


@pytest.mark.parametrize("make_learner", [lambda: robust(4, 1.0, 3, 300), lambda: parameter_free(4, 1.0)])
def test_state_round_trip_continues_bit_for_bit(make_learner: Any) -> None:
    grads = _grads(300, 4, 6, scale=0.7)
    full, part = make_learner(), make_learner()
    _run(full, grads)
    _run(part, grads[:137])
    state = {k: v.clone() for k, v in part.state_dict().items()}
    assert all(v.dtype == torch.float64 for v in state.values())
    again = make_learner()
    again.load_state_dict(state)
    _run(again, grads[137:])
    assert torch.equal(again.predict(), full.predict())
    assert set(again.state_dict()) == set(full.state_dict())
    assert all(torch.equal(v, full.state_dict()[k]) for k, v in again.state_dict().items())


def test_non_finite_gradients_are_skipped_and_counted() -> None:
    learner = robust(3, 1.0, 2, 100)
    _run(learner, _grads(10, 3, 7))
    before = learner.predict()
    learner.update(torch.tensor([float("nan"), 1.0, float("inf")]))
    assert learner.skipped == 1 and learner.rounds == 11
    assert torch.isfinite(learner.predict()).all()
    huge = torch.tensor([1e308, -1e308, 1e308])
    learner.update(huge)  # finite but enormous: clipped to norm G, counted
    assert learner.clipped >= 1 and torch.isfinite(learner.predict()).all()
    assert before.shape == (3,)


@pytest.mark.parametrize(("build", "match"), [
    (lambda: robust(3, 1.0, -1, 100), "corruptions=-1 is invalid"),
    (lambda: robust(3, 0.0, 1, 100), "gradient_bound=0.0 is invalid"),
    (lambda: robust(3, float("nan"), 1, 100), "gradient_bound=nan is invalid"),
    (lambda: robust(3, float("inf"), 1, 100), "gradient_bound=inf is invalid"),
    (lambda: robust(3, 1.0, 1, 0), "horizon=0 is invalid"),
    (lambda: robust(0, 1.0, 1, 10), "dim=0 is invalid"),
    (lambda: parameter_free(2, -3.0), "gradient_bound=-3.0 is invalid"),
    (lambda: RobustOnline(corruptions=2, gradient_bound="auto"), "gradient_bound='auto' is invalid"),
    (lambda: RobustOnline(corruptions=True), "corruptions=True is invalid"),
])
def test_bad_parameters_are_one_line_config_errors(build: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        build()
    assert "\n" not in str(err.value)


def test_a_gradient_of_the_wrong_shape_is_refused_before_any_state_changes() -> None:
    learner = robust(3, 1.0, 2, 100)
    _run(learner, _grads(5, 3, 8))
    state = learner.state_dict()
    for bad in (torch.zeros(4), torch.zeros(3, 1), [0.0, 0.0, 0.0]):
        with pytest.raises(ConfigError, match="gradient="):
            learner.update(bad)  # type: ignore[arg-type]
    assert all(torch.equal(v, learner.state_dict()[k]) for k, v in state.items())


# --- robust-online as the server optimizer ----------------------------------------------------------------------

RUN: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 7, "byzantine": 1, "f": 1,
    "aggregator": "cwtm", "attack": "signflip", "rounds": 12, "batch_size": 8, "lr": 0.5, "momentum": 0.0,
    "eval_every": 4, "checkpoint_every": 4, "seed": 3,
    "server_optimizer": "robust-online", "server_optimizer_params": {"corruptions": 3, "gradient_bound": 10.0},
}


def test_server_optimizer_is_the_learner_around_the_start_point() -> None:
    opt = make("robust-online", corruptions=2, gradient_bound=5.0, horizon=50)
    theta = torch.randn(2, 3)
    learner = robust(6, 5.0, 2, 50, epsilon=0.1)
    t = theta
    for g in _grads(20, 6, 9):
        t = opt.step(t, g.to(torch.float32).reshape(2, 3), 0.1)
        learner.update(g.to(torch.float32))
        assert torch.equal(t, theta + learner.predict().to(torch.float32).reshape(2, 3))
    with pytest.raises(ConfigError, match=re.escape("lr=0.2 is invalid")):
        opt.step(t, torch.zeros(2, 3), 0.2)
    with pytest.raises(ConfigError, match=re.escape("gradient=(6,) is invalid")):
        opt.step(t, torch.zeros(6), 0.1)


def test_robust_online_trains_from_a_config_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    full = tmp_path / "full"
    rows = train(make_config(RUN), full)
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]
    part = train_interrupted(make_config(RUN), tmp_path / "part", 8)
    train(make_config(RUN), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert {"optim.anchor", "optim.epsilon", "optim.learner.magnitude.w"} <= set(a)
    assert a["optim.learner.magnitude.w"].dtype == torch.float64  # float64 state survives the resume uncast
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    keys = ("round", "test_accuracy")
    assert [[r.get(k) for k in keys] for r in store.read_rows(full)] == [
        [r.get(k) for k in keys] for r in store.read_rows(part)]


@pytest.mark.parametrize(("change", "match"), [
    ({"schedule": "cosine"}, "schedule='cosine' is invalid"),
    ({"server_optimizer_params": {"corruptions": -1, "gradient_bound": 1.0}}, "corruptions=-1 is invalid"),
    ({"server_optimizer_params": {"corruptions": 1, "gradient_bound": "auto"}}, "gradient_bound='auto' is invalid"),
    ({"server_optimizer_params": {"corruptions": 1, "gradient_bound": 0}}, "gradient_bound=0 is invalid"),
    ({"server_optimizer_params": {"corruption": 1}}, "robust-online parameter"),
    ({"server_momentum": 0.9}, "server_momentum=0.9 is invalid"),
])
def test_config_errors(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_config({**RUN, **change})
