"""LEAF's JSON files: FEMNIST (by writer), Shakespeare (by speaking role), Sent140 (by Twitter user).

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", arXiv:1812.01097, 2018) publishes its data sets as
the output of its preprocessing scripts: a ``train/`` and a ``test/`` directory of JSON files, each

.. code-block:: json

    {"users": ["f0000_14", ...], "num_samples": [124, ...],
     "user_data": {"f0000_14": {"x": [...], "y": [...]}, ...}}

one entry of ``x`` and ``y`` per sample, grouped by the user (the natural client) who produced it. The samples are

* **FEMNIST** — 28×28 handwritten characters of NIST Special Database 19, grouped by writer: ``x`` a list of 784
  pixel values ``v/255`` in [0, 1] (LEAF's ``data_to_json.py``), ``y`` the class 0–61 (digits 0–9, upper-case A–Z,
  lower-case a–z);
* **Shakespeare** — next-character prediction, grouped by speaking role (a character in a play): ``x`` a string of
  80 characters, ``y`` the character that follows;
* **Sent140** — tweets labelled by sentiment, grouped by Twitter user: ``x`` the list ``[id, date, query, user,
  text]`` of Sentiment140's row, ``y`` 0 (negative) or 1 (positive).

This module reads and checks the files and turns them into arrays; :mod:`phalanx.data.loaders` finds them and
builds the :class:`~phalanx.data.base.Dataset`.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from phalanx import files
from phalanx.data import jsonscan
from phalanx.data.base import DataFormatError
from phalanx.data.limits import short

__all__ = [
    "EXPANSION", "EXPANSION_SLACK", "FEMNIST_CLASSES", "LEAF_LETTERS", "MAX_DEPTH", "MAX_FILE_BYTES",
    "MAX_STRING_BYTES", "OOV", "TEXT_EXPANSION", "TEXT_SAMPLE_BYTES",
    "LeafSplit", "check_text_cost", "encode_text", "femnist_pixels", "has_leaf_files", "parse_leaf_json",
    "read_leaf_bytes", "read_leaf_dir", "read_leaf_json",
    "sent140_text", "shakespeare_text", "text_labels",
]

FEMNIST_CLASSES = tuple("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
"""FEMNIST's 62 classes, index = label (LEAF's ``relabel_class``: digits, then upper-case, then lower-case)."""

LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""The 80 characters of LEAF's Shakespeare models (``ALL_LETTERS`` in LEAF's ``language_utils.py``), index = code."""

OOV = len(LEAF_LETTERS)
"""The code of a character outside :data:`LEAF_LETTERS` (LEAF maps it to −1; here it is one more symbol, 80)."""

_CODES = np.full(256, OOV, dtype=np.uint8)  # code of each Latin-1 character; other code points are OOV
for _i, _c in enumerate(LEAF_LETTERS):
    _CODES[ord(_c)] = _i


MAX_STRING_BYTES = 1 << 16
"""The longest JSON string a LEAF file may hold, in bytes (64 KiB; LEAF's longest strings are tweets, at most 280
characters: under 4 KB even with each escaped as a surrogate pair): a longer one is refused before anything is
parsed (:func:`phalanx.data.jsonscan.scan`)."""
MAX_DEPTH = 8
"""The deepest nesting a LEAF file may have (LEAF's own: 5, ``{"user_data": {user: {"x": [[...]]}}}``)."""
EXPANSION = 16
"""What parsing a LEAF file may cost, per byte of the file: its :meth:`~phalanx.data.jsonscan.JsonCost.estimate`
must stay within ``EXPANSION`` × its size + :data:`EXPANSION_SLACK` (LEAF's three formats, as its scripts write
them, are estimated at most 14 ×: tests/test_data_bombs.py)."""
EXPANSION_SLACK = 1 << 20
MAX_FILE_BYTES = 1 << 30
"""The largest LEAF file read (1 GiB), whatever its estimate, refused from its size before a byte is read: parsing
one may cost up to :data:`EXPANSION` × its size, so this also caps one parse at 16 GiB + :data:`EXPANSION_SLACK`.
LEAF's largest files are well below it (estimated from their sample counts, not measured here): FEMNIST's
``all_data_*.json`` hold about 100 writers each (~0.1 GB), Shakespeare's training split ~4.2 million samples of 80
characters (~0.4 GB)."""


@dataclass
class LeafSplit:
    """One split (``train/`` or ``test/``) of a LEAF data set: the users in file order, and each sample's ``x``,
    ``y`` and user (an index into ``users``); ``starts[k]``: the first sample read from ``files[k]``; ``size``: the
    bytes read from its files (what :func:`check_text_cost` weighs the conversion against)."""

    users: list[str]
    x: list[Any]
    y: list[Any]
    user_of: np.ndarray[Any, Any]
    files: list[Path]
    starts: list[int] = field(default_factory=list)
    size: int = 0

    def locate(self, i: int) -> tuple[str, str]:
        """The file that sample ``i`` was read from, and the field that holds it
        (``user_data["<user>"]``)."""
        k = max(bisect.bisect_right(self.starts, i) - 1, 0)
        where = str(self.files[k]) if self.files else "?"
        user = self.users[int(self.user_of[i])] if i < len(self.user_of) else "?"
        return where, _user_field(user)


def _user_field(user: str) -> str:
    """A user's field, ``user_data["<user>"]`` (a name longer than 60 characters cut, marked with …)."""
    return f"user_data[{json.dumps(user[:60])}{'…' if len(user) > 60 else ''}]"


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _json_files(folder: Path) -> list[Path]:
    """Every ``*.json`` entry of ``folder`` (any name ending ``.json``, hidden ones too), sorted by name, each a
    regular file or a link to one: its kind is read with ``os.stat`` and nothing is opened here (a FIFO cannot
    block). Anything else — a FIFO, a device or a link to one, a directory, a dangling link, a link loop, a link
    whose target cannot be looked up — is a one-line :class:`DataFormatError` naming it, not skipped: a split with
    one of its files silently left out would load as less data than it holds. The readers then open each file once
    more, ``O_NONBLOCK``, and check it with ``fstat`` (:func:`read_leaf_bytes`): a file swapped meanwhile is refused
    too."""
    try:
        with os.scandir(folder) as entries:
            names = sorted(e.name for e in entries if e.name.endswith(".json"))
    except OSError as exc:
        raise DataFormatError(str(folder), f"cannot list: {exc.strerror or exc}") from None
    allowed = "regular .json files (or links to them) only"
    for name in names:
        path = folder / name
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            what = "a link whose target" if os.path.islink(path) else "an entry that"
            raise DataFormatError(str(path), f"{what} cannot be looked up: {exc.strerror or exc}",
                                  allowed=allowed) from None
        if not stat.S_ISREG(mode):
            kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
            raise DataFormatError(str(path), f"{kind}, not a regular file", allowed=allowed)
    return [folder / name for name in names]


def has_leaf_files(folder: Path) -> bool:
    """Whether ``folder`` holds LEAF's layout: ``train/`` and ``test/`` with at least one ``.json`` file each (a
    :class:`DataFormatError` naming any ``*.json`` entry there that is not a regular file: :func:`_json_files`)."""
    return all((folder / s).is_dir() and _json_files(folder / s) for s in ("train", "test"))


def _refused(path: Path, problem: str) -> DataFormatError:
    return DataFormatError(str(path), problem)


def read_leaf_json(path: Path) -> Any:
    """``path`` parsed as JSON once :func:`~phalanx.data.jsonscan.scan` has shown it affordable: a regular file of at
    most :data:`MAX_FILE_BYTES`, no string longer than :data:`MAX_STRING_BYTES`, no nesting deeper than
    :data:`MAX_DEPTH`, and an estimated cost within :data:`EXPANSION` × the file's size; a one-line
    :class:`DataFormatError` naming the file otherwise.

    The file is opened once (:func:`phalanx.files.read_regular`: ``O_NONBLOCK``, so a FIFO in its place does not
    block; ``fstat`` on that descriptor, so a device or a link to ``/dev/zero`` is refused, as is a file over the
    cap, from its size) and its bytes are read once: the scan and the parse see the same bytes, whatever happens to
    the name meanwhile."""
    return parse_leaf_json(read_leaf_bytes(path), str(path))


def read_leaf_bytes(path: Path) -> bytes:
    """The bytes of the LEAF file ``path``, read once from one regular-file descriptor of at most
    :data:`MAX_FILE_BYTES` (:func:`read_leaf_json`); a one-line :class:`DataFormatError` naming it otherwise."""
    try:
        return files.read_regular(path, MAX_FILE_BYTES, follow=True, error=_refused)
    except OSError as exc:
        raise DataFormatError(str(path), f"cannot read: {exc.strerror or exc}") from None
    except MemoryError:
        raise DataFormatError(str(path), "not enough memory to read it",
                              allowed=f"at most {MAX_FILE_BYTES:,} bytes and the memory to read them") from None


def parse_leaf_json(raw: bytes, where: str) -> Any:
    """``raw``, the bytes read from the file ``where``, parsed as JSON once the scan of these very bytes has shown it
    affordable (:func:`read_leaf_json`)."""
    cost = jsonscan.scan(raw, MAX_STRING_BYTES, MAX_DEPTH, where)
    budget = EXPANSION * cost.size + EXPANSION_SLACK
    if cost.estimate() > budget:
        raise DataFormatError(where, f"parsing it would take up to {cost.estimate():,} bytes ({cost.containers:,} "
                              f"arrays and objects, {cost.commas:,} items in {cost.size:,} bytes)",
                              allowed=f"at most {EXPANSION} × the file's size + {EXPANSION_SLACK:,} = {budget:,} "
                              "bytes; LEAF's own formats need at most 14 ×")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique)
    except _DuplicateKey as exc:
        raise DataFormatError(where, f"the key {_shown_key(exc.key)} is given twice in one object",
                              allowed="each key once per object (json keeps the last, another reader the first: "
                              "two readers would see two data sets)") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise DataFormatError(where, f"not a LEAF JSON file ({type(exc).__name__}: {exc})") from None
    except MemoryError:
        raise DataFormatError(where, f"not enough memory to parse its {len(raw):,} bytes (up to "
                              f"{cost.estimate():,} bytes estimated)") from None


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One JSON object's pairs as a dict, refused (:class:`_DuplicateKey`) when a key is given twice — ``json.loads``
    alone keeps the last ``"w"`` of ``{"w": …, "w": …}``, so a file could show a reviewer (or a first-wins reader)
    one writer's data and train Phalanx on another's, or hide a whole ``users`` list. Linear: one dict, and a set
    only for a file that has a repeated key."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _shown_key(key: Any) -> str:
    """A key of the file for an error message: :func:`~phalanx.data.limits.short`'s ``repr`` of its first 16
    characters, itself cut to 60 (a non-printable character's escape is up to 10 characters long)."""
    text = short(key, 16)
    return text if len(text) <= 60 else text[:59] + "…"


def _user_entries(doc: Any, where: str) -> list[tuple[str, list[Any], list[Any]]]:
    """The ``(user, x, y)`` of one LEAF file's document, in the order of ``users``, with its structure checked:
    ``users`` a list of distinct strings, ``num_samples`` (when present) one count per user, equal to the data's,
    ``user_data[user]`` an object with lists ``x`` and ``y`` of one length. A :class:`DataFormatError` naming the
    file and the field otherwise."""
    if not isinstance(doc, dict) or "users" not in doc or "user_data" not in doc:
        got = f"a {type(doc).__name__}"
        if isinstance(doc, dict):  # the file's first keys, each shortened: a key may hold 64 KiB of anything
            keys = [_shown_key(k) for k in itertools.islice(doc, 6)]
            got = f"an object of {len(doc):,} keys: {', '.join(keys)}{', …' if len(doc) > 6 else ''}"
        raise DataFormatError(where, f"expected a JSON object with 'users', 'num_samples' and 'user_data', got {got}")
    listed, data, counts = doc["users"], doc["user_data"], doc.get("num_samples")
    if not isinstance(listed, list):
        raise DataFormatError(where, f"a {type(listed).__name__}", field="users", allowed="a list of user names")
    if not isinstance(data, dict):
        raise DataFormatError(where, f"a {type(data).__name__}", field="user_data",
                              allowed="an object: user -> {'x': [...], 'y': [...]}")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(listed)):
        got = f"{len(counts)} counts" if isinstance(counts, list) else f"a {type(counts).__name__}"
        raise DataFormatError(where, f"'num_samples' must list one count per user: {got} for {len(listed)} users",
                              field="num_samples", allowed="a list of one count per user")
    seen: set[str] = set()
    out: list[tuple[str, list[Any], list[Any]]] = []
    for k, user in enumerate(listed):
        if not isinstance(user, str) or user in seen:
            what = "a duplicate" if isinstance(user, str) else f"a {type(user).__name__}"
            raise DataFormatError(where, f"{what}: {short(user)}", field=f"users[{k}]", allowed="distinct strings")
        seen.add(user)
        name = _user_field(user)
        entry = data.get(user)
        if not isinstance(entry, dict) or not isinstance(entry.get("x"), list) or not isinstance(entry.get("y"),
                                                                                                  list):
            raise DataFormatError(where, f"user {short(user)}: expected {name} = {{'x': [...], 'y': [...]}}",
                                  field=name)
        x, y = entry["x"], entry["y"]
        if len(x) != len(y):
            raise DataFormatError(where, f"user {short(user)}: {len(x)} inputs but {len(y)} labels", field=name,
                                  allowed="one label in y per input in x")
        if counts is not None and (not _count(counts[k]) or counts[k] != len(y)):
            raise DataFormatError(where, f"user {short(user)}: num_samples says {short(counts[k])}, the data hold "
                                  f"{len(y)}", field=f"num_samples[{k}]", allowed=f"{len(y)}")
        out.append((user, x, y))
    return out


def read_leaf_dir(folder: Path) -> LeafSplit:
    """Read every ``*.json`` file of ``folder`` (sorted by name) in LEAF's format.

    A user may appear in several files (its samples are then appended in file order). Each file is checked before
    it is parsed (:func:`read_leaf_json`: its strings, nesting and parsing cost against its size) and after
    (:func:`_user_entries`: its structure); a :class:`~phalanx.data.base.DataFormatError` names the file and the
    field for invalid JSON, missing keys, ``num_samples`` that disagree with the data, or ``x`` and ``y`` of
    different lengths.
    """
    users: list[str] = []
    index: dict[str, int] = {}
    xs: list[Any] = []
    ys: list[Any] = []
    owner: list[int] = []
    starts: list[int] = []
    files = _json_files(folder)
    size = 0
    for path in files:
        raw = read_leaf_bytes(path)
        size += len(raw)
        entries = _user_entries(parse_leaf_json(raw, str(path)), str(path))
        del raw
        starts.append(len(ys))
        for user, x, y in entries:
            u = index.setdefault(user, len(users))
            if u == len(users):
                users.append(user)
            xs.extend(x)
            ys.extend(y)
            owner.extend([u] * len(y))
    return LeafSplit(users, xs, ys, np.asarray(owner, dtype=np.int64), files, starts, size)


def _bad(split: LeafSplit, i: int, where: str, part: str, problem: str, allowed: str) -> DataFormatError:
    """The error for ``part`` (``"x"`` or ``"y"``) of sample ``i`` of ``split``, naming the file it came from
    (``where`` when unknown) and its field, ``user_data["<user>"].x[k]``: the ``k``-th of that user in that file."""
    if not split.files or i >= len(split.user_of):
        return DataFormatError(where, f"sample {i}: {part}: {problem}", allowed=allowed)
    path, name = split.locate(i)
    first = bisect.bisect_right(split.starts, i) - 1
    lo = split.starts[first] if first >= 0 else 0
    k = int((split.user_of[lo:i] == split.user_of[i]).sum())
    return DataFormatError(path, problem, field=f"{name}.{part}[{k}]", allowed=allowed)


def femnist_pixels(split: LeafSplit, where: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """FEMNIST's ``x`` as uint8 images ``(N, 1, 28, 28)`` (``round(255·x)``, exact for LEAF's ``v/255``) and ``y``
    as int64 labels in 0–61; a :class:`DataFormatError` naming the file and the sample for anything else.

    Every pixel must be a JSON number (an int or a float: not a string, a bool, a list) and every label a JSON
    integer (not ``3.9``, ``"61"``, ``true`` nor ``[1]``), checked value by value before it is converted: a row
    of 784 pairs would otherwise become 2 images under one label (and shift every later writer's images), and a
    float label would be truncated. One image per sample and one label per sample, always."""
    pixels = "784 numbers in [0, 1] (LEAF stores v/255)"
    n = len(split.y)
    bad = next((i for i, r in enumerate(split.x) if not isinstance(r, list) or len(r) != 784), None)
    if bad is not None:
        got = len(split.x[bad]) if isinstance(split.x[bad], list) else type(split.x[bad]).__name__
        raise _bad(split, bad, where, "x", f"expected 784 pixels per FEMNIST sample, got {got}", pixels)
    if not set(map(type, itertools.chain.from_iterable(split.x))) <= _NUMBERS:  # C speed: ~14 µs a sample
        bad = next((i for i, r in enumerate(split.x) if not set(map(type, r)) <= _NUMBERS), 0)
        kinds = sorted({type(v).__name__ for v in split.x[bad]} - {"int", "float"}) or ["?"]
        raise _bad(split, bad, where, "x", f"FEMNIST pixels are JSON numbers, got a {kinds[0]}", pixels)
    try:
        x = np.asarray(split.x, dtype=np.float64).reshape(-1, 784)
    except OverflowError:  # an integer pixel past float64's range
        bad = next((i for i, r in enumerate(split.x) if not _converts(r, np.float64)), 0)
        raise _bad(split, bad, where, "x", "FEMNIST pixels must lie in [0, 1]", pixels) from None
    if x.shape != (n, 784):  # unreachable after the checks above; never images and labels misaligned
        raise _bad(split, 0, where, "x", f"{x.shape[0]} images for {n} labels", "one image per label")
    if x.size:
        ok = np.isfinite(x).all(axis=1) & (x >= 0).all(axis=1) & (x <= 1).all(axis=1)
        if not ok.all():
            raise _bad(split, int(np.argmin(ok)), where, "x", "FEMNIST pixels must lie in [0, 1]", pixels)
    labels = "0..61"
    for i, v in enumerate(split.y):
        if type(v) is not int:  # a bool is not an int here; 3.9 and "61" are refused, not converted
            raise _bad(split, i, where, "y", f"a FEMNIST label is a JSON integer, got {short(v)}", labels)
        if not 0 <= v < len(FEMNIST_CLASSES):
            raise _bad(split, i, where, "y", f"FEMNIST labels must lie in 0..61, got {short(v)}", labels)
    y = np.asarray(split.y, dtype=np.int64).reshape(n)
    np.rint(np.multiply(x, 255.0, out=x), out=x)  # in place: one float64 array, not three
    return x.astype(np.uint8).reshape(-1, 1, 28, 28), y


_NUMBERS = frozenset((int, float))
"""The Python types of a JSON number as :func:`json.loads` makes them (``true`` is a bool, not one of them)."""


def _converts(values: Any, dtype: type) -> bool:
    try:
        np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def encode_text(texts: list[str], length: int, where: str) -> np.ndarray[Any, Any]:
    """Strings as uint8 codes ``(N, length)`` in :data:`LEAF_LETTERS` (a character outside it: :data:`OOV`; 81
    symbols, so one byte each — int64 took 8). A string shorter than ``length`` is left-padded with spaces, a longer
    one keeps its last ``length`` characters. Encoded :data:`_TEXT_CHUNK` strings at a time: what it holds besides
    the codes is bounded by one chunk, whatever ``N``."""
    out = np.empty((len(texts), length), dtype=np.uint8)
    for lo in range(0, len(texts), _TEXT_CHUNK):
        part = texts[lo:lo + _TEXT_CHUNK]
        bad = next((k for k, s in enumerate(part) if not isinstance(s, str)), None)
        if bad is not None:
            raise DataFormatError(where, f"sample {lo + bad}: expected a string, got {type(part[bad]).__name__}")
        joined = "".join(s[-length:].rjust(length) for s in part)
        b = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        out[lo:lo + len(part)] = np.where(b < 256, _CODES[np.minimum(b, 255)], OOV).reshape(len(part), length)
    return out


_TEXT_CHUNK = 512
"""Strings encoded at a time by :func:`encode_text` (at 144 characters: ~1 MiB of temporaries)."""


TEXT_EXPANSION = 16
"""What turning a text split (Shakespeare, Sent140) into arrays may allocate, per byte of the split's files:
:func:`check_text_cost`'s ``N × (length × 5 +`` :data:`TEXT_SAMPLE_BYTES` ``)`` must stay within ``TEXT_EXPANSION``
× the files' size + :data:`EXPANSION_SLACK`, checked before anything is allocated. LEAF's 80-character
Shakespeare lines need 5.2 ×, Sent140 rows of Sentiment140's shape about 4.5 ×, the shipped ``sent140-sample`` (short
synthetic tweets) 7.0 ×."""
TEXT_SAMPLE_BYTES = 64
"""What one text sample costs besides its codes, in bytes: its label and user id as int64 and their copies, and its
slots in the lists the split is read into (docs/data.md, "What a data file may cost")."""


def check_text_cost(split: LeafSplit, length: int, where: str) -> None:
    """Refuse, in one line naming ``where``, a text split whose conversion — ``length`` uint8 codes a sample and their
    float32 copy (5 bytes a character) and :data:`TEXT_SAMPLE_BYTES` a sample — would allocate more than
    :data:`TEXT_EXPANSION` × the bytes of its files + :data:`EXPANSION_SLACK`: a file of short strings (each padded
    to ``length``) or of many small files cost up to 106 × its size before this check."""
    n = len(split.x)
    need = n * (length * 5 + TEXT_SAMPLE_BYTES)
    budget = TEXT_EXPANSION * split.size + EXPANSION_SLACK
    if need > budget:
        raise DataFormatError(where, f"{n:,} samples of {length} codes would take {need:,} bytes to hold (from "
                              f"{split.size:,} bytes of files)", allowed=f"at most {TEXT_EXPANSION} × the files' "
                              f"size + {EXPANSION_SLACK:,} = {budget:,} bytes; LEAF's 80-character lines need 5.2 ×")


def shakespeare_text(split: LeafSplit, where: str) -> list[str]:
    """Shakespeare's ``x`` (one string each), checked: a :class:`DataFormatError` naming the file and the sample
    for anything else."""
    bad = next((i for i, s in enumerate(split.x) if not isinstance(s, str)), None)
    if bad is not None:
        raise _bad(split, bad, where, "x", f"a Shakespeare input is a string, got {type(split.x[bad]).__name__}",
                   "a string")
    return split.x


def text_labels(split: LeafSplit, where: str) -> np.ndarray[Any, Any]:
    """Shakespeare's ``y`` (one character each) as codes in :data:`LEAF_LETTERS` (else :data:`OOV`)."""
    for i, c in enumerate(split.y):
        if not isinstance(c, str) or len(c) != 1:
            raise _bad(split, i, where, "y", f"a Shakespeare label is one character, got {short(c)}",
                       "one character")
    return encode_text([str(c) for c in split.y], 1, where)[:, 0].astype(np.int64)


def sent140_text(split: LeafSplit, where: str) -> tuple[list[str], np.ndarray[Any, Any]]:
    """Sent140's tweets (the 5th field of each ``x``) and their labels, each the JSON integer 0 or 1."""
    texts: list[str] = []
    for i, row in enumerate(split.x):
        if not isinstance(row, list) or len(row) < 5 or not isinstance(row[4], str):
            raise _bad(split, i, where, "x", "a Sent140 input is [id, date, query, user, text]",
                       "a list whose 5th item is the tweet's text")
        texts.append(row[4])
    for i, v in enumerate(split.y):  # the JSON integers 0 and 1: not 0.9, "1", " 0 ", true (int() took them all)
        if type(v) is not int or v not in (0, 1):
            raise _bad(split, i, where, "y", f"Sent140 labels must be the integer 0 or 1, got {short(v)}", "0 or 1")
    return texts, np.asarray(split.y, dtype=np.int64).reshape(len(split.y))
