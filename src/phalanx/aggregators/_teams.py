"""How many threads a C kernel may ask OpenMP for: torch's own count, but only where torch itself would open its
thread team.

GNU libgomp cannot use a thread team inherited through ``os.fork``: once a team's threads have started, a forked
child hangs in its first parallel region. torch opens its team only for an elementwise loop of at least
``at::internal::GRAIN_SIZE`` elements (:data:`GRAIN`), so a process that only ever computed on small tensors forks
safely. Phalanx's kernels (``_cwkernel``, ``_normkernel``, ``_sumkernel``) share torch's libgomp, so on a smaller
input they run on the calling thread and open no team either (``tests/test_kernel_fork.py``).
"""

from __future__ import annotations

import torch

__all__ = ["GRAIN", "team_threads"]

GRAIN = 32_768
"""Elements below which torch runs an elementwise loop on the calling thread (``at::internal::GRAIN_SIZE``)."""


def team_threads(elements: int) -> int:
    """Threads for a kernel call that reads ``elements`` values: ``torch.get_num_threads()`` (at least 1) from
    :data:`GRAIN` elements on, 1 (no team) below."""
    return max(1, torch.get_num_threads()) if elements >= GRAIN else 1
