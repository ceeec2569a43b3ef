"""The round algorithms: what the workers compute each round and who combines it.

:mod:`~phalanx.training.algorithms.base` is the seam every algorithm is built on (``RoundAlgorithm``, the ``Run`` it
sees, the registry of names); the built-ins are a module each — :mod:`~phalanx.training.algorithms.dsgd`
(distributed SGD with worker momentum), :mod:`~phalanx.training.algorithms.fedavg` (federated averaging, FedProx,
FedBN through :mod:`~phalanx.training.algorithms.fedbn`), :mod:`~phalanx.training.algorithms.scaffold` (SCAFFOLD),
:mod:`~phalanx.training.algorithms.gossip` (decentralized SGD and Decentralized Anytime SGD; one node alone in
:mod:`~phalanx.training.algorithms.gossip_node`); the buffered asynchronous ones on a simulated clock —
:mod:`~phalanx.training.algorithms.fedbuff` (FedBuff), :mod:`~phalanx.training.algorithms.basgd` (BASGD),
:mod:`~phalanx.training.algorithms.kardam` (Kardam) and :mod:`~phalanx.training.algorithms.zenopp` (Zeno++), over
:mod:`~phalanx.training.algorithms.asynchronous` and :mod:`~phalanx.training.algorithms.clock`.
"""

from phalanx.training.algorithms.base import RoundAlgorithm, Run, register

__all__ = ["RoundAlgorithm", "Run", "register"]
