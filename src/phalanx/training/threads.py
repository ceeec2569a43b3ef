"""One fixed team of intra-op threads for a run: what bit-for-bit reproducibility asks of OpenMP and MKL.

torch splits a reduction over many elements (more than its grain size, 32,768) into one chunk per thread of its
OpenMP team and adds the chunks' sums, so a float result depends on how many threads the team has — measured:
``geomed`` on an MLP with d = 38,410 gives another θ after the first round on 1 thread than on 2 (docs/design.md,
"Randomness"). The count is fixed by ``torch.set_num_threads``, but two runtimes may still hand out fewer threads
than asked, by the machine's load:

* OpenMP's *dynamic adjustment* (``OMP_DYNAMIC=true`` in the environment, or ``omp_set_dynamic(1)``): GCC's libgomp,
  which torch's Linux wheels ship, then gives a parallel region max(1, cpus − ⌊15-minute load average + 0.1⌋)
  threads (libgomp's ``gomp_dynamic_max_threads``), so the same run on a busy machine sums in another order.
* MKL's own dynamic mode, on by default (``MKL_DYNAMIC``), in which MKL "may use fewer threads than specified";
  Intel's conditions for reproducible results ask for both off ("Obtaining Numerically Reproducible Results",
  oneMKL Developer Guide). ``torch.set_num_threads`` turns MKL's off; a process that never calls it keeps it on.

:func:`pin_threads`, called when a run's loop opens, turns both off for the calling thread and keeps the thread
count, so the team a run gets is the count it asked for, whatever the load (``tests/test_determinism.py``). It
does not make runs with different thread counts agree: that is not promised.

Which count a run gets is chosen above this layer (:mod:`phalanx.experiments.threads`: it may write its cache
file, the training layer writes none).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import torch

__all__ = ["openmp_runtimes", "pin_threads"]

_RUNTIMES: list[Any] | None = None


def openmp_runtimes() -> list[Any]:
    """The OpenMP runtimes this process has loaded (Linux: every mapped ``libgomp``/``libomp``/``libiomp``, as
    ``ctypes.CDLL`` handles of the copies already loaded — so their calls change the state torch uses); empty
    elsewhere or when none is loaded. Looked up once, when one is found (torch loads its runtime on import)."""
    global _RUNTIMES
    if _RUNTIMES is not None:
        return _RUNTIMES
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            fields = [line.split(None, 5) for line in fh]
    except OSError:
        return []
    paths = sorted({f[5].strip() for f in fields if len(f) == 6 and any(
        name in f[5].rsplit("/", 1)[-1] for name in ("libgomp", "libomp", "libiomp"))})
    out = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.omp_set_dynamic.argtypes = [ctypes.c_int]
            lib.omp_get_dynamic.restype = ctypes.c_int
        except (OSError, AttributeError):  # not an OpenMP runtime after all, or not loadable again
            continue
        out.append(lib)
    if out:
        _RUNTIMES = out
    return out


def pin_threads() -> int:
    """Keep this thread's intra-op team at ``torch.get_num_threads()`` whatever the load: OpenMP's dynamic adjustment
    off in every loaded runtime, MKL's dynamic mode off (``torch.set_num_threads`` with the same count does it).
    Returns the thread count. Idempotent; the count itself is left as it is."""
    threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    for lib in openmp_runtimes():
        lib.omp_set_dynamic(0)
    return threads
