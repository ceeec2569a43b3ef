"""What reading a data file may allocate: bounds that follow from the file's own size, checked *before* allocating.

A data file is input from outside (a download, a copy from a colleague, a file an attacker planted): its header may
claim anything. Every reader of :mod:`phalanx.data` therefore derives, from the number of bytes the file really
has, the most memory that file can justify, and refuses — with a one-line
:class:`~phalanx.data.base.DataFormatError` naming the file — a header or a structure that asks for more:

* **gzip** (IDX files): deflate cannot expand its input more than :data:`GZIP_MAX_RATIO` times — its longest match,
  258 bytes, costs at least 2 bits of compressed stream (zlib's "technical details", *Maximum compression factor*:
  "the limit is 1032:1"). A ``.gz`` file of ``s`` bytes therefore holds at most ``1032·s`` bytes, and the reader
  decompresses incrementally, stopping one byte after the size its header declares (:func:`read_exactly`).
* **plain files** hold exactly their size: a header must declare exactly what the file holds.
* **pickles** (CIFAR-10) and **JSON** (LEAF): see :mod:`phalanx.data.cifar` and :mod:`phalanx.data.jsonscan`.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from phalanx.data.base import DataFormatError

__all__ = ["GZIP_MAGIC", "GZIP_MAX_RATIO", "file_size", "read_exactly", "short"]

GZIP_MAX_RATIO = 1032
"""Deflate's largest expansion, decompressed bytes per compressed byte (zlib technical details: 1032:1)."""
GZIP_MAGIC = b"\x1f\x8b"


def file_size(path: Path) -> int:
    """The size of ``path`` in bytes; a :class:`DataFormatError` naming it when it cannot be read."""
    try:
        return path.stat().st_size
    except OSError as exc:
        raise DataFormatError(str(path), f"cannot read: {exc.strerror or exc}") from None


def read_exactly(stream: io.BufferedIOBase, n: int) -> tuple[np.ndarray[Any, Any], bool]:
    """``n`` bytes of ``stream`` into a new uint8 array, and whether the stream had *more* than ``n`` (one byte is
    read past them, never the rest). Returns fewer than ``n`` bytes (the array cut to what came) at its end.

    The caller has already checked that ``n`` is within what the file's size justifies: this allocates ``n`` bytes
    once and reads into them in place (no second copy)."""
    buf = np.empty(n, dtype=np.uint8)
    view = buf.data
    got = 0
    while got < n:
        k = stream.readinto(view[got:])
        if not k:
            return buf[:got], False
        got += k
    return buf, bool(stream.read(1))


def short(value: Any, width: int = 40, depth: int = 0) -> str:
    """``repr(value)`` for an error message, in bounded time and memory whatever the value (a file's 30 MB string, a
    list of a million items, an integer of a million digits): strings and bytes cut to ``width`` characters,
    tuples to 6 items two levels deep, lists and dicts by their length only."""
    if isinstance(value, str | bytes | bytearray) and len(value) > width:
        return f"{value[:width]!r}… ({len(value):,} long)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<an integer of {value.bit_length():,} bits>"
    if isinstance(value, tuple):
        if depth >= 2:
            return f"<a tuple of {len(value):,}>"
        items = [short(v, width, depth + 1) for v in value[:6]] + (["…"] if len(value) > 6 else [])
        return "(" + ", ".join(items) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list | dict | set):
        return f"<a {type(value).__name__} of {len(value):,}>"
    return repr(value)[: 2 * width]
