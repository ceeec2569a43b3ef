"""Reader for the IDX format of MNIST and Fashion-MNIST, plain or gzip-compressed.

The format (LeCun et al., http://yann.lecun.com/exdb/mnist/, "FILE FORMATS"): a 4-byte magic number — two zero
bytes, a type code, the number of dimensions ``k`` — then ``k`` big-endian uint32 sizes, then the values in C order,
big-endian. Type codes: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Any

import numpy as np

from phalanx.data.base import DataFormatError

__all__ = ["read_idx"]

_TYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(2)
    opener: Any = gzip.open if head == _GZIP_MAGIC else open  # by content, not by file name
    try:
        with opener(path, "rb") as fh:
            data: bytes = fh.read()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataFormatError(str(path), f"cannot decompress: {exc}") from exc
    return data


def read_idx(path: str | Path) -> np.ndarray[Any, Any]:
    """Read one IDX file (``.gz`` or plain, detected from the content) into a writable array in native byte order.

    Raises :class:`~phalanx.data.base.DataFormatError` when the magic number, the type code or the size is wrong
    (a truncated download, an HTML error page saved under the file's name, ...).
    """
    p = Path(path)
    data = _read_bytes(p)
    if len(data) < 4:
        raise DataFormatError(str(p), f"{len(data)} bytes, too short for an IDX header")
    zero, code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or code not in _TYPES or ndim == 0:
        raise DataFormatError(
            str(p), f"not an IDX file (magic number 0x{data[:4].hex()}; expected 0x0000TTDD with T in 08..0E)",
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataFormatError(str(p), f"truncated header ({len(data)} bytes, {ndim} dimensions announced)")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_TYPES[code])
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise DataFormatError(
            str(p), f"{len(data)} bytes, expected {expected} for an array of shape {dims} of {dtype.name}",
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)
