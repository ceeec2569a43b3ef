"""The coordinate-wise rules' time over their floor (one pass, ``x.sum(0)``), side by side in one process.

    PYTHONPATH=src .venv/bin/python benchmarks/cw_floor.py [--sizes 16:65536,50:1e6] [--reps 7] [--threads 1]
                                                          [--baseline PATH/_cwkernel....so]

For each ``(n, d)`` (default: n ∈ {16, 50, 64, 200, 1000} × d ∈ {65,536, 10⁶}; float32 Gaussian rows, seeded) it
times, alternating in one process, ``x.sum(0)`` (issue 37's floor for coordinate-wise rules, as
``benchmarks/_bench_floors.py`` measures it) and ``cwmed``, ``cwtm`` and ``meamed`` (f = n // 5) through
``coordinate_window_mean`` — the C kernel when it is built — and prints each median of ``--reps`` calls (after a
warm-up) and its ratio to the floor's median. With ``--baseline`` it also loads another build of the kernel
(e.g. the previous commit's ``.so`` copied aside) and times it in the same rounds with the same arguments, and
checks that both builds' outputs are identical bit for bit (they must be: same network, same summation order).
The A/B cell in parentheses calls *both* builds' kernels the same way (``_kernel_call``: the plan made once, no rule
around it); until 2026-12-07 this build was timed through the rule and the baseline as a bare kernel call, which
favoured the baseline (n = 16, d = 65,536, one run: the rule 2.99× the floor, the same build's bare call 2.33×; the
rule's own Python is about 36 µs a call by ``timeit``, the rest is its place in the round, right after the floor).
``--clock cpu`` times this thread's CPU time instead of wall time (for tuning on a shared machine; 1 thread only).
Targets (issue 37): ≤ 3× the floor at n ≤ 64, ≤ 6× at n = 1,000. Nothing is asserted: it prints.

A second floor, the network's own: the kernel's compare-exchange run in registers on its own lanes
(``_cwkernel.compare_exchange_spin``: eight passes of Batcher's 8-wire network between one load and one store of
each wire, whichever instruction set the CPU runs) gives the time of one compare-exchange on one column; times the
compare-exchanges the rule's network has (Batcher's whole network for the trimmed mean and MeaMed, the one pruned to
the middle for the median) and d, it is the least the sort can take on this CPU however the memory is used. Each
rule's cell then reads ``a× / b×``: its time over the pass, and over that network floor (the larger of the two
floors is the one that binds).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from phalanx.aggregators import _sortnet, coordinatewise

DEFAULT_SIZES = [(n, d) for d in (65_536, 10**6) for n in (16, 50, 64, 200, 1000)]
MODES = {"cwmed": "median", "cwtm": "trimmed", "meamed": "meamed"}


def _load(path: str) -> Any:
    """Load another build of the extension under its own module object (not registered in sys.modules)."""
    spec = importlib.util.spec_from_file_location("_cwkernel", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _kernel_call(mod: Any, x: torch.Tensor, mode: int, trim: int) -> Callable[[], torch.Tensor]:
    """What ``coordinatewise._cw_kernel`` does without contributions, on the kernel module ``mod``."""
    n, d = x.shape
    trim_, length = _sortnet.window_params(n, mode, trim)
    # a build with tile_rows gets the compare-exchanges in its cache order, an older one in Batcher's order; one with
    # load_sort_network its load plan (groups of rows sorted as they are loaded), an older one the whole network
    tile = int(mod.tile_rows(n, x.dtype == torch.float64)) if hasattr(mod, "tile_rows") else 0
    nets = _sortnet.load_sort_nets(mod)
    plan, pairs = _sortnet.kernel_program(n, _sortnet.network_window(n, mode, trim_, length), tile, nets)
    threads = torch.get_num_threads()

    def call() -> torch.Tensor:
        out = torch.empty(d, dtype=x.dtype)
        mod.window_parallel(x.data_ptr(), n, d, pairs.data_ptr(), pairs.shape[0], mode, trim_, length,
                            out.data_ptr(), 0, x.dtype == torch.float64, threads, *plan)
        return out

    return call


def _rounds(fns: dict[str, Callable[[], Any]], reps: int, clock: Callable[[], float]) -> dict[str, float]:
    """Median seconds of each function, the functions alternating within each round (same load for all)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def compare_exchange_seconds(mod: Any, reps: int) -> float | None:
    """Seconds per compare-exchange and column in registers (the median of ``reps`` runs of about 20 ms each), or
    None for a build without ``compare_exchange_spin``."""
    if not hasattr(mod, "compare_exchange_spin"):
        return None
    t0 = time.perf_counter()
    count = mod.compare_exchange_spin(100, False)
    spins = max(1, int(100 * 0.02 / max(time.perf_counter() - t0, 1e-6)))
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        count = mod.compare_exchange_spin(spins, False)
        rates.append((time.perf_counter() - t0) / count)
    return statistics.median(rates)


def network_size(n: int, mode: str, f: int) -> int:
    """The compare-exchanges of the network the kernel runs for ``mode`` on n rows (load-time groups included)."""
    code = coordinatewise._MODES[mode]
    trim, length = _sortnet.window_params(n, code, f)
    window = _sortnet.network_window(n, code, trim, length)
    return int((_sortnet.batcher_pairs(n) if window is None else _sortnet.window_pairs(n, *window)).shape[0])


def _sizes(spec: str | None) -> list[tuple[int, int]]:
    if not spec:
        return DEFAULT_SIZES
    return [(int(float(a)), int(float(b))) for a, b in (part.split(":") for part in spec.split(","))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", help="n:d pairs, e.g. 16:65536,50:1e6 (default: n 16…1000 × d 65,536 and 10⁶)")
    ap.add_argument("--reps", type=int, default=7, help="timed calls per measurement (median; default 7)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall: time.perf_counter (default); cpu: this thread's CPU time (time.thread_time), which "
                         "a busy machine's preemptions do not inflate (memory contention still does)")
    ap.add_argument("--baseline", help="path of another build of _cwkernel*.so to time beside this one")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not coordinatewise.HAVE_KERNEL:
        print("the C kernel is not built: timing the torch.sort path")
    base = _load(args.baseline) if args.baseline else None
    print(f"threads {args.threads} · reps {args.reps} · clock {args.clock} · load {os.getloadavg()[0]:.2f} · kernel "
          f"{getattr(coordinatewise._cwkernel, '__file__', None)}")
    per_cx = compare_exchange_seconds(coordinatewise._cwkernel, args.reps) if coordinatewise.HAVE_KERNEL else None
    if per_cx is not None:
        print(f"network floor: {per_cx * 1e12:.1f} ps per compare-exchange and column in registers (float32)")
    head = "| n | d | floor `x.sum(0)` | " + " | ".join(
        f"{r} × floor" + (" / × network floor" if per_cx else "")
        + (" (kernel calls: this build vs baseline)" if base else "")
        for r in MODES) + (" | identical |" if base else " |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for n, d in _sizes(args.sizes):
        x = torch.randn(n, d, generator=torch.Generator().manual_seed(n * 7919 + d))
        f = n // 5
        fns: dict[str, Callable[[], Any]] = {"floor": lambda x=x: x.sum(0)}
        same = []
        for rule, mode in MODES.items():
            code = coordinatewise._MODES[mode]
            fns[rule] = lambda m=mode, x=x, f=f: coordinatewise.coordinate_window_mean(x, m, f, False)  # type: ignore[misc]
            if base is not None:  # the A/B on like terms: both builds' kernels called the same way, no rule around
                fns[rule + "_mine"] = _kernel_call(coordinatewise._cwkernel, x, code, f)
                fns[rule + "_base"] = _kernel_call(base, x, code, f)
                mine = coordinatewise.coordinate_window_mean(x, mode, f, False)[0]  # type: ignore[arg-type]
                same.append(torch.equal(mine, fns[rule + "_base"]()))
        t = _rounds(fns, args.reps, time.perf_counter if args.clock == "wall" else time.thread_time)
        cells = [f"{t[r] / t['floor']:.2f}"
                 + (f" / {t[r] / (per_cx * network_size(n, mode, f) * d):.2f}" if per_cx else "")
                 + (f" ({t[r + '_mine'] / t['floor']:.2f} vs {t[r + '_base'] / t['floor']:.2f})" if base else "")
                 for r, mode in MODES.items()]
        tail = f" | {'yes' if all(same) else 'NO'} |" if base else " |"
        print(f"| {n} | {d:,} | {t['floor'] * 1e3:.2f} ms | " + " | ".join(cells) + tail, flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
