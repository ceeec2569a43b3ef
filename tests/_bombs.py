"""Hostile data files, written here from the formats' descriptions, and a child process that loads them under a memory
limit and reports what each load cost (tests/test_data_bombs.py).

Every bomb is what an attacker who controls a data file can write: a few hundred bytes of pickle, a gzip file whose
header lies, a JSON file that ``json.loads`` blows up. The child measures each load twice: ``tracemalloc``'s peak
(every byte Python and numpy *allocated*, touched or not, so an ``np.empty`` of 4 GB counts) and the growth of its
peak resident memory (``ru_maxrss``, what the kernel really gave it; its peak is reset to the
resident size after the imports through ``/proc/self/clear_refs``, so that only the loads count);
it runs under ``RLIMIT_AS`` = its size after imports + :data:`HEADROOM`, so a load that tries to take gigabytes
fails at once with a ``MemoryError`` instead of swapping the machine.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np

import phalanx

SRC = Path(phalanx.__file__).resolve().parents[1]
HEADROOM = 1 << 29
"""Address space the child may add to what it holds after its imports (512 MiB)."""

# ------------------------------------------------------------------------------------------------------------ pickle


class Py2Pickle:
    """The opcodes Python 2's ``cPickle.dump(obj, f, 2)`` wrote (how CIFAR-10's batches were made): a ``str`` as
    SHORT_BINSTRING / BINSTRING, every str, tuple, list, dict and global memoized with BINPUT / LONG_BINPUT, ints as
    BININT1 / BININT2 / BININT, lists and dicts filled in batches of 1,000 (``pickle.py``'s ``_batch_appends``), and
    a numpy 1.x array as ``_reconstruct(ndarray, (0,), 'b')`` + BUILD ``(1, shape, dtype, False, data)`` with its
    dtype ``dtype('u1', 0, 1)`` + BUILD ``(3, '|', None, None, None, -1, -1, 0)``."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.memo = 0

    def put(self) -> None:
        self.out += b"q" + bytes([self.memo]) if self.memo < 256 else b"r" + struct.pack("<I", self.memo)
        self.memo += 1

    def string(self, s: bytes) -> None:
        self.out += (b"U" + bytes([len(s)]) if len(s) < 256 else b"T" + struct.pack("<i", len(s))) + s
        self.put()

    def int(self, v: int) -> None:
        if 0 <= v < 256:
            self.out += b"K" + bytes([v])
        elif 0 <= v < 65536:
            self.out += b"M" + struct.pack("<H", v)
        else:
            self.out += b"J" + struct.pack("<i", v)

    def glob(self, module: bytes, name: bytes) -> None:
        self.out += b"c" + module + b"\n" + name + b"\n"
        self.put()

    def array(self, a: np.ndarray) -> None:
        self.glob(b"numpy.core.multiarray", b"_reconstruct")
        self.glob(b"numpy", b"ndarray")
        self.int(0)
        self.out += b"\x85"  # TUPLE1
        self.put()
        self.string(b"b")
        self.out += b"\x87"  # TUPLE3
        self.put()
        self.out += b"R"
        self.put()
        self.out += b"("  # the state: (1, shape, dtype, False, data)
        self.int(1)
        for s in a.shape:
            self.int(s)
        self.out += {1: b"\x85", 2: b"\x86", 3: b"\x87"}[a.ndim]
        self.put()
        self.glob(b"numpy", b"dtype")
        self.string(b"u1")
        self.int(0)
        self.int(1)
        self.out += b"\x87"
        self.put()
        self.out += b"R"
        self.put()
        self.out += b"("
        self.int(3)
        self.string(b"|")
        self.out += b"NNN" + b"J\xff\xff\xff\xff" * 2
        self.int(0)
        self.out += b"t"
        self.put()
        self.out += b"b\x89"  # BUILD the dtype; NEWFALSE: not Fortran order
        self.string(a.tobytes())
        self.out += b"t"
        self.put()
        self.out += b"b"

    def items(self, values: list[Any], each: Any, close: bytes) -> None:
        for start in range(0, len(values), 1000):
            part = values[start: start + 1000]
            self.out += b"(" if len(part) > 1 else b""
            for v in part:
                each(v)
            self.out += close if len(part) > 1 else close.replace(b"e", b"a").replace(b"u", b"s")


def py2_batch(data: np.ndarray, labels: list[int], batch_label: str = "training batch 1 of 5") -> bytes:
    """A CIFAR-10 batch as Python 2 and numpy 1.x pickled it (:class:`Py2Pickle`)."""
    p = Py2Pickle()
    p.out += b"}"
    p.put()
    p.out += b"("
    p.string(b"data")
    p.array(data)
    p.string(b"labels")
    p.out += b"]"
    p.put()
    p.items(labels, p.int, b"e")
    p.string(b"batch_label")
    p.string(batch_label.encode())
    p.string(b"filenames")
    p.out += b"]"
    p.put()
    p.items([f"img_{i}.png".encode() for i in range(len(labels))], p.string, b"e")
    p.out += b"u."
    return bytes(p.out)


def _batch_around(payload: bytes) -> bytes:
    """``{"data": <payload>, "labels": []}`` (protocol 2), the payload's opcodes pushing one value."""
    return b"\x80\x02}(X\x04\x00\x00\x00data" + payload + b"X\x06\x00\x00\x00labels]u."


def ndarray_bomb() -> bytes:
    """``numpy.ndarray((150000, 3072))``: 3.7 GB of float64 from a few dozen bytes (an allowed callable before)."""
    return _batch_around(b"cnumpy\nndarray\n" + b"J\xf0I\x02\x00M\x00\x0c\x86\x85R")


def reconstruct_bomb() -> bytes:
    """``_reconstruct(ndarray, (150000, 3072), b'b')``: numpy's own rebuilder asked for a 460 MB empty array."""
    return _batch_around(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
                         + b"J\xf0I\x02\x00M\x00\x0c\x86C\x01b\x87R")


def codecs_bomb(levels: int = 28) -> bytes:
    """``_codecs.encode`` nested ``levels`` deep with the ``hex`` codec: each level doubles, 64 bytes → 64·2^levels."""
    calls = b"c_codecs\nencode\nq\x00" + b"h\x00" * (levels - 1)
    value = b"C\x40" + b"A" * 64 + b"X\x03\x00\x00\x00hexq\x01" + b"\x86R"
    return _batch_around(calls + value + b"h\x01\x86R" * (levels - 1))


def memo_encode_bomb(size: int = 1 << 15, times: int = 4000) -> bytes:
    """One ``size``-character string, memoized, ``_codecs.encode``-d ``times`` times into a list: each encode a new
    ``size``-byte object (``size·times`` bytes from a file of ``size + 7·times``)."""
    head = b"c_codecs\nencode\nq\x00X" + struct.pack("<I", size) + b"a" * size + b"q\x01X\x06\x00\x00\x00latin1q\x02"
    return _batch_around(b"(" + head + b"h\x00h\x01h\x02\x86R" * times + b"l")


def empty_lists_bomb(n: int = 1 << 19) -> bytes:
    """A list of ``n`` empty lists: 2 bytes of pickle (``]a``) make a 56-byte list and an 8-byte slot."""
    return _batch_around(b"]" + b"]a" * n)


# -------------------------------------------------------------------------------------------------------------- gzip


def idx_header(shape: tuple[int, ...], code: int = 0x08) -> bytes:
    return struct.pack(">HBB", 0, code, len(shape)) + struct.pack(f">{len(shape)}I", *shape)


def gzip_of(header: bytes, zeros: int) -> bytes:
    """``header`` + ``zeros`` zero bytes, gzip-compressed a megabyte at a time (never held whole)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [c.compress(header)]
    block = bytes(1 << 20)
    for _ in range(zeros >> 20):
        out.append(c.compress(block))
    out.append(c.compress(bytes(zeros & ((1 << 20) - 1))))
    out.append(c.flush())
    return b"".join(out)


# -------------------------------------------------------------------------------------------------------------- JSON


def long_string_json(nbytes: int) -> bytes:
    """A LEAF-looking file whose one user name is ``nbytes`` long and ends in an astral character (so CPython stores
    the whole string, and the decoded document, at 4 bytes a character)."""
    name = b"a" * (nbytes - 4) + "\U0001f600".encode()
    return b'{"users": ["' + name + b'"], "num_samples": [0], "user_data": {}}'


def empty_lists_json(n: int) -> bytes:
    return b'{"users": [], "user_data": {}, "x": [' + b",".join([b"[]"] * n) + b"]}"


def deep_json(depth: int) -> bytes:
    return b'{"users": ' + b"[" * depth + b"]" * depth + b', "user_data": {}}'


# ----------------------------------------------------------------------------------------------------------- the child

CHILD = r'''
import gzip, json, pickle, resource, sys, time, tracemalloc
from pathlib import Path

import numpy as np
from phalanx.data import cifar, idx, jsonscan, leaf
from phalanx.data.base import DataFormatError


class OldCifarUnpickler(pickle.Unpickler):
    """The reader before: an allow-list of callables, each then called with whatever the file gave it."""
    import codecs
    R, F = np.zeros(1).__reduce_ex__(2)[0], np.zeros(1).__reduce_ex__(5)[0]
    ALLOWED = {("numpy.core.multiarray", "_reconstruct"): R, ("numpy._core.multiarray", "_reconstruct"): R,
               ("numpy.core.numeric", "_frombuffer"): F, ("numpy._core.numeric", "_frombuffer"): F,
               ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): codecs.encode}

    def find_class(self, module, name):
        return self.ALLOWED[(module, name)]


READERS = {
    "cifar": cifar.read_batch,
    "idx": idx.read_idx,
    "leaf-file": lambda p: leaf.read_leaf_json(Path(p)),
    "old-cifar": lambda p: OldCifarUnpickler(open(p, "rb"), encoding="latin1").load(),
    "old-idx": lambda p: gzip.open(p).read(),
    "old-leaf": lambda p: json.loads(Path(p).read_text(encoding="utf-8")),
}


def statm(field):
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[field]) * resource.getpagesize()


cases = json.loads(sys.argv[1])
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (statm(0) + int(sys.argv[2]), hard))
try:  # Linux: reset the peak resident size (VmHWM, ru_maxrss) to the current one, past the imports' own peak
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
except OSError:
    pass
base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
for kind, path, patches in cases:
    for name, value in patches.items():
        module, attr = name.rsplit(".", 1)
        setattr(sys.modules[module], attr, value)
    tracemalloc.reset_peak()
    held = tracemalloc.get_traced_memory()[0]  # what earlier cases left traced (a failed old load can leave some)
    start = time.perf_counter()
    error, message = None, ""
    try:
        READERS[kind](path)
    except DataFormatError as exc:
        error, message = "DataFormatError", str(exc)
    except MemoryError:
        error = "MemoryError"
    except Exception as exc:
        error, message = type(exc).__name__, str(exc)[:300]
    traced = tracemalloc.get_traced_memory()[1] - held
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb
    print(json.dumps({"kind": kind, "path": path, "error": error, "message": message, "traced": traced,
                      "rss_grown": grown * 1024, "seconds": time.perf_counter() - start}), flush=True)
'''


def load_in_child(cases: list[tuple[str, Path, dict[str, Any]]], headroom: int = HEADROOM) -> list[dict[str, Any]]:
    """Load each ``(reader, path, patches)`` in one child process (module docstring); one report per case, in order.

    ``patches``: module attributes to set first (``{"phalanx.data.cifar.BUDGET_FACTOR": 10**9}``), for the mutants
    that switch a check off. ``rss_grown`` is cumulative (the peak resident size only grows), ``traced`` per case."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    arg = json.dumps([[kind, str(path), patches] for kind, path, patches in cases])
    done = subprocess.run([sys.executable, "-c", CHILD, arg, str(headroom)], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(cases), done.stderr[-3000:]
    return reports


# ------------------------------------------------------------------------------------------------- all the bombs

BOMBS: dict[str, tuple[str, Any]] = {  # name → (reader, the file's bytes or how to make it)
    "ndarray": ("cifar", ndarray_bomb),
    "reconstruct": ("cifar", reconstruct_bomb),
    "codecs": ("cifar", codecs_bomb),
    "memo": ("cifar", memo_encode_bomb),
    "lists": ("cifar", lambda: empty_lists_bomb(1 << 18)),
    "huge": ("cifar", None),  # a sparse 300 MB file
    "lies.gz": ("idx", lambda: gzip_of(idx_header((1, 28, 28)), 128 << 20)),
    "claims.gz": ("idx", lambda: gzip.compress(idx_header((60_000, 28, 28)) + bytes(100))),
    "absurd.gz": ("idx", lambda: gzip.compress(idx_header((2**32 - 1,) * 3))),
    "plain": ("idx", lambda: idx_header((60_000, 28, 28)) + bytes(100)),
    "string.json": ("leaf-file", lambda: long_string_json(8 << 20)),
    "lists.json": ("leaf-file", lambda: empty_lists_json(700_000)),
    "deep.json": ("leaf-file", lambda: deep_json(100_000)),
}
OLD = {"cifar": "old-cifar", "idx": "old-idx", "leaf-file": "old-leaf"}
MUTANTS = {  # a check switched off: (bomb, the module attribute that disables it)
    "memo": "phalanx.data.cifar.BUDGET_FACTOR",
    "claims.gz": "phalanx.data.idx.GZIP_MAX_RATIO",
    "string.json": "phalanx.data.leaf.MAX_STRING_BYTES",
    "lists.json": "phalanx.data.leaf.EXPANSION",
    "deep.json": "phalanx.data.leaf.MAX_DEPTH",
}


def measure(folder: Path) -> dict[str, Any]:
    """Write every bomb of :data:`BOMBS` into ``folder`` and load each in one child process: first by today's
    readers, then by the readers as they were before (``old``: the pickle allow-list, ``gzip`` whole,
    ``json.loads``), then with each check of :data:`MUTANTS` switched off (``mutant``), in that order — the peak
    resident size only grows, so the refusals are measured before anything large was ever held. Returns the paths
    and the reports, by bomb, of each group."""
    paths: dict[str, Path] = {}
    for name, (_, make) in BOMBS.items():
        paths[name] = folder / name
        if make is None:
            with open(paths[name], "wb") as fh:
                fh.truncate(300 << 20)  # sparse: no disk, no memory
        else:
            paths[name].write_bytes(make())
    cases: list[tuple[str, Path, dict[str, Any]]] = [(kind, paths[n], {}) for n, (kind, _) in BOMBS.items()]
    old = [n for n in BOMBS if n not in ("huge", "claims.gz", "absurd.gz", "plain")]  # those the old readers read
    cases += [(OLD[BOMBS[n][0]], paths[n], {}) for n in old]
    cases += [(BOMBS[n][0], paths[n], {attr: 10**18}) for n, attr in MUTANTS.items()]
    reports = iter(load_in_child(cases))
    return {"paths": paths, "new": {n: next(reports) for n in BOMBS}, "old": {n: next(reports) for n in old},
            "mutant": {n: next(reports) for n in MUTANTS}}


if __name__ == "__main__":  # PYTHONPATH=src python tests/_bombs.py: the table of docs/data.md
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        got = measure(Path(tmp))
        print(f"{'file':12} {'bytes':>11}  {'now':>20}  {'before':>22}  {'check off':>24}")

        def cell(r: dict[str, Any] | None) -> str:
            if r is None:
                return "-"
            if r["error"] == "MemoryError":
                return "MemoryError"
            size = f"{r['traced'] / 2**20:,.1f} MiB"
            said = "one line" if r["error"] == "DataFormatError" else r["error"]
            return size if said is None else f"{size}, {said}"

        for name, path in got["paths"].items():
            print(f"{name:12} {path.stat().st_size:>11,}  {cell(got['new'][name]):>20}  "
                  f"{cell(got['old'].get(name)):>22}  {cell(got['mutant'].get(name)):>24}")
