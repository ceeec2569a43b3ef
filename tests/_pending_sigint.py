"""A SIGINT left pending in the main thread once it is *inside* a given wait, never before.

``_thread.interrupt_main`` trips SIGINT without interrupting any wait: the state a real signal leaves when its C
handler runs after the thread released the GIL and before it entered its wait (:mod:`phalanx.waits`). Sent from a
timer, it could land before the main thread reached the wait — a KeyboardInterrupt outside the test's
``pytest.raises``, which ends the whole pytest session (an attacker's review made it happen with a 100 ms stall). So
a thread watches the main thread's stack (``sys._current_frames``) and trips the signal only once its top frame is the
wait asked for; before it, it starts the test's watchdog."""

from __future__ import annotations

import _thread
import linecache
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

WATCH_S = 60.0
"""How long the watcher waits for the main thread to reach the wait (then it sends nothing: the test fails)."""


def in_lock_wait(frame: FrameType) -> bool:
    """The main thread is blocked in a ``Condition.wait`` with a timeout (``Event.wait``'s too): on the line of the
    lock wait itself, past every point where a pending signal would still be seen."""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith("threading.py") and \
        line == "gotit = waiter.acquire(True, timeout)"


def in_run_lock(frame: FrameType) -> bool:
    """The main thread waits for a run directory's lock: in :func:`phalanx.waits.flock` (asleep between two tries),
    or — the code before, a mutant — in a blocking ``fcntl.flock`` called from ``runstate._lock``."""
    name, file = frame.f_code.co_name, frame.f_code.co_filename
    return (name == "flock" and file.endswith("waits.py")) or (name == "_lock" and file.endswith("runstate.py"))


def interrupt_once_in(where: Callable[[FrameType], bool],
                      before: Callable[[], None] = lambda: None) -> threading.Thread:
    """Start a thread that, once the main thread's top frame satisfies ``where``, calls ``before`` (the test's
    watchdog) and trips SIGINT; the thread, to join."""
    main = threading.main_thread().ident

    def watch() -> None:
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(main or 0)
            if frame is not None and where(frame):
                before()
                _thread.interrupt_main(signal.SIGINT)
                return
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher
