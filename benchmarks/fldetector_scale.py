"""FLDetector's round time at 1,000 simulated clients, once its history is full (measured, not asserted).

    .venv/bin/python benchmarks/fldetector_scale.py [--clients 1000] [--per-round 1000,100] [--d 10000]
                                                    [--window 10] [--rounds 10] [--threads 1]

Each client i has a fixed mean update mᵢ (Gaussian) and sends mᵢ + noise each round (float32); with
``--per-round`` k < clients, k clients are sampled per round (seeded), passed as the ``ids`` context. The rule runs
``window + 2`` rounds to fill its L-BFGS memory and score history, then ``--rounds`` more rounds are timed one by
one (median and range printed), so the timed rounds include predicting every eligible client, the gap statistic
and the 2-means split on up to k scores, and the base rule (cwmed) on the kept rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from phalanx import aggregators


def run(clients: int, per_round: int, d: int, window: int, rounds: int, seed: int = 0) -> list[float]:
    """The times of the timed rounds, in seconds."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(clients, d, generator=g)
    rule = aggregators.make("fldetector", f=max(1, per_round // 10), window=window)
    times = []
    for t in range(window + 2 + rounds):
        ids = torch.arange(clients) if per_round >= clients else torch.randperm(clients, generator=g)[:per_round]
        ids = ids.sort().values
        x = means[ids] + 0.1 * torch.randn(ids.numel(), d, generator=g)
        t0 = time.perf_counter()
        rule(x, ids=ids, generator=g)
        dt = time.perf_counter() - t0
        if t >= window + 2:
            times.append(dt)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--per-round", default="1000,100")
    ap.add_argument("--d", type=int, default=10_000)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for k in (int(v) for v in args.per_round.split(",")):
        times = run(args.clients, k, args.d, args.window, args.rounds)
        print(f"clients={args.clients} per_round={k} d={args.d} window={args.window} threads={args.threads}: "
              f"median {statistics.median(times):.3f} s per round (min {min(times):.3f}, max {max(times):.3f}, "
              f"{len(times)} rounds)", flush=True)


if __name__ == "__main__":
    main()
