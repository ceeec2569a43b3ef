"""Training: vmap gradients equal the loop, one round by hand, determinism, resume = uninterrupted, config errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _interrupt import train_interrupted
from phalanx import aggregators, models
from phalanx.analysis import aggregation_error
from phalanx.errors import ConfigError
from phalanx.experiments import grid, make_config, report, runner, store, train
from phalanx.experiments.config import apply_overrides
from phalanx.training import SGD, Experiment, Loop
from phalanx.training.problem import Problem
from phalanx.training.server import detection_auc
from phalanx.training.shards import WorkerData, sample_batches

SMALL = {
    "dataset": "digits", "model": "mlp", "workers": 8, "byzantine": 2, "f": 2, "aggregator": "cwtm",
    "attack": "signflip", "partition": "dirichlet", "alpha": 1.0, "rounds": 12, "batch_size": 8, "lr": 0.1,
    "eval_every": 4, "checkpoint_every": 4, "seed": 3,
}


@pytest.mark.parametrize("per_worker", ["auto", "vmap"])
@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn"])
def test_vmap_gradients_equal_the_loop(name: str, per_worker: str) -> None:
    torch.manual_seed(0)
    model = models.make(name, (1, 8, 8), 10)
    problem = Problem(model, per_worker=per_worker)
    theta = problem.initial_theta()
    xb = torch.randn(5, 7, 1, 8, 8)
    yb = torch.randint(0, 10, (5, 7))
    assert torch.allclose(problem.grads(theta, xb, yb), problem.grads_loop(theta, xb, yb), atol=1e-5)


class _Tensors:
    """A data set given as tensors (what an Experiment needs of one)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> None:
        self.train_x, self.train_y, self.test_x, self.test_y, self.num_classes = x, y, x, y, num_classes


def test_one_round_by_hand() -> None:
    torch.manual_seed(0)
    problem = Problem(models.make("logreg", (1, 2, 2), 3))
    x = torch.randn(12, 1, 2, 2)
    y = torch.randint(0, 3, (12,))
    shards = [torch.arange(0, 4), torch.arange(4, 8), torch.arange(8, 12)]
    exp = Experiment(model=problem, dataset=_Tensors(x, y, 3), rule=aggregators.make("mean", f=0), workers=3,
                     shards=shards, lr=0.5, rounds=1, eval_every=1, seed=4)
    theta0 = problem.initial_theta()
    loop = Loop(exp)
    res = loop.step().result
    # the same round by hand: same batches (the seed's batch stream), per-worker gradients, mean, one SGD step
    from phalanx.training.streams import generator

    gen2 = generator(4, "batches")
    pos = (torch.rand(3, 32, generator=gen2, dtype=torch.float64) * 4).long()  # uniform positions in each shard
    idx = torch.stack([s[pos[i]] for i, s in enumerate(shards)])
    g = problem.grads_loop(theta0, x[idx], y[idx])
    assert torch.allclose(loop.state.theta, theta0 - 0.5 * g.mean(0), atol=1e-6)
    assert loop.state.momentum is not None and torch.allclose(loop.state.momentum, g, atol=1e-6)  # m₀ = g₀
    assert res is not None and res.agg_error == pytest.approx(0.0, abs=1e-10)


def test_server_momentum_is_heavy_ball_on_the_aggregate() -> None:
    """SGD(momentum=μ) on the server: u ← μ u + a, θ ← θ − η u, with a the round's aggregate (checked against the
    plain run's aggregates, which do not depend on the server optimizer in round 0 and are recomputed by hand)."""
    torch.manual_seed(0)
    ds = _Tensors(torch.randn(40, 1, 2, 2), torch.randint(0, 3, (40,)), 3)
    kw = {"dataset": ds, "rule": aggregators.make("cwtm", f=1), "workers": 4, "lr": 0.3, "rounds": 3,
          "eval_every": 1}
    problem = Problem(models.make("logreg", (1, 2, 2), 3, generator=torch.Generator().manual_seed(2)))
    loop = Loop(Experiment(model=problem, optimizer=SGD(momentum=0.5), **kw))
    theta, u = problem.initial_theta(), None
    for _ in range(3):
        loop.step()
        a = loop.state.previous
        assert a is not None
        u = a.clone() if u is None else 0.5 * u + a
        theta = theta - 0.3 * u
        torch.testing.assert_close(loop.state.theta, theta)
    assert torch.equal(loop.snapshot().optimizer["momentum_buffer"], loop.experiment.optimizer.state_dict()[
        "momentum_buffer"])


def test_measurements() -> None:
    honest = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    assert aggregation_error(torch.tensor([1.0, 0.0]), honest) == 0.0
    assert aggregation_error(torch.tensor([2.0, 0.0]), honest) == pytest.approx(1.0)
    byz = torch.tensor([False, False, True])
    assert detection_auc(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), byz) == 1.0
    assert detection_auc(torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64), byz) == 0.25


def test_training_learns_and_is_deterministic(tmp_path: Path) -> None:
    cfg = make_config({**SMALL, "attack": "none", "byzantine": 0, "rounds": 40, "eval_every": 20})
    rows = train(cfg)
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3
    assert rows == train(cfg)


def test_resume_equals_uninterrupted(tmp_path: Path) -> None:
    cfg = make_config(SMALL)
    full = train(cfg, tmp_path / "full")
    # interrupted: run 8 rounds into the directory, then ask for all 12 (resumes from the round-8 checkpoint)
    partial_dir = train_interrupted(cfg, tmp_path / "part", 8)
    resumed = train(cfg, partial_dir)
    assert [r["test_accuracy"] for r in resumed] == [r["test_accuracy"] for r in full]
    assert [r["round"] for r in resumed] == [0, 4, 8, 12]
    assert store.is_finished(partial_dir) and (partial_dir / "metrics.parquet").exists()


def test_run_dir_refuses_another_config(tmp_path: Path) -> None:
    train(make_config({**SMALL, "rounds": 2}), tmp_path)
    with pytest.raises(ConfigError, match="differs in rounds"):
        train(make_config({**SMALL, "rounds": 3}), tmp_path)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"bogus": 1}, "unknown key"),
        ({"agregator": "cwtm"}, r"unknown key; did you mean aggregator\?"),
        ({"f": 4}, "f=4 is invalid: allowed < workers/2"),
        ({"byzantine": 8}, "byzantine=8 is invalid: allowed < workers"),
        ({"aggregator": "krum", "f": 3}, "workers"),
        ({"aggregator": "nope"}, "aggregator"),
        ({"attack": "nope"}, "attack"),
        ({"dataset": "nope"}, "dataset"),
        ({"lr": -1}, "lr"),
        ({"lr": float("inf")}, "lr=inf is invalid: allowed a finite number"),
        ({"weight_decay": float("inf")}, "weight_decay=inf is invalid: allowed a finite number"),
        ({"momentum": float("nan")}, "momentum=nan is invalid"),
        ({"partition": "random"}, "partition"),
        ({"partition": "diriclet"}, r"partition='diriclet' is invalid: .*\(did you mean dirichlet\?\)"),  # issue 38
        ({"engine": "torchrn"}, r"\(did you mean torchrun\?\)"),
    ],
)
def test_config_errors(change: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_config({**SMALL, **change})


def test_overrides_and_grid() -> None:
    data = apply_overrides(SMALL, ["f=1", "aggregator=['cwtm', 'krum']", "attack_params.scale=2.0", "seed=[0, 1]"])
    assert data["f"] == 1 and data["attack_params"] == {"scale": 2.0}
    cfgs = grid.configs(data)
    assert [(c.aggregator, c.seed) for c in cfgs] == [("cwtm", 0), ("cwtm", 1), ("krum", 0), ("krum", 1)]
    assert len({grid.run_id(c) for c in cfgs}) == 4


def test_sweep_skips_finished_runs_and_reports(tmp_path: Path) -> None:
    data = {**SMALL, "rounds": 4, "aggregator": ["cwtm", "cwmed"], "attack": ["none", "signflip"]}
    cfgs = grid.configs(data)
    seen: list[str] = []
    runner.run_grid(cfgs, tmp_path, on_done=lambda c, s: seen.append(s))
    assert seen == ["done"] * 4
    seen.clear()
    runner.run_grid(cfgs, tmp_path, on_done=lambda c, s: seen.append(s))
    assert seen == ["skipped (finished)"] * 4
    result = report.write_report(tmp_path)
    assert {s["aggregator"] for s in result["summary"]} == {"cwtm", "cwmed"}
    assert (tmp_path / "report.md").exists() and (tmp_path / "accuracy.png").exists()
    assert (tmp_path / "heatmap.png").exists()


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="Debian's dataset-fashion-mnist is not installed (.ci/run installs it)",
)
def test_trains_on_real_fashion_mnist() -> None:
    cfg = make_config({
        "dataset": "fashion-mnist", "model": "logreg", "workers": 6, "byzantine": 1, "f": 1, "aggregator": "cwtm",
        "attack": "signflip", "rounds": 30, "batch_size": 32, "lr": 0.1, "eval_every": 30, "seed": 0,
    })
    rows = train(cfg)
    assert rows[-1]["test_accuracy"] > 0.6  # 10 classes: chance is 0.1


def test_batches_come_from_each_workers_own_shard() -> None:
    x = torch.arange(10, dtype=torch.float32)[:, None]
    y = torch.arange(10)
    shards = [torch.tensor([0, 1, 2]), torch.tensor([3]), torch.tensor([4, 5, 6, 7, 8, 9])]
    data = WorkerData(x, y, shards, 10)
    _, yb = sample_batches(data, 3, 400, torch.Generator().manual_seed(0))
    for w, shard in enumerate(shards):
        drawn = set(yb[w].tolist())
        assert drawn == set(shard.tolist())  # every element drawn, nothing from another shard


def test_no_heatmap_for_a_single_attack(tmp_path: Path) -> None:
    cfgs = grid.configs({**SMALL, "rounds": 2, "aggregator": ["cwtm", "cwmed"]})
    runner.run_grid(cfgs, tmp_path)
    result = report.write_report(tmp_path)
    assert [p.name for p in result["plots"]] == ["accuracy.png"]
    assert not (tmp_path / "heatmap.png").exists()


@pytest.mark.parametrize("per_worker", ["auto", "vmap"])
def test_accumulate_grads_is_the_momentum_update_of_grads(per_worker: str) -> None:
    torch.manual_seed(0)
    model = models.make("mlp", (1, 8, 8), 10, generator=torch.Generator().manual_seed(1), hidden=[7, 5])
    problem = Problem(model, per_worker=per_worker)
    theta = problem.initial_theta()
    xb, yb = torch.randn(4, 3, 1, 8, 8), torch.randint(0, 10, (4, 3))
    g = problem.grads(theta, xb, yb) + 0.01 * theta
    m0 = torch.randn(4, problem.dim)
    buf = torch.empty(6, problem.dim)  # rows 0..3 used: a view of the momentum buffer, as the round passes it
    buf[:4] = m0
    problem.accumulate_grads(theta, xb, yb, buf[:4], 0.1, weight_decay=0.01)
    assert torch.allclose(buf[:4], 0.9 * m0 + 0.1 * g, atol=1e-6)
    problem.accumulate_grads(theta, xb, yb, buf[:4], 1.0, weight_decay=0.01)
    assert torch.allclose(buf[:4], g, atol=1e-6)
    with pytest.raises(ValueError, match="row-contiguous"):
        problem.accumulate_grads(theta, xb, yb, torch.empty(problem.dim, 4).t(), 0.1)
    one = torch.zeros(1, problem.dim)  # one worker takes the plain-autograd path: the same gradient
    problem.accumulate_grads(theta, xb[1:2], yb[1:2], one, 1.0, weight_decay=0.01)
    assert torch.allclose(one[0], g[1], atol=1e-6)
