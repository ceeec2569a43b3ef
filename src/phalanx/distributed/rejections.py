"""Bounded records of what a keyed job refused: rejections are *counted* per (round, recording rank, rank or peer
address, kind of reason), with a few whole reasons kept as samples, so that what an attacker can make a rank record
does not grow with what it sends.

Every refused connection, frame or row is a :class:`Rejection` (the round of the rank that refused it, the sender's
rank — None for a peer with no listed key —, the reason, and ``at``: the rank that refused it, when it reported it
to rank 0). A :class:`RejectionLog` files each one under its *group*

    key = (round, at, rank, peer, kind)

where ``peer`` is the sender's host for an unlisted sender (taken from the reason's ``from HOST``), None otherwise,
and ``kind`` is the reason with that host written ``HOST`` and every run of digits ``N`` (cut to
:data:`KIND_CHARS`). A group holds a count and at most :data:`SAMPLES` whole reasons (each at most
:data:`REASON_CHARS` characters). At most :data:`GROUPS_PER_ROUND` groups are opened per (round, at), drains
included; a rejection that would open another group is counted in that (round, at)'s *overflow* group (kind
:data:`OVERFLOW`, one per drain). A round's rejections are drained at most twice (at the record of that round and at
the next one, or when the session ends), so a process records at most ``GROUPS_PER_ROUND + 2`` groups of at most
:data:`GROUP_BYTES` bytes per round it ran and recording rank, whatever arrives; ``total`` counts every rejection
(exact).

A rank other than 0 of the sealed mesh reports its rejections to rank 0 through a :class:`Reporter`: the first
:data:`SAMPLES` of a group are reported one by one, with their reasons; the others are counted and reported as one
``count`` each time the group's count reaches a power of two, and when the rank closes (:meth:`Reporter.flush`). A
group of ``c`` rejections costs at most ``SAMPLES + log2(c) + 1`` reports, and rank 0's count is exact once the rank
has closed. Rank 0 reads each report with :func:`parse_report` (types and ranges checked: a malformed report is a
rejection of its own, never an exception) and files it under *its own* round (a reporter cannot name rounds to open
groups with).
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

GROUPS_PER_ROUND = 16
"""Groups kept per (round, recording rank) between two drains; more kinds go to one overflow group."""
SAMPLES = 2
"""Whole reasons kept per group."""
REASON_CHARS = 300
KIND_CHARS = 120
PEER_CHARS = 64
RECENT = 64
"""The most recent rejections kept whole, in memory only (what a test or a debugger looks at)."""
OVERFLOW = "(other kinds: more than the record keeps per round)"
MAX_COUNT = 1 << 62
"""The largest count a group (or a report) may carry."""
GROUP_BYTES = 256 + 6 * (KIND_CHARS + PEER_CHARS + SAMPLES * (REASON_CHARS + 2))
"""The most bytes one group takes as a line of JSON (a character may be escaped as ``\\uXXXX``: six bytes)."""

_PEER = re.compile(r"\bfrom \[?([0-9A-Za-z_.:%-]{1,255})\]?")
_DIGITS = re.compile(r"\d+")


@dataclass
class Rejection:
    """A message or connection that was not used: in which round, from which rank (None: not on the allow-list)."""

    round: int
    rank: int | None
    reason: str
    at: int | None = None
    """The rank that rejected it, when it reported it to rank 0 (None: the rank that holds the record)."""


def peer_and_kind(rank: int | None, reason: str) -> tuple[str | None, str]:
    """The group a reason falls in: the sender's host when it has no listed key, and the reason's kind."""
    peer = None
    if rank is None:
        found = _PEER.search(reason)
        if found:
            peer = found.group(1)[:PEER_CHARS]
            reason = reason.replace(found.group(1), "HOST")
    return peer, _DIGITS.sub("N", reason)[:KIND_CHARS]


@dataclass
class _Group:
    count: int = 0
    samples: list[str] = field(default_factory=list)


class RejectionLog:
    """The bounded record of one rank's rejections (see the module's docstring). Thread-safe; ``len()`` is how many
    rejections were recorded (``total``), iteration and indexing reach the :data:`RECENT` last ones."""

    def __init__(self, groups_per_round: int = GROUPS_PER_ROUND, samples: int = SAMPLES) -> None:
        self.groups_per_round = groups_per_round
        self.samples = samples
        self.total = 0
        """Every rejection recorded (the sum of the counts)."""
        self.appends = 0
        """Calls to :meth:`append` (a report of c rejections is one)."""
        self.recent: deque[Rejection] = deque(maxlen=RECENT)
        self._groups: dict[tuple[int, int, int | None, str | None, str], _Group] = {}
        self._opened: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    def append(self, rejection: Rejection, count: int = 1) -> bool:
        """Record ``count`` rejections like ``rejection``; whether its reason was kept as a sample."""
        count = max(1, min(int(count), MAX_COUNT))
        reason = rejection.reason[:REASON_CHARS]
        at = 0 if rejection.at is None else rejection.at
        peer, kind = peer_and_kind(rejection.rank, reason)
        key = (rejection.round, at, rejection.rank, peer, kind)
        with self._lock:
            self.total += count
            self.appends += 1
            self.recent.append(rejection)
            group = self._groups.get(key)
            if group is None:
                opened = self._opened.get((rejection.round, at), 0)
                if opened >= self.groups_per_round:
                    key = (rejection.round, at, None, None, OVERFLOW)
                    group = self._groups.setdefault(key, _Group())
                else:
                    self._opened[(rejection.round, at)] = opened + 1
                    group = self._groups[key] = _Group()
            group.count = min(group.count + count, MAX_COUNT)
            if len(group.samples) < self.samples:
                group.samples.append(reason)
                return True
            return False

    def drain(self) -> list[dict[str, Any]]:
        """The groups recorded since the last drain, as JSON objects (sorted), and forget them."""
        with self._lock:
            groups, self._groups = self._groups, {}
            if self._opened:  # the budget of a round outlives a drain (rounds only go forward within a process)
                last = max(t for t, _ in self._opened)
                self._opened = {k: v for k, v in self._opened.items() if k[0] >= last - 2}
        out = []
        for (t, at, rank, peer, kind), g in sorted(groups.items(), key=lambda kv: _order(kv[0])):
            out.append({"round": t, "at": at, "rank": rank, "peer": peer, "kind": kind, "count": g.count,
                        "samples": g.samples})
        return out

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[Rejection]:
        with self._lock:
            return iter(list(self.recent))

    def __getitem__(self, index: Any) -> Any:
        with self._lock:
            return list(self.recent)[index]


def _order(key: tuple[int, int, int | None, str | None, str]) -> tuple[Any, ...]:
    t, at, rank, peer, kind = key
    return t, at, -1 if rank is None else rank, peer or "", kind


class Reporter:
    """Which of a mesh rank's rejections to report to rank 0, and when (see the module's docstring). Keeps the
    groups of the current round only; not thread-safe (the mesh calls it under its lock)."""

    def __init__(self, groups_per_round: int = GROUPS_PER_ROUND, samples: int = SAMPLES) -> None:
        self.groups_per_round = groups_per_round
        self.samples = samples
        self.round: int | None = None
        self._groups: dict[tuple[int | None, str | None, str], list[Any]] = {}  # key → [count, unreported, reason]

    def add(self, rejection: Rejection) -> list[dict[str, Any]]:
        """Record one rejection; the reports to send now."""
        reports: list[dict[str, Any]] = []
        if self.round is not None and rejection.round != self.round:
            reports = self.flush()
        self.round = rejection.round
        reason = rejection.reason[:REASON_CHARS]
        peer, kind = peer_and_kind(rejection.rank, reason)
        key: tuple[int | None, str | None, str] = (rejection.rank, peer, kind)
        if key not in self._groups and len(self._groups) >= self.groups_per_round:
            key = (None, None, OVERFLOW)
        group = self._groups.setdefault(key, [0, 0, reason])
        group[0] += 1
        group[2] = reason
        if group[0] <= self.samples:
            reports.append(self._report(key, reason, 1))
        else:
            group[1] += 1
            if group[0] & (group[0] - 1) == 0:  # a power of two: report what accumulated
                reports.append(self._report(key, reason, group[1]))
                group[1] = 0
        return reports

    def flush(self) -> list[dict[str, Any]]:
        """Every count not reported yet (the rank closes, or a new round begins); the groups are forgotten."""
        reports = [self._report(key, g[2], g[1]) for key, g in self._groups.items() if g[1]]
        self._groups = {}
        return reports

    def _report(self, key: tuple[int | None, str | None, str], reason: str, count: int) -> dict[str, Any]:
        return {"round": self.round, "rank": key[0], "reason": reason if key[2] != OVERFLOW else OVERFLOW,
                "count": count}


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def parse_report(payload: bytes | bytearray, workers: int) -> tuple[int | None, str, int] | str:
    """A mesh ``REPORT``'s (rank, reason, count), or what is wrong with it: a JSON object with ``rank`` (a rank of
    the job, or null), ``reason`` (a string), ``count`` (1 … :data:`MAX_COUNT`, default 1) and ``round`` (an
    integer, 0 … 2⁶²; not used: rank 0 files a report under its own round). Nothing a peer sends makes it raise."""
    try:
        item = json.loads(bytes(payload))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        return f"not JSON ({type(exc).__name__})"
    if not isinstance(item, dict):
        return "not a JSON object"
    rank, reason, count = item.get("rank"), item.get("reason"), item.get("count", 1)
    if rank is not None and not _int(rank, 0, workers - 1):
        return f"rank {str(rank)[:20]!r} is not a rank of the job"
    if not isinstance(reason, str):
        return "no reason"
    if not _int(count, 1, MAX_COUNT):
        return f"count {str(count)[:20]!r} is not an integer in 1 … 2^62"
    if not _int(item.get("round"), 0, 1 << 62):
        return f"round {str(item.get('round'))[:20]!r} is not an integer in 0 … 2^62"
    return rank, reason[:REASON_CHARS], count
