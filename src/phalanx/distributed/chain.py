"""Rank 0's transcript written append-only (the review's F7): every record is appended and flushed when it is made,
so rank 0 holds one step's record at a time and writes each byte once — O(rounds) bytes over a run, where the former
writer rewrote the whole file at every checkpoint (O(rounds²)) and kept every step's bodies in memory.

**The chain.** The transcript's digest is SHA-256 of every byte written so far (FIPS 180-4): a running hash, each
line chained to all the lines before it by SHA-256's own Merkle–Damgård chaining, so a line removed, inserted, edited
or two lines swapped anywhere before a signed point change the digest signed there. Two points are signed with rank
0's Ed25519 key (the allow-list's; nothing here but hashing and the existing signatures):

- **at every checkpoint** (:meth:`Appender.mark`), the *mark* ``[offset, head, signature]``: the file's length, the
  SHA-256 of its first ``offset`` bytes and rank 0's signature of ``PREFIX_DOMAIN ‖ offset (8 bytes, big-endian) ‖
  head``. It is written into the checkpoint's own metadata (:data:`END`, in the same atomic rename as the
  checkpoint and the sessions' binding: :mod:`phalanx.distributed.binding`), so the checkpoint says where the
  record stood. A resume cuts the file back to ``offset`` — the lines of rounds done again, written after the
  checkpoint, go — checks that what is left hashes to ``head``, and continues the chain from there;
- **when the run stops or ends**, the last line (``{"type": "signature", "sha256", "signature"}``, as before):
  rank 0's signature of ``DOMAIN ‖ SHA-256(every byte before it)``.

The two domains differ, so a mark cannot be made into a last line (a transcript cut at a checkpoint and presented
as complete). ``phalanx audit`` recomputes the digest line by line: the file must pass through the checkpoint's mark
(a line ending exactly at ``offset``, with that digest) and, unless it ends exactly there (a run that stopped
without closing it, not done), end with rank 0's last line.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

END = "transcript_end"
"""The checkpoint metadata key of the transcript's mark ``[offset, head, signature]`` (:meth:`Appender.mark`)."""
PREFIX_DOMAIN = b"phalanx/transcript-prefix/v1\x00"


class Chain:
    """The transcript's running digest: SHA-256 of every line given to :meth:`update`, in order."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def update(self, line: bytes) -> None:
        """Chain one line (its bytes, newline included)."""
        self.h.update(line)

    def digest(self) -> bytes:
        """The digest of every line so far (the chain goes on)."""
        return self.h.digest()


def mark_message(offset: int, head: bytes) -> bytes:
    """What rank 0 signs at a checkpoint: the transcript's first ``offset`` bytes hash to ``head``."""
    return PREFIX_DOMAIN + offset.to_bytes(8, "big") + head


def verify_mark(public_key: Any, offset: int, head: str, signature: str) -> bool:
    """Whether ``signature`` is rank 0's (``public_key``) of the mark ``(offset, head)``."""
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(bytes.fromhex(signature), mark_message(offset, bytes.fromhex(head)))
    except (InvalidSignature, ValueError):
        return False
    return True


class Appender:
    """The transcript file open for appending at ``offset`` (anything after it is cut), with its chain (``chain``:
    the digest of the first ``offset`` bytes) and the file's own SHA-256 (``whole``, the manifest's digest)."""

    def __init__(self, path: Path, chain: Chain, whole: Any, offset: int) -> None:
        from phalanx.experiments import dirfd
        from phalanx.experiments.store import writing

        self.path = path
        self.chain, self.whole = chain, whole
        with writing(path):  # through the run directory's held descriptor (phalanx.experiments.dirfd)
            self.fh = os.fdopen(dirfd.open_file(path.parent, path.name, os.O_RDWR | os.O_CREAT), "r+b")  # held open
            self.fh.seek(offset)
            self.fh.truncate()
        self.offset = offset
        self.before: tuple[int, int, bytes] | None = None
        """(round, offset, digest) where the last record began: a checkpoint of that round marks there."""
        self.written = 0
        """Bytes this process appended (what the review's F7 measured: it grows linearly with the rounds)."""

    def append(self, lines: list[bytes], round_: int | None = None) -> None:
        """Append ``lines`` (each a canonical line; ``round_``: the round whose record they are) and flush them to
        the operating system."""
        from phalanx.experiments.store import writing

        if round_ is not None:
            self.before = (round_, self.offset, self.chain.digest())
        with writing(self.path):
            for line in lines:
                self.fh.write(line)
                self.chain.update(line)
                self.whole.update(line)
                self.offset += len(line)
                self.written += len(line)
            self.fh.flush()

    def sync(self) -> None:
        """Flush to disk and record the file's digest in the run directory's manifest."""
        from phalanx.experiments.store import record_artifact, writing

        with writing(self.path):
            os.fsync(self.fh.fileno())
        record_artifact(self.path.parent, self.path.name, self.whole.hexdigest())

    def mark(self, identity: Any, round_: int) -> list[Any]:
        """The mark ``[offset, head, signature]`` of a checkpoint of round ``round_`` (see the module's docstring),
        the file synced first: where the records of rounds before it end — before the last record when that is of
        round ``round_`` itself (a round that stopped after its record was made: it will be done again)."""
        self.sync()
        offset, head = self.offset, self.chain.digest()
        if self.before is not None and self.before[0] >= round_:
            _, offset, head = self.before
        return [offset, head.hex(), identity.sign(mark_message(offset, head)).hex()]

    def close(self) -> None:
        self.fh.close()


def mark_json(mark: list[Any]) -> str:
    """The mark as the checkpoint's metadata holds it (canonical JSON)."""
    return json.dumps(mark, separators=(",", ":"))


class MarkCheck:
    """The audit's check of a transcript against its checkpoint's mark ``end`` (None: a checkpoint without one,
    written before transcripts were appended — then the last line, which signs every byte, is the only check):
    a line ends exactly at the mark's offset with the mark's digest, signed by rank 0 (``public_key``); a file
    that ends there without a last line is a run stopped without closing its record (not done), anything else
    after it must end with rank 0's last line."""

    def __init__(self, end: tuple[int, str, str] | None, public_key: Any) -> None:
        self.end = end
        self.key = public_key
        self.offset = 0
        self.passed = False

    def line(self, raw: bytes, chain: Chain) -> str | None:
        """After ``raw`` was chained: the problem, the first time the file reaches or steps over the mark."""
        before, self.offset = self.offset, self.offset + len(raw)
        if self.end is None or before >= self.end[0] or self.offset < self.end[0]:
            return None
        offset, head, sig = self.end
        self.passed = True
        if self.offset != offset:
            return (f"no line of the transcript ends at byte {offset}, where its checkpoint says the record stood "
                    "(lines added, removed or edited before it)")
        if chain.digest().hex() != head:
            return (f"the transcript's first {offset} bytes are not the ones rank 0 marked at the checkpoint (lines "
                    "removed, swapped or edited before it)")
        if not verify_mark(self.key, offset, head, sig):
            return "the checkpoint's mark of the transcript does not verify with rank 0's key on the allow-list"
        return None

    def ended(self, signed: bool, done: bool) -> str | None:
        """At the end of the file (``signed``: its last line was a signature line): the problem, if any; None also
        where the last line's own check speaks (a run that is done, or a checkpoint without a mark)."""
        if self.end is None:
            return None
        offset = self.end[0]
        if not self.passed:
            return (f"the transcript ends at byte {self.offset}, before byte {offset} where its checkpoint says the "
                    "record stood (its tail cut)")
        if not signed and not done and self.offset > offset:
            return (f"the transcript's {self.offset - offset} bytes after byte {offset}, where its checkpoint says "
                    "the record stood, are not signed by rank 0 (appended by someone else, or written by a run that "
                    "stopped without closing its record: a resume cuts them)")
        return None

    def closed_here(self, signed: bool, done: bool) -> bool:
        """Whether a file without a last line is complete: a run not done that ended exactly at its mark."""
        return not signed and not done and self.end is not None and self.passed and self.offset == self.end[0]
