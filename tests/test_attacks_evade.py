"""``evade`` (:mod:`phalanx.attacks.evade`, issue 36): the attack that adapts to an asynchronous filter's test.

Unit level, against each algorithm's own acceptance function (AFLGuard's :func:`accepted`, Zeno++'s
:func:`normalised` and :func:`scores`, Kardam's :meth:`screen` through the step's oracle
:func:`screen_oracle`): the attack's rows pass by construction, and the mutant without the constraint (its target
sent as it is: the plain attack it adapts) is rejected. Run level (docs/async.md's filter setting, shortened): the
adaptive attack is accepted far more often than the plain ×10 sign flip, with the damage measured against the run
without attack. Bad parameters are one-line errors; runs are deterministic."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.test_async_filters import FIRST, after_steps, experiment, honest_gradient, last_row

from phalanx import attacks
from phalanx.attacks import AttackContext
from phalanx.attacks.evade import Evade, drift_direction, target_vector
from phalanx.errors import ConfigError
from phalanx.training.algorithms.aflguard import AFLGuard, accepted
from phalanx.training.algorithms.asynchronous import screen_oracle
from phalanx.training.algorithms.kardam import Kardam
from phalanx.training.algorithms.zenopp import ZenoPP, normalised, scores

EPS = torch.finfo(torch.float64).eps


def _ctx(honest: torch.Tensor, b: int, screen: Any = None) -> AttackContext:
    return AttackContext(honest, b, 0, None, torch.Generator().manual_seed(0), screen=screen)


def _honest(center: torch.Tensor, h: int = 6, noise: float = 0.3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return center + noise * torch.randn(h, center.numel(), generator=g, dtype=torch.float64)


def test_without_a_filter_it_sends_its_target_and_the_drift_is_orthogonal() -> None:
    """No filter (``screen`` None): the target itself — with ``target = "signflip"`` exactly ``signflip``'s rows;
    the drift direction is a unit vector orthogonal to ḡ (to float64 rounding at d = 50), the same at every call."""
    honest = _honest(torch.linspace(-1, 1, 50, dtype=torch.float64))
    ctx = _ctx(honest, 3)
    assert torch.equal(Evade(scale=4.0)(ctx), attacks.make("signflip", scale=4.0)(ctx))
    mean = honest.mean(dim=0)
    u = drift_direction(mean, 7)
    assert abs(float(u.dot(mean))) <= 50 * EPS * float(mean.norm()) and abs(float(u.norm()) - 1) <= 50 * EPS
    assert torch.equal(u, drift_direction(mean, 7)) and not torch.equal(u, drift_direction(mean, 8))
    drift = Evade(target="drift", scale=2.0, seed=7)(ctx)
    torch.testing.assert_close(drift[0], target_vector(mean, "drift", 2.0, 7))
    assert torch.equal(drift[0], drift[2])


def test_against_aflguards_ball_it_finds_the_flip_that_fits() -> None:
    """AFLGuard's own test as the oracle (λ = 1.5, g₀ near ḡ): every row of ``evade`` passes, and it is a sign
    flip (⟨g, ḡ⟩ < 0) on the ball's edge — one bisection step further (α* + 2⁻¹²) is rejected. The mutant without
    the constraint — the ×10 flip it walks towards, ``signflip(scale=10)`` — is rejected."""
    g0 = torch.linspace(0.5, 2.0, 40, dtype=torch.float64)
    honest = _honest(g0, noise=0.05)
    oracle = lambda rows: accepted(rows, g0, 1.5)  # noqa: E731
    rows = Evade(scale=10.0)(_ctx(honest, 2, oracle))
    mean = honest.mean(dim=0)
    assert bool(accepted(rows, g0, 1.5).all()) and float(rows[0].dot(mean)) < 0
    c = float(rows[0].dot(mean) / mean.dot(mean))  # rows = c ḡ with c = 1 − α*(1 + s)
    further = (c - 11 * 2.0**-12) * mean
    assert not bool(accepted(further[None], g0, 1.5).all())
    assert not bool(accepted(attacks.make("signflip", scale=10.0)(_ctx(honest, 2)), g0, 1.5).any())


def test_against_zenos_score_it_keeps_the_cosine_just_above_rho() -> None:
    """Zeno++'s own score as the oracle (ρ = 0.05, ε = 0, v near ḡ): the drift rows pass with cos(v, g) in
    [ρ, ρ + 0.05] — on the edge of the test, not an honest direction; the mutant without the constraint (the drift
    target itself, nearly orthogonal to v) is rejected."""
    v = torch.linspace(-1.0, 2.0, 60, dtype=torch.float64)
    honest = _honest(v, noise=0.1)
    rho = 0.05
    oracle = lambda rows: scores(normalised(rows, v), v, rho) >= 0.0  # noqa: E731
    rows = Evade(target="drift", scale=10.0)(_ctx(honest, 2, oracle))
    assert bool(oracle(rows).all())
    cos = float(torch.nn.functional.cosine_similarity(rows[0], v, dim=0))
    assert rho <= cos <= rho + 0.05
    target = target_vector(honest.mean(dim=0), "drift", 10.0, 0)
    assert not bool(oracle(target[None]).any())


def test_against_kardams_filter_its_rows_pass_where_the_flip_is_rejected() -> None:
    """Kardam's own filter through the step's oracle (after 8 honest steps, the candidate judged after one honest
    update of worker 0): ``evade``'s rows pass, the ×10 sign flip (its mutant without the constraint) is rejected;
    the oracle commits nothing (the state is unchanged and a second call answers the same)."""
    algo = Kardam(buffer_size=4, filter_f=2, speeds="constant")
    loop, exp = after_steps(algo, 8)
    own, t, theta = loop.state.own, loop.state.round, loop.state.theta
    ring = own["thetas"].clone()
    ring[t % (algo.max_staleness + 1)] = theta
    honest = honest_gradient(loop, exp)[None]
    before = {k: v.clone() for k, v in own.items()}
    oracle = screen_oracle(algo, exp, own, theta, t, torch.tensor([0, 8, 9]), honest, torch.tensor([t, t, t]), ring)
    rows = Evade(scale=10.0)(_ctx(honest, 2, oracle))
    assert bool(oracle(rows).all()) and bool(oracle(rows).all())
    assert not bool(oracle(attacks.make("signflip", scale=10.0)(_ctx(honest, 2))).all())
    assert all(torch.equal(before[k], own[k]) for k in before)


KW: dict[str, Any] = {"byzantine": 2, "rounds": 20}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aflguard_accepts_the_adaptive_flip_and_loses_accuracy(seed: int) -> None:
    """Always-first attackers, half of every buffer (n = 10, b = 2, K = 4, 20 steps): AFLGuard rejects every ×10
    flip; it accepts every ``evade`` update (same ×10 target) and ends more than 15 points below both the ×10
    flip's run and the run without attack (a measured outcome on 3 seeds, not a bound)."""
    _, clean = last_row(experiment(AFLGuard(buffer_size=4, **FIRST), rounds=20, seed=seed))
    _, plain = last_row(experiment(AFLGuard(buffer_size=4, **FIRST), seed=seed, attack="signflip",
                                   attack_params={"scale": 10.0}, **KW))
    _, adaptive = last_row(experiment(AFLGuard(buffer_size=4, **FIRST), seed=seed, attack="evade", **KW))
    assert plain["byzantine_rejected"] == plain["byzantine_updates"] > 0
    assert adaptive["byzantine_rejected"] == 0 < adaptive["byzantine_updates"]
    assert adaptive["test_accuracy"] + 0.15 < min(plain["test_accuracy"], clean["test_accuracy"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kardam_and_zeno_accept_the_adaptive_updates(seed: int) -> None:
    """Same setting: Kardam rejects fewer than half as many ``evade`` updates as ×10 flips; Zeno++ rejects most
    ×10 flips and fewer than a fifth of the ``evade`` drift's updates (each rejection one where even the honest mean
    fails the test) — and the drift ends below the run without attack (the damage; docs/async.md measures it)."""
    flip: dict[str, Any] = {"attack": "signflip", "attack_params": {"scale": 10.0}, **KW}
    _, plain = last_row(experiment(Kardam(buffer_size=4, filter_f=2, **FIRST), seed=seed, **flip))
    _, adaptive = last_row(experiment(Kardam(buffer_size=4, filter_f=2, **FIRST), seed=seed, attack="evade", **KW))
    assert 2 * adaptive["byzantine_rejected"] < plain["byzantine_rejected"]
    _, clean = last_row(experiment(ZenoPP(buffer_size=4, **FIRST), rounds=20, seed=seed))
    _, zplain = last_row(experiment(ZenoPP(buffer_size=4, **FIRST), seed=seed, **flip))
    _, drift = last_row(experiment(ZenoPP(buffer_size=4, **FIRST), seed=seed, attack="evade",
                                   attack_params={"target": "drift"}, **KW))
    assert 2 * zplain["byzantine_rejected"] > zplain["byzantine_updates"]
    assert 5 * drift["byzantine_rejected"] < drift["byzantine_updates"]
    assert drift["test_accuracy"] < clean["test_accuracy"]


def test_runs_are_deterministic() -> None:
    """Two runs with the seed are equal bit for bit (θ and every metric): the attack draws nothing."""
    kw: dict[str, Any] = {"byzantine": 2, "attack": "evade", "attack_params": {"target": "drift"}, "rounds": 5}
    a, ra = last_row(experiment(ZenoPP(buffer_size=4, **FIRST), **kw))
    b, rb = last_row(experiment(ZenoPP(buffer_size=4, **FIRST), **kw))
    assert torch.equal(a.state.theta, b.state.theta) and ra == rb


@pytest.mark.parametrize(("params", "parameter"), [
    ({"target": "flip"}, "target"), ({"scale": 0.0}, "scale"), ({"scale": float("nan")}, "scale"),
    ({"steps": 0}, "steps"), ({"steps": 53}, "steps"), ({"seed": -1}, "seed"), ({"steps": True}, "steps"),
])
def test_bad_parameters_are_refused_in_one_line(params: dict[str, Any], parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        attacks.make("evade", **params)
    assert info.value.parameter == parameter and "\n" not in str(info.value)


def test_a_context_refuses_a_screen_that_is_not_callable() -> None:
    with pytest.raises(ConfigError, match=r"^screen="):
        _ctx(torch.ones(2, 3, dtype=torch.float64), 1, screen=3)
