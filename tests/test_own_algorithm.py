"""A round algorithm from the user's own module (examples/plugins/mylab/algorithms.py, full-batch distributed GD),
named by ``module:attr`` spec with ``algorithm_params``: it trains through ``phalanx run``, a parallel sweep, a
resume after an interruption and ``phalanx launch`` — and nothing of Phalanx names it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests._interrupt import train_interrupted
from tests.test_extending import PLUGINS, env, final, phalanx

from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train

SPEC = "mylab.algorithms:FullGD"
JOB = {"dataset": "digits", "model": "mlp", "workers": 5, "byzantine": 1, "f": 1, "aggregator": ["cwtm", "cwmed"],
       "attack": "alie", "algorithm": SPEC, "algorithm_params": {"chunk": 200}, "rounds": 12, "eval_every": 6,
       "checkpoint_every": 6, "lr": 0.5, "seed": 3}


def toml(data: dict[str, object]) -> str:
    def value(v: object) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)

    return "".join(f"{k} = {value(v)}\n" for k, v in data.items())


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))


def test_run_sweep_and_launch_train_the_users_algorithm(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(toml(JOB))
    environ = env(PLUGINS)
    phalanx(["run", str(job), "--out", str(tmp_path / "run")], environ)
    phalanx(["sweep", str(job), "--jobs", "2", "--out", str(tmp_path / "sweep")], environ)
    one, two = final(tmp_path / "run"), final(tmp_path / "sweep")
    assert set(one) == {"cwtm", "cwmed"} == set(two)
    for rule in one:  # the same runs in this process and in the sweep's worker processes (one thread each there:
        # a full-shard gradient's sums may round differently, so equal up to float32 rounding over 12 steps)
        assert one[rule][0] == pytest.approx(two[rule][0], abs=2 / 360)
        torch.testing.assert_close(one[rule][1], two[rule][1], atol=1e-5, rtol=1e-4)
    assert one["cwtm"][0] > 0.5  # it learns, under ALIE
    launched = phalanx(["launch", "--workers", "5", str(job), "--set", "aggregator=cwtm", "--set", "round_timeout=60",
                        "--out", str(tmp_path / "launch")], environ)
    assert launched.returncode == 0
    got = final(tmp_path / "launch")["cwtm"]
    torch.testing.assert_close(got[1], one["cwtm"][1], atol=1e-5, rtol=1e-4)  # real processes, the same run


def test_an_interrupted_run_of_the_users_algorithm_resumes_to_the_same_bits(tmp_path: Path, on_path: None) -> None:
    cfg = make_config({**JOB, "aggregator": "cwtm"})
    train(cfg, tmp_path / "whole")
    part = train_interrupted(cfg, tmp_path / "resumed", stop=6)
    train(cfg, part)
    a = load_file(str(next((tmp_path / "whole").glob("**/checkpoint.safetensors"))))
    b = load_file(str(next((tmp_path / "resumed").glob("**/checkpoint.safetensors"))))
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_the_users_algorithm_keeps_run_ids_of_builtin_configs_and_checks_its_params(on_path: None) -> None:
    from phalanx.experiments import grid

    plain = make_config({"workers": 5, "aggregator": "cwtm", "f": 1})
    assert "algorithm_params" not in plain.identity()  # a built-in config's run id is as before
    assert grid.run_id(plain) == grid.run_id(make_config({"workers": 5, "aggregator": "cwtm", "f": 1,
                                                          "algorithm": "dsgd"}))
    with pytest.raises(ConfigError, match=r"parameters of mylab.algorithms:FullGD: chunk"):
        make_config({**JOB, "aggregator": "cwtm", "algorithm_params": {"chunks": 3}})
    with pytest.raises(ConfigError, match=r"algorithm_params=.*built-in algorithm takes its own config keys"):
        make_config({"workers": 5, "aggregator": "cwtm", "algorithm_params": {"chunk": 3}})
    with pytest.raises(ConfigError, match="did you mean fedavg"):
        make_config({"algorithm": "fedav"})
    with pytest.raises(ConfigError, match=r"a subclass of phalanx\.training\.algorithms\.base\.RoundAlgorithm"):
        make_config({"algorithm": "mylab.rules:MedianOfMeans"})
    assert sys.modules.get("mylab.algorithms") is not None
