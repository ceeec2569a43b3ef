"""The ``torchrun`` engine: every worker its own process, on one machine or many (docs/distributed.md).

Both engines run the same loop (:class:`phalanx.training.loop.Loop`) and the same round algorithm; this package
provides the transports that cross processes and the per-rank entry point:

* :mod:`~phalanx.distributed.env` — the torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` …) and the
  c10d ``TCPStore``;
* :mod:`~phalanx.distributed.wire` — tensors ↔ bytes, key names, byte counts;
* :mod:`~phalanx.distributed.parameter_server` — parameter-server topology, tolerant of crashed and silent workers;
* :mod:`~phalanx.distributed.serverless` — server-free topology (all-gather; needs every rank alive);
* :mod:`~phalanx.distributed.neighbours` — gossip topology (point to point with the graph neighbours), over the links
  of :mod:`~phalanx.distributed.gossip_links`;
* with keys: :mod:`~phalanx.distributed.keys` (identities, the allow-list), :mod:`~phalanx.distributed.channel`
  (TLS contexts, frames), :mod:`~phalanx.distributed.admission` (how a listener admits connections: one thread,
  deadlines, caps per source), :mod:`~phalanx.distributed.rendezvous` (where ranks listen, what is read from the
  store), :mod:`~phalanx.distributed.sealed` (the parameter server's sealed links),
  :mod:`~phalanx.distributed.mesh` (the serverless and gossip topologies' sealed mesh) and
  :mod:`~phalanx.distributed.transcript` (who was heard, ``phalanx audit``; bound to the run's checkpoint by
  :mod:`~phalanx.distributed.binding`; appended and marked at each checkpoint by :mod:`~phalanx.distributed.chain`);
* :mod:`~phalanx.distributed.recording` — rank 0's ``distributed.json`` and messages (loop callbacks);
* :mod:`~phalanx.distributed.worker` — the per-rank entry point (``torchrun … -m phalanx.distributed.worker``);
* :mod:`~phalanx.distributed.launch` and :mod:`~phalanx.distributed.cli` — ``phalanx launch`` on one machine.
"""

from phalanx.distributed.errors import TransportError, WorkersLostError

__all__ = ["TransportError", "WorkersLostError"]
