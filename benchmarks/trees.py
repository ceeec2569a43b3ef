"""The in-process round of two source trees of Phalanx, side by side: is a refactor slower?

    git worktree add /tmp/before <commit>          # the tree to compare with (copy the built _cwkernel*.so into its
    cp src/phalanx/aggregators/_cwkernel*.so /tmp/before/src/phalanx/aggregators/   # aggregators/ to be fair)
    .venv/bin/python benchmarks/trees.py --before /tmp/before/src [--after src] [--repeats 3]

Per setting it alternates processes of the two trees (``PYTHONPATH`` first on ``sys.path``), each timing
``Loop.step`` in process — 20 warm-up rounds, then the median of 150 — and prints the medians of the runs and
their ratio. Settings: DSGD with 50 workers (cwtm, ALIE) and FedAvg with 100 clients, 20 per round, 5 local steps
(cwtm, sign flip), both an MLP on digits, 2 threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SETTINGS = {
    "dsgd, n = 50, cwtm, ALIE": {"dataset": "digits", "model": "mlp", "workers": 50, "f": 10, "byzantine": 10,
                                 "aggregator": "cwtm", "attack": "alie"},
    "fedavg, 100 clients, 20 per round, 5 local steps, cwtm, sign flip": {
        "dataset": "digits", "model": "mlp", "workers": 100, "f": 4, "byzantine": 10, "aggregator": "cwtm",
        "attack": "signflip", "algorithm": "fedavg", "clients_per_round": 20, "local_steps": 5},
}
ONE = """
import json, statistics, sys, time
import torch
from phalanx.experiments import from_config, make_config
from phalanx.training import Loop
cfg = json.loads(sys.argv[1])
torch.set_num_threads(2)
loop = Loop(from_config(make_config({**cfg, "rounds": 10**9, "eval_every": 10**9})))
loop.open()
ts = []
for t in range(170):
    t0 = time.perf_counter()
    loop.step()
    if t >= 20:
        ts.append(time.perf_counter() - t0)
print(statistics.median(ts))
"""


def one(src: Path, cfg: dict[str, object]) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", ONE, json.dumps(cfg)], env=env, capture_output=True, text=True,
                         timeout=900, check=True)
    return float(out.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the src/ directory of the tree to compare with")
    ap.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent / "src")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print("| setting | before ms (runs) | after ms (runs) | after ÷ before |\n|---|---|---|---|")
    for name, cfg in SETTINGS.items():
        runs: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            runs["before"].append(one(args.before, cfg))
            runs["after"].append(one(args.after, cfg))
        b, a = statistics.median(runs["before"]), statistics.median(runs["after"])
        cells = [", ".join(f"{1e3 * x:.2f}" for x in runs[k]) for k in ("before", "after")]
        print(f"| {name} | {1e3 * b:.2f} ({cells[0]}) | {1e3 * a:.2f} ({cells[1]}) | {a / b:.3f}× |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
