"""The one atomic write (:mod:`phalanx.files`): old or new content, never torn; no temporary file left; a private
file never readable by others; a planted link replaced, not followed; ``exclusive`` never replaces."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from phalanx import files


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_write_that_fails_midway_leaves_the_old_content_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")

    def torn(fh: BinaryIO) -> None:
        fh.write(b"new, half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        files.write_atomic(path, torn)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_a_plain_open_is_the_mutant_the_check_above_rejects(tmp_path: Path) -> None:
    """The same failure through ``open(path, "wb")`` tears the file: the test above would fail on it."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(OSError), open(path, "wb") as fh:
        fh.write(b"new, half")
        raise OSError(28, "No space left on device")
    assert path.read_bytes() != b"old"


def test_a_private_file_is_never_readable_by_others_not_even_while_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "key"
    seen: list[int] = []
    files.write_atomic(path, b"secret", 0o600, before_replace=lambda tmp: seen.append(_mode(tmp)))
    assert seen == [0o600]
    assert _mode(path) == 0o600


def test_the_default_mode_is_a_plain_opens(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        files.write_atomic(tmp_path / "a", b"x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a") == 0o640


def test_a_link_planted_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    path = tmp_path / "out"
    path.symlink_to(victim)
    files.write_atomic(path, b"new")
    assert victim.read_bytes() == b"untouched"
    assert not path.is_symlink() and path.read_bytes() == b"new"


def test_exclusive_never_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "sig"
    files.write_atomic(path, b"first", exclusive=True)
    with pytest.raises(FileExistsError):
        files.write_atomic(path, b"second", exclusive=True)
    assert path.read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["sig"]


def test_before_replace_sees_the_complete_file_and_a_failure_there_keeps_the_old(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")

    def refuse(tmp: Path) -> None:
        assert tmp.read_bytes() == b"new"
        raise RuntimeError("manifest unwritable")

    with pytest.raises(RuntimeError):
        files.write_atomic(path, b"new", before_replace=refuse)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_the_temporary_is_removed_whatever_happens_to_it(tmp_path: Path) -> None:
    target = tmp_path / "t"
    with files.temporary(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".t.") and _mode(tmp) == 0o600
    assert not tmp.exists()
    with pytest.raises(ValueError), files.temporary(target) as tmp:
        raise ValueError
    assert not tmp.exists()


def test_the_bounded_read_takes_one_regular_file_and_no_more_than_its_cap(tmp_path: Path) -> None:
    """:func:`files.read_regular`: a FIFO is refused without blocking (opened ``O_NONBLOCK``, checked with ``fstat``),
    a link is refused unless followed, a sparse file over the cap is refused from its size (nothing read), and
    every refusal is the caller's own error naming the file."""
    def error(path: Path, problem: str) -> Exception:
        return LookupError(f"{path}: {problem}")

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(LookupError, match="not a regular file"):
        files.read_regular(fifo, 10, follow=True, error=error)
    (tmp_path / "ok").write_bytes(b"12345")
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    with pytest.raises(LookupError, match="symbolic link"):
        files.read_regular(tmp_path / "link", 10, error=error)
    assert files.read_regular(tmp_path / "link", 10, follow=True, error=error) == b"12345"
    with open(tmp_path / "sparse", "wb") as fh:
        fh.truncate(3 << 30)
    with pytest.raises(LookupError, match="3,221,225,472 bytes, more than the 10 "):
        files.read_regular(tmp_path / "sparse", 10, error=error)
    assert files.size_of(tmp_path / "ok") == 5
    with pytest.raises(ValueError, match="symbolic link"):
        files.size_of(tmp_path / "link")


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int]]:
    """Record, in order, every ``fsync`` (of a regular file or a directory, by inode) and every rename or link."""
    events: list[tuple[str, str, int]] = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("fsync", "dir" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
        real_fsync(fd)

    def replace(*args: object, **kwargs: object) -> None:
        real_replace(*args, **kwargs)  # type: ignore[arg-type]
        events.append(("rename", "", 0))

    def link(*args: object, **kwargs: object) -> None:
        real_link(*args, **kwargs)  # type: ignore[arg-type]
        events.append(("rename", "", 0))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "link", link)
    return events


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _durable(events: list[tuple[str, str, int]], target: Path) -> None:
    """The file that took ``target``'s name was fsynced before the rename, and ``target``'s directory after it."""
    kinds = [(e[0], e[1]) for e in events]
    assert kinds.count(("rename", "")) == 1, events
    at = kinds.index(("rename", ""))
    assert ("fsync", "file") in kinds[:at], f"the file was not fsynced before its rename: {events}"
    after = [e for e in events[at + 1:] if e[:2] == ("fsync", "dir")]
    assert any(e[2] == target.parent.stat().st_ino for e in after), f"its directory was not fsynced: {events}"


@pytest.mark.parametrize("how", ["write_atomic", "exclusive", "held write", "held install", "install"])
def test_a_write_returns_only_once_the_file_and_its_directory_entry_are_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """docs/reliability.md, "Nothing is lost" (a power cut): the temporary file is fsynced before its rename, and the
    directory after it — a file's own fsync does not write the name that the rename gave it. Each way a file
    appears: :func:`phalanx.files.write_atomic` (replacing, or ``exclusive``: a hard link), and a run directory's
    :func:`phalanx.experiments.dirfd.write` and :func:`~phalanx.experiments.dirfd.install` (held by its descriptor
    or not)."""
    from phalanx.experiments import dirfd

    d = tmp_path / "run"
    d.mkdir()
    target = d / "f.bin"
    if how in ("held install", "install"):
        with dirfd.held(d) if how == "held install" else _nothing():
            tmp = dirfd.scratch(d) / ".f.bin.0000.tmp"
            tmp.write_bytes(b"new")
            with open(tmp, "rb+") as fh:  # the writer's own step (store: checkpoint.check_written, DuckDB's file)
                events = _spy(monkeypatch)
                os.fsync(fh.fileno())
            dirfd.install(d, tmp, target.name)
    else:
        events = _spy(monkeypatch)
        if how == "held write":
            with dirfd.held(d):
                dirfd.write(d, target.name, b"new")
        else:
            files.write_atomic(target, b"new", exclusive=how == "exclusive")
    assert target.read_bytes() == b"new"
    _durable(events, target)


@pytest.mark.parametrize("refusal", ["open", "EBADF", "ENOSYS"])
def test_a_directory_that_cannot_be_synced_does_not_fail_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    refusal: str) -> None:
    """A directory this user may write but not read (mode 0o300: opening it for the fsync is EACCES), or a file
    system that answers EBADF / ENOSYS to a directory fsync: the write stands and returns, as before the directory
    fsync was added (an attacker's review: it raised after the file was already replaced). Mutant: any error
    raised."""
    import errno

    real_open, real_fsync = os.open, os.fsync
    target = tmp_path / "f.bin"

    def is_dir(fd: int) -> bool:
        return stat.S_ISDIR(os.fstat(fd).st_mode)

    def opening(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if refusal == "open" and flags & getattr(os, "O_DIRECTORY", 0) and Path(path) == tmp_path:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    def syncing(fd: int) -> None:
        if refusal != "open" and is_dir(fd):
            raise OSError(getattr(errno, refusal), refusal)
        real_fsync(fd)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "fsync", syncing)
    files.write_atomic(target, b"new")
    assert target.read_bytes() == b"new"


@pytest.mark.parametrize("in_run_directory", [True, False])
def test_a_parquet_file_is_on_disk_before_its_name_and_its_name_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_run_directory: bool) -> None:
    """``store.write_parquet`` (a finished run's ``metrics.parquet``): DuckDB closes the file it writes without an
    fsync (strace shows none), so the store syncs it before the rename, and the directory after — in a run directory
    (its manifest records the file) and outside one. Before, neither was synced outside a run directory, and the
    file's bytes were not inside one: a power cut could leave the new name on an empty file."""
    from phalanx.experiments import store

    d = tmp_path / "run"
    d.mkdir()
    if in_run_directory:
        store._write_manifest(d, {"artifacts": {}})  # a run directory: its manifest exists
    events = _spy(monkeypatch)
    store.write_parquet(d / "metrics.parquet", [{"round": 0, "loss": 1.5}])
    ino = (d / "metrics.parquet").stat().st_ino
    last = max(i for i, e in enumerate(events) if e[0] == "rename")
    assert ("fsync", "file", ino) in events[:last], events
    assert ("fsync", "dir", d.stat().st_ino) in events[last + 1:], events


def test_the_online_learners_constants_are_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``online.bound.save`` (the fitted constants a check reads back): a temporary file synced, renamed, its directory
    synced. Before, ``write_text`` in place: a crash mid-write left half a JSON file where the constants were."""
    from phalanx.online import bound

    target = tmp_path / "constants.json"
    target.write_text("{}")
    events = _spy(monkeypatch)
    bound.save(bound.Constants(0.5, 0.25, 1.5, {"seeds": [1]}, "a test"), target)
    _durable(events, target)
    assert bound.load(target).margin == 1.5


def test_a_downloaded_data_file_is_on_disk_before_its_name_and_its_name_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.download.fetch`` (a data set's cache, ``load(..., download=True)``): the ``.part`` file whose MD5
    matched is fsynced before it takes its name, and the folder after. Before, a bare rename: a power cut could leave
    the real name on a torn file, which the next load without ``download`` reads."""
    import hashlib

    from phalanx.data import download

    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "f.gz").write_bytes(b"x" * 5000)
    md5 = hashlib.md5(b"x" * 5000, usedforsecurity=False).hexdigest()
    target = tmp_path / "cache" / "f.gz"
    target.parent.mkdir()
    events = _spy(monkeypatch)
    download.fetch([(mirror / "f.gz").as_uri()], target, md5)
    _durable(events, target)
    assert target.read_bytes() == b"x" * 5000
