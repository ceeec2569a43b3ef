"""Decentralized learning without a server: communication graphs and gossip matrices.

>>> from phalanx.decentralized import gossip, gossip_attacks, robust_gossip, topology
>>> g = topology.make("ring", 8)
>>> W = gossip.metropolis_hastings(g)
>>> round(gossip.spectral_gap(W), 4)
0.1953

Every node keeps its own model: the network's state is a stacked ``(n, d)`` tensor X (row i is node i's vector) and
one gossip step is one matrix product, ``gossip.gossip(W, X) = W @ X``, for all nodes at once.

- :mod:`~phalanx.decentralized.topology`: :class:`Graph`, the builders (``ring``, ``torus``, ``complete``, ``star``,
  ``erdos_renyi``, ``exponential``, ``hypercube``) behind ``topology.make(name, n, **params)``, a user's own graph
  (:func:`from_adjacency`) and :func:`check_neighbourhood` (does every node have enough neighbours for its rule's f).
- :mod:`~phalanx.decentralized.gossip`: Metropolis–Hastings and uniform-neighbour weights, :func:`check_gossip_matrix`,
  :func:`spectral_gap` and :func:`mixing_rate`, the step ``gossip.gossip(W, X)``.
- :mod:`~phalanx.decentralized.robust_gossip`: robust gossip rules (``clipped_gossip``, ``cs_plus``, ``ios``,
  ``monna``), batched over nodes.
- :mod:`~phalanx.decentralized.gossip_attacks`: attacks that use the graph (``dissensus``, ``spectral``).

Training over a graph is the round algorithm :class:`phalanx.training.algorithms.gossip.Gossip` (``algorithm =
"gossip"``), which uses these graphs and matrices. See docs/decentralized.md.
"""

from phalanx.decentralized import gossip, gossip_attacks, robust_gossip, topology
from phalanx.decentralized.gossip import (
    check_gossip_matrix,
    consensus_distance,
    metropolis_hastings,
    mixing_rate,
    spectral_gap,
    uniform_neighbour,
)
from phalanx.decentralized.topology import Graph, check_neighbourhood, from_adjacency

__all__ = [
    "Graph", "check_gossip_matrix", "check_neighbourhood", "consensus_distance", "from_adjacency", "gossip",
    "gossip_attacks", "metropolis_hastings", "mixing_rate", "robust_gossip", "spectral_gap", "topology",
    "uniform_neighbour",
]
