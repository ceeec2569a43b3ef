"""BatchNorm and Hybrid BN with server-held statistics (phalanx.models.norm, phalanx.training.norm_stats): the layer's
math against torch's batch_norm, per-client gradients under vmap, the clients' statistics and their robust pool, a
federated run that measures and resumes them, and the configurations that are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx import aggregators, models
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train
from phalanx.models.norm import FedNorm2d, recording
from phalanx.training import DSGD, Experiment
from phalanx.training.norm_stats import NormStats
from phalanx.training.problem import Problem
from phalanx.training.stages.norm_stats import PoolStats


def _features(seed: int = 0, n: int = 6, c: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, 4, 5, generator=g) * 2.0 + torch.arange(c).view(1, c, 1, 1)


def _tol(x: torch.Tensor) -> dict[str, float]:
    eps = torch.finfo(x.dtype).eps
    return {"atol": 50 * eps * float(x.detach().abs().max()), "rtol": 50 * eps}


def test_batch_mode_is_batchnorm_in_training_and_uses_the_global_statistics_in_evaluation() -> None:
    x = _features()
    layer = FedNorm2d(3, "batch")
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        layer.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
        layer.global_mean.copy_(torch.tensor([0.5, 1.0, -1.0]))
        layer.global_var.copy_(torch.tensor([2.0, 0.5, 1.5]))
    want = F.batch_norm(x, None, None, layer.weight, layer.bias, training=True, eps=1e-5)
    torch.testing.assert_close(layer.train()(x), want, **_tol(want))
    want = F.batch_norm(x, layer.global_mean, layer.global_var, layer.weight, layer.bias, training=False, eps=1e-5)
    torch.testing.assert_close(layer.eval()(x), want, **_tol(want))


def test_hybrid_mode_mixes_batch_and_global_statistics_with_sigmoid_of_d() -> None:
    """μ = a μ_b + (1 − a) μ_g and σ² = a σ²_b + (1 − a) σ²_g with a = sigmoid(d) per channel; d = 0 at start."""
    x = _features(1)
    layer = FedNorm2d(3, "hybrid")
    assert layer.mix is not None and torch.equal(layer.mix, torch.zeros(3))
    with torch.no_grad():
        layer.mix.copy_(torch.tensor([-2.0, 0.0, 3.0]))
        layer.global_mean.copy_(torch.tensor([0.5, 1.0, -1.0]))
        layer.global_var.copy_(torch.tensor([2.0, 0.5, 1.5]))
    a = torch.sigmoid(layer.mix.detach())
    mu_b, var_b = x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3), unbiased=False)
    mu = a * mu_b + (1 - a) * layer.global_mean
    var = a * var_b + (1 - a) * layer.global_var
    want = (x - mu.view(1, 3, 1, 1)) / torch.sqrt(var.view(1, 3, 1, 1) + 1e-5)
    got = layer.train()(x)
    torch.testing.assert_close(got, want.detach(), **_tol(want))
    got.sum().backward()  # d is trained: it gets a gradient
    assert layer.mix.grad is not None and bool((layer.mix.grad != 0).any())
    torch.testing.assert_close(layer.eval()(x), F.batch_norm(x, layer.global_mean, layer.global_var, eps=1e-5))


@pytest.mark.parametrize("norm", ["batch", "hybrid"])
def test_per_client_gradients_under_vmap_equal_one_client_at_a_time(norm: str) -> None:
    model = models.make("cnn", (1, 8, 8), 4, generator=torch.Generator().manual_seed(0),
                        channels=[4, 8], hidden=16, norm=norm)
    problem = Problem(model)
    g = torch.Generator().manual_seed(1)
    xb, yb = torch.randn(3, 5, 1, 8, 8, generator=g), torch.randint(0, 4, (3, 5), generator=g)
    thetas = problem.initial_theta() + 0.05 * torch.randn(3, problem.dim, generator=g)
    together = problem.grads_each(thetas, xb, yb)
    alone = torch.cat([problem.grads_each(thetas[i : i + 1], xb[i : i + 1], yb[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(together, alone, **_tol(alone))


def test_measured_statistics_and_their_pool() -> None:
    """A client's row is (μ_b ‖ σ²_b + μ_b²) of each layer's input; with f = 0 the pool is the pooled mean and the
    pooled variance with the spread of the clients' means; with f = 1 a Byzantine row of huge values is trimmed."""
    model = models.make("cnn", (1, 8, 8), 4, generator=torch.Generator().manual_seed(0), channels=[4, 8], hidden=16,
                        norm="batch")
    problem = Problem(model)
    stats = NormStats.of(model)
    assert stats is not None and stats.channels == 12
    xb = torch.randn(3, 10, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    rows = stats.measure(problem.layout.views(problem.initial_theta()), problem.buffers, xb)
    assert rows.shape == (3, 24)
    conv = model.features[0]
    h = conv(xb[1])  # the first layer's input for client 1
    torch.testing.assert_close(rows[1, :4], h.mean(dim=(0, 2, 3)).detach(), **_tol(h))
    second = h.var(dim=(0, 2, 3), unbiased=False) + h.mean(dim=(0, 2, 3)).square()
    torch.testing.assert_close(rows[1, 12:16], second.detach(), **_tol(h))
    pooled = stats.pool(rows, 0)
    mu_k, var_k = rows[:, :12], rows[:, 12:] - rows[:, :12].square()
    mu = mu_k.mean(0)
    torch.testing.assert_close(pooled[:12], mu, **_tol(rows))
    torch.testing.assert_close(pooled[12:], (var_k + (mu_k - mu).square()).mean(0), **_tol(rows))
    evil = torch.cat([rows, torch.full((1, 24), 1e30)])
    robust = stats.pool(evil, 1)
    assert bool((robust[12:] < 10 * rows[:, 12:].max(0).values).all())
    assert not bool(torch.isfinite(stats.pool(evil, 0)).all()) or float(stats.pool(evil, 0).max()) > 1e20
    before = stats.vector()
    stats.blend(torch.full((24,), float("inf")), 0.5)  # a non-finite pool is not taken
    assert torch.equal(stats.vector(), before)
    stats.blend(pooled, 0.25)
    torch.testing.assert_close(stats.vector(), torch.lerp(before, pooled, 0.25))


def test_recording_is_off_outside_the_context() -> None:
    layer = FedNorm2d(3)
    layer(_features())
    assert layer.recorded is None
    with recording(layer) as layers:
        layer(_features())
        assert layers == [layer] and layer.recorded is not None
    assert not layer.record


FED_BN: dict[str, Any] = {
    "algorithm": "fedavg", "dataset": "digits", "model": "cnn",
    "model_params": {"channels": [4, 8], "hidden": 16, "norm": "hybrid"}, "workers": 12, "clients_per_round": 4,
    "local_steps": 2, "batch_size": 8, "lr": 0.05, "byzantine": 2, "f": 1, "aggregator": "cwtm",
    "attack": "signflip", "partition": "dirichlet", "alpha": 0.5, "rounds": 10, "eval_every": 5,
    "checkpoint_every": 5, "seed": 3, "stats_batch": 16, "stats_momentum": 0.3,
}


def test_federated_run_measures_the_statistics_and_resumes_them(tmp_path: Path) -> None:
    """A Hybrid BN CNN under a vector attack on updates and statistics: the checkpoint holds the global statistics,
    they moved from (0, 1) and are finite, and a run stopped at round 5 resumes to the same bits."""
    cfg = make_config(FED_BN)
    full = tmp_path / "full"
    rows = train(cfg, full)
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.05  # it learns, under attack
    ckpt = load_file(str(full / "checkpoint.safetensors"))
    stats = ckpt["norm_stats"]
    assert stats.shape == (24,) and bool(torch.isfinite(stats).all())
    assert not torch.equal(stats[:12], torch.zeros(12)) and bool((stats[12:] >= 0).all())
    part = train_interrupted(cfg, tmp_path / "part", 5)
    train(cfg, part)
    again = load_file(str(part / "checkpoint.safetensors"))
    for key in ckpt:
        assert torch.equal(ckpt[key], again[key]), key


def test_batchnorm_statistics_matter_for_evaluation() -> None:
    """Evaluation uses the global statistics: with them reset to (0, 1) the trained model predicts differently."""
    from phalanx.experiments import from_config
    from phalanx.training.loop import Loop

    exp = from_config(make_config({**FED_BN, "attack": "none", "byzantine": 0, "model_params": {
        "channels": [4, 8], "hidden": 16, "norm": "batch"}}))
    loop = Loop(exp)
    loop.run()
    pool = exp.stage(PoolStats)
    assert pool is not None
    norm = pool.norm  # the stage's own layers: the clients measure on them, the stage pools into them
    theta = loop.state.theta
    x = exp.dataset.test_x
    trained = exp.problem.predict(theta, x)
    assert torch.equal(norm.vector(), loop.snapshot().stages["norm_stats"])  # the checkpoint's key, as before
    norm.load(torch.cat([torch.zeros(norm.channels), torch.ones(norm.channels)]))
    assert not torch.equal(exp.problem.predict(theta, x), trained)


@pytest.mark.parametrize(("change", "match"), [
    ({"algorithm": "dsgd", "clients_per_round": None, "local_steps": 1, "stats_batch": 64, "stats_momentum": 0.1},
     "model_params.norm='hybrid' is invalid: allowed 'group' or 'none' with algorithm = 'dsgd'"),
    ({"engine": "torchrun"}, "model_params.norm='hybrid' is invalid: allowed 'group' or 'none' with engine"),
    ({"model_params": {"norm": "layer"}}, "norm='layer' is invalid"),
    ({"stats_momentum": 0.0}, "stats_momentum"),
])
def test_config_errors(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        cfg = make_config({**FED_BN, **change})
        from phalanx.experiments.build import check_points
        check_points([cfg])


def test_experiment_refuses_a_batchnorm_model_with_dsgd() -> None:
    from phalanx.experiments import from_config

    exp = from_config(make_config(FED_BN))
    with pytest.raises(ConfigError, match="BatchNorm / Hybrid BN"):
        Experiment(model=exp.problem, dataset=exp.dataset, rule=aggregators.make("mean", f=0), workers=4,
                   algorithm=DSGD())


def test_norm_stats_of_a_model_without_them_is_none() -> None:
    assert NormStats.of(models.make("cnn", (1, 8, 8), 4)) is None
    assert NormStats.of(models.make("resnet20", (3, 8, 8), 4, norm="batch")) is not None
