"""The round-algorithm seam: a round algorithm of a user's own — a subclass of ``RoundAlgorithm`` in the user's
module, nothing registered, nothing edited elsewhere — trains through the experiment, the loop and its callbacks;
what the built-ins declare replaces the name checks the experiment and the loop used to make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests._interrupt import train_interrupted
from torch import Tensor

from phalanx import aggregators, data, models
from phalanx.errors import ConfigError, WorkersLostError
from phalanx.experiments import from_config, make_config, store, train
from phalanx.training import Experiment, Loop, run
from phalanx.training.algorithms.base import RoundAlgorithm
from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.algorithms.fedavg import FedAvg
from phalanx.training.algorithms.gossip import AnytimeGossip, Gossip
from phalanx.training.state import Received, RoundAborted, RoundState


class FullBatch:
    """Every worker sends the gradient of its whole shard (no sampling): full-batch distributed gradient descent."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def round(self, theta: Tensor, t: int, rule: Any) -> Received:
        run = self.run
        rows = [run.problem.grads(theta, run.data.x[s][None], run.data.y[s][None])[0] for s in run.data.shards]
        return Received(torch.stack(rows))

    def streams(self) -> dict[str, Tensor]:
        return {}


class FullBatchGD(RoundAlgorithm):
    """A user's own algorithm: declares what it is, provides its in-process worker side."""

    name = "full-batch-gd"
    missing_word = "machines"

    def per_round(self, workers: int) -> int:
        return workers

    def all_workers(self, run: Any, streams: dict[str, Tensor], carried: Tensor | None) -> FullBatch:
        return FullBatch(run)

    def one_worker(self, run: Any, rank: int, streams: dict[str, Tensor], carried: Tensor | None) -> Any:
        raise NotImplementedError("in-process only")


class PolyakGD(FullBatchGD):
    """A user's algorithm with state of its own: full-batch GD whose reported model is the running average of the
    iterates (Polyak–Ruppert), x̄ₜ₊₁ = x̄ₜ + (θₜ₊₁ − x̄ₜ)/(t + 2), kept as ``own["average"]``."""

    name = "polyak-gd"

    def initial_state(self, run: Any, theta: Tensor) -> dict[str, Tensor]:
        return {"average": theta.clone()}

    def next_state(self, run: Any, state: RoundState, got: Received) -> dict[str, Tensor]:
        average = state.own["average"]
        return {"average": average + (state.theta - average) / (state.round + 1)}

    def evaluate(self, run: Any, state: RoundState) -> dict[str, Any]:
        acc, loss = run.problem.evaluate(state.own["average"], run.test_x, run.test_y)
        return {"test_accuracy": acc, "test_loss": loss, "last_iterate_accuracy":
                run.problem.evaluate(state.theta, run.test_x, run.test_y)[0]}


def experiment(algorithm: RoundAlgorithm, **kw: Any) -> Experiment:
    ds = data.load("digits")
    torch.manual_seed(0)
    return Experiment(model=models.make("mlp", ds.input_shape, ds.num_classes), dataset=ds, workers=4,
                      rule=aggregators.make("cwtm", f=1), algorithm=algorithm, rounds=6, eval_every=3, **kw)


def test_a_users_own_round_algorithm_trains_through_the_loop() -> None:
    rows = run(experiment(FullBatchGD(), lr=0.5))
    assert [r["round"] for r in rows] == [0, 3, 6]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]  # it learns
    # full-batch rounds draw nothing: the same run twice gives the same bits
    again = run(experiment(FullBatchGD(), lr=0.5))
    assert [r["test_loss"] for r in rows] == [r["test_loss"] for r in again]


def test_its_own_state_is_carried_evaluated_checkpointed_and_resumed(tmp_path: Path) -> None:
    """The algorithm's own state (here the averaged iterate) is checkpointed under ``algorithm.<name>`` by a writer
    that knows nothing about it, its own evaluation makes the metric rows, and an interrupted run resumes to the same
    bits — through the config, the run directory and the loop of ``phalanx run``."""
    cfg = make_config({"dataset": "digits", "model": "mlp", "workers": 4, "aggregator": "cwtm", "f": 1,
                       "algorithm": "tests.test_algorithm_seam:PolyakGD", "rounds": 6, "eval_every": 3,
                       "checkpoint_every": 3, "lr": 0.5, "seed": 1})
    rows = train(cfg, tmp_path / "full")
    assert {"test_accuracy", "last_iterate_accuracy"} <= set(rows[-1])
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.2  # the average of learning iterates learns
    ckpt = load_file(str(tmp_path / "full" / "checkpoint.safetensors"))
    assert ckpt["algorithm.average"].shape == ckpt["theta"].shape
    assert not torch.equal(ckpt["algorithm.average"], ckpt["theta"])
    exp = from_config(cfg)
    assert rows[-1]["test_accuracy"] == exp.problem.evaluate(ckpt["algorithm.average"], exp.test_x, exp.test_y)[0]
    part = train_interrupted(cfg, tmp_path / "part", 3)
    train(cfg, part)
    again = load_file(str(part / "checkpoint.safetensors"))
    assert set(again) == set(ckpt) and all(torch.equal(ckpt[k], again[k]) for k in ckpt)
    assert store.read_rows(part) == store.read_rows(tmp_path / "full")


def test_its_declared_missing_word_names_the_lost_participants() -> None:
    class Dropping(FullBatch):
        def round(self, theta: Tensor, t: int, rule: Any) -> Received:
            raise RoundAborted([1, 2], "two machines went away")

    class DroppingGD(FullBatchGD):
        def all_workers(self, run: Any, streams: dict[str, Tensor], carried: Tensor | None) -> Dropping:
            return Dropping(run)

    with pytest.raises(WorkersLostError, match="machines"):
        Loop(experiment(DroppingGD())).run()


def test_its_own_check_refuses_a_run_before_it_trains() -> None:
    class Picky(FullBatchGD):
        def check(self, run: Any) -> None:
            if run.workers < 5:
                raise ConfigError("workers", run.workers, ">= 5 for this algorithm")

    with pytest.raises(ConfigError, match="workers=4"):
        experiment(Picky())


def test_an_object_that_is_not_a_round_algorithm_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match="algorithm="):
        experiment(object())  # type: ignore[arg-type]


@pytest.mark.parametrize(("algo", "declared"), [
    (DSGD(), {"missing_word": "ranks", "runs_on_device": True, "pools_norm_stats": False, "decentralized": False}),
    (FedAvg(), {"missing_word": "clients", "runs_on_device": True, "pools_norm_stats": True,
                "keeps_local_norms": True}),
    (None, {"missing_word": "neighbours", "decentralized": True, "runs_on_device": False}),
])
def test_the_built_ins_declare_what_the_loop_used_to_find_out_by_name(algo: Any, declared: dict[str, Any]) -> None:
    if algo is None:
        from phalanx.decentralized import topology

        algo = Gossip(graph=topology.make("ring", 6))
        assert AnytimeGossip(graph=topology.make("ring", 6)).decentralized
    for key, value in declared.items():
        assert getattr(algo, key) == value, key


def test_no_module_outside_the_algorithms_compares_an_algorithm_name() -> None:
    """The loop, the experiment and the callbacks read declared attributes; none compares ``algorithm.name``."""
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "src" / "phalanx" / "training"
    for name in ("loop.py", "experiment.py", "transport.py", "server.py"):
        text = (src / name).read_text()
        assert "algorithm.name ==" not in text and 'getattr(experiment.algorithm' not in text, name
        assert "isinstance(self.algorithm" not in text, name
