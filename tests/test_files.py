"""The one atomic write (:mod:`phalanx.files`): old or new content, never torn; no temporary file left; a private
file never readable by others; a planted link replaced, not followed; ``exclusive`` never replaces."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

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
