"""The thread count of a run, chosen for the user and kept per machine (issue 37 item 5).

:func:`choose` decides the count of a single run (issue 37 item 5: torch's default, one thread per core, gave the
default job no speed-up on a quiet 2-core machine and made it 3× slower at load 6–9). Since the result depends on
the count, the count may not depend on the load of the moment (the determinism rule: same config and seed, same
result on the same machine, loaded or not): it is ``--threads``, else ``PHALANX_THREADS``, else — for ``jobs``
worker processes — ``cores // jobs``, else the count measured fastest on this machine *once*: the default job's
rounds timed at 1, 2, 4, … threads (:func:`fastest`: the fewest threads within :data:`TIE` of the best), stored
atomically in ``$XDG_CACHE_HOME/phalanx/threads.json`` under the machine's CPU model, core count and torch version
and read back on every later run (``tests/test_threads_choice.py``). A cache file that is too large, not JSON, or
whose entry does not hold — a count outside 1 … cores, timings that do not make that count the fastest — is refused
in one line and measured again. The measurement itself sees the load of its moment: the count stored is the one
measured then, and stays until the cache file is removed (or the CPU, core count or torch version changes).
"""

from __future__ import annotations

import json
import math
import os
import platform
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from phalanx.errors import ConfigError
from phalanx.files import write_atomic

__all__ = ["THREADS_ENV", "ThreadChoice", "choose", "fastest"]

THREADS_ENV = "PHALANX_THREADS"
"""The environment variable that sets a run's thread count (``--threads`` wins over it): a count, or ``torch`` for
torch's own default (one thread per core in this process; ``cores // jobs`` in worker processes)."""
TIE = 1.5
"""More threads are chosen only when at least 1.5× faster than fewer. The choice is measured once, on a quiet or a
busy moment, and kept; its risk is not symmetric: a newcomer's quiet measurement chose 2 threads for 0.568 ms a
round against 0.765 ms on 1 (1.35×), while on this 2-core machine at load ~4 a round of the same job took 80 ms on
2 threads against 0.70 ms on 1 (an OpenMP team waiting on a thread another process holds) — a small gain when the
machine is quiet, a large loss when it is not. Every extra thread is also CPU time taken from the machine's other
work."""
CACHE_MAX_BYTES = 64 * 1024
"""The cache file is refused above this size (it holds a few entries of a few hundred bytes)."""
CACHE_MAX_ENTRIES = 64
"""Entries kept in the cache file (other machines sharing a home directory); the oldest go first."""


@dataclass(frozen=True)
class ThreadChoice:
    """A run's thread count (None: torch's own default, left as it is) and why it is that."""

    threads: int | None
    why: str

    def line(self) -> str:
        """The one line a run prints about it."""
        count = "torch's default" if self.threads is None else str(self.threads)
        return f"threads: {count} ({self.why}; --threads N or {THREADS_ENV}=N to choose)"


def fastest(timings: Mapping[int, float]) -> int:
    """The fewest threads whose time is within :data:`TIE` of the best of ``timings`` (threads → seconds)."""
    best = min(timings.values())
    return min(t for t, s in timings.items() if s <= best * TIE)


def candidates(cores: int) -> list[int]:
    """The counts measured: 1, 2, 4, … below ``cores``, and ``cores`` itself."""
    out = [1 << k for k in range(max(1, cores).bit_length()) if 1 << k < cores]
    return [*out, max(1, cores)]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 16)
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.lower().startswith(("model name", "hardware")) and ":" in line:
            return " ".join(line.split(":", 1)[1].split())[:200]
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_key(cores: int) -> str:
    """What a measured count is stored under: the CPU model, the core count and torch's version."""
    return f"{_cpu_model()} | {cores} cores | torch {torch.__version__}"


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/phalanx/threads.json`` (default ``~/.cache/phalanx/threads.json``)."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "phalanx" / "threads.json"


def _count(raw: object, parameter: str, cores: int) -> int:
    """``raw`` as a thread count 1 … ``cores``, else the one-line :class:`ConfigError` naming ``parameter``."""
    try:
        value = int(str(raw).strip()) if not isinstance(raw, bool) else None
    except ValueError:
        value = None
    if value is None or not 1 <= value <= cores:
        raise ConfigError(parameter, raw, f"a thread count 1 … {cores} (this machine's cores), or torch "
                          "(torch's own default)")
    return value


def _entries(path: Path) -> tuple[dict[str, Any], str | None]:
    """The cache file's entries and what is wrong with it (None: nothing; no file: no entries)."""
    try:  # non-blocking open, then a regular file only: a FIFO or a device put there would block or never end
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"unreadable ({exc.strerror or exc})"
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}, "not a regular file"
        try:
            raw = fh.read(CACHE_MAX_BYTES + 1)
        except OSError as exc:
            return {}, f"unreadable ({exc.strerror or exc})"
    if len(raw) > CACHE_MAX_BYTES:
        return {}, f"larger than {CACHE_MAX_BYTES // 1024} KiB"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}, "not a JSON file"
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        return {}, "not a JSON object of machine entries"
    return data, None


def _entry(value: Any, cores: int) -> tuple[int | None, dict[int, float] | None, str | None]:
    """An entry's count and timings, or what is wrong with it."""
    if not isinstance(value, dict) or not isinstance(value.get("timings"), dict):
        return None, None, "its entry for this machine is not {threads, timings}"
    threads = value.get("threads")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= cores:
        return None, None, f"its count {str(threads)[:20]} is not 1 … {cores}"
    timings: dict[int, float] = {}
    for k, v in value["timings"].items():
        if (not (isinstance(k, str) and k.isdigit() and 1 <= int(k) <= cores) or isinstance(v, bool)
                or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0):
            return None, None, "its timings are not {threads: seconds > 0}"
        timings[int(k)] = float(v)
    if not timings or fastest(timings) != threads:
        return None, None, f"its timings do not make {threads} the fastest count"
    return threads, timings, None


def _timings_text(timings: Mapping[int, float]) -> str:
    """``1 thread 0.842 ms, 2 threads 15 ms`` (``1: 0.842 ms`` read as "default job 1": a first-hour review)."""
    return ", ".join(f"{t} thread{'s' if t != 1 else ''} {1e3 * s:.3g} ms" for t, s in sorted(timings.items()))


def choose(*, jobs: int = 1, override: int | None = None, env: Mapping[str, str] | None = None,
           cores: int | None = None, measure: Callable[[int], float] | None = None, path: Path | None = None,
           say: Callable[[str], None] | None = None) -> ThreadChoice:
    """The thread count of a run in each of ``jobs`` processes: ``override`` (``--threads``), else
    ``PHALANX_THREADS`` in ``env`` (a count or ``torch``), else ``cores // jobs`` for several processes, else the
    count stored for this machine in ``path`` (:func:`cache_path`), else — no entry, or one refused, said by
    ``say`` in one line — ``measure(t)`` (seconds a round of the default job takes at ``t`` threads) at every
    :func:`candidates` count, the :func:`fastest` stored atomically. Nothing here reads the load: the same cache
    gives the same count however busy the machine is."""
    env = os.environ if env is None else env
    cores = max(1, cores or os.cpu_count() or 1)
    if override is not None:
        return ThreadChoice(_count(override, "--threads", cores), "--threads")
    raw = env.get(THREADS_ENV, "").strip()
    if raw == "torch":
        return ThreadChoice(None, f"{THREADS_ENV}=torch")
    if raw:
        return ThreadChoice(_count(raw, THREADS_ENV, cores), THREADS_ENV)
    if jobs > 1:
        return ThreadChoice(max(1, cores // jobs), f"{cores} cores / {jobs} processes")
    if cores == 1 or measure is None:
        return ThreadChoice(1, "one core" if cores == 1 else "nothing measured")
    path = cache_path() if path is None else path
    key = machine_key(cores)
    entries, broken = _entries(path)
    problem = broken
    if key in entries:
        threads, timings, problem = _entry(entries[key], cores)
        if threads is not None and timings is not None:
            return ThreadChoice(threads, f"the fastest measured on this machine, per round of the default job: "
                                f"{_timings_text(timings)}, stored in {path}")
    if problem is not None and say is not None:
        say(f"ignored {path}: {problem}; measuring again")
    timings = {t: float(measure(t)) for t in candidates(cores)}
    threads = fastest(timings)
    kept = {k: v for k, v in entries.items() if k != key} if broken is None else {}
    kept = dict(list(kept.items())[-(CACHE_MAX_ENTRIES - 1):]) if CACHE_MAX_ENTRIES > 1 else {}
    kept[key] = {"threads": threads, "timings": {str(t): s for t, s in timings.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(kept, indent=1, sort_keys=True).encode())
        where = f"stored in {path}"
    except OSError as exc:
        where = f"not stored: {path}: {exc.strerror or exc}"
    return ThreadChoice(threads, f"the fastest measured now, per round of the default job: {_timings_text(timings)}"
                        f"; {where}")
