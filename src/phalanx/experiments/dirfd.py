"""A run directory held open by a descriptor while a process writes into it (issue 38, review38's leftovers).

**Why.** A run directory must be a directory of its own, not a symbolic link: a link planted by a co-user of a shared
``runs/`` folder would send every file of the run to wherever it points. Checked by name and then used by name, the
check can be undone between the two: the co-user renames the checked directory away and puts a link in its place,
and every later write by name lands in the directory the link names (a time-of-check/time-of-use race, CWE-367).

**How.** The check *is* the open: ``os.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)`` refuses a link (``ELOOP``)
and anything that is not a directory, and the descriptor it returns names the directory that was checked for as
long as it is held, whatever the name points at later (POSIX ``openat(2)``; the ``dir_fd=`` arguments of Python's
:mod:`os`). While it is held — :func:`held`, for the block in which a run holds its lock
(:func:`phalanx.experiments.runstate.locked`) — every file the run writes into it is created, renamed and removed
relative to the descriptor:

* :func:`write`: a payload in memory (the manifest, ``config.json``, metric rows, markers), written as
  :func:`phalanx.files.write_atomic` writes it — a fresh temporary file created ``O_EXCL | O_NOFOLLOW``, ``fsync``,
  permissions, an optional step before it appears (the manifest records its digest), then ``renameat``, then
  ``fsync`` of the held directory (:func:`phalanx.files.sync_directory`: the rename survives a power cut);
* :func:`scratch` and :func:`install`: a file a library writes by path (safetensors' checkpoint, DuckDB's Parquet)
  is written under :func:`scratch` — on Linux ``/proc/self/fd/N``, the directory as the descriptor names it — and
  renamed into place relative to the descriptor; where ``/proc`` is missing the temporary file goes by name and the
  rename relative to the descriptor fails if the directory was swapped meanwhile (refused, not redirected);
* :func:`open_file`: a file the run keeps open and appends to (rank 0's transcript under ``phalanx launch``);
* :func:`unlink` and :func:`temporaries`: removing a marker and clearing a killed write's temporary files.

So a swap after the check leaves the run's writes in the directory that was checked (now under whatever name the
co-user gave it), never in the link's target (``tests/test_run_dir_links.py``). Reads stay by name: a file read from
a swapped directory is checked as any file is (the manifest's digests, a signature), and a symbolic link in a run
directory is refused, never followed, by every bounded read (:func:`phalanx.experiments.runfiles.open_regular`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from phalanx.errors import OutputError
from phalanx.files import file_mode, sync_directory, write_atomic

_HELD: dict[str, list[int]] = {}
"""Run directory (its absolute path) → [descriptor, how many blocks hold it]."""
_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def link_refused(path: Path, what: str) -> OutputError:
    """The one-line error for a link (or other file) planted where a run directory or a lock file goes."""
    return OutputError(str(path), f"{what}, not followed (whoever can write its folder could point it at any file of "
                       "yours)", "remove it, then run the same command again")


def _open(path: Path) -> int:
    """A descriptor on the directory ``path`` (created with its parents if missing), opened only if it is a directory
    of its own: ``O_DIRECTORY | O_NOFOLLOW`` refuses a symbolic link and anything else in one line naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a link (dangling or not) or a file of that name: the open below says which
        pass
    except OSError as exc:
        raise OutputError.of(path, exc) from None
    try:
        return os.open(path, _FLAGS)
    except OSError as exc:
        if path.is_symlink():  # ELOOP (Linux), EMLINK (FreeBSD): O_NOFOLLOW met a link
            raise link_refused(path, "a symbolic link where a run directory goes") from None
        raise OutputError.of(path, exc) from None  # ENOTDIR: "… is a file, not a directory", as mkdir's was


def check(path: Path) -> None:
    """Create the run directory ``path`` if needed and check, by opening it, that it is a directory of its own (see the
    module's docstring); an :class:`~phalanx.errors.OutputError` naming it otherwise."""
    os.close(_open(path))


@contextmanager
def held(path: Path) -> Iterator[int]:
    """Inside the block, ``path`` is held by a descriptor opened as :func:`check` checks it, and every write of this
    module into it goes through that descriptor; nested blocks share it. Yields the descriptor."""
    key = os.path.abspath(path)
    entry = _HELD.get(key)
    if entry is None:
        entry = _HELD[key] = [_open(Path(path)), 0]
    entry[1] += 1
    try:
        yield entry[0]
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            del _HELD[key]
            os.close(entry[0])


def fd_of(path: Path) -> int | None:
    """The descriptor holding the run directory ``path`` (:func:`held`), or ``None``."""
    entry = _HELD.get(os.path.abspath(path))
    return None if entry is None else entry[0]


def scratch(path: Path) -> Path:
    """Where a library writes a temporary file of the run directory ``path``: the held directory as its descriptor
    names it (``/proc/self/fd/N``, Linux), else ``path`` itself (then :func:`install` refuses a swapped directory)."""
    fd = fd_of(path)
    if fd is not None:
        through = Path(f"/proc/self/fd/{fd}")
        if through.is_dir():
            return through
    return Path(path)


def install(path: Path, tmp: Path, name: str) -> None:
    """Rename the finished temporary file ``tmp`` (in :func:`scratch`) to ``path/name``, relative to the held
    descriptor when there is one: a temporary file that is not in the checked directory is refused
    (:class:`FileNotFoundError`), never moved into another."""
    fd = fd_of(path)
    if fd is None:
        os.replace(tmp, Path(path) / name)
        sync_directory(Path(path))
    else:
        os.replace(tmp.name, name, src_dir_fd=fd, dst_dir_fd=fd)
        sync_directory(fd=fd)  # the rename survives a power cut (the file was synced before: its writer's step)


def write(path: Path, name: str, payload: bytes, mode: int | None = None, *,
          before_replace: Callable[[Path], object] | None = None) -> None:
    """Write ``path/name`` atomically (:func:`phalanx.files.write_atomic`), relative to the held descriptor when there
    is one; ``before_replace`` is called with the temporary file's path (in :func:`scratch`). Errors: the
    :class:`OSError` of the step that failed; no temporary file is left."""
    fd = fd_of(path)
    if fd is None:
        write_atomic(Path(path) / name, payload, mode, before_replace=before_replace)
        return
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    out = os.open(tmp, flags, 0o600, dir_fd=fd)
    try:
        with os.fdopen(out, "wb") as fh:
            os.fchmod(fh.fileno(), file_mode() if mode is None else mode)
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        if before_replace is not None:
            before_replace(scratch(path) / tmp)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        sync_directory(fd=fd)  # the new name survives a power cut, not only the bytes
    finally:
        try:
            os.unlink(tmp, dir_fd=fd)
        except FileNotFoundError:  # moved into place
            pass


def open_file(path: Path, name: str, flags: int, mode: int = 0o666) -> int:
    """A descriptor on ``path/name`` opened with ``flags`` (plus ``O_NOFOLLOW | O_CLOEXEC``: a symbolic link planted
    at that name is refused, never followed), relative to the held descriptor when there is one — for a file a run
    keeps open and appends to (rank 0's transcript, :mod:`phalanx.distributed.chain`). Errors: the :class:`OSError`
    of the open."""
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = fd_of(path)
    return os.open(Path(path) / name, flags, mode) if fd is None else os.open(name, flags, mode, dir_fd=fd)


def unlink(path: Path, name: str) -> None:
    """Remove ``path/name`` if it exists, relative to the held descriptor when there is one."""
    fd = fd_of(path)
    try:
        if fd is None:
            (Path(path) / name).unlink()
        else:
            os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass


def temporaries(path: Path) -> list[str]:
    """The names of the temporary files killed writes left in the run directory (``.NAME.XXXXXXXX.tmp``), listed
    through the held descriptor when there is one."""
    fd = fd_of(path)
    try:
        names = os.listdir(fd if fd is not None else path)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(".") and n.endswith(".tmp"))


def still_named(path: Path) -> bool:
    """Whether ``path`` still names the directory held (no descriptor held: ``True``) — for a step that can only go
    by name (the directory's signature, made by a library that walks it)."""
    fd = fd_of(path)
    if fd is None:
        return True
    try:
        now, then = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (then.st_dev, then.st_ino)
