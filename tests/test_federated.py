"""Federated rounds (algorithm = "fedavg"): one round by hand, FedAvg with one step and every client equals DSGD
without momentum, sampling, local epochs, FedProx, attacks on updates, FedAdam, resume, config errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx import aggregators, attacks, models
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config, store, train
from phalanx.training import DSGD, Experiment, Loop
from phalanx.training.algorithms.fedavg import FedAvg
from phalanx.training.optim import SGD, Adam
from phalanx.training.problem import Problem
from phalanx.training.streams import generator

FED: dict[str, Any] = {
    "algorithm": "fedavg", "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 20,
    "clients_per_round": 6, "local_steps": 3, "byzantine": 4, "f": 1, "aggregator": "cwtm", "attack": "alie",
    "partition": "dirichlet", "alpha": 1.0, "rounds": 12, "batch_size": 8, "lr": 0.05, "momentum": 0.5,
    "eval_every": 4, "checkpoint_every": 4, "seed": 7,
}


class _Tensors:
    def __init__(self, x: torch.Tensor, y: torch.Tensor, classes: int) -> None:
        self.train_x, self.train_y, self.test_x, self.test_y, self.num_classes = x, y, x, y, classes


def _tiny(seed: int = 0) -> tuple[Problem, _Tensors, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(40, 1, 2, 2, generator=g), torch.randint(0, 3, (40,), generator=g)
    problem = Problem(models.make("logreg", (1, 2, 2), 3, generator=torch.Generator().manual_seed(1)))
    shards = [torch.arange(i * 5, i * 5 + 5) if i < 6 else torch.arange(30 + (i - 6) * 5, 35 + (i - 6) * 5)
              for i in range(8)]
    return problem, _Tensors(x, y, 3), shards


def test_one_round_by_hand() -> None:
    """Sample C of N, K local steps with momentum, weight decay and FedProx on every sampled client's own batches,
    pseudo-gradients θ − θᵢ, mean, server SGD with lr 0.5: the same θ as a plain loop over the clients."""
    problem, ds, shards = _tiny()
    algo = FedAvg(clients_per_round=3, local_steps=4, batch_size=5, lr=0.2, momentum=0.5, weight_decay=0.01,
                  prox_mu=0.1)
    exp = Experiment(model=problem, dataset=ds, rule=aggregators.make("mean", f=0), workers=8, shards=shards,
                     algorithm=algo, optimizer=SGD(), lr=0.5, rounds=1, eval_every=1, seed=3)
    theta0 = problem.initial_theta()
    loop = Loop(exp)
    info = loop.step()
    # by hand
    ids = torch.randperm(8, generator=generator(3, "clients"))[:3].sort().values
    bg = generator(3, "batches")
    params = {int(i): theta0.clone() for i in ids}
    vel = {int(i): torch.zeros_like(theta0) for i in ids}
    for _ in range(4):
        u = torch.rand(3, 5, generator=bg, dtype=torch.float64)
        for row, i in enumerate(ids.tolist()):
            pos = (u[row] * 5).long().clamp(max=4)
            idx = shards[i][pos]
            p = params[i]
            g = problem.grads_loop(p, ds.train_x[idx][None], ds.train_y[idx][None])[0]
            g = g + 0.01 * p + 0.1 * (p - theta0)
            vel[i] = 0.5 * vel[i] + g
            params[i] = p - 0.2 * vel[i]
    pseudo = torch.stack([theta0 - params[i] for i in ids.tolist()])
    torch.testing.assert_close(loop.state.theta, theta0 - 0.5 * pseudo.mean(0))
    assert info.aggregated == 3 and loop.state.momentum is None  # federated clients keep no state between rounds


def test_one_local_step_with_every_client_is_dsgd_without_momentum() -> None:
    problem, ds, shards = _tiny(2)
    common: dict[str, Any] = {"model": problem, "dataset": ds, "rule": aggregators.make("mean", f=0), "workers": 8,
                              "shards": shards, "rounds": 5, "eval_every": 5, "seed": 4}
    fed = Loop(Experiment(algorithm=FedAvg(local_steps=1, batch_size=4, lr=0.3), lr=1.0, **common))
    fed.run()
    dsgd = Loop(Experiment(algorithm=DSGD(batch_size=4, momentum=0.0), lr=0.3, **common))
    dsgd.run()
    torch.testing.assert_close(fed.state.theta, dsgd.state.theta)  # θ − 1·mean(0.3 g) vs θ − 0.3·mean(g)


def test_sampling_is_uniform_without_replacement_and_logged() -> None:
    exp = from_config(make_config({**FED, "rounds": 200, "eval_every": 1}))
    loop = Loop(exp)
    loop.open()
    seen = torch.zeros(20)
    byz_counts = []
    for _ in range(200):
        workers = loop.transport.workers
        assert workers is not None
        state = workers.client_gen.get_state()
        info = loop.step()
        gen = torch.Generator()
        gen.set_state(state)
        ids = torch.randperm(20, generator=gen)[:6]
        assert len(set(ids.tolist())) == 6
        seen[ids] += 1
        assert info.result is not None
        byz_counts.append(info.result.sampled_byzantine)
        assert info.result.sampled_byzantine == int((ids >= 16).sum())
    assert seen.min() > 30 and seen.max() < 90  # expected 60 each
    assert 0 in byz_counts and max(byz_counts) >= 2  # the sampled number of attackers varies from round to round


def test_rows_log_the_sampled_attackers_and_training_works() -> None:
    rows = train(make_config({**FED, "rounds": 40, "eval_every": 20, "attack": "signflip"}))
    assert "byzantine_sampled" in rows[1] and rows[1]["algorithm"] == "fedavg"
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3


def test_local_epochs_take_each_shards_own_number_of_steps() -> None:
    problem, ds, shards = _tiny()
    shards = [*shards[:7], torch.arange(35, 40)]
    shards[0] = torch.arange(0, 2)  # 2 samples: 1 step of batch 4 at E = 1; the others: 5 samples → 2 steps
    exp = Experiment(model=problem, dataset=ds, rule=aggregators.make("mean", f=0), workers=8, shards=shards,
                     algorithm=FedAvg(local_epochs=1.0, batch_size=4, lr=0.1), rounds=1, seed=0)
    clients = exp.algorithm.all_workers(exp, {k: generator(0, k).get_state() for k in ("batches", "attack",
                                                                                      "clients")}, None)
    assert clients.steps.tolist() == [1, 2, 2, 2, 2, 2, 2, 2]


def test_an_attack_sees_the_rounds_honest_updates_and_a_data_attack_trains_on_poison() -> None:
    seen: list[torch.Tensor] = []

    class Spy:
        def __init__(self) -> None:
            pass

        def __call__(self, ctx: Any) -> torch.Tensor:
            seen.append(ctx.honest.clone())
            return -ctx.honest.mean(0, keepdim=True).expand(ctx.n_byzantine, -1).clone()

    cls = attacks.registry.user_attack(Spy, "spy")
    exp = from_config(make_config({**FED, "rounds": 6}))
    exp.attack = cls()
    loop = Loop(exp)
    loop.run()
    assert seen and all(s.shape[1] == exp.problem.dim for s in seen)
    rows = train(make_config({**FED, "attack": "labelflip", "rounds": 8, "eval_every": 8}))
    assert rows[-1]["test_accuracy"] > 0.3


def test_fedadam_matches_its_formula_and_resumes(tmp_path: Path) -> None:
    opt = Adam(beta1=0.9, beta2=0.99, tau=1e-3)
    theta, a = torch.zeros(3), torch.tensor([1.0, -2.0, 0.5])
    t1 = opt.step(theta, a, 0.1)
    m, v = 0.1 * a, 0.01 * a * a
    torch.testing.assert_close(t1, -0.1 * m / (v.sqrt() + 1e-3))
    again = Adam()
    again.load_state_dict(opt.state_dict())
    torch.testing.assert_close(again.step(t1, a, 0.1), opt.step(t1, a, 0.1))
    cfg = {**FED, "server_optimizer": "adam", "server_optimizer_params": {"tau": 0.01}, "server_lr": 0.01,
           "aggregator": "bucketing(s=2)>cwmed"}
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 8)
    train(make_config(cfg), part)
    a_ckpt, b_ckpt = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert {"rng.clients", "optim.m", "optim.v", "optim.step"} <= set(a_ckpt)
    for k in a_ckpt:
        assert torch.equal(a_ckpt[k], b_ckpt[k]), k
    keys = ("round", "test_accuracy", "byzantine_sampled")
    assert [[r.get(k) for k in keys] for r in store.read_rows(full)] == [
        [r.get(k) for k in keys] for r in store.read_rows(part)]


@pytest.mark.parametrize(("change", "match"), [
    ({"clients_per_round": 21}, "clients_per_round=21 is invalid"),
    ({"local_steps": 0}, "local_steps"),
    ({"f": 3}, "f=3 is invalid: allowed < clients_per_round/2"),
    ({"algorithm": "dsgd"}, "clients_per_round=6 is invalid: allowed its default with algorithm = 'dsgd'"),
    ({"engine": "torchrun", "topology": "serverless"}, "topology='serverless' is invalid: allowed 'server'"),
    ({"server_optimizer": "adam", "server_momentum": 0.9}, "server_momentum=0.9 is invalid"),
    ({"aggregator": "krum", "f": 2}, "clients_per_round=6 is invalid: allowed >= 7 for aggregator 'krum'"),
    ({"aggregator": "bulyan", "f": 1}, "clients_per_round=6 is invalid: allowed >= 7"),
])
def test_config_errors(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_config({**FED, **change})


def test_dsgd_configs_keep_their_identity() -> None:
    cfg = make_config({k: v for k, v in FED.items() if k not in ("algorithm", "clients_per_round", "local_steps")})
    assert not {"algorithm", "clients_per_round", "local_steps", "server_lr"} & set(cfg.identity())


def test_backdoor_trigger_poisoning_and_success_rate() -> None:
    bd = attacks.make("backdoor", target=3, size=2, value=9.0, poison_fraction=0.5)
    x, y = torch.zeros(8, 1, 4, 4), torch.arange(8) % 5
    x2, y2 = bd.transform(x, y, 10, torch.Generator().manual_seed(0))
    poisoned = (x2 != x).flatten(1).any(1)
    assert int(poisoned.sum()) == 4 and bool((y2[poisoned] == 3).all()) and torch.equal(y2[~poisoned], y[~poisoned])
    assert torch.equal(x2[poisoned][0, 0, 2:, 2:], torch.full((2, 2), 9.0)) and x2[poisoned][0, 0, :2].eq(0).all()
    assert torch.equal(x, torch.zeros(8, 1, 4, 4))  # the input is not modified
    flat = bd.trigger(torch.zeros(3, 10))
    assert flat[:, -4:].eq(9.0).all() and flat[:, :-4].eq(0).all()
    # success rate: the share of triggered non-target inputs classified as the target
    fooled = bd.metrics(lambda xs: torch.full((xs.shape[0],), 3), x, y)
    clean = bd.metrics(lambda xs: torch.zeros(xs.shape[0], dtype=torch.long), x, y)
    assert fooled == {"attack_success": 1.0} and clean == {"attack_success": 0.0}
    with pytest.raises(ConfigError, match="poison_fraction"):
        attacks.make("backdoor", poison_fraction=0.0)


def test_backdoor_in_federated_rounds_logs_its_success_and_boost_scales_the_update() -> None:
    cfg = make_config({**FED, "attack": "backdoor", "rounds": 4, "eval_every": 2, "attack_params": {"boost": 1.0}})
    rows = train(cfg)
    assert all("attack_success" in r for r in rows)

    def first_round_vectors(boost: float) -> tuple[torch.Tensor, list[int]]:
        exp = from_config(make_config({**FED, "attack": "backdoor", "attack_params": {"boost": boost}}))
        loop = Loop(exp)
        loop.open()
        workers = loop.transport.workers
        assert workers is not None
        got = workers.round(exp.problem.initial_theta(), 0, lambda x: x.mean(0))
        assert got.rows is not None
        return got.vectors, got.rows

    plain, rows = first_round_vectors(1.0)
    boosted, _ = first_round_vectors(4.0)
    byz = torch.tensor([r >= 16 for r in rows])
    assert bool(byz.any())
    torch.testing.assert_close(boosted[byz], 4.0 * plain[byz])
    torch.testing.assert_close(boosted[~byz], plain[~byz])
    dsgd = {k: v for k, v in FED.items() if k not in ("algorithm", "clients_per_round", "local_steps")}
    with pytest.raises(ConfigError, match=r"boost=4\.0 is invalid: allowed 1 with algorithm = 'dsgd'"):
        make_config({**dsgd, "attack": "backdoor", "attack_params": {"boost": 4.0}})
    with pytest.raises(ConfigError, match=r"boost=4\.0 is invalid: allowed 1 with distributed SGD"):  # objects API
        exp = from_config(make_config({**dsgd, "attack": "backdoor"}))
        Experiment(model=exp.problem, dataset=exp.dataset, rule=exp.rule, workers=exp.workers,
                   attack=attacks.make("backdoor", boost=4.0))


@pytest.mark.parametrize("name", ["fedavg.toml", "local_steps.toml", "local_steps_fixed.toml"])
def test_the_example_configs_are_valid_grids(name: str) -> None:
    from phalanx.experiments import grid, load_toml
    from phalanx.experiments.build import check_points

    cfgs = grid.configs(load_toml(Path(__file__).resolve().parent.parent / "examples" / "federated" / name))
    check_points(cfgs)
    assert all(c.algorithm == "fedavg" for c in cfgs)


@pytest.mark.parametrize(("attack", "extra"), [("alie", {}), ("labelflip", {}),
                                               ("backdoor", {"attack_params": {"boost": 3.0}}),
                                               ("none", {"byzantine": 0, "local_epochs": 0.5})])
def test_client_slots_give_the_batched_rows(attack: str, extra: dict[str, Any]) -> None:
    """The worker side of the torchrun engine, in process: C slots (``FedAvg.one_worker``), each training only the
    client it plays, give the rows of the batched round, round after round, with every stream in step — the attack
    stream passed from slot to slot as the server passes it (a round's Byzantine slots change)."""
    cfg = make_config({**FED, "attack": attack, "byzantine": 8, "workers": 12, "clients_per_round": 5, **extra})
    exp = from_config(cfg)
    streams = {name: generator(cfg.seed, name).get_state() for name in ("batches", "attack", "clients")}
    everyone = exp.algorithm.all_workers(exp, streams, None)
    slots = [exp.algorithm.one_worker(exp, r, streams, None) for r in range(5)]
    rule = exp.rule
    theta = exp.problem.initial_theta()
    attack_state = streams["attack"]
    kinds: set[tuple[int, int]] = set()
    for t in range(6):
        got = everyone.round(theta, t, rule)
        sent = [s.vector(theta, t) for s in slots]
        plan = slots[0].plan
        assert all(s.plan == plan for s in slots) and plan.clients == got.rows
        kinds.add((len(plan.honest), len(plan.attacking)))
        honest = torch.stack([sent[r] for r in plan.honest]) if plan.honest else theta.new_zeros(0, theta.numel())
        for r in plan.attacking:
            slots[r].attack_gen.set_state(attack_state)
            sent[r] = slots[r].attack_vector(honest, rule, t)
            attack_state = slots[r].attack_gen.get_state()
        if not plan.attacking:
            attack_state = slots[0].attack_gen.get_state()
        assert torch.equal(attack_state, everyone.attack_gen.get_state())
        for r, v in enumerate(sent):
            assert v is not None
            torch.testing.assert_close(v, got.vectors[r])  # float32 defaults: one row vs a batch of rows
        for s in slots:
            assert torch.equal(s.batch_gen.get_state(), everyone.batch_gen.get_state())
            assert torch.equal(s.client_gen.get_state(), everyone.client_gen.get_state())
        theta = theta - got.vectors.mean(0)
    if attack == "alie":
        assert any(h == 0 for h, _ in kinds) and any(h and a for h, a in kinds), kinds  # no honest client; mixed
