"""TEST-ONLY fault injection. Never set these variables in a real run.

``PHALANX_TEST_SLEEP="RANK:ROUND:SECONDS[,RANK:ROUND:SECONDS…]"`` makes rank RANK sleep SECONDS before it computes
its vector of round ROUND — a worker that stops answering for a while (tests/test_distributed_faults.py).
"""

from __future__ import annotations

import os
import sys
import time

VAR = "PHALANX_TEST_SLEEP"


def _plan() -> dict[tuple[int, int], float]:
    raw = os.environ.get(VAR, "").strip()
    plan: dict[tuple[int, int], float] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        rank, round_, seconds = item.split(":")
        plan[(int(rank), int(round_))] = float(seconds)
    return plan


_PLAN = _plan()


def maybe_sleep(rank: int, round_: int) -> None:
    """Sleep if the test plan says so for this (rank, round)."""
    seconds = _PLAN.get((rank, round_))
    if seconds:
        print(f"[phalanx rank {rank}] {VAR}: sleeping {seconds:g} s in round {round_} (test hook)", file=sys.stderr,
              flush=True)
        time.sleep(seconds)
