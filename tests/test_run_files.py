"""Hostile files in a run directory (phalanx.experiments.runfiles): a manifest, config.json, metrics.jsonl, signature
bundle or checkpoint header that is huge, nested deeply, malformed or lies about sizes is one line naming the file,
read with bounded memory.

Each case runs in a fresh process that imports everything first, then reads the file; its peak resident memory
(``getrusage``'s ``ru_maxrss``) may grow by at most :data:`BOUND` — far below what the file claims (1 GiB, or a
header of 1 TiB), so a reader that believed the file would fail the test. Huge files are sparse (no disk used).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

import _rundirs
from _rundirs import legacy
from phalanx.errors import ConfigError, IntegrityError
from phalanx.experiments import provenance, runfiles, store

ROOT = Path(__file__).resolve().parent.parent
BOUND_MIB = 64
"""How much the reading process's peak memory may grow (a line of metrics.jsonl may be 1 MiB; read once)."""
CLAIM = 1 << 30
"""What a huge file claims (its size): 16 times the bound."""


finished = _rundirs.finished  # a finished run to copy and attack (a fixture)


def _sparse(path: Path, size: int, head: bytes = b"") -> None:
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _header(path: Path, table: dict[str, Any], data: int = 0, length: int | None = None) -> None:
    raw = json.dumps(table).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw) if length is None else length) + raw)
        fh.truncate(8 + len(raw) + data)


def _ckpt_meta(d: Path, meta: dict[str, str]) -> None:
    path = d / "checkpoint.safetensors"
    save_file(load_file(str(path)), str(path), metadata={**runfiles.checkpoint_header(path).metadata, **meta})


CASES: dict[str, tuple[Any, str, str, str]] = {
    # name: (make it hostile, the file it names, what the line says, the call that reads it)
    "manifest.json of 1 GiB": (lambda d: _sparse(d / "manifest.json", CLAIM), "manifest.json", "not read",
                               "store.verify(d, ('config.json',))"),
    "manifest.json nested 3 million deep": (lambda d: (d / "manifest.json").write_bytes(_nested(1_500_000)),
                                            "manifest.json", "nested too deeply", "store.verify(d, ('config.json',))"),
    "manifest.json with artifacts that are not digests": (
        lambda d: (d / "manifest.json").write_text(json.dumps({"integrity": 1, "artifacts": [1, 2]})),
        "manifest.json", "not a map", "store.verify(d, ('config.json',))"),
    "config.json of 1 GiB": (lambda d: (legacy(d), _sparse(d / "config.json", CLAIM)), "config.json", "not read",
                             "store.check_identity(d, {})"),
    "config.json nested 3 million deep": (
        lambda d: (legacy(d), (d / "config.json").write_bytes(_nested(1_500_000))), "config.json",
        "nested too deeply", "store.check_identity(d, {})"),
    "metrics.jsonl: one line of 1 GiB": (lambda d: (legacy(d), _sparse(d / "metrics.jsonl", CLAIM, b'{"round": ')),
                                         "metrics.jsonl", "longer than", "store.read_rows(d)"),
    "metrics.jsonl: a row nested 400,000 deep (within the line's 1 MiB)": (
        lambda d: (legacy(d), (d / "metrics.jsonl").write_bytes(_nested(400_000) + b"\n")), "metrics.jsonl",
        "more { and [ than a metric row can", "store.read_rows(d)"),
    "metrics.jsonl of 5 GiB": (lambda d: (legacy(d), _sparse(d / "metrics.jsonl", 5 << 30)), "metrics.jsonl",
                               "not read", "store.read_rows(d)"),
    "phalanx.sig of 1 GiB": (lambda d: _sparse(d / "phalanx.sig", CLAIM), "phalanx.sig", "not read",
                             "signing.verify(d, KEY)"),
    "phalanx.sig nested 1 million deep": (lambda d: (d / "phalanx.sig").write_bytes(_nested(1_000_000)),
                                          "phalanx.sig", "not a readable", "signing.verify(d, KEY)"),
    "checkpoint header claiming 1 TiB": (
        lambda d: (legacy(d), _header(d / "checkpoint.safetensors", {}, length=1 << 40)), "checkpoint.safetensors",
        "lies about sizes", "store.open_checkpoint(d)"),
    "checkpoint header of 64 MiB (a sparse file that holds it)": (
        lambda d: (legacy(d), _sparse(d / "checkpoint.safetensors", 8 + (64 << 20), struct.pack("<Q", 64 << 20))),
        "checkpoint.safetensors", "more than the 8,388,608", "store.open_checkpoint(d)"),
    "checkpoint tensor claiming 2^40 floats": (
        lambda d: (legacy(d), _header(d / "checkpoint.safetensors", {"theta": {
            "dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 4 << 40]}}, data=16)),
        "checkpoint.safetensors", "lies about sizes", "store.open_checkpoint(d)"),
    "checkpoint tensors overlapping": (
        lambda d: (legacy(d), _header(d / "checkpoint.safetensors", {
            "theta": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "momentum": {"dtype": "F32", "shape": [1, 4], "data_offsets": [0, 16]}}, data=16)),
        "checkpoint.safetensors", "overlap", "store.open_checkpoint(d)"),
    "checkpoint header nested 1 million deep": (
        lambda d: (legacy(d), (d / "checkpoint.safetensors").write_bytes(struct.pack("<Q", 2_000_000)
                                                                          + _nested(1_000_000))),
        "checkpoint.safetensors", "nested too deeply", "store.open_checkpoint(d)"),
    "checkpoint with 5,000 provenance entries": (
        lambda d: (legacy(d), _ckpt_meta(d, {provenance.KEY: json.dumps([{"statement": "{}", "bundle": None}]
                                                                          * 5000)})),
        "checkpoint.safetensors", "not a list of 1 to 1024", "provenance.inspect(d, KEY)"),
    "checkpoint with a provenance statement of 1 MiB": (
        lambda d: (legacy(d), _ckpt_meta(d, {provenance.KEY: json.dumps([{"statement": "x" * (1 << 20),
                                                                            "bundle": None}])})),
        "checkpoint.safetensors", "over 16,384 bytes", "provenance.inspect(d, KEY)"),
}

PROBE = """
import json, resource, sys
from pathlib import Path
from phalanx import signing
from phalanx.errors import PhalanxError
from phalanx.experiments import provenance, store
signing.require()
import model_signing.verifying, model_signing.hashing  # imported before the baseline, as the reader's own imports
d, KEY = Path(sys.argv[1]), Path(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    CALL
    said = "no error"
except PhalanxError as exc:
    said = str(exc)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"said": said, "grown_kib": grown}))
"""


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_file_is_one_line_naming_it_read_with_bounded_memory(case: str, finished: Path,
                                                                     tmp_path: Path) -> None:
    pytest.importorskip("model_signing")
    from phalanx import signing

    make, name, needle, call = CASES[case]
    d = Path(shutil.copytree(finished, tmp_path / "run"))
    _, pub = signing.keygen(tmp_path / "k.pem", tmp_path / "k.pub")
    make(d)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PROBE.replace("CALL", call), str(d), str(pub)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    said = out["said"]
    assert "\n" not in said and str(d) in said and name in said and needle in said, said
    assert out["grown_kib"] < BOUND_MIB * 1024, f"peak memory grew by {out['grown_kib'] / 1024:.0f} MiB: {said}"


def test_a_fifo_in_place_of_a_recorded_file_is_refused_without_blocking(finished: Path, tmp_path: Path) -> None:
    """A FIFO would block the digest's read forever (and a device never end): refused as not a regular file."""
    d = Path(shutil.copytree(finished, tmp_path / "run"))
    (d / "metrics.parquet").unlink()
    os.mkfifo(d / "metrics.parquet")
    with pytest.raises(ConfigError, match=r"metrics\.parquet.*not a regular file"):
        store.check_finished(d, json.loads((d / "config.json").read_text()))


def test_a_finished_run_whose_files_disagree_with_its_manifest_is_not_skipped_as_done(finished: Path,
                                                                                     tmp_path: Path) -> None:
    d = Path(shutil.copytree(finished, tmp_path / "run"))
    identity = json.loads((d / "config.json").read_text())
    store.check_finished(d, identity)
    (d / "metrics.parquet").write_bytes(b"PAR1 not the rows")
    with pytest.raises(IntegrityError, match=r"metrics\.parquet: changed"):
        store.check_finished(d, identity)
    d2 = Path(shutil.copytree(finished, tmp_path / "run2"))
    manifest = json.loads((d2 / "manifest.json").read_text())
    manifest["seed"] = 5
    (d2 / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match=r"records seed 5, but config\.json says seed 0"):
        store.check_finished(d2, identity)


def test_an_honest_checkpoint_passes_the_header_checks_and_its_digests_agree(finished: Path) -> None:
    """The checks' control: the files Phalanx writes pass, and the tensors' digest is the same streamed from the file
    as computed from the tensors in memory."""
    ckpt = finished / "checkpoint.safetensors"
    header = runfiles.checkpoint_header(ckpt)
    assert set(header.tensors) == set(load_file(str(ckpt)))
    assert runfiles.tensors_digest_of_file(ckpt, header) == runfiles.tensors_digest(load_file(str(ckpt)))
    rows = store.read_rows(finished)
    assert [r["round"] for r in rows] == [0, 2, 4]


def test_markers_and_a_recorded_config_too_large_to_read_are_reported_unreadable(finished: Path,
                                                                                tmp_path: Path) -> None:
    """``phalanx status`` reads FAILED / DIVERGED markers, lock files and config.json tolerantly: one of 1 GiB is
    not read (it would be whole), it is shown as unreadable."""
    from phalanx.experiments import runstate, status

    d = Path(shutil.copytree(finished, tmp_path / "run"))
    _sparse(d / runstate.FAILED, CLAIM)
    assert runstate.failure(d) == {"error": "?", "message": "(unreadable FAILED marker)"}
    _sparse(d / "config.json", CLAIM)
    assert status.recorded_config(d) == {}


def _table(**entries: Any) -> dict[str, Any]:
    return {"theta": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, **entries}


HEADERS: dict[str, tuple[dict[str, Any], int, str]] = {
    # a header that lies or is malformed in one way each: (table, bytes of data, what the refusal says)
    "an unknown dtype": ({"theta": {"dtype": "X99", "shape": [4], "data_offsets": [0, 16]}}, 16, "dtype 'X99'"),
    "a negative size": ({"theta": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, 16, "not a list"),
    "a shape of 9 dimensions": ({"theta": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}, 4,
                                "at most 8 sizes"),
    # 0 elements, so its byte count checks out, but torch.empty raised TypeError: a traceback (an attacker's review)
    "a size of 2**63 beside a 0": (_table(evil={"dtype": "F32", "shape": [0, 2**63], "data_offsets": [16, 16]}), 16,
                                   "below 2**63"),
    "offsets that are not a pair": ({"theta": {"dtype": "F32", "shape": [4], "data_offsets": [0]}}, 16,
                                    "not [begin, end]"),
    "a size that is not its shape's": ({"theta": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}, 16,
                                       "lies about sizes"),
    "a gap between tensors": (_table(momentum={"dtype": "F32", "shape": [1, 4], "data_offsets": [20, 36]}), 36,
                              "gaps"),
    "data no tensor covers": (_table(), 32, "cover 16 bytes of the 32"),
    "an entry that is not a tensor's": ({"theta": [1, 2]}, 0, "not a tensor's"),
    "metadata of numbers": ({**_table(), "__metadata__": {"round": 4}}, 16, "not a map of text to text"),
    "5,000 tensors": ({f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(5000)},
                      5000, "more than 4,096"),
    "a list, not an object": ([], 0, "not a JSON object"),  # type: ignore[dict-item]
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_every_check_of_a_checkpoint_header_rejects_its_mutant(case: str, tmp_path: Path) -> None:
    table, data, needle = HEADERS[case]
    path = tmp_path / "checkpoint.safetensors"
    _header(path, table, data=data)
    with pytest.raises(ConfigError) as info:
        runfiles.checkpoint_header(path)
    assert needle in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_checkpoint_beyond_the_runs_last_round_and_too_many_rows_are_refused(
        finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = Path(shutil.copytree(finished, tmp_path / "run"))
    legacy(d)
    _ckpt_meta(d, {"round": "99"})
    with pytest.raises(ConfigError, match=r"round 99, outside 0 … 4"):
        store.open_checkpoint(d, rounds=4)
    monkeypatch.setattr(store, "MAX_ROWS", 1)
    with pytest.raises(ConfigError, match="more than 2 metric rows"):
        store.read_rows(d)


def _swap_in_hostile(ckpt: Path) -> None:
    """A valid safetensors file of one 256 MiB tensor (sparse: no disk used) renamed over ``ckpt``."""
    size = 256 << 20
    table = json.dumps({"theta": {"dtype": "F32", "shape": [size // 4], "data_offsets": [0, size]}}).encode()
    hostile = ckpt.with_name("hostile.safetensors")
    _sparse(hostile, 8 + len(table) + size, struct.pack("<Q", len(table)) + table)
    os.replace(hostile, ckpt)


def _rewrite_last_byte(ckpt: Path) -> None:
    with open(ckpt, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 0xFF]))


@pytest.mark.parametrize("attack", [_swap_in_hostile, _rewrite_last_byte], ids=["renamed over", "changed in place"])
def test_a_checkpoint_changed_after_its_checks_is_never_the_one_loaded(
        attack: Any, finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint is hashed, its header checked and its tensors read from one descriptor: a file renamed over it
    right after the header check (an attacker racing the reader; here the race is won deterministically) is never
    read, and one changed in place is refused by the digest of the bytes read. Before, it was opened by name three
    times and the swapped-in file was loaded unchecked (256 MiB of memory for a file the header check never saw)."""
    import resource

    d = Path(shutil.copytree(finished, tmp_path / "run"))
    ckpt = d / "checkpoint.safetensors"
    genuine = store.open_checkpoint(d)
    assert genuine is not None
    real = runfiles.checkpoint_header

    def checked_then_attacked(path: Path, *args: Any, **kwargs: Any) -> runfiles.Header:
        header = real(path, *args, **kwargs)
        if Path(path) == ckpt:
            monkeypatch.setattr(runfiles, "checkpoint_header", real)  # once
            attack(ckpt)
        return header

    monkeypatch.setattr(runfiles, "checkpoint_header", checked_then_attacked)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        loaded = store.open_checkpoint(d)
    except (ConfigError, IntegrityError) as exc:
        assert "\n" not in str(exc) and str(ckpt) in str(exc), str(exc)
    else:
        assert loaded is not None and loaded.tensors == genuine.tensors, "a file other than the checked one loaded"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < BOUND_MIB * 1024


def test_a_file_that_grows_between_its_stat_and_its_read_is_refused_having_read_no_more_than_its_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_bounded`` sizes a file, then reads at most its cap + 1 bytes and checks again: a file that grew after
    the stat (here the stat is made to see 0 bytes of a file of 16 MiB, capped at 1 MiB) is one line naming it, and
    the read allocated about the cap, not the file (traced: under 2 MiB)."""
    import tracemalloc

    path = tmp_path / "config.json"
    path.write_bytes(b" " * (16 << 20))
    monkeypatch.setattr(runfiles, "size_of", lambda *args, **kwargs: 0)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as info:
            runfiles.read_bounded(path, 1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(path) in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert peak < 2 << 20, f"the read allocated {peak / (1 << 20):.1f} MiB"
