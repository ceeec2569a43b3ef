"""FLAME: cosine clustering, clipping to the median norm and Gaussian noise (Nguyen et al., USENIX Security 2022)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import clipped_mean, cosine_matrix, float64_gram, median_norm, row_norms
from phalanx.aggregators.base import (
    Aggregator,
    RuleTags,
    as_compute_dtype,
    check_positive,
    random_source,
)
from phalanx.aggregators.registry import register
from phalanx.errors import ConfigError

__all__ = ["FLAME", "cosine_distances", "majority_cluster"]


def cosine_distances(x: Tensor, bad: Tensor) -> Tensor:
    r"""``1 − cos(xᵢ, xⱼ)`` for every pair of rows, float64 ``(n, n)`` on the CPU, from a Gram matrix summed in
    float64 column chunk by column chunk (no float64 copy of ``x``). A bad row is infinitely far from every row
    (itself included: it is nobody's neighbour); a zero row has cosine 0 with every row (distance 1)."""
    good = ~bad.cpu()
    cos, _ = cosine_matrix(float64_gram(x, good).cpu(), good)
    dist = 1.0 - cos
    dist.fill_diagonal_(0.0)
    far = ~good[:, None] | ~good[None, :]
    return torch.where(far, torch.full_like(dist, float("inf")), dist)


def _minimum_spanning_tree(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Prim's algorithm on a dense symmetric ``(n, n)`` weight matrix: the ``n − 1`` edges ``(a, b, weight)``.

    Inherently sequential in the vertices (one vertex joins per step); each step is one vectorised pass over n.
    Ties go to the lowest vertex index.
    """
    n = w.shape[0]
    inside = torch.zeros(n, dtype=torch.bool)
    inside[0] = True
    best = w[0].clone()
    parent = torch.zeros(n, dtype=torch.int64)
    a = torch.empty(n - 1, dtype=torch.int64)
    b = torch.empty(n - 1, dtype=torch.int64)
    weight = torch.empty(n - 1, dtype=torch.float64)
    inf = torch.tensor(float("inf"), dtype=torch.float64)
    for step in range(n - 1):
        candidate = torch.where(inside, inf, best)
        j = int(torch.argmin(torch.nan_to_num(candidate, nan=float("inf"))))
        if bool(inside[j]):  # every remaining vertex is at +inf and argmin found an inside one: take the first
            j = int((~inside).nonzero()[0])
        a[step], b[step], weight[step] = parent[j], j, candidate[j]
        inside[j] = True
        closer = ~inside & (w[j] < best)
        best = torch.where(closer, w[j], best)
        parent = torch.where(closer, torch.full_like(parent, j), parent)
    return a, b, weight


def majority_cluster(dist: Tensor, min_cluster_size: int | None = None, min_samples: int = 1) -> Tensor:
    r"""The points HDBSCAN puts in its cluster when no two clusters can coexist, as FLAME runs it: a boolean
    ``(n,)`` mask.

    FLAME (Nguyen et al., USENIX Security 2022, Algorithm 1) runs the ``hdbscan`` library with
    ``min_cluster_size = n/2 + 1``, ``min_samples = 1`` and ``allow_single_cluster = True`` on the cosine
    distances. A cluster then holds more than half of the points, so the condensed tree has no split into two
    clusters and HDBSCAN's answer is its root cluster; the steps below compute that answer directly (Campello,
    Moulavi & Sander, PAKDD 2013; the ``hdbscan`` library's labelling of a single root cluster):

    1. core distance :math:`c_i`: the distance to the ``min_samples``-th nearest *other* point (the ``hdbscan``
       library counts ``min_samples`` without the point itself; scikit-learn's ``HDBSCAN`` counts it, so its
       ``min_samples = 2`` is this 1); mutual reachability :math:`m_{ij} = \max(c_i, c_j, d_{ij})`;
    2. the single-linkage tree of :math:`m` (its minimum spanning tree, merged in increasing order);
    3. from the root down: a split whose smaller side has fewer than ``min_cluster_size`` points lets those points
       fall out at that distance and the cluster continues in the larger side; the first split whose two sides are
       both too small lets every remaining point fall out there;
    4. the cluster is the points that fell out last — at the smallest such distance (``λ = 1/distance`` at least
       the largest λ of the root's children, in the library's terms); every other point is noise.

    ``min_cluster_size`` defaults to ``n // 2 + 1`` and must exceed ``n / 2``. Infinite distances (bad rows) are
    allowed: such points fall out first.
    """
    n = dist.shape[0]
    mcs = n // 2 + 1 if min_cluster_size is None else int(min_cluster_size)
    if not n / 2 < mcs <= n:
        raise ConfigError("min_cluster_size", mcs, f"an integer in (n/2, n] = ({n / 2:g}, {n}] (one cluster)")
    if n <= 2:
        return torch.ones(n, dtype=torch.bool)
    d = dist.to(device="cpu", dtype=torch.float64)
    off = d.clone()
    off.fill_diagonal_(float("inf"))
    k = min(int(min_samples), n - 1)
    core = off.sort(dim=1).values[:, k - 1] if k >= 1 else torch.zeros(n, dtype=torch.float64)
    reach = torch.maximum(d, torch.maximum(core[:, None], core[None, :]))
    a, b, w = _minimum_spanning_tree(reach)
    order = torch.sort(w, stable=True).indices.tolist()
    # Kruskal's merges in increasing distance: node n + s joins two components (the dendrogram).
    root_of = list(range(n))

    def find(i: int) -> int:
        while root_of[i] != i:
            root_of[i] = root_of[root_of[i]]
            i = root_of[i]
        return i

    node_of = list(range(n))  # component representative -> its dendrogram node
    left = [0] * (n - 1)
    right = [0] * (n - 1)
    height = [0.0] * (n - 1)
    size = [1] * n + [0] * (n - 1)
    for s, e in enumerate(order):
        ra, rb = find(int(a[e])), find(int(b[e]))
        left[s], right[s], height[s] = node_of[ra], node_of[rb], float(w[e])
        size[n + s] = size[node_of[ra]] + size[node_of[rb]]
        root_of[rb] = ra
        node_of[ra] = n + s

    def leaves(node: int) -> list[int]:
        out, stack = [], [node]
        while stack:
            v = stack.pop()
            if v < n:
                out.append(v)
            else:
                stack += [left[v - n], right[v - n]]
        return out

    fell = torch.full((n,), float("inf"), dtype=torch.float64)  # the distance at which each point fell out
    node = 2 * n - 2
    last = float("inf")
    while node >= n:
        lo, hi, h = left[node - n], right[node - n], height[node - n]
        big, small = (lo, hi) if size[lo] >= size[hi] else (hi, lo)
        last = h
        fell[leaves(small)] = h
        if size[big] < mcs:  # both sides too small: the cluster ends here
            fell[leaves(big)] = h
            break
        node = big
    return fell <= last


@register
class FLAME(Aggregator):
    r"""FLAME: keep the majority cluster of the cosine distances, clip every kept update to the median norm,
    average, and add Gaussian noise scaled to that norm.

    Nguyen et al., "FLAME: Taming backdoors in federated learning", USENIX Security 2022 (arXiv 2101.02281),
    Algorithm 1. With the updates :math:`\Delta_i` (FedAvg's pseudo-gradients :math:`W_{t-1} - W_i`):

    1. clustering: HDBSCAN on :math:`c_{ij} = 1 - \cos(\Delta_i, \Delta_j)` with ``min_cluster_size = n/2 + 1``,
       ``min_samples = 1``, a single cluster allowed; the admitted set :math:`\mathcal{A}` is that cluster
       (:func:`majority_cluster`), more than half of the rows;
    2. adaptive clipping: :math:`S_t = \mathrm{median}_i \lVert \Delta_i \rVert` over all n rows (the paper's
       median of the Euclidean distances :math:`\lVert W_{t-1} - W_i\rVert`), each admitted update scaled by
       :math:`\min(1, S_t / \lVert \Delta_i \rVert)`;
    3. aggregation and noise: :math:`\frac{1}{|\mathcal{A}|} \sum_{i \in \mathcal{A}} \Delta_i \min(1, S_t /
       \lVert\Delta_i\rVert) + \mathcal{N}(0, \sigma^2 I)` with :math:`\sigma = \lambda S_t` (``noise`` = λ,
       default 0.001, the paper's value for image classification). The noise lands on the model through the
       server's step (its learning rate scales it; FedAvg's server step of 1 adds it as the paper does).

    Deviation, on purpose: the paper clusters the local *models* :math:`W_i`; a Phalanx rule receives the updates,
    so the cosines are those of the updates (the models' cosines are dominated by the shared global model; the
    updates' are what differs between clients). The clipping bound and the noise are the paper's exactly, since
    :math:`\lVert W_{t-1} - W_i\rVert = \lVert\Delta_i\rVert`.

    The clustering is implemented here, in torch (:func:`majority_cluster`), rather than by the ``hdbscan``
    package: with a cluster larger than n/2 HDBSCAN's answer reduces to one walk down the single-linkage tree of
    the mutual-reachability distances, which is exact, deterministic, dependency-free and O(n²) after the
    distances (tests/test_flame.py checks it against scikit-learn's ``HDBSCAN`` with the same settings).

    The noise is drawn from the ``generator=`` the caller passes per call (a training run passes its server's
    ``aggregator`` stream, so a resumed run is bit-for-bit equal), else from the rule's own generator seeded with
    ``seed``; float64 normal draws on the CPU, cast to the input's dtype.

    Robustness conventions (ours): bad rows (NaN/Inf, or an overflowing norm) are infinitely far from every row
    and never admitted, and count as +inf in the median. ``f`` is not used by the rule; ``n > 2f`` states the
    honest majority its majority cluster relies on. Contributions: :math:`1/|\mathcal{A}|` on each admitted row.
    ε and κ: not known; ``None``.
    """

    name: ClassVar[str] = "flame"
    floor = "gemm"
    reference: ClassVar[str] = (
        "T. D. Nguyen, P. Rieger, H. Chen, H. Yalame, H. Möllering, H. Fereidooni, S. Marchal, M. Miettinen, "
        "A. Mirhoseini, S. Zeitouni, F. Koushanfar, A.-R. Sadeghi, T. Schneider, 'FLAME: Taming backdoors in "
        "federated learning', USENIX Security 2022 (arXiv 2101.02281), Algorithm 1"
    )
    requirement = "n > 2f (honest majority for the n/2 + 1 cluster; f itself is not used by the rule)"
    context_keys = frozenset({"generator"})
    pairwise_matrices = 5  # the Gram matrix, the distances, their sorted copy, mutual reachability, the tree's mask
    # Cosines and norms are measured from the origin; the noise makes n identical rows give that row plus noise.
    tags = RuleTags(translation=False, identical=False)

    def __init__(self, f: int = 0, noise: float = 0.001, seed: int = 0) -> None:
        super().__init__(f)
        self.noise = float(check_positive("noise", noise))
        self.seed = int(check_positive("seed", seed, integer=True, allow_zero=True))
        self._generator = torch.Generator().manual_seed(self.seed)

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        d = x.shape[1]
        xc = as_compute_dtype(x)
        norms, bad = row_norms(xc)
        admitted = majority_cluster(cosine_distances(xc.detach(), bad)).to(x.device) & ~bad
        med = median_norm(norms, bad)
        out, share = clipped_mean(xc, admitted, norms, bad, med)
        level = float(med.detach())
        sigma = self.noise * level if level < float("inf") else 0.0
        z = torch.randn(d, generator=random_source(context, self._generator), dtype=torch.float64)
        out = out + (sigma * z).to(device=x.device, dtype=out.dtype)
        return out.to(x.dtype), (share if want_contributions else None)
