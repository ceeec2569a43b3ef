"""The waits a stop still ends (:mod:`phalanx.waits`).

``_thread.interrupt_main`` leaves a SIGINT pending in the main thread without interrupting any wait — the state a real
signal leaves when its C handler runs after the thread released the GIL and before it entered its wait (CPython's
lock wait then misses it). Each wait below is of 60 s on something that a helper thread sets only once the test is
over (or by a watchdog, 30 s after the interrupt, well within the wait's own timeout): a sliced wait raises
``KeyboardInterrupt`` within a slice; a plain wait (the mutant) waits out the watchdog."""

from __future__ import annotations

import _thread
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from phalanx import waits

LONG_S = 60.0
"""Each wait's own timeout."""
WATCHDOG_S = 30.0
"""When the watchdog sets what the wait waits for (after the interrupt): a sliced wait has ended long before."""


@pytest.fixture
def sigint() -> Iterator[None]:
    """Python's own SIGINT handler (a test or plug-in before may have left another)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted(wait: Callable[[threading.Event, threading.Condition], object],
                 watchdog_s: float = WATCHDOG_S) -> bool:
    """Run ``wait(event, cond)`` with a SIGINT left pending 50 ms into it (never set, never notified, unless the
    watchdog fires ``watchdog_s`` later); whether the wait ended by ``KeyboardInterrupt`` before the watchdog."""
    event, cond, fired = threading.Event(), threading.Condition(), threading.Event()

    def watchdog() -> None:
        fired.set()
        event.set()
        with cond:
            cond.notify_all()

    timer = threading.Timer(watchdog_s, watchdog)
    pending = threading.Timer(0.05, lambda: (timer.start(), _thread.interrupt_main(signal.SIGINT)))
    pending.start()
    try:
        wait(event, cond)
    except KeyboardInterrupt:
        return not fired.is_set()
    finally:
        pending.join()
        timer.cancel()
    return False


def _wait_for(event: threading.Event, cond: threading.Condition) -> object:
    with cond:
        return waits.wait_for(cond, event.is_set, LONG_S)


def test_a_signal_its_wait_missed_ends_each_sliced_wait(sigint: None) -> None:
    assert _interrupted(lambda event, cond: waits.wait_event(event, LONG_S))
    assert _interrupted(lambda event, cond: waits.wait_event(event, None))
    assert _interrupted(_wait_for)


def test_the_unsliced_waits_are_the_mutants_the_check_rejects(sigint: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One slice as long as the whole wait: the pending SIGINT is seen only when the watchdog (here 2 s after it)
    ends the wait."""
    monkeypatch.setattr(waits, "SLICE_S", 2 * LONG_S)
    assert not _interrupted(lambda event, cond: waits.wait_event(event, LONG_S), watchdog_s=2.0)
    assert not _interrupted(_wait_for, watchdog_s=2.0)


def test_the_waits_answer_as_the_ones_they_replace() -> None:
    """Set: True at once; never set: False after the timeout (also 0); a condition's predicate value as a bool."""
    event, cond = threading.Event(), threading.Condition()
    assert waits.wait_event(event, 0.0) is False and waits.wait_event(event, 0.05) is False
    event.set()
    assert waits.wait_event(event, 0.0) is True and waits.wait_event(event, None) is True
    with cond:
        assert waits.wait_for(cond, lambda: 0, 0.05) is False
        assert waits.wait_for(cond, lambda: [1], 0.0) is True
    box: list[int] = []

    def later() -> None:
        with cond:
            box.append(1)
            cond.notify_all()

    threading.Timer(0.05, later).start()
    with cond:
        assert waits.wait_for(cond, lambda: box, LONG_S) is True


def test_flock_takes_a_free_lock_and_gives_up_on_a_held_one(tmp_path: Path) -> None:
    import fcntl
    import os

    path = tmp_path / "lock"
    path.write_bytes(b"")
    mine, other = os.open(path, os.O_RDONLY), os.open(path, os.O_RDONLY)
    try:
        assert waits.flock(mine, fcntl.LOCK_EX, 0.0)
        assert not waits.flock(other, fcntl.LOCK_EX, 0.0) and not waits.flock(other, fcntl.LOCK_SH, 0.05)
        threading.Timer(0.05, lambda: fcntl.flock(mine, fcntl.LOCK_UN)).start()
        assert waits.flock(other, fcntl.LOCK_EX, LONG_S)
    finally:
        os.close(mine)
        os.close(other)
