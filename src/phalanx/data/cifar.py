"""Reader for the "CIFAR-10 python version" batches (Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html).

``cifar-10-batches-py/`` holds ``data_batch_1`` … ``data_batch_5`` (training, 5 × 10,000 images), ``test_batch``
(10,000) and ``batches.meta``. Each batch is a pickled dict with ``data`` — a uint8 array ``(10000, 3072)``, each row
an image's red, green then blue 32×32 planes in row-major order — and ``labels``, a list of ints in 0..9.

Unpickling can run arbitrary code, so the batches are read with an unpickler that only resolves the names a
numpy array needs (``numpy…_reconstruct``, ``numpy…_frombuffer``, ``numpy.ndarray``, ``numpy.dtype``,
``_codecs.encode``); anything else is refused with a :class:`~phalanx.data.base.DataFormatError`.
"""

from __future__ import annotations

import codecs
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from phalanx.data.base import DataFormatError

__all__ = ["CLASSES", "TEST_FILE", "TRAIN_FILES", "read_batch", "read_cifar10"]

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

# numpy's array-rebuilding functions, taken from numpy itself whatever module it keeps them in (numpy 1 vs 2)
_RECONSTRUCT = np.zeros(1).__reduce_ex__(2)[0]  # protocols 0-4
_FROMBUFFER = np.zeros(1).__reduce_ex__(5)[0]  # protocol 5
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,  # how Python 3 pickles bytes with protocol <= 2
}


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file") from None


def read_batch(path: str | Path) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """One batch file → ``(images uint8 (N, 3, 32, 32), labels int64 (N,))``."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            obj = _ArraysOnly(fh, encoding="latin1").load()  # latin1: the batches were pickled by Python 2
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise DataFormatError(str(p), f"not a CIFAR-10 python batch: {exc}") from exc
    if not isinstance(obj, dict):
        raise DataFormatError(str(p), f"expected a pickled dict, got {type(obj).__name__}")
    obj = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}
    if "data" not in obj or "labels" not in obj:
        raise DataFormatError(str(p), f"expected keys 'data' and 'labels', got {sorted(map(str, obj))}")
    data = np.asarray(obj["data"])
    labels = np.asarray(obj["labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataFormatError(str(p), f"'data' should be uint8 (N, 3072), got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise DataFormatError(str(p), f"{labels.shape[0]} labels for {data.shape[0]} images")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataFormatError(str(p), f"labels outside 0..9 (min {labels.min()}, max {labels.max()})")
    return data.reshape(-1, 3, 32, 32), labels


def read_cifar10(folder: str | Path) -> tuple[np.ndarray[Any, Any], ...]:
    """``folder`` holding the six batches → ``(train_images, train_labels, test_images, test_labels)``."""
    f = Path(folder)
    parts = [read_batch(f / name) for name in TRAIN_FILES]
    test_x, test_y = read_batch(f / TEST_FILE)
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    return train_x, train_y, test_x, test_y
