"""Decentralized Anytime SGD (algorithm AnytimeGossip): one round is the paper's recursion written by hand, a
complete graph with W = J/n is centralized Anytime SGD, both sequences survive a checkpoint bit for bit, robust rules
and attacks see the pair [w | x], and the configurations that are refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phalanx import attacks, data, models
from phalanx.decentralized import robust_gossip, topology
from phalanx.errors import ConfigError
from phalanx.training import Experiment, Loop
from phalanx.training.algorithms.dsgd import worker_batches
from phalanx.training.algorithms.gossip import AnytimeGossip
from phalanx.training.streams import restored

DS = data.load("digits")


def _exp(graph: topology.Graph, rule: str = "mean", f: int = 0, attack: str = "none", byzantine: int = 0,
         rounds: int = 4, **algo: Any) -> Experiment:
    model = models.make("logreg", DS.input_shape, DS.num_classes, generator=torch.Generator().manual_seed(0))
    return Experiment(model=model, dataset=DS, workers=graph.n, byzantine=byzantine,
                      rule=robust_gossip.configured(rule, f, "anytime", True), attack=attacks.make(attack),
                      rounds=rounds,
                      lr=1.0, eval_every=rounds, seed=3, algorithm=AnytimeGossip(graph=graph, batch_size=8, **algo))


def _tol(x: torch.Tensor, ops: int = 64) -> float:
    return ops * torch.finfo(x.dtype).eps * max(1.0, float(x.abs().max()))


def test_rounds_follow_the_anytime_recursion_with_both_sequences_gossiped() -> None:
    """Three rounds on a ring, recomputed by hand: g at the query point x, w̃ = w − η t g, x̃ = x + 2/(t+1)(w̃ − x),
    then W applied to both."""
    g = topology.make("ring", 5)
    eta = 0.01
    exp = _exp(g, rounds=3, lr=eta)
    loop = Loop(exp)
    loop.open()
    x = loop.state.theta.expand(5, -1).clone()
    w = x.clone()
    batches = restored(loop.transport.workers.batch_gen.get_state())
    mix = exp.algorithm.mixing.to(x.dtype)
    for t in range(1, 4):
        loop.step()
        xb, yb = worker_batches(exp.data, exp.attack, workers=5, byzantine=0, batch_size=8, batch_gen=batches,
                                attack_gen=torch.Generator())
        grads = exp.problem.grads_each(x, xb, yb)
        w_half = w - eta * t * grads
        x_half = x + (2.0 / (t + 1)) * (w_half - x)
        w, x = mix @ w_half, mix @ x_half
        torch.testing.assert_close(loop.state.theta, x, atol=_tol(x), rtol=0)
        torch.testing.assert_close(loop.state.momentum, w, atol=_tol(w), rtol=0)
    # round 1 puts x̃ on w̃ (α₁/α₁:₁ = 1); later rounds average: x and w part ways
    assert not torch.allclose(loop.state.theta, loop.state.momentum)


def test_complete_graph_with_uniform_weights_is_centralized_anytime_sgd() -> None:
    """W = J/n: all nodes hold the same (w, x) every round — Anytime SGD on the average of the n gradients."""
    g = topology.make("complete", 4)
    exp = _exp(g, rounds=3, lr=0.02, weights="uniform_neighbour")
    loop = Loop(exp)
    loop.run()
    x, w = loop.state.theta, loop.state.momentum
    for rows in (x, w):
        torch.testing.assert_close(rows, rows[:1].expand_as(rows), atol=_tol(rows), rtol=0)


def test_a_robust_rule_with_f_0_is_plain_gossip_on_both_sequences() -> None:
    g = topology.make("torus", 9)
    plain, clipped = Loop(_exp(g, lr=0.01)), Loop(_exp(g, rule="clipped_gossip", lr=0.01))
    plain.run()
    clipped.run()
    for a, b in ((plain.state.theta, clipped.state.theta), (plain.state.momentum, clipped.state.momentum)):
        torch.testing.assert_close(a, b, atol=_tol(a, 256), rtol=0)


def test_byzantine_neighbours_attack_the_pair_and_a_robust_rule_holds() -> None:
    """Sign-flipping neighbours wreck plain anytime gossip; the trimmed mean over each neighbourhood keeps the honest
    nodes' query points near the attack-free run."""
    g = topology.make("torus", 9)
    clean = Loop(_exp(g, rule="cwtm", f=1, rounds=6, lr=0.01))
    attacked = Loop(_exp(g, rule="cwtm", f=1, attack="signflip", byzantine=1, rounds=6, lr=0.01))
    broken = Loop(_exp(g, rule="mean", attack="signflip", byzantine=1, rounds=6, lr=0.01))
    for loop in (clean, attacked, broken):
        loop.run()
    honest = 8
    ref = clean.state.theta[:honest]
    robust_gap = float((attacked.state.theta[:honest] - ref).norm())
    plain_gap = float((broken.state.theta[:honest] - ref).norm())
    assert robust_gap < plain_gap / 2


ANYTIME = {
    "algorithm": "anytime", "graph": "torus", "workers": 9, "dataset": "digits", "model": "logreg",
    "aggregator": "mean", "batch_size": 8, "lr": 0.005, "momentum": 0.0, "rounds": 8, "eval_every": 4,
    "checkpoint_every": 4, "seed": 1,
}


def test_an_anytime_run_from_config_resumes_to_the_same_bits(tmp_path: Any) -> None:
    from safetensors.torch import load_file

    from _interrupt import train_interrupted
    from phalanx.experiments import make_config, train

    cfg = make_config(ANYTIME)
    rows = train(cfg, tmp_path / "full")
    assert rows[-1]["algorithm"] == "anytime" and rows[-1]["graph"] == "torus"
    assert {"worst_node_accuracy", "consensus_distance"} <= set(rows[-1])
    part = train_interrupted(cfg, tmp_path / "part", 4)
    train(cfg, part)
    a, b = load_file(str(tmp_path / "full" / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and "momentum" in a  # the iterates w travel in the nodes' carried state
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(("change", "match"), [
    ({"momentum": 0.9}, "momentum=0.9 is invalid: allowed 0 with algorithm = 'anytime'"),
    ({"engine": "torchrun", "topology": "server"}, "topology='server' is invalid: allowed 'gossip' with algorithm = "
                                                   "'anytime'"),
    ({"server_momentum": 0.9}, "server_momentum=0.9 is invalid: allowed its default with algorithm = 'anytime'"),
    ({"graph": "ring", "aggregator": "krum", "f": 1}, "graph='ring' is invalid"),
])
def test_config_errors(change: dict[str, Any], match: str) -> None:
    from phalanx.experiments import make_config
    from phalanx.experiments.build import check_points

    with pytest.raises(ConfigError, match=match):
        check_points([make_config({**ANYTIME, **change})])


def test_decentralized_rules_and_attacks_are_accepted_with_anytime() -> None:
    from phalanx.experiments import make_config

    for change in ({"aggregator": "cs_plus", "f": 1, "byzantine": 1, "attack": "dissensus"},
                   {"aggregator": "ios", "f": 1, "byzantine": 1, "attack": "spectral"}):
        make_config({**ANYTIME, **change})


def test_the_api_refuses_momentum() -> None:
    with pytest.raises(ConfigError, match="momentum"):
        AnytimeGossip(graph=topology.make("ring", 4), momentum=0.5)


def test_the_example_grid_is_valid() -> None:
    from pathlib import Path

    from phalanx.experiments import grid, load_toml
    from phalanx.experiments.build import check_points

    cfgs = grid.configs(load_toml(Path(__file__).resolve().parent.parent / "examples" / "decentralized" /
                                  "anytime.toml"))
    check_points(cfgs)
    assert {(c.algorithm, c.lr) for c in cfgs} == {("gossip", 0.8), ("anytime", 0.016)} and len(cfgs) == 6
