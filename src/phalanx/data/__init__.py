"""Data sets and partitioners.

>>> from phalanx import data
>>> ds = data.load("digits")                       # built in: 1,797 8×8 digits, no download
>>> ds.train_x.shape, ds.num_classes
(torch.Size([1442, 1, 8, 8]), 10)
>>> parts = data.partition(ds.train_y, n_workers=8, scheme="dirichlet", alpha=0.5, seed=1)
>>> sum(len(p) for p in parts) == ds.n_train
True

:func:`load` finds ``mnist``, ``fashion-mnist`` (Debian: ``apt-get install dataset-fashion-mnist``) and ``cifar10``
on disk, or downloads them when asked (``download=True``), and reads LEAF's ``femnist``, ``shakespeare`` and
``sent140`` JSON files, whose samples carry their writer / speaker / user id. :func:`partition` splits a label tensor
among workers (``iid``, ``dirichlet``, ``pathological``, or ``natural``: one user per worker); :func:`heterogeneity`
measures how non-IID the result is. :func:`from_hf` turns Hugging Face ``datasets`` objects (and flwr-datasets
partitions) into a :class:`Dataset` with user ids (the optional extra ``phalanx[hf]``). See docs/data.md.
"""

from phalanx.data.base import DataFormatError, Dataset, DatasetNotFoundError, DownloadError
from phalanx.data.hf import from_hf
from phalanx.data.idx import read_idx
from phalanx.data.leaf import read_leaf_dir
from phalanx.data.loaders import (
    LEAF_SETS,
    cache_dir,
    canonical,
    check_spec,
    load,
    names,
    register,
    search_dirs,
    split_spec,
)
from phalanx.data.partition import SCHEMES, heterogeneity, partition

__all__ = [
    "LEAF_SETS",
    "SCHEMES",
    "DataFormatError",
    "Dataset",
    "DatasetNotFoundError",
    "DownloadError",
    "cache_dir",
    "canonical",
    "check_spec",
    "from_hf",
    "heterogeneity",
    "load",
    "names",
    "partition",
    "read_idx",
    "read_leaf_dir",
    "register",
    "search_dirs",
    "split_spec",
]
