"""``cge`` and ``cc`` against ByzPy and ByzFL, the implementations alternating call by call (issue 37, item 2).

    PYTHONPATH=src .venv/bin/python benchmarks/cge_cc_modes.py [--threads 1] [--reps 9] [--sizes 50:1e6:10,...]

``make bench`` (``benchmarks/aggregators.py``) times each implementation's calls back to back — five of Phalanx,
then five of each peer — so a swing of the machine's load between two blocks lands on one side only. Here every
repetition runs every implementation once, in turn (the order rotating from one repetition to the next), so a
change in the load hits them alike; the companion of ``benchmarks/clip_arc_modes.py`` for the other two rules that
Phalanx shares with its peers:

* ``cge``: Phalanx ``CGE(f)(x)`` beside ByzPy 0.1.4's ``ComparativeGradientElimination(f).aggregate(rows)``
  (ByzFL 0.0.11 has no CGE);
* ``cc``: Phalanx ``CenteredClipping(tau, iterations=3, center="zero")(x)`` beside ByzFL's
  ``CenteredClipping(L=3, tau)`` (a fresh object per call: its centre starts at 0) and ByzPy's
  ``CenteredClipping(c_tau=tau, M=3, init="zero").aggregate(rows)``; τ = the median row norm (as in ``make bench``).

Plus one pass ``x.sum(0)`` (the floor). Input: Gaussian rows around a common random mean, float32, seed 0; ByzPy's
list of rows (views of x) is built before the clock. Medians are printed with their ratios, the outputs compared
with Phalanx's (max |Δ| relative to max |Phalanx output|), and the 1-minute load average at the start and the end.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_common import sizes_main
from _bench_peers import load_byzfl, load_byzpy

ITERATIONS = 3
"""Centered-clipping iterations, as in ``make bench``'s ``cc`` case."""


def implementations(x: torch.Tensor, f: int) -> dict[str, Callable[[], Any]]:
    """Every timed call on ``x``, by name (``rule: library``); the floor first."""
    from phalanx.aggregators.cc import CenteredClipping
    from phalanx.aggregators.cge import CGE

    bz, bp = load_byzfl(), load_byzpy()
    tau = float(torch.linalg.vector_norm(x, dim=1).median())
    rows = list(x.unbind(0))  # ByzPy's input format (views of x), built before the clock
    return {
        "pass x.sum(0)": lambda: x.sum(0),
        "cge: Phalanx": lambda: CGE(f=f)(x),
        "cge: ByzPy": lambda: bp.CGE(f=f).aggregate(rows),
        "cc: Phalanx": lambda: CenteredClipping(f=f, tau=tau, iterations=ITERATIONS, center="zero")(x),
        "cc: ByzFL": lambda: bz.CenteredClipping(L=ITERATIONS, tau=tau)(x),
        "cc: ByzPy": lambda: bp.CenteredClipping(c_tau=tau, M=ITERATIONS, init="zero").aggregate(rows),
    }


def run(n: int, d: int, f: int, reps: int) -> list[str]:
    """Time every implementation ``reps`` times, alternating; return the report lines of this setting."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g).add_(torch.randn(d, generator=g))
    x_ref = x.clone()
    impls = implementations(x, f)
    names = list(impls)
    times: dict[str, list[float]] = {k: [] for k in names}
    outs = {k: impls[k]() for k in names}  # warm-up, not counted; kept for the comparison
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            out = impls[name]()
            times[name].append(time.perf_counter() - t0)
            del out
    if not torch.equal(x, x_ref):
        raise AssertionError("an implementation changed its input")
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [f"n={n} d={d} f={f} threads={torch.get_num_threads()} (median of {reps}):"]
    for name in names:
        lines.append(f"  {name:16s} {med[name] * 1e3:10.2f} ms   {med[name] / med['pass x.sum(0)']:6.2f}x pass")
    for rule in ("cge", "cc"):
        ph = outs[f"{rule}: Phalanx"]
        scale = float(ph.abs().max())
        for peer in (k for k in names if k.startswith(f"{rule}: By")):
            diff = float((ph - torch.as_tensor(outs[peer]).to(ph.dtype)).abs().max()) / scale
            lines.append(f"  {rule}: {peer.split(': ')[1]} / Phalanx = {med[peer] / med[f'{rule}: Phalanx']:.2f}x"
                         f"   (max |Δ| / max |output| {diff:.1e})")
    return lines


def main(argv: list[str] | None = None) -> int:
    return sizes_main(run, "50:1e6:10,200:1e5:40", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
