"""No data file exhausts memory before it is checked (issue 33, item 5).

The attacker controls a data file (a CIFAR-10 batch, an MNIST ``.gz``, a LEAF JSON file) and nothing else. Each bomb
is written here, a few hundred bytes where the format allows it, and loaded in a child process
(:func:`_bombs.load_in_child`) that reports what the load *allocated* (``tracemalloc``'s peak, which counts an
untouched ``np.empty`` too) and how much its resident memory grew; the child runs under ``RLIMIT_AS`` = its size
after imports + 512 MiB. Every bomb must fail with one line naming the file, within :data:`TRACED_BOUND` and
:data:`RSS_BOUND`. So that the bounds prove something, each bomb is also loaded by the reader as it was before
(``old-*``) and by the reader with its check switched off (a mutant): both must blow the same bound.

Real-format files — a batch written with the opcodes Python 2 and numpy 1.x used for CIFAR-10, Python 3's pickles
of every protocol, LEAF's three formats — still load exactly.
"""

from __future__ import annotations

import gzip
import json
import pickle
import random
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _bombs import idx_header, measure, py2_batch
from phalanx.data import cifar, idx, jsonscan, leaf
from phalanx.data.base import DataFormatError
from phalanx.errors import PhalanxError

TRACED_BOUND = 32 << 20
"""What refusing a bomb may allocate: 32 MiB (the bombs ask for 0.2 to 16 GB)."""
RSS_BOUND = 96 << 20
"""How much the child's resident memory may grow over all its refusals: 96 MiB."""


def _refused(report: dict[str, Any], path: Path, *phrases: str) -> None:
    """``report`` is a one-line DataFormatError naming ``path`` and saying ``phrases``, within the bounds."""
    assert report["error"] == "DataFormatError", report
    message = report["message"]
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    for phrase in phrases:
        assert phrase in message, (phrase, message)
    assert report["traced"] < TRACED_BOUND, (path.name, report["traced"])
    assert report["rss_grown"] < RSS_BOUND, (path.name, report["rss_grown"])


def _blew(report: dict[str, Any]) -> bool:
    """The load failed for want of memory under the child's limit, or allocated more than the bound."""
    return report["error"] == "MemoryError" or report["traced"] > TRACED_BOUND


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every bomb loaded in one child process (:func:`_bombs.measure`; the child takes ~20 s to import torch here)."""
    return measure(tmp_path_factory.mktemp("bombs"))


# ----------------------------------------------------------------------------------------------------- CIFAR-10


def _batch(n: int = 12, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), [int(v) for v in rng.integers(0, 10, n)]


@pytest.mark.parametrize("how", ["python2", *[f"protocol{p}" for p in range(pickle.HIGHEST_PROTOCOL + 1)]])
def test_real_format_batches_load_exactly(tmp_path: Path, how: str) -> None:
    """Python 2's opcodes (how the published batches were written) and Python 3's pickle of every protocol of the
    same dict: the same pixels and labels as ``pickle.loads`` gives, in a writable array, with nothing called."""
    data, labels = _batch()
    path = tmp_path / "data_batch_1"
    if how == "python2":
        path.write_bytes(py2_batch(data, labels))
    else:
        batch = {"batch_label": "training batch 1 of 5", "data": data, "labels": labels,
                 "filenames": [f"img_{i}.png" for i in range(len(labels))]}
        path.write_bytes(pickle.dumps(batch, protocol=int(how[-1])))
    x, y = cifar.read_batch(path)
    assert x.dtype == np.uint8 and x.shape == (12, 3, 32, 32) and x.flags.writeable
    np.testing.assert_array_equal(x.reshape(12, 3072), data)
    assert y.dtype == np.int64 and y.tolist() == labels
    if how != "python2":
        np.testing.assert_array_equal(pickle.loads(path.read_bytes())["data"], x.reshape(12, 3072))


def test_a_real_batchs_budget_is_about_twice_its_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full-size batch (10,000 images) in Python 2's format fits the budget with room: what the interpretation
    made is ~2.06 × the file (its pixels as the pickle's text, then as the array's bytes), under BUDGET_FACTOR = 4."""
    data, labels = _batch(10_000, seed=1)
    path = tmp_path / "data_batch_1"
    path.write_bytes(py2_batch(data, labels))
    spent: list[tuple[int, int]] = []
    run = cifar._Interpreter.run

    def spy(self: Any) -> Any:
        out = run(self)
        spent.append((self.spent, len(self.blob)))
        return out

    monkeypatch.setattr(cifar._Interpreter, "run", spy)
    x, y = cifar.read_batch(path)
    assert np.array_equal(x.reshape(10_000, 3072), data) and y.tolist() == labels
    used, size = spent[0]
    assert 2.0 < used / size < 2.2 < cifar.BUDGET_FACTOR


def test_cifar_bombs_are_refused_in_one_line_within_the_bounds(loaded: dict[str, Any]) -> None:
    """numpy.ndarray((150000, 3072)) (53 bytes → 3.7 GB), _reconstruct of that shape (92 bytes → 460 MB), 28 nested
    _codecs.encode (285 bytes → 17 GB), one string encoded 4,000 times (65 KB → 131 MB), 2^18 empty lists
    (512 KB → 16 MB), and a 300 MB file: each refused by the reader, within the bounds. The reader before (an
    allow-list of callables, then called) blows the bound on every gigabyte bomb and makes 24+ bytes per byte of the
    lists, and the interpreter without its budget blows the bound on the encoded string."""
    new, old, p = loaded["new"], loaded["old"], loaded["paths"]
    assert max(p[k].stat().st_size for k in ("ndarray", "reconstruct", "codecs")) < 300
    _refused(new["ndarray"], p["ndarray"], "numpy.ndarray called with ((150000, 3072),)",
             "allowed: numpy.ndarray only")
    _refused(new["reconstruct"], p["reconstruct"], "_reconstruct(numpy.ndarray, (150000, 3072), b'b')")
    _refused(new["codecs"], p["codecs"], "_codecs.encode of (b'AAAA", "'hex')", "one level")
    _refused(new["memo"], p["memo"], "it decodes to more than", f"at most {cifar.BUDGET_FACTOR} × the file's")
    size = p["lists"].stat().st_size  # the one bomb with no gigabytes in it: ~31 bytes for each byte of the file
    _refused(new["lists"], p["lists"], "it decodes to more than")
    assert new["lists"]["traced"] < (cifar.BUDGET_FACTOR + 2) * size + 2 * cifar.BUDGET_SLACK
    assert old["lists"]["traced"] > 24 * size, old["lists"]
    _refused(new["huge"], p["huge"], "314,572,800 bytes, more than the 268,435,456", "a CIFAR-10 batch is about 31 MB")
    assert all(_blew(old[k]) for k in ("ndarray", "reconstruct", "codecs", "memo")), old
    assert _blew(loaded["mutant"]["memo"]), loaded["mutant"]["memo"]


def test_cifar_structure_is_checked_naming_the_file(tmp_path: Path) -> None:
    """Anything but the batch's shapes is one line naming the file: a global outside the list, an array whose data
    do not match its shape, a BUILD of a plain object, labels that are not one int in 0..9 per image."""
    data, labels = _batch(3)
    path = tmp_path / "b"

    def refused(blob: bytes, *phrases: str) -> None:
        path.write_bytes(blob)
        with pytest.raises(DataFormatError) as info:
            cifar.read_batch(path)
        assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
        for phrase in phrases:
            assert phrase in str(info.value)

    refused(pickle.dumps(print), "refusing to load builtins.print")
    lie = py2_batch(data, labels).replace(b"K\x01K\x03M\x00\x0c\x86", b"K\x01K\x04M\x00\x0c\x86")  # shape (4, 3072)
    refused(lie, "an array of shape (4, 3072) of uint8 needs 12,288 bytes of data, the pickle carries 9,216")
    refused(b"\x80\x02}(X\x01\x00\x00\x00a]ub.", "BUILD of anything but a new dtype or array")
    refused(pickle.dumps({"data": data, "labels": labels[:2]}), "labels: 2 labels for 3 images")
    refused(pickle.dumps({"data": data, "labels": [0, 1, 10]}), "labels: labels outside 0..9", "allowed: 0..9")
    refused(pickle.dumps({"data": data, "labels": [0, 1, True]}), "labels: labels of type list")
    refused(pickle.dumps({"data": data.astype(np.float64), "labels": labels}), "dtype(name, 0, 1) with an integer")
    refused(pickle.dumps({"data": data}, protocol=2)[:-1], "not a CIFAR-10 python batch")  # cut short
    refused(pickle.dumps([data]), "expected a pickled dict, got list")


def _mangled(r: random.Random, blob: bytes, alphabet: bytes = b"") -> bytes:
    """``blob`` with 1 to 4 random edits: a byte replaced (from ``alphabet`` or any), bytes cut, a piece of the
    blob pasted elsewhere (repeating a memo reference, an opcode, a bracket)."""
    b = bytearray(blob)
    for _ in range(r.randint(1, 4)):
        k, i = r.random(), r.randrange(len(b))
        if k < 0.4:
            b[i] = r.choice(alphabet + bytes([r.randrange(256)]))
        elif k < 0.6:
            del b[i: i + r.randint(1, 8)]
        else:
            b[i:i] = b[r.randrange(len(b)):][: r.randint(1, 30)]
    return bytes(b)


def test_a_mangled_batch_is_a_batch_or_one_line(tmp_path: Path) -> None:
    """1,500 random edits of real-format batches (Python 2's, Python 3's protocols 0–5): each reads as a batch or
    fails with a one-line DataFormatError — never another exception (20,000 edits were run the same way once)."""
    data, labels = _batch(2)
    seeds = [py2_batch(data, labels)] + [pickle.dumps({"data": data, "labels": labels, "x": (1.5, None, 10**30)},
                                                      protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)]
    r = random.Random(1)
    path = tmp_path / "b"
    for _ in range(1500):
        path.write_bytes(_mangled(r, r.choice(seeds)))
        try:
            cifar.read_batch(path)
        except DataFormatError as exc:
            assert "\n" not in str(exc)


# ---------------------------------------------------------------------------------------------------------- IDX


def test_idx_bombs_are_refused_in_one_line_within_the_bounds(loaded: dict[str, Any]) -> None:
    """A .gz whose header declares one 28×28 image but which holds 128 MB (the attacker's 1.4 MB file held 3.1 GB)
    stops one byte after the declared 800; headers declaring more than 1032 × the compressed size — a 60,000-image
    set in a 100-byte file, three dimensions of 2^32 − 1 — and a plain file's header that lies are refused before
    anything is allocated. Decompressing whole (the reader before) and the ratio check switched off blow the bound."""
    new, p = loaded["new"], loaded["paths"]
    assert p["lies.gz"].stat().st_size < 300_000 and p["claims.gz"].stat().st_size < 200
    _refused(new["lies.gz"], p["lies.gz"], "more than 800 bytes, expected 800 for an array of shape (1, 28, 28)")
    size = p["claims.gz"].stat().st_size
    _refused(new["claims.gz"], p["claims.gz"], "declares an array of shape (60000, 28, 28) of uint8 (47,040,016 "
             f"bytes), more than a {size}-byte gzip file can hold",
             f"allowed: at most 1032 × the compressed size = {1032 * size:,}")
    _refused(new["absurd.gz"], p["absurd.gz"], "more than a", "can hold")
    _refused(new["plain"], p["plain"], "116 bytes, expected 47040016 for an array of shape (60000, 28, 28) of uint8")
    assert _blew(loaded["old"]["lies.gz"]), loaded["old"]["lies.gz"]
    mutant = loaded["mutant"]["claims.gz"]
    assert _blew(mutant) and mutant["error"] == "DataFormatError"  # 47 MB allocated, then the data were short


def test_idx_reads_stop_at_the_declared_size(tmp_path: Path) -> None:
    """In process: the header's size bounds the read whatever follows (a file one byte too long is refused, by
    reading one byte past the declared end), and big-endian types come back native and writable."""
    arr = (np.arange(24, dtype=np.int32) - 12).reshape(2, 3, 4)
    body = idx_header((2, 3, 4), 0x0C) + arr.astype(">i4").tobytes()
    p = tmp_path / "f.gz"
    p.write_bytes(gzip.compress(body))
    out = idx.read_idx(p)
    assert out.dtype == np.int32 and out.dtype.isnative and out.flags.writeable
    np.testing.assert_array_equal(out, arr)
    p.write_bytes(gzip.compress(body + b"\x00"))
    with pytest.raises(DataFormatError, match=r"more than 112 bytes, expected 112 for an array of shape \(2, 3, 4\)"):
        idx.read_idx(p)


# ---------------------------------------------------------------------------------------------------- LEAF JSON


def test_leaf_bombs_are_refused_in_one_line_within_the_bounds(loaded: dict[str, Any]) -> None:
    """One 8 MB string ending in an astral character (the attacker's was 400 MB → 2.2 GB), 700,000 empty lists
    (2.1 MB → 49 MB parsed), 100,000 levels of nesting: refused by the scan before ``json`` builds anything, in
    one line naming the file. ``json.loads`` (the reader before), and the reader without its string cap or its
    expansion cap, blow the bound; without its depth cap the file is still refused, but by json's recursion."""
    new, old, mutant, p = loaded["new"], loaded["old"], loaded["mutant"], loaded["paths"]
    _refused(new["string.json"], p["string.json"], "a JSON string longer than 65,536 bytes starts at byte 11",
             "allowed: strings of at most 65,536 bytes")
    _refused(new["lists.json"], p["lists.json"], "parsing it would take up to",
             f"allowed: at most {leaf.EXPANSION} × the file")
    _refused(new["deep.json"], p["deep.json"], "JSON nested more than 8 levels deep at byte 17",
             "allowed: at most 8 levels")
    assert _blew(old["string.json"]) and _blew(old["lists.json"]), old
    assert old["deep.json"]["error"] == "RecursionError"  # json.loads before: a traceback, not a line
    assert _blew(mutant["string.json"]) and _blew(mutant["lists.json"]), mutant
    deep = mutant["deep.json"]
    assert deep["error"] == "DataFormatError" and "RecursionError" in deep["message"]


def _leaf_doc(x: list[Any], y: list[Any]) -> dict[str, Any]:
    return {"users": ["u"], "num_samples": [len(y)], "user_data": {"u": {"x": x, "y": y}}}


REAL_FORMATS = {  # LEAF's three formats, as its scripts write them (json.dump: ASCII, ", " and ": " separators)
    "femnist, mostly 1.0": _leaf_doc([[1.0] * 700 + [0.5019607843137255] * 84] * 60, [3] * 60),
    "femnist, compact 0.0": _leaf_doc([[0.0] * 784] * 60, [3] * 60),
    "shakespeare": _leaf_doc(['to be, or not to be, "that" is\nthe question: whether \'tis nobler in the mind'] * 2000,
                             ["s"] * 2000),
    "sent140": _leaf_doc([["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user",
                           "@switchfoot http://twitpic.com/2y1zl - Awww, that\u2019s a bummer. \U0001f600"]] * 2000,
                         [0] * 2000),
}
ADVERSARIAL = {
    "empty lists": "[" + ",".join(["[]"] * 100_000) + "]",
    "empty objects": "[" + ",".join(["{}"] * 100_000) + "]",
    "distinct keys": "{" + ",".join(f'"{i}":{{}}' for i in range(50_000)) + "}",
    "nested singletons": "[" + ",".join(["[[0]]"] * 50_000) + "]",
    "floats": "[" + ",".join(["0.0"] * 100_000) + "]",
    "long integers": "[" + ",".join(["9" * 4000] * 100) + "]",
    "astral escapes": "[" + ",".join(['"\\ud83d\\ude00"'] * 50_000) + "]",
    "one wide string": '["' + "a" * 1_000_000 + '\U0001f600"]',
}


@pytest.mark.parametrize("name", [*REAL_FORMATS, *ADVERSARIAL])
def test_the_parse_estimate_bounds_what_json_allocates(tmp_path: Path, name: str) -> None:
    """The scan's estimate is at least what ``json.loads`` of the decoded file allocated (tracemalloc's peak) — with
    the reader's hook that refuses a repeated key, which holds each object's pairs and its dict at once — on LEAF's
    three formats and on the shapes ``json`` expands most; LEAF's formats are estimated at most 14 × their size,
    within EXPANSION (16)."""
    compact = name == "femnist, compact 0.0"
    text = ADVERSARIAL[name] if name in ADVERSARIAL else json.dumps(
        REAL_FORMATS[name], separators=(",", ":") if compact else None)
    path = tmp_path / "f.json"
    path.write_bytes(text.encode())
    cost = jsonscan.scan(path, 10**9, 10**6)
    tracemalloc.start()
    try:
        json.loads(path.read_bytes().decode("utf-8"), object_pairs_hook=leaf._unique)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cost.estimate() >= peak, (cost, peak)
    if name in REAL_FORMATS:
        assert cost.estimate() <= 14 * cost.size < leaf.EXPANSION * cost.size
        assert leaf.read_leaf_json(path) == REAL_FORMATS[name]


def test_the_scan_tokenises_as_json_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200 random documents (escaped quotes and backslashes, non-ASCII and astral characters, both separators),
    scanned in chunks of 1 to 64 bytes and of 1 MiB: the scan finds exactly json's strings and their lengths in
    bytes, whatever the chunk boundaries cut."""
    r = random.Random(0)

    def value(depth: int = 0) -> Any:
        k = r.random()
        if depth > 4 or k < 0.3:
            return r.choice([1, -2.5, True, None, 'a"b\\', '\\\\"', "x" * r.randint(0, 9), "é\u2028😀", 10**20])
        if k < 0.65:
            return [value(depth + 1) for _ in range(r.randint(0, 4))]
        return {f'k\\{i}"': value(depth + 1) for i in range(r.randint(0, 4))}

    def strings(v: Any) -> list[str]:
        if isinstance(v, str):
            return [v]
        if isinstance(v, list):
            return [s for x in v for s in strings(x)]
        if isinstance(v, dict):
            return [s for k, x in v.items() for s in (k, *strings(x))]
        return []

    path = tmp_path / "f.json"
    for _ in range(200):
        doc, ascii_only = value(), r.random() < 0.5
        path.write_bytes(json.dumps(doc, ensure_ascii=ascii_only, separators=r.choice([(",", ":"), (", ", ": ")]))
                         .encode())
        monkeypatch.setattr(jsonscan, "CHUNK", r.choice([1, 2, 3, 7, 64, 1 << 20]))
        cost = jsonscan.scan(path, 10**9, 100)
        found = strings(doc)
        assert cost.strings == len(found)
        assert cost.string_bytes == sum(len(json.dumps(s, ensure_ascii=ascii_only).encode()) - 2 for s in found)


def _leaf_file(folder: Path, doc: Any, name: str = "a.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return folder / name


@pytest.mark.parametrize(("doc", "field", "says"), [
    ({"users": "u", "user_data": {}}, "users", "allowed: a list of user names"),
    ({"users": ["a", "a"], "user_data": {"a": {"x": [], "y": []}}}, "users[1]", "a duplicate"),
    ({"users": [7], "user_data": {}}, "users[0]", "a int"),
    ({"users": ["a"], "user_data": []}, "user_data", "allowed: an object"),
    ({"users": ["a"], "num_samples": [1, 2], "user_data": {"a": {"x": [], "y": []}}}, "num_samples", "2 counts"),
    ({"users": ["a"], "num_samples": [True], "user_data": {"a": {"x": [[0.0] * 784], "y": [1]}}}, "num_samples[0]",
     "num_samples says True"),
    ({"users": ["a"], "user_data": {"a": {"x": [1], "y": [1, 2]}}}, 'user_data["a"]', "1 inputs but 2 labels"),
    ({"users": ["a"], "user_data": {"a": {"x": [1]}}}, 'user_data["a"]', "expected user_data"),
])
def test_leaf_structure_errors_name_the_file_and_the_field(tmp_path: Path, doc: Any, field: str, says: str) -> None:
    path = _leaf_file(tmp_path / "train", doc)
    with pytest.raises(DataFormatError) as info:
        leaf.read_leaf_dir(tmp_path / "train")
    assert info.value.path == str(path) and info.value.field == field and says in str(info.value)
    assert str(info.value).startswith(f"{path}: {field}: ") and "\n" not in str(info.value)


def test_a_bad_sample_names_its_file_user_and_index(tmp_path: Path) -> None:
    """A FEMNIST pixel outside [0, 1] in the second file names that file, the user and the sample within it."""
    good = {"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": [[0.0] * 784], "y": [1]}}}
    bad_rows = [[0.0] * 784, [0.0] * 783 + [1.5]]
    bad = {"users": ["a", "b"], "num_samples": [1, 2],
           "user_data": {"a": {"x": [[0.0] * 784], "y": [1]}, "b": {"x": bad_rows, "y": [2, 3]}}}
    _leaf_file(tmp_path / "train", good, "1.json")
    second = _leaf_file(tmp_path / "train", bad, "2.json")
    split = leaf.read_leaf_dir(tmp_path / "train")
    with pytest.raises(DataFormatError) as info:
        leaf.femnist_pixels(split, str(tmp_path / "train"))
    assert info.value.path == str(second) and info.value.field == 'user_data["b"].x[1]'
    assert "[0, 1]" in str(info.value)
    split.y[2] = 99
    split.x[3][-1] = 0.5
    with pytest.raises(DataFormatError, match=r'user_data\["b"\]\.y\[0\]: FEMNIST labels must lie in 0\.\.61'):
        leaf.femnist_pixels(split, str(tmp_path / "train"))


def test_a_mangled_leaf_file_is_read_or_one_line(tmp_path: Path) -> None:
    """1,000 random edits of LEAF files of the three formats (brackets, quotes, escapes, digits, any byte), read
    and turned into each format's arrays: data or a one-line DataFormatError, never another exception."""
    from phalanx.data import loaders

    docs = [json.dumps(_leaf_doc([[0.5] * 784, [1.0] * 784], [2, 3])).encode(),
            json.dumps(_leaf_doc(["to be or not", 'x"y\\'], ["a", "b"])).encode(),
            json.dumps(_leaf_doc([["1", "d", "q", "u", "hi \u00e9"]], [1]), ensure_ascii=False).encode()]
    r = random.Random(2)
    folder = tmp_path / "train"
    for _ in range(1000):
        _leaf_file(folder, _mangled(r, r.choice(docs), b'[]{}",:\\0123456789.eE-tfn ').decode("latin-1"))
        try:
            split = leaf.read_leaf_dir(folder)
            for name in loaders.LEAF_SETS:
                try:
                    loaders._leaf_arrays(name, split, str(folder))
                except DataFormatError as exc:
                    assert "\n" not in str(exc)
        except DataFormatError as exc:
            assert "\n" not in str(exc)


def test_a_lone_surrogate_in_a_text_is_a_character_like_any_other(tmp_path: Path) -> None:
    """JSON may escape a lone surrogate (``"\\ud800"``); it is one character outside LEAF's letters (code OOV),
    not a UnicodeEncodeError."""
    _leaf_file(tmp_path / "train", '{"users": ["r"], "user_data": {"r": {"x": ["ab\\ud800"], "y": ["c"]}}}')
    split = leaf.read_leaf_dir(tmp_path / "train")
    codes = leaf.encode_text(leaf.shakespeare_text(split, "here"), 4, "here")
    assert codes.tolist() == [[leaf.LEAF_LETTERS.index(" "), leaf.LEAF_LETTERS.index("a"),
                               leaf.LEAF_LETTERS.index("b"), leaf.OOV]]


# ------------------------------------------------------------------------------------------- through a run config


def test_a_bad_data_file_names_the_file_not_model_params(tmp_path: Path) -> None:
    """A run whose MNIST file lies is refused by the grid's check with the file's error (before, the check turned
    every ValueError into ``model_params=…``)."""
    from phalanx.experiments import make_config
    from phalanx.experiments.build import check_points

    folder = tmp_path / "mnist"
    folder.mkdir()
    for stem, shape in (("train-images-idx3-ubyte", (20, 28, 28)), ("train-labels-idx1-ubyte", (20,)),
                        ("t10k-images-idx3-ubyte", (5, 28, 28)), ("t10k-labels-idx1-ubyte", (5,))):
        (folder / f"{stem}.gz").write_bytes(gzip.compress(idx_header(shape) + bytes(int(np.prod(shape)))))
    lying = folder / "train-labels-idx1-ubyte.gz"
    lying.write_bytes(gzip.compress(idx_header((20,)) + bytes(21)))
    cfg = make_config({"dataset": "mnist", "data_root": str(folder), "workers": 2, "rounds": 1, "model": "logreg"})
    with pytest.raises(DataFormatError) as info:
        check_points([cfg])
    assert isinstance(info.value, PhalanxError) and info.value.path == str(lying)
    assert "model_params" not in str(info.value) and "more than 28 bytes, expected 28" in str(info.value)


def test_data_format_error_is_one_line_and_pickles() -> None:
    err = DataFormatError("/d/f.json", "bad\nthing", field="users[0]", allowed="strings")
    assert str(err) == "/d/f.json: users[0]: bad thing (allowed: strings)"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is DataFormatError and str(back) == str(err) and back.__dict__ == err.__dict__
