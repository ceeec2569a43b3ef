"""Gossip matrices on a :class:`~phalanx.decentralized.topology.Graph`, their spectral gap, and the gossip step.

Every node i keeps its own vector xᵢ ∈ ℝᵈ; the state of the network is the stacked ``(n, d)`` tensor X whose row i
is xᵢ. One gossip step replaces every node's vector by a weighted average of its own and its neighbours'::

    xᵢ ← Σⱼ W_ij xⱼ          i.e.   X ← W X          (W_ij = 0 unless j = i or i — j is an edge)

— one matrix product for all nodes (:func:`gossip`). When W is symmetric and doubly stochastic (W = Wᵀ, W 1 = 1)
the step keeps the average x̄ = (1/n) Σᵢ xᵢ and contracts the disagreement around it by the **mixing rate**
β = ‖W − J/n‖₂ (J the all-ones matrix), the largest eigenvalue magnitude of W other than the eigenvalue 1::

    ‖W X − 1 x̄ᵀ‖_F ≤ β ‖X − 1 x̄ᵀ‖_F

(Xiao & Boyd, "Fast linear iterations for distributed averaging", Systems & Control Letters 53, 2004, where β is
the per-step convergence factor they minimise; Boyd, Ghosh, Prabhakar & Shah, "Randomized gossip algorithms", IEEE
Trans. Information Theory 52(6), 2006). The
**spectral gap** is δ = 1 − β — Koloskova, Stich & Jaggi, "Decentralized stochastic optimization and gossip
algorithms with compressed communication", ICML 2019, who write δ = 1 − |λ₂(W)| with eigenvalues ordered by
magnitude. δ = 1 for the exact average (W = J/n), δ → 0 as the graph mixes worse, δ = 0 for a disconnected graph.
Koloskova et al., "A unified theory of decentralized SGD with changing topology and local updates", ICML 2020,
Assumption 4, use the squared contraction instead: a fixed W satisfies their consensus rate with
p = 1 − β² = δ (2 − δ).

Weights (both built in float64 and then cast to ``dtype``):

- :func:`metropolis_hastings` — symmetric and doubly stochastic on every graph.
- :func:`uniform_neighbour` — row stochastic; symmetric and doubly stochastic only on regular graphs (every node of
  the same degree: ring, torus, complete, hypercube, exponential); on others (star, Erdős–Rényi) the step does not
  keep the average.

:func:`check_gossip_matrix` checks a user's own W against a graph.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from phalanx.decentralized.topology import Graph
from phalanx.errors import ConfigError, InputError
from phalanx.validate import check_choice

__all__ = [
    "KINDS", "check_gossip_matrix", "consensus_distance", "describe", "gossip", "metropolis_hastings",
    "mixing_rate", "operator", "spectral_gap", "tolerance", "uniform_neighbour", "weight_names", "weights",
]

KINDS = ("symmetric", "doubly", "row")
"""What :func:`check_gossip_matrix` can require: ``"symmetric"`` (symmetric and doubly stochastic), ``"doubly"``
(rows and columns sum to 1) or ``"row"`` (rows sum to 1)."""

SPARSE_MIN_NODES = 256
SPARSE_MAX_DENSITY = 0.02
""":func:`operator` stores W as a sparse CSR matrix when n ≥ ``SPARSE_MIN_NODES`` and at most a
``SPARSE_MAX_DENSITY`` share of its entries are non-zero (see :func:`operator` for the measurement)."""


def _check_graph(graph: Any) -> Graph:
    if not isinstance(graph, Graph):
        raise ConfigError("graph", type(graph).__name__, "a phalanx.decentralized.Graph")
    return graph


def _check_dtype(dtype: Any) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError("dtype", dtype, "a floating-point torch.dtype (float16/bfloat16/32/64)")
    return dtype


def tolerance(dtype: torch.dtype, n: int) -> float:
    """How far a row sum (or a symmetric pair) of an ``n``-node gossip matrix in ``dtype`` may be off from exact:
    ``4 · n · eps(dtype)`` — a sum of at most n rounded terms is off by at most about ``n · eps`` (Higham, "Accuracy
    and stability of numerical algorithms", 2nd ed., 2002, Chapter 4), with a safety factor of 4."""
    return 4.0 * max(int(n), 1) * torch.finfo(_check_dtype(dtype)).eps


def metropolis_hastings(graph: Graph, dtype: torch.dtype = torch.float32) -> Tensor:
    """The Metropolis–Hastings weights of ``graph`` as a dense ``(n, n)`` tensor::

        W_ij = 1 / (1 + max(d_i, d_j))   for an edge i — j,
        W_ii = 1 − Σ_{j ∈ N(i)} W_ij,     W_ij = 0 otherwise.

    Symmetric, non-negative (W_ii ≥ 1 − d_i / (1 + d_i) > 0) and doubly stochastic on any graph, built from each
    node's and its neighbours' degrees only: the Metropolis–Hastings heuristic of Xiao & Boyd, "Fast linear
    iterations for distributed averaging", Systems & Control Letters 53, 2004 (also Xiao, Boyd & Lall, "A scheme
    for robust distributed sensor fusion based on average consensus", IPSN 2005; Boyd, Ghosh, Prabhakar & Shah,
    "Randomized gossip algorithms", IEEE Trans. Information Theory 52(6), 2006). On a d-regular graph every weight
    is 1/(d + 1): the same matrix as :func:`uniform_neighbour`.
    """
    graph = _check_graph(graph)
    dtype = _check_dtype(dtype)
    deg = graph.degrees.to(torch.float64)
    w = graph.adjacency.to(torch.float64) / (1.0 + torch.maximum(deg[:, None], deg[None, :]))
    w += torch.diag(1.0 - w.sum(dim=1))
    return w.to(dtype)


def uniform_neighbour(graph: Graph, dtype: torch.dtype = torch.float32) -> Tensor:
    """Equal weights over each node's closed neighbourhood, as a dense ``(n, n)`` tensor::

        W_ij = 1 / (d_i + 1)   for j ∈ N(i) ∪ {i},   W_ij = 0 otherwise.

    Every row sums to 1 (row stochastic): each node averages what it holds and receives. The columns sum to 1 —
    and W is symmetric — only when every node has the same degree (a regular graph); otherwise the step drifts the
    average towards the high-degree nodes' values, so :func:`check_gossip_matrix` with ``kind="symmetric"``
    (the default) refuses it, and :func:`spectral_gap` is defined for it only on regular graphs.
    """
    graph = _check_graph(graph)
    dtype = _check_dtype(dtype)
    closed = graph.adjacency | torch.eye(graph.n, dtype=torch.bool)
    w = closed.to(torch.float64) / (graph.degrees.to(torch.float64) + 1.0)[:, None]
    return w.to(dtype)


_WEIGHTS = {"metropolis_hastings": metropolis_hastings, "uniform_neighbour": uniform_neighbour}


def weight_names() -> list[str]:
    """The names :func:`weights` knows."""
    return sorted(_WEIGHTS)


def weights(name: str, graph: Graph, dtype: torch.dtype = torch.float32) -> Tensor:
    """The gossip matrix ``name`` (``"metropolis_hastings"`` or ``"uniform_neighbour"``) of ``graph``; an unknown
    name is a ConfigError naming ``weights`` with the closest names."""
    return _WEIGHTS[check_choice("weights", name, weight_names())](graph, dtype)


def _dense(w: Any, parameter: str) -> Tensor:
    if not isinstance(w, Tensor):
        raise ConfigError(parameter, type(w).__name__, "a torch.Tensor of shape (n, n)")
    if w.layout != torch.strided:
        w = w.to_dense()
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
        raise ConfigError(parameter, f"shape {tuple(w.shape)}", "a square (n, n) matrix")
    if not w.is_floating_point():
        raise ConfigError(parameter, f"dtype {w.dtype}", "a floating-point matrix")
    return w.detach()


def check_gossip_matrix(
    w: Tensor, graph: Graph | None = None, *, kind: str = "symmetric", parameter: str = "weights",
) -> Tensor:
    """Check a gossip matrix; return it (dense, as given) or raise a one-line ConfigError naming ``parameter``.

    W must be a finite ``(n, n)`` floating-point matrix (n = ``graph.n`` when a graph is given) with

    - no negative entry (below −tol);
    - no weight off the graph's edges: W_ij = 0 exactly unless i = j or i — j is an edge (when ``graph`` is given);
    - rows summing to 1 (``kind="row"``); also columns summing to 1 (``"doubly"``); also W = Wᵀ (``"symmetric"``,
      the default: what :func:`spectral_gap` needs and what keeps the average).

    "Summing to 1" and "symmetric" hold within tol = :func:`tolerance` (``4 · n · eps`` of W's dtype).
    """
    kind = check_choice("kind", kind, KINDS)
    w = _dense(w, parameter)
    n = w.shape[0]
    shape = f"a {n}×{n} matrix"
    if graph is not None:
        graph = _check_graph(graph)
        if n != graph.n:
            raise ConfigError(parameter, shape, f"an {graph.n}×{graph.n} matrix, one row per node of the graph")
    if not bool(torch.isfinite(w).all()):
        i, j = (int(v) for v in torch.nonzero(~torch.isfinite(w))[0])
        raise ConfigError(parameter, shape, "finite entries", f"W[{i}, {j}] = {w[i, j].item()}")
    tol = tolerance(w.dtype, n)
    w64 = w.to(torch.float64)
    if bool((w64 < -tol).any()):
        i, j = (int(v) for v in torch.nonzero(w64 < -tol)[0])
        raise ConfigError(parameter, shape, "non-negative entries", f"W[{i}, {j}] = {w64[i, j].item():.6g}")
    if graph is not None:
        outside = (w != 0) & ~graph.adjacency & ~torch.eye(n, dtype=torch.bool)
        if bool(outside.any()):
            i, j = (int(v) for v in torch.nonzero(outside)[0])
            raise ConfigError(
                parameter, shape, f"weight only on the diagonal and on the edges of the {graph.name} graph",
                f"W[{i}, {j}] = {w64[i, j].item():.6g} but nodes {i} and {j} are not neighbours",
            )
    allowed = {
        "row": "a row-stochastic matrix (rows sum to 1)",
        "doubly": "a doubly stochastic matrix (rows and columns sum to 1)",
        "symmetric": "a symmetric doubly stochastic matrix",
    }[kind]
    rows = (w64.sum(dim=1) - 1.0).abs()
    if bool((rows > tol).any()):
        i = int(torch.argmax(rows))
        raise ConfigError(
            parameter, shape, allowed, f"row {i} sums to {w64[i].sum().item():.9g} (tolerance {tol:.2g})",
        )
    if kind == "symmetric":
        asym = (w64 - w64.T).abs()
        if bool((asym > tol).any()):
            i, j = (int(v) for v in torch.nonzero(asym == asym.max())[0])
            hint = f"W[{i}, {j}] = {w64[i, j].item():.6g} but W[{j}, {i}] = {w64[j, i].item():.6g}"
            if graph is not None and int(graph.degrees.min()) != int(graph.degrees.max()):
                hint += "; uniform-neighbour weights are symmetric only on regular graphs: use metropolis_hastings"
            raise ConfigError(parameter, shape, allowed, hint)
    if kind in ("doubly", "symmetric"):
        cols = (w64.sum(dim=0) - 1.0).abs()
        if bool((cols > tol).any()):
            j = int(torch.argmax(cols))
            raise ConfigError(
                parameter, shape, allowed, f"column {j} sums to {w64[:, j].sum().item():.9g} (tolerance {tol:.2g})",
            )
    return w


def mixing_rate(w: Tensor) -> float:
    """β = ‖W − J/n‖₂ = max(|λ₂(W)|, |λₙ(W)|), the largest eigenvalue magnitude of a symmetric doubly stochastic
    W other than its eigenvalue 1: each gossip step contracts the distance to consensus by β at least,
    ‖W X − 1 x̄ᵀ‖_F ≤ β ‖X − 1 x̄ᵀ‖_F (Xiao & Boyd 2004). β = 0 for W = J/n; β = 1 when the graph is
    disconnected (or W is periodic, eigenvalue −1).

    W is checked first (:func:`check_gossip_matrix`, ``kind="symmetric"``); the eigenvalues of W − J/n come from
    ``torch.linalg.eigvalsh`` in float64.
    """
    w = check_gossip_matrix(w, kind="symmetric")
    n = w.shape[0]
    w64 = w.to(torch.float64)
    w64 = (w64 + w64.T) / 2 - torch.full((n, n), 1.0 / n, dtype=torch.float64)
    return float(torch.linalg.eigvalsh(w64).abs().max())


def spectral_gap(w: Tensor) -> float:
    """δ = 1 − β = 1 − |λ₂(W)| (eigenvalues ordered by magnitude, λ₁ = 1) of a symmetric doubly stochastic W —
    the "spectral gap" (eigengap) δ of Koloskova, Stich & Jaggi, ICML 2019. In (0, 1] for a connected
    graph with a W that is not periodic: 1 for the exact average J/n, small for a slowly mixing graph (a ring's
    δ is Θ(1/n²)). See :func:`mixing_rate`."""
    return 1.0 - mixing_rate(w)


def describe(graph: Graph, w: Tensor) -> dict[str, Any]:
    """What a run reports about its communication: the graph's :meth:`~Graph.describe` plus ``spectral_gap`` and
    ``mixing_rate`` of W (checked against the graph)."""
    w = check_gossip_matrix(w, _check_graph(graph), kind="symmetric")
    beta = mixing_rate(w)
    return {**graph.describe(), "spectral_gap": 1.0 - beta, "mixing_rate": beta}


def operator(w: Tensor) -> Tensor:
    """W in the layout that makes :func:`gossip` fastest: a sparse CSR tensor when the graph is large and sparse
    (n ≥ ``SPARSE_MIN_NODES`` = 256 and at most ``SPARSE_MAX_DENSITY`` = 2 % of the entries non-zero, in float32 or
    float64), the dense matrix otherwise. Compute W once, convert it once, and gossip with the result every step.

    Measured on CPU (torch 2.13, one thread, best of 7): on a 25 × 40 torus (n = 1000, 5 non-zeros per row) one
    step took 2.75 ms dense vs 0.08 ms CSR at d = 100, 26 vs 7.3 ms at d = 1000, 276 vs 73 ms at d = 10⁴ (COO was
    no faster than CSR). On circulant graphs with 2k + 1 non-zeros per row, CSR was 4–20× faster at n = 1000 up
    to 1.7 % density and about even at 6.5 %, even at n = 256 and d = 10⁴, and 2–4× slower than dense at n ≤ 64
    whatever the density (dense BLAS wins on small matrices).
    """
    w = _dense(w, "weights")
    n = w.shape[0]
    nnz = int(torch.count_nonzero(w))
    if n >= SPARSE_MIN_NODES and nnz <= SPARSE_MAX_DENSITY * n * n and w.dtype in (torch.float32, torch.float64):
        with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            return w.to_sparse_csr()
    return w


def gossip(w: Tensor, x: Tensor) -> Tensor:
    """One gossip step for every node at once: ``X ← W X``, i.e. ``xᵢ ← Σⱼ W_ij xⱼ``.

    ``x`` is the stacked ``(n, d)`` state (row i is node i's vector); ``w`` the ``(n, n)`` gossip matrix, dense or
    sparse (CSR from :func:`operator`). One matrix product, no loop over nodes; W is cast to X's dtype (and device)
    when they differ — build W in X's dtype (and put it through :func:`operator`) once to avoid the cast at every
    step. W is not re-checked here (:func:`check_gossip_matrix` once, before the run).
    """
    if not isinstance(x, Tensor) or x.ndim != 2:
        got = f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise InputError("gossip: x", got, "a 2-D (n, d) tensor, one row per node")
    if not x.is_floating_point():
        raise InputError("gossip: x", f"dtype {x.dtype}", "a floating-point dtype")
    if not isinstance(w, Tensor) or w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[1] != x.shape[0]:
        got = f"shape {tuple(w.shape)}" if isinstance(w, Tensor) else type(w).__name__
        raise InputError("gossip: w", got, f"a ({x.shape[0]}, {x.shape[0]}) matrix, one row per node of x")
    if w.dtype != x.dtype or w.device != x.device:
        w = w.to(device=x.device, dtype=x.dtype)
    return w @ x


def consensus_distance(x: Tensor) -> float:
    """Ξ² = (1/n) Σᵢ ‖xᵢ − x̄‖², the mean squared distance of the nodes' vectors to their average (Kong et al.,
    "Consensus control for decentralized deep learning", ICML 2021, Section 3), computed in float64."""
    if not isinstance(x, Tensor) or x.ndim != 2 or not x.is_floating_point():
        got = f"shape {tuple(x.shape)}, dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
        raise InputError("consensus_distance: x", got, "a floating-point (n, d) tensor")
    x64 = x.detach().to(torch.float64)
    return float(((x64 - x64.mean(dim=0)) ** 2).sum(dim=1).mean())
