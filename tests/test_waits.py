"""The waits a stop still ends (:mod:`phalanx.waits`).

``_thread.interrupt_main`` leaves a SIGINT pending in the main thread without interrupting any wait — the state a real
signal leaves when its C handler runs after the thread released the GIL and before it entered its wait (CPython's
lock wait then misses it); ``tests/_pending_sigint.py`` trips it only once the main thread is blocked in the wait.
Each wait below is of 60 s on something that a helper thread sets only once the test is
over (or by a watchdog, 30 s after the interrupt, well within the wait's own timeout): a sliced wait raises
``KeyboardInterrupt`` within a slice; a plain wait (the mutant) waits out the watchdog."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from _pending_sigint import in_lock_wait, interrupt_once_in
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
    """Run ``wait(event, cond)`` with a SIGINT left pending once it is blocked in its lock wait (never set, never
    notified, unless the watchdog fires ``watchdog_s`` later); whether the wait ended by ``KeyboardInterrupt`` before
    the watchdog."""
    event, cond, fired = threading.Event(), threading.Condition(), threading.Event()

    def watchdog() -> None:
        fired.set()
        event.set()
        with cond:
            cond.notify_all()

    timer = threading.Timer(watchdog_s, watchdog)
    backstop = threading.Timer(WATCHDOG_S + LONG_S, watchdog)  # (no interrupt ever sent: the test fails, never hangs)
    backstop.start()
    watcher = None
    try:
        watcher = interrupt_once_in(in_lock_wait, before=timer.start)
        wait(event, cond)
    except KeyboardInterrupt:
        return not fired.is_set()
    finally:
        if watcher is not None:
            watcher.join()
        timer.cancel()
        backstop.cancel()
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


def test_a_timeout_that_is_not_a_finite_number_is_refused() -> None:
    """``Event.wait(nan)`` returned at once; a sliced wait of NaN would have spun until the event was set."""
    event, cond = threading.Event(), threading.Condition()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="not a finite number"):
            waits.wait_event(event, bad)
        with cond, pytest.raises(ValueError, match="not a finite number"):
            waits.wait_for(cond, lambda: False, bad)


def test_every_condition_wait_of_the_transports_is_sliced() -> None:
    """The torchrun transports' waits on a run's thread go through :func:`phalanx.waits.wait_for`: a plain
    ``Condition.wait_for`` reintroduced at any of them (each a mutant this scan rejects) would miss a stop again. The
    one left is a link's sender thread, which no stop reaches (it waits for its queue, and ends on the link's
    close)."""
    import re

    src = Path(__file__).resolve().parent.parent / "src" / "phalanx"
    plain = {f"{path.relative_to(src)}: {line.strip()}" for path in sorted(src.rglob("*.py"))
             for line in path.read_text().splitlines() if re.search(r"(?<!waits)\.wait_for\(", line)
             and "def wait_for" not in line and "``cond.wait_for" not in line}
    assert plain == {"distributed/sealed.py: down.cond.wait_for(lambda: bool(down.pending))"}
