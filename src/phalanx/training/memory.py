"""Keep large freed blocks in the process heap, so that every round does not page-fault its tensors afresh.

A simulated round allocates a few tensors the size of the worker matrix (vmap's per-parameter gradients and their
concatenation: 100–600 MB at n = 200–1,000 for a 79k-parameter MLP). glibc serves blocks above its mmap threshold
(at most 32 MiB by default) with fresh ``mmap`` pages and unmaps them on free, so the kernel maps and zeroes them
again every round: measured here as half of the round at n ≥ 200 (docs/benchmarks.md). Raising the mmap and trim
thresholds (``mallopt``) keeps those blocks for reuse. It changes only how this process's heap returns memory to the
system; nothing is changed on other platforms or allocators. ``PHALANX_NO_MALLOC_TUNING=1`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
_DONE = False


def tune_allocator(mmap_threshold: int = 1 << 30, trim_threshold: int = 2 << 30) -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True if the setting is in force."""
    global _DONE
    if _DONE:
        return True
    if os.environ.get("PHALANX_NO_MALLOC_TUNING") or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, another allocator)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt takes an int: 1 GiB and 2 GiB fit. It returns 1 on success.
    ok = mallopt(M_MMAP_THRESHOLD, min(mmap_threshold, 2**31 - 1)) == 1
    ok = mallopt(M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)) == 1 and ok
    _DONE = ok
    return ok
