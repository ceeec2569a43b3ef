"""A folder only this user can change, for files that are later *executed* or unpickled.

The Slurm executor hands ``submitit`` a folder in which it writes each task's pickled callable; the node loads it
with :func:`pickle.load` when the task starts, minutes or days later. Whoever can replace that file, the folder, or
any directory above it (rename ``OUT/slurm`` away and plant a link to a folder of their own in its place) between the
submission and the start runs code as the user on the node. A co-user of a shared ``runs/`` directory is such an
attacker (docs/security.md), so the folder is checked the way OpenSSH's ``StrictModes`` checks ``~/.ssh``:

* every directory on the path, from ``/`` down, as written and as resolved, is owned by root or the user and is
  writable by nobody else, unless it has the sticky bit (``/tmp``: others cannot rename or delete what is not theirs);
  a symbolic link on the path is owned by root or the user;
* the folder itself is created ``0700`` if it is missing (and so is every missing directory above it, one at a time,
  then the chain is checked again); if it exists it is a directory (not a link), owned by the user, writable by
  nobody else — and it is made ``0700``, so that the job folders ``submitit`` creates in it under a group-friendly
  umask (``002``: ``0775`` folders, ``0664`` pickles) are out of others' reach;
* the folder holds none of submitit's tags (``%j`` …): submitit would write above the tag, in a folder not checked.

Anything else is a one-line :class:`~phalanx.errors.ConfigError` naming the setting and the directory at fault, raised
before anything is written. Access-control lists and the file system's own guarantees (NFS root squash) are not
read: a directory made writable to others only through an ACL passes (noted in docs/security.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from phalanx.errors import ConfigError

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _owned(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def _unsafe(directory: Path, st: os.stat_result, last: bool) -> str | None:
    """Why ``directory`` (its ``lstat``) lets someone else change what lies under it, or None."""
    if stat.S_ISLNK(st.st_mode):
        return None if _owned(st) else f"{directory} is a symbolic link owned by uid {st.st_uid}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory"
    if not _owned(st) or (last and st.st_uid != os.geteuid()):
        return f"{directory} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & _OTHERS_WRITE and (last or not st.st_mode & stat.S_ISVTX):
        return f"{directory} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _chain(path: Path) -> list[Path]:
    """``path`` and every directory above it, from ``/`` down."""
    return [*reversed(path.parents), path]


def _check_above(key: str, folder: Path, advice: str) -> None:
    """Every directory above ``folder`` that exists, as written and as resolved, is safe (:func:`_unsafe`)."""
    for path in (folder, folder.resolve()):
        for step in _chain(path.parent):
            try:
                st = os.lstat(step)
            except FileNotFoundError:
                break
            if (why := _unsafe(step, st, last=False)) is not None:
                raise ConfigError(key, str(folder), "a folder only you can write", f"{why}; {advice}")


def private_folder(key: str, folder: Path) -> Path:
    """``folder`` (absolute), created ``0700`` with every missing directory above it, once it and every directory
    above it are safe as the module's docstring says, and made ``0700`` (so that what ``submitit`` creates in it
    under a group-friendly umask is out of others' reach); a :class:`ConfigError` naming ``key`` otherwise."""
    if "%" in str(folder):  # submitit's tags (%j, %A, %a, %t): it writes above them, in a folder not checked here
        raise ConfigError(key, str(folder), "a folder without submitit's tags (%j, %A, %a, %t)",
                          "each task's files go into a folder of its own inside it already")
    folder = Path(os.path.abspath(folder))
    advice = ("the folder holds the pickles the tasks load, so whoever can change it runs code as you on the nodes; "
              f"give {key} a folder only you can write (--slurm folder=PATH)")
    _check_above(key, folder, advice)
    for step in _chain(folder):  # one at a time: os.makedirs gives the directories above the last the umask's mode
        try:
            os.mkdir(step, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(key, str(folder), "a folder that can be created", str(exc)) from None
    _check_above(key, folder, advice)  # again: a directory someone else made meanwhile (in a sticky one) is refused
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(key, str(folder), "a folder only you can write", f"{folder} is a symbolic link; {advice}")
    if (why := _unsafe(folder, st, last=True)) is not None:
        raise ConfigError(key, str(folder), "a folder only you can write", f"{why}; {advice}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(folder, 0o700)
    return folder
