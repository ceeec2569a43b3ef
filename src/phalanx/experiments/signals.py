"""Stopping a grid cleanly on SIGINT (Ctrl-C) and SIGTERM, and child processes that end with their parent.

The first SIGINT or SIGTERM stops a grid: no new run starts, the runs in progress keep their last checkpoint, and the
grid raises :class:`Interrupted`, which says how many runs finished (the CLI prints it as one line and exits with 130
or 143). Later signals are ignored while the program winds down.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from phalanx.errors import PhalanxError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a grid cleanly."""


class Interrupted(PhalanxError):
    """A grid stopped by SIGINT (Ctrl-C) or SIGTERM. ``finished`` of ``total`` runs are finished; the others keep
    their last checkpoint, so the same command, started again, resumes. ``exit_code``: 128 + the signal's number (130
    for SIGINT, 143 for SIGTERM), as a shell reports a process ended by that signal."""

    def __init__(self, signum: int, finished: int, total: int, detail: str | None = None) -> None:
        self.signum = signum
        self.finished = finished
        self.total = total
        self.exit_code = 128 + signum
        super().__init__(
            f"interrupted by {signal.Signals(signum).name}: {finished} of {total} runs finished; " + (detail or (
                "run the same command again to resume (finished runs are skipped, the others go on from their last "
                "checkpoint)"))
        )


class StopRequested(BaseException):
    """SIGINT or SIGTERM arrived (raised by the handlers of :func:`stop_on_signals`; a ``BaseException``, like
    ``KeyboardInterrupt``, so that no ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def handlers(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """Handle SIGINT and SIGTERM with ``handler`` inside the block (the previous handlers come back after); nothing
    outside the main thread, where Python cannot install handlers."""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside the block, the first SIGINT or SIGTERM raises :class:`StopRequested` (later ones are ignored while the
    program winds down): a run in this process stops where it is, its files as they were at its last checkpoint."""
    fired: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if not fired:
            fired.append(signum)
            raise StopRequested(signum)

    with handlers(handler):
        yield


@contextmanager
def recording(stopped: list[int]) -> Iterator[None]:
    """Inside the block the first SIGINT or SIGTERM is appended to ``stopped`` (for a loop that polls it)."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stopped:
            stopped.append(signum)

    with handlers(on_signal):
        yield


def exit_with_parent() -> None:
    """Make a child process of a grid end when the process that started it ends (killed, Ctrl-C): its run resumes
    from its last checkpoint next time, instead of going on unseen (a pool worker outlives a parent killed by a
    signal)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns when the parent process has exited (its sentinel is closed)
        os._exit(1)

    threading.Thread(target=watch, name="phalanx-parent-watch", daemon=True).start()
