"""Kardam (Damaskinos et al., ICML 2018) and Zeno++ (Xie, Koyejo & Gupta, ICML 2020) on the asynchronous seam
(issue 36): each filter's test as its paper states it, each with the mutant it rejects; what a rejected update does;
determinism given the seed; a resumed run equal to the uninterrupted one; bad parameters refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests._interrupt import train_interrupted
from typer.testing import CliRunner

from phalanx import aggregators, attacks, cli, data, models
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train
from phalanx.training import Experiment, Loop
from phalanx.training.algorithms.asynchronous import Asynchronous
from phalanx.training.algorithms.kardam import Kardam, dampening, quantile_bound
from phalanx.training.algorithms.zenopp import ZenoPP, normalised, scores
from phalanx.training.loop import Evaluate

DS = data.load("digits")
FIRST: dict[str, Any] = {"byzantine_timing": "always_first", "max_staleness": 10}


def experiment(algo: Asynchronous, byzantine: int = 0, attack: str = "none", rounds: int = 20, seed: int = 1,
               attack_params: dict[str, Any] | None = None) -> Experiment:
    torch.manual_seed(0)  # the model's initialisation
    return Experiment(model=models.make("logreg", DS.input_shape, DS.num_classes), dataset=DS, workers=10,
                      byzantine=byzantine, rule=aggregators.make("mean", f=0),
                      attack=attacks.make(attack, **(attack_params or {})), algorithm=algo, rounds=rounds, lr=0.5,
                      seed=seed, eval_every=rounds)


def last_row(exp: Experiment) -> tuple[Loop, dict[str, Any]]:
    loop = Loop(exp, callbacks=[Evaluate()])
    return loop, loop.run()[-1]


# --- Kardam ---------------------------------------------------------------------------------------------------------


def test_kardams_quantile_is_the_papers() -> None:
    """K̂ is the ⌈(n − f)/n · m⌉-th smallest known coefficient: with n = 10, f = 2 and every worker known, the 8th —
    above it lie exactly f values, so f Byzantine coefficients at the top cannot raise it past the honest ones."""
    lips = torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 8, 1e9, math.inf], dtype=torch.float64)
    assert quantile_bound(lips, 10, 2) == 8.0
    assert quantile_bound(lips, 10, 0) == math.inf  # the mutant f = 0: the maximum, the Byzantine value
    assert quantile_bound(torch.full((10,), float("nan"), dtype=torch.float64), 10, 2) is None
    assert dampening(torch.tensor([0, 2]), 0.5).tolist() == [1.0, math.exp(-1.0)]


def after_steps(algo: Kardam | ZenoPP, steps: int) -> tuple[Loop, Experiment]:
    """A run of ``algo`` opened and stepped ``steps`` server steps (one more round configured), and its experiment."""
    exp = experiment(algo, rounds=steps + 1)
    loop = Loop(exp)
    loop.open()
    for _ in range(steps):
        loop.step()
    return loop, exp


def judge(algo: Asynchronous, loop: Loop, exp: Experiment, g: torch.Tensor, worker: int = 0) -> bool:
    """The filter's verdict on update ``g`` of ``worker``, computed at the current θ (the state is not advanced)."""
    own = loop.state.own
    t = loop.state.round
    ring = own["thetas"].clone()
    ring[t % (algo.max_staleness + 1)] = loop.state.theta
    _, keep, _ = algo.screen(exp, own, loop.state.theta, t, torch.tensor([worker]), g[None],
                             torch.tensor([t]), ring)
    return bool(keep[0])


def honest_gradient(loop: Loop, exp: Experiment, worker: int = 0) -> torch.Tensor:
    shard = exp.data.shards[worker][:32]
    return exp.problem.grads(loop.state.theta, exp.data.x[shard][None], exp.data.y[shard][None])[0]


def test_kardam_rejects_a_scaled_update_and_its_mutant_does_not() -> None:
    """After honest steps, the Lipschitz filter admits an honest worker's gradient and rejects the same gradient
    scaled by 10 (its coefficient is far above the (n − f)/n quantile). The mutant — a filter that accepts
    everything (K̂ = ∞) — admits the scaled one."""
    algo = Kardam(buffer_size=4, filter_f=2, speeds="constant")
    loop, exp = after_steps(algo, 8)
    g = honest_gradient(loop, exp)
    assert judge(algo, loop, exp, g) and not judge(algo, loop, exp, 10 * g)
    assert not judge(algo, loop, exp, torch.full_like(g, float("nan")))
    lips = loop.state.own["kardam_lip"]
    loop.state.own["kardam_lip"] = torch.full_like(lips, math.inf)  # the mutant: every update passes
    assert judge(algo, loop, exp, 10 * g)


def test_kardam_admits_honest_updates_under_no_attack() -> None:
    """No attack: the filter passes most honest updates (a measured lower bound of the acceptance, 3 seeds: more than
    half; the paper's cost is < f/n of them) and the model learns."""
    for seed in (0, 1, 2):
        _, row = last_row(experiment(Kardam(buffer_size=4, filter_f=2, **FIRST), rounds=20, seed=seed))
        assert row["byzantine_rejected"] == 0 and row["rejected"] == row["honest_rejected"]
        assert row["rejected"] < row["updates"] / 2 and row["test_accuracy"] > 0.6


def test_kardam_rejects_scaled_byzantine_updates_that_fedbuff_applies() -> None:
    """Always-first sign flippers scaled by 10 (n = 10, b = 2, K = 4, f = 2): the filter rejects Byzantine updates
    and records them (``byzantine_rejected`` > 0, every rejection counted once). The mutant — Kardam's filter with
    the bound lifted (f = 0 is the maximum; every coefficient finite passes more) — rejects fewer."""
    kw: dict[str, Any] = {"byzantine": 2, "attack": "signflip", "attack_params": {"scale": 10.0}}
    _, row = last_row(experiment(Kardam(buffer_size=4, filter_f=2, **FIRST), **kw))
    assert row["byzantine_rejected"] > 0
    assert row["rejected"] == row["byzantine_rejected"] + row["honest_rejected"]
    _, lax = last_row(experiment(Kardam(buffer_size=4, filter_f=0, **FIRST), **kw))
    assert lax["byzantine_rejected"] < row["byzantine_rejected"]


# --- Zeno++ ---------------------------------------------------------------------------------------------------------


def test_zenos_score_is_the_papers() -> None:
    """g̃ = ‖v‖/‖g‖ · g, and the score ⟨v, g̃⟩ − ρ‖g̃‖²: a sign-flipped v scores −(1 + ρ)‖v‖²."""
    v = torch.tensor([3.0, 4.0])
    g = normalised(torch.tensor([[-6.0, -8.0], [0.0, 0.0]]), v)
    assert g.tolist() == [[-3.0, -4.0], [0.0, 0.0]]
    assert scores(g, v, 0.1).tolist() == pytest.approx([-25.0 - 2.5, 0.0])




def test_zeno_rejects_a_sign_flipped_update_and_its_mutant_does_not() -> None:
    """Zeno++ admits an honest gradient and rejects the same gradient sign-flipped (its validation score is
    negative, below −ε). The mutant ε = 10⁶ (a test that cannot fail) admits it."""
    algo = ZenoPP(buffer_size=4, speeds="constant")
    loop, exp = after_steps(algo, 5)
    g = honest_gradient(loop, exp)
    assert judge(algo, loop, exp, g) and not judge(algo, loop, exp, -g)
    assert judge(ZenoPP(buffer_size=4, speeds="constant", epsilon=1e6), loop, exp, -g)


def test_zeno_with_rho_zero_admits_what_barely_descends() -> None:
    """ρ > 0 demands a sufficient descent: an update that is almost orthogonal to the validation gradient (cos ≈
    0.001: noise with a trace of descent) is rejected with ρ = 0.01 and admitted by the mutant ρ = 0."""
    algo = ZenoPP(buffer_size=4, speeds="constant", rho=0.01)
    loop, exp = after_steps(algo, 5)
    v = algo.gradient(exp, loop.state.theta)  # what the step at the current θ scores against (refresh = 1)
    noise = torch.randn(v.shape, generator=torch.Generator().manual_seed(0), dtype=v.dtype)
    noise -= (noise @ v) / (v @ v) * v  # orthogonal to v
    g = noise / noise.norm() + 0.001 * v / v.norm()
    assert not judge(algo, loop, exp, g)
    assert judge(ZenoPP(buffer_size=4, speeds="constant", rho=0.0), loop, exp, g)


def test_zeno_rejects_sign_flippers_and_learns() -> None:
    """Always-first sign flippers (n = 10, b = 2, K = 4: half of every buffer): Zeno++ rejects at least 90 % of their
    updates and learns (where FedBuff's mean is at chance, tests/test_async.py); the mutant ε = 10⁶ rejects none."""
    kw: dict[str, Any] = {"byzantine": 2, "attack": "signflip", "attack_params": {"scale": 10.0}, "rounds": 20}
    _, row = last_row(experiment(ZenoPP(buffer_size=4, **FIRST), **kw))
    assert row["byzantine_rejected"] >= 0.9 * row["byzantine_updates"] and row["test_accuracy"] > 0.6
    _, lax = last_row(experiment(ZenoPP(buffer_size=4, epsilon=1e6, **FIRST), **kw))
    assert lax["byzantine_rejected"] == 0 and lax["test_accuracy"] < 0.3


def test_zenos_validation_gradient_is_lazy() -> None:
    """With ``refresh = 3`` the validation gradient is recomputed only at steps 0, 3, 6 …: after step 4 it is the one
    computed at θ₃."""
    algo = ZenoPP(buffer_size=3, refresh=3, speeds="constant")
    loop, exp = after_steps(algo, steps=3)
    theta3 = loop.state.theta.clone()
    loop.step()
    loop.step()
    assert int(loop.state.own["zeno_at"]) == 3
    assert torch.equal(loop.state.own["zeno_v"], algo.gradient(exp, theta3))


# --- both -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", [Kardam(buffer_size=4, filter_f=2, **FIRST), ZenoPP(buffer_size=4, **FIRST)])
def test_a_rejected_update_moves_nothing_and_runs_are_deterministic(algo: Asynchronous) -> None:
    """Two runs with the seed are equal bit for bit (θ, every metric); with NaN attackers the model stays finite and
    every Byzantine update is rejected."""
    kw: dict[str, Any] = {"byzantine": 2, "attack": "signflip", "attack_params": {"scale": 10.0}, "rounds": 6}
    a, ra = last_row(experiment(algo, **kw))
    b, rb = last_row(experiment(algo, **kw))
    assert torch.equal(a.state.theta, b.state.theta) and ra == rb
    loop, row = last_row(experiment(algo, byzantine=2, attack="nan", rounds=6))
    assert bool(torch.isfinite(loop.state.theta).all()) and row["byzantine_rejected"] == row["byzantine_updates"] > 0


def test_an_interrupted_filter_run_resumes_bit_for_bit(tmp_path: Path) -> None:
    """The filters' state (Kardam's references and coefficients, Zeno++'s lazy validation gradient) is checkpointed:
    a run stopped after step 4 and resumed ends with the uninterrupted run's checkpoint, key for key."""
    for name, params in (("kardam", {"buffer_size": 3, "filter_f": 2}), ("zenopp", {"buffer_size": 3, "refresh": 3})):
        cfg = make_config({"dataset": "digits", "model": "logreg", "workers": 8, "byzantine": 2, "f": 0,
                           "aggregator": "mean", "attack": "signflip", "algorithm": name,
                           "algorithm_params": {**params, "byzantine_timing": "always_first"},
                           "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "lr": 0.5, "seed": 4})
        train(cfg, tmp_path / name / "whole")
        part = train_interrupted(cfg, tmp_path / name / "resumed", stop=4)
        train(cfg, part)
        a = load_file(str(next((tmp_path / name / "whole").glob("**/checkpoint.safetensors"))))
        b = load_file(str(next((tmp_path / name / "resumed").glob("**/checkpoint.safetensors"))))
        assert set(a) == set(b) and "algorithm.screened" in a
        for key in a:  # bit for bit; NaN (a worker without a coefficient) equals NaN
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, equal_nan=True, msg=key)


@pytest.mark.parametrize(("make", "parameter"), [
    (lambda: Kardam(filter_f=-1), "algorithm_params.filter_f"),
    (lambda: Kardam(beta=-0.1), "algorithm_params.beta"),
    (lambda: Kardam(beta=float("nan")), "algorithm_params.beta"),
    (lambda: experiment(Kardam(filter_f=4)), "algorithm_params.filter_f"),
    (lambda: Kardam(buffer_size=0), "algorithm_params.buffer_size"),
    (lambda: ZenoPP(rho=-1.0), "algorithm_params.rho"),
    (lambda: ZenoPP(epsilon=float("inf")), "algorithm_params.epsilon"),
    (lambda: ZenoPP(refresh=0), "algorithm_params.refresh"),
    (lambda: ZenoPP(validation_size=0), "algorithm_params.validation_size"),
    (lambda: experiment(ZenoPP(validation_size=10**7)), "algorithm_params.validation_size"),
])
def test_bad_filter_parameters_are_refused_in_one_line(make: Any, parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.parameter == parameter and "\n" not in str(info.value)


def test_a_hostile_filter_checkpoint_is_refused() -> None:
    """A resumed state whose filter tensors have another shape, a non-finite reference or validation gradient, an
    impossible count or non-finite statistics is refused in one line naming ``start``."""
    for algo, key in ((Kardam(buffer_size=2), "kardam_lip"), (ZenoPP(buffer_size=2), "zeno_v"),
                      (Kardam(buffer_size=2), "screened")):
        exp = experiment(algo)
        own = algo.initial_state(exp, exp.problem.initial_theta())
        algo.load_state(exp, own)
        bad = [{**own, key: torch.zeros(3)}, {**own, key: torch.full_like(own[key], float("nan"))}]
        if key == "kardam_lip":
            bad = [bad[0], {**own, "kardam_refs": torch.tensor(3)},
                   {**own, "kardam_ref_grad": torch.full_like(own["kardam_ref_grad"], float("inf"))}]
        for state in bad:
            with pytest.raises(ConfigError, match=r"^start=") as info:
                algo.load_state(exp, state)
            assert "\n" not in str(info.value)


def test_the_config_refuses_what_the_api_does() -> None:
    """The config path checks Kardam's f against the workers before anything is built."""
    base = {"dataset": "digits", "model": "logreg", "workers": 9, "aggregator": "mean", "f": 0}
    with pytest.raises(ConfigError, match=r"^algorithm_params.filter_f=3"):
        make_config({**base, "algorithm": "kardam", "algorithm_params": {"filter_f": 3}})
    with pytest.raises(ConfigError, match=r"^algorithm_params.rho=-1"):
        make_config({**base, "algorithm": "zenopp", "algorithm_params": {"rho": -1.0}})
    make_config({**base, "algorithm": "kardam", "algorithm_params": {"filter_f": 2}})


def test_the_cli_lists_and_runs_both(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli.app, ["list", "algorithms", "--format", "csv"])
    assert res.exit_code == 0 and "kardam" in res.output and "zenopp" in res.output
    for name in ("kardam", "zenopp"):
        res = runner.invoke(cli.app, ["run", "--set", "dataset=digits", "--set", "model=logreg", "--set", "workers=6",
                                      "--set", "aggregator=mean", "--set", "f=0", "--set", f"algorithm={name}",
                                      "--set", "algorithm_params={buffer_size = 2}", "--set", "rounds=2",
                                      "--set", "seed=0", "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        rows = [json.loads(line) for line in next(tmp_path.glob(f"{name}/**/metrics.jsonl")).read_text().splitlines()]
        assert rows[-1]["round"] == 2 and rows[-1]["rejected"] >= 0
