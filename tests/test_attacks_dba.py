"""DBA: each attacker stamps its own bar of the global trigger; success is measured with the whole trigger."""

from __future__ import annotations

import pytest
import torch

from _backdoor_cfg import FED
from phalanx import attacks
from phalanx.attacks import DBA
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train
from phalanx.experiments.build import check_points
from phalanx.training.algorithms.dsgd import poison_rows


def test_the_local_patterns_are_disjoint_and_make_up_the_global_trigger() -> None:
    dba = DBA(parts=4, size=3, gap=1, value=9.0)
    parts = [dba.part((1, 8, 8), k) for k in range(4)]
    assert all(int(p.sum()) == 3 for p in parts)
    assert int(torch.stack(parts).sum(0).max()) == 1  # disjoint
    assert torch.equal(torch.stack(parts).any(0), dba.pattern((1, 8, 8)))
    assert parts[0][0, 0, :3].all() and parts[1][0, 0, 4:7].all() and parts[2][0, 2, :3].all()
    x = torch.zeros(2, 1, 8, 8)
    assert torch.equal(dba.trigger(x)[0] == 9.0, dba.pattern((1, 8, 8)))
    flat = DBA(parts=3, size=2, gap=1).pattern((10,))
    assert flat.tolist() == [True, True, False, True, True, False, True, True, False, False]


def test_each_attacker_trains_with_its_own_part() -> None:
    dba = DBA(parts=4, size=2, gap=1, value=9.0, poison_fraction=1.0, target=5)
    xb, yb = torch.zeros(6, 4, 1, 8, 8), torch.zeros(6, 4, dtype=torch.long)
    px, py = poison_rows(dba, xb, yb, 1, 10, torch.Generator().manual_seed(0), attackers=[0, 1, 2, 3, 4])
    assert torch.equal(px[0], xb[0]) and torch.equal(py[0], yb[0])  # the honest row as it was
    for row, attacker in zip(range(1, 6), range(5), strict=True):
        stamped = px[row] == 9.0
        assert torch.equal(stamped.all(0), dba.part((1, 8, 8), attacker % 4))  # attacker 4 reuses part 0
        assert bool((py[row] == 5).all())


def test_bad_parameters_and_a_pattern_larger_than_the_image() -> None:
    with pytest.raises(ConfigError, match="parts"):
        attacks.make("dba", parts=1)
    with pytest.raises(ConfigError, match="gap"):
        attacks.make("dba", gap=-1)
    with pytest.raises(ConfigError, match=r"size=5 is invalid: .*larger than the image"):
        check_points([make_config({**FED, "attack": "dba", "attack_params": {"size": 5}})])  # 5 + 1 + 5 > 8


def test_a_federated_run_logs_the_global_triggers_success() -> None:
    rows = train(make_config({**FED, "attack": "dba", "rounds": 4}))
    assert all(0.0 <= r["attack_success"] <= 1.0 for r in rows)
