"""Reading the files of a run directory back with bounded memory.

Whoever can write into a run directory (a co-user of a shared ``runs/`` folder, a Byzantine participant of a study who
hands over its results) decides what Phalanx reads there. So every file read back is sized before it is read and
parsed within a bound that its honest content never comes near; a file that is too large, nested too deeply, not
what it should be, or whose header lies about sizes is one :class:`~phalanx.errors.ConfigError` naming the file
(:func:`damaged`), raised before anything of the size the file claims is allocated.

=====================  =========================  ===========================================================
file                   bound                      what an honest one holds
=====================  =========================  ===========================================================
``manifest.json``,     :data:`MAX_JSON_BYTES`     a few kB: versions, digests of a handful of files, the config
``config.json``        (4 MiB), JSON nested at    (the largest honest config measured: a few kB)
                       most as deep as Python's
                       parser allows
``metrics.jsonl``      :data:`MAX_ROW_BYTES` a    a few hundred bytes a row (the row carries the config's
                       line (1 MiB), at most      columns), at most :data:`~phalanx.experiments.schema.MAX_ROWS`
                       ``MAX_ROWS + 1`` rows,     rows (+ round 0)
                       :data:`MAX_METRICS_BYTES`
                       (4 GiB) in all
checkpoint header      :data:`MAX_HEADER_BYTES`   a table of a few dozen tensors and the provenance record
(safetensors)          (8 MiB), every tensor      (a few kB a training session)
                       inside the file and of
                       the size its shape says
markers (``FAILED``,   :data:`MAX_MARKER_BYTES`   one short JSON object
``DIVERGED``, lock)    (64 KiB)
=====================  =========================  ===========================================================

The safetensors format (Hugging Face, https://github.com/huggingface/safetensors): 8 bytes, a little-endian unsigned
64-bit length N, then N bytes of JSON (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}``), then the tensors' bytes; offsets are relative to the end of the header. :func:`checkpoint_header`
checks N against the file's size before it reads the header, and every tensor's offsets against the rest of the
file and its dtype and shape, before any tensor is read. :func:`load_checked` does all of it on one descriptor — the
manifest's digest, the header, then the tensors (:func:`read_tensors`) — so that the file checked is the file loaded
(a file renamed over the checkpoint between a check and the load is never read).

:func:`tensors_digest` / :func:`tensors_digest_of_file`: one SHA-256 of a checkpoint's *tensors* (names, dtypes,
shapes and bytes, not its metadata), the same whether computed from the tensors in memory before they are written or
streamed from the file (no tensor is loaded): what a provenance record (:mod:`phalanx.experiments.provenance`) says a
training session wrote, while the record itself lives in that file's metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from phalanx import files
from phalanx.errors import ConfigError, IntegrityError

MAX_JSON_BYTES = 4 << 20
"""The largest ``manifest.json`` / ``config.json`` read back."""
MAX_MARKER_BYTES = 64 << 10
"""The largest ``FAILED`` / ``DIVERGED`` marker or lock file read back."""
MAX_ROW_BYTES = 1 << 20
"""The longest line of ``metrics.jsonl`` read back (a row holds at most 256 scalars of at most 256 characters:
:mod:`phalanx.training.metric_rows`; an honest one a few hundred bytes)."""
MAX_METRICS_BYTES = 4 << 30
"""The largest ``metrics.jsonl`` read back (streamed: memory is bounded by the rows kept, not by this)."""
MAX_HEADER_BYTES = 8 << 20
"""The largest safetensors header of a checkpoint read back."""
MAX_TENSORS = 4096
"""The most tensors a checkpoint may hold."""
CHANGED = "changed or truncated since it was written (its SHA-256 differs from manifest.json's)"
"""The problem an :class:`~phalanx.errors.IntegrityError` names for a file whose digest is not the recorded one."""

DTYPES: dict[str, tuple[torch.dtype | None, int]] = {
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8), "I32": (torch.int32, 4), "I16": (torch.int16, 2), "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1), "BOOL": (torch.bool, 1), "U16": (getattr(torch, "uint16", None), 2),
    "U32": (getattr(torch, "uint32", None), 4), "U64": (getattr(torch, "uint64", None), 8),
    "F8_E4M3": (getattr(torch, "float8_e4m3fn", None), 1), "F8_E5M2": (getattr(torch, "float8_e5m2", None), 1),
    "C64": (torch.complex64, 8),
}
"""safetensors' dtype names, the torch dtype each is and its item size in bytes."""
_NAME_OF = {dtype: name for name, (dtype, _) in DTYPES.items() if dtype is not None}


def damaged(path: Path, problem: str) -> ConfigError:
    """The error for a run-directory file that cannot be read as Phalanx wrote it: names the file, the problem and
    the directory to delete (the run then starts again from round 0)."""
    return ConfigError("file", str(path), "a file as Phalanx wrote it",
                       f"{problem}; delete {path.parent} to run that run again from the start")


def problem_of(exc: ConfigError) -> str:
    """The problem a :func:`damaged` error names, without its advice to delete the directory: for a reader that
    records it as a line of its own (``phalanx audit``: the directory is someone else's, not to be run again)."""
    return str(exc.hint or exc.allowed).split("; delete ")[0]


def reason(exc: BaseException) -> str:
    """An exception's message as a short clause of one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def open_regular(path: Path, follow: bool = False) -> BinaryIO:
    """``path`` opened for reading, only if it is a regular file (:func:`phalanx.files.open_regular`: ``O_NONBLOCK``,
    ``O_NOFOLLOW`` unless ``follow``, ``fstat`` on the descriptor read); a :func:`damaged` error otherwise,
    :class:`FileNotFoundError` if it is missing."""
    return files.open_regular(path, follow, damaged)


def size_of(path: Path, follow: bool = False) -> int:
    """The size of ``path`` in bytes (:func:`phalanx.files.size_of`); a :func:`damaged` error if it is a symbolic
    link (not followed unless ``follow``) or not a regular file."""
    return files.size_of(path, follow, damaged)


def _too_large(path: Path, size: int, limit: int) -> ConfigError:
    return damaged(path, files.too_large(size, limit))


def loads(path: Path, raw: bytes) -> Any:
    """``raw`` (the content of ``path``) as JSON; a :func:`damaged` error naming ``path`` if it is not UTF-8 JSON, is
    nested deeper than the parser's recursion limit, or holds an integer longer than Python converts
    (``sys.get_int_max_str_digits()``, 4,300 digits: a plain :class:`ValueError` of ``json``)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise damaged(path, f"not JSON (byte {exc.start} is not UTF-8)") from None
    except json.JSONDecodeError as exc:
        raise damaged(path, f"not JSON ({reason(exc)})") from None
    except RecursionError:
        raise damaged(path, "JSON nested too deeply") from None
    except ValueError as exc:  # an integer of more than sys.get_int_max_str_digits() (4,300) digits
        raise damaged(path, f"a number too long to read ({reason(exc)})") from None


def read_bounded(path: Path, limit: int, follow: bool = False) -> bytes:
    """The bytes of ``path``, sized first: a :func:`damaged` error if it holds more than ``limit`` (nothing of it read)
    or is a symbolic link (unless ``follow``: a file the user named); :class:`FileNotFoundError` if it is missing."""
    size = size_of(path, follow)
    if size > limit:
        raise _too_large(path, size, limit)
    with open_regular(path, follow) as fh:
        raw = fh.read(limit + 1)
    if len(raw) > limit:  # it grew between the stat and the read
        raise _too_large(path, len(raw), limit)
    return raw


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file of a run directory read with bounded memory (see the module's docstring)."""
    return loads(path, read_bounded(path, limit))


def read_json_object(path: Path, limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """:func:`read_json`, and it must be a JSON object."""
    data = read_json(path, limit)
    if not isinstance(data, dict):
        raise damaged(path, f"a JSON {type(data).__name__}, not an object")
    return data


def jsonl_lines(path: Path, max_line: int = MAX_ROW_BYTES, max_bytes: int = MAX_METRICS_BYTES
                ) -> Iterator[tuple[int, bytes]]:
    """The lines of a JSON-lines file as ``(line number, raw bytes with their newline)``, streamed: a line longer
    than ``max_line`` or a file larger than ``max_bytes`` is a :func:`damaged` error, raised having read at most
    ``max_line`` bytes more than the lines before it."""
    size = size_of(path)
    if size > max_bytes:
        raise _too_large(path, size, max_bytes)
    with open_regular(path) as fh:
        number = 0
        while True:
            line = fh.readline(max_line + 1)
            if not line:
                return
            number += 1
            if len(line) > max_line and not line.endswith(b"\n"):
                raise damaged(path, f"line {number} is longer than {max_line:,} bytes (not read further)")
            yield number, line


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a checkpoint's safetensors header: its dtype name, shape, and where its bytes are (relative to
    the start of the data section)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A checkpoint's checked safetensors header: its tensors, its metadata, where the data section starts."""

    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_start: int


def _entry(path: Path, name: str, raw: Any, data_size: int) -> TensorEntry:
    if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "data_offsets"}:
        raise damaged(path, f"its header's entry for tensor {name[:60]!r} is not a tensor's")
    dtype, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if dtype not in DTYPES:
        raise damaged(path, f"tensor {name[:60]!r} has dtype {str(dtype)[:20]!r}, not one safetensors knows")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**63 for s in shape)):
        # (a size of 2**63 with another of 0 is 0 elements, which passes the size check: torch cannot hold it)
        raise damaged(path, f"tensor {name[:60]!r} has shape {str(shape)[:60]}, not a list of at most 8 sizes "
                      "below 2**63")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise damaged(path, f"tensor {name[:60]!r} has data offsets {str(offsets)[:60]}, not [begin, end]")
    begin, end = offsets
    numel = 1
    for s in shape:
        numel *= s
    if not 0 <= begin <= end <= data_size or end - begin != numel * DTYPES[dtype][1]:
        raise damaged(path, f"tensor {name[:60]!r} claims {numel:,} × {DTYPES[dtype][1]} bytes at [{begin:,}, "
                      f"{end:,}), but the file holds {data_size:,} bytes of tensor data (its header lies about sizes)")
    return TensorEntry(dtype, tuple(shape), begin, end)


def checkpoint_header(path: Path, limit: int = MAX_HEADER_BYTES, fh: BinaryIO | None = None) -> Header:
    """The checked header of the safetensors file ``path`` (see the module's docstring); a :func:`damaged` error
    naming it otherwise, raised having read at most ``limit`` + 8 bytes. Given ``fh`` (``path`` opened with
    :func:`open_regular`), read from that descriptor, sized by ``fstat`` on it: the file checked is the file read."""
    if fh is None:
        size = size_of(path)
        with open_regular(path) as opened:
            return _header_of(path, opened, size, limit)
    fh.seek(0)
    return _header_of(path, fh, os.fstat(fh.fileno()).st_size, limit)


def _header_of(path: Path, fh: BinaryIO, size: int, limit: int) -> Header:
    head = fh.read(8)
    if len(head) < 8:
        raise damaged(path, f"{size} bytes: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8:
        raise damaged(path, f"its header claims {n:,} bytes, but the file has {size - 8:,} after the length "
                      "(its header lies about sizes)")
    if n > limit:
        raise damaged(path, f"its header claims {n:,} bytes, more than the {limit:,} a checkpoint's may have "
                      "(not read)")
    raw = fh.read(n)
    table = loads(path, raw)
    if not isinstance(table, dict):
        raise damaged(path, "its header is not a JSON object")
    meta = table.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise damaged(path, "its header's metadata is not a map of text to text")
    if len(table) > MAX_TENSORS:
        raise damaged(path, f"its header lists {len(table):,} tensors, more than {MAX_TENSORS:,}")
    data_size = size - 8 - n
    tensors = {name: _entry(path, name, entry, data_size) for name, entry in table.items()}
    covered = sorted((t.begin, t.end) for t in tensors.values())
    at = 0
    for begin, end in covered:
        if begin != at:
            raise damaged(path, "its tensors overlap or leave gaps in the data (its header lies about sizes)")
        at = end
    if at != data_size:
        raise damaged(path, f"its tensors cover {at:,} bytes of the {data_size:,} of data after the header")
    return Header(tensors, meta, 8 + n)


def _table(entries: dict[str, tuple[str, tuple[int, ...]]]) -> bytes:
    return json.dumps({k: [d, list(s)] for k, (d, s) in sorted(entries.items())}, separators=(",", ":"),
                      sort_keys=True).encode()


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 (hex) of the tensors a checkpoint holds: the canonical JSON table ``{name: [dtype, shape]}`` (sorted
    names, safetensors' dtype names), then each tensor's bytes in that order (little-endian, row-major, as
    safetensors stores them). Equal to :func:`tensors_digest_of_file` of the file they are saved to."""
    h = hashlib.sha256()
    entries = {}
    for name, t in tensors.items():
        if t.dtype not in _NAME_OF:
            raise ConfigError("checkpoint tensor", f"{name} ({t.dtype})", f"one of the dtypes safetensors stores "
                              f"({', '.join(sorted(DTYPES))})")
        entries[name] = (_NAME_OF[t.dtype], tuple(t.shape))
    h.update(_table(entries))
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def tensors_digest_of_file(path: Path, header: Header | None = None) -> str:
    """:func:`tensors_digest` of the checkpoint ``path``, streamed from the file in blocks of 1 MiB (no tensor is
    loaded)."""
    header = header if header is not None else checkpoint_header(path)
    h = hashlib.sha256()
    h.update(_table({k: (e.dtype, e.shape) for k, e in header.tensors.items()}))
    with open_regular(path) as fh:
        for name in sorted(header.tensors):
            e = header.tensors[name]
            fh.seek(header.data_start + e.begin)
            left = e.end - e.begin
            while left:
                block = fh.read(min(left, 1 << 20))
                if not block:
                    raise damaged(path, f"cut short inside tensor {name[:60]!r}")
                h.update(block)
                left -= len(block)
    return h.hexdigest()


def digest_of(path: Path, fh: BinaryIO) -> str:
    """SHA-256 (hex) of the file ``fh`` (``path`` opened with :func:`open_regular`), streamed in blocks of 1 MiB from
    its start to the size ``fstat`` gives; a :func:`damaged` error if it grew meanwhile."""
    size, h = os.fstat(fh.fileno()).st_size, hashlib.sha256()
    fh.seek(0)
    while size:
        block = fh.read(min(size, 1 << 20))
        if not block:
            break
        h.update(block)
        size -= len(block)
    if fh.read(1):
        raise damaged(path, "it grew while it was read")
    return h.hexdigest()


def read_tensors(path: Path, fh: BinaryIO, header: Header) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors of the checkpoint ``fh`` (``path`` opened with :func:`open_regular`) whose checked header is
    ``header`` (:func:`checkpoint_header` of the same ``fh``), read into tensors allocated from that header (at most
    the file's size, checked against it), and the SHA-256 of every byte read, the header's included: equal to
    :func:`digest_of` the file when nothing changed it while it was read. The one descriptor is read from its start
    to its end, once; a file cut short or grown meanwhile is a :func:`damaged` error."""
    h = hashlib.sha256()
    fh.seek(0)
    head = fh.read(header.data_start)
    if len(head) != header.data_start:
        raise damaged(path, "cut short inside its header")
    h.update(head)
    tensors = {}
    for name, e in sorted(header.tensors.items(), key=lambda item: item[1].begin):
        dtype = DTYPES[e.dtype][0]
        if dtype is None:
            raise damaged(path, f"tensor {name[:60]!r} has dtype {e.dtype}, which this torch cannot hold")
        t = torch.empty(e.shape, dtype=dtype)
        if t.numel():
            buf, got = t.reshape(-1).view(torch.uint8).numpy().data, 0
            while got < len(buf):
                read = fh.readinto(buf[got:])  # type: ignore[attr-defined]
                if not read:
                    raise damaged(path, f"cut short inside tensor {name[:60]!r}")
                got += read
            h.update(buf)
        tensors[name] = t
    if fh.read(1):
        raise damaged(path, "it grew while it was read")
    return tensors, h.hexdigest()


def load_checked(path: Path, accepted: tuple[Any, ...] | None) -> tuple[Header, dict[str, torch.Tensor]] | None:
    """The checkpoint ``path``, opened once (None if it is missing): hashed (given the digests ``accepted``, one of
    them it must have: an :class:`~phalanx.errors.IntegrityError` otherwise, before anything of its size is
    allocated), its header checked (:func:`checkpoint_header`), then its tensors read (:func:`read_tensors`), all
    from that one descriptor: a file put in its place meanwhile is never read, and one changed in place while read is
    refused by the digest of what was read."""
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        return None
    with fh:
        if accepted is not None and digest_of(path, fh) not in accepted:
            raise IntegrityError(str(path), CHANGED)
        header = checkpoint_header(path, fh=fh)
        try:
            tensors, read = read_tensors(path, fh, header)
        except (OSError, RuntimeError, TypeError, OverflowError) as exc:  # (a shape torch cannot hold included)
            raise damaged(path, f"truncated or not a safetensors file ({reason(exc)})") from None
    if accepted is not None and read not in accepted:
        raise IntegrityError(str(path), CHANGED)
    return header, tensors
