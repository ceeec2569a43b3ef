"""Decentralized SGD over a graph (algorithm Gossip): equal to server DSGD on a complete graph with uniform weights,
the plain step is W @ X̃, Byzantine neighbours' messages differ per receiver, robust gossip survives an attack that
breaks plain gossip, evaluation reports every honest node, and the configurations that are refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phalanx import aggregators, attacks, data, models
from phalanx.decentralized import topology
from phalanx.errors import ConfigError
from phalanx.training import DSGD, Experiment, Loop, run
from phalanx.training.algorithms.gossip import Gossip
from phalanx.training.neighbourhood import closed_neighbourhoods

DS = data.load("digits")


def _model(seed: int = 0) -> torch.nn.Module:
    return models.make("mlp", DS.input_shape, DS.num_classes, generator=torch.Generator().manual_seed(seed),
                       hidden=[16])


def _exp(graph: topology.Graph, rule: str = "mean", f: int = 0, attack: str = "none", byzantine: int = 0,
         rounds: int = 6, **algo: Any) -> Experiment:
    return Experiment(model=_model(), dataset=DS, workers=graph.n, byzantine=byzantine,
                      rule=aggregators.make(rule, f=f), attack=attacks.make(attack), rounds=rounds, lr=1.0,
                      eval_every=rounds, seed=4, algorithm=Gossip(graph=graph, batch_size=8, **algo))


def test_complete_graph_with_uniform_weights_is_server_dsgd() -> None:
    """W = J/n: every node averages every local step, so all nodes hold the server's θ of distributed SGD with the
    same momentum, learning rate and batches."""
    g = topology.make("complete", 6)
    gossip = _exp(g, rounds=5, weights="uniform_neighbour", lr=0.2, momentum=0.5)
    server = Experiment(model=_model(), dataset=DS, workers=6, rule=aggregators.make("mean", f=0), rounds=5,
                        lr=0.2, eval_every=5, seed=4, algorithm=DSGD(batch_size=8, momentum=0.5))
    a, b = Loop(gossip), Loop(server)
    a.run()
    b.run()
    x = a.state.theta
    assert x.shape == (6, gossip.problem.dim)
    tol = 64 * torch.finfo(x.dtype).eps * float(x.abs().max())
    for i in range(6):
        torch.testing.assert_close(x[i], b.state.theta, atol=tol, rtol=0)


def test_the_plain_step_is_the_mixing_matrix_applied_to_the_local_steps() -> None:
    g = topology.make("ring", 7)
    exp = _exp(g, rounds=1, lr=0.1)
    loop = Loop(exp)
    loop.open()
    theta0 = loop.state.theta.clone()
    nodes = loop.transport.workers
    batch_state = nodes.batch_gen.get_state()
    loop.step()
    # the same round by hand: gradients of every node at θ₀ on the same batches, local step, W @ X̃
    from phalanx.training.algorithms.dsgd import worker_batches
    from phalanx.training.streams import restored

    xb, yb = worker_batches(exp.data, exp.attack, workers=7, byzantine=0, batch_size=8,
                            batch_gen=restored(batch_state), attack_gen=torch.Generator())
    g0 = exp.problem.grads(theta0, xb, yb)
    half = theta0 - 0.1 * g0
    want = exp.algorithm.mixing.to(half.dtype) @ half
    tol = 64 * torch.finfo(half.dtype).eps * float(half.abs().max())
    torch.testing.assert_close(loop.state.theta, want, atol=tol, rtol=0)


def test_byzantine_neighbours_send_each_receiver_its_own_attack() -> None:
    """ALIE on a torus: a Byzantine node's messages depend on the receiving node's honest neighbourhood."""
    g = topology.make("torus", 16)
    exp = _exp(g, rule="cwtm", f=1, attack="alie", byzantine=2, rounds=1)
    loop = Loop(exp)
    loop.open()
    got = loop.transport.exchange(loop.state.theta, 0, exp.rule)
    closed = closed_neighbourhoods(g)
    expected = {i for i in range(14) if bool((closed[i] >= 14).any())}
    assert got.messages is not None and set(got.messages) == expected
    for i, msgs in got.messages.items():
        assert msgs.shape == (int((closed[i] >= 14).sum()), exp.problem.dim)
    firsts = [m[0] for m in got.messages.values()]
    assert any(not torch.equal(firsts[0], m) for m in firsts[1:])


def test_robust_gossip_survives_sign_flipping_neighbours_that_break_plain_gossip() -> None:
    g = topology.make("torus", 16)
    plain = run(_exp(g, attack="signflip", byzantine=2, rounds=60, lr=0.1, momentum=0.9))
    robust = run(_exp(g, rule="cwtm", f=1, attack="signflip", byzantine=2, rounds=60, lr=0.1, momentum=0.9))
    clean = run(_exp(g, rounds=60, lr=0.1, momentum=0.9))
    assert clean[-1]["test_accuracy"] > 0.8
    assert robust[-1]["worst_node_accuracy"] > 0.7 > plain[-1]["worst_node_accuracy"]
    for r in (plain[-1], robust[-1], clean[-1]):
        assert {"worst_node_accuracy", "consensus_distance"} <= set(r)
        assert r["worst_node_accuracy"] <= r["test_accuracy"] and r["consensus_distance"] >= 0


def test_refused_configurations() -> None:
    ring = topology.make("ring", 8)
    with pytest.raises(ConfigError, match="workers"):
        Experiment(model=_model(), dataset=DS, workers=9, rule=aggregators.make("mean", f=0),
                   algorithm=Gossip(graph=ring))
    with pytest.raises(ConfigError, match="smallest closed neighbourhood"):  # krum f=1 needs n ≥ 2f + 3 = 5 > 3
        _exp(ring, rule="krum", f=1)
    with pytest.raises(ConfigError, match="f=2 is invalid"):  # f < 3/2 on a ring
        _exp(ring, rule="cwtm", f=2)
    with pytest.raises(ConfigError, match=r"gossip_weights|weights"):
        Gossip(graph=ring, weights="random")


GOSSIP: dict[str, Any] = {
    "algorithm": "gossip", "graph": "torus", "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]},
    "workers": 9, "byzantine": 1, "f": 1, "aggregator": "cwtm", "attack": "alie", "batch_size": 8, "lr": 0.1,
    "momentum": 0.9, "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "seed": 1,
}


def test_a_gossip_run_from_config_resumes_to_the_same_bits(tmp_path: Any) -> None:
    from safetensors.torch import load_file

    from _interrupt import train_interrupted
    from phalanx.experiments import make_config, train

    cfg = make_config(GOSSIP)
    rows = train(cfg, tmp_path / "full")
    assert rows[-1]["algorithm"] == "gossip" and rows[-1]["graph"] == "torus"
    assert {"worst_node_accuracy", "consensus_distance"} <= set(rows[-1])
    part = train_interrupted(cfg, tmp_path / "part", 4)
    train(cfg, part)
    a, b = load_file(str(tmp_path / "full" / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and a["theta"].shape == (9, a["theta"].shape[1]) and "momentum" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(("change", "match"), [
    ({"algorithm": "dsgd"}, "graph='torus' is invalid: allowed its default with algorithm = 'dsgd'"),
    ({"engine": "torchrun", "topology": "server"}, "topology='server' is invalid: allowed 'gossip' with algorithm = "
                                                   "'gossip'"),
    ({"graph": "ring", "aggregator": "krum"}, "graph='ring' is invalid: allowed a graph whose every node has >= 4"),
    ({"graph": "ring", "f": 2}, "graph='ring' is invalid"),
    ({"graph": "moebius"}, "topology"),
    ({"server_momentum": 0.9}, "server_momentum=0.9 is invalid: allowed its default with algorithm = 'gossip'"),
    ({"model": "cnn", "model_params": {"norm": "batch"}}, "model_params.norm='batch' is invalid"),
    ({"workers": 7}, "n"),  # no 2-D torus of 7 nodes
    ({"gossip_weights": "max_degree"}, "weights"),
])
def test_config_errors(change: dict[str, Any], match: str) -> None:
    from phalanx.experiments import make_config
    from phalanx.experiments.build import check_points

    with pytest.raises(ConfigError, match=match):
        check_points([make_config({**GOSSIP, **change})])


def test_the_example_grid_is_valid() -> None:
    from pathlib import Path

    from phalanx.experiments import grid, load_toml
    from phalanx.experiments.build import check_points

    cfgs = grid.configs(load_toml(Path(__file__).resolve().parent.parent / "examples" / "decentralized" /
                                  "gossip.toml"))
    check_points(cfgs)
    assert {c.aggregator for c in cfgs} == {"mean", "cwtm"} and all(c.algorithm == "gossip" for c in cfgs)


def test_a_rule_that_takes_a_centre_gets_the_nodes_own_local_step() -> None:
    """Centered clipping at node i is centred on i's own x̃ᵢ (self-centred clipping); the spy sees every honest
    node's own row as its centre."""
    from phalanx.aggregators.cc import CenteredClipping

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Spy(CenteredClipping):
        def __call__(self, x: torch.Tensor, **context: Any) -> torch.Tensor:
            seen.append((x.clone(), context["center"].clone()))
            return super().__call__(x, **context)

    g = topology.make("ring", 6)
    exp = Experiment(model=_model(), dataset=DS, workers=6, rule=Spy(f=1, tau=0.5), rounds=1, lr=1.0, eval_every=1,
                     algorithm=Gossip(graph=g, batch_size=8, lr=0.1))
    loop = Loop(exp)
    loop.step()
    assert len(seen) == 6
    for rows, centre in seen:
        assert any(torch.equal(centre, r) for r in rows)  # its own x̃ᵢ is among its neighbourhood's rows
