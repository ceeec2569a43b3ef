"""server_optimizer = "clipped-sgd": SGD on the aggregate clipped to norm G (phalanx.training.optim.ClippedSGD), the
control beside robust-online in the corrupted-rounds study — its step by hand, what a Byzantine aggregate can make
it do, its config and a resume."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train
from phalanx.training.optim import SGD, ClippedSGD, make


def test_step_is_sgd_along_the_clipped_aggregate() -> None:
    opt, theta = make("clipped-sgd", clip=0.5), torch.tensor([1.0, 2.0, 3.0])
    long = torch.tensor([3.0, 4.0, 0.0])  # norm 5: clipped to 0.5 → (0.3, 0.4, 0)
    assert torch.allclose(opt.step(theta, long, 2.0), theta - 2.0 * torch.tensor([0.3, 0.4, 0.0]))
    short = torch.tensor([0.1, 0.0, -0.2])  # inside the ball: unchanged
    assert torch.equal(opt.step(theta, short, 2.0), SGD().step(theta, short, 2.0))
    assert opt.params() == {"clip": 0.5, "momentum": 0.0, "weight_decay": 0.0, "nesterov": False}


def test_with_momentum_the_buffer_holds_clipped_aggregates_and_round_trips() -> None:
    a, b = ClippedSGD(clip=1.0, momentum=0.9), SGD(momentum=0.9)
    theta = torch.zeros(2)
    gs = [torch.tensor([10.0, 0.0]), torch.tensor([0.0, 0.5]), torch.tensor([-6.0, 8.0])]
    ta, tb = theta, theta
    for g in gs:
        ta = a.step(ta, g, 0.1)
        tb = b.step(tb, g * min(1.0, 1.0 / float(g.norm())), 0.1)
    assert torch.allclose(ta, tb)
    again = ClippedSGD(clip=1.0, momentum=0.9)
    again.load_state_dict(a.state_dict())
    assert torch.equal(again.step(ta, gs[0], 0.1), a.step(ta, gs[0], 0.1))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_aggregate_is_skipped(bad: float) -> None:
    """A Byzantine majority can make the mean NaN or infinite: the round steps as if the aggregate were 0."""
    opt, theta = ClippedSGD(clip=0.3), torch.tensor([1.0, -1.0])
    assert torch.equal(opt.step(theta, torch.tensor([bad, 1.0]), 0.5), theta)


def test_a_huge_finite_aggregate_moves_theta_by_at_most_lr_times_clip() -> None:
    """Entries near the float32 maximum overflow a float32 norm; the float64 norm does not, so the step is a clipped
    step, not a NaN."""
    opt, theta = ClippedSGD(clip=0.3), torch.zeros(1000)
    big = torch.full((1000,), 3.0e38)
    new = opt.step(theta, big, 2.0)
    assert torch.isfinite(new).all()
    assert float(torch.linalg.vector_norm(new - theta, dtype=torch.float64)) <= 2.0 * 0.3 * (1 + 1e-6)


@pytest.mark.parametrize(("params", "match"), [
    ({"clip": 0.0}, "clip=0.0 is invalid"), ({"clip": -1.0}, "clip=-1.0 is invalid"),
    ({"clip": math.inf}, "clip=inf is invalid"), ({"clip": "auto"}, "clip='auto' is invalid"),
    ({"clip": 1.0, "momentum": 1.0}, "momentum=1.0 is invalid"),
])
def test_bad_parameters_are_one_line_config_errors(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        make("clipped-sgd", **params)
    assert "\n" not in str(err.value)


RUN: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 7, "byzantine": 1, "f": 0,
    "aggregator": "mean", "attack": "signflip", "attack_params": {"scale": 100.0}, "rounds": 12, "batch_size": 8,
    "lr": 0.3, "momentum": 0.0, "eval_every": 4, "checkpoint_every": 4, "seed": 3,
    "server_optimizer": "clipped-sgd", "server_optimizer_params": {"clip": 0.3, "momentum": 0.5},
}


def test_trains_from_a_config_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    rows = train(make_config(RUN), tmp_path / "full")
    assert all(math.isfinite(r["test_loss"]) for r in rows if "test_loss" in r)
    part = train_interrupted(make_config(RUN), tmp_path / "part", 8)
    train(make_config(RUN), part)
    a, b = load_file(str(tmp_path / "full" / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert "optim.momentum_buffer" in a and set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ConfigError, match="server_momentum"):
        make_config({**RUN, "server_momentum": 0.9})  # its momentum goes in server_optimizer_params
