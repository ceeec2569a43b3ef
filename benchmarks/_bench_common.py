"""What the benchmark scripts share: the cores a process may use, a package's version, one JSON record appended to a
file, and the table cells' formats."""

from __future__ import annotations

import json
import os
from typing import Any


def all_threads() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def emit(path: str, rec: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def package_version(pkg: str) -> str:
    """The installed version of ``pkg``, or "not installed"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


def fmt_time(t: float | None) -> str:
    if t is None:
        return "—"
    if t < 1e-3:
        return f"{t * 1e6:.0f} µs"
    if t < 1.0:
        return f"{t * 1e3:.1f} ms"
    return f"{t:.2f} s"


def md_row(cells: list[str] | tuple[str, ...]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def sizes_main(run: Any, default_sizes: str, doc: str | None, argv: list[str] | None) -> int:
    """The command line of an alternating script (``clip_arc_modes.py``, ``cge_cc_modes.py``): ``--threads``,
    ``--reps`` and ``--sizes n:d:f,…``; ``run(n, d, f, reps)`` gives each setting's lines, printed between the load
    averages at the start and the end."""
    import argparse

    import torch

    ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--sizes", default=default_sizes, help="n:d:f settings, comma-separated")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"load average at start {os.getloadavg()[0]:.1f}", flush=True)
    for item in args.sizes.split(","):
        n, d, f = item.split(":")
        print("\n".join(run(int(n), int(float(d)), int(f), args.reps)), flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0
