"""Hostile LEAF trees, from an attacker's review of the LEAF loaders (the eager ``data.load`` and the lazy
``LeafPopulation``): each finding's input is written into ``tmp_path`` here, small, and must give data or a typed
one-line ``DataFormatError`` naming the file — never another exception, never data silently changed
(docs/data.md, "What a data file may cost" and "Natural federated data")."""

from __future__ import annotations

import json
import os
import signal
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from phalanx import data
from phalanx.data import leaf, loaders
from phalanx.data.base import DataFormatError
from phalanx.data.leaf_population import LeafPopulation

ROW = [0.5] * 784


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PHALANX_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setattr(loaders, "_SYSTEM_DIR", tmp_path / "system-datasets")


def _doc(users: dict[str, Any]) -> dict[str, Any]:
    return {"users": list(users), "num_samples": [len(u["y"]) for u in users.values()], "user_data": users}


def _tree(root: Path, users: dict[str, Any], test: dict[str, Any] | None = None) -> Path:
    """A LEAF tree: ``train/a.json`` holding ``users``, ``test/a.json`` holding ``test`` (one honest sample)."""
    for s in ("train", "test"):
        (root / s).mkdir(parents=True, exist_ok=True)
    (root / "train" / "a.json").write_text(json.dumps(_doc(users)))
    (root / "test" / "a.json").write_text(json.dumps(_doc(test or {"t": {"x": [ROW], "y": [1]}})))
    return root


def _one_line(exc: BaseException, path: Path) -> None:
    assert isinstance(exc, DataFormatError), f"{type(exc).__name__}: {exc}"
    assert str(exc).startswith(str(path)) and "\n" not in str(exc), str(exc)


def _both_refuse(root: Path, path: Path) -> None:
    """The eager reader and the lazy population each refuse the tree in one line naming ``path``."""
    for load in (lambda: data.load("femnist", root=root), lambda: LeafPopulation(root, eval_clients=1)):
        with pytest.raises(Exception) as info:
            load()
        _one_line(info.value, path)


# --- F1: one image and one label per sample -------------------------------------------------------------------


@pytest.mark.parametrize("users", [{"w": {"x": [[[0.5, 0.5]] * 784] * 2, "y": [1, 2]}},
                                   {"w": {"x": [[[]] * 784] * 2, "y": [1, 2]}},
                                   {"w": {"x": [ROW] * 2, "y": [[1], [2]]}},
                                   {"w": {"x": [ROW], "y": [[1, 99]]}},
                                   {"w": {"x": [ROW], "y": [[]]}}],
                         ids=["pixel-pairs", "empty-pixels", "boxed-labels", "label-list", "empty-label"])
def test_non_scalar_pixels_or_labels_are_refused_naming_the_file(tmp_path: Path, users: dict[str, Any]) -> None:
    """A row of 784 pairs was 2 images under one label (the lazy population then trained every later client of the
    round on its neighbour's images); labels ``[[1]]`` were an (N, 1) array. Each pixel and each label a number."""
    alone = _tree(tmp_path / "alone", users)  # the eager reader: only the hostile writer
    with pytest.raises(Exception) as info:
        data.load("femnist", root=alone)
    _one_line(info.value, alone / "train" / "a.json")
    beside = _tree(tmp_path / "beside", {"e": {"x": [ROW], "y": [0]}, **users})  # lazily: not an evaluation client
    with pytest.raises(Exception) as info:
        LeafPopulation(beside, eval_clients=1)
    _one_line(info.value, beside / "train" / "a.json")
    assert '"w"' in str(info.value)  # the writer's field, user_data["w"].x[k] or .y[k]


# --- F2: rows that convert one by one but not together ----------------------------------------------------------


@pytest.mark.parametrize("users", [{"w": {"x": [ROW, [[0.5]] * 784], "y": [1, 2]}},
                                   {"w": {"x": [ROW, ROW], "y": [1, [2]]}}], ids=["pixels", "labels"])
def test_rows_ragged_only_together_are_one_line(tmp_path: Path, users: dict[str, Any]) -> None:
    """The culprit search was ``next()`` without a default: rows that each convert alone but not together ended in
    a bare ``StopIteration`` traceback (``phalanx run`` too)."""
    root = _tree(tmp_path, users)
    _both_refuse(root, root / "train" / "a.json")


# --- F5: exact JSON types ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("x", "y"), [(ROW, 3.9), (ROW, 61.999), (ROW, "5"), (ROW, True), (["0.5"] * 784, 1),
                                      ([True] + [0.5] * 783, 1), ([" 1e-0 "] * 784, 1), ([10 ** 400] * 784, 1)],
                         ids=["float-label", "float-label-61", "string-label", "bool-label", "string-pixels",
                              "bool-pixel", "spaced-string-pixels", "huge-int-pixels"])
def test_femnist_values_of_the_wrong_json_type_are_refused(tmp_path: Path, x: Any, y: Any) -> None:
    """``3.9`` was label 3, ``"5"`` label 5, ``true`` label 1, ``"0.5"`` a pixel: a label is a JSON integer (not a
    bool), a pixel a JSON number; refused naming the file and the sample, in both readers."""
    root = _tree(tmp_path, {"w": {"x": [x], "y": [y]}})
    _both_refuse(root, root / "train" / "a.json")


def test_honest_femnist_values_still_load_exactly(tmp_path: Path) -> None:
    """Integer pixels 0 and 1 and float ones load as round(255·x); integer labels as given."""
    root = _tree(tmp_path, {"w": {"x": [[0] * 783 + [1], [(i % 256) / 255 for i in range(784)]], "y": [0, 61]}})
    ds = data.load("femnist", root=root)
    assert ds.train_y.tolist() == [0, 61]
    split = leaf.read_leaf_dir(root / "train")
    px, _ = leaf.femnist_pixels(split, "w")
    assert px[0].reshape(-1).tolist() == [0] * 783 + [255]
    assert px[1].reshape(-1).tolist() == [i % 256 for i in range(784)]


# --- F3, F10: every *.json entry of a split is a regular file, or the split is refused ----------------------------


def _loop(p: Path) -> None:
    os.symlink(p.name, p)


PLANTS: dict[str, Callable[[Path], None]] = {
    "fifo": os.mkfifo,
    "link-to-dev-zero": lambda p: os.symlink("/dev/zero", p),
    "dangling-link": lambda p: os.symlink("nowhere", p),
    "link-loop": _loop,
    "directory": lambda p: p.mkdir(),
    "unlookupable-link": lambda p: os.symlink("n" * 300, p),  # ENAMETOOLONG: Path.is_file() let it through, bare
}


@pytest.mark.parametrize("kind", list(PLANTS))
@pytest.mark.parametrize("split", ["train", "test"])
def test_a_json_entry_that_is_not_a_regular_file_is_refused_not_skipped(tmp_path: Path, kind: str, split: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO, a link to /dev/zero, a dangling link, a link loop or a directory named ``b.json`` was skipped without
    a word (the split loaded as less data than it holds; docs/data.md said refused), and a link whose target cannot
    be looked up (a 300-byte name: ENAMETOOLONG) was a bare ``OSError`` traceback. Each is one line naming it, in
    both readers, from the listing: no file is read first, and the FIFO is never opened (the alarm would fire)."""
    root = _tree(tmp_path, {"w": {"x": [ROW], "y": [1]}})
    planted = root / split / "b.json"
    PLANTS[kind](planted)
    read: list[Path] = []
    real = leaf.read_leaf_bytes
    monkeypatch.setattr(leaf, "read_leaf_bytes", lambda p: read.append(p) or real(p))

    def blocked(*_: Any) -> None:
        raise TimeoutError("blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(60)
    try:
        _both_refuse(root, planted)
        with pytest.raises(DataFormatError, match=r"b\.json"):
            leaf.has_leaf_files(root)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert read == []  # refused from the listings of train/ and test/, before either reader reads a file


# --- F4: what turning text into codes may allocate ---------------------------------------------------------------


def _text_tree(root: Path, name: str, chars: int, n: int, files: int) -> int:
    """A text tree of ``files`` training files of ``n`` samples each, every input ``chars`` characters long
    (compact JSON: the fewest bytes a sample can take); its files' total size."""
    x: Any = "a" * chars if name == "shakespeare" else [0, 0, 0, 0, "a" * chars]
    y: Any = "a" if name == "shakespeare" else 0
    for s in ("train", "test"):
        (root / s).mkdir(parents=True, exist_ok=True)
    for f in range(files):
        doc = _doc({f"u{f}": {"x": [x] * n, "y": [y] * n}})
        (root / "train" / f"{f:03d}.json").write_text(json.dumps(doc, separators=(",", ":")))
    (root / "test" / "a.json").write_text(json.dumps(_doc({"t": {"x": [x], "y": [y]}}), separators=(",", ":")))
    return sum(p.stat().st_size for p in root.rglob("*.json"))


def _peak(load: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        load()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


TEXT_BOUND = 24
"""docs/data.md: loading a text set whose conversion the check accepts peaks within 24 × its files' size + 2 MiB."""


@pytest.mark.parametrize(("name", "n", "files", "chars"), [
    ("shakespeare", 20_000, 1, 19), ("shakespeare", 1_000, 20, 19), ("sent140", 20_000, 1, 31),
    ("sent140", 1_000, 20, 31)])
def test_text_codes_stay_within_a_documented_multiple_of_the_files(tmp_path: Path, name: str, n: int, files: int,
                                                                   chars: int) -> None:
    """The worst text tree the conversion check accepts — the shortest inputs it lets through, ``chars`` characters
    (each padded to 80 or 144 codes), in one file or spread over 20 — loads within ``TEXT_BOUND`` × its files' size
    + 2 MiB (tracemalloc's peak); one character shorter is refused in one line before a code is allocated. Before:
    int64 codes and no check, 56 × (Shakespeare) and 49 × (Sent140) for one file, 106 × over 200 small files."""
    size = _text_tree(tmp_path / "edge", name, chars, n, files)
    peak = _peak(lambda: data.load(name, root=tmp_path / "edge"))
    assert peak <= TEXT_BOUND * size + 2 * leaf.EXPANSION_SLACK, f"{peak / size:.1f} × the files"
    shorter = tmp_path / "shorter"
    _text_tree(shorter, name, chars - 1, n, files)
    with pytest.raises(DataFormatError) as info:
        data.load(name, root=shorter)
    _one_line(info.value, shorter / "train")
    assert "codes would take" in str(info.value)


def test_the_bound_fails_without_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: the conversion check switched off. 40 small files of 3-character lines (each file within the
    parse's budget of 16 × its size + 1 MiB) then cost about twice ``TEXT_BOUND`` × their size."""
    size = _text_tree(tmp_path, "shakespeare", 3, 1_500, 40)
    monkeypatch.setattr(leaf, "check_text_cost", lambda *_: None)
    peak = _peak(lambda: data.load("shakespeare", root=tmp_path))
    assert peak > TEXT_BOUND * size + 2 * leaf.EXPANSION_SLACK, f"{peak / size:.1f} × the files"


def test_out_of_memory_while_encoding_text_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No memory left for the codes (within the bounds, on a small machine) was a bare ``MemoryError``; now one line
    naming the data directory."""
    _text_tree(tmp_path, "shakespeare", 5, 3, 1)
    real = leaf.np.empty

    def no_memory(shape: Any, *a: Any, **k: Any) -> Any:
        if isinstance(shape, tuple) and len(shape) == 2 and shape[1] == loaders.SHAKESPEARE_LENGTH:
            raise MemoryError
        return real(shape, *a, **k)

    monkeypatch.setattr(leaf.np, "empty", no_memory)
    with pytest.raises(DataFormatError, match="not enough memory") as info:
        data.load("shakespeare", root=tmp_path)
    _one_line(info.value, tmp_path)


SENT_ROW = ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", "a tweet"]


@pytest.mark.parametrize("y", [0.9, 1.5, "1", " 0 ", "\u0661", True, False, [1], None],
                         ids=["0.9", "1.5", "string-1", "spaced-0", "arabic-indic-1", "true", "false", "list", "null"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_sent140_labels_of_the_wrong_json_type_are_refused(tmp_path: Path, y: Any, split: str) -> None:
    """``int(v)`` took 0.9 as 0, 1.5 as 1, ``"1"``, ``" 0 "``, ARABIC-INDIC DIGIT ONE and ``true`` as labels: a
    Sent140 label is the JSON integer 0 or 1, refused otherwise in one line naming the file and the sample."""
    bad, good = {"w": {"x": [SENT_ROW], "y": [y]}}, {"w": {"x": [SENT_ROW], "y": [1]}}
    root = _tree(tmp_path, bad if split == "train" else good, bad if split == "test" else good)
    with pytest.raises(DataFormatError) as info:
        data.load("sent140", root=root)
    _one_line(info.value, root / split / "a.json")
    assert 'user_data["w"].y[0]' in str(info.value)
    ok = _tree(tmp_path / "ok", {"w": {"x": [SENT_ROW] * 2, "y": [0, 1]}}, good)
    assert data.load("sent140", root=ok).train_y.tolist() == [0, 1]


# --- F6: the text of an error is bounded, whatever the file holds -------------------------------------------------


@pytest.mark.parametrize("char", ["\u0085", "\U000e0001", "x"], ids=["nel", "astral-tag", "ascii"])
def test_the_missing_keys_error_shortens_the_keys(tmp_path: Path, char: str) -> None:
    """Six keys of 64 KiB each (U+0085: 2 bytes in the file, 4 characters in a repr) made a 786,373-character error
    line, printed whole by ``phalanx run``; the keys are shown shortened, the first six of them, in file order."""
    (tmp_path / "train").mkdir()
    key = char * (leaf.MAX_STRING_BYTES // len(char.encode()) - 8)
    text = "{" + ",".join(f'"{i}{key}": 0' for i in range(8)) + "}"
    (tmp_path / "train" / "a.json").write_text(text, encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        leaf.read_leaf_dir(tmp_path / "train")
    _one_line(info.value, tmp_path / "train" / "a.json")
    message = str(info.value)
    assert len(message) - len(str(tmp_path)) < 600, len(message)
    assert "an object of 8 keys: '0" in message and "'5" in message and "'6" not in message


@pytest.mark.parametrize("name", ["a.json\n\x1b[1;32mphalanx: all 100 runs finished OK\x1b[0m\n.json",
                                  "a\r\x1b[2Jb.json", "a\u2028b\x85\tc.json", b"a\xff\xfe.json"],
                         ids=["forged-line", "clear-screen", "separators", "not-utf-8"])
def test_a_file_name_with_control_characters_is_still_one_line(tmp_path: Path, name: str | bytes) -> None:
    """Whoever can write the data directory chooses the names listed: ``a.json\\n\\x1b[1;32mphalanx: all 100 runs
    finished OK…`` printed a forged green line after ``phalanx run``'s ``error:``. The name is shown escaped, on the
    one line (every character printable); the error's ``path`` keeps it as it is, for programs."""
    train = tmp_path / "train"
    train.mkdir()
    with open(os.path.join(os.fsencode(train), os.fsencode(name)), "wb") as fh:
        fh.write(b"{not json")
    with pytest.raises(DataFormatError) as info:
        leaf.read_leaf_dir(train)
    message = str(info.value)
    assert message.isprintable(), repr(message)
    path = os.path.join(str(train), os.fsdecode(name))
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)  # \n, \x1b, \udcff
    assert info.value.path == path and message.startswith(escaped + ": not a LEAF JSON file")
    assert "\\x1b" in message or "\\x85" in message or "\\udcff" in message


# --- F8: a key given twice ---------------------------------------------------------------------------------------


def _entry(y: int) -> str:
    return json.dumps({"x": [ROW], "y": [y]})


@pytest.mark.parametrize("text", [
    '{"users": ["w"], "num_samples": [1], "user_data": {"w": ' + _entry(1) + ', "w": ' + _entry(9) + "}}",
    '{"users": ["w"], "users": [], "num_samples": [1], "user_data": {"w": ' + _entry(1) + "}}",
    '{"users": ["w"], "num_samples": [1], "user_data": {"w": {"x": [' + json.dumps(ROW) + '], "y": [1], "y": [2]}}}',
], ids=["writer-twice", "users-twice", "labels-twice"])
def test_a_key_given_twice_is_refused(tmp_path: Path, text: str) -> None:
    """``json.loads`` keeps the last of two equal keys: writer ``"w"`` given twice loaded its second data (a
    reviewer, or a first-wins reader, sees the first), and a second, empty ``"users"`` hid the first as "no
    training samples". A key given twice in any object is one line naming the file and the key, in both readers."""
    root = _tree(tmp_path, {"t": {"x": [ROW], "y": [1]}})
    (root / "train" / "a.json").write_text(text)
    for load in (lambda: data.load("femnist", root=root), lambda: LeafPopulation(root, eval_clients=1)):
        with pytest.raises(DataFormatError) as info:
            load()
        _one_line(info.value, root / "train" / "a.json")
        assert "is given twice in one object" in str(info.value)


# --- F9: a writer listed in several files is one client, in both readers ----------------------------------------


def test_a_writer_in_two_files_does_not_double_its_test_samples(tmp_path: Path) -> None:
    """Writer ``a`` in ``train/a.json`` and ``train/b.json`` was two lazy clients, both evaluation clients, so its 3
    test samples were 6 in the run's test set (the eager reader: 3). Now it is one client holding both entries."""
    root = _tree(tmp_path, {"a": {"x": [ROW], "y": [1]}}, {"a": {"x": [ROW] * 3, "y": [4, 5, 6]}})
    (root / "train" / "b.json").write_text(json.dumps(_doc({"a": {"x": [ROW], "y": [2]}})))
    pop = LeafPopulation(root, eval_clients=2)
    assert pop.size == 1 and pop.test_y.tolist() == [4, 5, 6] == data.load("femnist", root=root).test_y.tolist()
    assert pop.clients([0])[0][1].tolist() == [1, 2]


def _raw(x: torch.Tensor, mean: float, std: float) -> list[int]:
    """Standardised FEMNIST pixels back to their stored values 0..255."""
    return torch.round((x.double() * std + mean) * 255).long().reshape(-1).tolist()


def test_the_lazy_population_and_the_eager_reader_agree(tmp_path: Path) -> None:
    """The same tree through both readers: the same writers, numbered alike (first appearance over the sorted
    train files), each holding the same training samples in the same order — a writer listed in two files merged
    in file order — and the evaluation clients' test samples equal to the eager reader's test samples of those
    writers, each counted once."""
    rng = np.random.default_rng(0)

    def writer(n: int) -> dict[str, Any]:
        return {"x": (rng.integers(0, 256, (n, 784)) / 255).tolist(), "y": rng.integers(0, 62, n).tolist()}

    for s in ("train", "test"):
        (tmp_path / s).mkdir()
    files = {"train/1.json": {"b": writer(2), "a": writer(3)}, "train/2.json": {"c": writer(1), "a": writer(2)},
             "train/3.json": {"d": writer(2), "b": writer(1)}, "test/1.json": {"a": writer(2), "c": writer(1)},
             "test/2.json": {"a": writer(1), "d": writer(2), "b": writer(1)}}
    for name, users in files.items():
        (tmp_path / name).write_text(json.dumps(_doc(users)))
    ds = data.load("femnist", root=tmp_path)
    pop = LeafPopulation(tmp_path, eval_clients=4)
    assert pop.size == len(ds.users) == 4 and list(ds.users) == ["b", "a", "c", "d"]
    mean, std = float(ds.mean[0]), float(ds.std[0])
    for k, (x, y) in enumerate(pop.clients(range(4))):
        mine = ds.train_users == k
        assert y.tolist() == ds.train_y[mine].tolist()
        assert _raw(x, pop.mean[0], pop.std[0]) == _raw(ds.train_x[mine], mean, std)
    want = torch.cat([ds.test_y[ds.test_users == k] for k in pop.eval_ids(4)])
    assert pop.test_y.tolist() == want.tolist() and len(want) == len(ds.test_y)
