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
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _async_runs import accuracy_at, read, up_to
from phalanx.analysis.stats import mean_ci


def cells(rows: list[dict[str, Any]], step: int, time: float) -> tuple[float, float, float, float | None]:
    """One run's staleness (mean up to ``step``), simulated time and accuracy at ``step``, accuracy at ``time``."""
    upto = up_to(rows, step)
    return (sum(r["staleness_mean"] for r in upto) / len(upto), upto[-1]["sim_time"], upto[-1]["test_accuracy"],
            accuracy_at(rows, time))


def concurrency(cfg: dict[str, Any]) -> int:
    """C, the config's ``algorithm_params.concurrency`` (absent: every worker)."""
    return int(cfg.get("algorithm_params", {}).get("concurrency") or cfg["workers"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--step", type=int, default=100)
    ap.add_argument("--time", type=float, default=50.0)
    args = ap.parse_args()
    print(f"| C | staleness mean to step {args.step} | simulated time at step {args.step} | test accuracy % at step "
          f"{args.step} | test accuracy % at simulated time {args.time:g} | seeds |")
    print("|---|---|---|---|---|---|")
    for c, runs in sorted(read(args.runs, concurrency).items()):
        got = [cells(rows, args.step, args.time) for rows in runs]
        at_time = [g[3] for g in got if g[3] is not None]
        timed = mean_ci(at_time).show(100, 1) if len(at_time) == len(got) else "— (a run ended before it)"
        print(f"| {c} | {mean_ci([g[0] for g in got]).show(1, 2)} | {mean_ci([g[1] for g in got]).show(1, 1)} | "
              f"{mean_ci([g[2] for g in got]).show(100, 1)} | {timed} | {len(got)} |")


if __name__ == "__main__":
    main()
