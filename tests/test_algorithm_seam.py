"""The round-algorithm seam: a round algorithm of a user's own — a subclass of ``RoundAlgorithm`` in the user's
module, nothing registered, nothing edited elsewhere — trains through the experiment, the loop and its callbacks;
what the built-ins declare replaces the name checks the experiment and the loop used to make."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from phalanx import aggregators, data, models
from phalanx.errors import ConfigError, WorkersLostError
from phalanx.training import Experiment, Loop, run
from phalanx.training.algorithm import RoundAlgorithm
from phalanx.training.dsgd import DSGD
from phalanx.training.fedavg import FedAvg
from phalanx.training.gossip import AnytimeGossip, Gossip
from phalanx.training.state import Received, RoundAborted


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
