"""Shared by the process tests: a rule that holds at a chosen call (so a test signals a process at a point it chose,
an event, not a race with the machine's speed), and the live children of a process, from /proc."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

JOB_TIMEOUT_S = float(os.environ.get("PHALANX_TEST_JOB_TIMEOUT", "400"))
"""A process job's hard bound in the tests (a hung job fails at it; a passing one never waits for it). Above the code's
own ``JOIN_TIMEOUT_S`` (120 s) plus a run: on the 2-core machine under load, starting 4–5 processes alone took 80 s,
and at the former 120 s a slow start was killed before the code's own wait for a late rank could report it."""

HONEST_ROUND_TIMEOUT_S = 20.0
"""``round_timeout`` of a process test whose verdict needs every honest rank in every round it asserts on (which ranks
were missing, that none was, the round a run stopped at, a resumed run equal to the simulated one). CI runs the suite
on 2 cores at load 5–14: a rank there can stall for seconds (descheduled, paging in, its evaluation), and at the
former 1.0–1.5 s one such stall made an honest rank "missing" and changed the verdict. 20 s is what this suite's
honest-only runs already rely on (``FED_JOB``, the serverless mesh, gossip). A rank a test means to be SILENT sleeps
on a file the test creates once rank 0 has declared it missing (``PHALANX_TEST_SLEEP=RANK:ROUND:FILE``), so such a
test pays this timeout once per silent round and never depends on how fast the machine runs."""

HONEST_STALL_S = 6.0
"""The adversary "a loaded machine": an honest rank stalled this long (``PHALANX_TEST_SLEEP=RANK:ROUND:6``) in a round
the test asserts on. Longer than every ``round_timeout`` the process tests had before (1.0–1.5 s in the parameter
server's fault tests, 4–5 s in ``BASE``'s jobs and the gossip tests), so it fails them; far below
:data:`HONEST_ROUND_TIMEOUT_S`, so the tests that carry it keep their verdict."""


HOLD = """
import os
import time

import torch

CALLS = [0]


class HoldingMedian:
    \"\"\"The coordinate-wise median; with HOLD_AT=<call>:<dir> set, its call number <call> (of this process) writes
    <dir>/holding and waits, forever: the test signals the process there, at a point it chose.\"\"\"

    def __init__(self, f=0):
        self.f = f

    def __call__(self, x):
        CALLS[0] += 1
        spec = os.environ.get("HOLD_AT")
        if spec and CALLS[0] == int(spec.split(":")[0]):
            open(os.path.join(spec.split(":", 1)[1], "holding"), "w").close()
            while True:
                time.sleep(1)
        return x.median(dim=0).values
"""


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def supervised(procs: list[subprocess.Popen[bytes]], timeout_s: float, before: Callable[[], object] | None = None,
               ) -> int:
    """A launched job's exit code: ``before()`` first (the test's script against the live ranks, if any), then
    :func:`phalanx.distributed.launch.supervise` to the end; every rank still alive afterwards — an assertion that
    failed in ``before``, a timeout — is killed and reaped, so no test leaves a rank behind."""
    from phalanx.distributed import launch

    try:
        if before is not None:
            before()
        return launch.supervise(procs, grace_s=5.0, timeout_s=timeout_s, say=lambda s: None)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
