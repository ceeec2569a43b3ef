"""Atomic file writes, written once: a reader sees a file's old content or its new one, never a torn one.

Every file Phalanx writes goes through :func:`temporary` (a fresh file beside the target, created ``O_EXCL`` with
mode 0600 by :func:`tempfile.mkstemp`, removed on every way out unless it was moved into place) and, for a payload
in memory, :func:`write_atomic` (write, ``fsync``, set the permissions, an optional step before the file appears —
the run directory's manifest records its digest there — then ``os.replace``, or with ``exclusive`` a hard link that
fails when the target already exists). A library that writes its own file (safetensors, DuckDB) is handed the
temporary path. The permissions default to what ``open(path, "w")`` would give (:func:`file_mode`); a private key
asks for 0o600, which it has from the start: the temporary file is never readable by others.

A link planted at the target is replaced, never followed (``os.replace`` renames over the name); a crash leaves at
most the temporary file, which :func:`phalanx.experiments.store.remove_temporaries` clears.
The one kind of file written in place, not replaced, is a lock file: it is opened ``O_NOFOLLOW`` and checked to be a
regular file of one link before anything is written to it (:func:`phalanx.experiments.store.open_lock`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = ["file_mode", "temporary", "write_atomic"]


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
            return
        try:
            os.link(tmp, path)  # atomic, and fails if the file appeared meanwhile
        except FileExistsError:
            raise
        except OSError:  # a file system without hard links
            if path.exists():
                raise FileExistsError(str(path)) from None
            os.replace(tmp, path)
