"""Atomic file writes, written once: a reader sees a file's old content or its new one, never a torn one.

Every file Phalanx writes goes through :func:`temporary` (a fresh file beside the target, created ``O_EXCL`` with
mode 0600 by :func:`tempfile.mkstemp`, removed on every way out unless it was moved into place) and, for a payload
in memory, :func:`write_atomic` (write, ``fsync``, set the permissions, an optional step before the file appears —
the run directory's manifest records its digest there — then ``os.replace``, or with ``exclusive`` a hard link that
fails when the target already exists, then ``fsync`` of the directory: :func:`sync_directory`). A library that
writes its own file (safetensors, DuckDB) is handed the temporary path. The permissions default to what
``open(path, "w")`` would give (:func:`file_mode`); a private key
asks for 0o600, which it has from the start: the temporary file is never readable by others.

A link planted at the target is replaced, never followed (``os.replace`` renames over the name); a crash leaves at
most the temporary file, which :func:`phalanx.experiments.store.remove_temporaries` clears.
The one kind of file written in place, not replaced, is a lock file: it is opened ``O_NOFOLLOW`` and checked to be a
regular file of one link before anything is written to it (:func:`phalanx.experiments.store.open_lock`).

Reading a file that someone else may write goes through :func:`open_regular` (or :func:`read_regular` for its bytes,
bounded): one ``open`` with ``O_NONBLOCK`` (a FIFO put in its place does not block) and, unless the user named the
file, ``O_NOFOLLOW``, then ``fstat`` on that descriptor — a regular file, checked on the very file that is read (no
swap between a check by name and the read). Its refusals are ``error(path, problem)``, so that each caller raises its
own one-line error (a run directory's :class:`~phalanx.errors.ConfigError`, a data file's
:class:`~phalanx.data.base.DataFormatError`); this module imports nothing of Phalanx.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = ["Refusal", "file_mode", "open_regular", "read_regular", "size_of", "sync_file", "temporary", "too_large",
           "write_atomic"]

Refusal = Callable[[Path, str], Exception]
"""How a reader words a refusal: ``error(path, problem)`` is the exception raised (one line naming the file)."""
LINK = "a symbolic link, not followed (whoever can write the run directory could point it at any file)"
"""The problem of a symbolic link where ``follow`` is off."""


def refused(path: Path, problem: str) -> Exception:
    """The default refusal: a :class:`ValueError` ``"<path>: <problem>"``."""
    return ValueError(f"{path}: {problem}")


def _proc_umask() -> int | None:
    """The process's umask as ``/proc/self/status`` reports it (Linux 4.7 and later), or None where it cannot."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        return None
    return None


def _umask_at_import() -> int:
    """The umask when this module is imported: from ``/proc`` where it can be read, else set and restored at once —
    ``os.umask`` is the only portable way to read it, and it changes the whole process's umask for a moment, which is
    safe here only because module import runs before any thread of Phalanx writes files."""
    mask = _proc_umask()
    if mask is None:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


_UMASK_AT_IMPORT = _umask_at_import()


def file_mode() -> int:
    """The permissions a new file of ours gets: those of ``open(path, "w")``, ``0o666 & ~umask``.

    The umask is read now from ``/proc/self/status`` where it is available (Linux), so a process that changes its
    umask is followed, without the set-and-restore of ``os.umask`` (process-wide, not thread-safe); elsewhere it is
    the umask read once when the module was imported."""
    mask = _proc_umask()
    return 0o666 & ~(_UMASK_AT_IMPORT if mask is None else mask)


@contextmanager
def temporary(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A new, empty, closed file beside ``path`` (same directory, so a rename onto ``path`` is atomic), named
    ``.<name>.<random><suffix>`` and created 0600; removed when the block ends unless it was moved away."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def write_atomic(path: Path, payload: bytes | Callable[[BinaryIO], object], mode: int | None = None, *,
                 before_replace: Callable[[Path], object] | None = None, exclusive: bool = False,
                 sync: bool = True) -> None:
    """Write ``payload`` (bytes, or a function that writes into the open binary file) to ``path`` atomically.

    ``mode``: the file's permissions (default :func:`file_mode`); ``before_replace(tmp)`` runs on the complete
    temporary file just before it takes ``path``'s name; ``exclusive``: never replace an existing file (a hard link,
    which fails with :class:`FileExistsError` when ``path`` appeared meanwhile; on a file system without hard links
    the existence check and the rename are two steps); ``sync``: ``fsync`` the data first (off only for files whose
    loss in a power cut costs nothing, such as a message between processes of one run). Errors are the
    :class:`OSError` of the step that failed; ``path`` then keeps its old content and no temporary file is left."""
    with temporary(path) as tmp:
        with open(tmp, "r+b") as fh:
            os.fchmod(fh.fileno(), file_mode() if mode is None else mode)
            if isinstance(payload, bytes | bytearray | memoryview):
                fh.write(payload)
            else:
                payload(fh)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        if before_replace is not None:
            before_replace(tmp)
        if not exclusive:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # atomic, and fails if the file appeared meanwhile
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links
                if path.exists():
                    raise FileExistsError(str(path)) from None
                os.replace(tmp, path)
        if sync:
            sync_directory(path.parent)


_UNSYNCABLE = {errno.EINVAL, errno.EBADF, errno.ENOSYS, getattr(errno, "ENOTSUP", errno.EINVAL),
               getattr(errno, "EOPNOTSUPP", errno.EINVAL)}


def sync_file(path: Path) -> None:
    """``fsync`` the file ``path``: one a library wrote and closed without syncing it (DuckDB's Parquet file)."""
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def sync_directory(path: Path | None = None, fd: int | None = None) -> None:
    """``fsync`` the directory ``path`` (or the open directory descriptor ``fd``), so that a rename or a new name in
    it survives a power cut: the file's own ``fsync`` does not write its directory entry (POSIX ``fsync(2)``).
    Skipped where directories cannot be opened (Windows, or a directory this user may write but not read) or synced
    (a file system that answers ``EINVAL`` / ``ENOTSUP`` / ``EBADF`` / ``ENOSYS``); any other error is raised —
    after the rename, so the caller's file is already the new one."""
    if fd is None:
        if os.name != "posix":
            return
        try:
            own = os.open(path if path is not None else ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                          | getattr(os, "O_CLOEXEC", 0))
        except PermissionError:  # a write-only directory (mode 0o300): its entry cannot be synced, the write stands
            return
        try:
            sync_directory(fd=own)
        finally:
            os.close(own)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _UNSYNCABLE:
            raise


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_regular(path: Path, follow: bool = False, error: Refusal = refused) -> BinaryIO:
    """``path`` opened for reading, only if it is a regular file: opened ``O_NONBLOCK`` (a FIFO put in its place does
    not block the open) and ``O_NOFOLLOW`` (a symbolic link planted in a run directory is refused, never followed;
    ``follow``: a file the user named, such as a public key or a config, may be a link), then checked with ``fstat``
    on the descriptor read (no swap between a check and the open); ``error(path, problem)`` otherwise,
    :class:`FileNotFoundError` (an :class:`OSError`) if it is missing."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if not follow and exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):  # EMLINK: FreeBSD
            raise error(path, LINK) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(path, "not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def size_of(path: Path, follow: bool = False, error: Refusal = refused) -> int:
    """The size of ``path`` in bytes; :class:`FileNotFoundError` if it does not exist; ``error(path, problem)`` if it
    is a symbolic link (``lstat``: not followed unless ``follow``) or not a regular file (a directory, a FIFO that
    would block a read, a device)."""
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise error(path, LINK)
    if not stat.S_ISREG(st.st_mode):
        raise error(path, "not a regular file")
    return st.st_size


def read_regular(path: Path, limit: int, follow: bool = False, error: Refusal = refused) -> bytes:
    """The bytes of the regular file ``path``, from one descriptor (:func:`open_regular`): refused with
    ``error(path, problem)`` when ``fstat`` says it holds more than ``limit`` bytes (nothing read; a sparse file of
    gigabytes costs nothing), and read with ``read(size + 1)``, so that a file growing meanwhile is refused too, never
    read whole (nor a buffer of ``limit`` bytes asked for). :class:`OSError` when it cannot be opened or read."""
    with open_regular(path, follow, error) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise error(path, too_large(size, limit))
        raw = fh.read(size + 1)  # what fstat said, and one byte more: never a buffer of the cap's size
    if len(raw) > size:  # it grew between the fstat and the read
        raise error(path, f"it grew while it was read (from {size:,} bytes)")
    return raw


def too_large(size: int, limit: int) -> str:
    """The problem of a file of ``size`` bytes where at most ``limit`` are read."""
    return f"{size:,} bytes, more than the {limit:,} such a file may have (not read)"
