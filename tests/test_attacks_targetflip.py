"""``targetflip``: Tolpegin et al.'s label flipping, one source class relabelled as one target class, the others
kept; its classes checked against the data set before the run."""

from __future__ import annotations

import pytest
import torch

from phalanx import attacks
from phalanx.errors import ConfigError
from phalanx.experiments.build import from_config
from phalanx.experiments.config import make_config

BASE = {"dataset": "digits", "model": "logreg", "workers": 5, "byzantine": 1, "f": 1, "aggregator": "cwtm",
        "attack": "targetflip", "rounds": 2}


def test_only_the_source_class_is_relabelled_and_only_as_the_target() -> None:
    y = torch.tensor([0, 5, 3, 5, 9, 5, 2])
    x = torch.randn(7, 4)
    x2, y2 = attacks.make("targetflip").transform(x, y, num_classes=10)
    assert x2 is x and torch.equal(y2, torch.tensor([0, 3, 3, 3, 9, 3, 2])) and torch.equal(y, torch.tensor(
        [0, 5, 3, 5, 9, 5, 2]))  # (the caller's labels untouched)
    _, y3 = attacks.make("targetflip", source=6, target=0).transform(x[:4], torch.tensor([6, 1, 6, 0]), num_classes=10)
    assert torch.equal(y3, torch.tensor([0, 1, 0, 0]))


def test_classes_outside_the_data_set_or_a_flip_onto_itself_are_refused_before_the_run() -> None:
    with pytest.raises(ConfigError, match=r"^attack_params\.source=12 is invalid: allowed a class of the data set: "
                                          r"0 … 9$"):
        from_config(make_config({**BASE, "attack_params": {"source": 12, "target": 3}}))
    with pytest.raises(ConfigError, match=r"^attack_params\.target=10 is invalid"):
        from_config(make_config({**BASE, "attack_params": {"source": 1, "target": 10}}))
    with pytest.raises(ConfigError, match="a class other than source = 5"):
        make_config({**BASE, "attack_params": {"source": 5, "target": 5}})
    with pytest.raises(ConfigError, match=r"target=-1 is invalid"):
        make_config({**BASE, "attack_params": {"target": -1}})


def test_a_run_under_it_trains_and_its_byzantine_workers_learn_the_flip() -> None:
    """Built from a config on the embedded digits: the attack is the data attack the engine poisons batches with."""
    exp = from_config(make_config({**BASE, "attack_params": {"source": 2, "target": 7}}))
    assert isinstance(exp.attack, attacks.TargetFlip) and (exp.attack.source, exp.attack.target) == (2, 7)
