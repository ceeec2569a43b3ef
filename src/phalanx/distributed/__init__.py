"""The ``torchrun`` engine: every worker its own process, on one machine or many (docs/distributed.md).

Both engines run the same round (:mod:`phalanx.training.round`): batches, local momentum, Byzantine vectors,
aggregation and step are the same functions; this package only decides *where* each phase runs and how the vectors
travel.

* :mod:`~phalanx.distributed.env` — the torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` …) and the
  c10d ``TCPStore``;
* :mod:`~phalanx.distributed.wire` — tensors ↔ bytes, key names, byte counts;
* :mod:`~phalanx.distributed.local` — one rank's own worker: its batches, momentum and (if Byzantine) attack;
* :mod:`~phalanx.distributed.recorder` — rank 0's run directory (the same files as the simulated engine);
* :mod:`~phalanx.distributed.server` — parameter-server topology, tolerant of crashed and silent workers;
* :mod:`~phalanx.distributed.serverless` — server-free topology (all-gather; needs every rank alive);
* :mod:`~phalanx.distributed.worker` — the per-rank entry point (``torchrun … -m phalanx.distributed.worker``);
* :mod:`~phalanx.distributed.launch` and :mod:`~phalanx.distributed.cli` — ``phalanx launch`` on one machine.
"""

from phalanx.distributed.errors import TransportError, WorkersLostError

__all__ = ["TransportError", "WorkersLostError"]
