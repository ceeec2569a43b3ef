"""How much memory this process can still get: what a plan checks before it allocates (a measurement's inputs, a
model's rows, a checkpoint's weights), so that a plan too large for the machine is one line, not the machine's
memory. Standard library only: every layer may ask."""

from __future__ import annotations

import os
from pathlib import Path

MEMORY_SHARE = 0.8
"""The share of the available memory a measurement may plan to use (the rest is the margin)."""


def available_memory() -> int | None:
    """Bytes of memory this process can still get: ``MemAvailable`` of ``/proc/meminfo`` (else the free physical
    pages), lowered to what the control group's limit leaves; None where neither is known."""
    avail: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        avail = None
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail
