"""A data file is read from one descriptor, checked to be a regular file, within an absolute cap, and re-read only if
it is still the file first read: an attacker's review swapped a LEAF file between its scan and its parse (a FIFO
blocked for ever, a link to /dev/zero ran out of memory, a huge string passed), rewrote a LEAF file under a lazy
population (an IndexError in round N, or silently other data), and planted a sparse IDX file whose header matches its
size (3 × 10^9 values: a MemoryError traceback). Each is now one line naming the file (docs/data.md, docs/security.md).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from phalanx.data import idx, jsonscan, leaf
from phalanx.data.base import DataFormatError

SRC = Path(__file__).resolve().parent.parent / "src"


def _doc(users: list[str]) -> dict[str, Any]:
    return {"users": users, "num_samples": [1] * len(users),
            "user_data": {u: {"x": [[0.5] * 784], "y": [i % 62]} for i, u in enumerate(users)}}


CHILD_TIMEOUT_S = 300.0
"""How long a child Python may take (it imports torch first: 25–30 s at load 16–20, a flaky-test review); a read
blocked on a FIFO never returns, so any bound finds it."""


def _python(code: str, timeout: float = CHILD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``code`` run in a child Python (killed if it outlives ``timeout``: a read blocked on a FIFO fails the test, it
    does not hang it)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still blocked after {timeout:g} s")


def test_a_leaf_file_swapped_after_its_scan_is_not_the_one_parsed(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan and the parse see the same bytes: the file replaced by another right after the scan (as an attacker
    racing the reader would) changes nothing of what is parsed."""
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_doc(["honest"])))
    real = jsonscan.scan

    def scan_then_swap(*args: Any, **kw: Any) -> jsonscan.JsonCost:
        cost = real(*args, **kw)
        path.unlink()
        path.write_text(json.dumps(_doc(["swapped"])))
        return cost

    monkeypatch.setattr(leaf.jsonscan, "scan", scan_then_swap)
    assert leaf.read_leaf_json(path)["users"] == ["honest"]


def _fifo_and_device_refused(fifo: Path, zero: Path, reader: str, call: str) -> None:
    """A FIFO at ``fifo`` and a link to /dev/zero at ``zero``, each read by ``call`` (on ``p``, after ``reader``) in
    a child Python: each must be one DataFormatError line saying it is not a regular file, without blocking."""
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    code = (f"from pathlib import Path; {reader}\n"
            f"for p in {[str(fifo), str(zero)]!r}:\n"
            f"    try: {call}\n"
            "    except Exception as e: print(type(e).__name__, e)\n")
    run = _python(code)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and len(lines) == 2, (run.stdout, run.stderr[-2000:])
    for line, p in zip(lines, (fifo, zero)):
        assert line.startswith(f"DataFormatError {p}: not a regular file"), line


def test_a_fifo_or_a_device_in_place_of_a_leaf_file_is_refused_without_blocking(tmp_path: Path) -> None:
    _fifo_and_device_refused(tmp_path / "fifo.json", tmp_path / "zero.json", "from phalanx.data import leaf",
                             "leaf.read_leaf_json(Path(p))")


def test_a_leaf_file_over_the_cap_is_refused_from_its_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leaf, "MAX_FILE_BYTES", 4096)
    path = tmp_path / "sparse.json"
    with open(path, "wb") as fh:
        fh.truncate(4097)
    with pytest.raises(DataFormatError) as caught:
        leaf.read_leaf_json(path)
    assert str(caught.value) == f"{path}: 4,097 bytes, more than the 4,096 such a file may have (not read)"


def test_out_of_memory_while_parsing_a_leaf_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_doc(["u"])))

    def no_memory(*args: Any, **kw: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(leaf.json, "loads", no_memory)
    with pytest.raises(DataFormatError, match=r"not enough memory to parse its [\d,]+ bytes") as caught:
        leaf.read_leaf_json(path)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


def test_a_sparse_idx_file_declaring_gigabytes_is_refused_before_allocating(tmp_path: Path) -> None:
    """3 × 10^9 uint8 values declared by a sparse file of that size (a few KiB on disk), read under a 2 GiB address
    space: refused from its header, not a MemoryError traceback."""
    path = tmp_path / "sparse-idx3-ubyte"
    with open(path, "wb") as fh:
        fh.write(struct.pack(">HBB3I", 0, 0x08, 3, 3000, 1000, 1000))
        fh.truncate(16 + 3_000_000_000)
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from phalanx.data.idx import read_idx\n"
            "try: read_idx(sys.argv[1])\n"
            "except Exception as e: print(type(e).__name__, e)\n")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0 and run.stdout.count("\n") == 1, (run.stdout, run.stderr[-2000:])
    assert run.stdout.startswith(f"DataFormatError {path}: the header declares an array of shape (3000, 1000, 1000) "
                                 "of uint8 (3,000,000,000 bytes) (allowed: arrays of at most 2,147,483,648 bytes"), \
        run.stdout


def test_out_of_memory_while_reading_an_idx_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "labels-idx1-ubyte"
    path.write_bytes(struct.pack(">HBBI", 0, 0x08, 1, 4) + bytes(4))

    def no_memory(*args: Any, **kw: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(idx, "read_exactly", no_memory)
    with pytest.raises(DataFormatError) as caught:
        idx.read_idx(path)
    assert str(caught.value) == f"{path}: not enough memory for an array of shape (4,) of uint8 (4 bytes)"


def test_a_fifo_in_place_of_an_idx_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "train-labels-idx1-ubyte"
    os.mkfifo(fifo)
    code = ("import sys; from phalanx.data.idx import read_idx\n"
            "try: read_idx(sys.argv[1])\n"
            "except Exception as e: print(type(e).__name__, e)\n")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    try:
        run = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True,
                             timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still blocked on the FIFO after {CHILD_TIMEOUT_S:g} s")
    assert run.stdout == f"DataFormatError {fifo}: not a regular file\n", (run.stdout, run.stderr[-2000:])


def _population(root: Path, users: list[str]) -> Path:
    for split in ("train", "test"):
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / "a.json").write_text(json.dumps(_doc(users)))
    return root / "train" / "a.json"


@pytest.mark.parametrize("rewrite", [["w0"], ["x0", "x1", "x2"]], ids=["fewer-writers", "same-count-other-data"])
def test_a_leaf_file_rewritten_under_a_lazy_population_is_refused_in_one_line(tmp_path: Path,
                                                                              rewrite: list[str]) -> None:
    """A ``train/`` file rewritten after the population opened: with fewer writers it was an IndexError traceback at
    the next request, with as many it silently gave other data; either is now one line naming the file."""
    from phalanx.data.leaf_population import LeafPopulation

    train = _population(tmp_path, ["w0", "w1", "w2"])
    pop = LeafPopulation(tmp_path, eval_clients=1)
    assert [x.shape[0] for x, _ in pop.clients([2])] == [1]
    train.write_text(json.dumps(_doc(rewrite)))
    with pytest.raises(DataFormatError) as caught:
        pop.clients([2])
    message = str(caught.value)
    assert message.startswith(f"{train}: changed since the population opened (SHA-256 ") and "\n" not in message


def test_a_fifo_or_a_device_in_place_of_a_cifar_batch_is_refused_without_blocking(tmp_path: Path) -> None:
    """A CIFAR-10 batch was sized by name and opened by name again: a FIFO put in its place blocked the read for
    ever (a later review of the fixes above). Now one descriptor, as for LEAF and IDX."""
    _fifo_and_device_refused(tmp_path / "data_batch_1", tmp_path / "test_batch", "from phalanx.data import cifar",
                             "cifar.read_pickle(p)")
