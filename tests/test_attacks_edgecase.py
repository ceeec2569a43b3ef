"""The edge-case backdoor: the tail of one class, mislabelled; success measured on the test set's tail."""

from __future__ import annotations

import pytest
import torch

from _backdoor_cfg import FED
from phalanx import attacks, data
from phalanx.attacks import EdgeCase
from phalanx.errors import ConfigError, InputError
from phalanx.experiments import make_config, train
from phalanx.experiments.build import check_points


def test_prepare_picks_the_farthest_samples_of_the_source_class() -> None:
    x = torch.tensor([[0.0], [1.0], [9.0], [-8.0], [5.0], [0.5]])
    y = torch.tensor([1, 1, 1, 1, 0, 1])
    ec = EdgeCase(source=1, target=0, tail=0.4, poison_fraction=1.0)
    ec.prepare(x, y, 2)  # class 1: mean 0.5, distances 0.5, 0.5, 8.5, 8.5, 0 → the two far ones
    assert ec.pool is not None and sorted(ec.pool.flatten().tolist()) == [-8.0, 9.0]
    assert ec.edge_cases(x, y).tolist() == [False, False, True, True, False, False]
    xb, yb = torch.zeros(4, 1), torch.full((4,), 1)
    x2, y2 = ec.transform(xb, yb, 2, torch.Generator().manual_seed(0))
    assert set(x2.flatten().tolist()) <= {-8.0, 9.0} and bool((y2 == 0).all())
    assert torch.equal(xb, torch.zeros(4, 1))  # the input is not modified
    fooled = ec.metrics(lambda xs: torch.zeros(xs.shape[0], dtype=torch.long), x, y)
    assert fooled == {"attack_success": 1.0}
    assert ec.metrics(lambda xs: torch.ones(xs.shape[0], dtype=torch.long), x, y) == {"attack_success": 0.0}


def test_the_digits_tail_is_rare_and_a_run_logs_its_success() -> None:
    ds = data.load("digits")
    ec = EdgeCase(source=7, target=1, tail=0.25)
    ec.prepare(ds.train_x, ds.train_y, ds.num_classes)
    assert ec.pool is not None and ec.pool.shape[0] == round(0.25 * int((ds.train_y == 7).sum()))
    assert 0 < int(ec.edge_cases(ds.test_x, ds.test_y).sum()) < int((ds.test_y == 7).sum())
    rows = train(make_config({**FED, "attack": "edgecase", "attack_params": {"tail": 0.25}, "rounds": 4}))
    assert all(0.0 <= r["attack_success"] <= 1.0 for r in rows)


def test_bad_parameters() -> None:
    with pytest.raises(ConfigError, match="target"):
        attacks.make("edgecase", source=3, target=3)
    for tail in (0.0, 1.5):
        with pytest.raises(ConfigError, match="tail"):
            attacks.make("edgecase", tail=tail)
    with pytest.raises(ConfigError, match=r"source=12 is invalid: allowed a class in \[0, 9\]"):
        check_points([make_config({**FED, "attack": "edgecase", "attack_params": {"source": 12}})])
    with pytest.raises(InputError, match="prepare"):
        EdgeCase().transform(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 10)
