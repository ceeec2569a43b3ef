"""`mean`'s column sums (``_sumkernel.c``) against the BLAS product it replaced, ByzFL's ``torch.mean`` and one pass.

    PYTHONPATH=src .venv/bin/python benchmarks/column_sums.py [--threads 2] [--sizes 10:1e5,50:1e6] [--reps 41]
    PYTHONPATH=src .venv/bin/python benchmarks/column_sums.py --grid

For each size, Gaussian rows (float32, seed 0; float64 too for the bits):
- **bits**: how many of the d coordinates of ``column_mean(x)`` (the rows added in row order, divided by n)
  differ, bit for bit, from the BLAS product ``(1ᵀX)/n`` that ``mean`` computed before, and from ``x.sum(0)/n``
  (torch's reduction, whose additions come in another order). 0 against the product means the kernel changed no
  result on this machine for row-major inputs;
- **time**: ``column_mean``, the product, ``torch.mean(x, dim=0)`` (what ByzFL's ``Average`` calls) and one pass
  ``x.sum(0)``, called in turn, the order rotating each repetition; medians, and ``column_mean``'s speed-up over
  ``torch.mean`` and its time over the pass.
Times are measured lower bounds under whatever load the machine has; print ``uptime`` beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from phalanx.aggregators._rowops import column_mean

SIZES = "10:1e5,20:1e5,10:1e6,50:1e6,200:1e5,1000:1e5"


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        n, _, d = part.partition(":")
        try:
            size = (int(n), int(float(d)))
        except ValueError:
            raise SystemExit(f"--sizes: {part!r} is not n:d (e.g. 10:1e5)") from None
        if not (1 <= size[0] <= 100_000 and 1 <= size[1] <= 10**8 and size[0] * size[1] <= 5 * 10**8):
            raise SystemExit(f"--sizes: {part!r} needs 1 <= n <= 1e5, 1 <= d <= 1e8 and n·d <= 5e8")
        out.append(size)
    return out


def _product(x: torch.Tensor) -> torch.Tensor:
    return (torch.ones(1, x.shape[0], dtype=x.dtype) @ x).squeeze(0).div_(x.shape[0])


def _differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """Coordinates whose bits differ (``!=`` would take -0.0 for +0.0)."""
    as_int = torch.int64 if a.dtype == torch.float64 else torch.int32
    return int((a.view(as_int) != b.view(as_int)).sum())


def _grid() -> None:
    """The wider bit check: every n in 1..64 and a range up to 3,000, d from 1 to 100,003, rows scaled over eight
    orders of magnitude, float32 and float64, 1 and 2 threads, and strided rows; prints the differing count."""
    torch.manual_seed(1)
    differing = cases = 0
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for dtype in (torch.float32, torch.float64):
            for n in [*range(1, 65), 100, 200, 513, 1000, 3000]:
                for d in (1, 5, 4095, 4096, 4097, 100_003) if n <= 200 else (1, 4097, 20_000):
                    scales = torch.logspace(-4, 4, n, dtype=dtype)[torch.randperm(n)].unsqueeze(1)
                    x = torch.randn(n, d, dtype=dtype) * scales
                    differing += _differing(column_mean(x), _product(x))
                    cases += 1
            wide = torch.randn(30, 5000, dtype=dtype)[:, :4001]
            differing += _differing(column_mean(wide), _product(wide))
            cases += 1
    print(f"grid: {cases} inputs, {differing} coordinates whose bits differ from the BLAS product")


def _medians(x: torch.Tensor, reps: int) -> dict[str, float]:
    """Each call's median in ms, the four called in turn, the order rotating each repetition."""
    calls: dict[str, Callable[[], object]] = {
        "column_mean": partial(column_mean, x), "product": partial(_product, x),
        "torch.mean": partial(torch.mean, x, dim=0), "x.sum(0)": partial(torch.sum, x, 0),
    }
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, choices=range(1, 65), metavar="N",
                        help="torch threads, 1..64 (default 1)")
    parser.add_argument("--sizes", default=SIZES, help=f"n:d pairs, comma-separated (default {SIZES})")
    parser.add_argument("--reps", type=int, default=41, choices=range(1, 1001), metavar="R",
                        help="calls of each, 1..1000 (default 41)")
    parser.add_argument("--grid", action="store_true", help="only the wider bit check (n = 1 ... 3,000; minutes)")
    args = parser.parse_args()
    if args.grid:
        _grid()
        return
    sizes = _sizes(args.sizes)
    torch.set_num_threads(args.threads)
    print(f"{args.threads} thread(s), medians of {args.reps}")
    print("n, d | differing coordinates vs the BLAS product (float32, float64) | vs x.sum(0)/n | column_mean · "
          "product · torch.mean · x.sum(0) | speed-up over torch.mean | × the pass")
    for n, d in sizes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(d, generator=g) + torch.randn(n, d, generator=g)
        x64 = x.double()
        product_bits = (_differing(column_mean(x), _product(x)), _differing(column_mean(x64), _product(x64)))
        sum_bits = _differing(column_mean(x), x.sum(0) / n)
        med = _medians(x, args.reps)
        names = list(med)
        print(f"{n}, {d} | {product_bits[0]}, {product_bits[1]} | {sum_bits} | "
              + " · ".join(f"{med[name]:.3g} ms" for name in names)
              + f" | {med['torch.mean'] / med['column_mean']:.2f}× | {med['column_mean'] / med['x.sum(0)']:.2f}×")


if __name__ == "__main__":
    main()
