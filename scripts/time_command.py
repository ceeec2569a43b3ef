"""Time one command the way the docs quote a time: wall clock, the machine's load while it ran, CPU time, peak memory.

    .venv/bin/python scripts/time_command.py [--label TEXT] [--append FILE] -- COMMAND [ARGS ...]

Prints one line a doc's time table can take as it is, e.g.::

    phalanx experiment privacy --preset quick: 1 min 12 s wall; load 1.9–3.4 (1-min average, sampled each second,
    2 cores); CPU 2 min 3 s (user + system, the command and its children); peak RSS 412 MiB (largest child)

and the same as JSON on a second line (``{"wall_s": …}``) for scripts. Exit status: the command's own.

Why a script: issue 38 asks that every time the docs quote is measured by a command in the repository and quoted
with its load, because a figure without the load it was measured at cannot be reproduced (a 2-core machine at load 9
runs a study 3–5× slower than at load 1). The load is the kernel's 1-minute average (``/proc/loadavg``, or
``os.getloadavg`` elsewhere), sampled once a second by a watcher thread while the command runs; its range (min–max)
is what a doc quotes. CPU time and peak RSS come from ``resource.getrusage(RUSAGE_CHILDREN)`` after the command ends
(peak RSS is the largest single descendant's, as the kernel reports it, not a sum).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Timing:
    """What one run of a command measured."""

    command: str
    wall_s: float
    load_min: float
    load_max: float
    cores: int
    cpu_s: float
    peak_rss_mib: float
    returncode: int


def load_average() -> float:
    """The 1-minute load average now."""
    return os.getloadavg()[0]


def clock(seconds: float) -> str:
    """``75.4`` → ``'1 min 15 s'``; under a minute ``'12.3 s'``; an hour or more ``'1 h 2 min'``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def time_command(argv: list[str], label: str | None = None, period_s: float = 1.0) -> Timing:
    """Run ``argv`` to its end, sampling the load every ``period_s`` seconds from just before it starts to its end."""
    if not argv:
        raise ValueError("command: empty; give it after '--'")
    samples = [load_average()]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(period_s):
            samples.append(load_average())

    watcher = threading.Thread(target=watch, daemon=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    watcher.start()
    try:
        returncode = subprocess.call(argv)
    finally:
        wall = time.perf_counter() - start
        done.set()
        watcher.join()
    samples.append(load_average())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss_kib = after.ru_maxrss if sys.platform != "darwin" else after.ru_maxrss / 1024
    return Timing(command=label or shlex.join(argv), wall_s=wall, load_min=min(samples), load_max=max(samples),
                  cores=os.cpu_count() or 1, cpu_s=cpu, peak_rss_mib=rss_kib / 1024, returncode=returncode)


def line(t: Timing) -> str:
    """The one line a doc's time table takes."""
    return (f"{t.command}: {clock(t.wall_s)} wall; load {t.load_min:.1f}–{t.load_max:.1f} (1-min average, sampled "
            f"each second, {t.cores} cores); CPU {clock(t.cpu_s)} (user + system, the command and its children); "
            f"peak RSS {t.peak_rss_mib:.0f} MiB (largest child)"
            + (f"; exit status {t.returncode}" if t.returncode else ""))


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--label", help="what to call the command in the line (default: the command itself)")
    parser.add_argument("--append", metavar="FILE", help="also append the line to FILE (the command's own output "
                        "goes to the terminal, so a log of many timings keeps only the timings)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS ...]")
    ns = parser.parse_args(args)
    argv = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not argv:
        parser.error("command: missing; give it after '--'")
    timing = time_command(argv, ns.label)
    print(line(timing), flush=True)
    print(json.dumps(asdict(timing)), flush=True)
    if ns.append:
        with open(ns.append, "a", encoding="utf-8") as log:
            log.write(line(timing) + "\n")
    return timing.returncode


if __name__ == "__main__":
    sys.exit(main())
