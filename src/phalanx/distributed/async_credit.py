"""Flow control of the real asynchronous server: a worker computes its next update only on a credit of rank 0.

Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022, Alg. 1: the server keeps a
fixed number of clients training *concurrently* and starts a new one when an update comes back, so the clients
produce what the server consumes. Without it each worker rank computes on every version it is sent; with n − 1
workers and a buffer of K the workers produce (n − 1)/K updates per step for K taken, and the rest is thrown away
(measured: docs/async.md, "Flow control").

**The rule.** Rank 0 keeps, per worker w, a cumulative count ``granted[w]`` and at most one outstanding credit (the
version g_w it was granted at). Publishing version t it first *settles* w's credit when an update of w with a version
≥ g_w arrived and is no longer in the buffer (it was aggregated or dropped, for any reason), or *expires* it when
t − g_w > S (S = ``max_staleness``: any update of that credit would arrive stale; the credit was lost, or the worker
crashed or is slow); then every worker without an outstanding credit is granted one (``granted[w] += 1``, g_w = t).
Version t's message carries the counts of every rank. A worker that has sent c updates computes on a version whose
message gives it ``granted[w] > c``, else it waits for the next version. So an honest worker has at most one update
in flight (two when it read a version after its credit expired), and the honest updates computed are at most

    aggregated + dropped (each with its reason) + n − 1 (in flight when the run stops; C with concurrency) + expired
    credits.

**Concurrency** (``algorithm_params.concurrency`` C, FedBuff only: K + f ≤ C ≤ n − 1 — f silent credit holders,
Byzantine ranks with their own keys or crashed ones, must leave K that deliver). Without it every worker without an
outstanding credit is granted one, so n − 1 are in flight and the staleness is about (n − 1)/K − 1 (Little's law).
With it, after settling and expiring, rank 0 grants only C − (outstanding) credits, so **at most C are outstanding at
once**, to the workers without one in a deterministic fair order: the ones that have waited longest first —
a worker waits from the version its last credit was settled or given up at (version 0 for one never granted) — ties by
rank. A worker that just delivered therefore goes behind every worker already waiting, and the credits turn over the
workers like a queue. Liveness: a step takes K updates of C ≥ K credited workers; publishing the next version
settles those K and grants K again, so C stay outstanding. A lost update or a crashed worker holds its credit until it
expires (S versions), during which the server steps on the other C − 1 — it tolerates C − K such credits within a
step (n − 1 − K without concurrency); more, and the step waits until ``round_timeout`` (the loop stops with a
checkpoint, as for any silent step).

**Deadlock freedom.** The counts are cumulative and re-sent with every version: a lost message is made good by the
next one; a lost update or a crashed worker costs that worker S + 1 versions, never the server, which waits on the
next arrival of any worker (:mod:`phalanx.distributed.async_server`). **Authentication.** With keys the counts travel
inside rank 0's θ frame on its sealed downlink (mutual TLS: no one else can write it); a message whose trailer is not
well formed gives no credit (:func:`split`). A credit is settled only by an arrival the links attributed to w (with
keys: signed by w). A Byzantine worker that ignores credits is held by the caps every arrival meets: one update per
worker per step and one held (:class:`~phalanx.distributed.async_buffer.Buffer`), one per version within S + 1
versions on the sealed links, and the step's bounded reading of store notices (``AsyncServer.drain_cap``).

Wire: ``THETA ‖ θ ‖ counts ‖ k`` — k (uint32, little-endian) counts of int64, one per rank of the job (index =
rank); k = 0 means no flow control (the filtering algorithms, whose zero step waits for every live worker's update of
the newest version: :mod:`phalanx.distributed.async_zero`). The θ digest a worker signs is of θ alone. A worker's
sealed links take a θ frame of up to 1 + row + 8n + 4 bytes (:class:`~phalanx.distributed.sealed.SealedWorkerLinks`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

COUNT = struct.Struct("<q")
TAIL = struct.Struct("<I")


def trailer(counts: list[int] | None) -> bytes:
    """The bytes after θ in a version's message: the counts (None: no flow control), then their number."""
    counts = counts or []
    return b"".join(COUNT.pack(c) for c in counts) + TAIL.pack(len(counts))


def split(msg: bytes, theta_bytes: int, ranks: int) -> tuple[bytes, list[int] | None] | None:
    """``msg`` (``THETA ‖ θ ‖ counts ‖ k``) as (θ, counts or None when it carries none); None when it is not well
    formed (θ not ``theta_bytes`` long, k neither 0 nor ``ranks``, a negative count): such a message gives no
    credit and is not computed on."""
    if len(msg) < 1 + theta_bytes + TAIL.size:
        return None
    (k,) = TAIL.unpack_from(msg, len(msg) - TAIL.size)
    if k not in (0, ranks) or len(msg) != 1 + theta_bytes + k * COUNT.size + TAIL.size:
        return None
    theta = msg[1:1 + theta_bytes]
    if k == 0:
        return theta, None
    counts = [COUNT.unpack_from(msg, 1 + theta_bytes + i * COUNT.size)[0] for i in range(k)]
    return (theta, counts) if min(counts) >= 0 else None


@dataclass
class Credits:
    """Rank 0's ledger (the module's docstring). Memory: three numbers per worker."""

    workers: int
    """n, the ranks of the job (workers are 1 … n − 1)."""
    max_staleness: int
    granted: list[int] = field(default_factory=list)
    owed: dict[int, int] = field(default_factory=dict)
    """Each worker's outstanding credit: the version it was granted at."""
    answered: dict[int, int] = field(default_factory=dict)
    """Each worker's newest version that arrived (whatever became of it)."""
    expired: int = 0
    """Credits given up after S versions (and granted again)."""
    concurrency: int | None = None
    """C: at most this many credits outstanding at once (None: one for every worker)."""
    waiting: dict[int, int] = field(default_factory=dict)
    """With C: the version each worker without a credit has waited since (its last credit settled or given up)."""
    most: int = 0
    """The most credits outstanding at once so far (after a grant)."""

    def __post_init__(self) -> None:
        self.granted = [0] * self.workers

    def arrived(self, rank: int, version: int) -> None:
        """An update of ``rank`` (as the links attribute it) of ``version`` arrived."""
        if 1 <= rank < self.workers:
            self.answered[rank] = max(version, self.answered.get(rank, -1))

    def publish(self, t: int, pending: set[int]) -> list[int]:
        """Version t is published; ``pending``: the workers with an update in the buffer now. Settle, expire and
        grant (the module's docstring); the counts version t's message carries."""
        for w in range(1, self.workers):
            g = self.owed.get(w)
            if g is not None and w not in pending:
                if self.answered.get(w, -1) >= g:
                    del self.owed[w]
                    self.waiting[w] = t
                elif t - g > self.max_staleness:
                    del self.owed[w]
                    self.waiting[w] = t
                    self.expired += 1
            if self.concurrency is None and w not in self.owed:
                self.granted[w] += 1
                self.owed[w] = t
        if self.concurrency is not None:
            free = sorted((self.waiting.get(w, 0), w) for w in range(1, self.workers) if w not in self.owed)
            for _, w in free[:max(0, self.concurrency - len(self.owed))]:
                self.granted[w] += 1
                self.owed[w] = t
                self.waiting.pop(w, None)
        self.most = max(self.most, len(self.owed))
        return list(self.granted)


def may_compute(counts: list[int] | None, rank: int, computed: int) -> bool:
    """Whether a worker that has sent ``computed`` updates may compute on a version whose message carries
    ``counts`` (None: no flow control, it may)."""
    return counts is None or counts[rank] > computed
