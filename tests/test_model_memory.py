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


def test_a_batch_size_whose_batches_cannot_fit_is_refused_naming_it_before_a_batch_is_drawn(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """review: t_hostile.sh — ``batch_size = 10¹²`` passed validation and failed at the first round inside the
    allocator ("you tried to allocate 32000000000000 bytes"), naming no key. Each of the round's honest workers draws
    ``batch_size`` samples at once, each at least its float32 input (digits: 64 values) and 32 bytes of draw, label
    and index: with 1 GB left and 20 honest workers on the CPU, 800 MB / (20 × 288) = 138,888 samples fit, one more does
    not."""
    from phalanx.experiments.runner import run_grid
    from phalanx.training import shards

    monkeypatch.setattr(build, "available_memory", lambda: 10**9)

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a batch was drawn")

    monkeypatch.setattr(shards, "sample_batches", never)
    for batch in (10**12, 138_889):
        with pytest.raises(ConfigError) as info:
            run_grid([make_config({"workers": 20, "batch_size": batch, "rounds": 2, "device": "cpu"})],
                     tmp_path / str(batch))
        text = str(info.value)
        assert "\n" not in text and text.startswith(f"batch_size={batch} is invalid: allowed 1..138,888: ") \
            and "20 honest worker(s)" in text and "1.0 GB are available" in text, text
        with pytest.raises(ConfigError, match=r"^batch_size="):
            from_config(make_config({"workers": 20, "batch_size": batch, "device": "cpu"}), data.load("digits"))
    import torch

    digits = data.load("digits")
    build.check_batch_memory(build.read(make_config({"workers": 20, "batch_size": 138_888})), digits,
                             torch.device("cpu"))  # the largest that fits
    # on a GPU the inputs are gathered there: only the draws (24 bytes a sample) count in this process's memory
    build.check_batch_memory(build.read(make_config({"workers": 20, "batch_size": 1_666_666})), digits,
                             torch.device("cuda"))
    with pytest.raises(ConfigError, match=r"^batch_size=1666667 is invalid: allowed 1\.\.1,666,666: "):
        build.check_batch_memory(build.read(make_config({"workers": 20, "batch_size": 1_666_667})), digits,
                                 torch.device("cuda"))
