"""A transcript read line by line with bounded memory: each line's length is checked before it is read whole, its
bytes (printable ASCII, as ``dumps`` writes them) as they are read, what it holds before ``json.loads`` builds it, and
its nesting after.

**What parsing costs.** ``json.loads`` makes a Python object of every value: a line of ``[{},{},…]`` made a 64-byte
dict of every 3 bytes — with :func:`_depth`'s former stack of a tuple per item, 47× the line's size (an 8 MiB line,
375 MiB; ``tests/test_audit_hostile.py``). A writer's line is far sparser, so :data:`DENSEST` bounds, counted on the
bytes before they are parsed (``bytes.count``: no allocation), how many dicts, lists, keys and other strings a line
may hold for its length — the densest line a transcript holds (a journal of rounds whose items are
``{"accepted":[],"missing":[],"round":0}``, 39 bytes) passes — plus :data:`FREE` of each, which covers the brackets,
colons and quotes a peer can put in the text of the rejections a group line samples
(:data:`~phalanx.distributed.rejections.GROUP_BYTES`: under 800 characters it chooses). What remains is measured
(the test above, tracemalloc's peak over the line's size, 1 MiB lines; a line read in several chunks adds about 1×
for their join): one long string (a step's body, a writer's bulkiest line) 3.0× — the bytes, the decoded text, the
string, which no use of ``json.loads`` avoids; journal items, a writer's densest, 8.7×; the costliest shapes the
bounds let through 6.2× (integers, strings) to 10.1× (keys). So the costliest line an attacker can write costs about
what a writer's densest does, and a line is at most :func:`~phalanx.distributed.transcript.line_limit` bytes.
"""

from __future__ import annotations

import json
from typing import IO, Any

MAX_DEPTH = 6
"""No line of a transcript nests deeper (a journal line: line → rounds → item → accepted → entry)."""


class Unreadable(Exception):
    """A transcript that cannot be read (one line says why)."""


def _depth(obj: Any) -> int:
    """How deeply ``obj`` nests, at most ``MAX_DEPTH`` + 1 (iteratively: no recursion on what a file holds; one
    iterator per level, so it costs O(depth), not a tuple per item — another copy of the line's objects, before)."""
    if not isinstance(obj, dict | list):
        return 0
    deepest, stack = 1, [iter(obj.values() if isinstance(obj, dict) else obj)]
    while stack:
        if (item := next(stack[-1], stack)) is stack:  # (the stack itself: the sentinel of a level's end)
            stack.pop()
        elif isinstance(item, dict | list):
            deepest = max(deepest, len(stack) + 1)
            if len(stack) < MAX_DEPTH:
                stack.append(iter(item.values() if isinstance(item, dict) else item))
    return deepest


CHUNK, _TEXT = 1 << 20, bytes(range(0x20, 0x7F)) + b"\n"  # Lines' chunk; what dumps writes (ASCII, \n at the end)
DENSEST = {"dicts": (b"{", 36), "lists": (b"[", 16), "keys": (b":", 12)}
"""Per kind of item, the fewest bytes of a line per item a writer's line has (its character, the bytes): a journal
item — 39 bytes, one dict, two lists, three keys — is the densest; other strings than keys: one per 12 bytes too."""
STRING_BYTES = 12
FREE = 1024
"""Items of each kind a line may hold beyond :data:`DENSEST` (the text of sampled rejections)."""


def _crowded(raw: bytes) -> str | None:
    """Which kind of item ``raw`` holds more of than a transcript's line of its length can, or None."""
    counts = {kind: raw.count(char) for kind, (char, _) in DENSEST.items()}
    for kind, (_, per) in DENSEST.items():
        if per * (counts[kind] - FREE) > len(raw):
            return kind
    if STRING_BYTES * (raw.count(b'"') // 2 - counts["keys"] - FREE) > len(raw):
        return "strings"
    return None


class Lines:
    """A transcript read line by line: each line's length is checked before it is parsed, its nesting after."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.number = 0

    def _line(self, limit: int, where: str) -> bytes:
        """At most ``limit`` + 1 bytes of the next line, by ``CHUNK``: a byte outside printable ASCII (not dumps'
        output) is :class:`Unreadable` at once: a sparse file's zeros cost a chunk, not the limit (issue 38, #6)."""
        parts, got = [], 0
        while got <= limit:
            part = self.fh.readline(min(CHUNK, limit + 1 - got))
            if not part:
                break
            if part.translate(None, _TEXT):
                raise Unreadable(f"{where} is not JSON as a transcript writes it (a byte not printable ASCII)")
            parts.append(part)
            got += len(part)
            if part.endswith(b"\n"):
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def next(self, limit: int) -> tuple[bytes, dict[str, Any]] | None:
        """The next line (its bytes, its object), None at the end; :class:`Unreadable` if it is longer than
        ``limit``, cut short, not a JSON object, or nested deeper than :data:`MAX_DEPTH`."""
        raw = self._line(limit, where := f"line {self.number + 1}")
        if not raw:
            return None
        self.number += 1
        if len(raw) > limit:
            raise Unreadable(f"{where} is longer than the {limit} bytes a line of this transcript can have")
        if not raw.endswith(b"\n"):
            raise Unreadable(f"{where} is cut short (no end of line)")
        if (crowded := _crowded(raw)) is not None:
            raise Unreadable(f"{where} holds more {crowded} than a transcript's line of {len(raw)} bytes can")
        try:
            obj = json.loads(raw)
        except RecursionError:
            raise Unreadable(f"{where} nests deeper than {MAX_DEPTH} levels") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise Unreadable(f"{where} is not JSON ({type(exc).__name__})") from None
        if not isinstance(obj, dict):
            raise Unreadable(f"{where} is not a JSON object")
        if _depth(obj) > MAX_DEPTH:
            raise Unreadable(f"{where} nests deeper than {MAX_DEPTH} levels")
        return raw, obj
