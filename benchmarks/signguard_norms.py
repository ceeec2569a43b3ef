"""SignGuard's norm phase: every norm in float64 (the previous path) against the one-pass norm filter.

    PYTHONPATH=src .venv/bin/python benchmarks/signguard_norms.py [--threads 2]

1 thread (or ``--threads``), Gaussian rows around a common random mean (float32, seed 0), n = 20, d = 10⁵ and
n = 50, d = 10⁶; every norm exactly (``row_norms`` for the bad rows and ``float64_row_norms`` on every row: the path
before the one-pass filter), the one-pass filter and one pass ``x.sum(0)`` alternated 7 times, medians. The filter
is timed with every row of S₁ treated as kept (its clipping needs the exact norm of every kept row above the
median: the worst case).
Times are measured lower bounds under whatever load the machine has; print ``uptime`` beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from phalanx.aggregators._rowops import float64_row_norms, median_norm, row_norms, row_sqnorm_estimates
from phalanx.aggregators.signguard import norm_filter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, choices=range(1, 65), metavar="N",
                        help="torch threads, 1..64 (default 1)")
    threads = parser.parse_args().threads
    torch.set_num_threads(threads)
    print(f"{threads} thread(s)")
    for n, d in [(20, 10**5), (50, 10**6)]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(d, generator=g) + torch.randn(n, d, generator=g)
        old_t, new_t, pass_t, kernels_t = [], [], [], []
        rows = 0
        for _ in range(7):
            t0 = time.perf_counter()
            x.sum(0)
            pass_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            bad = row_norms(x)[1]
            median_norm(float64_row_norms(x, bad), bad)
            old_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            decided = norm_filter(x, 0.1, 3.0)
            assert decided is not None
            med, _, s1, exact = decided
            exact.clip_norms(s1, med)
            new_t.append(time.perf_counter() - t0)
            rows = int(exact.known.sum())
            taken = torch.from_numpy(exact.known.nonzero()[0])
            largest = torch.empty(n, dtype=torch.float64)
            t0 = time.perf_counter()
            row_sqnorm_estimates(x, largest)
            float64_row_norms(x, torch.zeros(rows, dtype=torch.bool), rows=taken, max_squares=largest[taken])
            kernels_t.append(time.perf_counter() - t0)
        p, old, new = statistics.median(pass_t), statistics.median(old_t), statistics.median(new_t)
        kernels = statistics.median(kernels_t)
        print(f"n={n} d={d}: pass {p * 1e3:.2f} ms; every norm in float64 {old * 1e3:.1f} ms ({old / p:.1f}x pass); "
              f"one-pass filter {new * 1e3:.1f} ms ({new / p:.1f}x pass; its two kernel passes alone "
              f"{kernels * 1e3:.2f} ms, {kernels / p:.1f}x); exact norms on {rows}/{n} rows")


if __name__ == "__main__":
    main()
