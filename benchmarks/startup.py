"""Start-up of the ``phalanx`` commands: wall time of a fresh interpreter running each, median of ``--reps``.

    PYTHONPATH=src .venv/bin/python benchmarks/startup.py [--reps 5]

Each command runs as ``python -m phalanx.cli ARGS`` in its own process (stdout discarded), the commands alternated
repetition by repetition so that a change of load hits all of them alike; printed with whether torch was imported
(``-X importtime``'s list, a separate run) and the 1-minute load average before and after. The times are measured
lower bounds under the load printed beside them: a loaded machine starts slower (issue 37: 8–17 s at load 6–14).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS: tuple[tuple[str, ...], ...] = (
    ("--help",), ("--version",), ("list", "--help"), ("run", "--help"), ("sweep", "--help"),
    ("list", "datasets"), ("list", "models"), ("list", "aggregators"), ("list", "attacks"), ("list", "algorithms"),
    ("list", "stages"), ("tension", "--help"), ("experiment", "--help"), ("status", "/nonexistent-phalanx-dir"),
)
"""What is timed: the help pages (the study groups' too), the listings, and a command that fails on its argument
before any work."""


def _run(args: tuple[str, ...], importtime: bool = False) -> tuple[float, str]:
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "phalanx.cli", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False,
                          env={**os.environ, "COLUMNS": "100"})
    return time.perf_counter() - t0, proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    reps = parser.parse_args().reps
    load_before = os.getloadavg()[0]
    times: dict[tuple[str, ...], list[float]] = {c: [] for c in COMMANDS}
    _run(("--help",))  # one warm-up: the page cache
    for _ in range(reps):
        for c in COMMANDS:
            times[c].append(_run(c)[0])
    torch_loaded = {c: any(line.split("|")[-1].strip() == "torch" for line in _run(c, importtime=True)[1].splitlines())
                    for c in COMMANDS}
    load_after = os.getloadavg()[0]
    print(f"| command | median of {reps} (s) | min (s) | imports torch |")
    print("|---|---|---|---|")
    for c in COMMANDS:
        print(f"| `phalanx {' '.join(c)}` | {statistics.median(times[c]):.2f} | {min(times[c]):.2f} | "
              f"{'yes' if torch_loaded[c] else 'no'} |")
    print(f"\n1-minute load average: {load_before:.1f} before, {load_after:.1f} after; {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
