"""MoNNA's nearest-neighbour averaging as a robust gossip rule (``monna``): hand computations with equal and unequal
weights, the paper's rule (the n − f nearest, averaged) on the complete graph and the d + 1 − f nearest on a regular
graph, plain gossip for f = 0, the batched step against node-by-node calls, NaN/Inf/huge rows, the refused
configurations, the registry and short runs through the config path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from phalanx import attacks, cli, data, models
from phalanx.decentralized import gossip, robust_gossip, topology
from phalanx.errors import ConfigError
from phalanx.training import Experiment, Loop
from phalanx.training.algorithms.gossip import Gossip
from phalanx.training.neighbourhood import Neighbourhoods, closed_neighbourhoods

EPS64 = torch.finfo(torch.float64).eps


def _tol(x: torch.Tensor, ops: int = 64) -> float:
    """A sum of ``ops`` rounded terms of magnitude up to max |x|."""
    return ops * torch.finfo(x.dtype).eps * max(1.0, float(x.abs().max()))


def _star5() -> tuple[torch.Tensor, torch.Tensor]:
    """Node 0 and its 4 neighbours (K5, every weight 1/5): own x₀ = 0, the others at distances 1, 2, 3, 4."""
    x = torch.tensor([[0.0, 0], [1, 0], [0, 2], [3, 0], [0, -4]], dtype=torch.float64)
    return x, torch.full((5,), 0.2, dtype=torch.float64)


def _nna(rows: torch.Tensor, own: int, keep: int) -> torch.Tensor:
    """The paper's Nearest-Neighbour Averaging: the uniform mean of the ``keep`` rows nearest to row ``own`` (the
    node itself first among equal distances)."""
    d = (rows - rows[own]).norm(dim=1)
    d[own] = -1.0
    return rows[torch.argsort(d, stable=True)[:keep]].mean(0)


def _combine(graph: topology.Graph, w: torch.Tensor, x: torch.Tensor, h: int, f: int,
             messages: dict[int, torch.Tensor]) -> torch.Tensor:
    """The batched MoNNA step of the honest nodes 0 … h − 1 (``x``: every node's row, the Byzantine ones unused)."""
    hoods = Neighbourhoods(graph, w, honest=h, f=f)
    nodes = torch.arange(h)
    return robust_gossip.make("monna", f).combine(x[:h], hoods.rows(x, nodes, messages), hoods.weights[:h],
                                                  hoods.own[:h], hoods.tolerated[:h])


def _messages(graph: topology.Graph, h: int, d: int, gen: torch.Generator,
              scale: float = 5.0) -> dict[int, torch.Tensor]:
    closed = closed_neighbourhoods(graph)
    return {i: scale * torch.randn(int((closed[i] >= h).sum()), d, dtype=torch.float64, generator=gen)
            for i in range(h) if bool((closed[i] >= h).any())}


def _received(graph: topology.Graph, x: torch.Tensor, h: int, i: int,
              messages: dict[int, torch.Tensor]) -> torch.Tensor:
    """What honest node i holds: its closed neighbourhood's honest rows in index order, then its messages."""
    hood = closed_neighbourhoods(graph)[i]
    return x[hood] if i not in messages else torch.cat([x[hood[hood < h]], messages[i]])


# ------------------------------------------------------------------------------------------------------- by hand


def test_monna_by_hand_with_equal_weights() -> None:
    """Weights 1/5: f = 1 keeps the 4 nearest (0, 1, 2, 3), f = 2 the 3 nearest, each with share 1/kept."""
    x, w = _star5()
    rule = robust_gossip.make("monna", 1)
    out, share = rule.aggregate(x, own=0, weights=w)
    torch.testing.assert_close(out, x[:4].mean(0), atol=_tol(x), rtol=0)
    torch.testing.assert_close(share, torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0], dtype=torch.float64),
                               atol=16 * EPS64, rtol=0)
    out2, share2 = robust_gossip.make("monna", 2).aggregate(x, own=0, weights=w)
    torch.testing.assert_close(out2, x[:3].mean(0), atol=_tol(x), rtol=0)
    assert float(share2[3]) == 0.0 and float(share2[4]) == 0.0
    # the default weights are 1/n: the same rule
    torch.testing.assert_close(rule(x, own=0), out, atol=_tol(x), rtol=0)
    # the centre is the node's own row, not row 0: around x₂ = (0, 2) the farthest is x₄ = (0, −4)
    torch.testing.assert_close(rule(x, own=2, weights=w), x[:4].mean(0), atol=_tol(x), rtol=0)
    # around x₄ the farthest is x₂ (distance 6 > 5 = ‖x₄ − x₃‖)
    torch.testing.assert_close(rule(x, own=4, weights=w), x[[0, 1, 3, 4]].mean(0), atol=_tol(x), rtol=0)


def test_monna_with_unequal_weights_keeps_exactly_the_weight_total_minus_b() -> None:
    """Weights (self first) 0.3, 0.2, 0.1, 0.3, 0.1 at distances 0, 1, 2, 3, 4, f = 1: b = 0.3 (the largest
    neighbour weight), keep 1 − 0.3 = 0.7: 0.3 + 0.2 + 0.1 = 0.6, then 0.1 of the 0.3 at distance 3 (it straddles
    the bound), nothing of distance 4; renormalised by 0.7."""
    x, _ = _star5()
    w = torch.tensor([0.3, 0.2, 0.1, 0.3, 0.1], dtype=torch.float64)
    out, share = robust_gossip.make("monna", 1).aggregate(x, own=0, weights=w)
    want = torch.tensor([0.3, 0.2, 0.1, 0.1, 0.0], dtype=torch.float64) / 0.7
    torch.testing.assert_close(share, want, atol=64 * EPS64, rtol=0)
    torch.testing.assert_close(out, want @ x, atol=_tol(x), rtol=0)
    # whole candidates when the bound falls between them: 0.4, 0.1, 0.2, 0.1, 0.2 → b = 0.2, keep 0.8 = 0.4 + 0.1 +
    # 0.2 + 0.1, drop the 0.2 at distance 4
    w2 = torch.tensor([0.4, 0.1, 0.2, 0.1, 0.2], dtype=torch.float64)
    out2 = robust_gossip.make("monna", 1)(x, own=0, weights=w2)
    torch.testing.assert_close(out2, (w2[:4] @ x[:4]) / 0.8, atol=_tol(x), rtol=0)


def test_a_far_byzantine_row_gets_no_share_however_far() -> None:
    x, w = _star5()
    y = x.clone()
    outs = []
    for far in (10.0, 1e3, 1e30):
        y[4] = torch.tensor([far, -far], dtype=torch.float64)
        out, share = robust_gossip.make("monna", 1).aggregate(y, own=0, weights=w)
        assert float(share[4]) == 0.0
        outs.append(out)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    torch.testing.assert_close(outs[0], x[:4].mean(0), atol=_tol(x), rtol=0)


def test_the_order_of_the_neighbours_does_not_matter() -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(7, 5, dtype=torch.float64, generator=gen)
    w = torch.softmax(torch.randn(7, dtype=torch.float64, generator=gen), 0)
    rule = robust_gossip.make("monna", 2)
    base = rule(x, own=0, weights=w)
    for _ in range(3):
        perm = torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.randperm(6, generator=gen)])
        torch.testing.assert_close(rule(x[perm], own=0, weights=w[perm]), base, atol=_tol(x), rtol=0)


# ------------------------------------------------------------------------------------- the paper's rule, exactly


@pytest.mark.parametrize("f", [1, 2, 3])
@pytest.mark.parametrize("weights", ["metropolis_hastings", "uniform_neighbour"])
def test_on_the_complete_graph_monna_is_the_papers_nna(f: int, weights: str) -> None:
    """K7 with W = J/7, 5 honest nodes and 2 Byzantine ones sending each honest node its own vectors: every honest
    node ends at the uniform mean of the n − f vectors nearest to its own (its own included)."""
    g = topology.make("complete", 7)
    w = gossip.weights(weights, g, torch.float64)
    gen = torch.Generator().manual_seed(f)
    x = torch.randn(7, 6, dtype=torch.float64, generator=gen)
    h = 5
    messages = _messages(g, h, 6, gen, scale=1.5)  # near enough that some are kept
    out = _combine(g, w, x, h, f, messages)
    kept_byzantine = 0
    for i in range(h):
        rows = _received(g, x, h, i, messages)
        want = _nna(rows, i, 7 - f)
        torch.testing.assert_close(out[i], want, atol=_tol(rows), rtol=0)
        d = (rows - rows[i]).norm(dim=1)
        kept_byzantine += int((d[h:] < torch.sort(d).values[7 - f - 1] + 1e-12).sum())
    if f == 1:
        assert kept_byzantine > 0  # the messages were not all trivially far


def test_on_a_regular_graph_monna_keeps_the_d_plus_1_minus_f_nearest() -> None:
    """A 3 × 3 torus (degree 4, every MH weight 1/5), node 8 Byzantine: f = 1 keeps the 4 nearest of 5, f = 2 the 3
    nearest, averaged with equal weights."""
    g = topology.make("torus", 9)
    w = gossip.metropolis_hastings(g, torch.float64)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(9, 4, dtype=torch.float64, generator=gen)
    h = 8
    messages = _messages(g, h, 4, gen, scale=1.0)
    closed = closed_neighbourhoods(g)
    for f in (1, 2):
        out = _combine(g, w, x, h, f, messages)
        for i in range(h):
            rows = _received(g, x, h, i, messages)
            own = int(torch.nonzero(closed[i] == i)[0])  # i's row among the honest ones, in index order
            torch.testing.assert_close(out[i], _nna(rows, own, 5 - f), atol=_tol(rows), rtol=0)


@pytest.mark.parametrize("weights", ["metropolis_hastings", "uniform_neighbour"])
def test_with_f0_monna_is_plain_gossip_on_an_irregular_graph(weights: str) -> None:
    g = topology.make("erdos_renyi", 12, p=0.35, seed=2)
    w = gossip.weights(weights, g, torch.float64)
    assert int(g.degrees.min()) < int(g.degrees.max())
    x = torch.randn(12, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = _combine(g, w, x, 12, 0, {})
    torch.testing.assert_close(out, w @ x, atol=_tol(x), rtol=0)


def test_the_batched_step_equals_node_by_node_calls_with_unequal_weights() -> None:
    """Irregular graph, MH weights (unequal within a row), f = 2, Byzantine messages: batched = one call per node."""
    g = topology.make("erdos_renyi", 14, p=0.5, seed=3)
    w = gossip.metropolis_hastings(g, torch.float64)
    assert int(g.degrees.min()) >= 4
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(14, 6, dtype=torch.float64, generator=gen)
    h = 12
    messages = _messages(g, h, 6, gen, scale=2.0)
    out = _combine(g, w, x, h, 2, messages)
    closed = closed_neighbourhoods(g)
    rule = robust_gossip.make("monna", 2)
    for i in range(h):
        hood = closed[i]
        rows = _received(g, x, h, i, messages)
        alone = rule(rows, own=int(torch.nonzero(hood == i)[0]), weights=w[i, hood])
        torch.testing.assert_close(out[i], alone, atol=_tol(rows, 1024), rtol=0)


# --------------------------------------------------------------------------------------------- Byzantine values


@pytest.mark.parametrize("bad", [(float("nan"), float("inf")), (-float("inf"), 1e308), (float("nan"), 1e308)])
def test_up_to_f_bad_rows_are_dropped(bad: tuple[float, float]) -> None:
    """K6 around x₀ with two bad rows and f = 2: they count as infinitely far, so the result is the mean of the
    6 − 2 = 4 finite rows (the nearest)."""
    x, _ = _star5()
    y = torch.cat([x, torch.zeros(1, 2, dtype=torch.float64)])
    y[4], y[5] = bad
    w = torch.full((6,), 1 / 6, dtype=torch.float64)
    out, share = robust_gossip.make("monna", 2).aggregate(y, own=0, weights=w)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out, x[:4].mean(0), atol=_tol(x), rtol=0)
    assert float(share[4]) == 0.0 and float(share[5]) == 0.0
    # one bad row with f = 1 on K5
    for b in bad:
        z = x.clone()
        z[4] = b
        one = robust_gossip.make("monna", 1)(z, own=0, weights=w[:5] * 6 / 5)
        torch.testing.assert_close(one, x[:4].mean(0), atol=_tol(x), rtol=0)


def test_a_row_whose_squared_norm_overflows_float32_is_bad() -> None:
    x, w = _star5()
    y = x.to(torch.float32)
    y[4] = 1e38
    out = robust_gossip.make("monna", 1)(y, own=0, weights=w)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out, x[:4].mean(0).float(), atol=_tol(y), rtol=0)


def test_with_f0_a_nan_neighbour_propagates_as_in_plain_gossip() -> None:
    x, w = _star5()
    x[4] = float("nan")
    assert bool(torch.isnan(robust_gossip.make("monna", 0)(x, own=0, weights=w)).all())


# ------------------------------------------------------------------------------------------------------ refusals


def test_refused_configurations() -> None:
    with pytest.raises(ConfigError, match=r"f=2 is invalid: .*monna with f=2.*node 0 has degree 2") as err:
        robust_gossip.make("monna", 2).check_graph(topology.make("ring", 6))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"f=1 is invalid: .*node 1 has degree 1"):
        robust_gossip.make("monna", 1).check_graph(topology.make("star", 6))
    robust_gossip.make("monna", 1).check_graph(topology.make("ring", 6))  # 3 = 2f + 1 vectors: enough
    with pytest.raises(ConfigError, match=r"n=4 is invalid: .*n >= 5 for monna with f=2"):
        robust_gossip.make("monna", 2)(torch.zeros(4, 2), own=0)
    with pytest.raises(ConfigError, match="rule='monna' is invalid"):  # no own row: not at a node
        robust_gossip.make("monna", 1)(torch.zeros(5, 2))
    with pytest.raises(ConfigError, match="aggregator='nnm>monna' is invalid"):
        robust_gossip.make("nnm>monna", 1)
    with pytest.raises(ConfigError, match="monna"):
        robust_gossip.make("monna", 1, k=3)
    with pytest.raises(ConfigError, match="f=-1 is invalid"):
        robust_gossip.make("monna", -1)


# ------------------------------------------------------------------------------------------ registry and runs

GOSSIP: dict[str, Any] = {
    "algorithm": "gossip", "graph": "torus", "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]},
    "workers": 9, "byzantine": 1, "f": 1, "aggregator": "monna", "attack": "dissensus", "batch_size": 8, "lr": 0.1,
    "momentum": 0.9, "rounds": 8, "eval_every": 4, "seed": 1,
}


def test_monna_is_registered_and_listed() -> None:
    assert "monna" in robust_gossip.names()
    assert robust_gossip.get_class("monna") is robust_gossip.MoNNA
    assert robust_gossip.is_gossip_rule("monna")
    rule = robust_gossip.make("monna", 1)
    assert rule.min_workers() == 3 and rule.params() == {"f": 1}
    assert "arXiv 2209.10931" in rule.reference
    res = CliRunner().invoke(cli.app, ["list", "aggregators"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert any(line.split("│")[1].strip() == "monna" for line in res.output.splitlines() if line.count("│") > 2)


@pytest.mark.parametrize("attack", ["dissensus", "spectral", "alie"])
def test_runs_from_config(attack: str, tmp_path: Path) -> None:
    from phalanx.experiments import make_config, train

    rows = train(make_config({**GOSSIP, "attack": attack}), tmp_path)
    assert rows[-1]["aggregator"] == "monna" and rows[-1]["attack"] == attack
    assert rows[-1]["consensus_distance"] >= 0 and 0.0 <= rows[-1]["worst_node_accuracy"] <= 1.0


def test_monna_keeps_honest_nodes_bounded_where_plain_gossip_blows_up() -> None:
    ds = data.load("digits")
    g = topology.make("torus", 9)

    def loop(rule: str, f: int) -> Loop:
        model = models.make("mlp", ds.input_shape, ds.num_classes, generator=torch.Generator().manual_seed(0),
                            hidden=[16])
        r = robust_gossip.make(rule, f) if rule == "monna" else robust_gossip.configured(rule, f, "gossip", True)
        return Loop(Experiment(model=model, dataset=ds, workers=9, byzantine=1, rule=r,
                               attack=attacks.make("gaussian", sigma=1e4), rounds=8, lr=1.0, eval_every=8, seed=3,
                               algorithm=Gossip(graph=g, batch_size=8, lr=0.1)))

    plain, robust = loop("mean", 0), loop("monna", 1)
    start = float(plain.experiment.problem.initial_theta().abs().max())
    plain.run()
    robust.run()
    assert float(plain.state.theta[:8].abs().max()) > 1e3 * start
    assert float(robust.state.theta[:8].abs().max()) < 10 * start
