"""Selection against the sorting network for the float32 median, trimmed mean and MeaMed, side by side in one process.

    PYTHONPATH=src .venv/bin/python benchmarks/cw_select.py [--sizes 500:2e5,600:1.7e5,1000:1e5,2000:5e4] [--reps 5]
                                                            [--rules cwmed,cwtm,meamed] [--tiny-every K]
                                                            [--rounded] [--trim fifth|half] [--cluster V]

For each ``(n, d)`` (float32 Gaussian rows, seeded, or rounded to integers with ``--rounded``; f = n // 5, or (n - 1) //
2 with ``--trim half``; ``--cluster V`` sets the first f rows to V everywhere, identical attackers) it times,
alternating in one process on one thread, the floor ``x.sum(0)`` (one memory pass, issue 37's floor for coordinate-wise
rules) and ``cwmed`` / ``cwtm`` / ``meamed`` through ``coordinate_window_mean`` twice: with selection (``_cwselect.c``,
its flagged columns through the network, as the rule runs it) and with the network alone (``SELECT_MIN_ROWS`` set past
n). It prints each median over the floor's median, the share of columns selection flagged, and whether the two outputs
are equal (they must be). Nothing is asserted: it prints. The rule switches to selection from
``coordinatewise.SELECT_MIN_ROWS`` rows on.

``--tiny-every K`` plays the attacker who knows the algorithm but not the call's seed (it draws the sampled rows and
the pivots): one row holds 1e-45 in every K-th column, which fails the exactness condition there, so those columns
are flagged and recomputed by the network — K = 1 flags everything (selection backs off block by block), K = 32 one
column per network block (gathered rather than recomputed by whole blocks) — timed against the network on the same
rows.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from phalanx.aggregators import _sortnet, coordinatewise


def _flagged(x: torch.Tensor, mode: int, trim: int) -> float:
    n, d = x.shape
    trim_, length = _sortnet.window_params(n, mode, trim)
    out, flags = torch.empty(d), torch.zeros(d, dtype=torch.uint8)
    coordinatewise._cwselect.select(
        x.data_ptr(), n, d, 0, d, mode, trim_, length, out.data_ptr(), flags.data_ptr(), secrets.randbits(64)
    )
    return float(flags.float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="500:2e5,600:1.7e5,1000:1e5,2000:5e4")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rules", default="cwmed,cwtm,meamed", help="comma-separated subset")
    parser.add_argument("--rounded", action="store_true", help="rows rounded to integers (few distinct values)")
    parser.add_argument("--trim", choices=["fifth", "half"], default="fifth", help="f = n // 5 or (n - 1) // 2")
    parser.add_argument("--cluster", type=float, default=None,
                        help="the f Byzantine rows all hold this value in every column (identical attackers)")
    parser.add_argument("--tiny-every", type=int, default=0, help="1e-45 in one row, every K-th column (0: none)")
    args = parser.parse_args()
    if not coordinatewise.HAVE_SELECT:
        raise SystemExit("selection is not built for this CPU (x86-64 with AVX2)")
    torch.set_num_threads(1)
    saved = coordinatewise.SELECT_MIN_ROWS
    print(f"threads 1 · reps {args.reps} · load {os.getloadavg()[0]:.2f} · rule's switch at n = {saved}"
          + (f" · row n / 2 holds 1e-45 in every {args.tiny_every}. column" if args.tiny_every else "")
          + (" · rows rounded to integers" if args.rounded else "")
          + f" · f = {'n // 5' if args.trim == 'fifth' else '(n - 1) // 2'}"
          + (f" · f rows hold {args.cluster}" if args.cluster is not None else ""))
    print("| n | d | floor `x.sum(0)` | rule | selection × floor | network × floor | network / selection "
          "| flagged | equal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for item in args.sizes.split(","):
        n, d = int(item.split(":")[0]), int(float(item.split(":")[1]))
        x = torch.randn(n, d, generator=torch.Generator().manual_seed(n))
        if args.rounded:
            x = x.round()
        f = n // 5 if args.trim == "fifth" else (n - 1) // 2
        if args.cluster is not None:
            x[:f] = args.cluster
        if args.tiny_every:
            x[n // 2, :: args.tiny_every] = 1e-45
        for name, rule in (("cwmed", "median"), ("cwtm", "trimmed"), ("meamed", "meamed")):
            if name not in args.rules.split(","):
                continue
            mode = coordinatewise._MODES[rule]
            times: dict[str, list[float]] = {"floor": [], "selection": [], "network": []}
            outs: dict[str, torch.Tensor] = {}
            for _ in range(args.reps + 1):  # the first round warms up
                start = time.perf_counter()
                x.sum(0)
                times["floor"].append(time.perf_counter() - start)
                for path, rows in (("selection", 0), ("network", n + 1)):
                    coordinatewise.SELECT_MIN_ROWS = rows
                    start = time.perf_counter()
                    outs[path] = coordinatewise.coordinate_window_mean(x, rule, f, False)[0]
                    times[path].append(time.perf_counter() - start)
            coordinatewise.SELECT_MIN_ROWS = saved
            med = {k: statistics.median(v[1:]) for k, v in times.items()}
            print(f"| {n:,} | {d:,} | {med['floor'] * 1e3:.1f} ms | `{name}` | {med['selection'] / med['floor']:.2f}× "
                  f"| {med['network'] / med['floor']:.2f}× | {med['network'] / med['selection']:.2f}× "
                  f"| {100 * _flagged(x, mode, f):.2f} % | {torch.equal(outs['selection'], outs['network'])} |")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
