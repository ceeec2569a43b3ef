"""``load(name)``: find a data set's files, read them, standardise, return a :class:`~phalanx.data.base.Dataset`.

Where files are looked for (first match wins, recorded in ``Dataset.source``):

1. ``root`` if given: ``root`` itself, ``root/<name>``, and torchvision's layouts under ``root``;
2. ``$PHALANX_DATA/<name>`` (and torchvision's layouts under ``$PHALANX_DATA``) if the variable is set;
3. ``/usr/share/datasets/<name>`` — where Debian's ``dataset-fashion-mnist`` package puts Fashion-MNIST;
4. the cache, ``$XDG_CACHE_HOME/phalanx/<name>`` (default ``~/.cache/phalanx/<name>``);
5. only with ``download=True``: a download into ``root/<name>`` if ``root`` is given, else into the cache.

``digits`` needs none of this: it ships inside the package (``phalanx/data/_files/digits.csv.gz``).
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from phalanx.data import cifar, download, leaf
from phalanx.data.base import DataFormatError, Dataset, DatasetNotFoundError, standardise
from phalanx.data.idx import read_idx
from phalanx.data.leaf_population import LeafPopulation
from phalanx.data.population import Population, SyntheticPopulation
from phalanx.errors import ConfigError
from phalanx.plugins import Registry, accepted_params, split_call
from phalanx.validate import close_matches as suggest_names

__all__ = ["cache_dir", "canonical", "digits_split", "load", "names", "search_dirs"]

FASHION_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
_IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_TORCHVISION_DIR = {  # where torchvision keeps each data set's files under its root (LEAF: its checkout's data/)
    "digits": ".", "mnist": "MNIST/raw", "fashion-mnist": "FashionMNIST/raw", "cifar10": "cifar-10-batches-py",
    "femnist": "femnist/data", "shakespeare": "shakespeare/data", "sent140": "sent140/data",
}
_ALIASES = {"digits": "digits", "mnist": "mnist", "fashionmnist": "fashion-mnist", "fmnist": "fashion-mnist",
            "cifar10": "cifar10", "femnist": "femnist", "leaffemnist": "femnist", "shakespeare": "shakespeare",
            "leafshakespeare": "shakespeare", "sent140": "sent140", "leafsent140": "sent140"}
LEAF_SETS = ("femnist", "shakespeare", "sent140")
"""The LEAF data sets :func:`load` reads from LEAF's JSON files (:mod:`phalanx.data.leaf`), each with user ids."""
SHAKESPEARE_LENGTH = 80
"""Characters of context per Shakespeare sample (LEAF's ``SEQ_LEN``)."""
SENT140_LENGTH = 144
"""Characters per Sent140 tweet (tweets were at most 140 characters; longer ones keep their last 144)."""
_SYSTEM_DIR = Path("/usr/share/datasets")
L = TypeVar("L", bound=Callable[..., Any])
_REGISTRY: Registry[Callable[..., Any]] = Registry("dataset", "phalanx.datasets")
DIGITS_RESOURCE = "phalanx.data/_files/digits.csv.gz"


def names() -> list[str]:
    """The data sets :func:`load` knows, sorted: the built-in ones, those registered with :func:`register` and the
    installed plug-ins' entry points (a ``module:attr`` spec is accepted too)."""
    return _REGISTRY.names()


def register(name: str) -> Callable[[L], L]:
    """Decorator: make a loader known to :func:`load` under ``name``.

    A loader is a function that may take ``root`` (a directory, or None) and ``download`` (bool) keyword arguments
    and returns a :class:`~phalanx.data.base.Dataset`, or the tensors ``(train_x, train_y, test_x, test_y)``
    (optionally a fifth item, the number of classes), or a dict with those keys.
    """

    def deco(loader: L) -> L:
        _REGISTRY.register(loader, name=name)
        return loader

    return deco


def canonical(name: str) -> str:
    """The canonical spelling of a data-set name (``"Fashion_MNIST"`` → ``"fashion-mnist"``; a registered name or a
    ``module:attr`` spec as it is); ConfigError if unknown."""
    if not isinstance(name, str):
        raise ConfigError("name", name, "one of " + ", ".join(names()))
    if name in _REGISTRY:
        return name
    key = name.strip().lower().replace("-", "").replace("_", "")
    if key in _ALIASES:
        return _ALIASES[key]
    close = [_ALIASES.get(c, c) for c in suggest_names(name.strip().lower(), names() + list(_ALIASES))]
    hint = f"did you mean {', '.join(dict.fromkeys(close))}?" if close else None
    raise ConfigError("name", name, "one of " + ", ".join(names()) + " or a 'module:attr' spec", hint)


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/phalanx`` if the variable is set, else ``~/.cache/phalanx``."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "phalanx"


def search_dirs(name: str, root: str | Path | None = None) -> list[Path]:
    """The directories :func:`load` looks in for ``name``'s files, in order (existing or not).

    Each base directory — ``root``, ``root/<name>``, ``$PHALANX_DATA/<name>``, ``/usr/share/datasets/<name>``,
    ``<cache>/<name>`` — is tried as is and with torchvision's sub-directory (``MNIST/raw``, ``FashionMNIST/raw``,
    ``cifar-10-batches-py``) appended; ``$PHALANX_DATA`` itself only with that sub-directory, since the MNIST and
    Fashion-MNIST files have the same names.
    """
    name = canonical(name)
    layout = _TORCHVISION_DIR[name]
    out: list[Path] = []

    def add(base: Path) -> None:
        out.extend((base, base / layout))
        if name in LEAF_SETS:  # LEAF's own data/<name>/ directory passed as it is: its files are in data/
            out.append(base / "data")

    if root is not None:
        add(Path(root).expanduser())
        add(Path(root).expanduser() / name)
    env = os.environ.get("PHALANX_DATA")
    if env:
        add(Path(env).expanduser() / name)
        out.append(Path(env).expanduser() / layout)
    add(_SYSTEM_DIR / name)
    add(cache_dir() / name)
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------------------------------------------- digits


def _load_digits(root: str | Path | None, download_: bool) -> Dataset:
    """sklearn's 8×8 digits, shipped with Phalanx; stratified deterministic split (see :func:`digits_split`)."""
    with resources.files("phalanx.data").joinpath("_files/digits.csv.gz").open("rb") as fh:
        text = gzip.decompress(fh.read()).decode("ascii")
    table = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.int64)
    if table.shape != (1797, 65):
        raise DataFormatError(DIGITS_RESOURCE, f"expected 1797 rows of 65 integers, got {table.shape}")
    pixels = table[:, :64].astype(np.uint8).reshape(-1, 1, 8, 8)
    labels = table[:, 64]
    test = digits_split(labels)
    train_x, test_x, mean, std = standardise(pixels[~test], pixels[test], scale=16)
    return Dataset(
        name="digits", train_x=train_x, train_y=torch.from_numpy(labels[~test].copy()),
        test_x=test_x, test_y=torch.from_numpy(labels[test].copy()), num_classes=10, input_shape=(1, 8, 8),
        source=DIGITS_RESOURCE, mean=mean, std=std, classes=tuple(str(i) for i in range(10)),
    )


def digits_split(labels: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Test mask of the digits split: within each class, in file order, every 5th image (the 5th, 10th, ...).

    Deterministic without any random generator (so it cannot change with a numpy or torch release) and
    stratified: each class puts ⌊n_c / 5⌋ images in the test set — 355 of 1,797 (19.8 %), 1,442 for training.
    """
    test = np.zeros(labels.shape[0], dtype=bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        test[idx[4::5]] = True
    return test


# ---------------------------------------------------------------------------------------------- MNIST-like (IDX)


def _idx_file(folder: Path, stem: str) -> Path | None:
    """The file for ``stem`` in ``folder``: ``.gz`` or plain, ``-idx`` or ``.idx`` spelling; None if absent."""
    variants = (stem, stem.replace("-idx", ".idx"))
    for v in variants:
        for candidate in (folder / (v + ".gz"), folder / v):
            if candidate.is_file():
                return candidate
    return None


def _find_idx(folder: Path) -> list[Path] | None:
    files = [_idx_file(folder, s) for s in _IDX_STEMS]
    return [f for f in files if f is not None] if all(files) else None


def _how_idx(name: str, target: Path) -> str:
    files = ", ".join(s + ".gz" for s in _IDX_STEMS)
    lines = ["Get the files in one of these ways:"]
    if name == "fashion-mnist":
        lines.append(
            "  - Debian/Ubuntu: sudo apt-get install dataset-fashion-mnist  (→ /usr/share/datasets/fashion-mnist)",
        )
    lines += [
        f"  - put {files} (gzip or plain) into $PHALANX_DATA/{name}, or into a directory you pass with --set "
        "data_root=DIR (Python: root=)",
        f"  - --set download=true (Python: load({name!r}, download=True)): downloads them (MD5-checked) into {target}",
    ]
    return "\n".join(lines)


def _load_idx_set(name: str, root: str | Path | None, download_: bool) -> Dataset:
    dirs = search_dirs(name, root)
    found: list[Path] | None = None
    for d in dirs:
        found = _find_idx(d)
        if found:
            break
    target = (Path(root).expanduser() / name) if root is not None else cache_dir() / name
    if not found:
        if not download_:
            raise DatasetNotFoundError(name, [str(d) for d in dirs], _how_idx(name, target))
        found = _find_idx(download.download_idx(name, target))
        assert found is not None
    train_x, train_y, test_x, test_y = (read_idx(p) for p in found)
    for p, x, y in ((found[0], train_x, train_y), (found[2], test_x, test_y)):
        if x.dtype != np.uint8 or x.ndim != 3:
            raise DataFormatError(str(p), f"expected uint8 images (N, H, W), got {x.dtype} {x.shape}")
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise DataFormatError(str(p), f"{x.shape[0]} images but labels of shape {y.shape}")
        if y.size and (int(y.min()) < 0 or int(y.max()) > 9):
            raise DataFormatError(str(p), f"labels outside 0..9 (min {y.min()}, max {y.max()})")
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataFormatError(str(found[2]), f"test images {test_x.shape[1:]} vs training images {train_x.shape[1:]}")
    tr, te, mean, std = standardise(train_x[:, None], test_x[:, None], scale=255)
    return Dataset(
        name=name, train_x=tr, train_y=torch.from_numpy(train_y.astype(np.int64)), test_x=te,
        test_y=torch.from_numpy(test_y.astype(np.int64)), num_classes=10, input_shape=(1, *train_x.shape[1:]),
        source=str(found[0].parent), mean=mean, std=std,
        classes=FASHION_CLASSES if name == "fashion-mnist" else tuple(str(i) for i in range(10)),
    )


# ---------------------------------------------------------------------------------------------------------- CIFAR-10


def _has_cifar(folder: Path) -> bool:
    return all((folder / f).is_file() for f in (*cifar.TRAIN_FILES, cifar.TEST_FILE))


def _load_cifar10(root: str | Path | None, download_: bool) -> Dataset:
    dirs = search_dirs("cifar10", root)
    folder = next((d for d in dirs if _has_cifar(d)), None)
    target = (Path(root).expanduser() / "cifar10") if root is not None else cache_dir() / "cifar10"
    if folder is None:
        if not download_:
            how = (
                "Get the files in one of these ways:\n"
                "  - unpack cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) into "
                "$PHALANX_DATA/cifar10, or into a directory you pass with --set data_root=DIR (Python: root=)\n"
                "  - --set download=true (Python: load('cifar10', download=True)): downloads it (170 MB, MD5-checked) "
                f"into {target}"
            )
            raise DatasetNotFoundError("cifar10", [str(d) for d in dirs], how)
        folder = download.download_cifar10(target)
    train_x, train_y, test_x, test_y = cifar.read_cifar10(folder)
    tr, te, mean, std = standardise(train_x, test_x, scale=255)
    return Dataset(
        name="cifar10", train_x=tr, train_y=torch.from_numpy(train_y), test_x=te, test_y=torch.from_numpy(test_y),
        num_classes=10, input_shape=(3, 32, 32), source=str(folder), mean=mean, std=std, classes=cifar.CLASSES,
    )


# ------------------------------------------------------------------------------------------------- LEAF (JSON files)


def _how_leaf(name: str, target: Path) -> str:
    hub = {"femnist": "flwrlabs/femnist", "shakespeare": "flwrlabs/shakespeare"}.get(name)
    lines = [
        "Get the files in one of these ways:",
        f"  - run LEAF's data/{name}/preprocess.sh (Caldas et al. 2018) and pass its data/{name}/data directory "
        "(holding train/ and test/) with --set data_root=DIR (Python: root=), or copy it to $PHALANX_DATA/" + name,
    ]
    if hub is not None:
        lines.append(f"  - --set download=true (Python: load({name!r}, download=True)): Flower's copy of the LEAF data "
                     f"({hub} on the Hugging Face Hub; needs phalanx[hf]) into {target}")
    return "\n".join(lines)


Tokens = Callable[[list[str], str], np.ndarray[Any, Any]]
"""A tokenizer: ``(texts, where)`` → ``(N, length)`` token ids (:func:`phalanx.data.tokens.tokenizer`)."""


def _leaf_arrays(
    name: str, split: leaf.LeafSplit, where: str, tokens: Tokens | None = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A LEAF split's inputs (uint8 images for femnist, uint8 character codes for the text sets — the codes'
    conversion weighed against the split's size first, :func:`phalanx.data.leaf.check_text_cost` — or a pre-trained
    model's token ids for Sent140 with ``tokens``) and labels."""
    if name == "femnist":
        return leaf.femnist_pixels(split, where)
    if name == "shakespeare":
        texts = leaf.shakespeare_text(split, where)
        leaf.check_text_cost(split, SHAKESPEARE_LENGTH, where)
        return leaf.encode_text(texts, SHAKESPEARE_LENGTH, where), leaf.text_labels(split, where)
    texts, y = leaf.sent140_text(split, where)
    if tokens is not None:
        return tokens(texts, where), y
    leaf.check_text_cost(split, SENT140_LENGTH, where)
    return leaf.encode_text(texts, SENT140_LENGTH, where), y


def leaf_dataset(
    name: str, train: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]],
    test: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]], users: list[str], source: str,
) -> Dataset:
    """The :class:`Dataset` of a LEAF set from ``(x, y, user ids)`` of each split: FEMNIST's images standardised
    like every image set (:func:`~phalanx.data.base.standardise`, scale 255), the text sets' character codes as
    float32 (exact integers; the ``char-lstm`` model embeds them)."""
    (tx, ty, tu), (vx, vy, vu) = train, test
    if tx.shape[0] == 0:
        raise DataFormatError(source, f"{name}: no training samples")
    if name == "femnist":
        train_x, test_x, mean, std = standardise(tx, vx, scale=255)
        classes, num_classes = leaf.FEMNIST_CLASSES, 62
        shape: tuple[int, ...] = (1, 28, 28)
    else:
        train_x, test_x = (torch.from_numpy(a.astype(np.float32)) for a in (tx, vx))
        mean, std = (), ()
        if name == "shakespeare":
            classes, num_classes = (*leaf.LEAF_LETTERS, "<oov>"), leaf.OOV + 1
        else:
            classes, num_classes = ("negative", "positive"), 2
        shape = (int(tx.shape[1]),)
    return Dataset(
        name=name, train_x=train_x, train_y=torch.from_numpy(ty.astype(np.int64)), test_x=test_x,
        test_y=torch.from_numpy(vy.astype(np.int64)), num_classes=num_classes, input_shape=shape, source=source,
        mean=mean, std=std, classes=tuple(classes), train_users=torch.from_numpy(tu.astype(np.int64)),
        test_users=torch.from_numpy(vu.astype(np.int64)), users=tuple(users),
    )


def _load_leaf(name: str, root: str | Path | None, download_: bool, tokenizer: str | None = None,
               length: int | None = None, folder: Path | None = None) -> Dataset:
    """A LEAF data set from its ``train/`` and ``test/`` JSON directories (the first place that has both, or
    ``folder``), else, with ``download``, Flower's copy of it on the Hugging Face Hub
    (:func:`phalanx.data.hf.download_leaf`). Sent140 with ``tokenizer`` (``hf:NAME``): its tweets as that model's
    ``length`` token ids (:mod:`phalanx.data.tokens`; default 32).

    The users are numbered in file order, training files first; a test user absent from training (LEAF's
    ``-t user`` split) gets the next number.
    """
    if (tokenizer is not None or length is not None) and name != "sent140":
        raise ConfigError("dataset_params.tokenizer", tokenizer, f"None for {name} (token ids are for Sent140's "
                          "tweets)")
    if length is not None and tokenizer is None:
        raise ConfigError("dataset_params.length", length, "None without a tokenizer (the character codes are "
                          f"{SENT140_LENGTH} long)")
    tokens = None
    if tokenizer is not None:  # loaded (one line if it cannot be) before any file is read
        from phalanx.data import tokens as hf_tokens  # transformers: only when a tokenizer is asked for

        tokens = hf_tokens.tokenizer(tokenizer, 32 if length is None else length)
    dirs = search_dirs(name, root) if folder is None else [folder]
    folder = next((d for d in dirs if leaf.has_leaf_files(d)), None)
    target = (Path(root).expanduser() / name) if root is not None else cache_dir() / name
    if folder is None:
        if not download_ or name == "sent140":
            raise DatasetNotFoundError(name, [str(d) for d in dirs], _how_leaf(name, target))
        from phalanx.data import hf  # the optional extra: imported only when a download is asked for

        return hf.download_leaf(name, target)
    train, test = leaf.read_leaf_dir(folder / "train"), leaf.read_leaf_dir(folder / "test")
    users = list(train.users)
    index = {u: i for i, u in enumerate(users)}
    for u in test.users:
        if u not in index:
            index[u] = len(users)
            users.append(u)
    test_ids = np.asarray([index[test.users[k]] for k in test.user_of], dtype=np.int64)
    try:
        tx, ty = _leaf_arrays(name, train, str(folder / "train"), tokens)
        vx, vy = _leaf_arrays(name, test, str(folder / "test"), tokens)
        return leaf_dataset(name, (tx, ty, train.user_of), (vx, vy, test_ids), users, str(folder))
    except MemoryError:  # within the checked bounds, but more than this machine has
        n = len(train.y) + len(test.y)
        raise DataFormatError(str(folder), f"{name}: not enough memory to turn its {n:,} samples into arrays",
                              allowed=f"{name} samples this machine has the memory for") from None


for _leaf_name in ("femnist", "shakespeare"):
    _REGISTRY.register(lambda root, download, _n=_leaf_name: _load_leaf(_n, root, download), name=_leaf_name)
_REGISTRY.register(lambda root, download, tokenizer=None, length=None: _load_leaf(
    "sent140", root, download, tokenizer, length), name="sent140")
SENT140_SAMPLE = Path(__file__).resolve().parent / "_files" / "sent140-sample"
"""The shipped Sent140-format sample: synthetic tweets of 60 made-up users (``scripts/make_sent140_sample.py``)."""


@register("sent140-sample")
def _load_sent140_sample(tokenizer: str | None = None, length: int | None = None) -> Dataset:
    """``sent140-sample``: the synthetic tweets shipped in LEAF's Sent140 format (60 users, natural clients), read
    by the Sent140 reader; with ``tokenizer``, as that model's token ids."""
    ds = _load_leaf("sent140", None, False, tokenizer, length, folder=SENT140_SAMPLE)
    ds.name = "sent140-sample"
    return ds


def _population_params(build: Callable[[], Population]) -> Population:
    """A population built from a config's ``dataset_params``: a bad one is named as the config spells it."""
    try:
        return build()
    except ConfigError as exc:
        if type(exc) is not ConfigError or exc.parameter.startswith("dataset_params."):
            raise
        raise ConfigError(f"dataset_params.{exc.parameter}", exc.value, exc.allowed, exc.hint) from None


@register("synthetic")
def _load_synthetic(alpha: float = 0.5, beta: float = 0.5, seed: int = 0, max_samples: int = 1000,
                    eval_clients: int = 100) -> Population:
    """``synthetic``: FedProx's synthetic(α, β) population, each client generated from (seed, id) when it is
    sampled (:class:`~phalanx.data.population.SyntheticPopulation`)."""
    return _population_params(lambda: SyntheticPopulation(alpha, beta, seed, max_samples, eval_clients))


def _load_femnist_population(root: str | Path | None, path: str | None, eval_clients: int) -> Population:
    """``femnist-population``: FEMNIST's writers read lazily (:class:`~phalanx.data.leaf_population.LeafPopulation`)
    from ``path``, else the first place :func:`search_dirs` gives FEMNIST's files."""
    dirs = [Path(path).expanduser()] if path is not None else search_dirs("femnist", root)
    folder = next((d for d in dirs if leaf.has_leaf_files(d)), None)
    if folder is None:
        raise DatasetNotFoundError("femnist-population", [str(d) for d in dirs], "LEAF's FEMNIST train/ and test/ "
                                   "JSON directories (dataset_params.path, or the places femnist is looked for)")
    return _population_params(lambda: LeafPopulation(folder, eval_clients))


_REGISTRY.register(lambda root, download, path=None, eval_clients=100: _load_femnist_population(
    root, path, eval_clients), name="femnist-population")
_REGISTRY.register(lambda root, download: _load_digits(root, download), name="digits")
_REGISTRY.register(lambda root, download: _load_idx_set("mnist", root, download), name="mnist")
_REGISTRY.register(lambda root, download: _load_idx_set("fashion-mnist", root, download), name="fashion-mnist")
_REGISTRY.register(lambda root, download: _load_cifar10(root, download), name="cifar10")


def _as_dataset(name: str, got: Any) -> Dataset | Population:
    """What a loader returned, as a :class:`Dataset` (a client population as it is)."""
    if isinstance(got, Dataset | Population):
        return got
    if isinstance(got, dict):
        keys = ("train_x", "train_y", "test_x", "test_y")
        if not all(k in got for k in keys):
            raise ConfigError("dataset", name, f"a loader returning a Dataset, or a dict with {', '.join(keys)}")
        return Dataset.from_tensors(name, got["train_x"], got["train_y"], got["test_x"], got["test_y"],
                                    num_classes=got.get("num_classes"), source=f"loader {name}")
    if isinstance(got, tuple | list) and len(got) in (4, 5):
        return Dataset.from_tensors(name, got[0], got[1], got[2], got[3], num_classes=got[4] if len(got) == 5 else None,
                                    source=f"loader {name}")
    raise ConfigError("dataset", name, "a loader returning a Dataset, (train_x, train_y, test_x, test_y[, classes]) "
                                       f"or a dict of them (it returned a {type(got).__name__})")


def split_spec(name: str, params: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """A data-set name that may carry its loader's parameters inline (``"mylab.data:cancer(seed=1)"``) as the name
    and every parameter (the inline ones and ``params``; one given both ways is refused)."""
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError("dataset_params", params, "a table of the loader's parameters")
    given = dict(params or {})
    if not isinstance(name, str) or "(" not in name:
        return name, given
    bare, inline = split_call(name, "dataset")
    both = sorted(set(inline) & set(given))
    if both:
        raise ConfigError(f"dataset_params.{both[0]}", given[both[0]], f"one value: {name!r} sets it inline too")
    return bare, {**given, **inline}


def check_spec(name: str, params: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The canonical name and the parameters of a data set, checked against its loader's signature without loading
    anything: ``(name, params)``, or a ConfigError naming the bad name or parameter."""
    bare, kwargs = split_spec(name, params)
    key = canonical(bare)
    loader = _REGISTRY.get(key, "dataset")
    accepted = accepted_params(loader, skip=("root", "download"))
    if accepted is not None:
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            allowed = ", ".join(accepted) if accepted else "none (it takes no parameters)"
            raise ConfigError(f"dataset_params.{unknown[0]}", kwargs[unknown[0]], f"parameters of the data set "
                              f"{key!r}: {allowed}")
    return key, kwargs


def load(name: str, root: str | Path | None = None, download: bool = False,
         params: Mapping[str, Any] | None = None) -> Dataset | Population:
    """Load a data set by name (see :func:`names`; ``"Fashion_MNIST"``, ``"fmnist"``, ``"cifar-10"`` also work).

    Parameters
    ----------
    name: ``"digits"`` (built in), ``"mnist"``, ``"fashion-mnist"``, ``"cifar10"``, or LEAF's ``"femnist"``,
        ``"shakespeare"``, ``"sent140"`` (their ``train/`` and ``test/`` JSON directories; the samples carry user ids),
        a registered or ``module:attr`` loader — whose parameters may follow inline, ``"mylab.data:cancer(seed=1)"``.
    root: a directory to look in first (the files directly in it, or in ``root/<name>``, or torchvision's layout);
        ``digits`` ignores it, and ``download``, since it ships inside the package.
    download: if the files are found nowhere (module docstring), download them from the standard mirrors with
        MD5 checks. Off by default: nothing touches the network unless asked.
    params: the loader's own keyword parameters (a run config's ``dataset_params``); the built-in loaders take none.

    Raises :class:`~phalanx.data.base.DatasetNotFoundError` (a ConfigError) that lists the places searched and how to
    get the files, or :class:`~phalanx.data.base.DataFormatError` for a corrupt file.
    """
    if not isinstance(download, bool):
        raise ConfigError("download", download, "True or False")
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise ConfigError("root", root, "a directory path or None")
    key, own = check_spec(name, params)
    loader = _REGISTRY.get(key, "dataset")
    accepted = accepted_params(loader)
    kwargs = {k: v for k, v in (("root", root), ("download", download)) if accepted is None or k in accepted}
    return _as_dataset(key, loader(**kwargs, **own))
