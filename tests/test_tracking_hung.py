"""A tracker whose call never returns (a server that accepts and never answers) is dropped after the timeout and the run
finishes; one that never answers while starting refuses the run (:mod:`phalanx.experiments.tracking.calls`).

Each run is driven from a thread of the test and waited for on its own end (a watchdog of 120 s): the code before,
which called the tracker on the run's thread, never ends — the watchdog then frees the tracker and the test fails."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from phalanx.experiments import store
from phalanx.experiments.build import from_config
from phalanx.experiments.config import make_config
from phalanx.experiments.tracking import TrackedRun, Tracker, calls
from phalanx.experiments.train import train

TINY: dict[str, Any] = {"dataset": "digits", "model": "logreg", "workers": 5, "byzantine": 1, "f": 1,
                        "aggregator": "cwtm", "attack": "signflip", "rounds": 4, "eval_every": 1, "batch_size": 8}
TIMEOUT_S = 10.0
"""The tracker timeout in these tests: a call of the trackers below that answers takes microseconds, but its thread
must be scheduled within it on a loaded machine (the first test took 6.9 s at load 16–18: a flaky-test review)."""
WATCHDOG_S = 120.0


class Hangs(Tracker):
    """Answers until round ``at``, then blocks on ``release`` (never set until the test ends); ``hang_start``: blocks
    in ``start``."""

    name = "hangs"

    def __init__(self, release: threading.Event, at: int = 2, hang_start: bool = False, name: str = "hangs") -> None:
        super().__init__(None)
        self.name = name
        self.release, self.at, self.hang_start = release, at, hang_start
        self.logged: list[int] = []
        self.finished: list[str] = []
        self.threads: set[str] = set()

    def start(self, run: TrackedRun) -> Mapping[str, Any]:
        self.threads.add(threading.current_thread().name)
        if self.hang_start:
            self.release.wait()
        return {}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.threads.add(threading.current_thread().name)
        if step >= self.at:
            self.release.wait()
        self.logged.append(step)

    def finish(self, end: str) -> None:
        self.finished.append(end)


def _watched(run: Callable[[], None], release: threading.Event) -> BaseException | None:
    """Run ``run`` on a thread; what it raised (None); fails the test if it has not ended within the watchdog."""
    box: dict[str, BaseException] = {}

    def target() -> None:
        try:
            run()
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(WATCHDOG_S)
    if thread.is_alive():
        release.set()
        thread.join(WATCHDOG_S)
        pytest.fail("the run waited on a tracker that never answers")
    return box.get("error")


def test_a_tracker_that_never_answers_is_dropped_and_the_run_finishes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(calls, "CALL_TIMEOUT_S", TIMEOUT_S)
    release = threading.Event()
    hangs, other, run = Hangs(release), Hangs(release, at=99, name="answers"), tmp_path / "run"
    exp = from_config(make_config(TINY))
    try:
        with caplog.at_level(logging.WARNING, logger="phalanx.tracking"):
            error = _watched(lambda: train(exp, run, tracking=[hangs, other]), release)
        logged, finished = list(hangs.logged), list(hangs.finished)  # (before its call is released)
    finally:
        release.set()
    assert error is None, error
    assert store.is_finished(run) and [r["round"] for r in store.read_rows(run)] == [0, 1, 2, 3, 4]
    assert logged == [0, 1] and finished == []  # (dropped at round 2; a hung tracker is not called again)
    assert other.logged == [0, 1, 2, 3, 4] and other.finished == ["finished"]  # the other tracker: every row
    assert all(name.startswith("phalanx-tracker-") for name in hangs.threads | other.threads)
    (record,) = [r for r in caplog.records if r.name == "phalanx.tracking"]
    assert "failed at round 2" in record.getMessage() and f"no answer within {TIMEOUT_S:g} s" in record.getMessage()


def test_a_tracker_that_never_answers_while_starting_refuses_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(calls, "CALL_TIMEOUT_S", TIMEOUT_S)
    release = threading.Event()
    hangs, run = Hangs(release, hang_start=True), tmp_path / "run"
    exp = from_config(make_config(TINY))
    try:
        error = _watched(lambda: train(exp, run, tracking=[hangs]), release)
    finally:
        release.set()
    assert isinstance(error, RuntimeError)
    assert str(error) == f"tracker hangs did not start its run (no answer within {TIMEOUT_S:g} s)"
    assert not store.is_finished(run) and hangs.logged == []


def test_what_a_tracker_raises_on_its_thread_is_raised_on_the_runs() -> None:
    """A stop (Ctrl-C, the grid's) raised inside a tracker's call reaches the run's thread as itself."""
    thread = calls.OwnThread("t", TIMEOUT_S)

    def stops() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        thread.call(stops)
    assert thread.call(lambda x: x + 1, 1) == 2  # (the thread serves the next call)
    thread.stop()
    thread.thread.join(WATCHDOG_S)
    assert not thread.thread.is_alive()


def test_two_tracker_objects_of_one_name_are_refused() -> None:
    """Before, the second replaced the first, which heard nothing (this file's first test met it)."""
    from phalanx.errors import ConfigError
    from phalanx.experiments.tracking import Tracking

    release = threading.Event()
    with pytest.raises(ConfigError, match="each tracker named once"):
        Tracking.of_names([Hangs(release), Hangs(release)])


def test_a_stop_while_a_tracker_call_runs_is_not_held_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (here SIGINT sent to the main thread from inside the tracker's call) reaches the run while a tracker's
    ``log`` is still running: the run stops with ``KeyboardInterrupt`` without waiting for the call — its ``finish``
    is waited for the stop's grace only. A review of the thread's first version: the stop waited out the call (a
    slow server's 20 s; a hung one's whole timeout, 300 s). The call is released by a watchdog 60 s after the stop is
    sent (not after the test's start: under two test workers' load the run's first rounds are not the test's clock);
    the stop must have reached the test before."""
    import signal

    monkeypatch.setattr(calls, "CALL_TIMEOUT_S", 120.0)
    monkeypatch.setattr(calls, "STOP_GRACE_S", 0.5)
    release = threading.Event()

    class Interrupted(Hangs):
        def log(self, step: int, metrics: Mapping[str, float]) -> None:
            if step >= 2:
                watchdog.start()
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            super().log(step, metrics)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a test before may have left another)
    watchdog = threading.Timer(60.0, release.set)
    mine = Interrupted(release)
    exp = from_config(make_config(TINY))
    try:
        with pytest.raises(KeyboardInterrupt):
            train(exp, None, tracking=[mine])
        assert not release.is_set(), "the stop waited for the tracker's call"
        assert mine.logged == [0, 1] and mine.finished == []
    finally:
        watchdog.cancel()
        release.set()
        signal.signal(signal.SIGINT, previous)


def test_a_stop_that_lands_while_the_call_is_queued_still_shortens_the_later_waits() -> None:
    """The window the end-to-end test above met under two test workers' load (its watchdog fired): the tracker's thread
    took its job and sent the stop before the run's thread had begun to wait for the answer. The stop then came out of
    the queueing, outside the ``except`` that marks the stop, and the ``finish`` that followed waited the whole call
    timeout behind the call still running. Here the queue itself holds the run's thread until the signal is sent, so
    the stop lands there every time."""
    import queue
    import signal

    release, sent = threading.Event(), threading.Event()
    thread = calls.OwnThread("t", WATCHDOG_S)
    jobs = thread.jobs

    class HeldWhileTheJobRuns:
        """The tracker's queue; ``put`` returns only once the job has sent its stop (which lands in this wait)."""

        def put(self, job: Any) -> None:
            jobs.put(job)
            sent.wait(WATCHDOG_S)

        def get(self) -> Any:
            return jobs.get()

    def stops_then_hangs() -> None:
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        sent.set()
        release.wait(WATCHDOG_S)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    thread.jobs = HeldWhileTheJobRuns()  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            thread.call(stops_then_hangs)
        assert sent.is_set() and not release.is_set()
        assert thread.stopped, "a stop that lands as the call is queued was not marked: the finish would wait it out"
    finally:
        release.set()
        signal.signal(signal.SIGINT, previous)
        thread.jobs = jobs
        thread.stop()
    assert isinstance(jobs, queue.SimpleQueue)


def test_a_stop_whose_signal_the_wait_missed_is_seen_within_a_slice() -> None:
    """CPython's lock wait is not woken by a signal whose C handler ran after the thread released the GIL and before
    it entered the wait (127 of 3,000 signals sent as a call starts, on a quiet machine): that Ctrl-C waited out the
    tracker's call, which CI met twice in the end-to-end test above. ``_thread.interrupt_main`` makes that state on
    purpose — the signal is pending and no wait is interrupted — so the run's thread must look for it between slices
    of its wait. One long wait (the code before) returns only when the watchdog frees the call 60 s later."""
    import _thread
    import signal

    release = threading.Event()
    watchdog = threading.Timer(60.0, release.set)
    thread = calls.OwnThread("t", WATCHDOG_S)

    def pending_stop_then_hangs() -> None:
        watchdog.start()
        _thread.interrupt_main(signal.SIGINT)
        release.wait()

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            thread.call(pending_stop_then_hangs)
        assert not release.is_set(), "the stop waited for the tracker's call"
        assert thread.stopped
    finally:
        watchdog.cancel()
        release.set()
        signal.signal(signal.SIGINT, previous)
        thread.stop()


def test_a_tracker_timeout_that_is_not_a_positive_finite_number_is_refused() -> None:
    """NaN would have made the run's sliced waits spin (``Event.wait(nan)`` returned at once: a call dropped at
    once); 0, a negative number, inf, a bool or a string: a one-line error naming ``tracking.timeout``."""
    from phalanx.errors import ConfigError
    from phalanx.experiments.tracking import Tracking

    release = threading.Event()
    for bad in (float("nan"), float("inf"), 0, -1.0, True, "10"):
        with pytest.raises(ConfigError, match=r"tracking\.timeout"):
            Tracking({"hangs": Hangs(release)}, timeout=bad)  # type: ignore[arg-type]
    assert Tracking({"hangs": Hangs(release)}, timeout=2.5).timeout == 2.5
