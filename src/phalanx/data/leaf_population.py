"""A natural-data population read lazily from LEAF's FEMNIST files: one client per writer, a file parsed only when
one of its writers is asked for.

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", arXiv:1812.01097, 2018) writes a data set as
``train/`` and ``test/`` directories of JSON files, each ``{"users": [...], "num_samples": [...], "user_data":
{user: {"x": [...], "y": [...]}}}`` (:mod:`phalanx.data.leaf`). Its files hold a bounded number of writers each
(FEMNIST's ``all_data_*.json``: about 100), so the population is read a file at a time:

* **opening** parses each ``train/`` file once, in name order, and keeps its path and the SHA-256 of its bytes,
  and for each writer where its entries are (two integers; more only for a writer listed in several files) —
  memory O(files + writers), the peak one file's parse; client ``k`` is the ``k``-th distinct writer in that order,
  as the eager reader numbers them, and a writer listed in several files is one client holding its entries of every
  file in file order, as the eager reader appends them (it was one client per entry: such a writer chosen for
  evaluation put its test samples into the run's test set twice);
* **a request** for clients ``ids`` groups them by file and parses each file it needs once (the checks of
  :func:`phalanx.data.leaf.read_leaf_json` and the structure checks of the eager reader: a hostile file is a one-line
  :class:`~phalanx.data.base.DataFormatError` naming it, before its parse is allowed to cost more than
  :data:`~phalanx.data.leaf.EXPANSION` × its size), so its peak is one file plus the clients asked for, whatever the
  number of files; a file whose bytes are no longer those hashed at the opening (rewritten while the run trains:
  fewer writers, or the same number with other data) is a one-line :class:`~phalanx.data.base.DataFormatError`
  naming it, never an ``IndexError`` nor other data trained on silently;
* the **evaluation clients** (``eval_clients`` evenly spaced writers) give the pixels' standardisation (their training
  pixels' mean and standard deviation, :func:`phalanx.data.base.standardise`), the server's pooled training sample and
  the run's test set: their entries of ``test/``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from phalanx.data import leaf
from phalanx.data.base import DataFormatError, standardise
from phalanx.data.limits import short
from phalanx.data.population import Population
from phalanx.errors import ConfigError
from phalanx.validate import check_int

__all__ = ["LeafPopulation"]


def _entries(path: Path, digest: str | None = None) -> tuple[list[tuple[str, list[Any], list[Any]]], str]:
    """The checked ``(writer, x, y)`` entries of one LEAF file (bounded parse, then structure), and the SHA-256 of the
    bytes they were parsed from; with ``digest`` (what the file held when the population opened), a one-line
    :class:`DataFormatError` if the file no longer holds those bytes, before it is parsed."""
    raw = leaf.read_leaf_bytes(path)
    now = hashlib.sha256(raw).hexdigest()
    if digest is not None and now != digest:
        raise DataFormatError(str(path), f"changed since the population opened (SHA-256 {now[:16]}…, was "
                              f"{digest[:16]}…): its writers are not the clients the run numbered",
                              allowed="the file as it was when the run started; start the run again to read it anew")
    return leaf._user_entries(leaf.parse_leaf_json(raw, str(path)), str(path)), now


def _pixels(path: Path, user: str, x: list[Any], y: list[Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """One writer's FEMNIST samples as uint8 images and labels, checked by the eager reader's rules."""
    split = leaf.LeafSplit([user], x, y, np.zeros(len(y), dtype=np.int64), [path], [0])
    return leaf.femnist_pixels(split, str(path))


class LeafPopulation(Population):
    """FEMNIST's writers as a population, read lazily from ``folder`` (``train/`` and ``test/`` JSON directories;
    see the module's docstring). ``eval_clients``: how many evenly spaced writers make the test set (1 … 10,000)."""

    def __init__(self, folder: str | Path, eval_clients: int = 100) -> None:
        self.folder = Path(folder)
        self.eval_clients = check_int("eval_clients", eval_clients, low=1, high=10_000)
        if not leaf.has_leaf_files(self.folder):
            raise ConfigError("dataset_params.path", str(self.folder), "a LEAF data directory with train/ and test/ "
                              "folders of .json files")
        self.name = "femnist-population"
        self.num_classes = len(leaf.FEMNIST_CLASSES)
        self.input_shape = (1, 28, 28)
        self.files = leaf._json_files(self.folder / "train")
        self.digests: list[str] = []  # a request re-reads a file only if it still holds these bytes
        self._open()
        self.size = self.writers
        if self.writers == 0:
            raise DataFormatError(str(self.folder / "train"), "no writers", allowed="at least one writer")
        ids = self.eval_ids(self.eval_clients)
        raw, users = self._read(ids)
        wanted = set(users)
        tests: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
        for path in leaf._json_files(self.folder / "test"):
            for user, x, y in _entries(path)[0]:
                if user in wanted:
                    px, py = _pixels(path, user, x, y)
                    old = tests.get(user)
                    tests[user] = (px, py) if old is None else (np.concatenate([old[0], px]),
                                                              np.concatenate([old[1], py]))
        train_px = np.concatenate([r[0] for r in raw])
        empty = (np.zeros((0, 1, 28, 28), np.uint8), np.zeros(0, np.int64))
        test_px = np.concatenate([tests.get(u, empty)[0] for u in users])
        self.train_x, self.test_x, self.mean, self.std = standardise(train_px, test_px, 255)
        self.train_y = torch.from_numpy(np.concatenate([r[1] for r in raw]))
        self.test_y = torch.from_numpy(np.concatenate([tests.get(u, empty)[1] for u in users]))
        self._table = self._lookup()

    def _open(self) -> None:
        """Parse each ``train/`` file once, in name order: every entry checked as a request will read it (its pixels
        and labels; at least one sample), so that a bad file is refused when the population opens, not in round
        1,000; keep each file's SHA-256, which every later read must find again, and each distinct writer's first
        entry (``_first``: file and position) and its further entries in later files (``_more``)."""
        number: dict[bytes, int] = {}  # a writer's name (its SHA-256: 32 bytes, whatever its length) -> client
        first_file: list[int] = []
        first_pos: list[int] = []
        self._more: dict[int, list[tuple[int, int]]] = {}
        for f, path in enumerate(self.files):
            entries, digest = _entries(path)
            self.digests.append(digest)
            for pos, (user, x, y) in enumerate(entries):
                if not y:
                    raise DataFormatError(str(path), f"writer {short(user)} has no samples",
                                          field=leaf._user_field(user), allowed="at least one sample per writer")
                _pixels(path, user, x, y)
                k = number.setdefault(hashlib.sha256(user.encode("utf-8", "surrogatepass")).digest(), len(number))
                if k == len(first_file):
                    first_file.append(f)
                    first_pos.append(pos)
                else:  # listed in an earlier file too: the same client, as the eager reader has it
                    self._more.setdefault(k, []).append((f, pos))
        self._first = np.asarray([first_file, first_pos], dtype=np.int64).reshape(2, -1)
        self.writers = len(first_file)

    def _lookup(self) -> Tensor:
        """The float32 value of each pixel 0…255 under the evaluation clients' standardisation."""
        v = torch.arange(256, dtype=torch.float64) / 255.0
        return ((v - self.mean[0]) / (self.std[0] or 1.0)).float()

    def _parts(self, k: int) -> list[tuple[int, int]]:
        """Client ``k``'s entries, ``(file, position among that file's writers)``, in file order."""
        if not 0 <= k < self.writers:
            raise ConfigError("client", k, f"0..{self.writers - 1} (the writers of {self.folder})")
        return [(int(self._first[0, k]), int(self._first[1, k])), *self._more.get(k, [])]

    def _read(self, ids: Sequence[int]) -> tuple[list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]], list[str]]:
        """The raw pixels and labels of the clients ``ids``, in order, each file parsed once; and their writers."""
        by_file: dict[int, list[tuple[int, int, int]]] = {}
        pieces: list[list[Any]] = []
        for j, k in enumerate(ids):
            parts = self._parts(int(k))
            pieces.append([None] * len(parts))
            for i, (f, pos) in enumerate(parts):
                by_file.setdefault(f, []).append((j, i, pos))
        users: list[str] = [""] * len(ids)
        for f, wanted in by_file.items():
            path = self.files[f]
            entries, _ = _entries(path, self.digests[f])
            for j, i, pos in wanted:
                if pos >= len(entries):  # unreachable while the digest holds; never an IndexError
                    raise DataFormatError(str(path), f"{len(entries)} writers, client {ids[j]} is its writer {pos}")
                user, x, y = entries[pos]
                pieces[j][i], users[j] = _pixels(path, user, x, y), user
        out = [p[0] if len(p) == 1 else (np.concatenate([q[0] for q in p]), np.concatenate([q[1] for q in p]))
               for p in pieces]
        return out, users

    def clients(self, ids: Sequence[int]) -> list[tuple[Tensor, Tensor]]:
        """The standardised FEMNIST samples of the writers ``ids`` (each file parsed once per request)."""
        raw, _ = self._read(ids)
        return [(self._table[torch.from_numpy(px.astype(np.int64))], torch.from_numpy(py)) for px, py in raw]

    def __repr__(self) -> str:
        return f"LeafPopulation({str(self.folder)!r}, eval_clients={self.eval_clients})"
