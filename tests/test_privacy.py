"""Client-level differential privacy (phalanx.training.privacy, phalanx.analysis.privacy): the clipping and the noise
(its variance measured from many draws), the budget against dp-accounting's own accountant, the config keys and
their bad values, which workers are bound, the two shapes of the worker side drawing the same noise, and a resumed
run equal to an uninterrupted one bit for bit."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx import aggregators, data, models
from phalanx.analysis import privacy as accounting
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, legacy, make_config, store, train
from phalanx.training import Experiment, run
from phalanx.training.algorithms.scaffold import Scaffold
from phalanx.training.privacy import ClientDP
from phalanx.training.server import BoundRule
from phalanx.training.streams import generator

dpa = pytest.importorskip("dp_accounting")

SMALL: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 7, "byzantine": 1, "f": 1,
    "aggregator": "cwtm", "attack": "alie", "partition": "dirichlet", "alpha": 1.0, "rounds": 8, "batch_size": 8,
    "lr": 0.1, "eval_every": 4, "checkpoint_every": 4, "seed": 3, "dp_noise": 0.8, "dp_clip": 1.5,
}
FEDAVG: dict[str, Any] = {**SMALL, "algorithm": "fedavg", "workers": 10, "clients_per_round": 5, "local_steps": 2}


# ---------------------------------------------------------------------------------------------------------------
# the mechanism: clipping, noise
# ---------------------------------------------------------------------------------------------------------------

def test_clipping_scales_long_rows_to_norm_c_and_leaves_short_ones() -> None:
    dp = ClientDP(clip=2.0, noise=1.0)
    rows = torch.tensor([[3.0, 4.0], [0.6, 0.8], [0.0, 0.0], [-10.0, 0.0]])
    clipped = dp.clip_rows(rows.clone())
    norms = torch.linalg.vector_norm(clipped, dim=1)
    torch.testing.assert_close(norms, torch.tensor([2.0, 1.0, 0.0, 2.0]))
    torch.testing.assert_close(clipped[0], rows[0] * 2.0 / 5.0)  # the direction is kept
    torch.testing.assert_close(clipped[1], rows[1])
    assert torch.equal(clipped[2], rows[2])  # a zero update stays zero (no 0/0)


def test_the_noise_has_mean_zero_and_variance_sigma_squared_c_squared() -> None:
    """N(0, σ²C²) per coordinate: the sample mean within 5 standard errors of 0, the sample variance within 5
    standard errors (σ²C²·√(2/(N−1)) for a normal sample) of σ²C² — the tolerance from the sample size."""
    dp = ClientDP(clip=0.5, noise=3.0)
    rows = torch.zeros(200, 1000)  # zero updates: what comes out is the noise alone (clipping changes nothing)
    out = dp.privatize(rows, 200, generator(0, "dp")).double()
    n, var = out.numel(), (dp.noise * dp.clip) ** 2
    assert abs(out.mean().item()) < 5 * math.sqrt(var / n)
    assert abs(out.var().item() - var) < 5 * var * math.sqrt(2 / (n - 1))
    # rows are independent: the correlation of two rows' draws is within 5 standard errors (1/√d) of 0
    corr = torch.corrcoef(out[:2])[0, 1].item()
    assert abs(corr) < 5 / math.sqrt(out.shape[1])


def test_a_process_running_one_worker_adds_what_the_batched_run_adds_to_it() -> None:
    dp = ClientDP(clip=1.0, noise=0.7)
    g = torch.randn(5, 30, generator=torch.Generator().manual_seed(1)) * 3
    everyone = dp.privatize(g.clone(), 5, generator(4, "dp"))
    for r in range(5):
        gen = generator(4, "dp")
        mine = dp.privatize(g[r : r + 1].clone(), 5, gen, slice(r, r + 1))
        assert torch.equal(mine[0], everyone[r])
        none = generator(4, "dp")
        dp.privatize(g[:0].clone(), 5, none, slice(0, 0))  # a round it computes nothing: the stream still advances
        assert torch.equal(none.get_state(), gen.get_state())


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"clip": 0.0, "noise": 1.0}, "clip"), ({"clip": -1.0, "noise": 1.0}, "clip"),
    ({"clip": 1.0, "noise": 0.0}, "noise"), ({"clip": 1.0, "noise": -0.5}, "noise"),
    ({"clip": 1.0, "noise": 1.0, "delta": 0.0}, "delta"), ({"clip": 1.0, "noise": 1.0, "delta": 1.0}, "delta"),
    ({"clip": math.inf, "noise": 1.0}, "clip"),
])
def test_bad_parameters_are_one_line_naming_the_parameter(kwargs: dict[str, float], key: str) -> None:
    """The stage checks its own section's parameters, under the names the API user wrote (a config's errors name
    its flat keys through the adapter's ``name_of``: the next test)."""
    with pytest.raises(ConfigError) as exc:
        ClientDP(**kwargs)
    assert exc.value.parameter == key and "\n" not in str(exc.value)


def test_the_privacy_section_and_its_flat_keys_are_one_mapping() -> None:
    """The adapter's inverse (``legacy.flat_keys``, what a study writes) gives the flat keys that turn the same
    stage on, with the same parameters, as the stage sections read them back; the section's ``name_of`` names each
    parameter by its flat key in errors (an adapter whose ``name_of`` forgot the mapping fails here: the schema's
    ranges refuse a bad flat value first, so no config reaches the stage's own check with one)."""
    section = {"noise": 0.8, "clip": 1.5, "delta": 1e-6}
    flat = legacy.flat_keys("dp", section)
    assert flat == {"dp_noise": 0.8, "dp_clip": 1.5, "dp_delta": 1e-6}
    (dp,) = legacy.stage_sections(make_config({**SMALL, **flat}), lambda: [])
    assert (dp.name, dp.params, dp.key) == ("dp", {**section, "source": "seed"}, "dp_noise")  # simulated: seed
    assert [dp.name_of(p) for p in (*section, "source")] == ["dp_noise", "dp_clip", "dp_delta", "dp_noise_source"]
    with pytest.raises(ConfigError) as exc:
        legacy.flat_keys("dp", {"sigma": 1.0})
    assert exc.value.parameter == "sigma" and "noise, clip, delta, source" in str(exc.value)
    assert legacy.flat_keys("crfl", {"clip": 2.0}) == {"server_projection": "crfl",
                                                       "server_projection_params": {"clip": 2.0}}
    with pytest.raises(ConfigError, match="stage='fail_closed'"):
        legacy.flat_keys("fail_closed", {})


# ---------------------------------------------------------------------------------------------------------------
# the budget
# ---------------------------------------------------------------------------------------------------------------

def _library_epsilon(event: Any, rounds: int, delta: float) -> float:
    from dp_accounting import rdp

    acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(event, rounds)
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize(("noise", "rounds"), [(1.0, 10), (2.0, 100), (4.0, 500)])
def test_every_round_dsgd_budget_is_the_librarys_composed_gaussian(noise: float, rounds: int) -> None:
    """q = 1 (every worker every round): T Gaussian mechanisms of multiplier σ/2 (replace-one sensitivity 2C)."""
    b = accounting.budget(noise, 1e-5, rounds, 20, 20)
    expected = _library_epsilon(dpa.GaussianDpEvent(noise / 2), rounds, 1e-5)
    assert b.epsilon == b.epsilon_local == expected
    # the RDP of the Gaussian, T·α/(2z²), converted with the classical bound ε ≤ RDP(α) + log(1/δ)/(α − 1)
    # (Mironov 2017, Prop. 3): the library's conversion is at least as tight
    z = noise / 2
    classical = min(rounds * a / (2 * z * z) + math.log(1e5) / (a - 1) for a in [1 + x / 10 for x in range(1, 1000)])
    assert expected <= classical * (1 + 1e-9)


def test_sampled_budget_is_the_smaller_of_the_amplified_and_the_local_one() -> None:
    noise, rounds, n, m = 8.0, 200, 100, 10
    b = accounting.budget(noise, 1e-6, rounds, n, m)
    z = noise / 2
    local = _library_epsilon(dpa.GaussianDpEvent(z), rounds, 1e-6)
    amplified = _library_epsilon(dpa.SampledWithoutReplacementDpEvent(n, m, dpa.GaussianDpEvent(z)), rounds, 1e-6)
    assert b.epsilon_local == local
    assert b.epsilon == min(local, amplified)
    assert amplified < local  # q = 0.1 with this much noise: sampling helps the released models
    assert accounting.budget(noise, 1e-6, 0, n, m).epsilon == 0.0
    assert accounting.budget(noise, 1e-6, 100, n, m).epsilon < b.epsilon  # ε grows with the rounds


def test_a_missing_accountant_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # import dp_accounting raises ImportError
    accounting.budget.cache_clear()
    with pytest.raises(ConfigError, match=r"phalanx\[privacy\]") as exc:
        make_config({**SMALL})
    assert exc.value.parameter == "dp_noise" and "\n" not in str(exc.value)
    accounting.budget.cache_clear()


# ---------------------------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "key"), [
    ({"dp_noise": 0.0}, "dp_noise"), ({"dp_noise": -1.0}, "dp_noise"), ({"dp_clip": 0.0}, "dp_clip"),
    ({"dp_clip": -2}, "dp_clip"), ({"dp_delta": 0.0}, "dp_delta"), ({"dp_delta": 1.0}, "dp_delta"),
    ({"dp_delta": 1.5}, "dp_delta"), ({"dp_clip": None}, "dp_clip"), ({"dp_noise": None}, "dp_noise"),
    ({"dp_noise": None, "dp_clip": None, "dp_delta": 1e-6}, "dp_delta"),
    ({"algorithm": "gossip", "attack": "none", "byzantine": 0, "f": 0, "aggregator": "mean"}, "dp_noise"),
    ({"algorithm": "scaffold", "algorithm_params": {"clients_per_round": 4}, "attack": "none"}, "dp_noise"),
    ({"algorithm": "fedavg", "model": "cnn", "model_params": {"norm": "batch"}}, "model_params.norm"),
    # FLTrust's unnoised reference gradient on root samples drawn from the clients' data: no ε holds
    ({"aggregator": "fltrust"}, "aggregator"), ({"aggregator": "nnm>fltrust"}, "aggregator"),
    ({"aggregator": "fltrust", "algorithm": "fedavg", "clients_per_round": 4}, "aggregator"),
    # the edge-case pool holds honest clients' samples: one client's data would enter the Byzantine releases too
    ({"attack": "edgecase"}, "attack"),
    ({"attack": "edgecase", "algorithm": "fedavg", "clients_per_round": 4}, "attack"),
])
def test_bad_config_is_one_line_naming_the_key_at_validation(changes: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_config({**SMALL, **changes})
    assert exc.value.parameter == key and "\n" not in str(exc.value)


def test_new_keys_leave_run_ids_and_configs_of_runs_without_privacy_alone() -> None:
    plain = {k: v for k, v in SMALL.items() if not k.startswith("dp_")}
    dumped = make_config(plain).model_dump()
    assert not any(k.startswith("dp_") for k in dumped)
    with_dp = make_config(SMALL).model_dump()
    assert with_dp["dp_noise"] == 0.8 and with_dp["dp_clip"] == 1.5 and "dp_delta" not in with_dp  # its default


def test_the_api_refuses_an_algorithm_that_does_not_apply_it() -> None:
    ds = data.load("digits")
    with pytest.raises(ConfigError, match="distributed SGD and federated averaging") as exc:
        Experiment(model=models.make("logreg", ds.input_shape, ds.num_classes), dataset=ds, workers=4,
                   rule=aggregators.make("mean", f=0), algorithm=Scaffold(), privacy=ClientDP(1.0, 1.0))
    assert exc.value.parameter == "privacy"
    with pytest.raises(ConfigError, match="fltrust") as exc:  # an unnoised gradient of the clients' data
        Experiment(model=models.make("logreg", ds.input_shape, ds.num_classes), dataset=ds, workers=4,
                   rule=aggregators.make("fltrust", f=0), privacy=ClientDP(1.0, 1.0))
    assert exc.value.parameter == "aggregator" and "\n" not in str(exc.value)


# ---------------------------------------------------------------------------------------------------------------
# the workers
# ---------------------------------------------------------------------------------------------------------------

def test_honest_rows_are_privatized_and_a_vector_attack_is_not_bound() -> None:
    """With almost no noise, every honest first-round vector (m₀ = g̃₀) has norm ≤ C; the Byzantine row of a
    gaussian attack with a huge scale is far beyond it."""
    cfg = make_config({**SMALL, "dp_noise": 1e-9, "dp_clip": 0.05, "attack": "gaussian",
                       "attack_params": {"sigma": 100.0}})
    exp = from_config(cfg)
    streams = {name: generator(cfg.seed, name).get_state() for name in ("batches", "attack", "dp")}
    got = exp.algorithm.all_workers(exp, streams, None).round(exp.problem.initial_theta(), 0, BoundRule(exp.rule, {}))
    norms = torch.linalg.vector_norm(got.vectors, dim=1)
    assert bool((norms[: exp.honest] <= 0.05 * (1 + 1e-4)).all())
    assert bool((norms[exp.honest :] > 10).all())


@pytest.mark.parametrize("attack", ["alie", "labelflip"])
def test_every_dsgd_rank_sends_the_in_process_row(attack: str) -> None:
    cfg = make_config({**SMALL, "model": "logreg", "model_params": {}, "workers": 6, "byzantine": 2, "f": 2,
                       "attack": attack})
    exp = from_config(cfg)
    streams = {name: generator(cfg.seed, name).get_state() for name in ("batches", "attack", "dp")}
    everyone = exp.algorithm.all_workers(exp, streams, None)
    ranks = [exp.algorithm.one_worker(exp, r, streams, None) for r in range(cfg.workers)]
    theta, rule = exp.problem.initial_theta(), BoundRule(exp.rule, {})
    for t in range(3):
        rows = everyone.round(theta, t, rule).vectors.clone()
        sent = [w.vector(theta, t) for w in ranks]
        honest = torch.stack([v for v in sent[: exp.honest] if v is not None])
        for w, v in zip(ranks, sent):
            if v is None:
                v = w.attack_vector(honest, rule, t)
            torch.testing.assert_close(v, rows[w.rank])
            mine, all_of = w.stages.generators["dp"], everyone.stages.generators["dp"]
            assert torch.equal(mine.get_state(), all_of.get_state())  # every rank's noise in step
        theta = theta - 0.1 * rows.mean(0)


def test_every_fedavg_slot_sends_the_in_process_row() -> None:
    cfg = make_config({**FEDAVG, "model": "logreg", "model_params": {}, "attack": "none", "byzantine": 0})
    exp = from_config(cfg)
    streams = {name: generator(cfg.seed, name).get_state() for name in ("batches", "attack", "clients", "dp")}
    clients = exp.algorithm.all_workers(exp, streams, None)
    slots = [exp.algorithm.one_worker(exp, r, streams, None) for r in range(5)]
    theta, rule = exp.problem.initial_theta(), BoundRule(exp.rule, {})
    for t in range(2):
        rows = clients.round(theta, t, rule).vectors
        for s in slots:
            v = s.vector(theta, t)
            assert v is not None
            torch.testing.assert_close(v, rows[s.rank])
            assert torch.equal(s.stages.generators["dp"].get_state(), clients.stages.generators["dp"].get_state())


# ---------------------------------------------------------------------------------------------------------------
# runs: the ε column, the noise changes the run, resume bit for bit
# ---------------------------------------------------------------------------------------------------------------

def test_metric_rows_carry_the_budget_of_their_round() -> None:
    cfg = make_config(SMALL)
    rows = run(from_config(cfg))
    assert [r["round"] for r in rows] == [0, 4, 8]
    for r in rows:
        expected = accounting.budget(0.8, 1e-5, r["round"], 7, 7)
        assert r["dp_epsilon"] == expected.epsilon == r["dp_epsilon_local"]
        assert r["dp_noise"] == 0.8 and r["dp_clip"] == 1.5
    assert rows[0]["dp_epsilon"] == 0.0 < rows[1]["dp_epsilon"] < rows[2]["dp_epsilon"]
    plain = run(from_config(make_config({k: v for k, v in SMALL.items() if not k.startswith("dp_")})))
    assert "dp_epsilon" not in plain[-1] and plain[-1]["test_loss"] != rows[-1]["test_loss"]


@pytest.mark.parametrize("config", [SMALL, FEDAVG, {**SMALL, "attack": "labelflip"}],
                         ids=["dsgd-alie", "fedavg-alie", "dsgd-labelflip"])
def test_a_resumed_run_equals_the_uninterrupted_one_bit_for_bit(config: dict[str, Any], tmp_path: Path) -> None:
    full = tmp_path / "full"
    train(make_config(config), full)
    part = train_interrupted(make_config(config), tmp_path / "part", 4)
    train(make_config(config), part)
    ta, tb = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert "rng.dp" in ta and ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    assert store.read_rows(full) == store.read_rows(part)
    assert not torch.equal(ta["rng.dp"], generator(config["seed"], "dp").get_state())  # the noise was drawn
