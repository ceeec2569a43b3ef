"""How much of the workers' honest computation the real asynchronous server aggregates, and what it holds meanwhile.

    PYTHONPATH=src .venv/bin/python benchmarks/async_waste.py [--workers 16] [--buffer 4] [--staleness 4]
        [--steps 40] [--concurrency C] [--out DIR]

Setting (issue 36, "Speed"): ``phalanx launch`` of FedBuff on real processes — rank 0 the server, ``--workers``
worker ranks, no Byzantine worker, the embedded ``digits`` data and ``logreg``, K = ``--buffer``, S =
``--staleness``, ``--steps`` server steps, ``--concurrency`` C (``algorithm_params.concurrency``: at most C credits
outstanding; absent, every worker), seed 0, the store transport (no keys; ``--keys``: the sealed links, keys
made in the output folder). Every update a worker computes reaches rank 0 unless the run stops first, where it is
either aggregated or dropped with a reason (counted: :attr:`phalanx.distributed.async_buffer.Buffer.dropped`). Printed:
the honest updates computed (the workers' closing lines ``computed k updates``; "not reported" by code without them),
aggregated (the run's ``updates`` metric), dropped per reason (rank 0's closing line ``updates dropped: …``), the
credits (rank 0's ``credits: …`` line, :mod:`phalanx.distributed.async_credit`), the mean staleness over the steps,
the test accuracy, rank 0's wall seconds at the last step (the metric ``sim_time`` of a real run), rank 0's peak RSS
and median step (``distributed.json``) and the 1-minute load average before and after. ``--repeat`` runs it that
many times. A measured value of runs on the machine they ran on, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--buffer", type=int, default=4)
    ap.add_argument("--staleness", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keys", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="async_waste_"))
    for i in range(args.repeat):
        once(args, base / f"run{i}")


def once(args: argparse.Namespace, out: Path) -> None:
    """One launch and its figures."""
    out.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    if args.keys:
        subprocess.run([sys.executable, "-m", "phalanx.cli", "keys", "init", str(out / "keys"), "--workers",
                        str(args.workers + 1)], capture_output=True, check=True)
        keys = ["--keys", str(out / "keys")]
    load_before = os.getloadavg()[0]
    conc = "" if args.concurrency is None else f", concurrency = {args.concurrency}"
    params = f"{{buffer_size = {args.buffer}, max_staleness = {args.staleness}{conc}}}"
    cmd = [sys.executable, "-m", "phalanx.cli", "launch", "--workers", str(args.workers + 1),
           "--set", "dataset=digits", "--set", "model=logreg", "--set", "byzantine=0", "--set", "attack=none",
           "--set", "algorithm=fedbuff", "--set", f"algorithm_params={params}", "--set", "aggregator=mean",
           "--set", "f=0", "--set", f"rounds={args.steps}", "--set", "lr=0.5", "--set", "schedule=constant",
           "--set", "round_timeout=120", "--set", "seed=0", "--set", "eval_every=1",
           "--out", str(out / "runs"), *keys]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    load_after = os.getloadavg()[0]
    if proc.returncode != 0:
        sys.exit(f"the launch failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    runs = [p for p in (out / "runs").iterdir() if (p / "metrics.jsonl").exists()]
    rows = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "staleness_mean" in r]
    row = rows[-1]
    staleness = sum(r["staleness_mean"] for r in rows) / len(rows)  # (every step aggregates K updates)
    summary = json.loads((runs[0] / "distributed.json").read_text())["summary"]
    dropped: dict[str, int] = {}
    if m := re.search(r"updates dropped: ([^\n]*)", proc.stderr):
        for part in m.group(1).split(", "):
            reason, k = part.rsplit(" ", 1)
            dropped[reason] = int(k)
    lines = re.findall(r"computed (\d+) updates", proc.stderr)
    computed = str(sum(int(k) for k in lines)) if len(lines) == args.workers else "not reported"
    credits = re.search(r"credits: ([^\n]*)", proc.stderr)
    aggregated = int(row["updates"])
    arrived = aggregated + sum(dropped.values())
    print(f"workers {args.workers}, K = {args.buffer}, S = {args.staleness}, {args.steps} steps"
          f"{', keys' if args.keys else ''}{'' if args.concurrency is None else f', C = {args.concurrency}'}")
    print(f"honest computed {computed}, arrived {arrived}, aggregated {aggregated}: share aggregated "
          f"{aggregated / max(arrived, 1):.2f}")
    print("dropped: " + (", ".join(f"{k} {v}" for k, v in dropped.items()) or "none"))
    print(f"credits: {credits.group(1) if credits else 'none (no flow control)'}")
    print(f"rank 0 peak RSS {summary['max_rss_mib']:.0f} MiB, median step {1000 * summary['median_round_s']:.1f} ms, "
          f"mean staleness {staleness:.2f} (eval every step), test accuracy {row.get('test_accuracy', -1.0):.3f}, "
          f"rank 0's seconds at the last step {row['sim_time']:.2f} (sim_time)")
    print(f"1-minute load {load_before:.2f} before, {load_after:.2f} after")


if __name__ == "__main__":
    main()
