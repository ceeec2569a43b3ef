"""``scripts/seam_counts.py``, the counter of issue 39's figures: a function called with the validated-run value
(which wraps the config) counts as a stop, so the value cannot hide the config's path from the count."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from phalanx.experiments import validrun
from phalanx.experiments.config import validate
from phalanx.experiments.schema import RunConfig

SMALL = {"dataset": "digits", "model": "mlp", "workers": 6, "byzantine": 1, "f": 1, "aggregator": "cwtm",
         "attack": "none", "rounds": 1, "eval_every": 1, "seed": 0}


def _counter() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "scripts" / "seam_counts.py"
    spec = importlib.util.spec_from_file_location("seam_counts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["seam_counts"] = module
    spec.loader.exec_module(module)
    return module


def test_a_function_called_with_the_validated_run_alone_is_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _counter()
    run = validate(SMALL)
    names = [name for name, _ in counter.trace(lambda out: validrun.components(run))]
    assert names == ["phalanx.experiments.validrun.components"]
    # the mutant counter that counts the RunConfig alone does not see it: the check above is what catches it
    monkeypatch.setattr(counter, "carries_config", lambda value: isinstance(value, RunConfig))
    assert counter.trace(lambda out: validrun.components(validate(SMALL))) != []  # validation takes the config
    assert "phalanx.experiments.validrun.components" not in [
        name for name, _ in counter.trace(lambda out: validrun.components(run))]


def test_climbs_are_stops_no_deeper_than_the_one_before() -> None:
    counter = _counter()
    assert counter.climbs_of([("a", 3), ("b", 4), ("c", 4), ("d", 2), ("e", 5)]) == 2
