"""What parsing a JSON file will cost, measured on its bytes *before* :func:`json.loads` builds anything.

``json.loads`` has no limits: one string of 400 MB with a single astral character in it becomes a 1.6 GB ``str``
(CPython stores every character of a string at the width of its widest), and ``[[],[],…]`` makes a 56-byte list
object out of every 3 bytes. :func:`scan` reads the file in chunks of :data:`CHUNK` bytes (so it holds one chunk,
never the file) — or walks, chunk by chunk, the bytes already read from it, the very bytes then parsed (LEAF's
reader: no swap of the file between the scan and the parse) — and tokenises it with numpy just far enough to know,
for every byte, whether it lies inside a string
— quotes toggle, a backslash run of odd length escapes the byte after it, exactly as JSON's grammar (RFC 8259 §7)
says — and counts

* every string's length in bytes, refused as soon as one passes ``max_string`` (the file is not read further);
* the nesting depth, refused past ``max_depth`` (``json`` would otherwise recurse until ``RecursionError``);
* the containers, commas and colons outside strings, and whether any byte is not ASCII.

:meth:`JsonCost.estimate` turns the counts into an upper bound on the bytes ``json.loads`` allocates for the file
(CPython's object sizes: a ``str`` 80 bytes + its characters at 1 or 4 bytes each, a number 32 bytes + its digits,
a list or dict 104 bytes + 9 per item, 200 per key — the dict's slot and ``json``'s key memo — and the document
itself, as bytes and decoded); ``tests/test_data_bombs.py`` checks the bound against ``tracemalloc``'s measured
peak on the adversarial shapes above. The tokenisation agrees with ``json``'s on every prefix that ``json``
accepts, so an invalid file — which ``json`` rejects part-way — costs no more than its estimate either.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phalanx.data.base import DataFormatError

__all__ = ["CHUNK", "JsonCost", "scan"]

CHUNK = 1 << 18
"""Bytes read at a time by :func:`scan` (256 KiB: its numpy temporaries then stay within a few MiB)."""
_QUOTE, _BACKSLASH, _COMMA, _COLON = 0x22, 0x5C, 0x2C, 0x3A
_OPEN = (0x5B, 0x7B)  # [ {
_CLOSE = (0x5D, 0x7D)  # ] }


@dataclass
class JsonCost:
    """What :func:`scan` counted in a JSON file (see the module docstring)."""

    size: int = 0
    strings: int = 0
    string_bytes: int = 0
    containers: int = 0
    commas: int = 0
    colons: int = 0
    ascii: bool = True
    escapes: bool = False
    depth: int = 0

    def estimate(self) -> int:
        """An upper bound on the bytes ``json.loads`` of the decoded file allocates, the file's bytes and decoded
        text included (module docstring)."""
        text = 1 if self.ascii else 4  # the decoded document: 1 byte per character if ASCII, else at most 4
        chars = 1 if self.ascii and not self.escapes else 4  # a string's characters (\\u escapes may widen them)
        values = self.commas + self.containers + 1  # every value is a container's first or follows a comma
        return (
            self.size * (1 + text + 1)  # the bytes, the decoded text, and any number's digits
            + values * (32 + 9)  # each value's object (a number's) and its slot in its container
            + self.containers * 104
            + self.colons * 200
            + self.strings * 80 + self.string_bytes * chars
        )


def _chunks(source: Path | bytes, where: str) -> Iterator[bytes | memoryview]:
    """``source`` in chunks of :data:`CHUNK` bytes: the bytes given, or the file read (a one-line error if it cannot
    be)."""
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source)
        for at in range(0, len(view), CHUNK):
            yield view[at: at + CHUNK]
        return
    try:
        fh = open(source, "rb")
    except OSError as exc:
        raise DataFormatError(where, f"cannot read: {exc.strerror or exc}") from None
    with fh:
        while True:
            try:
                chunk = fh.read(CHUNK)
            except OSError as exc:
                raise DataFormatError(where, f"cannot read: {exc.strerror or exc}") from None
            if not chunk:
                return
            yield chunk


def scan(source: Path | bytes, max_string: int, max_depth: int, where: str | None = None) -> JsonCost:
    """Count the JSON tokens of ``source`` — a file, or the bytes already read from one (then the very bytes that
    will be parsed: nothing can change between the scan and the parse) — in chunks (module docstring); a
    :class:`DataFormatError` naming the file (``where``, default ``source`` when it is a path) and the byte offset
    for a string longer than ``max_string`` bytes or nesting deeper than ``max_depth``."""
    where = str(source) if where is None and isinstance(source, Path) else str(where)
    cost = JsonCost()
    in_string = False  # the state after the previous chunk
    escaped_next = False  # the previous chunk ended with an odd run of backslashes
    opened = -1  # where the open string's quote is (absolute offset)
    depth = 0
    offset = 0
    for chunk in _chunks(source, where):
        b = np.frombuffer(chunk, dtype=np.uint8)
        n = b.shape[0]
        if cost.ascii and int(b.max()) >= 0x80:
            cost.ascii = False
        escaped, escaped_next = _escaped(b, escaped_next)
        quotes = (b == _QUOTE) & ~escaped
        parity = np.cumsum(quotes, dtype=np.uint8) & 1  # wraps mod 256: only the parity is used
        inside = parity.astype(bool) ^ in_string  # after each byte: inside a string?
        outside = ~inside & ~quotes
        qpos = np.flatnonzero(quotes) + offset
        if in_string:  # the first quote of this chunk closes the string opened earlier
            qpos = np.concatenate([[opened], qpos])
        closed = qpos.shape[0] // 2
        lengths = qpos[1: 2 * closed: 2] - qpos[0: 2 * closed: 2] - 1
        cost.strings += closed
        cost.string_bytes += int(lengths.sum())
        if closed and int(lengths.max()) > max_string:
            k = int(np.argmax(lengths > max_string))
            raise _long(where, int(qpos[2 * k]), max_string)
        in_string = bool(qpos.shape[0] % 2)
        if in_string:
            opened = int(qpos[-1])
            if offset + n - opened - 1 > max_string:
                raise _long(where, opened, max_string)
        if not cost.escapes and bool((b == _BACKSLASH).any()):
            cost.escapes = True
        opens = outside & ((b == _OPEN[0]) | (b == _OPEN[1]))
        closes = outside & ((b == _CLOSE[0]) | (b == _CLOSE[1]))
        cost.containers += int(opens.sum())
        cost.commas += int((outside & (b == _COMMA)).sum())
        cost.colons += int((outside & (b == _COLON)).sum())
        if opens.any():
            level = np.cumsum(opens.view(np.int8) - closes.view(np.int8), dtype=np.int32) + depth
            deepest = int(level.max())
            if deepest > max_depth:
                at = offset + int(np.argmax(level > max_depth))
                raise DataFormatError(where, f"JSON nested more than {max_depth} levels deep at byte {at:,}",
                                      allowed=f"at most {max_depth} levels")
            depth = int(level[-1])
            cost.depth = max(cost.depth, deepest)
        else:
            depth -= int(closes.sum())
        offset += n
    cost.size = offset
    return cost


def _long(where: str, at: int, max_string: int) -> DataFormatError:
    return DataFormatError(where, f"a JSON string longer than {max_string:,} bytes starts at byte {at:,}",
                           allowed=f"strings of at most {max_string:,} bytes")


def _escaped(b: np.ndarray, carry: bool) -> tuple[np.ndarray, bool]:
    """Which bytes of ``b`` a backslash escapes (``carry``: the first one is, by the previous chunk's last run),
    and whether the byte after ``b`` is."""
    n = b.shape[0]
    escaped = np.zeros(n, dtype=bool)
    escaped[0] = carry
    slashes = np.flatnonzero(b == _BACKSLASH)
    if slashes.shape[0] == 0:
        return escaped, False
    breaks = np.flatnonzero(np.diff(slashes) != 1)
    starts = slashes[np.concatenate([[0], breaks + 1])]
    ends = slashes[np.concatenate([breaks, [slashes.shape[0] - 1]])]
    runs = ends - starts + 1 - ((starts == 0) & carry)  # an escaped first backslash escapes nothing itself
    odd = (runs % 2).astype(bool)
    after = ends[odd] + 1
    escaped[after[after < n]] = True
    return escaped, bool(odd[-1] and ends[-1] == n - 1)
