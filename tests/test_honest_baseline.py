"""``attack = "honest"`` is the all-honest baseline at the same n: the would-be Byzantine workers compute real
gradients on their own data, so the run is the ``byzantine = 0`` run bit for bit — unlike ``none``, whose Byzantine
workers replay copies of honest rows."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phalanx import attacks
from phalanx.experiments import from_config, make_config
from phalanx.training import run

JOB = {"rounds": 6, "eval_every": 3, "workers": 8, "f": 2, "aggregator": "cwtm", "seed": 4}


def final_theta(cfg: dict[str, Any]) -> torch.Tensor:
    exp = from_config(make_config({**JOB, **cfg}))
    thetas: list[torch.Tensor] = []
    from phalanx.training.loop import Callback, Loop

    class Last(Callback):
        def on_finish(self, loop: Loop) -> None:
            thetas.append(loop.state.theta.clone())

    run(exp, callbacks=[Last()])
    return thetas[0]


@pytest.mark.parametrize("algorithm", [{}, {"algorithm": "fedavg", "clients_per_round": 6}])
def test_the_honest_baseline_is_the_run_without_byzantine_workers(algorithm: dict[str, Any]) -> None:
    honest = final_theta({"attack": "honest", "byzantine": 2, **algorithm})
    nobody = final_theta({"attack": "none", "byzantine": 0, **algorithm})
    replay = final_theta({"attack": "none", "byzantine": 2, **algorithm})
    assert torch.equal(honest, nobody)
    assert not torch.equal(replay, nobody)  # duplicated rows are another run


def test_it_changes_nothing_of_the_batch() -> None:
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    x2, y2 = attacks.make("honest").transform(x, y, num_classes=3)
    assert torch.equal(x2, x) and torch.equal(y2, y)
