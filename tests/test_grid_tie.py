"""Grid axes that vary together (`[tie]`): the i-th values go into one point; errors for bad tables."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.errors import ConfigError
from phalanx.experiments import grid

BASE: dict[str, Any] = {"algorithm": "fedavg", "dataset": "digits", "model": "mlp", "workers": 10,
                        "clients_per_round": 5, "f": 1}


def test_tied_keys_are_one_axis_crossed_with_the_others() -> None:
    cfgs = grid.configs({**BASE, "aggregator": ["mean", "cwtm"], "tie": {"local_steps": [1, 5, 20],
                                                                         "rounds": [400, 80, 20]}})
    assert [(c.local_steps, c.rounds, c.aggregator) for c in cfgs] == [
        (1, 400, "mean"), (1, 400, "cwtm"), (5, 80, "mean"), (5, 80, "cwtm"), (20, 20, "mean"), (20, 20, "cwtm")]
    assert len({grid.run_id(c) for c in cfgs}) == 6


@pytest.mark.parametrize(("tie", "match"), [
    ({"local_steps": [1, 5], "rounds": [10]}, "one length"),
    ({"local_steps": []}, "non-empty"),
    ({"local_steps": 3}, "non-empty lists"),
    ("rounds", "a table"),
    ({"rounds": [1, 2], "nonsense": [1, 2]}, "nonsense"),
])
def test_bad_tie_tables(tie: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        grid.configs({**BASE, "tie": tie})


def test_a_tied_key_set_outside_the_table_is_refused() -> None:
    with pytest.raises(ConfigError, match="not also set outside"):
        grid.configs({**BASE, "rounds": 5, "tie": {"rounds": [1, 2]}})
