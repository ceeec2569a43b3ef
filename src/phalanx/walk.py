"""Walking a directory tree that someone else may have written, without recursion and within a depth.

``Path.rglob`` and ``os.walk`` recurse in Python 3.11 — one frame per level — so a tree of 1,100 nested folders
planted in a handed-over run directory made ``phalanx report`` and ``phalanx verify`` die with ``RecursionError``
(an attacker's review). :func:`walk` keeps its own stack of ``os.scandir`` iterators, never follows a symbolic link
(a link to ``/`` or to its own folder is reported as a link, not entered), and refuses a tree deeper than
``max_depth`` in one :class:`~phalanx.errors.ConfigError` naming the folder — before yielding anything below it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from phalanx.errors import ConfigError

MAX_DEPTH = 32
"""The deepest folder a run directory or a directory of runs may hold (a run directory: one level; a grid's output:
two or three)."""


def walk(root: Path, parameter: str, max_depth: int = MAX_DEPTH) -> Iterator[Path]:
    """Every entry under ``root`` (files, links and folders; not ``root`` itself), depth first, each folder's entries
    in name order; folders are entered, links are not. A :class:`ConfigError` naming ``parameter`` and the folder
    once a folder lies more than ``max_depth`` levels below ``root``."""
    stack = [(Path(root), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:  # a co-user's folder of mode 000 in a shared directory: one line, not a traceback
            raise ConfigError(parameter, str(root), "a folder whose every folder can be read",
                              f"{folder}: {exc.strerror or type(exc).__name__}") from None
        below = []
        for entry in entries:
            path = Path(entry.path)
            yield path
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 > max_depth:
                    raise ConfigError(parameter, str(root), f"a folder at most {max_depth} levels deep",
                                      f"{path} is deeper; not walked further")
                below.append((path, depth + 1))
        stack.extend(reversed(below))
