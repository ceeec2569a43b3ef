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
