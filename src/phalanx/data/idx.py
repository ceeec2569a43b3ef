"""Reader for the IDX format of MNIST and Fashion-MNIST, plain or gzip-compressed.

The format (LeCun et al., http://yann.lecun.com/exdb/mnist/, "FILE FORMATS"): a 4-byte magic number — two zero
bytes, a type code, the number of dimensions ``k`` — then ``k`` big-endian uint32 sizes, then the values in C order,
big-endian. Type codes: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64.

The header is read first and the array it declares, ``4 + 4k + ∏ dims · itemsize`` bytes, is checked against what
the file can hold (:mod:`phalanx.data.limits`) before anything is allocated: a plain file must be exactly that size,
a ``.gz`` file of ``s`` bytes can hold at most ``1032·s`` (deflate's largest expansion), and no file may declare
more than :data:`MAX_BYTES`. The values are then
decompressed straight into the array, and one byte more is asked for: a file holding more than its header declares
is refused without decompressing the rest.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any, cast

import numpy as np

from phalanx import files
from phalanx.data.base import DataFormatError
from phalanx.data.limits import GZIP_MAGIC, GZIP_MAX_RATIO, read_exactly

__all__ = ["MAX_BYTES", "read_idx"]

MAX_BYTES = 1 << 31
"""The largest array an IDX file may declare (2 GiB), whatever the file's size: a sparse file of gigabytes costs a
few KiB of disk and matches a header that declares it. The largest honest one is far below: MNIST's and
Fashion-MNIST's training images are 47 MB (60,000 × 28 × 28 bytes); EMNIST's largest split, 'byclass', 0.55 GB."""

_TYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_header(stream: io.BufferedIOBase, where: str) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """The dims, the dtype and the header's length of the IDX stream, whose position is left after the header."""
    head = stream.read(4)
    if len(head) < 4:
        raise DataFormatError(where, f"{len(head)} bytes, too short for an IDX header")
    zero, code, ndim = struct.unpack(">HBB", head)
    if zero != 0 or code not in _TYPES or ndim == 0:
        raise DataFormatError(
            where, f"not an IDX file (magic number 0x{head.hex()}; expected 0x0000TTDD with T in 08..0E)",
        )
    raw = stream.read(4 * ndim)
    if len(raw) < 4 * ndim:
        raise DataFormatError(where, f"truncated header ({4 + len(raw)} bytes, {ndim} dimensions announced)")
    return struct.unpack(f">{ndim}I", raw), np.dtype(_TYPES[code]), 4 + 4 * ndim


def _refused(path: Path, problem: str) -> DataFormatError:
    return DataFormatError(str(path), problem)


def read_idx(path: str | Path) -> np.ndarray[Any, Any]:
    """Read one IDX file (``.gz`` or plain, detected from the content) into a writable array in native byte order.

    Raises :class:`~phalanx.data.base.DataFormatError` naming the file when the magic number or the type code is
    wrong, when the header declares more than the file can hold (checked before allocating: see the module
    docstring), or when the data are cut short or go on past the declared size (a truncated download, an HTML error
    page saved under the file's name, a header that lies, ...).
    """
    p = Path(path)
    where = str(p)
    try:  # one descriptor: a regular file (a FIFO does not block the open), its size from fstat on it
        fh = files.open_regular(p, follow=True, error=_refused)
    except OSError as exc:
        raise DataFormatError(where, f"cannot read: {exc.strerror or exc}") from None
    try:
        with fh:
            size = os.fstat(fh.fileno()).st_size
            gz = fh.read(2) == GZIP_MAGIC  # by content, not by file name
            fh.seek(0)
            stream = gzip.GzipFile(fileobj=fh, mode="rb") if gz else cast(io.BufferedIOBase, fh)
            dims, dtype, header = _read_header(stream, where)
            n = math.prod(dims) * dtype.itemsize  # exact: Python integers
            expected = header + n
            what = f"an array of shape {dims} of {dtype.name}"
            if not gz and expected != size:
                raise DataFormatError(where, f"{size} bytes, expected {expected} for {what}")
            if gz and expected > GZIP_MAX_RATIO * size:
                raise DataFormatError(
                    where, f"the header declares {what} ({expected:,} bytes), more than a {size:,}-byte gzip file "
                    "can hold", allowed=f"at most {GZIP_MAX_RATIO} × the compressed size = "
                    f"{GZIP_MAX_RATIO * size:,} bytes (deflate's largest expansion)",
                )
            if n > MAX_BYTES:
                raise DataFormatError(where, f"the header declares {what} ({n:,} bytes)",
                                      allowed=f"arrays of at most {MAX_BYTES:,} bytes (phalanx.data.idx.MAX_BYTES)")
            buf, more = read_exactly(stream, n)
    except DataFormatError:
        raise
    except MemoryError:
        raise DataFormatError(where, f"not enough memory for {what} ({n:,} bytes)") from None
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise DataFormatError(where, f"cannot decompress: {exc}") from None
    if buf.shape[0] < n:
        raise DataFormatError(where, f"{header + buf.shape[0]} bytes, expected {expected} for {what}")
    if more:
        raise DataFormatError(where, f"more than {expected} bytes, expected {expected} for {what}")
    arr = buf.view(dtype)
    if not dtype.isnative:
        arr = arr.byteswap(inplace=True).view(dtype.newbyteorder("="))
    return arr.reshape(dims)
