"""Each tracker's calls on a thread of its own, each waited for at most :data:`CALL_TIMEOUT_S` seconds.

A tracker talks to something outside the run — an MLflow server, a W&B service, a disk — and a call that never
returns (a server that accepts the connection and never answers, a user's tracker stuck on a lock) would hold the run
for ever. So :class:`OwnThread` runs one tracker's ``start``, ``log`` and ``finish`` in order on one daemon thread (a
client library sees one thread, as before) while the run's thread waits for each call at most the timeout; a call
that does not return in time raises :class:`Hung`, the tracker is dropped like one that fails
(:mod:`phalanx.experiments.tracking.callback`) and never called again — its thread is left to the process's end. What
a call raises is raised again in the run's thread, ``KeyboardInterrupt`` and the grid's stop included, and a signal
still reaches the run's thread while it waits: the run stops at once, and the tracker's ``finish`` — queued behind
the call still running — is waited for :data:`STOP_GRACE_S` at most.

The run's thread waits in slices (:func:`phalanx.waits.wait_event`): one wait of the whole timeout missed a Ctrl-C
whose signal landed as the wait began, and waited out the tracker's call (CI met it twice).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from phalanx.waits import wait_event

CALL_TIMEOUT_S = 300.0
"""How long the run waits for one call of a tracker. MLflow's own HTTP client gives up on a request after 120 s and
retries with back-off, so a server that is down is normally reported by the tracker itself well within this."""
STOP_GRACE_S = 5.0
"""Once a wait for a call was cut short by a stop (Ctrl-C, the grid's stop, SIGTERM), how long each later call of
that tracker — its ``finish("interrupted")``, queued behind the call still running — is waited for: a stop is not
held for :data:`CALL_TIMEOUT_S` (a review: it waited out a slow tracker's call, a hung one's for 300 s)."""


class Hung(Exception):
    """A tracker's call did not return within the timeout."""


class OwnThread:
    """Calls to one tracker, in order, on a daemon thread named after it (see the module's docstring)."""

    def __init__(self, name: str, timeout: float) -> None:
        self.name, self.timeout = name, timeout
        self.jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], threading.Event, dict[str, Any]]
                                     | None] = queue.SimpleQueue()
        self.hung = False
        self.stopped = False
        """A wait for one of its calls was cut short by a stop: later calls are waited for :data:`STOP_GRACE_S`."""
        self.thread = threading.Thread(target=self._serve, name=f"phalanx-tracker-{name}", daemon=True)
        self.thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the tracker's thread; its value, or what it raised; :class:`Hung` after the timeout."""
        if self.hung:
            raise Hung(f"an earlier call of tracker {self.name} has not returned")
        done, box = threading.Event(), dict[str, Any]()
        timeout = min(self.timeout, STOP_GRACE_S) if self.stopped else self.timeout
        try:  # (the queueing inside: the call may start, and a stop land, before the wait has begun)
            self.jobs.put((fn, args, done, box))
            answered = wait_event(done, timeout)
        except BaseException:  # a stop reached the run's thread while the call runs on
            self.stopped = True
            raise
        if not answered:
            self.hung = True
            raise Hung(f"no answer within {timeout:g} s" + (" while the run stops" if self.stopped else ""))
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def stop(self) -> None:
        """End the thread once its calls are done (a hung one ends with the process)."""
        self.jobs.put(None)

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            fn, args, done, box = job
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # handed to the run's thread, which decides (FAILS or a stop)
                box["error"] = exc
            finally:
                done.set()
