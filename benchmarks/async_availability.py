"""FedBuff with and without a FedScale availability trace on the simulated clock: what going offline costs.

    PYTHONPATH=src .venv/bin/python benchmarks/async_availability.py RUNS --step 100 --time 10

Reads the runs ``phalanx run`` wrote under RUNS (each run directory's ``config.json`` and ``metrics.jsonl``; a grid
over ``algorithm_params`` with ``availability`` and seeds, docs/async.md "Availability") and prints one Markdown row
per availability: at step ``--step`` the simulated time, the updates lost to a worker going offline (``unavailable``)
and dropped as too stale, the mean staleness over the evaluation rows up to it and the test accuracy; and the test
accuracy at simulated time ``--time`` (the last evaluation at or before it) — each the mean ± 95 % Student-t
half-width over the seeds (:func:`phalanx.analysis.stats.mean_ci`). Nothing is timed: the numbers are functions of
the configs, the trace and the seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _async_runs import accuracy_at, read, up_to
from phalanx.analysis.stats import mean_ci


def cells(rows: list[dict[str, Any]], step: int, time: float) -> list[float | None]:
    """One run's simulated time, lost and dropped updates, staleness (mean up to ``step``) and accuracy at ``step``,
    and accuracy at ``time`` (None: the run ended before it)."""
    upto = up_to(rows, step)
    last = upto[-1]
    return [last["sim_time"], last["unavailable"], last["dropped"],
            sum(r["staleness_mean"] for r in upto) / len(upto), last["test_accuracy"], accuracy_at(rows, time)]


def availability(cfg: dict[str, Any]) -> str:
    """The config's ``algorithm_params.availability`` (absent: ``"always"``)."""
    return str(cfg.get("algorithm_params", {}).get("availability", "always"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--step", type=int, default=100)
    ap.add_argument("--time", type=float, default=10.0)
    args = ap.parse_args()
    s = args.step
    print(f"| availability | simulated time at step {s} | lost offline to step {s} | dropped to step {s} | "
          f"staleness mean to step {s} | test accuracy % at step {s} | test accuracy % at simulated time "
          f"{args.time:g} | seeds |")
    print("|---|---|---|---|---|---|---|---|")
    for name, runs in sorted(read(args.runs, availability).items()):
        got = [cells(rows, s, args.time) for rows in runs]
        col = [[g[i] for g in got] for i in range(6)]
        timed = mean_ci(col[5]).show(100, 1) if None not in col[5] else "— (a run ended before it)"
        print(f"| {name} | {mean_ci(col[0]).show(1, 1)} | {mean_ci(col[1]).show(1, 1)} | "
              f"{mean_ci(col[2]).show(1, 1)} | {mean_ci(col[3]).show(1, 2)} | {mean_ci(col[4]).show(100, 1)} | "
              f"{timed} | {len(got)} |")


if __name__ == "__main__":
    main()
