"""Phalanx against ByzPy 0.1.4 on ByzPy's own published workloads, side by side in one process, as ratios.

    .venv/bin/python benchmarks/byzpy_workloads.py [--reps 7] [--threads 1,2] [--only cge,arc]

The workloads are the defaults of the direct (single-process) mode of ByzPy's benchmark scripts
(``benchmarks/pytorch/*.py`` in ByzPy's repository, which the wheel does not ship): CGE on 128 × 131,072 with f = 16
(``cge_actor_pool.py``), ARC on 256 × 65,536 with f = 8 (``arc_preagg.py``), static clipping on 256 × 65,536 with
threshold 2 (``clipping_preagg.py``), centered clipping on 64 × 131,072 with τ = 0.1, M = 10, started from the mean
(``centered_clipping_actor_pool.py``); plus CGE on 64 × 65,536 with f = 8, the setting of Phalanx's issue 37. Inputs
are ByzPy's: ``torch.randn(d)`` per client from one seeded generator; ByzPy gets the list (its API), Phalanx the
stacked tensor, both built before the clock starts. ByzPy is timed through ``aggregate(list)`` /
``pre_aggregate(list)``, Phalanx through ``rule(x)`` / ``pre(x)`` (for centered clipping with ``center`` = the
column mean, computed inside the timed call as ByzPy does).

Each repetition times ByzPy, Phalanx and the floor ``x.sum(0)`` (one streaming pass) back to back, so the three
share the machine's load; the medians are reported with the 1-minute load average read before each workload.
Columns: speed-up = ByzPy / Phalanx; × floor = Phalanx / (passes × floor), passes = 1 for the norm rules and M
for M-iteration centered clipping; max |Δ| relative to max |Phalanx output|.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

WORKLOADS = {
    # key: (n, d, what ByzPy's script calls it, passes in the floor)
    "cge": (128, 131_072, "cge_actor_pool.py: f=16", 1),
    "cge-issue37": (64, 65_536, "Phalanx issue 37: f=8", 1),
    "arc": (256, 65_536, "arc_preagg.py: f=8", 1),
    "clip": (256, 65_536, "clipping_preagg.py: threshold=2", 1),
    "cc": (64, 131_072, "centered_clipping_actor_pool.py: tau=0.1, M=10, init=mean", 10),
}


@dataclass
class Pair:
    byzpy: Callable[[], Any]
    phalanx: Callable[[], Any]
    byzpy_out: Callable[[Any], np.ndarray]


def _rows(out: Any) -> np.ndarray:
    if isinstance(out, list):
        return np.stack([o.double().numpy() for o in out])
    return out.double().numpy()


def build(key: str, grads: list[torch.Tensor], x: torch.Tensor) -> Pair:
    """ByzPy's operator and the matching Phalanx rule for workload ``key``."""
    from byzpy.aggregators.norm_wise import CenteredClipping, ComparativeGradientElimination
    from byzpy.pre_aggregators import ARC, Clipping

    from phalanx.aggregators import make, registry
    from phalanx.aggregators._rowops import column_mean

    if key.startswith("cge"):
        f = 16 if key == "cge" else 8
        bp_cge, ph_cge = ComparativeGradientElimination(f=f), make("cge", f)
        return Pair(lambda: bp_cge.aggregate(grads), lambda: ph_cge(x), _rows)
    if key == "arc":
        bp_arc, ph_arc = ARC(f=8), registry.get_class("arc")(f=8)
        return Pair(lambda: bp_arc.pre_aggregate(grads), lambda: ph_arc(x), _rows)
    if key == "clip":
        bp_clip, ph_clip = Clipping(threshold=2.0), registry.get_class("clip")(threshold=2.0)
        return Pair(lambda: bp_clip.pre_aggregate(grads), lambda: ph_clip(x), _rows)
    bp_cc = CenteredClipping(c_tau=0.1, M=10, init="mean")
    ph_cc = make("cc", 0, tau=0.1, iterations=10)
    return Pair(lambda: bp_cc.aggregate(grads), lambda: ph_cc(x, center=column_mean(x)), _rows)


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(key: str, threads: int, reps: int, seed: int) -> dict[str, Any]:
    """Time one workload at ``threads`` threads: ByzPy, Phalanx and the floor alternated, ``reps`` times."""
    n, d, _, passes = WORKLOADS[key]
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(d, generator=gen) for _ in range(n)]
    x = torch.stack(grads)
    pair = build(key, grads, x)
    load = os.getloadavg()[0]
    bp_out, ph_out = pair.byzpy_out(pair.byzpy()), _rows(pair.phalanx())  # warm-up, and the outputs compared
    scale = float(np.abs(ph_out).max()) or 1.0
    rel = float(np.abs(bp_out - ph_out).max()) / scale if bp_out.shape == ph_out.shape else float("nan")
    tb, tp, tf = [], [], []
    for _ in range(reps):
        tb.append(_time(pair.byzpy))
        tp.append(_time(pair.phalanx))
        tf.append(_time(lambda: x.sum(0)))
    b, p, fl = statistics.median(tb), statistics.median(tp), statistics.median(tf)
    return {"key": key, "threads": threads, "byzpy": b, "phalanx": p, "floor": fl, "passes": passes,
            "speedup": b / p, "xfloor": p / (passes * fl), "rel": rel, "load": load}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--only", help="comma-separated subset of " + ", ".join(WORKLOADS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    keys = [k.strip() for k in args.only.split(",")] if args.only else list(WORKLOADS)
    for k in keys:
        if k not in WORKLOADS:
            ap.error(f"--only: unknown workload {k!r}; allowed: {', '.join(WORKLOADS)}")
    threads = [int(t) for t in args.threads.split(",")]
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - numpy's BLAS then follows its environment variables
        threadpool_limits = None
    from importlib.metadata import version

    print(f"ByzPy {version('byzpy')} vs Phalanx, torch {torch.__version__}, reps {args.reps} (medians)")
    print(f"{'workload':13} {'n × d':>14} thr {'load':>5} {'floor':>9} {'ByzPy':>10} {'Phalanx':>10} "
          f"{'speed-up':>8} {'× floor':>8} {'max|Δ| rel':>10}  ByzPy's setting")
    for k in keys:
        for t in threads:
            limit = threadpool_limits(t) if threadpool_limits else None
            r = run(k, t, args.reps, args.seed)
            if limit is not None:
                limit.unregister()
            n, d, what, passes = WORKLOADS[k]
            fl = f"{r['floor'] * 1e3:.2f} ms" + (f"×{passes}" if passes > 1 else "")
            print(f"{k:13} {f'{n} × {d}':>14} {t:>3} {r['load']:5.1f} {fl:>9} {r['byzpy'] * 1e3:8.2f}ms "
                  f"{r['phalanx'] * 1e3:8.2f}ms {r['speedup']:7.2f}× {r['xfloor']:7.2f}× {r['rel']:10.1e}  {what}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
