"""A device-capacity trace's bandwidth on the simulated clock (``algorithm_params.trace_bandwidth``): an update's time
is FedScale's completion time, 3·B·latency/1000 + 2·(d/32)/bandwidth seconds (docs/async.md, "The simulated clock")."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from phalanx import aggregators, attacks, data, models
from phalanx.errors import ConfigError
from phalanx.training import Experiment, Loop
from phalanx.training.algorithms import traces
from phalanx.training.algorithms.fedbuff import FedBuff

DS = data.load("digits")


def _trace(tmp_path: Path, table: dict[int, dict[str, float]]) -> str:
    path = tmp_path / "capacity.pkl"
    path.write_bytes(pickle.dumps(table, protocol=4))
    return f"fedscale:{path}"


# Client 0 computes fast on a slow link, client 1 slowly on a fast link, client 2 in between.
TABLE = {10: {"computation": 50.0, "communication": 200.0},
         20: {"computation": 150.0, "communication": 50000.0},
         30: {"computation": 100.0, "communication": 5000.0}}


def test_the_speeds_are_fedscales_completion_times_by_hand(tmp_path: Path) -> None:
    """B = 32, d = 320,000 (10,000 kbit each way): T = 3·32·latency/1000 + 20,000/bandwidth seconds —
    client 0: 4.8 + 100 = 104.8 s, client 1: 14.4 + 0.4 = 14.8 s, client 2: 9.6 + 4 = 13.6 s; the median 14.8 s.
    The mutant that reads the computation alone (the default) makes client 0 the fastest (speed 2), here it is the
    slowest."""
    spec = _trace(tmp_path, TABLE)
    expected = (14.8 / 104.8, 14.8 / 14.8, 14.8 / 13.6)
    got = traces.load_with_bandwidth(spec, dim=320_000, batch_size=32)
    assert got == pytest.approx(expected, rel=1e-12)
    assert traces.load(spec) == (2.0, 100.0 / 150.0, 1.0)  # the computation alone: client 0 fastest
    assert min(range(3), key=lambda i: got[i]) == 0
    small = traces.load_with_bandwidth(spec, dim=32, batch_size=32)  # a tiny model: the link hardly matters
    assert max(range(3), key=lambda i: small[i]) == 0


def test_a_run_takes_its_speeds_from_the_completion_times(tmp_path: Path) -> None:
    """The run's clock holds the trace's completion-time speeds for its own model's d and batch size; off (the
    default) it holds the computation's, bit for bit the speeds before the key existed."""
    spec = _trace(tmp_path, TABLE)

    def built(**params: object) -> Loop:
        torch.manual_seed(0)
        exp = Experiment(model=models.make("logreg", DS.input_shape, DS.num_classes), dataset=DS, workers=3,
                         byzantine=0, rule=aggregators.make("mean", f=0), attack=attacks.make("none"),
                         algorithm=FedBuff(buffer_size=2, speeds=spec, batch_size=8, **params), rounds=2, lr=0.5,
                         seed=0)
        loop = Loop(exp)
        loop.run()
        return loop

    dim = 64 * 10 + 10  # logreg on digits: 8×8 inputs, 10 classes
    on = built(trace_bandwidth=True)
    assert on.experiment.problem.dim == dim
    assert on.state.own["speed"].tolist() == list(traces.load_with_bandwidth(spec, dim, 8))
    assert built().state.own["speed"].tolist() == list(traces.load(spec))


def test_bad_values_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="only with speeds = 'fedscale:PATH'") as info:
        FedBuff(trace_bandwidth=True)
    assert info.value.parameter == "algorithm_params.trace_bandwidth" and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="true or false"):
        FedBuff(speeds="fedscale:sample", trace_bandwidth="yes")  # type: ignore[arg-type]
    no_link = _trace(tmp_path, {1: {"computation": 10.0}, 2: {"computation": 20.0, "communication": 0.0}})
    for params, says in (({"trace_bandwidth": True}, "'communication' must be a finite number > 0, got None"),):
        algo = FedBuff(speeds=no_link, buffer_size=1, **params)  # type: ignore[arg-type]
        torch.manual_seed(0)
        with pytest.raises(ConfigError, match=says) as info:
            Experiment(model=models.make("logreg", DS.input_shape, DS.num_classes), dataset=DS, workers=2,
                       byzantine=0, rule=aggregators.make("mean", f=0), attack=attacks.make("none"), algorithm=algo,
                       rounds=1, lr=0.5, seed=0)
        assert "capacity.pkl" in str(info.value) and "\n" not in str(info.value)
    FedBuff(speeds=no_link, buffer_size=1)  # without the key the bandwidth is not read: the old traces still run


def test_the_cli_runs_it_and_real_processes_refuse_it(tmp_path: Path) -> None:
    """From the command line on the shipped sample; with ``engine = "torchrun"`` one line before anything runs
    (processes send over their real links: the trace's bandwidth is the simulated clock's)."""
    from typer.testing import CliRunner

    from phalanx import cli

    base = ["run", "--set", "dataset=digits", "--set", "model=logreg", "--set", "workers=8", "--set", "byzantine=0",
            "--set", "attack=none", "--set", "f=0", "--set", "aggregator=mean", "--set", "algorithm=fedbuff",
            "--set", 'algorithm_params={buffer_size = 2, speeds = "fedscale:sample", trace_bandwidth = true}',
            "--set", "rounds=3", "--set", "seed=0", "--set", "eval_every=3"]
    res = CliRunner().invoke(cli.app, [*base, "--out", str(tmp_path / "sim")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli.app, [*base, "--set", "engine=torchrun", "--out", str(tmp_path / "proc")])
    assert res.exit_code != 0 and "trace_bandwidth=True is invalid" in str(res.output or res.exception)
    assert not (tmp_path / "proc").exists() or not any((tmp_path / "proc").iterdir())
