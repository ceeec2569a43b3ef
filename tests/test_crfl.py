"""CRFL (Xie, Chen, Chen & Li, ICML 2021): the global model clipped to ρ_t after every round and perturbed with
N(0, σ²I) in every round but the last (the noise's scale checked statistically), a resumed run equal to an
uninterrupted one bit for bit, the smoothed prediction and the certified radius against values computed by hand, no
radius where the vote is not confident, and the one-line refusals."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from _backdoor_cfg import FED
from _interrupt import train_interrupted
from phalanx import aggregators, data, models
from phalanx.decentralized import topology
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config, store, train
from phalanx.training import Callback, Evaluate, Experiment, Loop, Problem, RoundInfo
from phalanx.training.algorithms.gossip import Gossip
from phalanx.training.crfl import CRFL, certify, hoeffding_bounds, radius, votes
from phalanx.training.streams import generator

EPS32 = torch.finfo(torch.float32).eps
CRFL_CFG: dict[str, Any] = {
    **FED, "aggregator": "mean", "f": 0, "attack": "backdoor", "server_projection": "crfl",
    "server_projection_params": {"clip": 1.5, "noise": 0.01, "samples": 40},
}


class _Thetas(Callback):
    """θ after every round."""

    def __init__(self) -> None:
        self.thetas: list[Tensor] = []

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        self.thetas.append(loop.state.theta.clone())


def test_clipping_bounds_the_global_norm_after_every_round() -> None:
    """Replaying the run's ``projection`` stream takes the noise off every round's θ: what is left has norm ρ_t at
    most (equal to it in round 1: the initial MLP's norm is far above ρ₁), and the last round's θ — not perturbed —
    too."""
    cfg = make_config({**CRFL_CFG, "server_projection_params": {"clip": 1.5, "clip_growth": 0.25, "noise": 0.02,
                                                                "samples": 5}})
    exp = from_config(cfg)
    assert isinstance(exp.stage(CRFL), CRFL)
    seen = _Thetas()
    Loop(exp, callbacks=[seen]).run()
    gen = generator(cfg.seed, "projection")
    d = exp.problem.dim
    assert len(seen.thetas) == cfg.rounds
    for t, theta in enumerate(seen.thetas, start=1):
        rho = 1.5 + 0.25 * t
        noise = 0.02 * torch.randn(d, generator=gen) if t < cfg.rounds else torch.zeros(d)
        clipped = torch.linalg.vector_norm((theta - noise).double())
        tol = 8 * EPS32 * (1 + float(torch.linalg.vector_norm(noise)) / rho) * rho
        assert float(clipped) <= rho + tol
        if t == 1:
            assert float(clipped) >= rho - tol
    assert float(torch.linalg.vector_norm(seen.thetas[-1].double())) <= (1.5 + 0.25 * cfg.rounds) * (1 + 8 * EPS32)


def test_the_noise_has_the_right_scale_and_the_last_round_has_none() -> None:
    """θ = 0 (nothing to clip): what ``apply`` returns is the noise itself. Its mean is within 5 standard errors
    (σ/√d) of 0 and its mean square within 5 of σ² (the standard error of a mean of d squares of N(0, σ²):
    σ²·√(2/d)); in the last round nothing is added."""
    d, sigma = 200_000, 0.3
    crfl = CRFL(clip=1e6, noise=sigma)
    out = crfl.apply(torch.zeros(d), 3, 10, generator(0, "projection"))
    assert abs(float(out.double().mean())) < 5 * sigma / math.sqrt(d)
    assert abs(float(out.double().pow(2).mean()) - sigma**2) < 5 * sigma**2 * math.sqrt(2 / d)
    theta = torch.randn(d, generator=torch.Generator().manual_seed(1))
    assert torch.equal(crfl.apply(theta, 10, 10, generator(0, "projection")), theta)


def test_the_smoothing_copies_have_the_test_noise() -> None:
    """The M test-time copies are θ + σ_T ξ: their mean squared distance to θ is σ_T² (tolerance as above, over
    M·d draws)."""
    d, m, sigma_t = 5_000, 40, 0.05
    theta = torch.ones(d)
    seen: list[Tensor] = []

    def predict(th: Tensor, x: Tensor) -> Tensor:
        seen.append(th - theta)
        return torch.zeros(x.shape[0], dtype=torch.long)

    counts = votes(predict, theta, torch.zeros(3, 1), 2, m, sigma_t, generator(0, "crfl-smoothing"))
    assert counts.tolist() == [[m, 0]] * 3
    sq = torch.stack(seen).double().pow(2).mean()
    assert abs(float(sq) - sigma_t**2) < 5 * sigma_t**2 * math.sqrt(2 / (m * d))


def _assert_same(a: Path, b: Path) -> None:
    ta, tb = load_file(str(a / "checkpoint.safetensors")), load_file(str(b / "checkpoint.safetensors"))
    assert set(ta) == set(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert store.read_rows(a) == store.read_rows(b)


DSGD_CFG: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 7, "byzantine": 2, "f": 2,
    "aggregator": "cwtm", "attack": "backdoor", "rounds": 8, "batch_size": 8, "lr": 0.1, "eval_every": 2,
    "checkpoint_every": 4, "seed": 5, "server_projection": "crfl",
    "server_projection_params": {"clip": 3.0, "noise": 0.02, "samples": 30},
}


@pytest.mark.parametrize("cfg", [CRFL_CFG, DSGD_CFG], ids=["fedavg-mean", "dsgd-cwtm"])
def test_a_resumed_run_equals_an_uninterrupted_one_bit_for_bit(cfg: dict[str, Any], tmp_path: Path) -> None:
    """FedAvg with the mean (the paper's setting) and DSGD with a robust rule (CRFL composes with any)."""
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 4)
    assert "rng.projection" in load_file(str(part / "checkpoint.safetensors"))
    train(make_config(cfg), part)
    _assert_same(full, part)
    rows = store.read_rows(full)
    last = rows[-1]
    assert all(r["crfl_accuracy"] is None for r in rows[:-1])
    for key in ("crfl_accuracy", "crfl_certified_accuracy", "crfl_certified_rate", "crfl_attack_success"):
        assert 0.0 <= last[key] <= 1.0
    assert last["crfl_certified_accuracy"] <= min(last["crfl_accuracy"], last["crfl_certified_rate"])
    assert last["crfl_radius_median"] >= 0.0


def test_without_a_projection_nothing_changes() -> None:
    """No key of a config without CRFL enters its resolved form (its run id), and the run draws no projection."""
    cfg = make_config(FED)
    dumped = cfg.model_dump(mode="json")
    assert "server_projection" not in dumped and "server_projection_params" not in dumped
    exp = from_config(cfg)
    loop = Loop(exp)
    loop.open()
    assert exp.stage(CRFL) is None and "projection" not in loop.snapshot().streams


def test_hoeffding_bounds_and_the_radius_against_hand_computed_values() -> None:
    """M = 100 votes 80 / 15 / 5 over C = 3 classes, α = 0.01: margin √(ln(2C/α)/(2M)) = √(ln(600)/200); the
    radius with one attacked round a = 2 of T = 3, ρ = 1, σ = 0.5, σ_T = 0.25, and
    S = R·p·γ·τ·η·(q/n)·L_Z = 2·0.1·1·2·0.5·0.5·3 = 0.3."""
    counts = torch.tensor([[80, 15, 5]])
    top, p_a, p_b = hoeffding_bounds(counts, 0.01)
    margin = math.sqrt(math.log(600) / 200)
    assert int(top) == 0
    assert float(p_a) == pytest.approx(0.80 - margin, abs=1e-12)
    assert float(p_b) == pytest.approx(0.15 + margin, abs=1e-12)
    crfl = CRFL(clip=1.0, noise=0.5, test_noise=0.25, samples=100, alpha=0.01, attackers=2, weight=0.1, scale=1.0,
                local_steps=2, client_lr=0.5, poison_fraction=0.5, lipschitz=3.0, attack_rounds=[2])
    assert crfl.sensitivity == pytest.approx(0.3)
    cert = certify(counts, 0.01, sensitivity=crfl.sensitivity, rounds=3, attack_rounds=[2], clip=crfl.clip_at,
                   noise=0.5, test_noise=0.25)
    budget = -math.log(1 - (math.sqrt(0.80 - margin) - math.sqrt(0.15 + margin)) ** 2)
    contraction = 2 * NormalDist().cdf(1.0 / 0.25) - 1  # round 3 = T: ρ_T / σ_T
    expected = math.sqrt(budget * 0.5**2 / (2 * 0.3**2 * contraction))
    assert float(cert.radius) == pytest.approx(expected, rel=1e-9)
    # two attacked rounds: the per-round divergences add, each contracted only by the unattacked rounds after it
    # (round 1 by round 3 alone: round 2 is attacked, and there the chain rule adds its term and contracts nothing)
    two = radius(p_a, p_b, sensitivity=0.3, attack_rounds=[1, 2], rounds=3, clip=lambda t: 1.0, noise=0.5,
                 test_noise=0.25)
    expected_two = math.sqrt(budget / (2 * 0.3**2 * (contraction / 0.5**2 + contraction / 0.5**2)))
    assert float(two) == pytest.approx(expected_two, rel=1e-9)
    # attacked in the last round: σ_T's own divergence, nothing to contract it
    last = radius(p_a, p_b, sensitivity=0.3, attack_rounds=[3], rounds=3, clip=lambda t: 1.0, noise=0.5,
                  test_noise=0.25)
    assert float(last) == pytest.approx(math.sqrt(budget * 0.25**2 / (2 * 0.3**2)), rel=1e-9)


@pytest.mark.parametrize("row", [[50, 50], [55, 45], [40, 35, 25], [0, 0]])
def test_no_radius_where_the_vote_is_not_confident(row: list[int]) -> None:
    """A tie, or a lead within the two Hoeffding margins (M = 100, α = 0.001: 2·0.195 > 0.1), certifies nothing."""
    counts = torch.tensor([row])
    cert = certify(counts, 0.001, sensitivity=1.0, rounds=5, attack_rounds=[1], clip=lambda t: 1.0, noise=0.1,
                   test_noise=0.1)
    assert float(cert.radius) == 0.0


def test_the_smoothed_prediction_of_a_tiny_model_against_its_known_vote_share() -> None:
    """A linear model with two logits w₀x, w₁x (no bias) at x = 1: a noisy copy predicts class 1 with probability
    Φ((w₁ − w₀)/(σ√2)). With M = 4000 copies the vote share is within Hoeffding's margin of it (at α = 10⁻⁶), and
    the smoothed prediction and its bounds are those of the counts."""
    torch.manual_seed(0)
    model = nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.0], [0.1]]))
    problem = Problem(model)
    theta = problem.initial_theta()
    sigma, m = 0.2, 4000
    crfl = CRFL(clip=10.0, noise=sigma, samples=m, alpha=0.001)
    cert = crfl.certify(problem, theta, torch.ones(1, 1), 2, rounds=4, seed=3)
    share = float(cert.counts[0, 1]) / m
    assert abs(share - NormalDist().cdf(0.1 / (sigma * math.sqrt(2)))) < math.sqrt(math.log(2 / 1e-6) / (2 * m))
    assert int(cert.prediction) == 1 and int(cert.counts.sum()) == m
    top, p_a, p_b = hoeffding_bounds(cert.counts, 0.001)
    assert torch.equal(cert.p_a, p_a) and torch.equal(cert.p_b, p_b) and torch.equal(cert.prediction, top)
    # the same seed gives the same copies: the certificate is reproducible
    again = crfl.certify(problem, theta, torch.ones(1, 1), 2, rounds=4, seed=3)
    assert torch.equal(again.counts, cert.counts)


@pytest.mark.parametrize("params, key", [
    ({"noise": 0.0}, "server_projection_params.noise"), ({"noise": -1.0}, "server_projection_params.noise"),
    ({"clip": 0.0}, "server_projection_params.clip"), ({"clip": -2.0}, "server_projection_params.clip"),
    ({"samples": 0}, "server_projection_params.samples"), ({"alpha": 0.0}, "server_projection_params.alpha"),
    ({"alpha": 1.0}, "server_projection_params.alpha"), ({"alpha": 1.5}, "server_projection_params.alpha"),
    ({"test_noise": 0.0}, "server_projection_params.test_noise"),
    ({"attack_rounds": [0]}, "server_projection_params.attack_rounds"),
    ({"attack_rounds": [99]}, "server_projection_params.attack_rounds"),
    ({"attack_rounds": 3}, "server_projection_params.attack_rounds"),
    ({"sigma": 1.0}, "server_projection_params.sigma"),
])
def test_bad_parameters_are_one_line_errors(params: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_config({**CRFL_CFG, "server_projection_params": {"clip": 1.0, "noise": 0.1, **params}})
    assert exc.value.parameter == key and "\n" not in str(exc.value)


@pytest.mark.parametrize("change, key", [
    ({"server_projection": "smooth"}, "server_projection"),
    ({"server_projection": None}, "server_projection_params"),
    ({"algorithm": "gossip", "graph": "complete", "clients_per_round": None, "local_steps": 1}, "server_projection"),
    ({"model": "cnn", "model_params": {"norm": "fedbn"}}, "server_projection"),
])
def test_where_crfl_cannot_apply_it_is_refused(change: dict[str, Any], key: str) -> None:
    cfg = {**CRFL_CFG, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None or k == "server_projection"}
    if cfg.get("server_projection") is None:
        cfg.pop("server_projection")
    with pytest.raises(ConfigError) as exc:
        make_config(cfg)
    assert exc.value.parameter == key and "\n" not in str(exc.value)


def test_the_api_takes_a_projection_and_refuses_it_without_a_server_model() -> None:
    ds = data.load("digits")

    def model() -> nn.Module:
        return models.make("mlp", ds.input_shape, ds.num_classes, hidden=[8])

    exp = Experiment(model=model(), dataset=ds, rule=aggregators.make("mean", f=0), workers=4, rounds=2,
                     eval_every=1, projection=CRFL(clip=1.0, noise=0.01, samples=3))
    loop = Loop(exp, callbacks=[Evaluate()])
    rows = loop.run()
    assert rows[-1]["crfl_accuracy"] is not None
    assert float(torch.linalg.vector_norm(loop.state.theta.double())) <= 1.0 * (1 + 8 * EPS32)
    with pytest.raises(ConfigError, match="projection"):
        Experiment(model=model(), dataset=ds, rule=aggregators.make("mean", f=0), workers=4, rounds=2,
                   algorithm=Gossip(graph=topology.make("complete", 4)), projection=CRFL())


def test_the_defaults_come_from_the_run() -> None:
    """R = byzantine, p = 1/clients a round, τ = local_steps, η = lr, γ and q/n = the backdoor's boost and
    poison_fraction, and the attacked rounds 1 … stop_round."""
    cfg = make_config({**CRFL_CFG, "attack_params": {"boost": 4.0, "poison_fraction": 0.25, "stop_round": 3}})
    crfl = from_config(cfg).stage(CRFL)
    assert isinstance(crfl, CRFL)
    assert (crfl.attackers, crfl.weight, crfl.local_steps, crfl.client_lr) == (3, 1 / 10, 2, 0.05)
    assert (crfl.scale, crfl.poison_fraction, crfl.attack_rounds) == (4.0, 0.25, (1, 2, 3))
