"""Waits that a stop still ends, however its signal lands.

A thread that waits on a lock, an event or a condition in CPython is woken by a signal that arrives *during* the
wait (the wait fails with ``EINTR``; the Python handler then runs and raises ``KeyboardInterrupt`` or the grid's
stop). A signal whose C handler runs after the thread released the GIL and before it entered the wait does not wake
it: the handler has run, so the wait that follows is not interrupted, and the Python handler runs only when the wait
ends — ``scripts/signal_race.py`` measured 127 of 3,000 SIGINTs sent as a tracker-like call started noticed only when
the call returned on a quiet 2-core machine, 297 of 300 beside the test suite; ``_thread.interrupt_main`` (a signal
simulated in the process) never interrupts a wait at all.
One wait of a long timeout then holds a Ctrl-C (or torchrun's SIGTERM) for that whole timeout. So the waits here are
taken in slices of at most :data:`SLICE_S`: the Python handler of a pending signal runs at the first bytecode after a
slice, and a stop is seen within one slice. A blocking ``flock`` has the same window, and nothing else ends it but the
lock's holder — a co-user of a shared folder can hold a lock file for ever — so :func:`flock` polls the lock without
blocking, and gives up after its timeout.

``tests/test_waits.py`` makes the missed signal on purpose (``_thread.interrupt_main``) and checks that every wait
here ends within seconds; one unsliced wait of the same timeout (its mutant) waits out the whole timeout.
"""

from __future__ import annotations

import fcntl
import math
import random
import threading
import time
from collections.abc import Callable

SLICE_S = 0.2
"""The longest one wait lasts before the thread looks for a signal its wait missed: a stop is seen within this, and a
waiting thread wakes five times a second (a cost of microseconds)."""
LOCK_RETRY_MAX_S = 2.0
"""The longest pause between two tries of a lock waited for without a limit (a run's ``--wait`` may wait hours; on NFS
or Lustre each try is a request to the lock server). The pause is still slept in slices of :data:`SLICE_S`."""


def _deadline(timeout: float | None) -> float | None:
    """When a wait of ``timeout`` seconds ends (None: never); ValueError on a timeout that is not a finite number
    (NaN would wait for ever, where ``Event.wait(nan)`` returned at once)."""
    if timeout is None:
        return None
    if not math.isfinite(timeout):
        raise ValueError(f"timeout: {timeout!r} is not a finite number of seconds")
    return time.monotonic() + timeout


def wait_event(event: threading.Event, timeout: float | None) -> bool:
    """``event.wait(timeout)`` in slices (see the module's docstring); whether ``event`` was set. ``None``: no
    limit."""
    deadline = _deadline(timeout)
    while not event.is_set():
        left = SLICE_S if deadline is None else deadline - time.monotonic()
        if left <= 0:
            return False
        event.wait(min(left, SLICE_S))
    return True


def wait_for(cond: threading.Condition, predicate: Callable[[], object], timeout: float | None) -> bool:
    """``cond.wait_for(predicate, timeout)`` in slices (see the module's docstring), with ``cond`` held by the caller
    as for ``Condition.wait_for``; the predicate's last value, as a bool. ``None``: no limit."""
    deadline = _deadline(timeout)
    while not (ok := predicate()):
        left = SLICE_S if deadline is None else deadline - time.monotonic()
        if left <= 0:
            break
        cond.wait(min(left, SLICE_S))
    return bool(ok)


def flock(fd: int, operation: int, timeout: float | None) -> bool:
    """``fcntl.flock(fd, operation)`` (``LOCK_EX`` or ``LOCK_SH``) tried without blocking, again after pauses growing
    from 1 ms to :data:`SLICE_S` (to :data:`LOCK_RETRY_MAX_S` without a limit), each drawn between half and all of
    that so that waiters who started together do not retry in step, and slept in slices of :data:`SLICE_S` (see the
    module's docstring); whether the lock was taken within ``timeout`` seconds (``None``: no limit).

    Unlike a blocking ``flock``, whose waiters the kernel wakes as the lock is freed, a newcomer may take the lock
    before a waiter's next try: fine for locks held for one short write or for a whole run, not for a busy lock."""
    deadline = _deadline(timeout)
    most = SLICE_S if deadline is not None else LOCK_RETRY_MAX_S
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return False
        until = now + pause * random.uniform(0.5, 1.0)
        if deadline is not None:
            until = min(until, deadline)
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, SLICE_S))
        pause = min(2 * pause, most)
