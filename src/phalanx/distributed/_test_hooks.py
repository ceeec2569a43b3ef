"""TEST-ONLY fault injection. Never set these variables in a real run.

``PHALANX_TEST_SLEEP="RANK:ROUND:WHAT[,RANK:ROUND:WHAT…]"`` makes rank RANK stop answering before it computes its
vector of round ROUND: for WHAT seconds when WHAT is a number, else until the file WHAT exists (a test wakes it at a
point it chose); WHAT = ``exit`` makes it die there instead (``os._exit(1)``, as a crash: its sockets close).

``PHALANX_TEST_HOLD="ROUND:PATH[,ROUND:PATH…]"`` makes the parameter server stop before it publishes θ of round
ROUND, say ``holding round ROUND`` on stderr, and wait until the file PATH exists: a test can then act on the workers
at a known point (every live worker is waiting for that θ) instead of racing the job.
"""

from __future__ import annotations

import os
import sys
import time

VAR = "PHALANX_TEST_SLEEP"
HOLD_VAR = "PHALANX_TEST_HOLD"


def _entries(var: str, fields: int) -> list[list[str]]:
    raw = os.environ.get(var, "").strip()
    return [p.strip().split(":", fields - 1) for p in raw.split(",") if p.strip()]


_SLEEP = {(int(r), int(t)): what for r, t, what in _entries(VAR, 3)}
_HOLD = {int(t): path for t, path in _entries(HOLD_VAR, 2)}


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


def maybe_sleep(rank: int, round_: int) -> None:
    """Stop answering if the test plan says so for this (rank, round)."""
    what = _SLEEP.get((rank, round_))
    if not what:
        return
    if what == "exit":
        print(f"[phalanx rank {rank}] {VAR}: exiting in round {round_} (test hook)", file=sys.stderr, flush=True)
        os._exit(1)
    try:
        seconds: float | None = float(what)
    except ValueError:
        seconds = None
    say = f"sleeping {seconds:g} s" if seconds is not None else "sleeping until the test wakes it"
    print(f"[phalanx rank {rank}] {VAR}: {say} in round {round_} (test hook)", file=sys.stderr, flush=True)
    if seconds is not None:
        time.sleep(seconds)
    else:
        _wait_for(what)


def maybe_hold(round_: int) -> None:
    """Wait for the test's file before round ``round_`` if the test plan says so."""
    path = _HOLD.get(round_)
    if path is None:
        return
    print(f"[phalanx rank 0] {HOLD_VAR}: holding round {round_} (test hook)", file=sys.stderr, flush=True)
    _wait_for(path)
