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

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phalanx.data.base import DataFormatError

__all__ = [
    "FEMNIST_CLASSES", "LEAF_LETTERS", "OOV", "LeafSplit", "encode_text", "femnist_pixels", "has_leaf_files",
    "read_leaf_dir", "sent140_text", "text_labels",
]

FEMNIST_CLASSES = tuple("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
"""FEMNIST's 62 classes, index = label (LEAF's ``relabel_class``: digits, then upper-case, then lower-case)."""

LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""The 80 characters of LEAF's Shakespeare models (``ALL_LETTERS`` in LEAF's ``language_utils.py``), index = code."""

OOV = len(LEAF_LETTERS)
"""The code of a character outside :data:`LEAF_LETTERS` (LEAF maps it to −1; here it is one more symbol, 80)."""

_CODES = np.full(256, OOV, dtype=np.int64)  # code of each Latin-1 character; other code points are OOV
for _i, _c in enumerate(LEAF_LETTERS):
    _CODES[ord(_c)] = _i


@dataclass
class LeafSplit:
    """One split (``train/`` or ``test/``) of a LEAF data set: the users in file order, and each sample's ``x``,
    ``y`` and user (an index into ``users``)."""

    users: list[str]
    x: list[Any]
    y: list[Any]
    user_of: np.ndarray[Any, Any]
    files: list[Path]


def _json_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.json") if p.is_file())


def has_leaf_files(folder: Path) -> bool:
    """Whether ``folder`` holds LEAF's layout: ``train/`` and ``test/`` with at least one ``.json`` file each."""
    return all((folder / s).is_dir() and _json_files(folder / s) for s in ("train", "test"))


def read_leaf_dir(folder: Path) -> LeafSplit:
    """Read every ``*.json`` file of ``folder`` (sorted by name) in LEAF's format.

    A user may appear in several files (its samples are then appended in file order). Raises
    :class:`~phalanx.data.base.DataFormatError` naming the file for invalid JSON, missing keys, ``num_samples``
    that disagree with the data, or ``x`` and ``y`` of different lengths.
    """
    users: list[str] = []
    index: dict[str, int] = {}
    xs: list[Any] = []
    ys: list[Any] = []
    owner: list[int] = []
    files = _json_files(folder)
    for path in files:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataFormatError(str(path), f"not a LEAF JSON file ({type(exc).__name__}: {exc})") from None
        if not isinstance(doc, dict) or not {"users", "user_data"} <= set(doc):
            raise DataFormatError(str(path), "expected a JSON object with 'users', 'num_samples' and 'user_data'")
        listed, data = doc["users"], doc["user_data"]
        counts = doc.get("num_samples")
        if not isinstance(listed, list) or not isinstance(data, dict):
            raise DataFormatError(str(path), "'users' must be a list and 'user_data' an object")
        if counts is not None and (not isinstance(counts, list) or len(counts) != len(listed)):
            raise DataFormatError(str(path), "'num_samples' must list one count per user")
        for k, user in enumerate(listed):
            entry = data.get(user) if isinstance(user, str) else None
            if not isinstance(entry, dict) or not isinstance(entry.get("x"), list) or not isinstance(entry.get("y"),
                                                                                                      list):
                raise DataFormatError(str(path), f"user {user!r}: expected user_data[{user!r}] = {{'x': [...], "
                                      "'y': [...]}")
            x, y = entry["x"], entry["y"]
            if len(x) != len(y):
                raise DataFormatError(str(path), f"user {user!r}: {len(x)} inputs but {len(y)} labels")
            if counts is not None and counts[k] != len(y):
                raise DataFormatError(str(path), f"user {user!r}: num_samples says {counts[k]}, the data hold "
                                      f"{len(y)}")
            u = index.setdefault(user, len(users))
            if u == len(users):
                users.append(user)
            xs.extend(x)
            ys.extend(y)
            owner.extend([u] * len(y))
    return LeafSplit(users, xs, ys, np.asarray(owner, dtype=np.int64), files)


def femnist_pixels(split: LeafSplit, where: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """FEMNIST's ``x`` as uint8 images ``(N, 1, 28, 28)`` (``round(255·x)``, exact for LEAF's ``v/255``) and ``y``
    as int64 labels in 0–61; a :class:`DataFormatError` (naming ``where``) for anything else."""
    bad = next((i for i, r in enumerate(split.x) if not isinstance(r, list) or len(r) != 784), None)
    if bad is not None:
        got = len(split.x[bad]) if isinstance(split.x[bad], list) else type(split.x[bad]).__name__
        raise DataFormatError(where, f"user {split.users[split.user_of[bad]]!r}: expected 784 pixels per FEMNIST "
                              f"sample, got {got}")
    try:
        x = np.asarray(split.x, dtype=np.float64)
        y = np.asarray(split.y, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(where, f"FEMNIST samples must be 784 numbers and an integer label ({exc})") from None
    if x.ndim != 2 or x.shape[1] != 784 or y.shape != (x.shape[0],):
        raise DataFormatError(where, f"expected 784 pixels per FEMNIST sample, got shape {x.shape}")
    if x.size and (not np.isfinite(x).all() or x.min() < 0 or x.max() > 1):
        raise DataFormatError(where, "FEMNIST pixels must lie in [0, 1] (LEAF stores v/255)")
    if y.size and (y.min() < 0 or y.max() >= len(FEMNIST_CLASSES)):
        raise DataFormatError(where, f"FEMNIST labels must lie in 0..61, got {y.min()}..{y.max()}")
    v = np.rint(x * 255.0)
    return v.astype(np.uint8).reshape(-1, 1, 28, 28), y


def encode_text(texts: list[str], length: int, where: str) -> np.ndarray[Any, Any]:
    """Strings as int64 codes ``(N, length)`` in :data:`LEAF_LETTERS` (a character outside it: :data:`OOV`). A
    string shorter than ``length`` is left-padded with spaces, a longer one keeps its last ``length`` characters."""
    out = np.empty((len(texts), length), dtype=np.int64)
    for i, s in enumerate(texts):
        if not isinstance(s, str):
            raise DataFormatError(where, f"sample {i}: expected a string, got {type(s).__name__}")
        s = s[-length:].rjust(length)
        b = np.frombuffer(s.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        out[i] = np.where(b < 256, _CODES[np.minimum(b, 255)], OOV)
    return out


def text_labels(split: LeafSplit, where: str) -> np.ndarray[Any, Any]:
    """Shakespeare's ``y`` (one character each) as codes in :data:`LEAF_LETTERS` (else :data:`OOV`)."""
    for i, c in enumerate(split.y):
        if not isinstance(c, str) or len(c) != 1:
            raise DataFormatError(where, f"sample {i}: a Shakespeare label is one character, got {c!r}")
    return encode_text([str(c) for c in split.y], 1, where)[:, 0]


def sent140_text(split: LeafSplit, where: str) -> tuple[list[str], np.ndarray[Any, Any]]:
    """Sent140's tweets (the 5th field of each ``x``) and their labels (0 or 1)."""
    texts: list[str] = []
    for i, row in enumerate(split.x):
        if not isinstance(row, list) or len(row) < 5 or not isinstance(row[4], str):
            raise DataFormatError(where, f"sample {i}: a Sent140 input is [id, date, query, user, text]")
        texts.append(row[4])
    try:
        y = np.asarray([int(v) for v in split.y], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(where, f"Sent140 labels must be 0 or 1 ({exc})") from None
    if y.size and (y.min() < 0 or y.max() > 1):
        raise DataFormatError(where, "Sent140 labels must be 0 or 1")
    return texts, y
