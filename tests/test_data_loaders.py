"""phalanx.data.load: the built-in digits, IDX and CIFAR-10 files written here, search order, errors, downloads."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from phalanx import data
from phalanx.data import download, loaders
from phalanx.data.base import DataFormatError, Dataset, DatasetNotFoundError, DownloadError, standardise
from phalanx.errors import ConfigError

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the user's $PHALANX_DATA, cache or /usr/share/datasets unless it asks for them."""
    monkeypatch.delenv("PHALANX_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setattr(loaders, "_SYSTEM_DIR", tmp_path / "system-datasets")


# ----------------------------------------------------------------------------------------------------- writers


def write_idx(path: Path, arr: np.ndarray, *, gz: bool) -> Path:
    """An IDX file written from the format description, independently of the reader under test."""
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D}
    header = struct.pack(">HBB", 0, codes[arr.dtype], arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    payload = header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def fake_mnist(folder: Path, n_train: int = 50, n_test: int = 20, *, gz: bool = True, seed: int = 0) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for stem, arr in arrays.items():
        write_idx(folder / (stem + (".gz" if gz else "")), arr, gz=gz)
    return arrays


def fake_cifar(folder: Path, per_batch: int = 6, *, protocol: int = 2, seed: int = 0) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = {}
    for name in (*[f"data_batch_{i}" for i in range(1, 6)], "test_batch"):
        batch = {
            "batch_label": f"fake {name}",
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "labels": [int(v) for v in rng.integers(0, 10, per_batch)],
            "filenames": [f"img{i}.png" for i in range(per_batch)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))
        out[name] = batch
    return out


# ------------------------------------------------------------------------------------------------------ digits


def test_digits_is_built_in_and_standardised() -> None:
    ds = data.load("digits")
    assert isinstance(ds, Dataset) and ds.name == "digits"
    assert ds.train_x.shape == (1442, 1, 8, 8) and ds.test_x.shape == (355, 1, 8, 8)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert ds.num_classes == 10 and ds.input_shape == (1, 8, 8)
    assert ds.source.endswith("digits.csv.gz")
    # Standardised with the training set's statistics: mean 0, std 1 there (population std).
    assert abs(ds.train_x.mean().item()) < 1e-5
    assert abs(ds.train_x.double().std(unbiased=False).item() - 1) < 1e-5
    # Stratified split: every class ⌊n_c/5⌋ in test.
    all_y = torch.cat([ds.train_y, ds.test_y])
    assert torch.equal(torch.bincount(ds.test_y), torch.bincount(all_y) // 5)
    # Values are (v/16 − μ)/σ for integer v in 0..16.
    v = ds.train_x * ds.std[0] + ds.mean[0]
    assert torch.allclose(v * 16, (v * 16).round(), atol=1e-4)


def test_digits_is_deterministic_and_fingerprinted() -> None:
    a, b = data.load("digits"), data.load("Digits")
    assert a.fingerprint() == b.fingerprint()
    assert len(a.fingerprint()) == 64
    assert torch.equal(a.train_x, b.train_x)
    b.train_y[0] = (b.train_y[0] + 1) % 10
    assert a.fingerprint() != b.fingerprint()


def test_packaged_file_is_the_scikit_learn_one() -> None:
    from importlib import resources

    blob = resources.files("phalanx.data").joinpath("_files/digits.csv.gz").read_bytes()
    assert hashlib.sha256(blob).hexdigest() == "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
    assert resources.files("phalanx.data").joinpath("_files/digits.LICENSE.txt").is_file()


# --------------------------------------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32])
def test_read_idx_roundtrip(tmp_path: Path, gz: bool, dtype: type) -> None:
    arr = (np.arange(2 * 3 * 5) - 7).reshape(2, 3, 5).astype(dtype) if dtype != np.uint8 else (
        np.arange(30, dtype=np.uint8).reshape(2, 3, 5)
    )
    out = data.read_idx(write_idx(tmp_path / "f", arr, gz=gz))
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)
    out[0, 0, 0] = 1  # writable


@pytest.mark.parametrize(
    "payload, match",
    [
        (b"\x00\x00\x08", "too short"),
        (b"\x00\x01\x08\x01" + struct.pack(">I", 1) + b"\x00", "not an IDX file"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x00", "not an IDX file"),
        (b"\x00\x00\x08\x02" + struct.pack(">I", 1), "truncated header"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 5) + b"\x00\x01", "expected 13"),
        (b"<html>404 Not Found</html>", "not an IDX file"),
    ],
)
def test_read_idx_rejects_bad_files(tmp_path: Path, payload: bytes, match: str) -> None:
    p = tmp_path / "bad"
    p.write_bytes(payload)
    with pytest.raises(DataFormatError, match=match):
        data.read_idx(p)
    p.write_bytes(gzip.compress(payload))
    with pytest.raises(DataFormatError, match=match):
        data.read_idx(p)
    p.write_bytes(gzip.compress(payload)[:-6])  # truncated gzip
    with pytest.raises(DataFormatError):
        data.read_idx(p)


@pytest.mark.parametrize("gz", [True, False])
def test_load_idx_from_root(tmp_path: Path, gz: bool) -> None:
    arrays = fake_mnist(tmp_path / "files", gz=gz)
    ds = data.load("mnist", root=tmp_path / "files")
    assert ds.train_x.shape == (50, 1, 28, 28) and ds.test_x.shape == (20, 1, 28, 28)
    assert ds.source == str(tmp_path / "files")
    np.testing.assert_array_equal(ds.train_y.numpy(), arrays["train-labels-idx1-ubyte"])
    raw = arrays["train-images-idx3-ubyte"].astype(np.float64) / 255
    assert ds.mean[0] == pytest.approx(raw.mean()) and ds.std[0] == pytest.approx(raw.std())
    expected = ((raw - raw.mean()) / raw.std()).astype(np.float32)
    np.testing.assert_allclose(ds.train_x[:, 0].numpy(), expected, atol=1e-6)
    test_raw = arrays["t10k-images-idx3-ubyte"].astype(np.float64) / 255
    np.testing.assert_allclose(ds.test_x[:, 0].numpy(), (test_raw - raw.mean()) / raw.std(), atol=1e-5)


def test_search_order_root_env_system_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_mnist(tmp_path / "xdg-cache" / "phalanx" / "fashion-mnist", seed=1)
    assert data.load("fashion-mnist").source == str(tmp_path / "xdg-cache" / "phalanx" / "fashion-mnist")
    fake_mnist(tmp_path / "system-datasets" / "fashion-mnist", seed=2)
    assert data.load("fashion-mnist").source == str(tmp_path / "system-datasets" / "fashion-mnist")
    monkeypatch.setenv("PHALANX_DATA", str(tmp_path / "env"))
    fake_mnist(tmp_path / "env" / "FashionMNIST" / "raw", seed=3)  # torchvision's layout under $PHALANX_DATA
    assert data.load("fmnist").source == str(tmp_path / "env" / "FashionMNIST" / "raw")
    fake_mnist(tmp_path / "env" / "fashion-mnist", seed=4)
    assert data.load("Fashion_MNIST").source == str(tmp_path / "env" / "fashion-mnist")
    fake_mnist(tmp_path / "root" / "fashion-mnist", seed=5)
    assert data.load("fashion-mnist", root=tmp_path / "root").source == str(tmp_path / "root" / "fashion-mnist")
    dirs = data.search_dirs("fashion-mnist", tmp_path / "root")
    assert dirs[0] == tmp_path / "root" and dirs[-2] == tmp_path / "xdg-cache" / "phalanx" / "fashion-mnist"


def test_dot_spelling_and_mixed_compression(tmp_path: Path) -> None:
    arrays = fake_mnist(tmp_path / "m", gz=False)
    (tmp_path / "m" / "train-images-idx3-ubyte").rename(tmp_path / "m" / "train-images.idx3-ubyte")
    write_idx(tmp_path / "m" / "t10k-labels-idx1-ubyte.gz", arrays["t10k-labels-idx1-ubyte"], gz=True)
    (tmp_path / "m" / "t10k-labels-idx1-ubyte").unlink()
    assert data.load("mnist", root=tmp_path / "m").n_train == 50


def test_not_found_says_how_to_get_the_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        data.load("fashion-mnist", root=tmp_path / "nothing")
    msg = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "download=True" in msg and "PHALANX_DATA" in msg
    assert "--set download=true" in msg and "--set data_root=DIR" in msg  # the command line's spelling first
    assert str(tmp_path / "nothing") in msg
    assert isinstance(info.value, ConfigError)
    with pytest.raises(DatasetNotFoundError, match=r"cifar-10-python\.tar\.gz"):
        data.load("cifar10")


def test_inconsistent_idx_files_are_rejected(tmp_path: Path) -> None:
    arrays = fake_mnist(tmp_path / "m")
    write_idx(tmp_path / "m" / "train-labels-idx1-ubyte.gz", arrays["train-labels-idx1-ubyte"][:-1], gz=True)
    with pytest.raises(DataFormatError, match="50 images"):
        data.load("mnist", root=tmp_path / "m")
    bad = arrays["train-labels-idx1-ubyte"].copy()
    bad[0] = 11
    write_idx(tmp_path / "m" / "train-labels-idx1-ubyte.gz", bad, gz=True)
    with pytest.raises(DataFormatError, match="labels outside"):
        data.load("mnist", root=tmp_path / "m")


def test_real_debian_fashion_mnist(monkeypatch: pytest.MonkeyPatch) -> None:
    if not DEBIAN_FASHION.is_dir():
        pytest.skip(f"{DEBIAN_FASHION} absent: apt-get install dataset-fashion-mnist to run this test")
    monkeypatch.setattr(loaders, "_SYSTEM_DIR", DEBIAN_FASHION.parent)
    ds = data.load("fashion-mnist")
    assert ds.source == str(DEBIAN_FASHION)
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert ds.train_y.min() == 0 and ds.train_y.max() == 9
    assert torch.equal(torch.bincount(ds.train_y), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(ds.test_y), torch.full((10,), 1000))
    assert ds.classes[9] == "Ankle boot"
    assert 0.28 < ds.mean[0] < 0.29  # Fashion-MNIST's well-known mean pixel, 0.286


# ------------------------------------------------------------------------------------------------------- CIFAR


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_load_cifar10_batches(tmp_path: Path, protocol: int) -> None:
    batches = fake_cifar(tmp_path / "cifar-10-batches-py", protocol=protocol)
    ds = data.load("cifar-10", root=tmp_path)
    assert ds.name == "cifar10" and ds.source == str(tmp_path / "cifar-10-batches-py")
    assert ds.train_x.shape == (30, 3, 32, 32) and ds.test_x.shape == (6, 3, 32, 32)
    assert ds.train_y.tolist() == [v for i in range(1, 6) for v in batches[f"data_batch_{i}"]["labels"]]
    # Channel layout: row = 1024 red, 1024 green, 1024 blue values, each 32×32 row-major.
    first = batches["data_batch_1"]["data"][0].astype(np.float64) / 255
    raw_train = np.concatenate([batches[f"data_batch_{i}"]["data"] for i in range(1, 6)]).astype(np.float64) / 255
    for c in range(3):
        chan = raw_train[:, 1024 * c : 1024 * (c + 1)]
        assert ds.mean[c] == pytest.approx(chan.mean())
        expect = (first[1024 * c : 1024 * (c + 1)].reshape(32, 32) - chan.mean()) / chan.std()
        np.testing.assert_allclose(ds.train_x[0, c].numpy(), expect, atol=1e-5)


def test_cifar_reader_refuses_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple:
            return (print, ("pwned",))

    folder = tmp_path / "cifar-10-batches-py"
    fake_cifar(folder)
    (folder / "data_batch_3").write_bytes(pickle.dumps({"data": Evil(), "labels": []}, protocol=2))
    with pytest.raises(DataFormatError, match=r"refusing to load .*print"):
        data.load("cifar10", root=tmp_path)
    (folder / "data_batch_3").write_bytes(pickle.dumps({"data": np.zeros((2, 5), np.uint8), "labels": [0, 1]}))
    with pytest.raises(DataFormatError, match=r"uint8 \(N, 3072\)"):
        data.load("cifar10", root=tmp_path)


# --------------------------------------------------------------------------------------------------- downloads
# The network is not used: the mirrors are pointed at file:// URLs, which urllib serves the same way.


def _md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


def test_download_idx_from_a_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_mnist(tmp_path / "mirror")
    sums = {p.name: _md5(p) for p in (tmp_path / "mirror").iterdir()}
    monkeypatch.setitem(download.IDX_FILES, "mnist", sums)
    dead = (tmp_path / "no-such-mirror").as_uri() + "/"
    monkeypatch.setitem(download.MIRRORS, "mnist", (dead, (tmp_path / "mirror").as_uri() + "/"))
    with pytest.raises(DatasetNotFoundError):
        data.load("mnist")  # download is off by default
    ds = data.load("mnist", download=True)  # first mirror fails, the second works
    cache = tmp_path / "xdg-cache" / "phalanx" / "mnist"
    assert ds.source == str(cache) and ds.n_train == 50
    assert sorted(p.name for p in cache.iterdir()) == sorted(sums)
    assert data.load("mnist").source == str(cache)  # found in the cache next time
    assert data.load("mnist", root=tmp_path / "mine", download=True).source == str(cache)  # found: no download
    for p in cache.iterdir():
        p.unlink()
    ds_root = data.load("mnist", root=tmp_path / "mine", download=True)  # with a root, downloads go there
    assert ds_root.source == str(tmp_path / "mine" / "mnist")


def test_download_rejects_wrong_checksum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_mnist(tmp_path / "mirror")
    sums = {p.name: "0" * 32 for p in (tmp_path / "mirror").iterdir()}
    monkeypatch.setitem(download.IDX_FILES, "mnist", sums)
    monkeypatch.setitem(download.MIRRORS, "mnist", ((tmp_path / "mirror").as_uri() + "/",))
    with pytest.raises(DownloadError, match="MD5"):
        data.load("mnist", download=True)
    cache = tmp_path / "xdg-cache" / "phalanx" / "mnist"
    assert not any(cache.glob("*")) if cache.exists() else True  # nothing half-written is left


def test_download_cifar10_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cifar(tmp_path / "src" / "cifar-10-batches-py")
    archive = tmp_path / "mirror" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
        evil = tarfile.TarInfo("../escaped")
        evil.size = 3
        tar.addfile(evil, io.BytesIO(b"bad"))
    monkeypatch.setattr(download, "CIFAR10_ARCHIVE", ("cifar-10-python.tar.gz", _md5(archive)))
    monkeypatch.setitem(download.MIRRORS, "cifar10", ((tmp_path / "mirror").as_uri() + "/",))
    ds = data.load("cifar10", download=True)
    assert ds.train_x.shape == (30, 3, 32, 32)
    assert ds.source == str(tmp_path / "xdg-cache" / "phalanx" / "cifar10" / "cifar-10-batches-py")
    assert not (tmp_path / "xdg-cache" / "phalanx" / "escaped").exists()


# ------------------------------------------------------------------------------------------------ the rest


def test_names_and_bad_arguments(tmp_path: Path) -> None:
    assert data.names() == ["cifar10", "digits", "fashion-mnist", "femnist", "femnist-population", "mnist", "sent140",
                            "sent140-sample", "shakespeare", "synthetic"]
    assert data.canonical("Fashion_MNIST") == data.canonical("fmnist") == "fashion-mnist"
    assert data.canonical("CIFAR-10") == "cifar10"
    with pytest.raises(ConfigError, match="did you mean mnist"):
        data.load("mnsit")
    with pytest.raises(ConfigError, match="download"):
        data.load("digits", download="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="root"):
        data.load("digits", root=3)  # type: ignore[arg-type]


def test_dataset_validates_and_standardise_guards() -> None:
    x = torch.zeros(3, 1, 2, 2)
    y = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="train_y"):
        Dataset("t", x, y[:2], x, y, 2, (1, 2, 2), "here")
    with pytest.raises(ValueError, match="test_x"):
        Dataset("t", x, y, x.double(), y, 2, (1, 2, 2), "here")
    assert "train=3" in repr(Dataset("t", x, y, x, y, 2, (1, 2, 2), "here"))
    flat = np.full((2, 1, 2, 2), 7, dtype=np.uint8)
    tr, _, _, std = standardise(flat, flat, scale=16)  # constant image: centred, not divided by 0
    assert std == (0.0,) and torch.equal(tr, torch.zeros(2, 1, 2, 2))
    with pytest.raises(ValueError, match="above 16"):
        standardise(flat, flat + 10, scale=16)
