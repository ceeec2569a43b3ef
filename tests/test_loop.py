"""The one loop and its objects: server optimizer from TOML, the server's context for adaptive attacks, stochastic
rules on the server's stream (every rule resumes bit for bit), old run directories, transports that lose workers,
experiments built from objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from _interrupt import train_interrupted
from phalanx import aggregators, attacks, data, models
from phalanx.aggregators.cc import CenteredClipping
from phalanx.errors import ConfigError, WorkersLostError
from phalanx.experiments import from_config, grid, legacy, make_config, store, train
from phalanx.training import (
    SGD,
    BoundRule,
    Callback,
    Evaluate,
    Experiment,
    InProcess,
    Loop,
    Received,
    RoundAborted,
    Snapshot,
    optim,
    run,
)
from phalanx.training.streams import restored

SMALL: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 7, "byzantine": 1, "f": 1,
    "aggregator": "cwtm", "attack": "signflip", "partition": "dirichlet", "alpha": 1.0, "rounds": 12,
    "batch_size": 8, "lr": 0.1, "eval_every": 4, "checkpoint_every": 4, "seed": 3,
}


def interrupted(cfg_data: dict[str, Any], tmp: Path, stop: int) -> Path:
    """A run directory as a run killed after its round-``stop`` checkpoint leaves it."""
    return train_interrupted(make_config(cfg_data), tmp / "part", stop)


def assert_same_run(a: Path, b: Path) -> None:
    ta, tb = load_file(str(a / "checkpoint.safetensors")), load_file(str(b / "checkpoint.safetensors"))
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    assert metrics(a) == metrics(b)


def metrics(d: Path) -> list[tuple[Any, ...]]:
    """The measured values of a run directory's rows (the config columns of a shortened run differ in ``rounds``)."""
    keys = ("round", "test_accuracy", "test_loss", "agg_error", "byz_share", "detection_auc")
    return [tuple(r[k] for k in keys) for r in store.read_rows(d)]


# ---------------------------------------------------------------------------------------------------------------
# every rule resumes bit for bit (stochastic rules draw from the server's checkpointed stream)
# ---------------------------------------------------------------------------------------------------------------

def _spec(name: str) -> str:
    return name if name in aggregators.names("rule") else f"{name}>cwtm"


@pytest.mark.parametrize("name", aggregators.names())
def test_every_registered_rule_resumes_bit_for_bit(name: str, tmp_path: Path) -> None:
    spec = _spec(name)
    if name == "bucketing":
        spec = "bucketing(s=2)>cwtm"
    cfg = {**SMALL, "aggregator": spec, "rounds": 8, "checkpoint_every": 4, "eval_every": 4}
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = interrupted(cfg, tmp_path, 4)
    train(make_config(cfg), part)
    assert_same_run(full, part)


@pytest.mark.parametrize("spec", ["bucketing(s=2)>cwtm", "signguard", "dnc(subsample=100)"])
def test_stochastic_rules_draw_from_the_aggregator_stream(spec: str) -> None:
    """The run's ``aggregator`` stream advances (the rule draws from it, not from its own generator), a checkpoint
    holds it, and the rule's own generator is left alone."""
    exp = from_config(make_config({**SMALL, "aggregator": spec, "rounds": 3}))
    elements = [*getattr(exp.rule, "pre", []), getattr(exp.rule, "rule", exp.rule)]
    own = next(c for c in elements if hasattr(c, "_generator"))
    own_before = own._generator.get_state()
    loop = Loop(exp)
    loop.run()
    fresh = generator_state(exp.seed)
    assert not torch.equal(loop.snapshot().streams["aggregator"], fresh)
    assert torch.equal(own._generator.get_state(), own_before)


def generator_state(seed: int) -> torch.Tensor:
    from phalanx.training.streams import generator

    return generator(seed, "aggregator").get_state()


def test_a_checkpoint_of_the_first_release_resumes(tmp_path: Path) -> None:
    """Run directories written before the aggregator stream and the optimizer state existed (a checkpoint with
    θ, momentum, previous, rng.batches and rng.attack) still resume, to the same end as an uninterrupted run."""
    full = tmp_path / "full"
    train(make_config(SMALL), full)
    part = interrupted(SMALL, tmp_path, 8)
    ckpt = part / "checkpoint.safetensors"
    old = {k: v for k, v in load_file(str(ckpt)).items() if k in ("theta", "momentum", "previous", "rng.batches",
                                                                     "rng.attack")}
    save_file(old, str(ckpt), metadata={"round": "8", "rows": "3"})
    manifest = json.loads((part / "manifest.json").read_text())  # a directory of that release: no digests yet
    del manifest["integrity"], manifest["artifacts"]
    (part / "manifest.json").write_text(json.dumps(manifest))
    train(make_config(SMALL), part)
    got, want = load_file(str(part / "checkpoint.safetensors")), load_file(str(full / "checkpoint.safetensors"))
    assert torch.equal(got["theta"], want["theta"])
    assert metrics(part) == metrics(full)


def test_run_ids_of_existing_configs_are_unchanged() -> None:
    """New keys at their defaults stay out of a run's identity: a config of the first release keeps its run id
    (computed by the first release's code) and so its run directory."""
    base = {k: v for k, v in SMALL.items() if k != "model_params"} | {"workers": 8, "byzantine": 2, "f": 2}
    assert grid.run_id(make_config(base)) == "cwtm_signflip_f2_b2_s3_b502f100fc"
    assert "server_momentum" not in make_config(base).identity()
    moved = make_config({**base, "server_momentum": 0.9})
    assert moved.identity()["server_momentum"] == 0.9 and grid.run_id(moved) != grid.run_id(make_config(base))


# ---------------------------------------------------------------------------------------------------------------
# the server optimizer
# ---------------------------------------------------------------------------------------------------------------

def test_server_momentum_trains_from_toml_and_resumes(tmp_path: Path) -> None:
    toml = tmp_path / "job.toml"
    toml.write_text('dataset = "digits"\nmodel = "mlp"\nworkers = 7\nbyzantine = 1\nf = 1\naggregator = "cwtm"\n'
                    'attack = "alie"\nrounds = 40\neval_every = 20\ncheckpoint_every = 20\nlr = 0.05\n'
                    'server_momentum = 0.9\nseed = 1\n')
    from phalanx.experiments import load_toml

    cfg = make_config(load_toml(toml))
    exp = from_config(cfg)
    assert isinstance(exp.optimizer, SGD) and exp.optimizer.momentum == 0.9
    full = tmp_path / "full"
    rows = train(cfg, full)
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3
    assert "optim.momentum_buffer" in load_file(str(full / "checkpoint.safetensors"))
    plain = train(make_config({**load_toml(toml), "server_momentum": 0.0}))
    assert plain[-1]["test_accuracy"] != rows[-1]["test_accuracy"]  # the optimizer is really in the loop
    d = train_interrupted(cfg, tmp_path / "part", 20)
    train(cfg, d)
    assert_same_run(full, d)


@pytest.mark.parametrize(("change", "match"), [
    ({"server_momentum": 1.0}, "server_momentum"), ({"server_optimizer": "adamw"}, "server_optimizer"),
    ({"server_weight_decay": -1}, "server_weight_decay"),
])
def test_server_optimizer_config_errors(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_config({**SMALL, **change})


def test_server_optimizer_errors_name_the_key_the_config_wrote() -> None:
    """SGD checks its own section (``momentum``, ``nesterov``); the legacy adapter names each parameter by the key
    that set it — the flat ``server_momentum`` or ``server_optimizer_params.<p>`` (an adapter that named them all
    by one spelling fails here; the schema's range refuses a bad flat value before SGD sees it, so the flat name is
    checked on the adapter's own mapping)."""
    with pytest.raises(ConfigError) as api:
        SGD(momentum=1.0)
    assert api.value.parameter == "momentum"
    for params, key in (({"momentum": 1.0}, "server_optimizer_params.momentum"),
                        ({"nesterov": True}, "server_optimizer_params.nesterov")):
        with pytest.raises(ConfigError) as exc:
            make_config({**SMALL, "server_optimizer_params": params})
        assert exc.value.parameter == key and "\n" not in str(exc.value)
    flat = make_config({**SMALL, "server_momentum": 0.5})
    name, section, name_of = legacy.optimizer(flat, decentralized=False)
    assert (name, section) == ("sgd", {"momentum": 0.5, "weight_decay": 0.0})
    assert (name_of("momentum"), name_of("weight_decay")) == ("server_momentum", "server_weight_decay")
    with pytest.raises(ConfigError) as built:  # what the flat key would name if SGD refused its value
        optim.build(name, {**section, "momentum": 1.0}, cast(Any, None), name_of)
    assert built.value.parameter == "server_momentum"
    mixed = make_config({**SMALL, "server_optimizer_params": {"momentum": 0.25}})
    _, section, name_of = legacy.optimizer(mixed, decentralized=False)
    assert section["momentum"] == 0.25 and name_of("momentum") == "server_optimizer_params.momentum"


def test_sgd_state_dict_round_trip_and_nesterov() -> None:
    opt = SGD(momentum=0.5, nesterov=True)
    theta, g = torch.zeros(3), torch.tensor([1.0, 2.0, 3.0])
    t1 = opt.step(theta, g, 0.1)  # u = g; θ − η (g + μ u)
    torch.testing.assert_close(t1, -0.1 * 1.5 * g)
    again = SGD(momentum=0.5, nesterov=True)
    again.load_state_dict(opt.state_dict())
    torch.testing.assert_close(again.step(t1, g, 0.1), opt.step(t1, g, 0.1))
    with pytest.raises(ConfigError, match="nesterov"):
        SGD(nesterov=True)
    with pytest.raises(ConfigError, match="optimizer state"):
        SGD().load_state_dict({"bogus": torch.zeros(1)})


# ---------------------------------------------------------------------------------------------------------------
# the server's context for adaptive attacks
# ---------------------------------------------------------------------------------------------------------------

def test_fltrust_against_the_optimal_attack_trains() -> None:
    rows = train(make_config({**SMALL, "aggregator": "fltrust", "attack": "optimal", "rounds": 20,
                              "eval_every": 10}))
    assert all(r["test_accuracy"] > 0 for r in rows) and rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]


class _RecordingCC(CenteredClipping):
    """Centered clipping that records the centre of every call."""

    name = "cc"  # not registered: used directly

    def __init__(self, f: int = 0, **kw: Any) -> None:
        super().__init__(f, **kw)
        self.centres: list[torch.Tensor | None] = []

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: Any) -> Any:
        self.centres.append(context.get("center"))
        return super()._run(x, want_contributions, **context)


def test_cc_against_the_optimal_attack_uses_the_servers_centre() -> None:
    """Every call the attacker makes in round t sees the centre the server uses in round t (the previous aggregate);
    the server's own call in that round is the last one and sees the same centre."""
    rule = _RecordingCC(f=1, tau=1.0)
    ds = data.load("digits")
    exp = Experiment(model=models.make("mlp", ds.input_shape, ds.num_classes, hidden=(16,)), dataset=ds, rule=rule,
                     workers=7, byzantine=1, attack=attacks.make("optimal", evaluations=4), rounds=3, eval_every=10)
    loop = Loop(exp)
    loop.open()
    for t in range(3):
        before = len(rule.centres)
        previous = loop.state.previous
        loop.step()
        calls = rule.centres[before:]
        assert len(calls) == 6  # 5 candidate factors (4 + ALIE's default) by the attacker, then the server
        for c in calls:
            if t == 0:
                assert c is None
            else:
                assert c is not None and previous is not None and torch.equal(c, previous)


def test_bound_rule_gives_the_attacker_the_servers_draws_without_moving_its_stream() -> None:
    rule = aggregators.make("bucketing(s=2)>cwmed", f=1)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(7, 4)
    bound = BoundRule(rule, {"generator": gen})
    first, second = bound(x), bound(x)
    assert torch.equal(first, second)  # every call from the same state
    assert torch.equal(gen.get_state(), torch.Generator().manual_seed(5).get_state())  # the server's untouched
    assert torch.equal(rule(x, generator=gen), first)  # the server then draws exactly that
    rebuilt = BoundRule.from_payload(rule, bound.payload())
    assert torch.equal(rebuilt(x), first)
    assert torch.equal(restored(bound.payload()["generator"]).get_state(), bound.generator_state)


# ---------------------------------------------------------------------------------------------------------------
# transports that lose workers, callbacks
# ---------------------------------------------------------------------------------------------------------------

class _Dropping(InProcess):
    """In-process, but the vectors of ``lost`` never arrive from round ``after`` on. It delivers copies of the
    workers' buffer (which the in-process transport updates in place), so that the state at the start of a round it
    gives up is intact."""

    round_timeout = 1.0

    def __init__(self, lost: list[int], after: int) -> None:
        super().__init__()
        self.lost, self.after = lost, after

    def exchange(self, theta: torch.Tensor, t: int, rule: BoundRule) -> Received:
        got = super().exchange(theta, t, rule)
        if t < self.after:
            return Received(got.vectors.clone())
        keep = [r for r in range(got.vectors.shape[0]) if r not in self.lost]
        if len(self.lost) > 2:
            raise RoundAborted(self.lost, "the network is down")
        return Received(got.vectors[keep].clone(), keep, list(self.lost))


class _Keep(Callback):
    def __init__(self) -> None:
        self.aborted: list[Snapshot] = []
        self.missing: list[list[int]] = []

    def on_round(self, loop: Loop, info: Any) -> None:
        self.missing.append(info.missing)

    def on_abort(self, loop: Loop, snapshot: Snapshot) -> str | None:
        self.aborted.append(snapshot)
        return "/nowhere/checkpoint"


def test_missing_workers_count_against_f_and_too_many_stop_the_run() -> None:
    exp = from_config(make_config({**SMALL, "f": 2, "byzantine": 0, "attack": "none", "rounds": 6}))
    keep = _Keep()
    loop = Loop(exp, _Dropping([5], after=2), [Evaluate(), keep])
    loop.run()
    assert keep.missing == [[]] * 2 + [[5]] * 4
    assert 1 in loop.server._for_missing._rules  # aggregated with f − 1
    assert loop.state.momentum is not None and loop.state.momentum.shape[0] == 7  # every worker's row kept
    keep = _Keep()
    loop = Loop(exp, _Dropping([1, 2, 3], after=3), [Evaluate(), keep])
    with pytest.raises(WorkersLostError, match=r"round 3: 3 worker\(s\) missing .*network is down.*nowhere"):
        loop.run()
    assert [s.state.round for s in keep.aborted] == [3] and loop.state.round == 3
    keep = _Keep()
    with pytest.raises(WorkersLostError, match=r"round 1: 3 worker\(s\) missing.*more than f=2"):
        Loop(exp, _Dropping([0, 1, 2], after=1), [keep]).run()  # 3 > f, the server gives the round up
    # the abort snapshot holds the streams of the start of the round: resuming from it repeats the round exactly
    resumed = Loop(exp, None, [], start=keep.aborted[0])
    resumed.run()
    straight = Loop(from_config(make_config({**SMALL, "f": 2, "byzantine": 0, "attack": "none", "rounds": 6})))
    straight.run()
    assert torch.equal(resumed.state.theta, straight.state.theta)


# ---------------------------------------------------------------------------------------------------------------
# objects, not names
# ---------------------------------------------------------------------------------------------------------------

def test_an_experiment_of_objects_with_its_own_loss_trains(tmp_path: Path) -> None:
    ds = data.load("digits")
    model = models.make("mlp", ds.input_shape, ds.num_classes, generator=torch.Generator().manual_seed(0))

    def smoothed(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, y, label_smoothing=0.1)

    exp = Experiment(model=model, dataset=ds, rule=aggregators.make("nnm>cwtm", f=2), workers=10, byzantine=2,
                     attack=attacks.make("alie"), rounds=40, eval_every=20, loss=smoothed, lr=0.1,
                     optimizer=SGD(momentum=0.5))
    assert exp.problem.stack is None  # a loss of the user's own: the generic per-worker path
    rows = run(exp)
    assert [r["round"] for r in rows] == [0, 20, 40] and rows[-1]["test_accuracy"] > 0.6
    assert train(exp, tmp_path / "run") == rows  # train() takes objects too, into a run directory
    assert json.loads((tmp_path / "run" / "config.json").read_text())["rule"].startswith("Chain(")


@pytest.mark.parametrize(("kw", "match"), [
    ({"workers": 4, "rule": "cwtm"}, "rule"),
    ({"byzantine": 4}, "byzantine"),
    ({"rule": aggregators.make("cwtm", f=2), "workers": 4}, "f"),
    ({"rule": aggregators.make("krum", f=1), "workers": 3}, "workers"),
    ({"shards": [torch.arange(3)]}, "shards"),
    ({"lr": "fast"}, "lr"),
    ({"rounds": 0}, "rounds"),
])
def test_experiment_errors_name_the_parameter(kw: dict[str, Any], match: str) -> None:
    ds = data.load("digits")
    base: dict[str, Any] = {"model": models.make("logreg", ds.input_shape, ds.num_classes), "dataset": ds,
                            "rule": aggregators.make("cwtm", f=1), "workers": 4}
    with pytest.raises(ConfigError, match=match):
        Experiment(**{**base, **kw})


def test_the_default_loss_keeps_the_fast_path() -> None:
    """A config's default loss (cross-entropy, by name) keeps the MLP's explicit back-propagation; a loss of one's
    own takes the generic per-worker path."""
    assert from_config(make_config(SMALL)).problem.stack is not None
    ds = data.load("digits")
    own = Experiment(model=models.make("mlp", ds.input_shape, ds.num_classes), dataset=ds,
                     rule=aggregators.make("cwtm", f=1), workers=4, loss=lambda z, y: F.cross_entropy(z, y))
    assert own.problem.stack is None
