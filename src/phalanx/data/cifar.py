"""Reader for the "CIFAR-10 python version" batches (Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html).

``cifar-10-batches-py/`` holds ``data_batch_1`` … ``data_batch_5`` (training, 5 × 10,000 images), ``test_batch``
(10,000) and ``batches.meta``. Each batch is a dict pickled by Python 2's ``cPickle`` with ``data`` — a uint8 array
``(10000, 3072)``, each row an image's red, green then blue 32×32 planes in row-major order — and ``labels``, a list
of ints in 0..9 (and ``batch_label``, ``filenames``, which are not used).

**Nothing the file names is called.** Unpickling runs whatever callables a pickle names, and even numpy's own
(``numpy.ndarray((150000, 3072))``, nested ``_codecs.encode``) allocate gigabytes from a few bytes. So the pickle is
not unpickled: its opcodes are decoded one by one (:func:`pickletools.genops`, which runs nothing) and interpreted
here, for the few shapes a batch has:

* plain values — dicts, lists, tuples, ints, floats, strings, bytes, ``None``, booleans, the memo;
* an array as numpy pickles it, ``_reconstruct(ndarray, (0,), b"b")`` then a BUILD of ``(version, shape, dtype,
  fortran, data)`` (protocols 0–4; Python 2's ``data`` is a str, Python 3's a bytes object or
  ``_codecs.encode(text, "latin1")``), or ``_frombuffer(data, dtype, shape, order)`` (protocol 5);
* a dtype, ``dtype(name, 0, 1)`` then a BUILD of its state, for integer names only.

The array is made from its data with :func:`numpy.frombuffer` only when ``data`` has exactly ``∏ shape × itemsize``
bytes; ``numpy.ndarray`` called for itself, a ``_reconstruct`` of another shape, ``_codecs.encode`` of anything but
a string (so no chain of them), any other callable or opcode is refused. Every object the interpretation makes is
charged to a budget of :data:`BUDGET_FACTOR` × the file's size + :data:`BUDGET_SLACK` bytes (a real batch uses
about 2.1×: its pixels as text and as bytes), and a file larger than :data:`MAX_FILE_BYTES` is not read at all.
Every refusal is one :class:`~phalanx.data.base.DataFormatError` naming the file.
"""

from __future__ import annotations

import io
import math
import pickletools
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phalanx import files
from phalanx.data.base import DataFormatError
from phalanx.data.limits import short

__all__ = ["BUDGET_FACTOR", "BUDGET_SLACK", "CLASSES", "MAX_FILE_BYTES", "TEST_FILE", "TRAIN_FILES", "read_batch",
           "read_cifar10", "read_pickle"]

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

MAX_FILE_BYTES = 1 << 28
"""A batch file larger than this (256 MiB; a real batch is about 31 MB) is refused unread."""
BUDGET_FACTOR = 4
"""What interpreting a batch may make, per byte of the file (a batch of 10,000 images in Python 2's format: 2.06 —
its pixels held as the pickle's text, then as the array's bytes; tests/test_data_bombs.py)."""
BUDGET_SLACK = 1 << 20
"""…plus this many bytes (1 MiB), for the small objects of a small file."""

_CALLABLES: dict[tuple[str, str], str] = {
    ("numpy.core.multiarray", "_reconstruct"): "_reconstruct",  # numpy 1
    ("numpy._core.multiarray", "_reconstruct"): "_reconstruct",  # numpy 2
    ("numpy.core.numeric", "_frombuffer"): "_frombuffer",
    ("numpy._core.numeric", "_frombuffer"): "_frombuffer",
    ("numpy", "ndarray"): "ndarray",
    ("numpy", "dtype"): "dtype",
    ("_codecs", "encode"): "encode",  # how Python 3 pickles bytes with protocol <= 2
}
_INTEGER_DTYPES = frozenset({"u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8"})
_MAX_DIMS = 32  # numpy's own limit
_LIST_ITEM = 16  # bytes charged per list or tuple item (a pointer, over-allocated), per memo entry and dict item
_DICT_ITEM = 104
_CONTAINER = 64


@dataclass(frozen=True)
class _Callable:
    """A callable the pickle names (one of :data:`_CALLABLES`): a name, never called."""

    name: str

    def __repr__(self) -> str:
        return {"ndarray": "numpy.ndarray", "dtype": "numpy.dtype"}.get(self.name, self.name)


@dataclass
class _Held:
    """What a REDUCE of ``_reconstruct`` or ``dtype`` stands for until numpy's BUILD gives it its state."""

    kind: str  # "array" or "dtype"
    name: str = ""  # a dtype's name
    value: Any = None
    built: bool = False


class _Interpreter:
    """The pickle's opcodes, interpreted for the values a CIFAR batch holds (module docstring); nothing is called."""

    def __init__(self, where: str, blob: bytes) -> None:
        self.where = where
        self.blob = blob
        self.budget = BUDGET_FACTOR * len(blob) + BUDGET_SLACK
        self.spent = 0
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.pos = 0

    def fail(self, problem: str, allowed: str | None = None) -> DataFormatError:
        return DataFormatError(self.where, f"not a CIFAR-10 python batch: byte {self.pos}: {problem}", allowed=allowed)

    def charge(self, nbytes: int) -> None:
        self.spent += nbytes
        if self.spent > self.budget:
            raise self.fail(
                f"it decodes to more than {self.budget:,} bytes", allowed=f"at most {BUDGET_FACTOR} × the file's "
                f"{len(self.blob):,} bytes + {BUDGET_SLACK:,} (a real batch needs about 2.1 ×)",
            )

    def value(self, x: Any) -> Any:
        """``x`` as a value: a dtype or an array once numpy's BUILD has given it its state, refused before."""
        if isinstance(x, _Held):
            if not x.built:
                raise self.fail(f"a {x.kind} used before its state was set (BUILD)")
            return x.value
        return x

    def pop(self) -> Any:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise self.fail("stack underflow")
        return self.value(self.stack.pop())

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise self.fail("no MARK to pop to")
        start = self.marks.pop()
        items = [self.value(x) for x in self.stack[start:]]
        del self.stack[start:]
        return items

    def push(self, x: Any, cost: int) -> None:
        self.charge(cost)
        self.stack.append(x)

    def run(self) -> Any:
        with warnings.catch_warnings():  # a protocol-0 string's invalid escape: the file's problem, not a warning
            warnings.simplefilter("ignore", DeprecationWarning)
            return self._run()

    def _run(self) -> Any:
        try:
            for op, arg, pos in pickletools.genops(io.BytesIO(self.blob)):
                self.pos = pos if pos is not None else self.pos
                if op.name == "STOP":
                    if len(self.stack) != 1:
                        raise self.fail(f"{len(self.stack)} values left at STOP, expected 1")
                    return self.pop()
                self.step(op.name, arg)
        except DataFormatError:
            raise
        except (ValueError, TypeError, OverflowError, UnicodeError, KeyError, IndexError) as exc:
            raise self.fail(f"{type(exc).__name__}: {exc}") from None
        raise self.fail("no STOP opcode")  # pragma: no cover - genops raises at the end of the data first

    def step(self, name: str, arg: Any) -> None:
        """One opcode, with pickle's meaning for the values it makes (one branch per opcode, as pickle's table)."""
        if name in ("PROTO", "FRAME"):
            return
        if name == "MARK":
            self.marks.append(len(self.stack))
        elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
            self.push({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name], 0)
        elif name in ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT"):
            self.push(arg, 32 + (arg.bit_length() // 8 if isinstance(arg, int) else 0))
        elif name in ("STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
                      "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"):
            self.push(arg, sys.getsizeof(arg))
        elif name in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE"):
            self.push({"EMPTY_LIST": [], "EMPTY_DICT": {}, "EMPTY_TUPLE": ()}[name], _CONTAINER)
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            k = int(name[-1])
            items = [self.pop() for _ in range(k)][::-1]
            self.push(tuple(items), _CONTAINER + _LIST_ITEM * k)
        elif name in ("TUPLE", "LIST"):
            items = self.pop_mark()
            self.push(tuple(items) if name == "TUPLE" else items, _CONTAINER + _LIST_ITEM * len(items))
        elif name == "DICT":
            items = self.pop_mark()
            self.push(self.setitems({}, items), _CONTAINER)
        elif name in ("APPEND", "APPENDS"):
            items = [self.pop()] if name == "APPEND" else self.pop_mark()
            target = self.top(list)
            self.charge(_LIST_ITEM * len(items))
            target.extend(items)
        elif name in ("SETITEM", "SETITEMS"):
            items = [self.pop() for _ in range(2)][::-1] if name == "SETITEM" else self.pop_mark()
            self.setitems(self.top(dict), items)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            if not self.stack:
                raise self.fail("nothing to memoize")
            self.charge(_DICT_ITEM)
            self.memo[len(self.memo) if arg is None else int(arg)] = self.stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if int(arg) not in self.memo:
                raise self.fail(f"memo entry {arg} was never stored")
            self.push(self.memo[int(arg)], _LIST_ITEM)
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            module, attr = self.names() if name == "STACK_GLOBAL" else str(arg).partition(" ")[::2]
            if (module, attr) not in _CALLABLES:
                raise self.fail(f"refusing to load {module}.{attr} from a data file",
                                allowed="numpy's array and dtype rebuilders and _codecs.encode")
            self.push(_Callable(_CALLABLES[(module, attr)]), 0)
        elif name == "REDUCE":
            args = self.pop()
            func = self.pop()
            if not isinstance(func, _Callable) or not isinstance(args, tuple):
                raise self.fail(f"REDUCE of {type(func).__name__} with {type(args).__name__}")
            self.push(self.reduce(func.name, args), _CONTAINER)
        elif name == "BUILD":
            state = self.pop()
            if not self.stack or not isinstance(self.stack[-1], _Held) or self.stack[-1].built:
                raise self.fail("BUILD of anything but a new dtype or array (no object may be given a state)")
            self.build(self.stack[-1], state)
        else:
            raise self.fail(f"opcode {name}, which no CIFAR-10 batch uses")

    def names(self) -> tuple[str, str]:
        attr, module = self.pop(), self.pop()
        if not isinstance(module, str) or not isinstance(attr, str):
            raise self.fail("STACK_GLOBAL of non-strings")
        return module, attr

    def top(self, kind: type) -> Any:
        if not self.stack or not isinstance(self.stack[-1], kind):
            raise self.fail(f"expected a {kind.__name__} to add items to")
        return self.stack[-1]

    def setitems(self, target: dict[Any, Any], items: list[Any]) -> dict[Any, Any]:
        if len(items) % 2:
            raise self.fail("a dict item without its value")
        self.charge(_DICT_ITEM * (len(items) // 2))
        for k in range(0, len(items), 2):
            if not isinstance(items[k], str | bytes | int):
                raise self.fail(f"a dict key of type {type(items[k]).__name__}")
            target[items[k]] = items[k + 1]
        return target

    def reduce(self, func: str, args: tuple[Any, ...]) -> Any:
        if func == "_reconstruct":
            if len(args) != 3 or args[0] != _Callable("ndarray") or args[1] != (0,) or args[2] not in (b"b", "b"):
                raise self.fail(f"_reconstruct{short(args)}", allowed="_reconstruct(numpy.ndarray, (0,), b'b'), "
                                "as numpy pickles an array")
            return _Held("array")
        if func == "dtype":
            if (len(args) != 3 or not isinstance(args[0], str) or args[0] not in _INTEGER_DTYPES
                    or args[1] not in (0, False) or args[2] not in (1, True)):
                raise self.fail(f"numpy.dtype{short(args)}", allowed="dtype(name, 0, 1) with an integer name: "
                                + ", ".join(sorted(_INTEGER_DTYPES)))
            return _Held("dtype", name=args[0])
        if func == "encode":
            if len(args) != 2 or not isinstance(args[0], str) or args[1] not in ("latin1", "latin-1"):
                raise self.fail(f"_codecs.encode of {short(args)}", allowed="_codecs.encode(str, 'latin1'), as "
                                "Python 3 pickles bytes (one level: never of its own output)")
            self.charge(len(args[0]) + 33)
            return args[0].encode("latin-1")
        if func == "_frombuffer":
            if len(args) != 4 or not isinstance(args[1], np.dtype) or args[3] not in ("C", "F"):
                raise self.fail(f"_frombuffer{short(args)}", allowed="_frombuffer(data, dtype, shape, 'C' or 'F')")
            return self.array(args[0], args[2], args[1], args[3] == "F")
        raise self.fail(f"numpy.ndarray called with {short(args)}", allowed="numpy.ndarray only as "
                        "_reconstruct's first argument: an array's size comes from the data it carries")

    def build(self, held: _Held, state: Any) -> None:
        if not isinstance(state, tuple):
            raise self.fail(f"the state of a {held.kind} is a {type(state).__name__}, not a tuple")
        if held.kind == "dtype":
            if len(state) not in (8, 9) or state[1] not in ("|", "<", ">", "=") or any(s is not None
                                                                                       for s in state[2:5]):
                raise self.fail(f"dtype state {short(state)}", allowed="(version, byte order, None, None, None, "
                                "-1, -1, 0): a plain integer dtype")
            dtype = np.dtype(held.name)
            held.value = dtype.newbyteorder(state[1]) if state[1] in "<>" else dtype
        else:
            if len(state) == 5:
                state = state[1:]
            if len(state) != 4:
                raise self.fail(f"array state {short(state)}", allowed="(1, shape, dtype, fortran, data)")
            shape, dtype, fortran, data = state
            if not isinstance(dtype, np.dtype) or fortran not in (0, 1):
                raise self.fail(f"array state {short(state)}", allowed="(1, shape, dtype, fortran, data)")
            held.value = self.array(data, shape, dtype, bool(fortran))
        held.built = True

    def array(self, data: Any, shape: Any, dtype: np.dtype[Any], fortran: bool) -> np.ndarray[Any, Any]:
        """The array ``data`` holds, made only when its length is exactly what ``shape`` and ``dtype`` need."""
        if (not isinstance(shape, tuple) or len(shape) > _MAX_DIMS
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
            raise self.fail(f"array shape {short(shape)}", allowed=f"a tuple of at most {_MAX_DIMS} sizes >= 0")
        if not isinstance(data, str | bytes | bytearray):
            raise self.fail(f"array data of type {type(data).__name__}", allowed="bytes (or latin-1 text)")
        need = math.prod(shape) * dtype.itemsize
        if len(data) != need:
            raise self.fail(f"an array of shape {shape} of {dtype.name} needs {need:,} bytes of data, the pickle "
                            f"carries {len(data):,}", allowed="the data's own length")
        if isinstance(data, bytearray):
            buf = data
        else:
            self.charge(len(data) + 57)
            buf = bytearray(data, "latin-1") if isinstance(data, str) else bytearray(data)
        return np.frombuffer(buf, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def read_pickle(path: str | Path) -> Any:
    """The value pickled in ``path`` (a CIFAR batch's dict), interpreted without calling anything the file names
    (module docstring); a :class:`DataFormatError` naming the file for anything else, or for a file that would
    need more than its budget."""
    p = Path(path)
    try:  # one descriptor, a regular file (a FIFO swapped in does not block), sized by fstat before it is read
        blob = files.read_regular(p, MAX_FILE_BYTES, follow=True, error=_refused)
    except OSError as exc:
        raise DataFormatError(str(p), f"cannot read: {exc.strerror or exc}") from None
    return _Interpreter(str(p), blob).run()


def _refused(path: Path, problem: str) -> DataFormatError:
    return DataFormatError(str(path), problem, allowed=f"a regular file of at most {MAX_FILE_BYTES:,} bytes (a "
                           "CIFAR-10 batch is about 31 MB)")


def _labels(raw: Any, n: int, where: str) -> np.ndarray[Any, Any]:
    """A batch's labels (a list of ints, or an integer array) as int64 ``(n,)`` in 0..9."""
    values: Any
    if isinstance(raw, np.ndarray) and raw.ndim == 1 and raw.dtype.kind in "iu":
        values = raw
    elif isinstance(raw, list) and all(type(v) is int for v in raw):
        values = raw
    else:
        raise DataFormatError(where, f"labels of type {type(raw).__name__}", field="labels",
                              allowed="a list of ints in 0..9, one per image")
    if len(values) != n:
        raise DataFormatError(where, f"{len(values)} labels for {n} images", field="labels",
                              allowed="one label per image")
    if len(values) and (min(values) < 0 or max(values) > 9):
        raise DataFormatError(where, f"labels outside 0..9 (min {min(values)}, max {max(values)})",
                              field="labels", allowed="0..9")
    return np.asarray(values, dtype=np.int64)


def read_batch(path: str | Path) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """One batch file → ``(images uint8 (N, 3, 32, 32), labels int64 (N,))``."""
    p = Path(path)
    obj = read_pickle(p)
    if not isinstance(obj, dict):
        raise DataFormatError(str(p), f"expected a pickled dict, got {type(obj).__name__}")
    obj = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}
    if "data" not in obj or "labels" not in obj:
        raise DataFormatError(str(p), f"expected keys 'data' and 'labels', got {sorted(map(str, obj))[:8]}")
    data = obj["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataFormatError(str(p), f"'data' should be uint8 (N, 3072), got {got}", field="data")
    labels = _labels(obj["labels"], data.shape[0], str(p))
    return data.reshape(-1, 3, 32, 32), labels


def read_cifar10(folder: str | Path) -> tuple[np.ndarray[Any, Any], ...]:
    """``folder`` holding the six batches → ``(train_images, train_labels, test_images, test_labels)``."""
    f = Path(folder)
    parts = [read_batch(f / name) for name in TRAIN_FILES]
    test_x, test_y = read_batch(f / TEST_FILE)
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    return train_x, train_y, test_x, test_y
