"""FedBuff's concurrency C on the simulated clock: the staleness it saves and the simulated time it costs.

    PYTHONPATH=src .venv/bin/python benchmarks/async_concurrency.py RUNS --step 100 --time 50

Reads the runs ``phalanx run`` wrote under RUNS (each run directory's ``config.json`` and ``metrics.jsonl``; a grid
over ``algorithm_params`` with ``concurrency`` and seeds, docs/async.md "Concurrency") and prints one Markdown row
per C: the mean staleness over the evaluation rows up to step ``--step`` (each row the staleness mean of the step it
follows; Little's law with C in flight says C/K − 1), the simulated time at that step, the test accuracy at that
step, and the test accuracy at simulated time ``--time`` (the last evaluation at or before it; "—" when a run ended
before it), each the mean ± 95 % Student-t half-width over the seeds (:func:`phalanx.analysis.stats.mean_ci`).
Nothing is timed: the numbers are functions of the configs and seeds.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from phalanx.analysis.stats import mean_ci


def read(runs: Path) -> dict[int, list[list[dict[str, Any]]]]:
    """Each C's runs (their evaluation rows), C the config's ``algorithm_params.concurrency`` (absent: the workers)."""
    out: dict[int, list[list[dict[str, Any]]]] = defaultdict(list)
    for metrics in sorted(runs.glob("**/metrics.jsonl")):
        cfg = json.loads((metrics.parent / "config.json").read_text())
        c = cfg.get("algorithm_params", {}).get("concurrency") or cfg["workers"]
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        out[int(c)].append([r for r in rows if "sim_time" in r])
    return out


def cells(rows: list[dict[str, Any]], step: int, time: float) -> tuple[float, float, float, float | None]:
    """One run's staleness (mean up to ``step``), simulated time and accuracy at ``step``, accuracy at ``time``."""
    upto = [r for r in rows if 0 < r["round"] <= step and r["staleness_mean"] is not None]
    if not upto or upto[-1]["round"] != step:
        raise SystemExit(f"a run has no evaluation at step {step} (eval_every must divide it, rounds reach it)")
    before = [r for r in rows if (r["sim_time"] or 0.0) <= time]  # (round 0: time 0, θ₀)
    at_time = before[-1]["test_accuracy"] if before and rows[-1]["sim_time"] >= time else None
    return (sum(r["staleness_mean"] for r in upto) / len(upto), upto[-1]["sim_time"], upto[-1]["test_accuracy"],
            at_time)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--step", type=int, default=100)
    ap.add_argument("--time", type=float, default=50.0)
    args = ap.parse_args()
    print(f"| C | staleness mean to step {args.step} | simulated time at step {args.step} | test accuracy % at step "
          f"{args.step} | test accuracy % at simulated time {args.time:g} | seeds |")
    print("|---|---|---|---|---|---|")
    for c, runs in sorted(read(args.runs).items()):
        got = [cells(rows, args.step, args.time) for rows in runs]
        at_time = [g[3] for g in got if g[3] is not None]
        timed = mean_ci(at_time).show(100, 1) if len(at_time) == len(got) else "— (a run ended before it)"
        print(f"| {c} | {mean_ci([g[0] for g in got]).show(1, 2)} | {mean_ci([g[1] for g in got]).show(1, 1)} | "
              f"{mean_ci([g[2] for g in got]).show(100, 1)} | {timed} | {len(got)} |")


if __name__ == "__main__":
    main()
