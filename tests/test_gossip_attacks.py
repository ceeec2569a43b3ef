"""Decentralized attacks (dissensus, spectral) and robust gossip rules (clipped_gossip, cs_plus, ios): the formulas
against hand computations on tiny graphs, the batched combination against node-by-node calls, what they do to a
gossip round, survival of NaN/Inf/huge Byzantine values, the configurations that are refused, and short runs through
the config path."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from phalanx import aggregators, attacks, data, models
from phalanx.decentralized import gossip, gossip_attacks, robust_gossip, topology
from phalanx.decentralized.gossip_attacks import GossipView
from phalanx.errors import ConfigError
from phalanx.training import DSGD, Experiment, Loop, run
from phalanx.training.algorithms.gossip import Gossip
from phalanx.training.neighbourhood import Neighbourhoods, closed_neighbourhoods

DS = data.load("digits")
RULES = robust_gossip.names()
EPS64 = torch.finfo(torch.float64).eps


def _model() -> torch.nn.Module:
    return models.make("mlp", DS.input_shape, DS.num_classes, generator=torch.Generator().manual_seed(0), hidden=[16])


def _exp(graph: topology.Graph, rule: Any = "mean", f: int = 0, attack: Any = "none", byzantine: int = 0,
         rounds: int = 6, **algo: Any) -> Experiment:
    r = robust_gossip.make(rule, f) if rule in RULES else aggregators.make(rule, f=f) if isinstance(rule, str) else rule
    a = gossip_attacks.make(attack) if attack in gossip_attacks.names() else \
        attacks.make(attack) if isinstance(attack, str) else attack
    return Experiment(model=_model(), dataset=DS, workers=graph.n, byzantine=byzantine, rule=r, attack=a,
                      rounds=rounds, lr=1.0, eval_every=rounds, seed=3, algorithm=Gossip(graph=graph, batch_size=8,
                                                                                         **algo))


def _ring5() -> tuple[topology.Graph, torch.Tensor, torch.Tensor]:
    """A 5-node ring (node 4 Byzantine, neighbours 0 and 3): every MH weight is 1/3; honest X̃ (4, 3)."""
    g = topology.make("ring", 5)
    w = gossip.metropolis_hastings(g, torch.float64)
    x = torch.tensor([[0.0, 1, 2], [1, -1, 0], [3, 0, 1], [-2, 2, 5]], dtype=torch.float64)
    return g, w, x


# ----------------------------------------------------------------------------------------------- attacks, by hand


def test_dissensus_on_a_ring_by_hand() -> None:
    _, w, x = _ring5()
    view = GossipView(honest=x, mixing=w, targets=torch.tensor([0, 3]))
    # target 0: honest neighbour 1, Byzantine 4, all weights 1/3: progress (x1 − x0)/3, δ = 1/3
    for eps in (1.0, 1.5):
        got = gossip_attacks.make("dissensus", eps=eps).messages(view)
        want = torch.stack([x[0] - eps * (x[1] - x[0]), x[3] - eps * (x[2] - x[3])])
        torch.testing.assert_close(got, want, atol=16 * EPS64 * 10, rtol=0)
    torch.testing.assert_close(view.byzantine_weight(), torch.tensor([1 / 3, 1 / 3], dtype=torch.float64))


def test_the_fiedler_vector_of_a_path_is_its_closed_form() -> None:
    """Without node 4 the honest ring is the path 0–1–2–3 with weights 1/3: L = (1/3)·L_path, whose Fiedler vector
    is uₖ ∝ cos(π(2k + 1)/8) (the path's Laplacian eigenvectors); the sign makes u₀ > 0."""
    _, w, _ = _ring5()
    u = gossip_attacks.fiedler_vector(w, 4)
    want = torch.tensor([math.cos(math.pi * (2 * k + 1) / 8) for k in range(4)], dtype=torch.float64)
    torch.testing.assert_close(u, want / want.norm(), atol=64 * EPS64, rtol=0)
    assert float(u[0]) > 0


def test_spectral_messages_point_along_the_fiedler_vector() -> None:
    _, w, x = _ring5()
    u = gossip_attacks.fiedler_vector(w, 4)
    view = GossipView(honest=x, mixing=w, targets=torch.tensor([0, 3]))
    got = gossip_attacks.make("spectral", scale=2.5).messages(view)
    s = u @ x  # uᵀX̃
    want = torch.stack([x[0] + 2.5 * u[0] * s, x[3] + 2.5 * u[3] * s])
    torch.testing.assert_close(got, want, atol=64 * EPS64 * float(x.abs().max()), rtol=0)
    d = got - x[[0, 3]]
    cos = float(d[0] @ d[1] / (d[0].norm() * d[1].norm()))
    assert cos == pytest.approx(-1.0)  # targets on both sides of the cut are pushed apart (u₀ > 0 > u₃)


def test_spectral_search_takes_the_scale_that_moves_each_target_farthest() -> None:
    _, w, x = _ring5()
    targets = torch.tensor([0, 3])
    calls: list[torch.Tensor] = []

    def saturating(m: torch.Tensor) -> torch.Tensor:  # the new model follows the message up to distance 4, then
        # stays at half that: the farthest new model comes from an intermediate scale, not the largest
        calls.append(m)
        v = m - x[targets]
        c = v.norm(dim=1, keepdim=True)
        return x[targets] + v * torch.clamp(4.0 / c, max=1.0) * torch.where(c > 4.0, 0.5, 1.0)

    view = GossipView(honest=x, mixing=w, targets=targets, combine=saturating)
    spectral = gossip_attacks.Spectral()
    a = spectral.direction(view)
    chosen = gossip_attacks.search_scale(view, x[targets], a)
    assert len(calls) == len(gossip_attacks.SEARCH_SCALES) == 16
    honest = x[targets] + view.progress()
    for t in range(2):
        scores = [float((saturating((x[targets] + c * a))[t] - honest[t]).norm()) for c in gossip_attacks.SEARCH_SCALES]
        assert float(chosen[t]) == gossip_attacks.SEARCH_SCALES[scores.index(max(scores))]
    assert float(chosen.max()) < 2.0**12
    # plain gossip is linear in the message: the largest scale wins
    linear = GossipView(honest=x, mixing=w, targets=targets, combine=lambda m: m)
    largest = torch.full((2,), 2.0**12, dtype=torch.float64)
    assert torch.equal(gossip_attacks.search_scale(linear, x[targets], a), largest)


# ---------------------------------------------------------------------------------------------- rules, by hand


def _star5() -> tuple[torch.Tensor, torch.Tensor]:
    """Node 0 and its 4 neighbours on the complete graph K5 (every MH weight 1/5): own x₀ = 0, the others at
    distances 1, 2, 3, 4."""
    x = torch.tensor([[0.0, 0], [1, 0], [0, 2], [3, 0], [0, -4]], dtype=torch.float64)
    return x, torch.full((5,), 0.2, dtype=torch.float64)


def test_cs_plus_by_hand() -> None:
    """f = 1, weights 1/5: 2b = 0.4, so the two farthest (3 and 4) are clipped to the third largest distance, 2."""
    x, w = _star5()
    out, share = robust_gossip.make("cs_plus", 1).aggregate(x, own=0, weights=w)
    want = 0.2 * (x[1] + x[2] + x[3] * 2 / 3 + x[4] * 2 / 4)
    torch.testing.assert_close(out, want, atol=16 * EPS64 * 4, rtol=0)
    torch.testing.assert_close(share[1:], torch.tensor([0.2, 0.2, 0.2 * 2 / 3, 0.1], dtype=torch.float64))
    assert float(share.sum()) == pytest.approx(1.0)
    # step η scales the move
    half = robust_gossip.make("cs_plus(step=0.5)", 1)(x, own=0, weights=w)
    torch.testing.assert_close(half, 0.5 * want, atol=16 * EPS64 * 4, rtol=0)


def test_cs_plus_with_unequal_weights_by_hand() -> None:
    """Weights 0.4 (self), 0.1, 0.2, 0.1, 0.2 at distances 0, 1, 2, 3, 4 and f = 1: b = 0.2 (the largest neighbour
    weight), target 1 − 0.4 = 0.6; cumulative 0.4, 0.5, 0.7 → the first at ≥ 0.6 is distance 2 (0.7 > 0.6), so
    τ = the distance before it, 1."""
    x, _ = _star5()
    w = torch.tensor([0.4, 0.1, 0.2, 0.1, 0.2], dtype=torch.float64)
    out = robust_gossip.make("cs_plus", 1)(x, own=0, weights=w)
    want = 0.1 * x[1] + 0.2 * x[2] / 2 + 0.1 * x[3] / 3 + 0.2 * x[4] / 4
    torch.testing.assert_close(out, want, atol=16 * EPS64 * 4, rtol=0)


def test_clipped_gossip_by_hand() -> None:
    """f = 1, weights 1/5: all but the farthest weight 1/5 are {0, 1, 2, 3}: τ² = (1/5)(1 + 4 + 9)/(1/5) = 14."""
    x, w = _star5()
    out = robust_gossip.make("clipped_gossip", 1)(x, own=0, weights=w)
    tau = math.sqrt(14.0)
    want = 0.2 * (x[1] + x[2] + x[3] * min(1.0, tau / 3) + x[4] * min(1.0, tau / 4))
    torch.testing.assert_close(out, want, atol=16 * EPS64 * 4, rtol=0)


def test_ios_by_hand() -> None:
    """f = 1: the mean of all five is (0.8, −0.4); the farthest from it is x₄ = (0, −4) (distance 3.69): the
    result is the mean of the other four."""
    x, w = _star5()
    out = robust_gossip.make("ios", 1)(x, own=0, weights=w)
    torch.testing.assert_close(out, x[:4].mean(0), atol=16 * EPS64 * 4, rtol=0)
    # the node itself is never dropped, even when it is the farthest from the mean
    y = torch.tensor([[10.0], [0.0], [0.1], [-0.1], [0.2]], dtype=torch.float64)
    kept = robust_gossip.make("ios", 1)(y, own=0, weights=w)
    assert float(kept[0]) > 1.0


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_with_f0_is_plain_gossip_on_an_irregular_graph(rule: str) -> None:
    g = topology.make("erdos_renyi", 12, p=0.35, seed=2)
    w = gossip.metropolis_hastings(g, torch.float64)
    x = torch.randn(12, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    hoods = Neighbourhoods(g, w, honest=12, f=0)
    nodes = torch.arange(12)
    out = robust_gossip.make(rule, 0).combine(x, hoods.rows(x, nodes, {}), hoods.weights, hoods.own, hoods.tolerated)
    torch.testing.assert_close(out, w @ x, atol=64 * EPS64 * float(x.abs().max()), rtol=0)


@pytest.mark.parametrize("rule", RULES)
def test_the_batched_combination_equals_node_by_node_calls(rule: str) -> None:
    """Padded neighbourhoods of an irregular graph (degrees 2–7), some of them with Byzantine messages: the batched
    step gives every node what the rule gives its closed neighbourhood alone."""
    g = topology.make("erdos_renyi", 12, p=0.35, seed=2)
    w = gossip.metropolis_hastings(g, torch.float64)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(12, 6, dtype=torch.float64, generator=gen)
    h = 10
    hoods = Neighbourhoods(g, w, honest=h, f=1)
    closed = closed_neighbourhoods(g)
    messages = {i: 5 * torch.randn(int((closed[i] >= h).sum()), 6, dtype=torch.float64, generator=gen)
                for i in range(h) if bool((closed[i] >= h).any())}
    assert messages and int(g.degrees.min()) < int(g.degrees.max())
    r = robust_gossip.make(rule, 1)
    nodes = torch.arange(h)
    out = r.combine(x[:h], hoods.rows(x, nodes, messages), hoods.weights[:h], hoods.own[:h], hoods.tolerated[:h])
    for i in range(h):
        hood = closed[i]
        rows = x[hood] if i not in messages else torch.cat([x[hood[hood < h]], messages[i]])
        own = int(torch.nonzero(hood == i)[0])
        alone = r(rows, own=own, weights=w[i, hood])
        torch.testing.assert_close(out[i], alone, atol=1e3 * EPS64, rtol=0)


@pytest.mark.parametrize("rule", RULES)
def test_rules_survive_nan_inf_and_huge_rows(rule: str) -> None:
    x, w = _star5()
    r = robust_gossip.make(rule, 1)
    clean = r(x[:4], own=0, weights=w[:4] / w[:4].sum())
    assert bool(torch.isfinite(clean).all())
    for bad in (float("nan"), float("inf"), -float("inf"), 1e308):
        y = x.clone()
        y[4] = bad
        out = r(y, own=0, weights=w)
        assert bool(torch.isfinite(out).all()), (rule, bad)
        assert float(out.norm()) <= float(x[:4].norm(dim=1).max()) + 1e-12
    y32 = x.to(torch.float32)
    y32[4] = 1e38  # finite, but its squared norm overflows float32: a bad row
    assert bool(torch.isfinite(r(y32, own=0, weights=w)).all())


# -------------------------------------------------------------------------------------------------- in a round


def test_dissensus_with_eps_1_cancels_the_targets_progress_under_plain_gossip() -> None:
    g = topology.make("torus", 9)
    exp = _exp(g, attack=gossip_attacks.make("dissensus", eps=1.0), byzantine=2, rounds=1, lr=0.1)
    loop = Loop(exp)
    loop.open()
    theta = loop.state.theta
    got = loop.transport.exchange(theta, 0, exp.rule)
    loop.server.context(theta, None)
    new = theta - loop.server.aggregate(got, {}, False)[0]
    half = got.vectors
    targets = sorted(got.messages or {})
    others = [i for i in range(7) if i not in targets]
    assert targets and others
    tol = 256 * torch.finfo(half.dtype).eps * float(half.abs().max())
    torch.testing.assert_close(new[targets], half[targets], atol=tol, rtol=0)  # no progress at all
    w = exp.algorithm.mixing.to(half.dtype)
    torch.testing.assert_close(new[others], (w @ half)[others], atol=tol, rtol=0)  # the others gossip as usual
    assert float((new[others] - half[others]).abs().max()) > 100 * tol


def test_clipped_gossip_keeps_honest_nodes_bounded_where_plain_gossip_blows_up() -> None:
    g = topology.make("torus", 9)
    huge = attacks.make("gaussian", sigma=1e4)
    plain = Loop(_exp(g, attack=huge, byzantine=1, rounds=8, lr=0.1))
    clipped = Loop(_exp(g, rule="clipped_gossip", f=1, attack=huge, byzantine=1, rounds=8, lr=0.1))
    start = float(plain.experiment.problem.initial_theta().abs().max())
    plain.run()
    clipped.run()
    assert float(plain.state.theta[:8].abs().max()) > 1e3 * start
    assert float(clipped.state.theta[:8].abs().max()) < 10 * start


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("attack", ["nan", "inf"])
def test_training_survives_nan_and_inf_neighbours(rule: str, attack: str) -> None:
    rows = run(_exp(topology.make("torus", 9), rule=rule, f=1, attack=attack, byzantine=1, rounds=30, lr=0.1,
                    momentum=0.9))
    assert math.isfinite(rows[-1]["consensus_distance"])
    assert rows[-1]["worst_node_accuracy"] > 0.5


def test_a_server_attack_that_calls_the_rule_sees_the_nodes_gossip_rule() -> None:
    """optimal (a search over ALIE's strength) calls each target's rule: a robust gossip rule gets the node's own
    row and the rows' gossip weights."""
    g = topology.make("torus", 9)
    exp = _exp(g, rule="cs_plus", f=1, attack="optimal", byzantine=1, rounds=2, lr=0.1)
    rows = run(exp)
    assert math.isfinite(rows[-1]["consensus_distance"])


def test_decentralized_pieces_are_refused_outside_gossip() -> None:
    torch.manual_seed(0)
    server = Experiment(model=_model(), dataset=DS, workers=6, byzantine=1, rule=aggregators.make("cwtm", f=1),
                        attack=gossip_attacks.make("dissensus"), rounds=1, eval_every=1, algorithm=DSGD(batch_size=8))
    with pytest.raises(ConfigError, match=r"attack='dissensus' is invalid.*algorithm = 'gossip'"):
        run(server)
    rule = Experiment(model=_model(), dataset=DS, workers=6, rule=robust_gossip.make("cs_plus", 1), rounds=1,
                      eval_every=1, algorithm=DSGD(batch_size=8))
    with pytest.raises(ConfigError, match=r"rule='cs_plus' is invalid.*algorithm = 'gossip'"):
        run(rule)


def test_refused_rules_and_attacks() -> None:
    star = topology.make("star", 6)
    with pytest.raises(ConfigError, match=r"f=1 is invalid: .*node 1 has degree 1"):
        robust_gossip.make("cs_plus", 1).check_graph(star)
    with pytest.raises(ConfigError, match="f=2 is invalid"):  # ring: closed neighbourhoods of 3 < 2f + 1
        _exp(topology.make("ring", 6), rule="clipped_gossip", f=2)
    with pytest.raises(ConfigError, match="aggregator='nnm>cs_plus' is invalid"):
        robust_gossip.make("nnm>cs_plus", 1)
    with pytest.raises(ConfigError, match="step"):
        robust_gossip.make("cs_plus", 1, step=0)
    with pytest.raises(ConfigError, match=r"aggregator='cs_pluss' is invalid.*did you mean cs_plus"):
        robust_gossip.make("cs_pluss", 1)
    with pytest.raises(ConfigError, match="scale"):
        gossip_attacks.make("spectral", scale="largest")
    with pytest.raises(ConfigError, match="eps"):
        gossip_attacks.make("dissensus", eps=-1)
    with pytest.raises(ConfigError, match="dissensus parameter"):
        gossip_attacks.make("dissensus", epsilon=1)
    with pytest.raises(ConfigError, match="rule='ios' is invalid"):  # no own row: not at a node
        robust_gossip.make("ios", 1)(torch.zeros(5, 2))


# ------------------------------------------------------------------------------------------------ config path


GOSSIP: dict[str, Any] = {
    "algorithm": "gossip", "graph": "torus", "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]},
    "workers": 9, "byzantine": 1, "f": 1, "aggregator": "cs_plus", "attack": "spectral", "batch_size": 8, "lr": 0.1,
    "momentum": 0.9, "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "seed": 1,
}


@pytest.mark.parametrize(("aggregator", "attack", "params"), [
    ("clipped_gossip", "dissensus", {}), ("cs_plus(step=0.5)", "spectral", {"scale": 3.0}), ("ios", "spectral", {}),
    ("cwtm", "dissensus", {"eps": 1.0}), ("mean", "spectral", {}), ("cs_plus", "alie", {}), ("ios", "labelflip", {}),
])
def test_runs_from_config(aggregator: str, attack: str, params: dict[str, Any], tmp_path: Path) -> None:
    from phalanx.experiments import make_config, train

    cfg = make_config({**GOSSIP, "aggregator": aggregator, "attack": attack, "attack_params": params})
    rows = train(cfg, tmp_path)
    assert rows[-1]["aggregator"] == aggregator and rows[-1]["attack"] == attack
    assert {"worst_node_accuracy", "consensus_distance"} <= set(rows[-1])


def test_a_spectral_run_resumes_to_the_same_bits(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from _interrupt import train_interrupted
    from phalanx.experiments import make_config, train

    cfg = make_config(GOSSIP)
    train(cfg, tmp_path / "full")
    part = train_interrupted(cfg, tmp_path / "part", 4)
    train(cfg, part)
    a, b = load_file(str(tmp_path / "full" / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(("change", "match"), [
    ({"algorithm": "dsgd", "graph": "ring", "attack": "dissensus", "aggregator": "cwtm"},
     "attack='dissensus' is invalid: allowed an attack of `phalanx list attacks` with algorithm = 'dsgd'"),
    ({"algorithm": "fedavg", "graph": "ring", "attack": "spectral", "aggregator": "cwtm"},
     "attack='spectral' is invalid: allowed an attack of `phalanx list attacks` with algorithm = 'fedavg'"),
    ({"algorithm": "dsgd", "graph": "ring", "attack": "none"},
     "aggregator='cs_plus' is invalid: allowed a rule of `phalanx list aggregators` with algorithm = 'dsgd'"),
    ({"graph": "ring", "f": 2}, "graph='ring' is invalid"),
    ({"aggregator": "nnm>clipped_gossip"}, "aggregator='nnm>clipped_gossip' is invalid"),
    ({"attack_params": {"scale": -1}}, "scale=-1 is invalid"),
    ({"attack": "dissensus", "attack_params": {"eps": "big"}}, "eps='big' is invalid"),
    ({"aggregator": "monna", "graph": "ring", "f": 2}, "graph='ring' is invalid"),
    ({"aggregator": "monna", "algorithm": "dsgd", "attack": "none"},
     "aggregator='monna' is invalid: allowed a rule of `phalanx list aggregators` with algorithm = 'dsgd'"),
    ({"aggregator": "monna(k=2)"}, "monna"),
])
def test_config_errors(change: dict[str, Any], match: str) -> None:
    from phalanx.experiments import make_config

    cfg = {**GOSSIP, **change}
    if cfg["algorithm"] != "gossip":
        cfg.pop("graph")
    with pytest.raises(ConfigError, match=match) as err:
        make_config(cfg)
    assert "\n" not in str(err.value)


def test_the_example_grid_is_valid() -> None:
    from phalanx.experiments import grid, load_toml
    from phalanx.experiments.build import check_points

    path = Path(__file__).resolve().parent.parent / "examples" / "decentralized" / "robust_gossip.toml"
    cfgs = grid.configs(load_toml(path))
    check_points(cfgs)
    assert {c.aggregator for c in cfgs} >= {"mean", "cwtm", "clipped_gossip", "cs_plus"}
    assert {c.attack for c in cfgs} == {"none", "dissensus", "spectral"}
