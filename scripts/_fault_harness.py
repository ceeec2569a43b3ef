"""The ``phalanx`` command line with its run-directory writes watched, and optionally a SIGKILL at a chosen write —
the fault campaign's (``scripts/fault_campaign.py``) way into a run, with no hook in Phalanx itself.

    python scripts/_fault_harness.py run CONFIG --out DIR          # as `phalanx run CONFIG --out DIR`
    python scripts/_fault_harness.py sweep GRID --out DIR --jobs 2

Environment:

* ``PHALANX_FAULT_LOG=PATH`` — append one JSON line per event to PATH (one ``write`` each, ``O_APPEND``: the lines of
  concurrent processes do not mix, and a line is whole or absent when a process is killed).
* ``PHALANX_FAULT_KILL='{"nth": 7}'`` — SIGKILL this process at its 7th *write point*; with ``"kind"``, ``"file"``,
  ``"ctx"`` or ``"phase"`` as well, at the 7th write point that matches them all.
* ``PHALANX_FAULT_TAG=TEXT`` — copied into every line (and inherited by the sweep's worker processes, so that every
  process of one command can be found by its environment).

Write points (``"ev": "point"``), in the order a run meets them — the atomic writes of
:mod:`phalanx.experiments.store` all end in ``os.fsync`` / ``store.file_digest`` of a temporary file and
``os.replace`` of it:

* ``torn`` — the temporary file of ``file`` is written and about to be flushed (``os.fsync``), or, for the Parquet
  file (DuckDB writes it, no ``fsync``), about to be hashed (``store.file_digest``): the file is cut to half its size,
  then the process is killed — what a kill in the middle of writing it leaves;
* ``rename`` — the temporary file is complete (and, for a run-directory file, its digest recorded in the manifest);
  the process is killed just before ``os.replace`` moves it over ``file``.

``ctx`` names the file whose digest a manifest write records (the manifest update inside ``store._record``);
``phase`` the step of the run: ``open`` (a new run directory), ``checkpoint <round>``, ``finish``, ``report``.

Other events: ``proc`` (a process started: pid, parent), ``load`` (a run resumed from the checkpoint of ``round``,
``null`` for a fresh start), ``ckpt-begin`` / ``ckpt-end`` (a checkpoint of ``round`` started / installed),
``finish-begin`` / ``finish-end`` (the final metrics and ``DONE``), ``kill`` (the point this process kills itself
at). Every worker process of a sweep (started with the ``spawn`` method) runs this file's top level as
``__mp_main__`` before its work, so it is watched (and killable) like the sweep's own process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOG_ENV, KILL_ENV, TAG_ENV = "PHALANX_FAULT_LOG", "PHALANX_FAULT_KILL", "PHALANX_FAULT_TAG"

_state: dict[str, Any] = {"phase": "open", "recording": None, "seen": 0, "fd": None, "fsynced": set()}


def log(event: str, **fields: Any) -> None:
    """Append one event line (nothing without ``PHALANX_FAULT_LOG``)."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    if _state["fd"] is None:
        _state["fd"] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = {"ev": event, "pid": os.getpid(), "tag": os.environ.get(TAG_ENV, ""), "t": time.monotonic(), **fields}
    os.write(_state["fd"], (json.dumps(line) + "\n").encode())


def target_name(temp: str) -> str:
    """The file a temporary file of :mod:`phalanx.experiments.store` replaces: ``.metrics.jsonl.k2j4x9a1.tmp`` →
    ``metrics.jsonl``, ``.checkpoint.abcd1234.tmp`` → ``checkpoint.safetensors``."""
    stem = temp[1:].removesuffix(".tmp").removesuffix(".jsonl")
    name = stem.rsplit(".", 1)[0] if "." in stem else stem
    return "checkpoint.safetensors" if name == "checkpoint" else name


def is_temp(path: str) -> bool:
    """Whether ``path`` is one of the temporary files of an atomic write (``.NAME.XXXXXXXX.tmp``)."""
    base = os.path.basename(path)
    return base.startswith(".") and base.endswith(".tmp")


def _spec() -> dict[str, Any] | None:
    raw = os.environ.get(KILL_ENV)
    return json.loads(raw) if raw else None


def point(kind: str, path: str, cut: Callable[[], None] | None = None) -> None:
    """A write point: log it, and kill this process here if it is the one the kill spec names (``cut`` first, for a
    torn write)."""
    file = target_name(os.path.basename(path)) if kind == "torn" else os.path.basename(path)
    fields = {"kind": kind, "file": file, "ctx": _state["recording"], "phase": _state["phase"],
              "dir": os.path.basename(os.path.dirname(os.path.abspath(path)))}
    _state["seen"] += 1
    fields["i"] = _state["seen"]
    log("point", **fields)
    spec = _spec()
    if spec is None or any(spec[k] != fields[k] for k in ("kind", "file", "ctx", "phase") if k in spec):
        return
    matched = _state["matched"] = _state.get("matched", 0) + 1
    if matched != spec["nth"]:
        return
    if cut is not None:
        cut()
    log("kill", **fields)
    os.kill(os.getpid(), signal.SIGKILL)


def _half(path: str) -> Callable[[], None]:
    return lambda: os.truncate(path, os.path.getsize(path) // 2)


def install() -> None:
    """Watch the writes of this process (see the module's docstring)."""
    from phalanx.experiments import store

    real_replace, real_fsync = os.replace, os.fsync
    real_digest, real_record = store.file_digest, store._record
    real_save, real_open, real_finish = store.save_checkpoint, store.open_checkpoint, store.finish_run

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if is_temp(str(src)):
            at = kwargs.get("dst_dir_fd")  # a held run directory's rename (phalanx.experiments.dirfd): its real path
            point("rename", str(dst) if at is None else os.path.join(os.readlink(f"/proc/self/fd/{at}"), str(dst)))
        real_replace(src, dst, *args, **kwargs)

    def fsync(fd: Any) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
        except OSError:
            path = ""
        if is_temp(path):
            _state["fsynced"].add(os.path.realpath(path))
            point("torn", path, _half(path))
        real_fsync(fd)

    def file_digest(path: Path) -> str:
        name = str(path)
        if is_temp(name) and os.path.realpath(name) not in _state["fsynced"]:  # written without fsync (Parquet)
            point("torn", name, _half(name))
        return real_digest(path)

    def record(out: Path, name: str, digest: str) -> None:
        _state["recording"] = name
        try:
            real_record(out, name, digest)
        finally:
            _state["recording"] = None

    def save_checkpoint(out: Path, snap: Any, *args: Any, **kwargs: Any) -> Path:
        r = snap.state.round
        _state["phase"] = f"checkpoint {r}"
        log("ckpt-begin", run=Path(out).name, round=r)
        path = real_save(out, snap, *args, **kwargs)
        log("ckpt-end", run=Path(out).name, round=r)
        _state["phase"] = "train"
        return path

    def open_checkpoint(out: Path, *args: Any, **kwargs: Any) -> Any:
        _state["phase"] = "open"
        loaded = real_open(out, *args, **kwargs)
        log("load", run=Path(out).name, round=None if loaded is None else loaded.snapshot.state.round)
        _state["phase"] = "train"
        return loaded

    def finish_run(out: Path, rows: list[dict[str, Any]]) -> None:
        _state["phase"] = "finish"
        log("finish-begin", run=Path(out).name)
        real_finish(out, rows)
        log("finish-end", run=Path(out).name)
        _state["phase"] = "report"

    os.replace, os.fsync = replace, fsync
    store.file_digest, store._record = file_digest, record
    store.save_checkpoint, store.open_checkpoint, store.finish_run = save_checkpoint, open_checkpoint, finish_run


def install_phases() -> None:
    """Name the steps that write outside a checkpoint: a run directory created (manifest, config: ``open``) and the
    report of a command (``report``)."""
    from phalanx.experiments import report, store

    real_prepare, real_report = store.prepare_run_dir, report.write_report

    def prepare_run_dir(*args: Any, **kwargs: Any) -> None:
        _state["phase"] = "open"
        real_prepare(*args, **kwargs)

    def write_report(*args: Any, **kwargs: Any) -> Any:
        _state["phase"] = "report"
        return real_report(*args, **kwargs)

    store.prepare_run_dir, report.write_report = prepare_run_dir, write_report


if os.environ.get(LOG_ENV) or os.environ.get(KILL_ENV):
    log("proc", ppid=os.getppid(), main=__name__ == "__main__")
    install()
    install_phases()


if __name__ == "__main__":
    from phalanx.cli import main

    sys.argv = ["phalanx", *sys.argv[1:]]
    main()
