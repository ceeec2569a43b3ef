"""Tests of phalanx.decentralized: the communication graphs, the gossip matrices, their spectral gap and the gossip
step. Every tolerance comes from the dtype's machine epsilon and the size (``gossip.tolerance``)."""

from __future__ import annotations

import doctest
import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import phalanx.decentralized as dec
from phalanx.decentralized import gossip, topology
from phalanx.decentralized.gossip import tolerance
from phalanx.decentralized.topology import Graph
from phalanx.errors import ConfigError, InputError

ROOT = Path(__file__).resolve().parent.parent
BUILT = [("ring", 12, {}), ("torus", 12, {}), ("complete", 7, {}), ("star", 9, {}), ("erdos_renyi", 20, {"p": 0.3}),
         ("exponential", 12, {}), ("exponential", 16, {}), ("hypercube", 16, {})]
IDS = [f"{name}-{n}" for name, n, _ in BUILT]


def _x(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)


def _err(fn: object, parameter: str) -> ConfigError:
    """The ConfigError ``fn()`` raises, checked to name ``parameter`` and to be one line."""
    with pytest.raises(ConfigError) as info:
        fn()  # type: ignore[operator]
    assert info.value.parameter == parameter, str(info.value)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(parameter)
    return info.value


def _pairs(graph: Graph) -> set[tuple[int, int]]:
    return {(int(i), int(j)) for i, j in graph.edges}


# ---------------------------------------------------------------------------------------------------------- builders


@pytest.mark.parametrize(("name", "n", "params"), BUILT, ids=IDS)
def test_every_builder_gives_a_simple_connected_undirected_graph(name: str, n: int, params: dict) -> None:
    g = topology.make(name, n, **params)
    a = g.adjacency
    assert g.n == n and a.dtype == torch.bool and a.shape == (n, n)
    assert torch.equal(a, a.T) and not bool(a.diagonal().any())
    assert g.is_connected() and len(g.components()) == 1
    assert int(g.degrees.sum()) == 2 * g.num_edges == 2 * g.edges.shape[0]
    assert g.name == name
    for i in range(n):
        assert g.neighbours(i).tolist() == torch.nonzero(a[i]).flatten().tolist()


@pytest.mark.parametrize("n", [3, 4, 7, 16])
def test_ring(n: int) -> None:
    g = topology.make("ring", n)
    assert g.degrees.tolist() == [2] * n and g.num_edges == n
    assert _pairs(g) == {tuple(sorted((i, (i + 1) % n))) for i in range(n)}


@pytest.mark.parametrize(("n", "shape"), [(9, (3, 3)), (12, (3, 4)), (16, (4, 4)), (18, (3, 6)), (1000, (25, 40))])
def test_torus_near_square(n: int, shape: tuple[int, int]) -> None:
    g = topology.make("torus", n)
    r, c = shape
    assert (g.params["rows"], g.params["cols"]) == shape
    assert g.degrees.tolist() == [4] * n and g.num_edges == 2 * n
    for a, b in [(0, 0), (r - 1, c - 1), (1, 2)]:
        node = a * c + b
        want = {((a + 1) % r) * c + b, ((a - 1) % r) * c + b, a * c + (b + 1) % c, a * c + (b - 1) % c}
        assert set(g.neighbours(node).tolist()) == want


def test_torus_explicit_sides_and_bad_sizes() -> None:
    g = topology.make("torus", 24, rows=4)
    assert (g.params["rows"], g.params["cols"]) == (4, 6) and g.degrees.tolist() == [4] * 24
    assert topology.torus(24, rows=3, cols=8).params == {"rows": 3, "cols": 8}
    assert topology.torus(24, cols=3).params == {"rows": 8, "cols": 3}
    err = _err(lambda: topology.make("torus", 22), "n")  # 2 × 11: no side of 3 or more on both
    assert "21 or 24" in str(err)
    _err(lambda: topology.make("torus", 13), "n")  # a prime
    _err(lambda: topology.make("torus", 8), "n")  # smaller than 3 × 3
    _err(lambda: topology.make("torus", 12, rows=5), "rows")
    _err(lambda: topology.make("torus", 12, rows=2), "rows")
    _err(lambda: topology.make("torus", 12, rows=3, cols=5), "rows")


@pytest.mark.parametrize("n", [2, 3, 10])
def test_complete(n: int) -> None:
    g = topology.make("complete", n)
    assert g.degrees.tolist() == [n - 1] * n and g.num_edges == n * (n - 1) // 2


@pytest.mark.parametrize(("n", "centre"), [(2, 0), (6, 0), (6, 4)])
def test_star(n: int, centre: int) -> None:
    g = topology.make("star", n, centre=centre)
    want = [1] * n
    want[centre] = n - 1
    assert g.degrees.tolist() == want and g.num_edges == n - 1
    assert _pairs(g) == {tuple(sorted((centre, j))) for j in range(n) if j != centre}
    _err(lambda: topology.make("star", n, centre=n), "centre")


@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 16, 17, 31, 64])
def test_exponential_degrees_follow_the_offsets(n: int) -> None:
    g = topology.make("exponential", n)
    offsets = {s * 2**k % n for k in range(n.bit_length()) if 2**k <= n - 1 for s in (1, -1)} - {0}
    assert g.degrees.tolist() == [len(offsets)] * n
    assert g.num_edges == n * len(offsets) // 2
    for i in range(n):  # Ying et al.'s directed links i → i + 2^k, and their reverses
        assert set(g.neighbours(i).tolist()) == {(i + o) % n for o in offsets}
    if n & (n - 1) == 0 and n > 2:
        assert len(offsets) == 2 * int(math.log2(n)) - 1


@pytest.mark.parametrize("n", [2, 4, 8, 32])
def test_hypercube(n: int) -> None:
    g = topology.make("hypercube", n)
    m = int(math.log2(n))
    assert g.degrees.tolist() == [m] * n and g.num_edges == n * m // 2
    assert all(bin(i ^ j).count("1") == 1 for i, j in _pairs(g))
    err = _err(lambda: topology.make("hypercube", 12), "n")
    assert "8 or 16" in str(err)


def test_erdos_renyi_is_seeded_and_connected() -> None:
    a = topology.make("erdos_renyi", 30, p=0.2, seed=7)
    b = topology.make("erdos_renyi", 30, p=0.2, seed=7)
    c = topology.make("erdos_renyi", 30, p=0.2, seed=8)
    assert torch.equal(a.adjacency, b.adjacency) and not torch.equal(a.adjacency, c.adjacency)
    assert a.is_connected() and c.is_connected() and a.params == {"p": 0.2, "seed": 7}
    assert torch.equal(topology.make("erdos_renyi", 6, p=1.0).adjacency, topology.make("complete", 6).adjacency)


def test_erdos_renyi_redraws_until_connected_deterministically() -> None:
    # At p = 0.1 on 30 nodes (below ln(30)/30 ≈ 0.11) most draws are disconnected: the first connected one is kept.
    gen = torch.Generator().manual_seed(3)
    upper = torch.triu(torch.ones(30, 30, dtype=torch.bool), diagonal=1)
    draws = 0
    while True:
        draws += 1
        d = (torch.rand(30, 30, generator=gen, dtype=torch.float64) < 0.1) & upper
        first = Graph(d | d.T)
        if first.is_connected():
            break
    assert draws > 1, "pick a seed whose first draw is disconnected"
    g = topology.erdos_renyi(30, 0.1, seed=3, max_attempts=draws)
    assert torch.equal(g.adjacency, first.adjacency)
    err = _err(lambda: topology.erdos_renyi(30, 0.1, seed=3, max_attempts=draws - 1), "p")
    assert "ln(n)/n" in str(err)


def test_erdos_renyi_bad_parameters() -> None:
    _err(lambda: topology.make("erdos_renyi", 10), "topology 'erdos_renyi' parameter")  # p has no default
    _err(lambda: topology.make("erdos_renyi", 10, p=0.0), "p")
    _err(lambda: topology.make("erdos_renyi", 10, p=1.5), "p")
    _err(lambda: topology.make("erdos_renyi", 10, p=0.5, seed=-1), "seed")
    _err(lambda: topology.make("erdos_renyi", 40, p=0.01), "p")


# -------------------------------------------------------------------------------------------------- names and checks


def test_names_and_unknown_topology() -> None:
    assert {"ring", "torus", "complete", "star", "erdos_renyi", "exponential", "hypercube"} <= set(topology.names())
    err = _err(lambda: topology.make("rign", 8), "topology")
    assert "ring" in str(err.hint)
    assert "erdos_renyi" in str(_err(lambda: topology.make("erdos-renyi", 8, p=0.5), "topology").hint)
    _err(lambda: topology.make("ring", 8, k=2), "topology 'ring' parameter")
    _err(lambda: topology.make("ring", 2), "n")
    _err(lambda: topology.make("ring", 0), "n")
    _err(lambda: topology.make("ring", 8.0), "n")


def test_a_users_builder_and_a_spec() -> None:
    @topology.register("test_path")
    def path(n: int) -> Graph:  # a path is connected; split it to test the check
        i = torch.arange(n - 1)
        a = torch.zeros(n, n, dtype=torch.bool)
        a[i, i + 1] = a[i + 1, i] = True
        return Graph(a, "test_path")

    @topology.register("test_split")
    def split(n: int) -> Graph:
        return Graph(torch.zeros(n, n, dtype=torch.bool), "test_split")

    assert topology.make("test_path", 5).num_edges == 4
    assert "test_path" in topology.names()
    assert "2 components" not in str(_err(lambda: topology.make("test_split", 3), "topology"))
    assert topology.make("phalanx.decentralized.topology:complete", 4).num_edges == 6


def test_graph_validates_its_adjacency() -> None:
    _err(lambda: Graph(torch.zeros(3, 3)), "adjacency")  # not boolean
    _err(lambda: Graph(torch.zeros(3, 4, dtype=torch.bool)), "adjacency")
    _err(lambda: Graph([[False]]), "adjacency")  # type: ignore[arg-type]
    _err(lambda: Graph(torch.eye(3, dtype=torch.bool)), "adjacency")
    a = torch.zeros(3, 3, dtype=torch.bool)
    a[0, 1] = True
    _err(lambda: Graph(a), "adjacency")
    g = Graph(torch.zeros(4, 4, dtype=torch.bool))  # a Graph may be disconnected; make() never hands one out
    assert not g.is_connected() and g.components() == [[0], [1], [2], [3]]
    _err(lambda: g.neighbours(4), "i")
    ring = topology.make("ring", 5)
    assert repr(ring) == "Graph('ring', n=5, edges=5)"
    assert ring.describe() == {"topology": "ring", "params": {}, "n": 5, "edges": 5, "degree_min": 2,
                               "degree_max": 2}


# ------------------------------------------------------------------------------------------------------ a user's own


@pytest.mark.parametrize("kind", ["list", "numpy", "int", "float", "bool"])
def test_from_adjacency_accepts_0_1_matrices(kind: str) -> None:
    rows = [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]]
    matrix = {
        "list": rows, "numpy": np.array(rows), "int": torch.tensor(rows), "float": torch.tensor(rows).double(),
        "bool": torch.tensor(rows).bool(),
    }[kind]
    g = dec.from_adjacency(matrix)
    assert torch.equal(g.adjacency, topology.make("ring", 4).adjacency) and g.name == "custom"


@pytest.mark.parametrize(("matrix", "says"), [
    ([[0, 1, 1], [1, 0, 1]], "square"),
    ([[0]], "n >= 2"),
    ([[0, 2], [2, 0]], "0 and 1"),
    ([[0, 0.5], [0.5, 0]], "0 and 1"),
    ([[0, float("nan")], [float("nan"), 0]], "0 and 1"),
    ([[0, 1, 0], [0, 0, 1], [0, 1, 0]], "symmetric"),
    ([[1, 1], [1, 0]], "self-loops"),
    ([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], "connected"),
    ("abc", "0 and 1"),
    ([["a", "b"], ["c", "d"]], "0 and 1"),
], ids=["not-square", "one-node", "two", "weighted", "nan", "directed", "self-loop", "disconnected", "text",
        "strings"])
def test_from_adjacency_errors_name_the_adjacency(matrix: object, says: str) -> None:
    err = _err(lambda: dec.from_adjacency(matrix), "adjacency")
    assert says in str(err)


def test_disconnected_error_names_an_unreached_node() -> None:
    err = _err(lambda: dec.from_adjacency([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]), "adjacency")
    assert "2 components" in str(err) and "node 2" in str(err)


# ---------------------------------------------------------------------------------------------------- neighbourhoods


def test_check_neighbourhood() -> None:
    ring = topology.make("ring", 8)
    dec.check_neighbourhood(ring, 1, 3)  # 2f + 1 = 3 vectors: two neighbours and itself
    err = _err(lambda: dec.check_neighbourhood(ring, 2, 5, rule="cwtm"), "f")
    assert "node 0 has degree 2" in str(err) and "cwtm" in str(err) and "8 node(s)" in str(err)
    _err(lambda: dec.check_neighbourhood(ring, 1, 3, include_self=False), "f")
    star = topology.make("star", 6)
    dec.check_neighbourhood(star, 0, 2)
    err = _err(lambda: dec.check_neighbourhood(star, 1, 3), "f")
    assert "node 1 has degree 1" in str(err)  # the centre (degree 5) is fine; the first leaf is not
    _err(lambda: dec.check_neighbourhood(star, -1, 1), "f")
    _err(lambda: dec.check_neighbourhood(star, 0, 0), "need")
    _err(lambda: dec.check_neighbourhood("ring", 0, 1), "graph")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------------- weights


@pytest.mark.parametrize(("name", "n", "params"), BUILT, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_metropolis_hastings_is_symmetric_doubly_stochastic(
    name: str, n: int, params: dict, dtype: torch.dtype,
) -> None:
    g = topology.make(name, n, **params)
    w = gossip.metropolis_hastings(g, dtype)
    assert w.dtype == dtype and bool((w >= 0).all())
    tol = tolerance(dtype, n)
    w64 = w.double()
    assert float((w64.sum(0) - 1).abs().max()) <= tol and float((w64.sum(1) - 1).abs().max()) <= tol
    assert torch.equal(w, w.T)
    assert gossip.check_gossip_matrix(w, g) is not None
    deg = g.degrees.tolist()
    for i, j in _pairs(g):
        assert w64[i, j].item() == pytest.approx(1 / (1 + max(deg[i], deg[j])), rel=tol)


@pytest.mark.parametrize(("name", "n", "params"), BUILT, ids=IDS)
def test_uniform_neighbour_is_row_stochastic_and_doubly_only_when_regular(name: str, n: int, params: dict) -> None:
    g = topology.make(name, n, **params)
    w = gossip.uniform_neighbour(g, torch.float64)
    tol = tolerance(torch.float64, n)
    assert float((w.sum(1) - 1).abs().max()) <= tol
    gossip.check_gossip_matrix(w, g, kind="row")
    regular = int(g.degrees.min()) == int(g.degrees.max())
    if regular:
        gossip.check_gossip_matrix(w, g)
        torch.testing.assert_close(w, gossip.metropolis_hastings(g, torch.float64), rtol=0, atol=tol)
    else:
        assert float((w.sum(0) - 1).abs().max()) > tol
        err = _err(lambda: gossip.check_gossip_matrix(w, g), "weights")
        assert "metropolis_hastings" in str(err)
        _err(lambda: gossip.check_gossip_matrix(w, g, kind="doubly"), "weights")


def test_weights_by_name() -> None:
    g = topology.make("star", 5)
    assert torch.equal(gossip.weights("metropolis_hastings", g), gossip.metropolis_hastings(g))
    uniform = gossip.uniform_neighbour(g, torch.float64)
    assert torch.equal(gossip.weights("uniform_neighbour", g, torch.float64), uniform)
    assert gossip.weight_names() == ["metropolis_hastings", "uniform_neighbour"]
    assert "metropolis_hastings" in str(_err(lambda: gossip.weights("metropolis", g), "weights").hint)
    _err(lambda: gossip.metropolis_hastings(g, torch.int64), "dtype")
    _err(lambda: gossip.metropolis_hastings("star"), "graph")  # type: ignore[arg-type]


def test_metropolis_hastings_on_a_star_by_hand() -> None:
    n = 5  # centre degree 4, leaves degree 1: every edge 1/(1 + 4), the leaves keep 4/5, the centre 1/5
    w = gossip.metropolis_hastings(topology.make("star", n), torch.float64)
    want = torch.zeros(n, n, dtype=torch.float64)
    want[0, 1:] = want[1:, 0] = 1 / 5
    want[0, 0] = 1 / 5
    want[range(1, n), range(1, n)] = 4 / 5
    torch.testing.assert_close(w, want, rtol=0, atol=tolerance(torch.float64, n))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_check_gossip_matrix_errors(dtype: torch.dtype) -> None:
    g = topology.make("ring", 6)
    w = gossip.metropolis_hastings(g, dtype)  # every weight 1/3
    tol = tolerance(dtype, 6)

    def check(v: torch.Tensor, kind: str = "symmetric", graph: Graph | None = g) -> str:
        return str(_err(lambda: gossip.check_gossip_matrix(v, graph, kind=kind), "weights"))

    lifted = w.clone()
    lifted[0, 0] += 10 * tol  # row and column 0 sum to 1 + 10 tol; still symmetric
    assert "row 0" in check(lifted)
    inside = w.clone()
    inside[0, 0] += tol / 4
    gossip.check_gossip_matrix(inside, g)

    off_edge = w.clone()  # weight between nodes 0 and 3, which are not neighbours; still doubly stochastic
    off_edge[0, 3] = off_edge[3, 0] = 0.1
    off_edge[0, 0] -= 0.1
    off_edge[3, 3] -= 0.1
    assert "not neighbours" in check(off_edge)
    gossip.check_gossip_matrix(off_edge, None)  # without a graph the support is not checked

    negative = w.clone()
    negative[0, 1] = negative[1, 0] = -0.1
    negative[0, 0] += 1 / 3 + 0.1
    negative[1, 1] += 1 / 3 + 0.1
    assert "non-negative" in check(negative)

    # (1/3) I + (1/2) P + (1/6) Pᵀ, P the cyclic shift: doubly stochastic on the ring's edges, not symmetric
    p = torch.roll(torch.eye(6, dtype=torch.float64), 1, dims=1)
    skew = (torch.eye(6, dtype=torch.float64) / 3 + p / 2 + p.T / 6).to(dtype)
    assert "symmetric" in check(skew)
    gossip.check_gossip_matrix(skew, g, kind="doubly")

    nan = w.clone()
    nan[0, 0] = float("nan")
    assert "finite" in check(nan)
    check(w[:5, :5])
    check(w[:, :5])
    check(torch.eye(6, dtype=torch.int64))
    _err(lambda: gossip.check_gossip_matrix(w.tolist(), g), "weights")  # type: ignore[arg-type]
    _err(lambda: gossip.check_gossip_matrix(w, g, kind="stochastic"), "kind")
    _err(lambda: gossip.check_gossip_matrix(torch.zeros(6, 6, dtype=dtype), g, parameter="gossip"), "gossip")


def test_a_column_that_does_not_sum_to_one() -> None:
    g = topology.make("complete", 3)
    w = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    gossip.check_gossip_matrix(w, g, kind="row")
    assert "column 2 sums to 0.5" in str(_err(lambda: gossip.check_gossip_matrix(w, g, kind="doubly"), "weights"))


# ------------------------------------------------------------------------------------------------------ spectral gap


@pytest.mark.parametrize("n", [2, 5, 12])
def test_complete_graph_with_uniform_weights_has_gap_one(n: int) -> None:
    g = topology.make("complete", n)
    for w in (gossip.uniform_neighbour(g, torch.float64), gossip.metropolis_hastings(g, torch.float64)):
        torch.testing.assert_close(w, torch.full((n, n), 1 / n, dtype=torch.float64), rtol=0,
                                   atol=tolerance(torch.float64, n))
        assert gossip.spectral_gap(w) == pytest.approx(1.0, abs=tolerance(torch.float64, n))
        assert gossip.mixing_rate(w) <= tolerance(torch.float64, n)


@pytest.mark.parametrize("n", range(3, 21))
def test_ring_gap_matches_the_closed_form(n: int) -> None:
    # MH on a ring: every weight 1/3, W circulant with eigenvalues 1/3 + 2/3 cos(2πk/n), k = 0 … n − 1.
    w = gossip.metropolis_hastings(topology.make("ring", n), torch.float64)
    torch.testing.assert_close(w.diagonal(), torch.full((n,), 1 / 3, dtype=torch.float64), rtol=0,
                               atol=tolerance(torch.float64, n))
    beta = max(abs(1 / 3 + 2 / 3 * math.cos(2 * math.pi * k / n)) for k in range(1, n))
    assert gossip.mixing_rate(w) == pytest.approx(beta, abs=tolerance(torch.float64, n))
    assert gossip.spectral_gap(w) == pytest.approx(1 - beta, abs=tolerance(torch.float64, n))


def test_ring_gap_decreases_with_n() -> None:
    gaps = [gossip.spectral_gap(gossip.metropolis_hastings(topology.make("ring", n), torch.float64))
            for n in range(3, 41)]
    assert gaps[0] == pytest.approx(1.0, abs=tolerance(torch.float64, 3))  # the 3-ring is the complete graph
    assert all(a > b for a, b in itertools.pairwise(gaps))
    # Θ(1/n²): 1 − (1/3 + 2/3 cos(2π/n)) ≈ (2/3)(2π²/n²) = 4π²/(3n²)
    assert gaps[-1] == pytest.approx(4 * math.pi**2 / (3 * 40**2), rel=0.01)


def test_mixing_rate_takes_the_most_negative_eigenvalue_when_it_dominates() -> None:
    """β = max(|λ₂|, |λₙ|): a valid W (ring of 4, self weight 0.1, neighbours 0.45; eigenvalues 0.1 + 0.9 cos(πk/2)
    = 1, 0.1, −0.8, 0.1) whose |λₙ| = 0.8 dominates λ₂ = 0.1 — every Metropolis–Hastings W of the built-in graphs has
    λ₂ ≥ |λₙ|, so only this case tells β from the largest algebraic eigenvalue (0.1). One step contracts (1, −1, 1, −1)
    by exactly 0.8."""
    w = torch.zeros(4, 4, dtype=torch.float64)
    for i in range(4):
        w[i, i], w[i, (i + 1) % 4], w[i, (i - 1) % 4] = 0.1, 0.45, 0.45
    gossip.check_gossip_matrix(w, topology.make("ring", 4))
    assert gossip.mixing_rate(w) == pytest.approx(0.8, abs=1e-12)
    assert gossip.spectral_gap(w) == pytest.approx(0.2, abs=1e-12)
    x = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]], dtype=torch.float64)
    assert torch.linalg.vector_norm(w @ x) / torch.linalg.vector_norm(x) == pytest.approx(0.8, abs=1e-12)


@pytest.mark.parametrize("n", [4, 8, 16, 64])
def test_hypercube_gap(n: int) -> None:
    m = int(math.log2(n))  # eigenvalues of W = (I + A)/(m + 1): (1 + m − 2j)/(m + 1), j = 0 … m
    w = gossip.metropolis_hastings(topology.make("hypercube", n), torch.float64)
    assert gossip.mixing_rate(w) == pytest.approx((m - 1) / (m + 1), abs=tolerance(torch.float64, n))


@pytest.mark.parametrize(("rows", "cols"), [(3, 3), (3, 5), (4, 6)])
def test_torus_gap(rows: int, cols: int) -> None:
    # W = (I + A)/5 on the torus: eigenvalues (1 + 2 cos(2πa/rows) + 2 cos(2πb/cols))/5.
    n = rows * cols
    w = gossip.metropolis_hastings(topology.make("torus", n, rows=rows, cols=cols), torch.float64)
    lam = [(1 + 2 * math.cos(2 * math.pi * a / rows) + 2 * math.cos(2 * math.pi * b / cols)) / 5
           for a in range(rows) for b in range(cols) if (a, b) != (0, 0)]
    assert gossip.mixing_rate(w) == pytest.approx(max(abs(v) for v in lam), abs=tolerance(torch.float64, n))


@pytest.mark.parametrize("n", [3, 6, 20])
def test_star_gap_is_one_over_n(n: int) -> None:
    # MH on a star: eigenvalues 1, 1 − 1/n (n − 2 times: differences of leaves) and 0.
    w = gossip.metropolis_hastings(topology.make("star", n), torch.float64)
    assert gossip.spectral_gap(w) == pytest.approx(1 / n, abs=tolerance(torch.float64, n))


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
def test_disconnected_graph_has_gap_zero_and_non_symmetric_is_refused() -> None:
    two = torch.zeros(4, 4, dtype=torch.bool)
    two[0, 1] = two[1, 0] = two[2, 3] = two[3, 2] = True
    w = gossip.metropolis_hastings(Graph(two), torch.float64)
    assert gossip.spectral_gap(w) == pytest.approx(0.0, abs=tolerance(torch.float64, 4))
    star = topology.make("star", 5)
    _err(lambda: gossip.spectral_gap(gossip.uniform_neighbour(star)), "weights")
    csr = gossip.metropolis_hastings(topology.make("ring", 6), torch.float64).to_sparse_csr()
    assert gossip.spectral_gap(csr) == pytest.approx(1 - 2 / 3, abs=tolerance(torch.float64, 6))


def test_float32_gap_within_its_tolerance() -> None:
    g = topology.make("exponential", 12)
    a = gossip.spectral_gap(gossip.metropolis_hastings(g, torch.float32))
    b = gossip.spectral_gap(gossip.metropolis_hastings(g, torch.float64))
    assert a == pytest.approx(b, abs=tolerance(torch.float32, 12))


def test_describe_reports_the_gap() -> None:
    g = topology.make("ring", 8)
    w = gossip.metropolis_hastings(g, torch.float64)
    info = gossip.describe(g, w)
    assert info["topology"] == "ring" and info["n"] == 8 and info["edges"] == 8
    assert info["spectral_gap"] == pytest.approx(1 - info["mixing_rate"], abs=tolerance(torch.float64, 8))
    assert info["spectral_gap"] == pytest.approx(2 / 3 - 2 / 3 * math.cos(2 * math.pi / 8),
                                                 abs=tolerance(torch.float64, 8))
    _err(lambda: gossip.describe(topology.make("star", 8), gossip.uniform_neighbour(topology.make("star", 8))),
         "weights")


# ------------------------------------------------------------------------------------------------------------ gossip


@pytest.mark.parametrize(("name", "n", "params"), [*BUILT, ("torus", 256, {})],
                         ids=[*IDS, "torus-256"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gossip_keeps_the_average_and_contracts_by_beta(name: str, n: int, params: dict, dtype: torch.dtype) -> None:
    g = topology.make(name, n, **params)
    w = gossip.metropolis_hastings(g, dtype)
    beta = gossip.mixing_rate(w)
    x = _x(n, 7, seed=n, dtype=dtype)
    op = gossip.operator(w)
    y = gossip.gossip(op, x)
    assert y.shape == x.shape and y.dtype == dtype
    tol = tolerance(dtype, n)
    scale = float(x.abs().max())
    assert float((y.double().mean(0) - x.double().mean(0)).abs().max()) <= tol * scale
    # ‖WX − 1x̄ᵀ‖² ≤ β² ‖X − 1x̄ᵀ‖², up to the rounding of W and of the product
    assert gossip.consensus_distance(y) <= (beta + tol) ** 2 * gossip.consensus_distance(x) + (tol * scale) ** 2
    # ... with equality along the eigenvector of the eigenvalue of largest magnitude other than 1 (when β > 0: the
    # complete graph's β is rounding noise)
    if beta <= tol:
        return
    w64 = w.double()
    vals, vecs = torch.linalg.eigh(w64 - 1 / n)
    v = vecs[:, int(vals.abs().argmax())].unsqueeze(1)
    ratio = gossip.consensus_distance(w64 @ v) / gossip.consensus_distance(v)
    assert math.sqrt(ratio) == pytest.approx(beta, abs=tolerance(torch.float64, n))


def test_repeated_gossip_reaches_the_average() -> None:
    g = topology.make("torus", 16)
    w = gossip.metropolis_hastings(g, torch.float64)
    beta = gossip.mixing_rate(w)
    x = _x(16, 5, seed=1)
    start = gossip.consensus_distance(x)
    y = x
    for t in range(1, 31):
        y = gossip.gossip(w, y)
        assert gossip.consensus_distance(y) <= beta ** (2 * t) * start * (1 + tolerance(torch.float64, 16) * t)
    torch.testing.assert_close(y, x.mean(0).expand_as(y), rtol=0, atol=beta**30 * float(x.abs().max()) * 4)


def test_uniform_weights_on_a_star_move_the_average() -> None:
    # Documented: row stochastic but not column stochastic off regular graphs — the average drifts to the centre.
    g = topology.make("star", 5)
    x = torch.zeros(5, 1, dtype=torch.float64)
    x[0] = 1.0
    y = gossip.gossip(gossip.uniform_neighbour(g, torch.float64), x)
    assert float(y.mean()) > float(x.mean()) + tolerance(torch.float64, 5)


def test_operator_sparse_for_large_sparse_graphs_only() -> None:
    big = gossip.metropolis_hastings(topology.make("torus", 256), torch.float64)  # 5/256 ≈ 2 % non-zero
    assert gossip.operator(big).layout == torch.sparse_csr
    assert gossip.operator(gossip.metropolis_hastings(topology.make("torus", 16))).layout == torch.strided
    dense256 = gossip.metropolis_hastings(topology.make("complete", 256), torch.float64)
    assert gossip.operator(dense256).layout == torch.strided
    assert gossip.operator(big.half()).layout == torch.strided
    x = _x(256, 9, seed=2)
    torch.testing.assert_close(gossip.gossip(gossip.operator(big), x), big @ x, rtol=0,
                               atol=tolerance(torch.float64, 256) * float(x.abs().max()))


def test_gossip_input_checks_and_dtype() -> None:
    w = gossip.metropolis_hastings(topology.make("ring", 4), torch.float64)
    x = _x(4, 3, seed=0, dtype=torch.float32)
    y = gossip.gossip(w, x)  # W is cast to X's dtype
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), w @ x.double(), rtol=0, atol=tolerance(torch.float32, 4))
    with pytest.raises(InputError):
        gossip.gossip(w, x[0])
    with pytest.raises(InputError):
        gossip.gossip(w, x[:3])
    with pytest.raises(InputError):
        gossip.gossip(w, x.long())
    with pytest.raises(InputError):
        gossip.consensus_distance(x[0])


# -------------------------------------------------------------------------------------------------------------- docs


def test_docs_examples_run() -> None:
    text = (ROOT / "docs" / "decentralized.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    namespace: dict[str, object] = {}
    for code in blocks:
        exec(compile(code, "docs/decentralized.md:python-block", "exec"), namespace)


def test_package_docstring_example() -> None:
    result = doctest.testmod(dec, verbose=False)
    assert result.attempted >= 1 and result.failed == 0
