"""A co-user of a shared ``runs/`` folder plants links, FIFOs and malformed files where Phalanx writes and reads
(review38, findings 2, 4, 6, 7 and 8): each plant is refused in one line naming the path, or read as empty, and never
writes through a link, blocks or ends in a traceback. Each check has its mutant (the code before the fix), shown to
let the attack through.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import _rundirs
from _rundirs import legacy, one_line
from phalanx.errors import ConfigError, IntegrityError, OutputError, PhalanxError
from phalanx.experiments import make_config, provenance, runfiles, runstate, status, store, train

BIG = b"9" * 5000
"""An integer of 5,000 digits: more than Python converts (``sys.get_int_max_str_digits()``, 4,300)."""
VICTIM = b"VICTIM PRIVATE DATA\n"


finished = _rundirs.finished  # a finished run to copy and attack (a fixture)


# -- finding 2: a link planted where a lock or a run directory goes ---------------------------------------------------

def _plant(kind: str, lock: Path, victim: Path) -> None:
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "hard link":
        os.link(victim, lock)
    else:
        os.mkfifo(lock)


@pytest.mark.parametrize("kind", ["symlink", "hard link", "FIFO"])
def test_a_lock_planted_as_a_link_or_fifo_is_refused_and_the_file_it_names_is_left_intact(kind: str,
                                                                                          tmp_path: Path) -> None:
    victim = tmp_path / "victim" / "important.txt"
    victim.parent.mkdir()
    victim.write_bytes(VICTIM)
    run, out = tmp_path / "runs" / "r", tmp_path / "runs"
    run.mkdir(parents=True)
    _plant(kind, run / runstate.LOCK, victim)
    with pytest.raises(OutputError) as caught, runstate.locked(run):
        pass
    one_line(caught.value, str(run / runstate.LOCK))
    (out / ".grid.lock").unlink(missing_ok=True)
    _plant(kind, out / ".grid.lock", victim)
    with pytest.raises(OutputError) as caught:
        status.record_grid(out, [run], "local")
    one_line(caught.value, ".grid.lock")
    assert victim.read_bytes() == VICTIM


def test_the_mutant_lock_open_follows_the_link_and_truncates_its_target(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The open before the fix (``O_RDWR | O_CREAT``, no ``O_NOFOLLOW``, no ``fstat``): the plant of the test above
    overwrites the victim's file with the holder record."""
    victim = tmp_path / "important.txt"
    victim.write_bytes(VICTIM)
    run = tmp_path / "r"
    run.mkdir()
    (run / runstate.LOCK).symlink_to(victim)
    monkeypatch.setattr(store, "open_lock", lambda path: os.open(path, os.O_RDWR | os.O_CREAT, 0o666))
    with runstate.locked(run):
        pass
    assert victim.read_bytes() != VICTIM and b'"pid"' in victim.read_bytes()


def test_a_run_directory_planted_as_a_symlink_is_refused_and_its_target_left_intact(tmp_path: Path) -> None:
    victim = tmp_path / "victim2"
    victim.mkdir()
    (victim / "manifest.json").write_text('{"victim": "manifest of another tool"}')
    (tmp_path / "sd").mkdir()
    run = tmp_path / "sd" / "run"
    run.symlink_to(victim)
    cfg = make_config({"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 2})
    with pytest.raises(OutputError) as caught:
        train(cfg, run)
    one_line(caught.value, str(run), "symbolic link")
    with pytest.raises(OutputError):
        store.prepare_run_dir(run, {}, 0, "")
    assert sorted(p.name for p in victim.iterdir()) == ["manifest.json"]
    assert (victim / "manifest.json").read_text() == '{"victim": "manifest of another tool"}'


def test_the_mutant_make_run_dir_writes_into_the_link_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the link check (plain ``make_dir``), the run's files land in the directory the link names."""
    victim = tmp_path / "victim2"
    victim.mkdir()
    run = tmp_path / "run"
    run.symlink_to(victim)
    monkeypatch.setattr(store, "make_run_dir", store.make_dir)
    store.prepare_run_dir(run, {"x": 1}, 0, "")
    assert (victim / "config.json").exists()


# -- finding 6: integers of more than 4,300 digits --------------------------------------------------------------------

def _statement_with_big_segment(d: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = d / "checkpoint.safetensors"
    meta = runfiles.checkpoint_header(path).metadata
    statement = '{"segment": ' + BIG.decode() + "}"
    save_file(load_file(str(path)), str(path),
              metadata={**meta, provenance.KEY: json.dumps([{"statement": statement, "bundle": None}])})


BIG_CASES: dict[str, tuple[Any, str, Any]] = {
    # plant: (make it, the file the line names, the call that reads it)
    "manifest.json": (lambda d: (d / "manifest.json").write_bytes(b'{"integrity": 1, "seed": ' + BIG + b"}"),
                      "manifest.json", lambda d: store.verify(d, ("config.json",))),
    "config.json": (lambda d: (legacy(d), (d / "config.json").write_bytes(b'{"eval_every": ' + BIG + b"}")),
                    "config.json", lambda d: store.check_identity(d, {})),
    "metrics.jsonl": (lambda d: (legacy(d), open(d / "metrics.jsonl", "ab").write(b'{"round": ' + BIG + b"}\n")),
                      "metrics.jsonl", lambda d: store.read_rows(d)),
    "checkpoint provenance statement": (lambda d: (legacy(d), _statement_with_big_segment(d)),
                                        "checkpoint.safetensors", lambda d: provenance.read_chain(
                                            d / "checkpoint.safetensors", runfiles.checkpoint_header(
                                                d / "checkpoint.safetensors").metadata)),
}


@pytest.mark.parametrize("case", list(BIG_CASES))
def test_an_integer_of_5000_digits_is_one_line_naming_the_file(case: str, finished: Path, tmp_path: Path) -> None:
    make, name, call = BIG_CASES[case]
    d = Path(shutil.copytree(finished, tmp_path / "run"))
    make(d)
    with pytest.raises((ConfigError, IntegrityError)) as caught:
        call(d)
    one_line(caught.value, str(d), name)
    assert "too long" in str(caught.value)


def test_the_mutant_json_reader_lets_the_long_number_through_as_a_traceback(finished: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``except`` list before the fix (no plain ``ValueError``): the same plant is a ``ValueError``, not one of
    Phalanx's one-line errors."""
    def mutant(path: Path, raw: bytes) -> Any:
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise runfiles.damaged(path, "not JSON") from None

    monkeypatch.setattr(runfiles, "loads", mutant)
    d = Path(shutil.copytree(finished, tmp_path / "run"))
    BIG_CASES["config.json"][0](d)
    with pytest.raises(ValueError) as caught:
        store.check_identity(d, {})
    assert not isinstance(caught.value, PhalanxError)


# -- findings 7 and 8: grid.json, and what `phalanx status` reads ----------------------------------------------------

GRIDS: dict[str, Any] = {
    "nested 100,000 deep": lambda p: p.write_bytes(b"[" * 100_000),
    "runs not a list": lambda p: p.write_text('{"runs": 5}'),
    "runs of objects, slurm_jobs a number": lambda p: p.write_text('{"runs": [{}], "slurm_jobs": 3}'),
    "slurm_jobs of junk entries": lambda p: p.write_text('{"slurm_jobs": [{}, {"job": "1", "runs": [[3]]}, 4]}'),
    "a FIFO": os.mkfifo,
    "a run named ../other": lambda p: p.write_text('{"runs": ["../other", "/etc"]}'),
    "1 GiB": lambda p: (open(p, "wb").truncate(1 << 30)),
    "a number of 5,000 digits": lambda p: p.write_bytes(b'{"runs": [], "n": ' + BIG + b"}"),
}


@pytest.mark.parametrize("case", list(GRIDS))
def test_a_hostile_grid_json_is_read_as_empty_by_status_and_run(case: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "r1").mkdir(parents=True)
    (out / "r1" / "config.json").write_text("{}")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text("{}")
    GRIDS[case](out / status.GRID)
    assert status.read_grid(out)["runs"] == [] and status.read_grid(out)["slurm_jobs"] == []
    assert [r.run for r in status.grid_status(out)] == ["r1"]  # `phalanx status`
    from phalanx.experiments import slurm

    assert slurm.queued_runs(out) == {}  # the Slurm watcher's and status's view of the queue: nothing recorded
    if case != "a FIFO":  # `phalanx run` records its grid (a FIFO is not replaced: refused below)
        status.record_grid(out, [out / "r2"], "local")
        assert status.read_grid(out)["runs"] == ["r2"]


def test_the_mutant_read_grid_is_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_grid`` before the fix (an unbounded read, the shape trusted): wrong types are a ``TypeError``."""
    def mutant(out: Path) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((Path(out) / status.GRID).read_text())
        data.setdefault("runs", [])
        data.setdefault("slurm_jobs", [])
        return data

    monkeypatch.setattr(status, "read_grid", mutant)
    GRIDS["runs not a list"](tmp_path / status.GRID)
    with pytest.raises(TypeError):
        status.runs_of(tmp_path)


@contextlib.contextmanager
def _held(run: Path) -> Iterator[None]:
    """The run's lock held by another open file description, as another process would."""
    fd = os.open(run / runstate.LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@pytest.mark.parametrize("plant", ["metrics.jsonl a FIFO", ".lock a FIFO", "last row nested 30,000 deep",
                                   "last row with a round of 5,000 digits"])
def test_status_reads_a_planted_fifo_or_hostile_last_row_without_blocking_or_a_traceback(plant: str,
                                                                                       finished: Path,
                                                                                       tmp_path: Path) -> None:
    d = Path(shutil.copytree(finished, tmp_path / "run"))
    (d / "DONE").unlink()  # unfinished: status asks who holds the lock
    if plant == "metrics.jsonl a FIFO":
        (d / "metrics.jsonl").unlink()
        os.mkfifo(d / "metrics.jsonl")
    elif plant == ".lock a FIFO":
        (d / runstate.LOCK).unlink(missing_ok=True)
        os.mkfifo(d / runstate.LOCK)
    elif plant == "last row nested 30,000 deep":
        with open(d / "metrics.jsonl", "ab") as fh:
            fh.write(b"[" * 30_000 + b"]" * 30_000 + b"\n")
    else:
        with open(d / "metrics.jsonl", "ab") as fh:
            fh.write(b'{"round": ' + BIG + b"}\n")
    st = runstate.state(d)
    assert st.status == "stopped"
    assert st.round == (None if plant == "metrics.jsonl a FIFO" else 4)
    assert [r.status for r in status.grid_status(tmp_path)] == ["stopped"]


def test_status_still_sees_an_honest_holder(finished: Path, tmp_path: Path) -> None:
    """The control of the lock checks: a lock Phalanx made, held, is reported as running."""
    d = Path(shutil.copytree(finished, tmp_path / "run"))
    (d / "DONE").unlink()
    with runstate.locked(d):  # made by Phalanx (a regular file), then released
        pass
    with _held(d):
        assert runstate.state(d).status == "running"


# -- finding 4: two crashes in the record→rename window ---------------------------------------------------------------

def _crash_in_window(out: Path, name: str, payload: bytes) -> None:
    """What a SIGKILL between the manifest's record and the rename leaves: the new digest recorded, the old file."""
    store._record(out, name, hashlib.sha256(payload).hexdigest())


@pytest.mark.parametrize("name", ["metrics.jsonl", "checkpoint.safetensors"])
def test_two_crashes_in_the_record_rename_window_leave_a_resumable_file(name: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    store.prepare_run_dir(out, {"x": 1}, 0, "")
    store.write_artifact(out, name, b"M1")
    _crash_in_window(out, name, b"M2")  # session 1 killed: disk M1, manifest {M2, previous M1}
    store.verify(out, (name,))
    _crash_in_window(out, name, b"M2")  # session 2 writes the same M2 (a bit-exact resume), killed again
    store.verify(out, (name,))  # M1 is still recorded
    store.write_artifact(out, name, b"M2")  # session 3 completes
    store.verify(out, (name,))
    with pytest.raises(IntegrityError):  # the control: a file that was never recorded is still refused
        (out / name).write_bytes(b"M3")
        store.verify(out, (name,))


def test_the_mutant_record_keeps_the_recorded_digest_and_the_run_is_unresumable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_record`` before the fix: ``previous`` is the last recorded digest, so the second crash forgets M1."""
    def mutant(out: Path, name: str, digest: str) -> None:
        manifest = store._read_manifest(out)
        artifacts = manifest.setdefault("artifacts", {})
        old = artifacts.get(name, {}).get("sha256")
        artifacts[name] = {"sha256": digest, "previous": old}
        manifest["integrity"] = store.INTEGRITY_VERSION
        store.atomic_write_text(out / store.MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))

    monkeypatch.setattr(store, "_record", mutant)
    out = tmp_path / "run"
    store.prepare_run_dir(out, {"x": 1}, 0, "")
    store.write_artifact(out, "metrics.jsonl", b"M1")
    _crash_in_window(out, "metrics.jsonl", b"M2")
    _crash_in_window(out, "metrics.jsonl", b"M2")
    with pytest.raises(IntegrityError, match="changed or truncated"):
        store.verify(out, ("metrics.jsonl",))
