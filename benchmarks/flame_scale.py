"""FLAME's round time at 1,000 simulated clients (measured, not asserted), beside two floors measured in the same
process on the same rows: the mean (one pass over memory) and the n × n cosine distances FLAME's clustering starts
from (the BLAS part: one (n, d) × (d, n) product).

    .venv/bin/python benchmarks/flame_scale.py [--clients 1000] [--per-round 1000,100] [--d 10000] [--rounds 10]
                                               [--threads 1]

Each client i has a fixed mean update mᵢ (Gaussian) and sends mᵢ + noise each round (float32); with ``--per-round``
k < clients, k clients are sampled per round (seeded). Every round is timed (FLAME keeps no state across rounds):
the cosine distances, HDBSCAN's mutual-reachability tree and cluster selection, the clipping to the median norm and
the noise, as the rule runs them. Prints the median and range, and the median's ratio to each floor's median.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from phalanx import aggregators


def timed(fn: Callable[[Tensor], object], rows: list[Tensor]) -> list[float]:
    """The time of ``fn`` on each of ``rows``, in seconds."""
    out = []
    for x in rows:
        t0 = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t0)
    return out


def cosine_distances(x: Tensor) -> Tensor:
    u = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return 1.0 - u @ u.T


def run(clients: int, per_round: int, d: int, rounds: int, seed: int = 0) -> dict[str, list[float]]:
    """Per measure (flame, mean, distances): the times of the rounds, in seconds."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(clients, d, generator=g)
    rows = []
    for _ in range(rounds):
        ids = torch.arange(clients) if per_round >= clients else torch.randperm(clients, generator=g)[:per_round]
        rows.append(means[ids.sort().values] + 0.1 * torch.randn(ids.numel(), d, generator=g))
    flame = aggregators.make("flame", f=max(1, per_round // 10))
    mean = aggregators.make("mean", f=0)
    timed(lambda x: flame(x, generator=torch.Generator().manual_seed(seed)), rows[:1])  # warm-up
    return {
        "flame": timed(lambda x: flame(x, generator=torch.Generator().manual_seed(seed)), rows),
        "mean": timed(mean, rows),
        "distances": timed(cosine_distances, rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--per-round", default="1000,100")
    ap.add_argument("--d", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for k in (int(v) for v in args.per_round.split(",")):
        got = run(args.clients, k, args.d, args.rounds)
        med = {name: statistics.median(ts) for name, ts in got.items()}
        ts = got["flame"]
        print(f"clients={args.clients} per_round={k} d={args.d} threads={args.threads}: flame median "
              f"{med['flame']:.3f} s per round (min {min(ts):.3f}, max {max(ts):.3f}, {len(ts)} rounds); "
              f"{med['flame'] / med['mean']:.0f}x the mean ({med['mean'] * 1e3:.1f} ms), "
              f"{med['flame'] / med['distances']:.1f}x the cosine distances ({med['distances'] * 1e3:.1f} ms)",
              flush=True)


if __name__ == "__main__":
    main()
