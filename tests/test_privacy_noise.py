"""Client-level DP on the run path, end to end (docs/privacy.md): the honest rows a Byzantine spy receives are the
same workers' clipped updates plus N(0, σ²C²) per coordinate — the noise measured against an ``update_clip``-only
run, within a tolerance fixed from the sample size before looking at the data —, a FedAvg run's metric rows carry
the budget of its real population N and sample m (q = m/N), not another sampling rate, and the DP stage acts before
every other worker stage in every spelling of a run (docs/design.md, "Stages")."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import _dp_spy
from phalanx.analysis import privacy as accounting
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train
from phalanx.experiments.build import from_config
from phalanx.training.stages.privacy import ClientDP
from phalanx.training.stages.update_clip import UpdateClip

pytest.importorskip("dp_accounting")

C, SIGMA = 0.5, 1.5  # σ²C² = 0.5625, far from σ² (2.25), C² (0.25) and 0 (a mutant that forgets a factor, or the noise)
BASE: dict[str, Any] = {"dataset": "digits", "model": "logreg", "workers": 6, "byzantine": 1, "f": 1,
                        "attack": "_dp_spy:Spy", "aggregator": "mean", "rounds": 1, "eval_every": 1,
                        "momentum": 0.0, "seed": 0}
"""DSGD without momentum: a worker's row is its privatized gradient g̃ = clip_C(g) + σCξ, and round 0's θ and
batches are the same with DP or without."""


def _seen(data: dict[str, Any], out: Path) -> torch.Tensor:
    _dp_spy.SEEN.clear()
    train(make_config(data), out)
    (rows,) = _dp_spy.SEEN
    return rows.double()


@pytest.mark.parametrize("source", ["seed", "secret"])
def test_the_honest_rows_carry_gaussian_noise_of_variance_sigma2_c2(source: str, tmp_path: Path) -> None:
    """noised − clipped is N(0, σ²C²) per coordinate: its N = 5 × 650 coordinates' mean square s² has relative
    standard deviation √(2/N) (chi-square with N degrees of freedom, normal approximation) and its mean standard
    deviation σC/√N, so both are checked at 5 standard deviations (a false failure has probability below 1e-6)."""
    noised = _seen({**BASE, "dp_noise": SIGMA, "dp_clip": C, "dp_noise_source": source}, tmp_path / "dp")
    clean = _seen({**BASE, "stages": {"update_clip": {"c": C}}}, tmp_path / "clip")
    assert noised.shape == clean.shape == (5, 650)
    assert bool((torch.linalg.vector_norm(clean, dim=1) <= C * (1 + 1e-5)).all())  # the reference is clipped
    noise = (noised - clean).flatten()
    n, variance = noise.numel(), SIGMA**2 * C**2
    mean_square = float(noise.square().mean())  # the mean is known (0): N degrees of freedom
    assert abs(mean_square / variance - 1) <= 5 * math.sqrt(2 / n), mean_square
    assert abs(float(noise.mean())) <= 5 * SIGMA * C / math.sqrt(n)


def test_a_fedavg_run_reports_the_budget_of_its_population_and_sample() -> None:
    """The rows' ε is budget(rounds, N, m) with the run's N = 10 clients and m = 5 a round (q = 1/2): neither the
    unsampled budget nor another rate's; ``dp_epsilon_local`` is the T composed Gaussians'."""
    cfg = {"dataset": "digits", "model": "logreg", "algorithm": "fedavg", "workers": 10, "clients_per_round": 5,
           "local_steps": 1, "rounds": 4, "eval_every": 2, "dp_noise": SIGMA, "dp_clip": C, "seed": 1}
    rows = train(make_config(cfg))
    assert [r["round"] for r in rows] == [0, 2, 4]
    for r in rows[1:]:
        expected = accounting.budget(SIGMA, 1e-5, r["round"], 10, 5)
        assert r["dp_epsilon"] == expected.epsilon and r["dp_epsilon_local"] == expected.epsilon_local
        assert r["dp_epsilon"] < r["dp_epsilon_local"] == accounting.budget(SIGMA, 1e-5, r["round"], 10, 10).epsilon
        for other in (1, 2, 10):  # q = 1/N, 2/N, 1: the accounting of another run
            assert r["dp_epsilon"] != pytest.approx(accounting.budget(SIGMA, 1e-5, r["round"], 10, other).epsilon)


ORDER: dict[str, Any] = {"dataset": "digits", "model": "logreg", "workers": 5, "rounds": 2, "eval_every": 1,
                         "momentum": 0.0, "seed": 0}
"""docs/design.md "Stages": the differentially private stage acts first among the worker stages in every spelling."""


def _columns(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["round"], r.get("update_clip_max_norm"), r["test_loss"], r.get("dp_epsilon")) for r in rows]


def test_dp_acts_before_every_other_worker_stage_in_every_spelling() -> None:
    """``privacy=ClientDP`` beside ``stages=[UpdateClip]`` and ``stages=[ClientDP, UpdateClip]`` are the config's
    run (``dp_noise`` with ``[stages.update_clip]``), row for row: update_clip measures the noised update, never the
    raw one (its largest norm, published on every row, is at least the noise's)."""
    config = train(make_config({**ORDER, "dp_noise": 1.0, "dp_clip": 1.0, "stages": {"update_clip": {"c": 100.0}}}))
    plain = from_config(make_config(ORDER))
    sugar = dataclasses.replace(plain, stages=[UpdateClip(c=100.0)], privacy=ClientDP(clip=1.0, noise=1.0))
    listed = dataclasses.replace(plain, stages=[ClientDP(clip=1.0, noise=1.0), UpdateClip(c=100.0)])
    assert [s.name for s in sugar.stages] == [s.name for s in listed.stages] == ["dp", "update_clip"]
    for exp in (sugar, listed):
        assert _columns(train(exp)) == _columns(config)
    noise_norm = math.sqrt(650)  # σC√d: a row's noise alone; the raw updates here are far shorter
    assert all(r["update_clip_max_norm"] > 0.8 * noise_norm for r in config[1:])


def test_a_worker_stage_listed_before_dp_is_refused_naming_it() -> None:
    plain = from_config(make_config(ORDER))
    with pytest.raises(ConfigError, match="update_clip would see every raw update") as exc:
        dataclasses.replace(plain, stages=[UpdateClip(c=100.0), ClientDP(clip=1.0, noise=1.0)])
    assert "\n" not in str(exc.value) and exc.value.parameter == "stages"


@pytest.mark.parametrize("rule", ["foolsgold", "fldetector", "nnm>foolsgold", "mean"])
def test_a_rule_reading_client_ids_reports_no_amplification_by_sampling(rule: str) -> None:
    """A rule keyed on who sent each row (``ids``: FoolsGold's history, FLDetector's per-client L-BFGS) makes the
    released models depend on who was sampled, so the secret-sample amplification (Wang, Balle & Kasiviswanathan)
    does not hold for it: its ``dp_epsilon`` is the local budget on every row (docs/privacy.md); the mean's stays the
    amplified one, below the local (q = 4/20)."""
    cfg = {"dataset": "digits", "model": "logreg", "algorithm": "fedavg", "workers": 20, "clients_per_round": 4,
           "local_steps": 1, "rounds": 4, "eval_every": 2, "dp_noise": 8.0, "dp_clip": 1.0, "seed": 0,
           "aggregator": rule, "f": 1 if rule.startswith("nnm") else 0}
    rows = train(make_config(cfg))
    assert [r["round"] for r in rows] == [0, 2, 4]
    for r in rows[1:]:
        b = accounting.budget(8.0, 1e-5, r["round"], 20, 4)
        assert r["dp_epsilon_local"] == b.epsilon_local
        assert b.epsilon < b.epsilon_local  # the amplified budget would be smaller: the rule must not claim it
        assert r["dp_epsilon"] == (b.epsilon if rule == "mean" else b.epsilon_local)


def test_the_rule_sees_momentum_rows_whose_noise_spread_is_d_sigma2_c2_times_1_minus_beta_over_1_plus_beta() -> None:
    """What DP adds to the spread of what the rule receives (docs/privacy.md, "The study"): DSGD's workers send their
    momentum m ← βm + (1 − β)g̃, so after the first rounds the noise in each coordinate has variance
    σ²C²(1 − β)/(1 + β) (0.0526·σ²C² at β = 0.9), not σ²C² — that holds only in round 0 (m₀ = g̃₀). The honest spread
    (1/(h − 1)) Σᵢ ‖mᵢ − m̄‖², averaged over rounds 30–39, is within 20 % of d·σ²C²(1 − β)/(1 + β) (its sampling error
    is a few %, and the clipped gradients' own spread is below C² = 1, against 34 here); round 0's within 20 % of
    d·σ²C²."""
    beta = 0.9
    cfg = {**BASE, "workers": 11, "rounds": 40, "eval_every": 40, "momentum": beta, "dp_noise": 1.0, "dp_clip": 1.0}
    _dp_spy.SEEN.clear()
    train(make_config(cfg))
    spreads = []
    for h in _dp_spy.SEEN:
        h = h.double()
        spreads.append(float((h - h.mean(0)).square().sum(1).sum()) / (h.shape[0] - 1))
    d = _dp_spy.SEEN[0].shape[1]
    assert len(spreads) == 40 and d == 650
    stationary = d * (1 - beta) / (1 + beta)  # σ = C = 1
    assert abs(sum(spreads[30:]) / 10 / stationary - 1) < 0.2, spreads[30:]
    assert abs(spreads[0] / d - 1) < 0.2, spreads[0]


def test_fail_closed_reveals_the_sample_so_no_amplification_is_reported() -> None:
    """``fail_closed`` stops the run (and names the suspected clients) from a history of flags *per client*, so
    whether the run goes on depends on who was sampled: with it the rows' ``dp_epsilon`` is the local budget, as for a
    rule reading ids (docs/privacy.md); a stage that does not read ids (``update_clip`` after DP) changes nothing."""
    cfg = {"dataset": "digits", "model": "logreg", "algorithm": "fedavg", "workers": 20, "clients_per_round": 4,
           "local_steps": 1, "rounds": 2, "eval_every": 2, "dp_noise": 8.0, "dp_clip": 1.0, "seed": 0,
           "aggregator": "mean", "f": 0}
    b = accounting.budget(8.0, 1e-5, 2, 20, 4)
    closed = train(make_config({**cfg, "stages": {"fail_closed": {"bound": 4}}}))[-1]
    assert closed["dp_epsilon"] == closed["dp_epsilon_local"] == b.epsilon_local > b.epsilon
    plain = train(make_config(cfg))[-1]
    assert plain["dp_epsilon"] == b.epsilon < plain["dp_epsilon_local"]
