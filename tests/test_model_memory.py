"""A model too large for the machine is refused before it is built: its parameters are counted on the ``meta``
device (nothing allocated), times the rows the run's workers hold each round."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx import data, models
from phalanx.errors import ConfigError
from phalanx.experiments import build, from_config, make_config


@pytest.mark.parametrize(("name", "params"), [("mlp", {"hidden": [32, 16]}), ("logreg", {}), ("cnn", {}),
                                              ("resnet20", {}), ("cnn", {"norm": "group"})])
def test_the_planned_count_is_the_built_models(name: str, params: dict[str, Any]) -> None:
    shape = (1, 8, 8) if name != "resnet20" else (3, 8, 8)
    planned = models.planned_parameters(name, shape, 10, **params)
    assert planned == models.count_parameters(models.make(name, shape, 10, **params), trainable_only=False)


def test_a_builder_of_ones_own_is_not_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx.models import registry

    def own(input_shape: tuple[int, ...], num_classes: int) -> Any:
        return models.make("logreg", input_shape, num_classes)

    monkeypatch.setitem(registry._REGISTRY._entries, "own-planned-test", own)  # registered for this test only
    assert models.planned_parameters("own-planned-test", (1, 8, 8), 10) is None


def test_a_model_too_large_is_refused_before_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "available_memory", lambda: 10**9)  # a machine with 1 GB left

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was built")

    monkeypatch.setattr(models, "make", never)
    cfg = make_config({"model_params": {"hidden": [100_000]}, "workers": 20})  # 7.5 M parameters × 21 rows × 32 bytes
    with pytest.raises(ConfigError, match=r"model_params=\{'hidden': \[100000\]\} is invalid: allowed a model that "
                                          r"fits with 20 workers: 'mlp' with these parameters has 7,500,010 "
                                          r"parameters") as info:
        from_config(cfg, data.load("digits"))
    assert "\n" not in str(info.value) and "1.0 GB are available" in str(info.value)


def test_a_model_that_fits_is_built_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "available_memory", lambda: 10**9)
    exp = from_config(make_config({"workers": 20}), data.load("digits"))
    assert exp.problem.dim == 4810
