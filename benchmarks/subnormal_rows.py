"""The norm passes on a Byzantine row of tiny float64 values (squares subnormal) against ordinary rows.

    PYTHONPATH=src .venv/bin/python benchmarks/subnormal_rows.py

Subnormal arithmetic is about 10× slower on x86, so rows of 1e-160s (squares about 1e-320) made the one-pass
estimates and the exact float64 norms of CGE and SignGuard that much slower, on demand of any worker. Entries below
``_rowops.TINY`` (2^-480) now count as 0 in both (a comparison on the exponent bits). 1 thread, 4 float64 rows of
10⁶, the three kinds of row alternated 7 times, medians; the pass ``x.sum(0)`` beside them. Print ``uptime`` beside
the figures.
"""

from __future__ import annotations

import statistics
import time

import torch

from phalanx.aggregators import _rowops


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    spread = 1 + torch.rand(4, 10**6, generator=g, dtype=torch.float64)
    rows = {"ordinary (1.0)": spread.clone(), "tiny (1e-160)": spread * 1e-160, "subnormal (1e-310)": spread * 1e-310}
    bad = torch.zeros(4, dtype=torch.bool)
    calls = {
        "estimates": lambda x: _rowops.row_sqnorm_estimates(x),
        "exact norms": lambda x: _rowops.float64_row_norms(x, bad),
        "pass x.sum(0)": lambda x: x.sum(0),
    }
    times: dict[tuple[str, str], list[float]] = {(r, c): [] for r in rows for c in calls}
    for _ in range(7):
        for r, x in rows.items():
            for c, call in calls.items():
                t0 = time.perf_counter()
                call(x)
                times[r, c].append(time.perf_counter() - t0)
    for c in calls:
        base = statistics.median(times["ordinary (1.0)", c])
        cells = [f"{r} {statistics.median(times[r, c]) * 1e3:.2f} ms "
                 f"({statistics.median(times[r, c]) / base:.1f}x)" for r in rows]
        print(f"{c}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
