"""Hugging Face ``datasets`` and Flower Datasets (``flwr-datasets``) in, a Phalanx :class:`Dataset` with users out.

A user's own ``datasets.Dataset`` (from local files, ``Dataset.from_dict``, or the Hub), a list of them (one per
client), or a flwr-datasets partitioner that has been given a data set becomes one :class:`Dataset` whose samples
carry their client's id, so that ``partition = "natural"`` gives each client back as one worker
(:func:`from_hf`). ``load("femnist" | "shakespeare", download=True)`` uses the same conversion on Flower's copies of
the LEAF data on the Hub (:func:`download_leaf`).

``datasets`` is an optional extra (``pip install 'phalanx[hf]'``); nothing here imports it until it is needed, and a
missing package is a one-line :class:`~phalanx.errors.ConfigError` naming the extra.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from phalanx.data import leaf
from phalanx.data.base import DataFormatError, Dataset, DownloadError, standardise, user_ids
from phalanx.errors import ConfigError

__all__ = ["HOLDOUT", "HUB", "HUB_PROBE", "MAX_PADDING", "download_leaf", "from_hf", "holdout_split", "probe",
           "require"]

HOLDOUT = 10
"""Without a test set, every ``HOLDOUT``-th sample of each user (the 10th, 20th, …, in order) is a test sample:
LEAF's ``-t sample --tf 0.9`` split, drawn without a random generator."""

HUB: dict[str, dict[str, str]] = {
    "femnist": {"repo": "flwrlabs/femnist", "x": "image", "y": "character", "user": "writer_id"},
    "shakespeare": {"repo": "flwrlabs/shakespeare", "x": "x", "y": "y", "user": "character_id"},
}
"""Flower's copies of the LEAF data sets on the Hugging Face Hub (Flower Datasets' data hub) and their columns."""

HUB_PROBE = "https://huggingface.co/api/datasets/"
"""Asked (with a short timeout) before a download, so that an offline machine gets a one-line error at once."""
_PROBE_TIMEOUT_S = 10.0
_X_COLUMNS = ("image", "img", "pixels", "x", "text", "features")
_Y_COLUMNS = ("label", "labels", "character", "y", "target")


def require() -> Any:
    """The ``datasets`` module; a one-line ConfigError naming the extra when it is not installed."""
    try:
        import datasets
    except ImportError:
        raise ConfigError("dataset", "a Hugging Face datasets.Dataset", "the optional extra installed: pip install "
                          "'phalanx[hf]' (Hugging Face datasets)") from None
    return datasets


def _partitions(obj: Any) -> tuple[list[Any], list[str] | None]:
    """A data set, a list of per-client data sets, or a flwr-datasets partitioner, as a list of data sets (and the
    client names when each data set is one client)."""
    if hasattr(obj, "load_partition") and hasattr(obj, "num_partitions"):  # flwr_datasets.partitioner.Partitioner
        n = int(obj.num_partitions)
        natural = getattr(obj, "partition_id_to_natural_id", None)  # NaturalIdPartitioner: the ids' own names
        names = [str(natural[i]) if isinstance(natural, dict) and i in natural else str(i) for i in range(n)]
        return [obj.load_partition(i) for i in range(n)], names
    if isinstance(obj, Sequence) and not isinstance(obj, str) and not hasattr(obj, "column_names"):
        parts = list(obj)
        if not parts:
            raise ConfigError("train", "[]", "at least one data set")
        return parts, [str(i) for i in range(len(parts))]
    if not hasattr(obj, "column_names"):
        raise ConfigError("train", type(obj).__name__, "a datasets.Dataset, a list of them (one per client) or a "
                          "flwr-datasets partitioner with its data set set")
    return [obj], None


def _pick(columns: list[str], given: str | None, choices: tuple[str, ...], what: str) -> str:
    if given is not None:
        if given not in columns:
            raise ConfigError(what, given, "a column of the data set: " + ", ".join(columns))
        return given
    found = next((c for c in choices if c in columns), None)
    if found is None:
        raise ConfigError(what, None, f"the name of the {what} column (none of {', '.join(choices)} is there; "
                          f"columns: {', '.join(columns)})")
    return found


def _column(ds: Any, name: str) -> list[Any]:
    return list(ds[name])


MAX_PADDING = 16
"""Without ``length``, every string is padded to the longest: that longest may be at most ``MAX_PADDING`` × the mean
length + 64 characters (one outlier would otherwise pad every sample to its length: 10⁵ samples and one string of 10⁶
characters are 800 GB of codes)."""


def _text_length(values: list[Any], where: str) -> int:
    """The default ``length``: the longest string, when padding to it costs at most :data:`MAX_PADDING` × what the
    strings hold; a :class:`ConfigError` naming ``length`` otherwise, before anything is allocated."""
    lengths = [len(v) if isinstance(v, str) else 0 for v in values]
    longest = max(lengths)
    mean = sum(lengths) / len(lengths)
    if longest > MAX_PADDING * mean + 64:
        at = lengths.index(longest)
        raise ConfigError("length", None, f"a number of characters per input for {where}: its longest string (input "
                          f"{at}, {longest:,} characters) is over {MAX_PADDING} × the mean ({mean:,.0f}) + 64, and "
                          f"padding all {len(values):,} to it would take {8 * longest * len(values):,} bytes")
    return longest


def _inputs(values: list[Any], where: str, length: int | None) -> tuple[np.ndarray[Any, Any], str]:
    """A column as an array and its kind: ``"image"`` (uint8 ``(N, C, H, W)``), ``"text"`` (int64 codes) or
    ``"numeric"`` (float64 ``(N, ...)``)."""
    first = values[0]
    if hasattr(first, "getdata") and hasattr(first, "mode"):  # PIL images (a datasets Image feature, decoded)
        channels = 3 if first.mode == "RGB" else 1
        for i, img in enumerate(values):  # one size and channel count, checked before one byte is stacked
            c = 3 if getattr(img, "mode", None) == "RGB" else 1
            if getattr(img, "size", None) != first.size or c != channels:
                got = f"{getattr(img, 'size', type(img).__name__)} with {c} channel(s)"
                raise DataFormatError(where, f"input {i} is an image of {got}, input 0 of {first.size} with "
                                      f"{channels}", allowed="images of one size and one mode")
        arr = np.stack([np.asarray(img.convert("L") if img.mode not in ("L", "RGB") else img) for img in values])
        arr = arr[:, None] if arr.ndim == 3 else arr.transpose(0, 3, 1, 2)
        return arr.astype(np.uint8), "image"
    if isinstance(first, str):
        n = length if length is not None else _text_length(values, where)
        return leaf.encode_text(values, n, where), "text"
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(where, f"inputs must be images, strings or equal-shaped numbers ({exc})") from None
    return arr, "numeric"


def _labels(values: list[Any], names: list[str] | None, text: bool, where: str) -> tuple[np.ndarray[Any, Any],
                                                                                            tuple[str, ...]]:
    """Labels as int64 and the class names: integers as given (a ClassLabel's names kept), one-character strings of
    a text set in LEAF's vocabulary (next-character prediction), other strings numbered in sorted order."""
    if values and isinstance(values[0], str):
        if text and all(len(v) == 1 for v in values):
            return leaf.encode_text(values, 1, where)[:, 0].astype(np.int64), (*leaf.LEAF_LETTERS, "<oov>")
        classes = sorted(set(values))
        index = {c: i for i, c in enumerate(classes)}
        return np.asarray([index[v] for v in values], dtype=np.int64), tuple(classes)
    try:
        y = np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(where, f"labels must be integers or strings ({exc})") from None
    return y, tuple(names) if names else ()


def holdout_split(users: np.ndarray[Any, Any], every: int = HOLDOUT) -> np.ndarray[Any, Any]:
    """Test mask: within each user, in sample order, every ``every``-th sample (users with fewer have none)."""
    mask = np.zeros(users.shape[0], dtype=bool)
    order = np.argsort(users, kind="stable")
    _, starts, counts = np.unique(users[order], return_index=True, return_counts=True)
    for s, c in zip(starts, counts, strict=True):
        mask[order[s + every - 1: s + c: every]] = True
    return mask


def from_hf(
    train: Any, test: Any = None, *, x: str | None = None, y: str | None = None, user: str | None = None,
    name: str = "hf", num_classes: int | None = None, length: int | None = None, holdout: int = HOLDOUT,
) -> Dataset:
    """A Phalanx :class:`Dataset` (with user ids) from Hugging Face ``datasets`` objects.

    Parameters
    ----------
    train: a ``datasets.Dataset``; a list of them, one per client (e.g. ``[partitioner.load_partition(i) for i in
        range(partitioner.num_partitions)]``); or a flwr-datasets partitioner whose ``dataset`` is set (its
        partitions are loaded). With a list or a partitioner, client ``i``'s samples get user id ``i`` (named by
        its natural id for a ``NaturalIdPartitioner``), so ``partition = "natural"`` gives worker ``i`` = client
        ``i``.
    test: a ``datasets.Dataset`` with the same columns, or None: then every ``holdout``-th sample of each user is
        held out as the test set (:func:`holdout_split`; LEAF's ``-t sample`` split without a random draw).
    x, y: the input and label columns (default: the first of ``image``, ``img``, ``pixels``, ``x``, ``text``,
        ``features`` / ``label``, ``labels``, ``character``, ``y``, ``target`` present).
    user: the column of each sample's natural client (``writer_id``, ``character_id``; flwr-datasets'
        ``NaturalIdPartitioner(partition_by=...)``), when ``train`` is one data set. Without it (and one data set)
        the result has no user ids, and ``partition = "natural"`` refuses it.
    name: the data set's name; num_classes: default the largest label + 1 (a ClassLabel: its number of names).
    length: characters per text input (default: the longest string).

    Inputs: PIL images (a ``datasets.Image`` feature) become uint8 ``(N, C, H, W)``, standardised per channel like
    Phalanx's image sets (scale 255); strings become LEAF's character codes (:data:`phalanx.data.leaf.LEAF_LETTERS`,
    left-padded to ``length``), for the ``char-lstm`` model; numbers are used as given (float32).
    """
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 1):
        raise ConfigError("length", length, "an integer >= 1 (characters per text input), or None for the longest")
    parts, clients = _partitions(train)
    columns = list(parts[0].column_names)
    xc, yc = _pick(columns, x, _X_COLUMNS, "x"), _pick(columns, y, _Y_COLUMNS, "y")
    if user is not None and clients is None:
        _pick(columns, user, (), "user")
    feature = getattr(parts[0], "features", {}).get(yc) if hasattr(parts[0], "features") else None
    label_names = list(getattr(feature, "names", None) or []) or None
    xs: list[Any] = []
    ys: list[Any] = []
    us: list[Any] = []
    for i, part in enumerate(parts):
        if list(part.column_names) != columns:
            raise ConfigError("train", f"partition {i}", f"data sets with the same columns ({', '.join(columns)})")
        xs += _column(part, xc)
        ys += _column(part, yc)
        us += [clients[i]] * len(part) if clients is not None else (_column(part, user) if user else [])
    if not xs:
        raise ConfigError("train", name, "a data set with at least one sample")
    test_x: list[Any] = _column(test, xc) if test is not None else []
    test_y: list[Any] = _column(test, yc) if test is not None else []
    test_u: list[Any] = _column(test, user) if test is not None and user and user in test.column_names else []
    arr, kind = _inputs(xs + test_x, name, length)
    labels, classes = _labels(ys + test_y, label_names, kind == "text", name)
    n = len(xs)
    names, ids = user_ids(us + test_u) if us else ((), None)
    if test is None:
        mask = holdout_split(ids.numpy() if ids is not None else np.zeros(n, dtype=np.int64), holdout)
        if not mask.any():
            raise ConfigError("holdout", holdout, "a number of samples that some user has at least (every "
                              "holdout-th sample of a user is a test sample), or a test set: nothing was held out")
        train_idx, test_idx = np.flatnonzero(~mask), np.flatnonzero(mask)
    else:
        train_idx, test_idx = np.arange(n), np.arange(n, n + len(test_x))
    tu = ids[torch.from_numpy(train_idx)] if ids is not None else None
    vu = ids[torch.from_numpy(test_idx)] if ids is not None and (test is None or test_u) else None
    tx_raw, vx_raw = arr[train_idx], arr[test_idx]
    if kind == "image":
        tx, vx, mean, std = standardise(tx_raw, vx_raw, scale=255)
    else:
        tx, vx = torch.from_numpy(tx_raw.astype(np.float32)), torch.from_numpy(vx_raw.astype(np.float32))
        mean, std = (), ()
    ty, vy = torch.from_numpy(labels[train_idx].copy()), torch.from_numpy(labels[test_idx].copy())
    k = num_classes if num_classes is not None else (len(classes) if classes else int(labels.max()) + 1)
    if int(labels.min()) < 0 or int(labels.max()) >= k or k < 2:
        raise ConfigError("y", yc, f"labels in 0 … {k - 1}, at least two classes")
    shape = tuple(int(s) for s in tx.shape[1:]) or (1,)
    if not tx.shape[1:]:
        tx, vx = tx[:, None], vx[:, None]
    return Dataset(
        name=name, train_x=tx.contiguous(), train_y=ty, test_x=vx.contiguous(), test_y=vy, num_classes=k,
        input_shape=shape, source=f"datasets:{name}", mean=mean, std=std, classes=classes if len(classes) == k else (),
        train_users=tu, test_users=vu, users=names,
    )


def probe(url: str, timeout: float = _PROBE_TIMEOUT_S) -> None:
    """One request to ``url`` with a short timeout; a one-line :class:`DownloadError` when it cannot be reached
    (so that ``download=True`` offline fails at once instead of waiting on a library's retries)."""
    try:
        request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "phalanx"})
        with urllib.request.urlopen(request, timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return  # the server answered: the network is there
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(f"cannot reach {url} to download (offline?): {reason}") from None


def download_leaf(name: str, target: Path) -> Dataset:
    """``load(name, download=True)`` for ``femnist`` and ``shakespeare`` when LEAF's JSON files are found nowhere:
    Flower's copy of the LEAF data on the Hugging Face Hub (:data:`HUB`), downloaded by ``datasets`` into
    ``target/hf`` (its own cache: a second download reuses it), split per user like LEAF's ``-t sample --tf 0.9``
    (:func:`holdout_split`). Offline: a one-line :class:`DownloadError` at once (:func:`probe`)."""
    spec = HUB[name]
    datasets = require()
    probe(HUB_PROBE + spec["repo"])
    try:
        hub = datasets.load_dataset(spec["repo"], split="train", cache_dir=str(target / "hf"))
    except (OSError, ConnectionError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DownloadError(f"could not download {spec['repo']}: {first}") from None
    ds = from_hf(hub, x=spec["x"], y=spec["y"], user=spec["user"], name=name,
                 length=80 if name == "shakespeare" else None)
    if name == "femnist" and ds.classes and tuple(ds.classes) != leaf.FEMNIST_CLASSES:
        raise DataFormatError(spec["repo"], f"expected FEMNIST's 62 classes 0-9, A-Z, a-z, got {ds.classes[:5]}…")
    ds.source = f"{spec['repo']} ({target / 'hf'})"
    return ds
