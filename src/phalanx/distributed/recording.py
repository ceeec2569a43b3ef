"""What rank 0 records besides the run directory: ``distributed.json`` (per round: wall time, missing ranks, payload
bytes; in its summary, rank 0's peak resident memory) and its messages on stderr. Both are callbacks of the training
loop; only rank 0 has them. (Rank 0's transcript of who was heard, :mod:`phalanx.distributed.transcript`, is a
:class:`WrittenWithCheckpoints` too.)"""

from __future__ import annotations

import json
import resource
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.experiments import dirfd
from phalanx.experiments.runfiles import damaged, read_json
from phalanx.experiments.store import writing
from phalanx.training.loop import Callback, Loop, RoundInfo
from phalanx.training.state import Snapshot


@dataclass
class RoundLog:
    """What rank 0 saw of one round."""

    round: int
    seconds: float
    missing: list[int]
    sent: int
    received: int


class WrittenWithCheckpoints(Callback):
    """A record of rank 0's that is written with every checkpoint (``due``: the run directory's schedule,
    ``RunDirectory.checkpoints``), when the run stops early and at the end; subclasses say what a round adds
    (:meth:`record`) and how the record is written (:meth:`write`)."""

    def __init__(self, due: Callable[[int], bool]) -> None:
        self.due = due

    def record(self, loop: Loop, info: RoundInfo) -> None:
        """What round ``info.round`` adds to the record (before it may be written)."""

    def write(self) -> None:
        """Write the record (atomically)."""
        raise NotImplementedError

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        self.record(loop, info)
        if self.due(loop.state.round):
            self.write()

    def on_abort(self, loop: Loop, snapshot: Snapshot) -> str | None:
        self.write()
        return None

    def on_finish(self, loop: Loop) -> None:
        self.write()


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (``getrusage``: KiB on Linux, bytes on macOS) — what an
    attacker who makes rank 0 record things would grow."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)


ROW_FIELDS = {"round", "seconds", "missing", "sent", "received"}
"""The fields of a round's row in ``distributed.json``."""


def log_bytes(rounds: int, world_size: int) -> int:
    """The most bytes a ``distributed.json`` of ``rounds`` rounds and ``world_size`` ranks is read back with: its
    summary (64 KiB), and per round a row (512 bytes: four numbers and its indentation) with every rank missing (16
    bytes each, one a line with ``indent=1``)."""
    return (64 << 10) + (rounds + 1) * (512 + 16 * world_size)


def _count(value: object, high: int = 1 << 62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high


class DistributedLog(WrittenWithCheckpoints):
    """``distributed.json`` in the run directory (written with every checkpoint, when the run stops early and at the
    end); on resume, the rounds logged before the checkpoint are kept."""

    def __init__(self, path: Path, topology: str, world_size: int, due: Callable[[int], bool]) -> None:
        super().__init__(due)
        self.path = path
        self.topology = topology
        self.world_size = world_size
        self.log: list[RoundLog] = []

    def on_start(self, loop: Loop) -> None:
        if loop.resumed:
            self.log = [r for r in self.read(loop.experiment.rounds) if r.round < loop.state.round]

    def read(self, rounds: int) -> list[RoundLog]:
        """The rounds logged in ``distributed.json`` (none if it is missing), read back with bounded memory: at most
        :func:`log_bytes` of ``rounds`` (:func:`~phalanx.experiments.runfiles.read_json`: a symbolic link is not
        followed, a FIFO or a device is refused without blocking), every row :data:`ROW_FIELDS` with their types and
        ranges; anything else is one :class:`~phalanx.errors.ConfigError` naming the file (issue 38, finding 8)."""
        try:
            doc = read_json(self.path, log_bytes(rounds, self.world_size))
        except FileNotFoundError:
            return []
        rows = doc.get("rounds") if isinstance(doc, dict) else None
        if not isinstance(rows, list) or len(rows) > rounds + 1:
            raise damaged(self.path, f"not an object whose 'rounds' is a list of at most {rounds + 1} rows")
        log = []
        for i, r in enumerate(rows):
            if not (isinstance(r, dict) and set(r) == ROW_FIELDS and _count(r["round"], rounds)
                    and _count(r["sent"]) and _count(r["received"])
                    and isinstance(r["seconds"], (int, float)) and not isinstance(r["seconds"], bool)
                    and 0 <= r["seconds"] < float("inf") and isinstance(r["missing"], list)
                    and all(_count(k, self.world_size - 1) for k in r["missing"])):
                raise damaged(self.path, f"its row {i} is not {{{', '.join(sorted(ROW_FIELDS))}}} of a round of "
                              f"{rounds} and {self.world_size} ranks")
            log.append(RoundLog(**r))
        return log

    def record(self, loop: Loop, info: RoundInfo) -> None:
        self.log.append(RoundLog(info.round, info.seconds, info.missing, info.sent, info.received))

    def summary(self) -> dict[str, Any]:
        """Median round time and mean bytes per round (over the logged rounds)."""
        secs = [r.seconds for r in self.log]
        return {
            "topology": self.topology, "world_size": self.world_size, "rounds_logged": len(self.log),
            "median_round_s": statistics.median(secs) if secs else None,
            "bytes_sent_per_round": statistics.fmean(r.sent for r in self.log) if self.log else None,
            "bytes_received_per_round": statistics.fmean(r.received for r in self.log) if self.log else None,
            "rounds_with_missing": sum(1 for r in self.log if r.missing),
            "max_rss_mib": peak_rss_mib(),
        }

    def write(self) -> None:
        """Write ``distributed.json`` (atomically), through the run directory's held descriptor: into the directory
        the run checked, even if its name was swapped for a link since (:mod:`phalanx.experiments.dirfd`)."""
        payload = {"summary": self.summary(), "rounds": [vars(r) for r in self.log]}
        with writing(self.path):
            dirfd.write(self.path.parent, self.path.name, json.dumps(payload, indent=1).encode())


class RankLog(Callback):
    """Rank 0's messages on stderr: resuming, evaluations, and whenever the set of missing ranks changes."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.last_missing: list[int] = []

    def say(self, text: str) -> None:
        """One line on stderr, prefixed with the rank."""
        if not self.quiet:
            print(f"[phalanx rank 0] {text}", file=sys.stderr, flush=True)

    def on_start(self, loop: Loop) -> None:
        if loop.resumed:
            self.say(f"resuming from the checkpoint of round {loop.state.round}")

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        missing = info.missing
        gossip = loop.experiment.algorithm.decentralized  # missing: rank 0's graph neighbours
        who = loop.experiment.algorithm.missing_word
        if missing != self.last_missing and gossip:
            self.say(f"round {info.round}: no message in time from neighbours {missing}; node 0 took its own local "
                     "step in their place" if missing else f"round {info.round}: every neighbour is back")
            self.last_missing = missing
        elif missing != self.last_missing:  # say it when the set of missing ranks changes, not every round
            f = loop.experiment.f
            self.say(f"round {info.round}: {who} {missing} missing; aggregating {info.aggregated} vectors with "
                     f"f={f - len(missing)}" if missing else f"round {info.round}: every rank is back")
            self.last_missing = missing
        if info.row is not None:
            row = info.row
            self.say(f"round {loop.state.round}/{loop.experiment.rounds}: test accuracy {row['test_accuracy']:.3f}, "
                     f"loss {row['test_loss']:.3f}" + (f", missing {who} {missing}" if missing else ""))
