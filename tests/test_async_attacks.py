"""Attacks played by the worker processes of the asynchronous server (docs/async.md "On real processes"): a
Byzantine worker rank applies a registry vector attack to what it sends, configured by the run's ``attack`` and
``byzantine`` keys. It knows θ of its version and its own update, nothing else, so only an attack one worker can
run alone is allowed; the others are refused in one line before anything runs. One seed: a smoke test of the
wiring and of the rule's effect, not a verdict on the rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.test_async_processes import ASYNC, last_row, launched

from phalanx.errors import ConfigError
from phalanx.experiments.config import make_config

ATTACKED: dict[str, Any] = {
    **ASYNC, "workers": 6, "byzantine": 1, "f": 1, "attack": "signflip", "attack_params": {"scale": 20.0},
    "algorithm_params": {"buffer_size": 3, "max_staleness": 3}, "rounds": 30, "eval_every": 10,
}


@pytest.mark.parametrize("attack", ["alie", "minmax"])
def test_an_attack_one_worker_cannot_play_alone_is_refused_in_one_line(attack: str) -> None:
    """ALIE and min-max need the honest spread (several rows): refused, naming the attack, before any process starts
    (a data attack, played on the worker's own batches, is accepted: tests/test_async_process_filters.py)."""
    with pytest.raises(ConfigError) as err:
        make_config({**ATTACKED, "attack": attack, "attack_params": {}, "engine": "torchrun"})
    assert "attack" in str(err.value) and attack in str(err.value) and "\n" not in str(err.value)


def test_a_solo_attack_is_accepted_on_real_processes() -> None:
    cfg = make_config({**ATTACKED, "engine": "torchrun"})
    assert cfg.attack == "signflip" and cfg.byzantine == 1
    cfg = make_config({**ATTACKED, "attack": "labelflip", "attack_params": {}, "engine": "torchrun"})
    assert cfg.attack == "labelflip"


def test_a_byzantine_worker_process_flipping_its_update_beats_the_mean_not_the_median(tmp_path: Path) -> None:
    """Ranks 1–5, rank 5 Byzantine sending −20·g (sign flip, scale 20, on its own gradient g); K = 3, at most one
    update per worker in a step, so at most one Byzantine row of three. The coordinate-wise median (f = 1) learns;
    the mean, under the same attack, does not: its Byzantine rows were aggregated (``byzantine_updates`` > 0) and
    its accuracy stays far below the median's. One seed (a smoke test)."""
    rows = {}
    for rule in ("cwmed", "mean"):
        data = {**ATTACKED, "aggregator": rule}
        (tmp_path / rule).mkdir()
        code, errs = launched(data, tmp_path / rule, {})
        assert code == 0, errs[-3000:]
        rows[rule] = last_row(tmp_path / rule / "out")
    med, mean = rows["cwmed"], rows["mean"]
    assert med["round"] == mean["round"] == 30
    assert med["byzantine_updates"] > 0 and mean["byzantine_updates"] > 0
    assert med["test_accuracy"] > 0.7, med
    assert not mean["test_accuracy"] > med["test_accuracy"] - 0.3, (mean, med)
