"""The real asynchronous server's checks and buffer (:mod:`phalanx.distributed.async_server`, its steps 1–2): pure
logic, no I/O.

Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022, Alg. 1 (FedBuff): the server
buffers arriving updates with their staleness s = t − version and drops one with s > S (``max_staleness``). One step
holds at most one update per worker — its newest version; an older one of that worker in the step is dropped as
*superseded* — as on the simulated clock, where a worker delivers at most one update per step; one update per worker
that arrives after the buffer filled is held for the next step. With the server's credits
(:mod:`phalanx.distributed.async_credit`) an honest worker has one update in flight, so it is not superseded.

Memory: the (worker, version) pairs seen for the last S + 1 versions (at most (S + 1)·(n − 1)), the step's buffer
(at most one row per worker) and the rows held for the next step (at most one per worker); the record is a count per
(reason, rank), ranks outside the job counted under −1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from phalanx.distributed import wire

REASONS = ("stale", "future", "duplicate", "shape", "nonfinite", "rank", "lost", "superseded", "unpublished",
           "filtered")
"""Why an update was dropped: older than the bound, from a version not yet published, a second one of a worker for
one version, not one row of the model's length, a non-finite value, not from a worker rank, announced but gone, an
older version of a worker whose newer update is in the step (the server keeps each worker's freshest), or a version
before this session's first (after a resume: this session never published it, and the record of what each worker
delivered before the checkpoint is not the buffer's — a Byzantine worker's old version would otherwise be kept after
a newer one of it was aggregated, and the honest server's transcript would fail the audit), or one the algorithm's
filter rejected (Kardam's, Zeno++'s, AFLGuard's: :mod:`phalanx.distributed.async_filters`)."""
@dataclass
class Update:
    """An accepted update: the worker, the version it was computed at, the row."""

    rank: int
    version: int
    row: Tensor
    proof: tuple[str, str, str] | None = None
    """With keys: the update's SHA-256, its worker's signature for (run, version, rank), as the links checked them,
    and the SHA-256 of the θ it was computed at (the first
    :data:`~phalanx.distributed.async_server.THETA_DIGEST` bytes of what it signed; what the
    transcript records: :mod:`phalanx.distributed.async_transcript`)."""
    passed: Tensor | None = None
    """The row the algorithm's filter passed on, when it is not ``row`` (Zeno++'s normalised update); ``row`` stays
    the update as its worker signed it (what the transcript records)."""


@dataclass
class Buffer:
    """The server's checks and buffer (see the module's docstring, steps 1–2): pure logic, no I/O.

    Memory: the (worker, version) pairs seen for the last S + 1 versions (at most (S + 1)·(n − 1)), the step's buffer
    (at most one row per worker) and the rows held for the next step (at most one per worker); the record is a count
    per (reason, rank), ranks outside the job counted under −1.
    """

    workers: int
    dim: int
    dtype: torch.dtype
    max_staleness: int
    version: int = 0
    seen: set[tuple[int, int]] = field(default_factory=set)
    step: list[Update] = field(default_factory=list)
    held: dict[int, Update] = field(default_factory=dict)
    dropped: Counter[tuple[str, int]] = field(default_factory=Counter)
    since: int = 0
    """The first version this session published (the round it started or resumed from): an older one is dropped."""
    newest: dict[int, int] = field(default_factory=dict)
    """Each worker's newest accepted version: an older one after it is dropped as superseded, so the versions a
    worker's aggregated updates carry increase step after step (what the audit checks; an honest worker sends its
    versions in order, a Byzantine one that reorders them is dropped)."""
    judge: Callable[[int, int, Tensor], Tensor | None] | None = None
    """The algorithm's filter on an update that passed every other check (:meth:`~phalanx.distributed.async_filters.
    ProcessFilter.judge`): the row to use, or None — dropped as ``filtered``."""
    judged: list[Update] = field(default_factory=list)
    """The updates of the newest version the filter rejected (at most one per worker): a zero step's record
    (:mod:`phalanx.distributed.async_zero`)."""

    def publish(self, t: int) -> None:
        """Version t is published: forget pairs older than the bound, start the step with the held updates that are
        still within it (older ones dropped as stale)."""
        self.version, self.judged = t, []
        self.seen = {(r, v) for r, v in self.seen if t - v <= self.max_staleness}
        held, self.held, self.step = self.held, {}, []
        for u in held.values():
            if t - u.version > self.max_staleness:
                self.dropped["stale", u.rank] += 1
            else:
                self.step.append(u)

    def offer(self, rank: int, version: int, payload: bytes | bytearray,
              proof: tuple[str, str, str] | None = None) -> str | None:
        """Check one arrival; None when accepted (into the step, or held for the next one), else the reason."""
        reason = self._check(rank, version, payload)
        if reason is not None:
            self.dropped[reason, rank if 1 <= rank < self.workers else -1] += 1
            return reason
        self.seen.add((rank, version))
        self.newest[rank] = max(version, self.newest.get(rank, -1))
        row = wire.bytes_tensor(bytes(payload), self.dtype).clone()
        if not bool(torch.isfinite(row).all()):
            self.dropped["nonfinite", rank] += 1
            return "nonfinite"
        passed = row if self.judge is None else self.judge(rank, version, row)
        if passed is None:
            self.dropped["filtered", rank] += 1
            if version == self.version:
                self.judged.append(Update(rank, version, row, proof))
            return "filtered"
        u = Update(rank, version, row, proof, None if passed is row else passed)
        for i, x in enumerate(self.step):
            if x.rank == rank:  # one per worker in a step: the newer version, in the older one's place
                self.dropped["superseded", rank] += 1
                if x.version > version:
                    return "superseded"
                self.step[i] = u
                return None
        self.step.append(u)
        return None

    def _check(self, rank: int, version: int, payload: bytes | bytearray) -> str | None:
        if not 1 <= rank < self.workers:
            return "rank"
        if version > self.version:
            return "future"
        if version < self.since:
            return "unpublished"
        if self.version - version > self.max_staleness:
            return "stale"
        if (rank, version) in self.seen:
            return "duplicate"
        if version < self.newest.get(rank, -1):
            return "superseded"
        if len(payload) != self.dim * torch.empty((), dtype=self.dtype).element_size():
            return "shape"
        return None

    def counts(self) -> dict[str, int]:
        """Drops per reason over the run."""
        out = dict.fromkeys(REASONS, 0)
        for (reason, _), k in self.dropped.items():
            out[reason] += k
        return out
