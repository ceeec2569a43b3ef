"""The simulated asynchronous server step against the synchronous round, per processed update, in one process.

    .venv/bin/python benchmarks/asynchronous.py [--quick] [--workers N] [--buffers K ...] [--steps S] [--profile]

Setting (the same for every peer): the embedded ``digits`` data set, Phalanx's ``mlp`` 64-100-10, n = 1,000 workers
(IID split, seed 0), batch 32, no Byzantine worker, the mean, one thread. The peers, built with ``phalanx run``'s
code (``phalanx.experiments.from_config``, :meth:`phalanx.training.Loop.step`):

* **sync** — ``algorithm = "fedavg"`` with ``clients_per_round = K``, one local step: the synchronous round that
  aggregates K sampled workers' updates (what the straggler-bound round of the async study runs);
* **fedbuff** — ``algorithm = "fedbuff"`` with ``buffer_size = K`` on the simulated clock (log-normal speeds σ = 1,
  staleness bound 4): one server step aggregates K updates;
* **basgd** — ``algorithm = "basgd"`` with ``buffers = K``: one server step aggregates every update delivered
  until each buffer holds one (≥ K; counted from the clock's ``updates`` statistic).

A *processed update* is one worker's minibatch gradient that the server aggregates: sync K per round, fedbuff K per
step, basgd what its step took. Timing: ``--warmup`` steps each, then ``--steps`` rounds in which the peers take
turns (sync, fedbuff, basgd, sync, …) so that a change in the machine's load hits them alike; each step is timed
with ``time.process_time`` (CPU seconds of this one-thread process: another process on a shared machine does not
count, waiting does not either) and the median per update of each peer is reported, with the ratio
async / sync (target ≤ 1). No evaluation, checkpoint or log happens in the timed steps (the loop is stepped without
callbacks). ``--profile``: cProfile's top functions over the fedbuff steps of the largest K.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def build(workers: int, k: int, algorithm: str) -> Any:
    """A loop of one peer (no callbacks: no evaluation)."""
    from phalanx.experiments import from_config, make_config
    from phalanx.training import Loop

    base: dict[str, Any] = {
        "dataset": "digits", "model": "mlp", "model_params": {"hidden": [100]}, "workers": workers, "byzantine": 0,
        "f": 0, "aggregator": "mean", "rounds": 10**6, "eval_every": 10**6, "checkpoint_every": 10**6,
        "batch_size": 32, "lr": 0.1, "seed": 0,
    }
    if algorithm == "sync":
        base.update(algorithm="fedavg", clients_per_round=k)
    elif algorithm == "fedbuff":
        base.update(algorithm="fedbuff", algorithm_params={"buffer_size": k, "batch_size": 32})
    else:
        base.update(algorithm="basgd", algorithm_params={"buffers": k, "batch_size": 32})
    return Loop(from_config(make_config(base)))


def updates_of(loop: Any, k: int) -> int:
    """The updates the loop's last step aggregated: the clock's running total for an asynchronous peer, K for sync."""
    from phalanx.training.algorithms.asynchronous import AsyncClock

    for stage in getattr(loop.experiment, "stages", ()):
        if isinstance(stage, AsyncClock) and "stats" in stage.own:
            return int(stage.own["stats"][2])
    return -1


def timed(loop: Any, k: int) -> tuple[float, int]:
    """One step's CPU seconds and the updates it aggregated."""
    before = updates_of(loop, k)
    t0 = time.process_time()
    loop.step()
    dt = time.process_time() - t0
    after = updates_of(loop, k)
    return dt, (k if before < 0 else after - before)


def measure(workers: int, k: int, warmup: int, steps: int, profile: bool) -> dict[str, float]:
    """The median CPU seconds per processed update of each peer at buffer size K, taking turns."""
    peers = {name: build(workers, k, name) for name in ("sync", "fedbuff", "basgd")}
    for loop in peers.values():
        for _ in range(warmup):
            loop.step()
    per: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(steps):
        for name, loop in peers.items():
            dt, m = timed(loop, k)
            per[name].append(dt / max(m, 1))
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            peers["fedbuff"].step()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    return {name: statistics.median(v) for name, v in per.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: n = 100, K = 10, 5 steps")
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--buffers", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=41)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.workers, args.buffers, args.steps, args.warmup = 100, [10], 5, 1
    import torch

    torch.set_num_threads(1)
    print(f"n = {args.workers} workers, mlp 64-100-10 on digits, 1 thread, median CPU time per processed update "
          f"over {args.steps} steps each, taking turns")
    print("| K | sync | fedbuff | basgd | fedbuff / sync | basgd / sync |")
    print("|---|---|---|---|---|---|")
    for k in args.buffers:
        m = measure(args.workers, k, args.warmup, args.steps, args.profile and k == max(args.buffers))
        print(f"| {k} | {m['sync'] * 1e6:.0f} µs | {m['fedbuff'] * 1e6:.0f} µs | {m['basgd'] * 1e6:.0f} µs | "
              f"{m['fedbuff'] / m['sync']:.2f} | {m['basgd'] / m['sync']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
