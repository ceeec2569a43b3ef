"""Data sets and partitioners.

>>> from phalanx import data
>>> ds = data.load("digits")                       # built in: 1,797 8×8 digits, no download
>>> ds.train_x.shape, ds.num_classes
(torch.Size([1442, 1, 8, 8]), 10)
>>> parts = data.partition(ds.train_y, n_workers=8, scheme="dirichlet", alpha=0.5, seed=1)
>>> sum(len(p) for p in parts) == ds.n_train
True

:func:`load` finds ``mnist``, ``fashion-mnist`` (Debian: ``apt-get install dataset-fashion-mnist``) and ``cifar10``
on disk, or downloads them when asked (``download=True``). :func:`partition` splits a label tensor among workers
(``iid``, ``dirichlet``, ``pathological``); :func:`heterogeneity` measures how non-IID the result is.
See docs/data.md.
"""

from phalanx.data.base import DataFormatError, Dataset, DatasetNotFoundError, DownloadError
from phalanx.data.idx import read_idx
from phalanx.data.loaders import cache_dir, canonical, load, names, register, search_dirs
from phalanx.data.partition import SCHEMES, heterogeneity, partition

__all__ = [
    "SCHEMES",
    "DataFormatError",
    "Dataset",
    "DatasetNotFoundError",
    "DownloadError",
    "cache_dir",
    "canonical",
    "heterogeneity",
    "load",
    "names",
    "partition",
    "read_idx",
    "register",
    "search_dirs",
]
