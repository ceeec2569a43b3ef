"""``clip`` and ``arc`` against ByzFL like with like, the implementations alternating call by call (issue 37).

    PYTHONPATH=src .venv/bin/python benchmarks/clip_arc_modes.py [--threads 1] [--reps 9] [--sizes 50:1e6:10,...]

ByzFL's ``Clipping`` and ``ARC`` overwrite their input, so two pairs are timed:

* **copy** (the caller keeps its rows): Phalanx ``pre(x)`` beside ByzFL ``rule(x.clone())``, the copy on the clock,
  and ByzPy 0.1.4's ``pre_aggregate`` (a new list of rows; its input, the rows of x, built before the clock);
* **in place** (the caller gives its rows up): Phalanx ``pre.mix_(v)`` beside ByzFL ``rule(v)``, ``v`` a copy of x
  made before the clock for each call.

Plus one pass ``x.sum(0)`` (the floor of ``make bench``) and ``torch.linalg.vector_norm(x, dim=1)`` (the row norms
both sides need). Every repetition runs every implementation once, in turn, so a change in the machine's load hits
them alike; medians are printed with their ratios, and the 1-minute load average at the start and the end. The
outputs are checked against Phalanx's (max |Δ| relative to max |x|). Gaussian rows around a common random mean,
float32, seed 0; the threshold of ``clip`` is the median row norm (as in ``make bench``).
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


def _timed(fn: Callable[[Any], Any], arg: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(arg)
    return time.perf_counter() - t0, out


def run(n: int, d: int, f: int, reps: int) -> list[str]:
    """Time every implementation ``reps`` times, alternating; return the report lines of this setting."""
    from phalanx.aggregators.pre.arc import ARC
    from phalanx.aggregators.pre.clip import Clip

    bz, bp = load_byzfl(), load_byzpy()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g).add_(torch.randn(d, generator=g))
    tau = float(torch.linalg.vector_norm(x, dim=1).median())
    x_ref = x.clone()
    rows = list(x.unbind(0))  # ByzPy's input format (views of x), built before the clock
    impls: dict[str, tuple[Callable[[Any], Any], bool]] = {  # name: (call, on a fresh copy made off the clock)
        "pass x.sum(0)": (lambda v: v.sum(0), False),
        "row norms": (lambda v: torch.linalg.vector_norm(v, dim=1), False),
        "clip copy: Phalanx pre(x)": (lambda v: Clip(threshold=tau)(v), False),
        "clip copy: ByzFL Clipping(x.clone())": (lambda v: bz.Clipping(c=tau)(v.clone()), False),
        "clip copy: ByzPy Clipping(list)": (lambda v: bp.Clipping(threshold=tau).pre_aggregate(rows), False),
        "clip in place: Phalanx mix_(v)": (lambda v: Clip(threshold=tau).mix_(v)[0], True),
        "clip in place: ByzFL Clipping(v)": (lambda v: bz.Clipping(c=tau)(v), True),
        "arc copy: Phalanx pre(x)": (lambda v: ARC(f=f)(v), False),
        "arc copy: ByzFL ARC(x.clone())": (lambda v: bz.ARC(f=f)(v.clone()), False),
        "arc copy: ByzPy ARC(list)": (lambda v: bp.ARC(f=f).pre_aggregate(rows), False),
        "arc in place: Phalanx mix_(v)": (lambda v: ARC(f=f).mix_(v)[0], True),
        "arc in place: ByzFL ARC(v)": (lambda v: bz.ARC(f=f)(v), True),
    }
    times: dict[str, list[float]] = {k: [] for k in impls}
    outs: dict[str, Any] = {}
    for rep in range(reps + 1):  # the first round warms up and is not counted
        for name, (fn, fresh) in impls.items():
            arg = x.clone() if fresh else x
            dt, out = _timed(fn, arg)
            if rep:
                times[name].append(dt)
            else:
                outs[name] = out
            del arg, out
    if not torch.equal(x, x_ref):
        raise AssertionError("a copying call changed its input")
    del x_ref
    med = {k: statistics.median(v) for k, v in times.items()}
    scale = float(x.abs().max())
    lines = [f"n={n} d={d} f={f} threads={torch.get_num_threads()} (median of {reps}):"]
    for name in impls:
        lines.append(f"  {name:40s} {med[name] * 1e3:9.2f} ms   {med[name] / med['pass x.sum(0)']:5.2f}x pass")
    for rule in ("clip", "arc"):
        for mode in ("copy", "in place"):
            ph = next(k for k in impls if k.startswith(f"{rule} {mode}: Phalanx"))
            for peer in (k for k in impls if k.startswith(f"{rule} {mode}: By")):
                out = outs[peer]
                out = torch.stack(list(out)) if isinstance(out, (list, tuple)) else out
                diff = float((outs[ph] - out).abs().max()) / scale
                lines.append(f"  {rule} {mode}: {peer.split(': ')[1].split()[0]} / Phalanx = "
                             f"{med[peer] / med[ph]:.2f}x   (max |Δ| / max |x| {diff:.1e})")
    return lines


def main(argv: list[str] | None = None) -> int:
    return sizes_main(run, "50:1e6:10,20:1e5:4", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
