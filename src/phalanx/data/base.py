"""The :class:`Dataset` record, the errors of the data layer, and the shared standardisation.

Every loader returns the same record: images as a float32 tensor ``(N, C, H, W)``, standardised per channel with
the *training* set's mean and standard deviation, and labels as an int64 tensor ``(N,)``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from phalanx.errors import ConfigError, PhalanxError

__all__ = ["DataFormatError", "Dataset", "DatasetNotFoundError", "DownloadError", "printable", "standardise",
           "user_ids"]


class DatasetNotFoundError(ConfigError):
    """The files of a data set are in none of the places searched, and ``download`` was not asked for.

    A :class:`~phalanx.errors.ConfigError` (the fix is a change of configuration or environment); its message lists
    the places searched and the ways to get the files.

    Attributes: ``parameter`` (``"name"``), ``value`` (the data set), ``allowed`` (how to get it), ``searched``
    (the directories looked at, in order).
    """

    def __init__(self, name: str, searched: list[str], how: str) -> None:
        self.parameter = "name"
        self.value = name
        self.allowed = how
        self.searched = list(searched)
        where = "\n".join(f"  - {s}" for s in searched) or "  (nowhere)"
        Exception.__init__(self, f"data set {name!r}: files not found. Searched, in order:\n{where}\n{how}")


class DataFormatError(PhalanxError, ValueError):
    """A data file exists but is not what it claims to be (bad magic number, truncated, wrong shape, a header or a
    structure that would need more memory than the file's size justifies).

    One line: ``"<path>: [<field>: ]<problem>[ (allowed: <allowed>)]"``, naming the file, the field of it that is
    wrong (when the format has fields: a LEAF JSON key, a pickle's dict key) and the allowed range. Raised before
    anything large is allocated (docs/data.md, "What a data file may cost"). Each part is written with
    :func:`printable`: a file named ``"a.json\\n\\x1b[1;32mall runs finished OK"`` (whoever can write the data
    directory chooses the names listed) shows as that escaped text, on the one line, never as a second, forged line
    nor as an escape sequence a terminal acts on.

    Attributes: ``path`` (as given, for programs), ``problem``, ``field`` (or None), ``allowed`` (or None).
    """

    def __init__(self, path: str, problem: str, *, field: str | None = None, allowed: str | None = None) -> None:
        self.path = path
        self.problem = " ".join(str(problem).splitlines())  # one line, whatever a parser's message held
        self.field = field
        self.allowed = allowed
        where = printable(str(path))
        message = f"{where}: {printable(field)}: " if field else f"{where}: "
        message += printable(self.problem)
        if allowed:
            message += f" (allowed: {printable(' '.join(str(allowed).splitlines()))})"
        super().__init__(message)


def printable(text: str) -> str:
    """``text`` with each character that is not printable — a line break, a carriage return, ESC, any other control
    or separator character, a surrogate standing for a byte of an undecodable file name — written as its Python
    escape (``\\n``, ``\\x1b``, ``\\udcff``, at most 10 characters each): one line, nothing a terminal acts on."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class DownloadError(PhalanxError, OSError):
    """Every mirror of a file failed (network error or checksum mismatch)."""


def _shape_of(t: Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


@dataclass(eq=False)
class Dataset:
    """An image-classification data set, held in memory as tensors.

    Attributes
    ----------
    name: the canonical name (``"digits"``, ``"mnist"``, ``"fashion-mnist"``, ``"cifar10"``).
    train_x, test_x: float32 ``(N, C, H, W)``, standardised per channel with the training set's statistics:
        ``x = (v / scale − mean_c) / std_c`` with ``v`` the stored pixel value and ``scale`` its maximum (16 for
        digits, 255 otherwise).
    train_y, test_y: int64 ``(N,)`` in ``0 .. num_classes − 1``.
    num_classes: the number of classes.
    input_shape: ``(C, H, W)``, the shape of one image.
    source: where the data were read from (a path, or ``"phalanx.data/_files/digits.csv.gz"``).
    mean, std: the per-channel statistics used (of ``v / scale`` over the training set; population std).
    classes: the class names, index = label.
    train_users, test_users: int64 ``(N,)``, the natural client of each sample — an index into ``users`` (LEAF's
        writer of a FEMNIST character, speaking role of a Shakespeare line, Twitter user of a Sent140 tweet) — or
        None for a data set without such ids. ``partition = "natural"`` makes each user one worker.
    users: the user names, index = id (empty without ids).
    """

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    source: str
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    classes: tuple[str, ...] = ()
    train_users: Tensor | None = None
    test_users: Tensor | None = None
    users: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x: Tensor = getattr(self, f"{split}_x")
            y: Tensor = getattr(self, f"{split}_y")
            if x.dtype != torch.float32 or _shape_of(x)[1:] != tuple(self.input_shape):
                raise ValueError(f"{split}_x: expected float32 (N, *{self.input_shape}), got {x.dtype} {_shape_of(x)}")
            if y.dtype != torch.int64 or y.ndim != 1 or y.shape[0] != x.shape[0]:
                raise ValueError(f"{split}_y: expected int64 ({x.shape[0]},), got {y.dtype} {_shape_of(y)}")
            u: Tensor | None = getattr(self, f"{split}_users")
            if u is None:
                continue
            if u.dtype != torch.int64 or u.ndim != 1 or u.shape[0] != x.shape[0]:
                raise ValueError(f"{split}_users: expected int64 ({x.shape[0]},), got {u.dtype} {_shape_of(u)}")
            if u.numel() and (int(u.min()) < 0 or int(u.max()) >= len(self.users)):
                raise ValueError(f"{split}_users: ids must index users (0 … {len(self.users) - 1})")

    @property
    def has_users(self) -> bool:
        """Whether every training sample carries its natural client's id (what ``partition = "natural"`` needs)."""
        return self.train_users is not None and len(self.users) > 0

    @classmethod
    def from_tensors(
        cls, name: str, train_x: Any, train_y: Any, test_x: Any, test_y: Any, num_classes: int | None = None,
        source: str = "tensors", train_users: Any = None, test_users: Any = None,
    ) -> Dataset:
        """A data set from arrays or tensors: inputs become float32 ``(N, ...)``, labels int64 ``(N,)`` (used as
        given: standardise them first if the model expects it); ``num_classes`` defaults to the largest label + 1.

        ``train_users`` / ``test_users``: each sample's natural client (a writer, a speaker: any hashable ids,
        strings or integers), for ``partition = "natural"``; the users are numbered in order of first appearance,
        training samples first (:func:`user_ids`)."""
        try:
            tx, vx = (torch.as_tensor(v).to(torch.float32) for v in (train_x, test_x))
            ty, vy = (torch.as_tensor(v).to(torch.int64) for v in (train_y, test_y))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError("dataset", name, f"arrays or tensors of numbers ({exc})") from None
        if tx.ndim < 1 or tx.shape[1:] != vx.shape[1:] or tx.shape[0] == 0:
            got = f"{_shape_of(tx)}, {_shape_of(vx)}"
            raise ConfigError("dataset", name, f"non-empty train and test inputs of one shape, got {got}")
        for split, x, y in (("train", tx, ty), ("test", vx, vy)):
            if y.ndim != 1 or y.shape[0] != x.shape[0]:
                got = f"{_shape_of(y)} for {_shape_of(x)}"
                raise ConfigError("dataset", name, f"one label per {split} input, got {got}")
        labels = torch.cat([ty, vy])
        classes = int(labels.max()) + 1 if num_classes is None else int(num_classes)
        if int(labels.min()) < 0 or int(labels.max()) >= classes or classes < 2:
            raise ConfigError("dataset", name, f"labels in 0 … {classes - 1}, at least two classes")
        shape = tuple(int(s) for s in tx.shape[1:]) or (1,)
        if not tx.shape[1:]:
            tx, vx = tx[:, None], vx[:, None]
        if train_users is None:
            if test_users is not None:
                raise ConfigError("train_users", None, "the training samples' users too, when test_users are given")
            return cls(name, tx.contiguous(), ty.contiguous(), vx.contiguous(), vy.contiguous(), classes, shape,
                       source)
        tu_list, vu_list = list(train_users), [] if test_users is None else list(test_users)
        if len(tu_list) != tx.shape[0] or (test_users is not None and len(vu_list) != vx.shape[0]):
            raise ConfigError("train_users", f"{len(tu_list)} ids", f"one user id per training sample "
                              f"({tx.shape[0]}) and, if given, per test sample ({vx.shape[0]})")
        names, ids = user_ids(tu_list + vu_list)
        tu = ids[: len(tu_list)]
        vu = ids[len(tu_list):] if test_users is not None else None
        return cls(name, tx.contiguous(), ty.contiguous(), vx.contiguous(), vy.contiguous(), classes, shape, source,
                   train_users=tu, test_users=vu, users=names)

    @property
    def n_train(self) -> int:
        """Number of training images."""
        return int(self.train_x.shape[0])

    @property
    def n_test(self) -> int:
        """Number of test images."""
        return int(self.test_x.shape[0])

    def fingerprint(self) -> str:
        """SHA-256 (hex) of the four tensors: for each of train_x, train_y, test_x, test_y in that order, its name,
        dtype and shape, then its bytes in C order (native byte order, little-endian on every supported machine).

        Two data sets have the same fingerprint exactly when they hold the same values in the same order; the
        name and ``source`` are not part of it (the same files found in two places give the same fingerprint).
        A data set with user ids (:attr:`train_users`) also hashes them, and the user names, after the four.
        Hashes every byte (about 0.3 s for Fashion-MNIST) once: the result is kept, keyed by the tensors' storage
        and version counters, so an in-place change to any of them makes the next call hash again.
        """
        tensors = [getattr(self, k) for k in ("train_x", "train_y", "test_x", "test_y")]
        tensors += [t for t in (self.train_users, self.test_users) if t is not None]
        key = tuple((t.data_ptr(), t._version, _shape_of(t)) for t in tensors)
        cached = self.__dict__.get("_fingerprint_cache")
        if cached is not None and cached[0] == key:
            return str(cached[1])
        digest = self._hash()
        self.__dict__["_fingerprint_cache"] = (key, digest)
        return digest

    def _hash(self) -> str:
        h = hashlib.sha256()
        for key in ("train_x", "train_y", "test_x", "test_y"):
            t: Tensor = getattr(self, key).detach().to("cpu").contiguous()
            h.update(f"{key}|{t.dtype}|{_shape_of(t)}\n".encode())
            h.update(t.numpy().reshape(-1).view(np.uint8).data)  # the bytes in place, no copy
        for key in ("train_users", "test_users"):  # absent for the data sets without ids: their digest is unchanged
            u: Tensor | None = getattr(self, key)
            if u is not None:
                h.update(f"{key}|{u.dtype}|{_shape_of(u)}\n".encode())
                h.update(u.detach().to("cpu").contiguous().numpy().reshape(-1).view(np.uint8).data)
        if self.users:
            h.update(("users|" + "\x00".join(self.users)).encode())
        return h.hexdigest()

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, train={self.n_train}, test={self.n_test}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes}, source={self.source!r})"
        )


def user_ids(values: list[Any]) -> tuple[tuple[str, ...], Tensor]:
    """Ids of any hashable values (user names, integers) as int64 indices, numbered in order of first appearance,
    with the names (``str`` of each distinct value): ``(["b", "a", "b"]) → (("b", "a"), [0, 1, 0])``."""
    index: dict[Any, int] = {}
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        key = v.item() if isinstance(v, np.generic | Tensor) else v  # 0-d tensors hash by identity, not value
        out[i] = index.setdefault(key, len(index))
    return tuple(str(k) for k in index), torch.from_numpy(out)


def standardise(
    train: np.ndarray[Any, Any], test: np.ndarray[Any, Any], scale: int,
) -> tuple[Tensor, Tensor, tuple[float, ...], tuple[float, ...]]:
    """Map uint8 pixels ``v ∈ 0..scale`` of shape ``(N, C, H, W)`` to float32 ``(v / scale − μ_c) / σ_c``.

    ``μ_c`` and ``σ_c`` (population standard deviation) are computed exactly, in float64, from a histogram of the
    *training* pixels of channel ``c``; the test set is mapped with the same statistics. Each channel's map is a
    lookup table of ``scale + 1`` float32 values rounded once from float64, so the result does not depend on the
    order of a floating-point reduction. A channel with σ_c = 0 is only centred.
    """
    if train.ndim != 4 or test.ndim != 4 or train.shape[1:] != test.shape[1:]:
        raise ValueError(f"expected (N, C, H, W) arrays of one image shape, got {train.shape} and {test.shape}")
    if train.dtype != np.uint8 or test.dtype != np.uint8 or not 0 < scale <= 255 or train.shape[0] == 0:
        raise ValueError(
            f"expected uint8 pixels, a non-empty training set and 0 < scale <= 255; got {train.dtype} "
            f"{train.shape}, {test.dtype}, scale {scale}",
        )
    channels = train.shape[1]
    levels = np.arange(scale + 1, dtype=np.float64) / scale
    lut = np.empty((channels, scale + 1), dtype=np.float32)
    means: list[float] = []
    stds: list[float] = []
    for c in range(channels):
        pixels = torch.from_numpy(np.ascontiguousarray(train[:, c])).reshape(-1)
        counts = torch.bincount(pixels, minlength=scale + 1).numpy().astype(np.float64)
        if counts.shape[0] > scale + 1:
            raise ValueError(f"pixel values above {scale}")
        total = counts.sum()
        mu = float((counts * levels).sum() / total)
        sigma = float(np.sqrt((counts * (levels - mu) ** 2).sum() / total))
        means.append(mu)
        stds.append(sigma)
        lut[c] = ((levels - mu) / (sigma if sigma > 0 else 1.0)).astype(np.float32)

    def apply(raw: np.ndarray[Any, Any]) -> Tensor:
        if raw.size and int(raw.max()) > scale:
            raise ValueError(f"pixel values above {scale}")
        out = np.empty(raw.shape, dtype=np.float32)
        for c in range(channels):
            out[:, c] = lut[c][raw[:, c]]  # a table lookup per pixel, indexed by the uint8 values directly
        return torch.from_numpy(out)

    return apply(train), apply(test), tuple(means), tuple(stds)
