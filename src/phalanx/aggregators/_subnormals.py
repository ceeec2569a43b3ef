r"""Flush-to-zero arithmetic for the components that multiply rows together (on the CPU).

A *subnormal* (denormal) number is a non-zero value below the dtype's smallest normal magnitude: below
:math:`2^{-126} \approx 1.2\cdot 10^{-38}` in float32 and bfloat16, below :math:`2^{-1022}` in float64. x86 CPUs
handle an operation that reads or produces one through a microcode assist, tens of times slower. So a Byzantine
worker can slow a rule at no cost to itself, with rows of subnormals, or with *normal* rows whose products with
the honest values fall below the smallest normal (rows of ±1.5·10⁻³⁸ against honest entries below 1, or of ±10⁻²²
against each other). Measured on a 2-core Xeon (``benchmarks/subnormal_rules.py --off``): four float32 rows of
subnormals among twenty made Krum 28× slower and eight other components 3.6–25× slower; rows of ±1.5·10⁻³⁸ made
them up to 13× slower.

The components that measured far slower set ``subnormals_as_zero``; on the CPU their arithmetic then runs inside
:func:`denormals_are_zero`: the x86 MXCSR modes FTZ (a result that would be subnormal is 0) and DAZ (a subnormal
operand reads as 0) on the calling thread and on every thread of the OpenMP team that torch's loops and MKL's
products run on (the C kernel ``denormals_zero`` of ``_normkernel.c``, which shares torch's libgomp), and each
thread's previous bits back afterwards (``denormals_restore``). Each call costs two OpenMP parallel regions,
microseconds. A thread starts with its creator's floating-point state, so the team's threads, when the block or the
kernel's first region creates them, get the bits the caller had before the block, not the modes
(``tests/test_subnormals.py::test_the_first_flagged_call_of_a_process_leaves_no_pool_thread_with_the_modes``).
The convention: in these components' arithmetic on the CPU, every value below the smallest normal —
an input, an intermediate, a result — counts as 0. An input row is still returned bit for bit where a rule selects
it (Krum). On GPUs, which compute subnormals at full speed, IEEE gradual underflow stays: results there may differ,
by less than the smallest normal in each operation.

Without the kernel (a build without a C compiler) only the calling thread gets the modes, through
``torch.set_flush_denormal``, and loses them afterwards: one thread is protected, a multi-threaded product is not.
``PHALANX_NO_KERNEL=1`` (which sends the norm passes down their torch paths) leaves this to the kernel.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from phalanx.aggregators import _rowops
from phalanx.aggregators._teams import team_threads

__all__ = ["denormals_are_zero", "denormals_zero_threads"]


PYTHON_THREAD_WAIT_S = 5.0
"""How long :func:`_native_threads_started` waits for a Python thread being started to record its id."""


@contextmanager
def denormals_are_zero(x: torch.Tensor) -> Iterator[None]:
    """Run the block with FTZ and DAZ on (see the module docstring) when ``x`` is on a CPU; on other devices, as it
    is. Every thread of the team gets back the FTZ and DAZ bits it had, also when the block raises."""
    if x.device.type != "cpu":
        yield
        return
    if _rowops._normkernel is not None:
        kernel = _rowops._normkernel
        threads = team_threads(x.numel())  # a smaller input opens no OpenMP team (_teams)
        before = _thread_ids() if threads == 1 else None
        saved = kernel.denormals_zero(threads)
        try:
            yield
        finally:
            kernel.denormals_restore(saved)
            if before is not None and torch.get_num_threads() > 1 and _native_threads_started(before):
                # The block started the team (torch parallelised a small input's product): its new threads
                # copied the caller's modes when they were created, so they get the caller's previous bits.
                kernel.denormals_restore(saved[:2] * torch.get_num_threads())
        return
    torch.set_flush_denormal(True)  # the calling thread only; torch offers no way to read the mode back
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _thread_ids() -> frozenset[int] | None:
    """The ids of this process's threads (Linux ``/proc``), or None where they cannot be read."""
    try:
        return frozenset(int(t) for t in os.listdir("/proc/self/task"))
    except (OSError, ValueError):
        return None


def _native_threads_started(before: frozenset[int]) -> bool:
    """Whether threads that are not Python's started since ``before`` and still run.

    A thread starts with the floating-point state of the thread that creates it. The first OpenMP parallel region of
    a process creates the team's threads, so a region opened inside the single-thread path of
    :func:`denormals_are_zero` would hand them the modes for good. Thread ids, not their number (a thread that ended
    meanwhile hid the team's new one from a count), and Python's own threads left out (another Python thread
    starting threads made the restore open a team that torch never opened, and a later ``os.fork`` child hung):
    both found by a review. A Python thread being started is listed by ``threading`` before its OS thread has
    recorded its id (``native_id`` None until it does); while one is, a new id may be that thread's, so the check
    waits for it — for :data:`PYTHON_THREAD_WAIT_S` at most — instead of a fixed 11 ms, which a loaded machine
    outlasted (a flaky-test review: the restore then opened a team, and a forked child hung)."""
    now = _thread_ids()
    if now is None or not now - before:
        return False
    candidates = set(now - before)
    deadline = time.monotonic() + PYTHON_THREAD_WAIT_S
    while True:
        candidates &= _thread_ids() or frozenset()
        python = threading.enumerate()
        candidates -= {t.native_id for t in python}
        if not candidates:
            return False
        if all(t.native_id is not None for t in python) or time.monotonic() >= deadline:
            return True
        time.sleep(0.001)


def denormals_zero_threads(threads: int) -> int:
    """How many threads of an OpenMP team of ``threads`` have FTZ and DAZ on (0 without the kernel)."""
    if _rowops._normkernel is None:
        return 0
    return int(_rowops._normkernel.denormals_zero_threads(threads))
