"""How often a signal sent as a wait begins is seen only when the wait ends (the reason for :mod:`phalanx.waits`).

    .venv/bin/python scripts/signal_race.py [--tries 3000] [--hold 0.5]

Each try does what a tracker's call does to the run's thread (``tests/test_tracking_hung.py``): the main thread
queues a job and waits for it (``Event.wait`` with a timeout, as the run's thread did), and the job — on another thread
— sends SIGINT to the main thread at once, then holds for ``--hold`` seconds before it answers. A signal that lands
*during* the wait interrupts it: KeyboardInterrupt long before the job answers. One whose C handler runs after the main
thread released the GIL and before it entered the wait is noticed only when the job answers: *late*. The same tries
then wait with :func:`phalanx.waits.wait_event` (slices of 0.2 s): late only if a hold is shorter than a slice.
Prints one line per way of waiting, e.g. ``Event.wait: 127 of 3000 signals late``. Nothing is asserted: the count
depends on the machine and its load — on the 2-core development machine (2026-12-07), 127 of 3,000 quiet, and 297 of
300 (``--tries 300 --hold 0.3``) with the test suite running beside it (load about 4), where the main thread is
often descheduled between queueing the job and waiting for it; ``phalanx.waits.wait_event``: 0 of 300.
"""

from __future__ import annotations

import argparse
import queue
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from phalanx import waits


def late_signals(tries: int, hold: float, wait: Callable[[threading.Event, float], object]) -> int:
    """Of ``tries`` SIGINTs sent by a job as the main thread began to wait for it, how many were seen only once the job
    had answered."""
    jobs: queue.SimpleQueue[tuple[threading.Event, threading.Event] | None] = queue.SimpleQueue()

    def serve() -> None:
        while (job := jobs.get()) is not None:
            done, answered = job
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            answered.wait(hold)  # (the job's own work: it answers after `hold`)
            answered.set()
            done.set()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    late = 0
    for _ in range(tries):
        done, answered = threading.Event(), threading.Event()
        try:
            jobs.put((done, answered))
            wait(done, 10 * hold + 1.0)
        except KeyboardInterrupt:
            late += answered.is_set()
        done.wait()  # (the job has answered before the next try)
    jobs.put(None)
    server.join()
    return late


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=3000, help="signals sent per way of waiting (default 3000)")
    ap.add_argument("--hold", type=float, default=0.5, help="seconds each job holds before it answers (default 0.5)")
    args = ap.parse_args(argv)
    if args.tries < 1 or not 0.0 < args.hold <= 60.0:
        ap.error("--tries must be >= 1 and --hold in (0, 60]")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for name, wait in (("Event.wait", lambda e, t: e.wait(t)), ("phalanx.waits.wait_event", waits.wait_event)):
            print(f"{name}: {late_signals(args.tries, args.hold, wait)} of {args.tries} signals late", flush=True)
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    main()
