"""The trackers as one callback of the training loop (:mod:`phalanx.experiments.wiring` places it after the metric
rows are made and before the run directory, so that every tracker has closed its files before a finished run
directory is signed).

- ``on_start``: each tracker starts (or continues) its tracked run — an error here (a server that cannot be reached,
  a store that cannot be written) refuses the run before it trains — and receives the rows it has not seen yet
  (round 0's; on a resume, none twice).
- ``on_round``: every metric row, as it is made, to every tracker still working. A tracker that fails mid-run is
  dropped with one warning line (logger ``phalanx.tracking``): the run trains on and its own results are written.
  Failing is raising an :class:`Exception` — one whose message cannot be printed included — or
  :class:`SystemExit` (a client library that calls ``sys.exit``): :data:`FAILS`. What stops the process itself
  (``KeyboardInterrupt``, the grid's :class:`~phalanx.experiments.signals.StopRequested` and a worker's SIGTERM)
  still stops the run where it is, as anywhere else in a run. A tracker whose call does not return within
  :data:`~phalanx.experiments.tracking.calls.CALL_TIMEOUT_S` (a server that never answers) is dropped the same way
  and never called again (:mod:`phalanx.experiments.tracking.calls`: every call of a tracker runs on a thread of its
  own); one that does not answer while starting refuses the run.
- the end: ``finished`` after the last round (in ``on_finish``), or ``diverged`` / ``failed`` / ``interrupted``
  when the run stops early (:meth:`Tracked.closing`).

What a later session of the same run needs is kept in the run directory's ``tracking.json``: each tracker's ids (an
MLflow run id, a W&B id) and the last round it logged, so that a resumed run continues the same tracked runs and
logs no row twice (the rounds between the last checkpoint and an interruption are trained again, identically, and
not sent again).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from phalanx.errors import PhalanxError
from phalanx.experiments import runfiles, store
from phalanx.experiments.tracking import Tracking, calls
from phalanx.experiments.tracking.base import TrackedRun, TrackerLike, numbers
from phalanx.training.divergence import Diverged
from phalanx.training.loop import Callback, Loop, RoundInfo

log = logging.getLogger("phalanx.tracking")

KEPT = "tracking.json"
"""The run directory's file of what each tracker keeps between sessions of the run."""
KEPT_BYTES = 1 << 20
"""The most bytes of it read (a few identifiers per tracker are kept): a larger one keeps nothing."""
FAILS = (Exception, SystemExit)
"""What a tracker's call may raise without ending the run (the module's docstring): an error, or ``sys.exit`` in
its client library (a review: a tracker raising ``SystemExit`` ended the run, its directory without metrics). Not
``KeyboardInterrupt`` or the signals' exceptions (``BaseException``s): those are the process being stopped."""


def read_kept(run_dir: Path | None) -> dict[str, dict[str, Any]]:
    """What the trackers kept in ``run_dir`` ({} when nothing, or no run directory)."""
    if run_dir is None:
        return {}
    try:  # a hostile file (200,000 nested brackets raised RecursionError: an attacker's review) keeps nothing
        data = runfiles.read_json_object(run_dir / KEPT, KEPT_BYTES)
    except (OSError, PhalanxError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


class Tracked(Callback):
    """Sends one run to its trackers (see the module's docstring). ``run_dir``: the run's directory (None: a run
    without one: nothing is kept, nothing resumes)."""

    def __init__(self, tracking: Tracking, run_dir: Path | None = None) -> None:
        self.tracking = tracking
        self.run_dir = run_dir
        self.kept = read_kept(run_dir)
        self.active: dict[str, tuple[TrackerLike, calls.OwnThread]] = {}
        """The trackers still working, each with the thread its calls run on."""
        self.through: dict[str, int] = {}
        self.loop: Loop | None = None
        self.skip: frozenset[str] = frozenset()

    def on_start(self, loop: Loop) -> None:
        self.loop = loop
        self.skip = frozenset(loop.experiment.columns)
        run_dir = self.run_dir
        name = self.tracking.name or (run_dir.name if run_dir is not None else "run")
        for key, tracker in self.tracking.trackers.items():
            kept = dict(self.kept.get(key, {}))
            run = TrackedRun(name, dict(self.tracking.params), run_dir, None if run_dir is None else run_dir.parent,
                             {k: v for k, v in kept.items() if k != "through"}, loop.resumed)
            thread = calls.OwnThread(key, self._timeout())
            try:
                info = thread.call(tracker.start, run)  # an error: the run is refused before it trains
            except SystemExit as exc:  # ... as one error, not the process's exit
                thread.stop()
                raise RuntimeError(f"tracker {key} exited while starting its run ({_one_line(exc)})") from exc
            except calls.Hung as exc:
                raise RuntimeError(f"tracker {key} did not start its run ({exc})") from None
            except BaseException:
                thread.stop()
                raise
            self.active[key] = (tracker, thread)
            through = kept.get("through")
            self.through[key] = through if isinstance(through, int) and not isinstance(through, bool) else -1
            self.kept[key] = {**dict(info or {}), "through": self.through[key]}
        self._save()
        self._send(loop.rows)

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        if info.row is not None:
            self._send([info.row])

    def on_finish(self, loop: Loop) -> None:
        self.close("finished")

    @contextmanager
    def closing(self) -> Iterator[Tracked]:
        """Close the trackers however the run ends: ``diverged`` (the diverged row sent first), ``interrupted`` (a
        signal), ``failed`` (an error); after a finished run they are closed already."""
        try:
            yield self
        except Diverged:
            if self.loop is not None:
                self._send(self.loop.rows)
            self.close("diverged")
            raise
        except Exception:
            self.close("failed")
            raise
        except BaseException:
            self.close("interrupted")
            raise
        else:
            self.close("finished")

    def close(self, end: str) -> None:
        """Finish every tracker still working (a failure is a warning line: the run's results are written
        anyway)."""
        for key in list(self.active):
            tracker, thread = self.active.pop(key)
            try:
                thread.call(tracker.finish, end)
            except FAILS as exc:
                log.warning("tracker %s could not finish its run (%s); the run's own results are not affected", key,
                            _one_line(exc))
            finally:
                thread.stop()

    def _send(self, rows: list[dict[str, Any]]) -> None:
        """Every row a tracker has not logged yet, to that tracker; a tracker that fails is dropped."""
        sent = False
        for row in rows:
            step = row.get("round")
            if not isinstance(step, int):
                continue
            metrics = numbers(row, self.skip)
            for key in list(self.active):
                if self.through[key] >= step:
                    continue
                try:
                    tracker, thread = self.active[key]
                    thread.call(tracker.log, step, metrics)
                except FAILS as exc:
                    log.warning("tracker %s failed at round %d (%s): it is dropped for the rest of this run, which "
                                "trains on (its metrics are written to its run directory as always)", key, step,
                                _one_line(exc))
                    self._drop(key)
                    continue
                self.through[key] = step
                self.kept[key]["through"] = step
                sent = True
        if sent:
            self._save()

    def _drop(self, key: str) -> None:
        """Stop sending to a tracker that failed; it is told the run failed, as far as it still can be."""
        tracker, thread = self.active.pop(key)
        try:
            if not thread.hung:  # (a hung tracker is never called again)
                thread.call(tracker.finish, "failed")
        except FAILS:  # it failed already: one warning was said
            pass
        finally:
            thread.stop()

    def _timeout(self) -> float:
        """How long one call of a tracker is waited for (:attr:`Tracking.timeout`, or the module's default)."""
        timeout = self.tracking.timeout
        return calls.CALL_TIMEOUT_S if timeout is None else timeout

    def _save(self) -> None:
        """``tracking.json`` in the run directory (nothing without one)."""
        if self.run_dir is None:
            return
        try:
            store.write_artifact(self.run_dir, KEPT, json.dumps(self.kept, indent=1, sort_keys=True).encode())
        except Exception as exc:  # the run's own files come first
            log.warning("could not write %s (%s): a resumed run may log some rows to its trackers again",
                        self.run_dir / KEPT, _one_line(exc))


def _one_line(exc: BaseException) -> str:
    """``exc``'s message on one line of at most 300 characters; never raises (a tracker's exception whose
    ``__str__`` fails is named by its type: a review's such tracker lost the run)."""
    name = type(exc).__name__
    try:
        text = " ".join(str(exc).split())
    except FAILS:
        return f"{name}, whose message cannot be printed"
    if isinstance(exc, SystemExit):
        text = f"{name}: {text}" if text else name
    text = text or name
    return text if len(text) <= 300 else text[:297] + "..."
