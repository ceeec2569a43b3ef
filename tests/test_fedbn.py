"""FedBN (norm = "fedbn", phalanx.training.algorithms.fedbn): every client keeps its BatchNorm layers — γ, β and the
running statistics — and the rule aggregates the shared coordinates only. One round by hand against torch's BatchNorm2d,
per-client state (sampled, not sampled, Byzantine), the rule's and the attack's view, resume, the per-client
evaluation against a loop over clients, and the configurations that are refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save
from torch import Tensor, nn

from _interrupt import train_interrupted
from phalanx import aggregators, attacks, models
from phalanx.aggregators.mean import Mean
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config, store, train
from phalanx.models.norm import FedNorm2d
from phalanx.training import DSGD, Experiment, Loop
from phalanx.training.algorithms.fedavg import FedAvg
from phalanx.training.algorithms.fedbn import LocalNorms, label_shares, local_norms
from phalanx.training.loop import Evaluate
from phalanx.training.norm_stats import NormStats
from phalanx.training.optim import SGD
from phalanx.training.problem import Problem
from phalanx.training.streams import generator


def _tol(x: Tensor) -> dict[str, float]:
    """A float32 result of a few dozen operations per entry, against the same computed another way."""
    eps = torch.finfo(x.dtype).eps
    return {"atol": 50 * eps * float(x.detach().abs().max()), "rtol": 50 * eps}


class _Tensors:
    def __init__(self, x: Tensor, y: Tensor, tx: Tensor, ty: Tensor, classes: int) -> None:
        self.train_x, self.train_y, self.test_x, self.test_y, self.num_classes = x, y, tx, ty, classes


def _model(seed: int = 1) -> nn.Module:
    return models.make("cnn", (1, 8, 8), 3, generator=torch.Generator().manual_seed(seed), channels=[2, 4],
                       kernel_size=3, hidden=8, norm="fedbn")


def _data(clients: int, per: int = 6, seed: int = 0) -> tuple[_Tensors, list[Tensor]]:
    """``clients`` shards of ``per`` samples; client i's inputs are scaled and shifted by i (a feature shift) and its
    labels skewed towards class i mod 3."""
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for i in range(clients):
        xs.append(torch.randn(per, 1, 8, 8, generator=g) * (1 + i) + 2.0 * i)
        ys.append(torch.where(torch.rand(per, generator=g) < 0.7, torch.full((per,), i % 3),
                              torch.randint(0, 3, (per,), generator=g)))
    x, y = torch.cat(xs), torch.cat(ys)
    tx, ty = torch.randn(25, 1, 8, 8, generator=g) * 2 + 1, torch.arange(25) % 3
    shards = [torch.arange(i * per, (i + 1) * per) for i in range(clients)]
    return _Tensors(x, y, tx, ty, 3), shards


class _Spy(Mean):
    """The mean, remembering what it was given and what it returned."""

    def __init__(self, f: int = 0) -> None:
        super().__init__(f)
        self.seen: list[Tensor] = []
        self.out: list[Tensor] = []

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        out, contrib = super()._run(x, want_contributions, **context)
        self.seen.append(x.clone())
        self.out.append(out.clone())
        return out, contrib


def _torch_bn(model: nn.Module, row: Tensor, norms: LocalNorms) -> nn.Module:
    """A copy of ``model`` with every FedBN layer replaced by torch's ``BatchNorm2d`` holding ``row``'s γ, β and
    running statistics — the layer the FedBN authors' code trains."""
    ref = copy.deepcopy(model)
    p = norms.params
    gammas_betas = row[:p]
    means, variances = row[p : p + norms.channels], row[p + norms.channels :]
    off = offs = 0
    for name, layer in list(ref.named_modules()):
        if not isinstance(layer, FedNorm2d):
            continue
        c = layer.weight.numel()
        bn = nn.BatchNorm2d(c, eps=layer.eps, momentum=0.1)
        with torch.no_grad():
            bn.weight.copy_(gammas_betas[off : off + c])
            bn.bias.copy_(gammas_betas[off + c : off + 2 * c])
            bn.running_mean.copy_(means[offs : offs + c])
            bn.running_var.copy_(variances[offs : offs + c])
        off, offs = off + 2 * c, offs + c
        parent_name, _, leaf = name.rpartition(".")
        setattr(ref.get_submodule(parent_name), leaf, bn)
    return ref


def _bn_row(ref: nn.Module) -> Tensor:
    """γ, β of every BatchNorm2d in module order (θ's order for these models) ‖ running means ‖ running variances."""
    bns = [m for m in ref.modules() if isinstance(m, nn.BatchNorm2d)]
    return torch.cat([torch.cat([b.weight.detach(), b.bias.detach()]) for b in bns]
                     + [b.running_mean for b in bns] + [b.running_var for b in bns])


def test_one_round_by_hand_against_torch_batchnorm() -> None:
    """Three clients, all sampled, K = 3 local steps with momentum: each trains its own model (shared θ, its own BN)
    as torch's BatchNorm2d would — its parameters, and running statistics updated with momentum 0.1 and the
    unbiased batch variance; the rule averages the shared coordinates only; the new rows are the clients' layers."""
    model = _model()
    problem = Problem(model)
    norms = local_norms(problem)
    assert norms is not None and norms.channels == 6 and norms.width == 24
    ds, shards = _data(3)
    spy = _Spy()
    algo = FedAvg(local_steps=3, batch_size=4, lr=0.1, momentum=0.5)
    exp = Experiment(model=problem, dataset=ds, rule=spy, workers=3, shards=shards, algorithm=algo, optimizer=SGD(),
                     lr=1.0, rounds=1, eval_every=1, seed=5)
    loop = Loop(exp)
    loop.open()
    table0 = loop.state.own["local_norms"]
    theta0 = loop.state.theta.clone()
    assert table0 is not None and table0.shape == (3, 24)
    loop.step()
    bg = generator(5, "batches")
    refs = [_torch_bn(model, table0[i], norms).train() for i in range(3)]  # the model's own weights are θ₀
    opts = [torch.optim.SGD(r.parameters(), lr=0.1, momentum=0.5) for r in refs]
    for _ in range(3):
        u = torch.rand(3, 4, generator=bg, dtype=torch.float64)
        for i, (ref, opt) in enumerate(zip(refs, opts)):
            idx = shards[i][(u[i] * 6).long().clamp(max=5)]
            opt.zero_grad()
            F.cross_entropy(ref(ds.train_x[idx]), ds.train_y[idx]).backward()
            opt.step()
    table = loop.state.own["local_norms"]
    assert table is not None
    for i, ref in enumerate(refs):
        want = _bn_row(ref)
        torch.testing.assert_close(table[i], want, **_tol(want))
    shared = norms.shared_index
    ref_shared = torch.stack([torch.cat([p.detach().reshape(-1) for n, p in r.named_parameters()
                                         if not isinstance(r.get_submodule(n.rpartition(".")[0]), nn.BatchNorm2d)])
                              for r in refs])
    torch.testing.assert_close(loop.state.theta[shared], ref_shared.mean(0), **_tol(ref_shared))
    # the rule saw the shared coordinates only, and θ moved by exactly what it returned
    (seen,), (out,) = spy.seen, spy.out
    assert seen.shape == (3, problem.dim - 2 * norms.channels) == (3, shared.numel())
    assert torch.equal(loop.state.theta[shared], theta0[shared] - out)
    assert torch.equal(loop.state.theta[norms.bn_index], theta0[norms.bn_index])  # nobody's: left as it was


def test_clients_keep_their_own_batchnorm_and_the_shared_weights_are_the_rules() -> None:
    """Two clients with differently scaled data, several rounds: different γ, β and statistics at the end; θ's
    shared coordinates are θ₀ minus the sum of what the rule returned, round by round."""
    problem = Problem(_model(2))
    norms = local_norms(problem)
    assert norms is not None
    ds, shards = _data(2, per=8, seed=3)
    spy = _Spy()
    exp = Experiment(model=problem, dataset=ds, rule=spy, workers=2, shards=shards, optimizer=SGD(), lr=1.0,
                     algorithm=FedAvg(local_steps=2, batch_size=4, lr=0.1), rounds=4, eval_every=4, seed=1)
    loop = Loop(exp)
    loop.open()
    theta = loop.state.theta.clone()
    for _ in range(4):
        loop.step()
        theta[norms.shared_index] = theta[norms.shared_index] - spy.out[-1]
        assert torch.equal(loop.state.theta, theta)
    table = loop.state.own["local_norms"]
    assert table is not None
    p, c = norms.params, norms.channels
    assert not torch.equal(table[0, :p], table[1, :p])  # affine
    assert not torch.equal(table[0, p : p + c], table[1, p : p + c])  # running means
    assert not torch.equal(table[0, p + c :], table[1, p + c :])  # running variances
    assert all(s.shape == (2, norms.shared_index.numel()) for s in spy.seen)


def test_a_client_keeps_its_row_until_it_is_sampled_and_a_byzantine_row_is_never_written() -> None:
    """Eight clients, three a round, the last two Byzantine with a data attack (they train, on poisoned batches):
    round after round, exactly the sampled honest clients' rows change."""
    ds, shards = _data(8, per=5, seed=4)
    exp = Experiment(model=Problem(_model(3)), dataset=ds, rule=aggregators.make("cwtm", f=1), workers=8,
                     byzantine=2, attack=attacks.make("labelflip"), shards=shards,
                     algorithm=FedAvg(clients_per_round=3, local_steps=2, batch_size=3, lr=0.1), rounds=12, seed=2)
    loop = Loop(exp)
    loop.open()
    first = loop.state.own["local_norms"]
    assert first is not None
    changed: set[int] = set()
    byzantine_sampled = 0
    for _ in range(12):
        workers = loop.transport.workers
        assert workers is not None
        gen = torch.Generator()
        gen.set_state(workers.client_gen.get_state())
        ids = set(torch.randperm(8, generator=gen)[:3].tolist())
        before = loop.state.own["local_norms"]
        assert before is not None
        loop.step()
        after = loop.state.own["local_norms"]
        assert after is not None
        for i in range(8):
            same = torch.equal(after[i], before[i])
            assert same == (i not in ids or i >= 6), (i, ids)
        changed |= {i for i in ids if i < 6}
        byzantine_sampled += len(ids & {6, 7})
        assert torch.equal(after[6:], first[6:])
    assert byzantine_sampled > 0 and len(changed) >= 4


def test_a_vector_attack_sees_the_shared_coordinates() -> None:
    seen: list[Tensor] = []

    class Spy:
        def __call__(self, ctx: Any) -> Tensor:
            seen.append(ctx.honest.clone())
            return -ctx.honest.mean(0, keepdim=True).expand(ctx.n_byzantine, -1).clone()

    cls = attacks.registry.user_attack(Spy, "fedbn-spy")
    ds, shards = _data(6, per=5)
    exp = Experiment(model=Problem(_model()), dataset=ds, rule=aggregators.make("cc", f=1), workers=6, byzantine=2,
                     attack=cls(), shards=shards, algorithm=FedAvg(clients_per_round=4, batch_size=3), rounds=5,
                     seed=0)
    loop = Loop(exp)
    loop.run()
    norms = local_norms(exp.problem)
    assert norms is not None and seen
    assert all(s.shape[1] == norms.shared_index.numel() for s in seen)
    assert loop.state.previous is not None and loop.state.previous.shape == (exp.problem.dim,)
    assert bool((loop.state.previous[norms.bn_index] == 0).all())


FEDBN: dict[str, Any] = {
    "algorithm": "fedavg", "dataset": "digits", "model": "cnn",
    "model_params": {"channels": [4, 8], "hidden": 16, "norm": "fedbn"}, "workers": 12, "clients_per_round": 4,
    "local_steps": 2, "batch_size": 8, "lr": 0.05, "momentum": 0.5, "byzantine": 2, "f": 1, "aggregator": "cwtm",
    "attack": "signflip", "partition": "dirichlet", "alpha": 0.5, "rounds": 10, "eval_every": 5,
    "checkpoint_every": 5, "seed": 3,
}


def test_resume_equals_an_uninterrupted_run_bit_for_bit(tmp_path: Path) -> None:
    cfg = make_config(FEDBN)
    full = tmp_path / "full"
    rows = train(cfg, full)
    names = {"test_accuracy", "test_loss", "global_test_accuracy", "worst_client_accuracy", "clients_evaluated"}
    assert all(names <= set(r) for r in rows) and rows[-1]["clients_evaluated"] == 10
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.05  # it learns, under attack
    ckpt = load_file(str(full / "checkpoint.safetensors"))
    exp = from_config(cfg)
    norms = local_norms(exp.problem)
    assert norms is not None and ckpt["algorithm.local_norms"].shape == (12, norms.width) and "norm_stats" not in ckpt
    part = train_interrupted(cfg, tmp_path / "part", 5)
    train(cfg, part)
    again = load_file(str(part / "checkpoint.safetensors"))
    assert set(ckpt) == set(again)
    for key in ckpt:
        assert torch.equal(ckpt[key], again[key]), key
    assert store.read_rows(full) == store.read_rows(part)


def test_a_checkpoint_written_before_algorithm_state_was_prefixed_resumes(tmp_path: Path) -> None:
    """Checkpoints written before the round algorithm's state had its own ``algorithm.`` prefix kept FedBN's table
    as ``local_norms``: such a run directory resumes, to the same result as the uninterrupted run."""
    cfg = make_config(FEDBN)
    full = tmp_path / "full"
    train(cfg, full)
    part = train_interrupted(cfg, tmp_path / "part", 5)
    path = part / "checkpoint.safetensors"
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
    tensors = load_file(str(path))
    tensors["local_norms"] = tensors.pop("algorithm.local_norms")  # as the older writer named it
    meta.pop("provenance", None)  # which wrote no provenance record either (a renamed tensor breaks a record's digest)
    store.write_artifact(part, path.name, save(tensors, metadata=meta))
    train(cfg, part)
    assert store.read_rows(full) == store.read_rows(part)
    assert torch.equal(load_file(str(full / path.name))["algorithm.local_norms"],
                       load_file(str(path))["algorithm.local_norms"])


def _hand_metrics(exp: Experiment, theta: Tensor, table: Tensor, clients: list[int]) -> dict[str, float]:
    """The evaluation by a loop over clients: each client's model as a plain module (its γ, β and running statistics
    loaded), in evaluation mode, on the whole test set; per-class accuracy re-weighted by its label shares."""
    norms = local_norms(exp.problem)
    assert norms is not None
    ds = exp.dataset
    accs, plains, losses = [], [], []
    for i in clients:
        model = copy.deepcopy(exp.problem.model)
        own = norms.models(theta, table[i : i + 1])[0]
        with torch.no_grad():
            for name, p in model.named_parameters():
                view = exp.problem.layout.views(own)[name]
                p.copy_(view)
            p_, c = norms.params, norms.channels
            off = 0
            for layer in [m for m in model.modules() if isinstance(m, FedNorm2d)]:
                k = layer.weight.numel()
                layer.global_mean.copy_(table[i, p_ + off : p_ + off + k])
                layer.global_var.copy_(table[i, p_ + c + off : p_ + c + off + k])
                off += k
        model.eval()
        with torch.no_grad():
            logits = model(ds.test_x)
        right = (logits.argmax(1) == ds.test_y).double()
        each = F.cross_entropy(logits, ds.test_y, reduction="none").double()
        labels = ds.train_y[exp.data.shards[i]]
        share = torch.bincount(labels, minlength=ds.num_classes).double() / labels.numel()
        acc = sum(float(share[k]) * float(right[ds.test_y == k].mean()) for k in range(ds.num_classes))
        loss = sum(float(share[k]) * float(each[ds.test_y == k].mean()) for k in range(ds.num_classes))
        accs.append(acc)
        losses.append(loss)
        plains.append(float(right.mean()))
    return {"test_accuracy": sum(accs) / len(accs), "test_loss": sum(losses) / len(losses),
            "global_test_accuracy": sum(plains) / len(plains), "worst_client_accuracy": min(accs)}


@pytest.mark.parametrize("eval_clients", [100, 3])
def test_per_client_evaluation_matches_a_loop_over_clients(eval_clients: int) -> None:
    ds, shards = _data(8, per=6, seed=7)
    exp = Experiment(model=Problem(_model(4)), dataset=ds, rule=aggregators.make("mean", f=0), workers=8,
                     byzantine=2, shards=shards, algorithm=FedAvg(clients_per_round=4, local_steps=2, batch_size=4,
                                                                  lr=0.2), rounds=3, seed=1,
                     eval_clients=eval_clients)
    loop = Loop(exp, callbacks=[Evaluate()])
    loop.run()
    norms = local_norms(exp.problem)
    table = loop.state.own["local_norms"]
    assert norms is not None and table is not None
    assert len({tuple(r.tolist()) for r in table[:6]}) > 2  # clients with rows of their own
    clients = norms.evaluated_clients(6, eval_clients).tolist()
    assert clients == ([0, 1, 2, 3, 4, 5] if eval_clients == 100 else [0, 2, 5])
    got = norms.metrics(exp, loop.state.theta, table)
    want = _hand_metrics(exp, loop.state.theta, table, clients)
    assert got["clients_evaluated"] == len(clients)
    eps = torch.finfo(torch.float32).eps  # float32 logits, batched (vmap) against one model at a time
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=100 * eps, abs=100 * eps), key
    assert loop.rows[-1]["test_accuracy"] == got["test_accuracy"]  # the metric row's test_accuracy is this one
    # chunking (a few model-sample pairs per call) does not change the scores
    rows = table[torch.tensor(clients)]
    big = norms.class_scores(exp.problem, loop.state.theta, rows, ds.test_x, ds.test_y, 3)
    small = norms.class_scores(exp.problem, loop.state.theta, rows, ds.test_x, ds.test_y, 3, budget=7)
    torch.testing.assert_close(big[0], small[0])
    torch.testing.assert_close(big[1], small[1], rtol=100 * eps, atol=100 * eps * float(big[1].abs().max()))


def test_label_shares_and_the_evaluated_subset() -> None:
    ds, shards = _data(3, per=5)
    exp = Experiment(model=Problem(_model()), dataset=ds, rule=aggregators.make("mean", f=0), workers=3,
                     shards=shards, algorithm=FedAvg(), rounds=1)
    shares = label_shares(exp.data, torch.tensor([2, 0]))
    torch.testing.assert_close(shares[1], torch.bincount(ds.train_y[:5], minlength=3).double() / 5)
    assert torch.allclose(shares.sum(1), torch.ones(2, dtype=torch.float64))
    assert LocalNorms.evaluated_clients(1000, 100).tolist()[:3] == [0, 10, 20]
    assert LocalNorms.evaluated_clients(1000, 100).numel() == 100
    assert LocalNorms.evaluated_clients(1000, 100)[-1] == 999


@pytest.mark.parametrize(("change", "match"), [
    ({"algorithm": "dsgd", "clients_per_round": None, "local_steps": 1},
     "model_params.norm='fedbn' is invalid: allowed 'group' or 'none' with algorithm = 'dsgd'"),
    ({"algorithm": "gossip", "clients_per_round": None, "local_steps": 1, "f": 0, "byzantine": 0,
      "aggregator": "mean", "attack": "none"},
     "model_params.norm='fedbn' is invalid: allowed 'group' or 'none' with algorithm = 'gossip'"),
    ({"engine": "torchrun"}, "model_params.norm='fedbn' is invalid: allowed 'group' or 'none' with engine"),
    ({"model": "mlp", "model_params": {"norm": "fedbn"}},
     "model_params.norm='fedbn' is invalid: allowed a model with BatchNorm layers"),
    ({"model_params": {"channels": [4, 8], "norm": "batch"}, "eval_clients": 10}, "eval_clients=10 is invalid"),
    ({"eval_clients": 0}, "eval_clients"),
])
def test_config_errors(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_config({**FEDBN, **change})


def test_the_objects_api_refuses_fedbn_without_federated_rounds_and_on_client_slots() -> None:
    exp = from_config(make_config(FEDBN))
    with pytest.raises(ConfigError, match="FedBN model"):
        Experiment(model=exp.problem, dataset=exp.dataset, rule=aggregators.make("mean", f=0), workers=4,
                   algorithm=DSGD())
    streams = {k: generator(0, k).get_state() for k in ("batches", "attack", "clients")}
    with pytest.raises(ConfigError, match="engine='torchrun' is invalid: allowed 'simulated' for a FedBN model"):
        exp.algorithm.one_worker(exp, 0, streams, None)
    assert make_config({**FEDBN, "eval_clients": 100}).identity() == make_config(FEDBN).identity()
    assert "eval_clients" in make_config({**FEDBN, "eval_clients": 5}).identity()


def test_resnet20_takes_fedbn_and_no_server_statistics_are_kept() -> None:
    problem = Problem(models.make("resnet20", (3, 8, 8), 4, norm="fedbn"))
    norms = local_norms(problem)
    assert NormStats.of(problem.model) is None and norms is not None
    assert norms.channels == 16 + 2 * 3 * (16 + 32 + 64)
    assert norms.bn_index.numel() == 2 * norms.channels
    assert norms.shared_index.numel() == problem.dim - 2 * norms.channels


@pytest.mark.parametrize("rule", ["fltrust", "cc", "dnc", "signguard", "bucketing(s=2)>cwmed", "nnm>krum"])
def test_rules_with_a_context_or_their_own_draws_run_on_the_shared_coordinates(rule: str) -> None:
    """Centered clipping's centre, FLTrust's reference gradient and the stochastic rules' draws all live on the
    shared coordinates; two rounds give a finite model whose BatchNorm entries did not move."""
    cfg = make_config({**FEDBN, "aggregator": rule, "clients_per_round": 8, "f": 1, "rounds": 2, "eval_every": 2,
                       "attack": "alie", "server_optimizer": "adam", "server_optimizer_params": {"tau": 0.01},
                       "server_lr": 0.01})
    exp = from_config(cfg)
    loop = Loop(exp)
    loop.run()
    norms = local_norms(exp.problem)
    assert norms is not None
    theta = loop.state.theta
    assert bool(torch.isfinite(theta).all())
    assert torch.equal(theta[norms.bn_index], exp.problem.initial_theta()[norms.bn_index])
    assert not torch.equal(theta[norms.shared_index], exp.problem.initial_theta()[norms.shared_index])
