"""Downloads for ``load(..., download=True)``: the standard mirrors, MD5-verified, written atomically.

This is the only module of :mod:`phalanx.data` that touches the network, and only when a user asks for it. The
URLs and MD5 digests are the published ones (the same that torchvision uses; no torchvision code is used). A file
is first written to ``<name>.part``, synced, and renamed only once its MD5 matches, then its folder is synced (a
power cut leaves the old state or the whole file, never a torn one under the real name); a mirror that fails or
serves a file with the wrong digest is skipped and the next one is tried.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from phalanx.data.base import DownloadError
from phalanx.files import sync_directory, sync_file

__all__ = ["CIFAR10_ARCHIVE", "IDX_FILES", "MIRRORS", "download_cifar10", "download_idx", "fetch"]

MIRRORS: dict[str, tuple[str, ...]] = {
    "mnist": ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    "cifar10": ("https://www.cs.toronto.edu/~kriz/",),
}

IDX_FILES: dict[str, dict[str, str]] = {  # file name -> MD5 of the .gz as published
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}

CIFAR10_ARCHIVE = ("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a")
_CIFAR10_FOLDER = "cifar-10-batches-py"
_TIMEOUT_S = 60.0


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _install(part: Path, dest: Path) -> None:
    """Give the written file ``part`` the name ``dest`` durably: its bytes synced, the rename, its folder synced."""
    sync_file(part)
    os.replace(part, dest)
    sync_directory(dest.parent)


def fetch(urls: tuple[str, ...] | list[str], dest: Path, md5: str) -> Path:
    """Download ``dest`` from the first of ``urls`` that serves a file with the given MD5; return ``dest``.

    An existing ``dest`` with the right MD5 is kept. Raises :class:`~phalanx.data.base.DownloadError` listing what
    went wrong with each URL when none works.
    """
    if dest.is_file() and _md5(dest) == md5:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    problems: list[str] = []
    for url in urls:
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "phalanx"})
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response, open(part, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            problems.append(f"{url}: {exc}")
            part.unlink(missing_ok=True)
            continue
        got = _md5(part)
        if got != md5:
            problems.append(f"{url}: MD5 {got}, expected {md5}")
            part.unlink(missing_ok=True)
            continue
        _install(part, dest)
        return dest
    raise DownloadError(f"could not download {dest.name}:\n" + "\n".join(f"  - {p}" for p in problems))


def download_idx(name: str, folder: Path) -> Path:
    """Download the four IDX ``.gz`` files of ``"mnist"`` or ``"fashion-mnist"`` into ``folder``."""
    for filename, md5 in IDX_FILES[name].items():
        fetch([m + filename for m in MIRRORS[name]], folder / filename, md5)
    return folder


def download_cifar10(folder: Path) -> Path:
    """Download and unpack the CIFAR-10 python archive; return ``folder / "cifar-10-batches-py"``.

    Only regular files directly under ``cifar-10-batches-py/`` are written (no links, no absolute paths, no ``..``),
    whatever else the archive holds.
    """
    filename, md5 = CIFAR10_ARCHIVE
    archive = fetch([m + filename for m in MIRRORS["cifar10"]], folder / filename, md5)
    target = folder / _CIFAR10_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if not member.isfile() or len(parts) != 2 or parts[0] != _CIFAR10_FOLDER or parts[1] in ("", ".", ".."):
                continue
            src = tar.extractfile(member)
            if src is None:  # pragma: no cover - isfile() members always have content
                continue
            part = target / (parts[1] + ".part")
            with src, open(part, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            _install(part, target / parts[1])
    return target
