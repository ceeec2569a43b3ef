"""LEAF's FEMNIST, Shakespeare and Sent140 (Caldas et al. 2018): JSON files in LEAF's published format written here,
read back with each sample's user; ``partition = "natural"`` in a run config; the errors."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from phalanx import data
from phalanx.data import hf, leaf, loaders
from phalanx.data.base import DataFormatError, DatasetNotFoundError, DownloadError
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train
from phalanx.experiments.build import check_points, from_config

LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"  # LEAF's ALL_LETTERS


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the user's $PHALANX_DATA, cache or /usr/share/datasets."""
    monkeypatch.delenv("PHALANX_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setattr(loaders, "_SYSTEM_DIR", tmp_path / "system-datasets")


def write_leaf(folder: Path, split: str, files: list[dict[str, dict[str, list[Any]]]]) -> None:
    """``folder/split/*.json`` as LEAF's scripts write them: one file per dict of ``user → {"x", "y"}``."""
    (folder / split).mkdir(parents=True, exist_ok=True)
    for k, users in enumerate(files):
        doc = {"users": list(users), "num_samples": [len(u["y"]) for u in users.values()], "user_data": users}
        (folder / split / f"all_data_{k}_niid_05_keep_0_{split}_9.json").write_text(json.dumps(doc))


def femnist_users(rng: np.random.Generator, names: list[str], sizes: list[int]) -> dict[str, dict[str, list[Any]]]:
    """FEMNIST users: 784 pixel values v/255 (LEAF's data_to_json.py) and labels 0..61 per sample."""
    return {n: {"x": (rng.integers(0, 256, (s, 784)) / 255).tolist(), "y": rng.integers(0, 62, s).tolist()}
            for n, s in zip(names, sizes, strict=True)}


def femnist_dir(root: Path, seed: int = 0) -> tuple[Path, dict[str, Any]]:
    """A LEAF FEMNIST tree ``root/femnist/data/{train,test}``: 5 writers over two train files, one test-only writer
    (LEAF's ``-t user`` split puts whole writers in test)."""
    rng = np.random.default_rng(seed)
    folder = root / "femnist" / "data"
    train_files = [femnist_users(rng, ["f0000_14", "f0001_41"], [9, 6]),
                   femnist_users(rng, ["f0002_07", "f0003_33", "f0004_12"], [12, 4, 7])]
    test_files = [femnist_users(rng, ["f0001_41", "f0099_00"], [3, 2])]
    write_leaf(folder, "train", train_files)
    write_leaf(folder, "test", test_files)
    return folder, {"train": train_files, "test": test_files}


# ---------------------------------------------------------------------------------------------------- FEMNIST


def test_femnist_reads_leaf_files_with_writers(tmp_path: Path) -> None:
    folder, written = femnist_dir(tmp_path)
    ds = data.load("femnist", root=tmp_path)
    assert ds.source == str(folder) and ds.name == "femnist"
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 62 and ds.classes[10] == "A" and ds.classes[61] == "z"
    assert (ds.n_train, ds.n_test) == (38, 5)
    assert ds.users == ("f0000_14", "f0001_41", "f0002_07", "f0003_33", "f0004_12", "f0099_00")
    assert ds.train_users.tolist() == [0] * 9 + [1] * 6 + [2] * 12 + [3] * 4 + [4] * 7
    assert ds.test_users.tolist() == [1, 1, 1, 5, 5]  # a test-only writer gets the next id
    # The pixels, in file order, standardised with the training statistics (v/255 − μ)/σ.
    raw = np.concatenate([np.asarray(u["x"]) for f in written["train"] for u in f.values()])
    expected = (raw - raw.mean()) / raw.std()
    assert np.allclose(ds.train_x.reshape(38, -1).numpy(), expected, atol=1e-5)
    assert ds.train_y.tolist() == [y for f in written["train"] for u in f.values() for y in u["y"]]
    again = data.load("femnist", root=tmp_path)
    assert again.fingerprint() == ds.fingerprint()


def test_femnist_found_in_leafs_layouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _ = femnist_dir(tmp_path / "leaf" / "data")  # a LEAF checkout: leaf/data/femnist/data/{train,test}
    for root in (folder, folder.parent, tmp_path / "leaf" / "data"):
        assert data.load("femnist", root=root).source == str(folder)
    monkeypatch.setenv("PHALANX_DATA", str(tmp_path / "leaf" / "data"))
    assert data.load("FEMNIST").source == str(folder)


def test_natural_partition_gives_each_writer_back(tmp_path: Path) -> None:
    femnist_dir(tmp_path)
    ds = data.load("femnist", root=tmp_path)
    parts = data.partition(ds.train_y, 5, "natural", users=ds.train_users)
    assert [len(p) for p in parts] == [9, 6, 12, 4, 7]
    assert all(set(ds.train_users[p].tolist()) == {w} for w, p in enumerate(parts))


@pytest.mark.parametrize(("payload", "match"), [
    ("{not json", "not a LEAF JSON file"),
    (json.dumps({"users": ["a"]}), "expected a JSON object"),
    (json.dumps({"users": ["a"], "num_samples": [2], "user_data": {"a": {"x": [[0.0] * 784], "y": [1]}}}),
     "num_samples says 2"),
    (json.dumps({"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": [[0.0] * 784], "y": [1, 2]}}}),
     "1 inputs but 2 labels"),
    (json.dumps({"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": [[0.0] * 700], "y": [1]}}}),
     "784 pixels"),
    (json.dumps({"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": [[2.0] * 784], "y": [1]}}}),
     r"\[0, 1\]"),
    (json.dumps({"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": [[0.0] * 784], "y": [62]}}}),
     "0..61"),
])
def test_bad_leaf_files_name_the_file(tmp_path: Path, payload: str, match: str) -> None:
    folder, _ = femnist_dir(tmp_path)
    (folder / "train" / "zz_broken.json").write_text(payload)
    with pytest.raises(DataFormatError, match=match) as info:
        data.load("femnist", root=tmp_path)
    assert "zz_broken.json" in str(info.value) or "train" in str(info.value)


def test_not_found_says_how_to_get_leaf(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"preprocess\.sh") as info:
        data.load("femnist", root=tmp_path)
    assert "flwrlabs/femnist" in str(info.value) and str(tmp_path) in str(info.value)
    with pytest.raises(DatasetNotFoundError, match="sent140"):
        data.load("sent140", root=tmp_path, download=True)  # no hub copy: the files are needed


def test_download_offline_is_one_line_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("datasets")
    monkeypatch.setattr(hf, "HUB_PROBE", "http://127.0.0.1:1/")  # nothing listens there: refused at once
    start = time.monotonic()
    with pytest.raises(DownloadError, match="cannot reach") as info:
        data.load("femnist", root=tmp_path, download=True)
    assert "\n" not in str(info.value)
    assert time.monotonic() - start < 60  # the probe's timeout is 10 s; a refused connection returns at once


def test_download_without_the_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets → ImportError
    with pytest.raises(ConfigError, match=r"phalanx\[hf\]") as info:
        data.load("shakespeare", root=tmp_path, download=True)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------------ Shakespeare


TEXT = ("ROMEO. But soft! what light through yonder window breaks? It is the east, and Juliet is the sun. "
        "Arise, fair sun, and kill the envious moon, Who is already sick and pale with grief, {~}")


def shakespeare_dir(root: Path) -> Path:
    """LEAF Shakespeare: users are play_role names, x 80-character strings, y the next character."""
    text = TEXT

    def windows(start: int, n: int) -> dict[str, list[Any]]:
        xs = [text[i: i + 80] for i in range(start, start + n)]
        return {"x": xs, "y": [text[i + 80] for i in range(start, start + n)]}
    folder = root / "shakespeare" / "data"
    write_leaf(folder, "train", [{"THE_TRAGEDY_OF_ROMEO_AND_JULIET_ROMEO": windows(0, 7),
                                  "THE_TRAGEDY_OF_ROMEO_AND_JULIET_JULIET": windows(20, 5)}])
    write_leaf(folder, "test", [{"THE_TRAGEDY_OF_ROMEO_AND_JULIET_ROMEO": windows(102, 3)}])
    return folder


def test_shakespeare_codes_are_leafs_letters(tmp_path: Path) -> None:
    shakespeare_dir(tmp_path)
    ds = data.load("shakespeare", root=tmp_path)
    assert ds.input_shape == (80,) and ds.num_classes == 81 and ds.train_x.dtype == torch.float32
    assert (ds.n_train, ds.n_test) == (12, 3) and ds.train_users.tolist() == [0] * 7 + [1] * 5
    assert ds.users[1] == "THE_TRAGEDY_OF_ROMEO_AND_JULIET_JULIET"
    assert "".join(LETTERS[int(c)] for c in ds.train_x[0]) == TEXT[:80]
    assert int(ds.train_y[0]) == LETTERS.index(TEXT[80])
    last = ds.test_x[-1].long().tolist()  # TEXT[104:184] ends in "{~": neither is one of LEAF's letters
    assert last == [LETTERS.find(c) if c in LETTERS else 80 for c in TEXT[104:184]] and last[-2:] == [80, 80]
    assert int(ds.test_y[-1]) == LETTERS.index("}")
    assert ds.classes[80] == "<oov>" and leaf.OOV == 80


def test_char_lstm_trains_on_shakespeare_naturally(tmp_path: Path) -> None:
    shakespeare_dir(tmp_path)
    cfg = make_config({"dataset": "shakespeare", "data_root": str(tmp_path), "partition": "natural", "workers": 2,
                       "model": "char-lstm", "model_params": {"hidden": 8, "embedding": 4, "layers": 1},
                       "aggregator": "mean", "rounds": 3, "eval_every": 3, "batch_size": 4, "lr": 0.5})
    check_points([cfg])
    rows = train(cfg)
    assert len(rows) == 2 and rows[-1]["round"] == 3
    assert np.isfinite(rows[-1]["test_loss"]) and 0 <= rows[-1]["test_accuracy"] <= 1


# ---------------------------------------------------------------------------------------------------- Sent140


def test_sent140_tweets_by_user(tmp_path: Path) -> None:
    folder = tmp_path / "sent140" / "data"
    row = ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY"]
    write_leaf(folder, "train", [{"alice": {"x": [[*row, "alice", "good morning :)"], [*row, "alice", "meh"]],
                                            "y": [1, 0]},
                                  "bob": {"x": [[*row, "bob", "I hate mondays"]], "y": [0]}}])
    write_leaf(folder, "test", [{"bob": {"x": [[*row, "bob", "friday!"]], "y": [1]}}])
    ds = data.load("sent140", root=tmp_path)
    assert ds.input_shape == (loaders.SENT140_LENGTH,) and ds.num_classes == 2
    assert ds.train_users.tolist() == [0, 0, 1] and ds.test_users.tolist() == [1]
    assert ds.train_y.tolist() == [1, 0, 0]
    tail = "".join(LETTERS[int(c)] for c in ds.train_x[2, -14:])
    assert tail == "I hate mondays" and int(ds.train_x[2, 0]) == LETTERS.index(" ")  # left-padded with spaces


# ------------------------------------------------------------------------------------------------- run configs


def test_natural_femnist_run_from_a_config(tmp_path: Path) -> None:
    femnist_dir(tmp_path)
    base = {"dataset": "femnist", "data_root": str(tmp_path), "partition": "natural", "model": "logreg",
            "aggregator": "cwtm", "f": 1, "byzantine": 1, "attack": "signflip", "rounds": 4, "eval_every": 2,
            "batch_size": 4}
    cfg = make_config({**base, "workers": 5})
    exp = from_config(cfg)
    assert [len(s) for s in exp.shards] == [9, 6, 12, 4, 7]  # every writer is one worker, in writer order
    rows = train(make_config({**base, "workers": 5}))
    assert [r["round"] for r in rows] == [0, 2, 4]
    sampled = from_config(make_config({**base, "workers": 3})).shards  # 3 of the 5 writers, from the stream
    again = from_config(make_config({**base, "workers": 3})).shards
    assert [s.tolist() for s in sampled] == [s.tolist() for s in again]
    assert len({tuple(exp.dataset.train_users[s].unique().tolist()) for s in sampled}) == 3


def test_natural_without_user_ids_is_refused_before_any_run(tmp_path: Path) -> None:
    cfg = make_config({"dataset": "digits", "partition": "natural", "workers": 4, "rounds": 2})
    with pytest.raises(ConfigError, match="partition") as info:
        check_points([cfg])
    assert info.value.parameter == "partition" and "\n" not in str(info.value)
    femnist_dir(tmp_path)
    too_many = make_config({"dataset": "femnist", "data_root": str(tmp_path), "partition": "natural",
                            "workers": 6, "rounds": 2})
    with pytest.raises(ConfigError, match="workers") as more:
        check_points([too_many])
    assert "<= 5" in str(more.value)


def test_fingerprint_covers_the_users(tmp_path: Path) -> None:
    femnist_dir(tmp_path)
    ds = data.load("femnist", root=tmp_path)
    moved = data.Dataset(ds.name, ds.train_x, ds.train_y, ds.test_x, ds.test_y, ds.num_classes, ds.input_shape,
                         ds.source, train_users=torch.zeros_like(ds.train_users), test_users=ds.test_users,
                         users=ds.users)
    plain = data.Dataset(ds.name, ds.train_x, ds.train_y, ds.test_x, ds.test_y, ds.num_classes, ds.input_shape,
                         ds.source)
    assert len({ds.fingerprint(), moved.fingerprint(), plain.fingerprint()}) == 3
    assert not plain.has_users and ds.has_users
