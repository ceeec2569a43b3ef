"""The stage that records LoRA's truncation residual (``lora_residual``, :mod:`phalanx.training.stages.lora`):
brought by fedavg for mode 'update' only, its column on every row, its check, its state."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from phalanx import aggregators
from phalanx.aggregators.lora import AdapterUpdates, LoraLayout
from phalanx.errors import ConfigError
from phalanx.training.stages.lora import LoraResidual

TINY = "hf:phalanx-bert-tiny"


def _cfg(mode: str) -> dict[str, object]:
    return {
        "dataset": "sent140-sample", "dataset_params": {"tokenizer": TINY, "length": 16}, "partition": "natural",
        "model": TINY, "model_params": {"r": 2, "aggregation": mode}, "algorithm": "fedavg", "workers": 6,
        "local_steps": 1, "batch_size": 4, "lr": 0.1, "byzantine": 1, "f": 1, "aggregator": "cwtm",
        "attack": "signflip", "rounds": 2, "eval_every": 1, "seed": 0,
    }


def test_update_mode_rows_carry_the_residual_and_other_modes_do_not(tmp_path: Path) -> None:
    from phalanx.experiments import from_config, make_config, train

    rows = train(make_config(_cfg("update")), tmp_path / "update")
    assert rows[0]["lora_residual"] is None  # before the first round
    later = [row["lora_residual"] for row in rows[1:]]
    assert later and all(isinstance(v, float) and 0.0 <= v <= 1.0 and math.isfinite(v) for v in later)
    assert later[0] > 0.0  # cwtm's ΔW* of 6 clients' rank-2 updates does not fit in rank 2: the truncation is real
    exp = from_config(make_config(_cfg("update")))
    assert [s.name for s in exp.stages] == ["lora_residual"] and exp.stages[0].rule is exp.rule  # type: ignore[attr-defined]
    assert "lora_residual" not in train(make_config(_cfg("shared")), tmp_path / "shared")[-1]


def _rule() -> AdapterUpdates:
    layout = LoraLayout.of(["l.lora_A.d.weight", "l.lora_B.d.weight"], [(2, 5), (6, 2)])
    return AdapterUpdates(aggregators.make("mean", f=0), layout)


def test_its_check_refuses_a_rule_it_does_not_read_and_a_config_cannot_name_it() -> None:
    from types import SimpleNamespace

    rule = _rule()
    LoraResidual(rule).check(SimpleNamespace(rule=rule))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"stages\.lora_residual"):  # mutant: a plain rule has no residual to read
        LoraResidual(rule).check(SimpleNamespace(rule=aggregators.make("mean", f=0)))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"stages\.lora_residual"):  # another AdapterUpdates than the run's
        LoraResidual(rule).check(SimpleNamespace(rule=_rule()))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fedavg brings it"):
        LoraResidual.configure({}, None)  # type: ignore[arg-type]


def test_its_state_round_trips_and_a_bad_one_is_refused() -> None:
    stage = LoraResidual(_rule())
    assert stage.state_dict() == {}
    stage.last = 0.25
    again = LoraResidual(_rule())
    again.load_state_dict(stage.state_dict())
    assert again.last == 0.25
    again.load_state_dict({})
    assert again.last is None
    for bad in ({"last": torch.tensor([float("nan")], dtype=torch.float64)}, {"last": torch.zeros(2)},
                {"last": torch.zeros(1), "other": torch.zeros(1)}):
        with pytest.raises(ConfigError, match=r"stage\.lora_residual"):
            again.load_state_dict(bad)


def test_an_update_mode_run_resumes_bit_for_bit_with_its_residual(tmp_path: Path) -> None:
    """The residual is in the checkpoint (stage.lora_residual.last) and the resumed rows equal the uninterrupted
    ones (the re-factorised adapters, the SVD included, are deterministic on one machine)."""
    from safetensors.torch import load_file

    from _interrupt import train_interrupted
    from phalanx.experiments import make_config, store, train

    cfg = {**_cfg("update"), "rounds": 3, "eval_every": 1, "checkpoint_every": 1}
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 2)
    assert load_file(str(part / "checkpoint.safetensors"))["stage.lora_residual.last"].shape == (1,)
    train(make_config(cfg), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert store.read_rows(full) == store.read_rows(part)
