"""The norm kernel's passes alone against one pass ``x.sum(0)``: the one-pass estimates (with and without the rows'
largest squares) and the exact float64 norms of every row.

    PYTHONPATH=src .venv/bin/python benchmarks/norm_passes.py [--threads 2] [--reps 15]

Gaussian rows (float32, seed 0) at n = 20, d = 10⁵ (8 MB: from the cache) and n = 50, d = 10⁶; medians of
``--reps`` calls, each kind timed in turn. It prints the kernel's vector width (16 float64 lanes per vector with
AVX-512, 4 otherwise). It calls only functions that existed before the four-lane path, so run against an older
checkout's ``src`` it times that build. Times are measured lower bounds under whatever load the machine has;
print ``uptime`` beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from phalanx.aggregators import _rowops


def _median_ms(call: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, choices=range(1, 65), metavar="N",
                        help="torch threads, 1..64 (default 1)")
    parser.add_argument("--reps", type=int, default=15, choices=range(1, 1001), metavar="R",
                        help="calls of each, 1..1000 (default 15)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if _rowops._normkernel is None:
        raise SystemExit("the C norm kernel is not built here (setup.py)")
    width = _rowops._normkernel.vector_width() if hasattr(_rowops._normkernel, "vector_width") else 16
    print(f"{args.threads} thread(s), medians of {args.reps}, {width} float64 lanes per vector")
    for n, d in [(20, 10**5), (50, 10**6)]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(d, generator=g) + torch.randn(n, d, generator=g)
        bad = torch.zeros(n, dtype=torch.bool)
        largest = torch.empty(n, dtype=torch.float64)
        pass_ms = _median_ms(partial(torch.sum, x, 0), args.reps)
        est = _median_ms(partial(_rowops._kernel_sqnorms, x), args.reps)
        est_max = _median_ms(partial(_rowops._kernel_sqnorms, x, largest), args.reps)
        exact = _median_ms(partial(_rowops.float64_row_norms, x, bad), args.reps)
        print(f"n={n} d={d}: pass {pass_ms:.3g} ms; estimates {est:.3g} ms ({est / pass_ms:.2f}x), with the largest "
              f"squares {est_max:.3g} ms ({est_max / pass_ms:.2f}x); exact norms of every row {exact:.3g} ms "
              f"({exact / pass_ms:.2f}x)")


if __name__ == "__main__":
    main()
