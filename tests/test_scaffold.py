"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1, option II) as a round algorithm of one file: its first round
is FedAvg's, its control variates follow the paper's update exactly, the server's c stays the clients' mean under the
mean rule and full participation, a resumed run is bit for bit the uninterrupted one, and robust rules aggregate both
halves under attack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests._interrupt import train_interrupted

from phalanx import aggregators, attacks, data, models
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train
from phalanx.training import Experiment, Loop
from phalanx.training.algorithms.fedavg import FedAvg
from phalanx.training.algorithms.scaffold import Scaffold
from phalanx.training.loop import Evaluate

SPEC = "phalanx.training.algorithms.scaffold:Scaffold"
PARAMS = {"clients_per_round": 6, "local_steps": 3, "batch_size": 16, "lr": 0.05}


def experiment(algorithm: Any, rule: str = "mean", f: int = 0, workers: int = 8, byzantine: int = 0,
               attack: str = "none", rounds: int = 4) -> Experiment:
    ds = data.load("digits")
    torch.manual_seed(0)
    shards = data.partition(ds.train_y, workers, "pathological", classes_per_worker=2, seed=1)
    return Experiment(model=models.make("mlp", ds.input_shape, ds.num_classes), dataset=ds, workers=workers,
                      byzantine=byzantine, rule=aggregators.make(rule, f=f), attack=attacks.make(attack),
                      algorithm=algorithm, rounds=rounds, lr=1.0, shards=shards, seed=2)


def test_the_first_round_is_fedavgs() -> None:
    """With every control variate 0, the drift correction is 0: round 0 steps exactly as FedAvg's."""
    a, b = Loop(experiment(Scaffold(**PARAMS))), Loop(experiment(FedAvg(**PARAMS)))
    a.step()
    b.step()
    assert torch.equal(a.state.theta, b.state.theta)
    a.step()
    b.step()
    assert not torch.equal(a.state.theta, b.state.theta)  # from round 1 on the corrections act


def test_control_variates_follow_option_ii_and_c_is_the_clients_mean() -> None:
    """Full participation and the mean: cᵢ⁺ = cᵢ − c + (x − yᵢ)/(K η_l), c ← c + mean(Δcᵢ) = mean(cᵢ⁺)."""
    algo = Scaffold(clients_per_round=None, local_steps=3, batch_size=16, lr=0.05)
    loop = Loop(experiment(algo))
    loop.open()
    workers = loop.transport.workers
    n = loop.experiment.workers
    for _ in range(3):
        before = workers.table.clone()  # type: ignore[union-attr]
        theta = loop.state.theta.clone()
        got = workers.round(theta, loop.state.round, lambda x: x.mean(0))  # type: ignore[union-attr]
        d = theta.numel()
        pseudo, dc = got.vectors[:, :d], got.vectors[:, d:]
        expected = before[:n] - before[n] + pseudo / (3 * 0.05)
        scale = float(expected.abs().max()) + 1.0
        tol = 64 * torch.finfo(torch.float32).eps * scale
        torch.testing.assert_close(got.carry[:n], expected, atol=tol, rtol=0)  # type: ignore[index]
        torch.testing.assert_close(dc, expected - before[:n], atol=tol, rtol=0)
        agg, _ = loop.server.aggregate(got, {}, False)
        torch.testing.assert_close(agg, pseudo.mean(0), atol=tol, rtol=0)
        c = got.carry[n]  # type: ignore[index]
        torch.testing.assert_close(c, got.carry[:n].mean(0), atol=tol, rtol=0)  # type: ignore[index]
        loop.state.theta = theta - agg
        loop.state.round += 1


def test_an_interrupted_run_resumes_bit_for_bit(tmp_path: Path) -> None:
    cfg = make_config({"dataset": "digits", "model": "mlp", "workers": 8, "byzantine": 1, "f": 1, "aggregator": "cwtm",
                       "attack": "alie", "partition": "pathological", "algorithm": SPEC, "algorithm_params": PARAMS,
                       "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "lr": 1.0, "seed": 4})
    train(cfg, tmp_path / "whole")
    part = train_interrupted(cfg, tmp_path / "resumed", stop=4)
    train(cfg, part)
    a = load_file(str(next((tmp_path / "whole").glob("**/checkpoint.safetensors"))))
    b = load_file(str(next((tmp_path / "resumed").glob("**/checkpoint.safetensors"))))
    assert set(a) == set(b) and "momentum" in a  # the control-variate table is the carried state
    assert a["momentum"].shape == (9, a["theta"].numel())
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(("rule", "f", "attack"),
                         [("cwtm", 2, "alie"), ("multikrum", 2, "signflip"), ("cwmed", 2, "inf")])
def test_robust_rules_aggregate_both_halves_under_attack(rule: str, f: int, attack: str) -> None:
    exp = experiment(Scaffold(**{**PARAMS, "clients_per_round": 8}), rule=rule, f=f, workers=10, byzantine=2,
                     attack=attack, rounds=6)
    loop = Loop(exp, callbacks=[Evaluate()])
    rows = loop.run()
    assert bool(torch.isfinite(loop.state.theta).all())
    assert bool(torch.isfinite(loop.state.momentum).all())  # type: ignore[arg-type]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 2 / 360  # it learns (by more than 2 test samples)


def test_what_it_refuses_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"aggregator=.*centre or reference"):
        experiment(Scaffold(**PARAMS), rule="cc", f=1)
    with pytest.raises(ConfigError, match="engine='torchrun'"):
        Scaffold(**PARAMS).one_worker(None, 0, {}, None)
    ds = data.load("digits")
    bn = models.make("cnn", ds.input_shape, ds.num_classes, norm="batch")
    with pytest.raises(ConfigError, match="BatchNorm"):
        Experiment(model=bn, dataset=ds, workers=8, rule=aggregators.make("mean", f=0),
                   algorithm=Scaffold(**PARAMS))


@pytest.mark.parametrize("spec", ["fltrust", "nnm>fldetector"])
def test_a_refusal_names_the_rule_as_the_config_wrote_it(spec: str) -> None:
    """The user wrote ``aggregator = "nnm>fldetector"``: the one line says that, not the rule object's repr
    (``Chain(NNM(f=1) > FLDetector(f=1, window=10, …))``), which the user never wrote."""
    from phalanx.experiments import from_config

    with pytest.raises(ConfigError) as caught:
        from_config(make_config({"dataset": "digits", "model": "logreg", "workers": 6, "byzantine": 1, "f": 1,
                                 "algorithm": "scaffold", "aggregator": spec, "rounds": 1}))
    assert str(caught.value).startswith(f"aggregator={spec!r} is invalid"), str(caught.value)


def test_the_short_name_comes_from_the_packages_entry_point() -> None:
    from phalanx.experiments import from_config
    from phalanx.training.algorithms.base import names

    assert "scaffold" in names()
    cfg = make_config({"algorithm": "scaffold", "algorithm_params": PARAMS, "workers": 8, "aggregator": "cwtm",
                       "f": 1, "rounds": 2})
    assert isinstance(from_config(cfg).algorithm, Scaffold)


def _flat_spelling() -> None:
    """``clients_per_round`` (and FedAvg's other client keys) set flat mean what they mean for federated averaging:
    SCAFFOLD is built with them, the run is the ``algorithm_params`` one (the same run id), and the population's
    checks apply to them. Raises (AssertionError or ConfigError) where they do not."""
    from phalanx.experiments.config import apply_overrides
    from phalanx.experiments.grid import run_id

    base = {"algorithm": "scaffold", "workers": 20, "aggregator": "cwtm", "f": 1, "rounds": 2}
    flat = make_config(apply_overrides(base, ["clients_per_round=10", "local_steps=3", "prox_mu=0.01"]))
    table = make_config({**base, "algorithm_params": {"clients_per_round": 10, "local_steps": 3, "prox_mu": 0.01}})
    assert run_id(flat) == run_id(table)
    from phalanx.experiments import from_config

    algo = from_config(flat).algorithm
    assert isinstance(algo, Scaffold)
    assert (algo.clients_per_round, algo.local_steps, algo.prox_mu) == (10, 3, 0.01)
    with pytest.raises(ConfigError, match="clients_per_round=30"):  # more clients than the population
        make_config({**base, "clients_per_round": 30})
    with pytest.raises(ConfigError, match=r"clients_per_round=10.*algorithm_params\.clients_per_round"):
        make_config({**base, "clients_per_round": 10, "algorithm_params": {"clients_per_round": 8}})


def test_fedavgs_client_keys_mean_the_same_for_scaffold() -> None:
    _flat_spelling()


def test_the_flat_client_keys_have_scaffolds_defaults() -> None:
    """A flat key left at its default is not moved (so no run id changes): that is the same run only because the
    config's default is the constructor's."""
    import inspect

    from phalanx.experiments.schema import RunConfig
    from phalanx.training.algorithms.builtin import own_keys

    sig = inspect.signature(Scaffold).parameters
    shared = [k for k in own_keys() if k in sig]
    assert {"clients_per_round", "local_steps", "local_epochs", "prox_mu"} <= set(shared)
    for key in shared:
        assert RunConfig.model_fields[key].get_default() == sig[key].default, key


@pytest.mark.parametrize("mutant", ["ignores the flat keys", "drops a conflicting spelling"])
def test_the_flat_spelling_check_rejects_a_broken_adapter(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants of the adapter: one that leaves the flat keys where they are (the config is then refused, as before
    the adapter), one that lets algorithm_params win silently over a flat key of another value."""
    from phalanx.experiments import legacy

    real = legacy.client_keys
    if mutant == "ignores the flat keys":
        monkeypatch.setattr(legacy, "client_keys", lambda table: table)
    else:
        def quiet(table: dict[str, Any]) -> dict[str, Any]:
            params = table.get("algorithm_params", {})
            return real({k: v for k, v in table.items() if k not in params})
        monkeypatch.setattr(legacy, "client_keys", quiet)
    with pytest.raises((AssertionError, ConfigError, pytest.fail.Exception)):
        _flat_spelling()


@pytest.mark.parametrize(("table", "names"), [
    ({"local_steps": 0}, "local_steps=0"),
    ({"clients_per_round": "x"}, "clients_per_round='x'"),
    ({"clients_per_round": True}, "clients_per_round=True"),
    ({"clients_per_round": 10**18}, "clients_per_round=1000000000000000000"),
    ({"local_epochs": -1.0}, "local_epochs=-1.0"),
    ({"clients_per_round": 3, "algorithm_params": "x"}, "algorithm_params='x'"),
])
def test_a_bad_flat_client_key_is_refused_in_one_line_naming_it(table: dict[str, Any], names: str) -> None:
    """A hostile file's flat client keys with SCAFFOLD: moved or not, refused in one line naming the key written."""
    with pytest.raises(ConfigError) as caught:
        make_config({"algorithm": "scaffold", "workers": 8, **table})
    assert str(caught.value).startswith(names) and "\n" not in str(caught.value)
