"""stop_round: the attackers poison rounds 0 … s−1, then behave honestly; rows say how long ago they stopped."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from _backdoor_cfg import FED
from phalanx import attacks
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train
from phalanx.training.algorithms.dsgd import worker_batches
from phalanx.training.shards import WorkerData

DSGD: dict[str, Any] = {k: v for k, v in FED.items() if k not in ("algorithm", "clients_per_round", "local_steps")}


def test_after_the_stop_round_the_batches_are_clean() -> None:
    x, y = torch.randn(40, 1, 4, 4), torch.arange(40) % 4
    shards = [torch.arange(i * 10, (i + 1) * 10) for i in range(4)]
    wd = WorkerData(x, y, shards, 4)
    attack = attacks.make("backdoor", stop_round=3)

    def batches(t: int, a: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return worker_batches(wd, a, workers=4, byzantine=2, batch_size=5, batch_gen=torch.Generator().manual_seed(0),
                              attack_gen=torch.Generator().manual_seed(1), round=t)

    plain = worker_batches(wd, attacks.make("labelflip"), workers=4, byzantine=0, batch_size=5,
                           batch_gen=torch.Generator().manual_seed(0), attack_gen=torch.Generator().manual_seed(1))
    before, after = batches(2, attack), batches(3, attack)
    assert not torch.equal(before[0], plain[0])  # round 2: the Byzantine workers' batches carry the trigger
    assert torch.equal(after[0], plain[0]) and torch.equal(after[1], plain[1])  # round 3: clean


@pytest.mark.parametrize("base", [FED, DSGD], ids=["fedavg", "dsgd"])
def test_rows_carry_the_rounds_since_the_attack_stopped(base: dict[str, Any]) -> None:
    rows = train(make_config({**base, "attack": "backdoor", "attack_params": {"stop_round": 4}, "rounds": 8}))
    assert [(r["round"], r["rounds_since_stop"]) for r in rows] == [(0, None), (2, None), (4, 0), (6, 2), (8, 4)]
    plain = train(make_config({**base, "attack": "backdoor", "rounds": 2}))
    assert "rounds_since_stop" not in plain[-1]


def test_bad_stop_rounds_and_algorithms_that_would_not_stop() -> None:
    for stop in (0, -1, 1.5):
        with pytest.raises(ConfigError, match="stop_round"):
            attacks.make("dba", stop_round=stop)
    with pytest.raises(ConfigError, match=r"stop_round=3 is invalid: allowed None with algorithm 'gossip'"):
        make_config({**DSGD, "algorithm": "gossip", "graph": "complete", "momentum": 0.0, "f": 1, "byzantine": 1,
                     "attack": "backdoor", "attack_params": {"stop_round": 3}})
