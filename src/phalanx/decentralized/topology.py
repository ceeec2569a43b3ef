"""Communication graphs of decentralized learning: :class:`Graph`, the named builders behind :func:`make`, a user's
own graph (:func:`from_adjacency`) and the check that every node has enough neighbours for a robust rule
(:func:`check_neighbourhood`).

A graph is undirected, simple (no self-loops, no multi-edges) and — for everything :func:`make` and
:func:`from_adjacency` hand out — connected. Node ``i`` talks to its neighbours ``N(i) = {j : A_ij}``; its degree is
``d_i = |N(i)|``. The builders (``n`` is the number of nodes):

- ``ring`` — i — i ± 1 (mod n); degree 2; n ≥ 3.
- ``torus`` — a rows × cols grid with wrap-around, (a, b) — (a ± 1, b) and (a, b ± 1); degree 4; rows, cols ≥ 3.
- ``complete`` — every pair; degree n − 1; n ≥ 2.
- ``star`` — the centre (node 0 by default) — every other node; degrees n − 1 and 1; n ≥ 2.
- ``erdos_renyi`` — each pair with probability p, redrawn (seeded) until connected; mean degree ≈ p (n − 1).
- ``exponential`` — i — i ± 2^k (mod n) for 2^k ≤ n − 1; degree |{±2^k mod n}| ≈ 2 log₂ n; n ≥ 2.
- ``hypercube`` — i — i XOR 2^k; degree log₂ n; n a power of 2.
- ``attached`` — a ``base`` graph on the first n − b nodes, each of the last b linked to all of them (b =
  ``byzantine``): every base node has exactly b neighbours among the last b (the Byzantine ones, in a run).

A builder is a function ``builder(n, **params) -> Graph``; :func:`register` adds one under a name, a
``module:attr`` spec names one in another module, and an installed package's entry point in the group
``phalanx.graphs`` adds one for every process (:mod:`phalanx.plugins`; the group ``phalanx.topologies``, which
the torchrun topologies shared until each kind had its own, is still read with a deprecation warning).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.plugins import Registry, check_params
from phalanx.validate import check_int, check_real

__all__ = [
    "Graph", "check_neighbourhood", "complete", "erdos_renyi", "exponential", "from_adjacency",
    "hypercube", "make", "names", "register", "ring", "star", "torus",
]

B = TypeVar("B", bound=Callable[..., Any])


def _reached(adjacency: Tensor, start: int) -> Tensor:
    """The nodes reachable from ``start`` (a boolean mask): breadth-first, one frontier per step, each step one
    row gather (no loop over nodes; O(n²) work in all)."""
    n = adjacency.shape[0]
    reached = torch.zeros(n, dtype=torch.bool)
    reached[start] = True
    frontier = reached.clone()
    while bool(frontier.any()):
        frontier = adjacency[frontier].any(dim=0) & ~reached
        reached |= frontier
    return reached


def _components(adjacency: Tensor) -> list[list[int]]:
    """The connected components, each as its sorted node list, in order of their smallest node."""
    n = adjacency.shape[0]
    left = torch.ones(n, dtype=torch.bool)
    out = []
    while bool(left.any()):
        start = int(torch.nonzero(left)[0])
        comp = _reached(adjacency, start)
        out.append(torch.nonzero(comp).flatten().tolist())
        left &= ~comp
    return out


def _check_adjacency(adjacency: Any) -> Tensor:
    """The checks :class:`Graph` makes on its adjacency matrix (every failure a ConfigError naming ``adjacency``)."""
    if not isinstance(adjacency, Tensor):
        raise ConfigError("adjacency", type(adjacency).__name__, "a boolean torch.Tensor of shape (n, n)")
    if adjacency.dtype != torch.bool:
        raise ConfigError("adjacency", f"dtype {adjacency.dtype}", "a boolean (n, n) tensor (use from_adjacency)")
    if adjacency.ndim != 2 or adjacency.shape[0] != adjacency.shape[1] or adjacency.shape[0] < 1:
        raise ConfigError("adjacency", f"shape {tuple(adjacency.shape)}", "a square (n, n) matrix with n >= 1")
    if adjacency.layout != torch.strided:
        raise ConfigError("adjacency", f"layout {adjacency.layout}", "a dense (strided) tensor")
    adjacency = adjacency.detach().to("cpu").clone()
    loops = torch.nonzero(adjacency.diagonal()).flatten()
    if loops.numel():
        raise ConfigError(
            "adjacency", f"a self-loop at node {int(loops[0])}", "a graph without self-loops (a zero diagonal)",
            "a node always keeps its own value in gossip: the weights' diagonal, not an edge",
        )
    asym = torch.nonzero(adjacency != adjacency.T)
    if asym.numel():
        i, j = (int(v) for v in asym[0])
        raise ConfigError(
            "adjacency", f"an edge {i}→{j} without {j}→{i}", "a symmetric matrix (an undirected graph)",
        )
    return adjacency


@dataclass(frozen=True, eq=False)
class Graph:
    """An undirected simple graph on nodes ``0 … n−1``.

    ``adjacency`` is a boolean symmetric ``(n, n)`` CPU tensor with a zero diagonal (checked at construction: a
    :class:`~phalanx.errors.ConfigError` naming ``adjacency`` otherwise; the graph keeps its own copy, which must not
    be modified in place). ``name`` says where it came from (``"ring"``, ``"custom"``), ``params`` with which
    parameters. A ``Graph`` itself may be disconnected (:meth:`is_connected`); :func:`make` and
    :func:`from_adjacency` hand out connected ones only.
    """

    adjacency: Tensor
    name: str = "custom"
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "adjacency", _check_adjacency(self.adjacency))
        object.__setattr__(self, "params", dict(self.params))

    @property
    def n(self) -> int:
        """The number of nodes."""
        return int(self.adjacency.shape[0])

    @property
    def degrees(self) -> Tensor:
        """``d_i = |N(i)|`` for every node, an ``(n,)`` int64 tensor."""
        return self.adjacency.sum(dim=1)

    @property
    def num_edges(self) -> int:
        """The number of (undirected) edges, ``Σ_i d_i / 2``."""
        return int(self.adjacency.sum()) // 2

    @property
    def edges(self) -> Tensor:
        """Every edge once, as an ``(m, 2)`` int64 tensor of pairs ``i < j`` in lexicographic order."""
        return torch.nonzero(torch.triu(self.adjacency, diagonal=1))

    def neighbours(self, i: int) -> Tensor:
        """``N(i)``, the neighbours of node ``i`` in increasing order (an int64 tensor), without ``i`` itself."""
        i = check_int("i", i, low=0, high=self.n - 1)
        return torch.nonzero(self.adjacency[i]).flatten()

    def is_connected(self) -> bool:
        """Whether every node reaches every other (breadth-first search from node 0)."""
        return bool(_reached(self.adjacency, 0).all())

    def components(self) -> list[list[int]]:
        """The connected components, each a sorted list of nodes, in order of their smallest node."""
        return _components(self.adjacency)

    def describe(self) -> dict[str, Any]:
        """Name, parameters, nodes, edges and the degree range, for logs and manifests."""
        deg = self.degrees
        return {
            "topology": self.name, "params": dict(self.params), "n": self.n, "edges": self.num_edges,
            "degree_min": int(deg.min()), "degree_max": int(deg.max()),
        }

    def __repr__(self) -> str:
        params = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"Graph({self.name!r}, n={self.n}{params}, edges={self.num_edges})"


def _require_connected(graph: Graph, parameter: str, value: Any) -> Graph:
    if not graph.is_connected():
        comps = graph.components()
        unreached = comps[1][0]
        raise ConfigError(
            parameter, value, "a connected graph",
            f"{len(comps)} components; node {unreached} cannot be reached from node 0, so gossip never reaches "
            "consensus",
        )
    return graph


def _from_pairs(n: int, rows: Tensor, cols: Tensor, name: str, params: dict[str, Any]) -> Graph:
    """The graph with the edges ``rows[k] — cols[k]`` (both directions; pairs with ``rows[k] == cols[k]`` dropped)."""
    adj = torch.zeros(n, n, dtype=torch.bool)
    adj[rows, cols] = True
    adj[cols, rows] = True
    adj.fill_diagonal_(False)
    return Graph(adj, name, params)


# ---------------------------------------------------------------------------------------------------------- registry


def _accept(obj: Any, name: str) -> Callable[..., Graph]:
    if not callable(obj):
        raise ConfigError("topology", name, "a function builder(n, **params) -> Graph")
    return obj


_REGISTRY: Registry[Callable[..., Graph]] = Registry("topology", "phalanx.graphs", _accept,
                                                      legacy_group="phalanx.topologies")


def register(name: str) -> Callable[[B], B]:
    """Decorator: make ``builder(n, **params) -> Graph`` known to :func:`make` under ``name``."""

    def deco(builder: B) -> B:
        _REGISTRY.register(builder, name=name)
        return builder

    return deco


def names() -> list[str]:
    """The topology names :func:`make` accepts, sorted (installed plug-ins' entry points included; a ``module:attr``
    spec is accepted too)."""
    return _REGISTRY.names()


def _required(build: Callable[..., Any], params: dict[str, Any]) -> list[str]:
    """The builder's parameters without a default that ``params`` does not give (``n`` aside)."""
    try:
        sig = inspect.signature(build)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = [p.name for p in list(sig.parameters.values())[1:]
                if p.kind in kinds and p.default is inspect.Parameter.empty]
    return [p for p in required if p not in params]


def make(name: str, n: int, **params: Any) -> Graph:
    """The connected graph ``name`` on ``n`` nodes (see :func:`names`), built with ``params``.

    Every failure is a one-line :class:`~phalanx.errors.ConfigError` naming its key, raised before anything runs:
    an unknown name names ``topology`` and suggests the closest names, a parameter the builder does not take is
    refused, and a graph that is not connected (a user's builder) names ``topology``.
    """
    build = _REGISTRY.get(name, "topology")
    n = check_int("n", n, low=1)
    check_params(f"topology {name!r}", build, params, skip=("n",))
    missing = _required(build, params)
    if missing:
        raise ConfigError(f"topology {name!r} parameter", missing, f"values for {', '.join(missing)} (no default)")
    graph = build(n, **params)
    if not isinstance(graph, Graph):
        raise ConfigError("topology", name, f"a builder that returns a Graph (it returned a {type(graph).__name__})")
    if graph.n != n:
        raise ConfigError("topology", name, f"a builder that returns a graph on n={n} nodes (it has {graph.n})")
    return _require_connected(graph, "topology", name)


# ---------------------------------------------------------------------------------------------------------- builders


@register("ring")
def ring(n: int) -> Graph:
    """The cycle ``i — i ± 1 (mod n)``: every node has degree 2, n edges (n ≥ 3; for n = 2 use ``complete``)."""
    n = check_int("n", n, low=3, hint="a ring needs 3 nodes; n = 2 is the complete graph")
    i = torch.arange(n)
    return _from_pairs(n, i, (i + 1) % n, "ring", {})


def _near_square(n: int) -> tuple[int, int] | None:
    """``(rows, cols)`` with ``rows × cols = n``, ``3 ≤ rows ≤ cols`` and rows as large as possible, or None."""
    for rows in range(math.isqrt(n), 2, -1):
        if n % rows == 0:
            return rows, n // rows
    return None


def _torus_sizes(limit: int) -> list[int]:
    return [m for m in range(9, limit) if _near_square(m) is not None]


@register("torus")
def torus(n: int, rows: int | None = None, cols: int | None = None) -> Graph:
    """The two-dimensional torus: an ``rows × cols`` grid with wrap-around, node ``a·cols + b`` linked to
    ``((a ± 1) mod rows, b)`` and ``(a, (b ± 1) mod cols)``. Every node has degree 4 and there are 2n edges.

    Without ``rows``/``cols`` the grid is the most nearly square factorisation ``n = rows × cols`` with
    ``3 ≤ rows ≤ cols`` (n = 12 → 3 × 4, n = 1000 → 25 × 40); giving one of them fixes the other. Both sides must be
    at least 3 — with a side of 2 the wrap-around would duplicate an edge and the degree would not be 4, with a side
    of 1 it is a ring — so n must be 9, 12, 15, 16, 18, 20, 21, 24, 25, … (not a prime, nor twice a prime): any
    other n is a :class:`~phalanx.errors.ConfigError` naming ``n`` with the nearest sizes that work.
    """
    n = check_int("n", n, low=9, hint="a torus needs a grid of at least 3 × 3")
    if rows is None and cols is None:
        shape = _near_square(n)
        if shape is None:
            lower = [m for m in _torus_sizes(n) if m < n]
            upper = next(m for m in range(n + 1, 4 * n + 16) if _near_square(m) is not None)
            near = (f"{lower[-1]} or " if lower else "") + str(upper)
            raise ConfigError(
                "n", n, "rows × cols with rows, cols >= 3 (9, 12, 15, 16, 18, 20, 21, 24, 25, ...)",
                f"nearest: {near}; or use ring or exponential for any n",
            )
        r, c = shape
    else:
        if rows is not None:
            r = check_int("rows", rows, low=3)
            c = n // r if cols is None else check_int("cols", cols, low=3)
        else:
            c = check_int("cols", cols, low=3)
            r = n // c
        if r * c != n or r < 3 or c < 3:
            raise ConfigError(
                "rows" if rows is not None else "cols", rows if rows is not None else cols,
                f"a grid rows × cols = n = {n} with both sides >= 3",
            )
    idx = torch.arange(n).reshape(r, c)
    right = torch.roll(idx, shifts=-1, dims=1)
    down = torch.roll(idx, shifts=-1, dims=0)
    return _from_pairs(
        n, torch.cat([idx.flatten(), idx.flatten()]), torch.cat([right.flatten(), down.flatten()]),
        "torus", {"rows": r, "cols": c},
    )


@register("complete")
def complete(n: int) -> Graph:
    """Every pair of nodes linked: degree n − 1, n(n − 1)/2 edges (n ≥ 2). With uniform weights gossip is the
    exact average in one step."""
    n = check_int("n", n, low=2)
    adj = ~torch.eye(n, dtype=torch.bool)
    return Graph(adj, "complete", {})


@register("star")
def star(n: int, centre: int = 0) -> Graph:
    """Node ``centre`` linked to every other node and no other edge: the centre has degree n − 1, the others 1;
    n − 1 edges (n ≥ 2). A server-like graph: every path between two leaves goes through the centre."""
    n = check_int("n", n, low=2)
    centre = check_int("centre", centre, low=0, high=n - 1)
    others = torch.tensor([i for i in range(n) if i != centre], dtype=torch.long)
    return _from_pairs(n, torch.full_like(others, centre), others, "star", {"centre": centre})


@register("erdos_renyi")
def erdos_renyi(n: int, p: float, seed: int = 0, max_attempts: int = 100) -> Graph:
    """An Erdős–Rényi graph G(n, p) — each of the n(n − 1)/2 pairs linked independently with probability ``p``
    (Erdős & Rényi, "On the evolution of random graphs", 1960) — conditioned on being connected.

    Draws come from one ``torch.Generator`` seeded with ``seed``: the uniform ``U_ij`` of the upper triangle are
    drawn, ``i — j`` iff ``U_ij < p``, and a disconnected draw is thrown away and the next one drawn from the same
    generator, so the same ``(n, p, seed)`` always gives the same graph. After ``max_attempts`` disconnected draws a
    :class:`~phalanx.errors.ConfigError` names ``p``: G(n, p) is connected with high probability only once
    ``p > ln(n) / n`` (Erdős & Rényi 1960), so the hint suggests a larger one.
    """
    n = check_int("n", n, low=2)
    p = check_real("p", p, low=0.0, low_open=True, high=1.0)
    seed = check_int("seed", seed, low=0)
    max_attempts = check_int("max_attempts", max_attempts, low=1)
    gen = torch.Generator().manual_seed(seed)
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    for _ in range(max_attempts):
        draw = (torch.rand(n, n, generator=gen, dtype=torch.float64) < p) & upper
        graph = Graph(draw | draw.T, "erdos_renyi", {"p": p, "seed": seed})
        if graph.is_connected():
            return graph
    threshold = math.log(n) / n
    raise ConfigError(
        "p", p, f"a probability for which G(n={n}, p) is connected within max_attempts={max_attempts} draws",
        f"none of {max_attempts} draws with seed={seed} was connected; G(n, p) is connected with high probability "
        f"for p > ln(n)/n = {threshold:.3g}: try p >= {min(1.0, 2 * threshold):.3g}",
    )


def _exponential_offsets(n: int) -> list[int]:
    return [2**k for k in range(max(n - 1, 1).bit_length()) if 2**k <= n - 1]


@register("exponential")
def exponential(n: int) -> Graph:
    """The (static, undirected) exponential graph: node i linked to ``i ± 2^k (mod n)`` for ``k = 0 … ⌊log₂(n−1)⌋``
    — Ying, Yuan, Chen, Hu, Pan & Yin, "Exponential graph is provably efficient for decentralized deep training",
    NeurIPS 2021 (their static exponential graph is directed, i → i + 2^k; this is its undirected closure, which a
    symmetric gossip matrix needs). The degree is the number of distinct non-zero residues ``±2^k mod n``: about
    2 log₂ n (2 log₂ n − 1 when n is a power of 2), for n ≥ 2.
    """
    n = check_int("n", n, low=2)
    i = torch.arange(n)
    offsets = _exponential_offsets(n)
    rows = i.repeat(len(offsets))
    cols = torch.cat([(i + o) % n for o in offsets])
    return _from_pairs(n, rows, cols, "exponential", {})


@register("hypercube")
def hypercube(n: int) -> Graph:
    """The m-dimensional hypercube on n = 2^m nodes: i linked to ``i XOR 2^k`` for ``k = 0 … m − 1`` (the nodes
    whose binary labels differ in one bit). Degree log₂ n, n log₂(n) / 2 edges; n must be a power of 2, ≥ 2."""
    n = check_int("n", n, low=2)
    if n & (n - 1):
        low = 1 << (n.bit_length() - 1)
        raise ConfigError("n", n, "a power of 2 >= 2", f"nearest: {low} or {2 * low}; or use exponential for any n")
    i = torch.arange(n)
    dims = n.bit_length() - 1
    rows = i.repeat(dims)
    cols = torch.cat([i ^ (1 << k) for k in range(dims)])
    return _from_pairs(n, rows, cols, "hypercube", {})


@register("attached")
def attached(n: int, byzantine: int, base: str = "torus", base_params: dict[str, Any] | None = None) -> Graph:
    """The graph ``base`` (with ``base_params``) on the first n − ``byzantine`` nodes, and each of the last
    ``byzantine`` nodes linked to every one of them (not to each other): every node of the base graph has exactly
    ``byzantine`` neighbours among the last nodes. With the Byzantine nodes being the last ``byzantine`` of a run
    (``byzantine`` equal to the run's), it is the worst case of that many Byzantine nodes — each of them neighbours
    every honest node — and the number of Byzantine neighbours per honest node is set exactly (1 ≤ byzantine < n)."""
    n = check_int("n", n, low=2)
    b = check_int("byzantine", byzantine, low=1, high=n - 1)
    if base == "attached":
        raise ConfigError("base", base, "a topology other than 'attached'")
    inner = make(base, n - b, **(base_params or {}))
    adj = torch.zeros(n, n, dtype=torch.bool)
    adj[: n - b, : n - b] = inner.adjacency
    adj[n - b:, : n - b] = True
    adj[: n - b, n - b:] = True
    return Graph(adj, "attached", {"byzantine": b, "base": base, "base_params": dict(inner.params)})


def from_adjacency(matrix: Any, name: str = "custom") -> Graph:
    """A user's own graph from its adjacency matrix: a torch tensor, a NumPy array or nested lists.

    The matrix must be square, hold only 0 and 1 (or booleans), be symmetric (undirected), have a zero diagonal (no
    self-loops) and describe a connected graph with n ≥ 2 nodes; each failure is a one-line
    :class:`~phalanx.errors.ConfigError` naming ``adjacency`` and saying which entry, node or component is at fault.
    """
    if isinstance(matrix, Tensor):
        t = matrix.detach().to("cpu")
        if t.layout != torch.strided:
            t = t.to_dense()
    else:
        try:
            arr = np.asarray(matrix)
        except (TypeError, ValueError) as exc:
            raise ConfigError("adjacency", type(matrix).__name__, f"a square 0/1 matrix ({exc})") from None
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise ConfigError("adjacency", f"an array of {arr.dtype}", "a square matrix of 0 and 1")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.ndim != 2 or t.shape[0] != t.shape[1] or t.shape[0] < 2:
        raise ConfigError("adjacency", f"shape {tuple(t.shape)}", "a square (n, n) matrix with n >= 2")
    if t.dtype != torch.bool:
        if t.is_complex():
            raise ConfigError("adjacency", f"dtype {t.dtype}", "a real matrix of 0 and 1")
        bad = torch.nonzero((t != 0) & (t != 1))
        if bad.numel():
            i, j = (int(v) for v in bad[0])
            raise ConfigError(
                "adjacency", f"entry ({i}, {j}) = {t[i, j].item()!r}", "a matrix of 0 and 1 (an unweighted graph)",
                "gossip weights come from the graph (metropolis_hastings, uniform_neighbour), not from the matrix",
            )
        t = t != 0
    graph = Graph(t, name, {})
    return _require_connected(graph, "adjacency", f"a {graph.n}×{graph.n} matrix")


# ---------------------------------------------------------------------------------------------------- neighbourhoods


def check_neighbourhood(
    graph: Graph, f: int, need: int, *, include_self: bool = True, rule: str | None = None,
) -> None:
    """Refuse an ``f`` for which some node's robust rule would be undefined.

    In decentralized robust aggregation each node i aggregates the vectors of its neighbourhood — ``N(i) ∪ {i}``
    (``include_self=True``: ``d_i + 1`` vectors) or ``N(i)`` alone (``d_i`` vectors) — with a rule configured for
    ``f``; ``need`` is the number of vectors that rule needs with this ``f`` (for example 2f + 1 for the
    coordinate-wise median or trimmed mean, 2f + 3 for Krum: an aggregator's ``min_workers()``). A node with fewer
    is a one-line :class:`~phalanx.errors.ConfigError` naming ``f``, the first such node and its degree.
    """
    if not isinstance(graph, Graph):
        raise ConfigError("graph", type(graph).__name__, "a phalanx.decentralized.Graph")
    f = check_int("f", f, low=0)
    need = check_int("need", need, low=1)
    deg = graph.degrees
    have = deg + 1 if include_self else deg
    short = torch.nonzero(have < need).flatten()
    if short.numel():
        i = int(short[0])
        who = f"{rule} with f={f}" if rule else f"the rule with f={f}"
        counted = f"its {int(deg[i])} neighbour(s) and itself" if include_self else f"its {int(deg[i])} neighbour(s)"
        raise ConfigError(
            "f", f, f"a value for which every node's neighbourhood holds the {need} vectors {who} needs",
            f"node {i} has degree {int(deg[i])}: {int(have[i])} vectors ({counted}) < {need}; "
            f"{short.numel()} node(s) short — lower f or use a denser topology",
        )
