"""phalanx.data.from_hf against the real Hugging Face ``datasets`` and Flower Datasets (``flwr-datasets``): local data
sets built here in, a Phalanx Dataset whose natural partition is the clients out; the hub download's conversion on
a local copy in Flower's schema (no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from phalanx import data, models
from phalanx.data import hf, leaf
from phalanx.data.base import DataFormatError
from phalanx.errors import ConfigError

datasets = pytest.importorskip("datasets")
partitioners = pytest.importorskip("flwr_datasets.partitioner")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow's "Downcasting array dtype" on from_dict


def images(n: int = 60, writers: int = 4, seed: int = 0) -> Any:
    """An image data set with a writer column, as a user builds one from local files."""
    rng = np.random.default_rng(seed)
    ds = datasets.Dataset.from_dict({
        "image": [rng.integers(0, 256, (8, 8), dtype=np.uint8) for _ in range(n)],
        "label": rng.integers(0, 3, n).tolist(),
        "writer_id": [f"w{(i * 7) % writers}" for i in range(n)],
    })
    return ds.cast_column("image", datasets.Image())


def test_a_user_column_gives_users_and_a_per_user_holdout() -> None:
    raw = images()
    ds = data.from_hf(raw, user="writer_id", name="mine")
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 3 and ds.users == ("w0", "w3", "w2", "w1")
    writers = raw["writer_id"]
    # every 10th sample of each writer is held out: 15 each → the 10th goes to test
    assert ds.n_test == 4 and ds.test_users.tolist() == [0, 1, 2, 3]  # samples 36..39, one per writer
    held = [i for w in ("w0", "w3", "w2", "w1") for i in [j for j, v in enumerate(writers) if v == w][9::10]]
    assert sorted(ds.test_y.tolist()) == sorted(raw.select(held)["label"])
    pixels = np.stack([np.asarray(img) for img in raw["image"]]).astype(np.float64) / 255
    keep = np.setdiff1d(np.arange(60), held)
    mu, sd = pixels[keep].mean(), pixels[keep].std()
    assert np.allclose(ds.train_x[:, 0].numpy(), (pixels[keep] - mu) / sd, atol=1e-5)
    parts = data.partition(ds.train_y, 4, "natural", users=ds.train_users)
    assert [sorted(set(ds.train_users[p].tolist())) for p in parts] == [[0], [1], [2], [3]]


@pytest.mark.parametrize("make", [
    lambda: partitioners.NaturalIdPartitioner(partition_by="writer_id"),
    lambda: partitioners.DirichletPartitioner(num_partitions=3, partition_by="label", alpha=0.5, seed=1),
    lambda: partitioners.IidPartitioner(num_partitions=5),
])
def test_a_flower_partitioner_comes_back_as_the_workers(make: Any) -> None:
    raw = images()
    partitioner = make()
    partitioner.dataset = raw
    ds = data.from_hf(partitioner, test=images(10, seed=1))
    n = partitioner.num_partitions
    parts = data.partition(ds.train_y, n, "natural", users=ds.train_users)
    for i, shard in enumerate(parts):  # worker i holds exactly client i's samples, in its order
        assert ds.train_y[shard].tolist() == partitioner.load_partition(i)["label"]
    if isinstance(partitioner, partitioners.NaturalIdPartitioner):
        assert sorted(ds.users) == ["w0", "w1", "w2", "w3"]  # named by the natural ids


def test_a_list_of_client_data_sets() -> None:
    clients = [images(12, seed=s) for s in range(3)]
    ds = data.from_hf(clients)
    assert ds.users == ("0", "1", "2") and ds.train_users.bincount().tolist() == [11, 11, 11]


def test_text_columns_become_leaf_codes_for_char_lstm() -> None:
    text = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer"
    raw = datasets.Dataset.from_dict({
        "character_id": ["HAMLET"] * 4 + ["OPHELIA"] * 2,
        "x": [text[i: i + 20] for i in range(6)], "y": [text[i + 20] for i in range(6)],
    })
    ds = data.from_hf(raw, user="character_id", test=raw.select([0]), length=20)
    assert ds.input_shape == (20,) and ds.num_classes == 81
    assert ds.train_x[0].long().tolist() == [leaf.LEAF_LETTERS.find(c) for c in text[:20]]
    assert ds.test_users.tolist() == [0]  # the test set's own user column, numbered with the training users
    net = models.make("char-lstm", ds.input_shape, ds.num_classes, hidden=8)
    assert net(ds.train_x).shape == (6, 81)


def test_download_converts_flowers_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub path on a local data set in flwrlabs/femnist's schema: the network is not used."""
    rng = np.random.default_rng(3)
    hub = datasets.Dataset.from_dict({
        "image": [rng.integers(0, 256, (28, 28), dtype=np.uint8) for _ in range(30)],
        "writer_id": ["f0000_14"] * 20 + ["f0001_41"] * 10, "hsf_id": [0] * 30,
        "character": rng.integers(0, 62, 30).tolist(),
    }).cast_column("image", datasets.Image()).cast_column("character",
                                                           datasets.ClassLabel(names=list(leaf.FEMNIST_CLASSES)))
    asked: list[tuple[str, str]] = []

    def load_dataset(repo: str, split: str, cache_dir: str) -> Any:
        asked.append((repo, cache_dir))
        return hub

    monkeypatch.setattr(hf, "probe", lambda url, timeout=10.0: None)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    ds = data.load("femnist", root=tmp_path, download=True)
    assert asked == [("flwrlabs/femnist", str(tmp_path / "femnist" / "hf"))]
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 62 and ds.classes == leaf.FEMNIST_CLASSES
    assert ds.users == ("f0000_14", "f0001_41") and (ds.n_train, ds.n_test) == (27, 3)
    assert ds.test_users.tolist() == [0, 0, 1]


def test_bad_inputs_are_one_line_errors() -> None:
    raw = images(12)
    with pytest.raises(ConfigError, match="x"):
        data.from_hf(raw, x="pixels_missing")
    with pytest.raises(ConfigError, match="user"):
        data.from_hf(raw, user="nobody")
    with pytest.raises(ConfigError, match="same columns"):
        data.from_hf([raw, raw.remove_columns("writer_id")])
    with pytest.raises(ConfigError, match=r"datasets\.Dataset"):
        data.from_hf({"image": [1, 2]})
    plain = data.from_hf(raw)  # no users: natural is refused, the other schemes work
    assert not plain.has_users
    with pytest.raises(ConfigError, match="users"):
        data.partition(plain.train_y, 2, "natural", users=plain.train_users)
    assert torch.cat(data.partition(plain.train_y, 2, "iid")).numel() == plain.n_train


def test_images_of_different_sizes_are_one_line_before_stacking() -> None:
    """An image column whose images differ in size (a hub copy with one odd image) is refused, naming the input,
    instead of numpy's traceback from stacking them."""
    rng = np.random.default_rng(0)
    raw = datasets.Dataset.from_dict({
        "image": [rng.integers(0, 256, (8, 8), dtype=np.uint8)] * 5 + [rng.integers(0, 256, (9, 8), dtype=np.uint8)],
        "label": [0, 1, 0, 1, 0, 1],
    }).cast_column("image", datasets.Image())
    with pytest.raises(DataFormatError, match=r"input 5 is an image of \(8, 9\) with 1 channel\(s\), input 0 of "
                       r"\(8, 8\) .*allowed: images of one size") as info:
        data.from_hf(raw, name="odd")
    assert str(info.value).startswith("odd: ") and "\n" not in str(info.value)


def test_one_outlier_string_does_not_pad_every_sample_to_it() -> None:
    """Without ``length``, the longest string sets the width of every sample: one string of 10⁶ characters among
    2,000 short ones would be 16 GB of codes. Refused, naming ``length``, before anything is allocated; with
    ``length`` given it loads."""
    import tracemalloc

    texts = ["to be or not to be"] * 1999 + ["x" * 1_000_000]
    raw = datasets.Dataset.from_dict({"x": texts, "y": ["a", "b"] * 1000})
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"length=None .*input 1999, 1,000,000 characters\) is over 16 × the "
                           r"mean \(518\) \+ 64, and padding all 2,000 to it would take 16,000,000,000 bytes") as info:
            data.from_hf(raw, name="talk")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 << 20 and "\n" not in str(info.value)  # the column itself is ~20 MB; no 16 GB array
    assert data.from_hf(raw, name="talk", length=20).input_shape == (20,)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="length"):
            data.from_hf(raw, length=bad)
