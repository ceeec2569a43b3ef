"""Start the ranks of a job on this machine, as torchrun would, but without its agent's all-or-nothing policy.

torchrun's elastic agent stops every local worker as soon as one fails (measured: SIGKILL of one rank under
``torchrun --nproc-per-node 2`` → the agent sends SIGTERM to the other). That is the opposite of what the parameter-
server topology is for, so ``phalanx launch`` starts the N processes itself, with the variables torchrun sets
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), reports a worker
that dies, and lets rank 0 decide whether training goes on. The job's result is rank 0's exit status.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from phalanx.distributed.env import free_port

GRACE_S = 10.0
"""After rank 0 exits, the others get this long to exit on their own before they are terminated."""


def rank_env(rank: int, world_size: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The environment of one rank: the torchrun variables, one thread per process unless set."""
    env = dict(os.environ)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0", "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "PYTHONUNBUFFERED": "1",
    })
    env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does for several processes per machine
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # the store's timeout warnings are expected when workers fail
    return env


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the rank gets SIGTERM when the process that started it ends, however it ends (SIGKILL
    included: Linux's parent-death signal), so a killed ``phalanx launch`` leaves no rank behind; a rank whose parent
    is already gone when the signal is armed ends at once. Nothing elsewhere (no such signal)."""

    def arm() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):  # not Linux
            return
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


PR_SET_PDEATHSIG = 1


def spawn(
    world_size: int, worker_args: Sequence[str], *, master_addr: str = "127.0.0.1", master_port: int | None = None,
    extra_env: dict[str, str] | None = None, stdout: IO[bytes] | int | None = None,
    stderr: IO[bytes] | int | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start ranks ``0 … world_size−1`` of ``python -m phalanx.distributed.worker WORKER_ARGS``."""
    port = master_port or free_port(master_addr)
    procs = []
    for rank in range(world_size):
        env = rank_env(rank, world_size, master_addr, port)
        env.update(extra_env or {})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "phalanx.distributed.worker", *worker_args], env=env, stdout=stdout, stderr=stderr,
            preexec_fn=_die_with_parent(os.getpid()) if sys.platform == "linux" else None,
        ))
    return procs


def supervise(
    procs: list[subprocess.Popen[bytes]], *, grace_s: float = GRACE_S, timeout_s: float | None = None,
    say: Callable[[str], None] = print,
) -> int:
    """Wait for rank 0; report workers that die on the way; end the rest afterwards. Rank 0's exit status.

    ``timeout_s`` bounds the whole job (then every rank is killed and 124 returned).
    """
    start = time.monotonic()
    reported: set[int] = set()
    try:
        while procs[0].poll() is None:
            for r, p in enumerate(procs[1:], start=1):
                code = p.poll()
                if code not in (None, 0) and r not in reported:
                    reported.add(r)
                    how = f"signal {-code}" if code < 0 else f"exit status {code}"
                    say(f"rank {r} stopped ({how}); training goes on without it if the topology allows")
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                say(f"job still running after {timeout_s:g} s: stopping every rank")
                _end(procs, 0.0)
                return 124
            time.sleep(0.1)
        _end(procs[1:], grace_s)
    except BaseException:  # Ctrl-C, SIGTERM (StopRequested), anything: no rank outlives the launcher
        _end(procs, 2.0)
        raise
    return int(procs[0].returncode)


def _end(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.poll() is None:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def worker_args(config: Path | None, overrides: Sequence[str], out: Path | None, point: int | None = None) -> list[str]:
    """The command-line arguments of :mod:`phalanx.distributed.worker` for one job."""
    args = [] if config is None else [str(config)]
    for item in overrides:
        args += ["--set", item]
    args += ["--no-out"] if out is None else ["--out", str(out)]
    if point is not None:
        args += ["--point", str(point)]
    return args
