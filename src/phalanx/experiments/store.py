"""Run directories: resolved config, manifest, metrics and checkpoints, all written atomically.

Layout of a run directory::

    config.json           the resolved configuration
    manifest.json         versions, seed, data fingerprint, start time
    metrics.jsonl         one row per evaluated round (rewritten atomically at every checkpoint)
    checkpoint.safetensors  θ, worker momentum, previous aggregate, normalisation statistics, random-stream states,
                            server optimizer
                          state, round (atomic)
    metrics.parquet       the same rows as Parquet, written when the run finishes
    DONE                  marker of a finished run
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from phalanx import __version__
from phalanx.errors import ConfigError
from phalanx.experiments.config import RESULT_NEUTRAL_KEYS
from phalanx.training.state import RoundState, Snapshot


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """Write a file so that readers see the old or the new content, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Text version of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode())


def prepare_run_dir(out: Path, identity: dict[str, Any], seed: int, data_fingerprint: str) -> None:
    """Create the run directory, or check that an existing one holds the same configuration.

    ``identity`` is what names the run (a config's :meth:`~phalanx.experiments.config.RunConfig.identity`); the
    resolved configuration is written as ``config.json``, with a manifest of versions, seed and data fingerprint.
    """
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "config.json"
    if cfg_path.exists():
        existing = {k: v for k, v in json.loads(cfg_path.read_text()).items() if k not in RESULT_NEUTRAL_KEYS}
        resolved = {k: v for k, v in identity.items() if k not in RESULT_NEUTRAL_KEYS}
        if existing != resolved:
            changed = sorted(k for k in set(existing) | set(resolved) if existing.get(k) != resolved.get(k))
            raise ConfigError(
                "run directory", str(out), f"a directory of the same configuration (differs in {', '.join(changed)})",
                "use another --out or delete it",
            )
        return
    atomic_write_text(cfg_path, json.dumps(identity, indent=2, sort_keys=True))
    manifest = {
        "phalanx": __version__, "torch": torch.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "seed": seed, "data_fingerprint": data_fingerprint,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True))


def save_checkpoint(out: Path, snap: Snapshot) -> Path:
    """Write the metric rows so far, then the checkpoint (both atomically; rows first, so none are lost).

    Tensors: ``theta``, ``momentum``, ``previous``, ``norm_stats`` (BatchNorm / Hybrid BN global statistics),
    ``rng.<stream>`` (random streams), ``optim.<name>`` (the server
    optimizer's state); metadata: ``round`` and the number of rows.
    """
    state, rows = snap.state, snap.rows
    atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    tensors = {"theta": state.theta.contiguous()}
    if state.momentum is not None:
        tensors["momentum"] = state.momentum.contiguous()
    if state.previous is not None:
        tensors["previous"] = state.previous.contiguous()
    if state.stats is not None:
        tensors["norm_stats"] = state.stats.contiguous()
    for name, g in snap.streams.items():
        tensors[f"rng.{name}"] = g
    for name, t in snap.optimizer.items():
        tensors[f"optim.{name}"] = t.contiguous()
    path = out / "checkpoint.safetensors"
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".checkpoint.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"round": str(state.round), "rows": str(len(rows))})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(out: Path) -> Snapshot | None:
    """The last checkpoint of a run directory, with the metric rows up to it; None if there is none."""
    ckpt = out / "checkpoint.safetensors"
    if not ckpt.exists():
        return None
    with safe_open(str(ckpt), framework="pt") as fh:
        meta = fh.metadata()
    tensors = load_file(str(ckpt))
    round_ = int(meta["round"])
    rows = [r for r in read_rows(out) if r["round"] <= round_]
    state = RoundState(
        theta=tensors["theta"], momentum=tensors.get("momentum"), previous=tensors.get("previous"), round=round_,
        stats=tensors.get("norm_stats"),
    )
    streams = {k.removeprefix("rng."): v for k, v in tensors.items() if k.startswith("rng.")}
    optimizer = {k.removeprefix("optim."): v for k, v in tensors.items() if k.startswith("optim.")}
    return Snapshot(state, streams, optimizer, rows, resumed=True)


def finish_run(out: Path, rows: list[dict[str, Any]]) -> None:
    """Write the final metrics (JSON lines and Parquet) and mark the run finished."""
    atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write_parquet(out / "metrics.parquet", rows)
    atomic_write_text(out / "DONE", time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")


def is_finished(out: Path) -> bool:
    """Whether a run directory holds a finished run."""
    return (out / "DONE").exists()


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows to Parquet through DuckDB (atomically: a temporary file, then a rename)."""
    import duckdb

    fd, tmp_json = tempfile.mkstemp(dir=path.parent, suffix=".jsonl")
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        con = duckdb.connect()
        con.execute(
            f"COPY (SELECT * FROM read_json_auto('{tmp_json}', format='newline_delimited')) TO '{tmp}' "
            "(FORMAT parquet)"
        )
        con.close()
        os.replace(tmp, path)
    finally:
        Path(tmp_json).unlink(missing_ok=True)
        Path(tmp).unlink(missing_ok=True)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Read the metric rows of a run directory (JSON lines)."""
    metrics = path / "metrics.jsonl"
    if not metrics.exists():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def finished_rows(path: Path) -> list[dict[str, Any]]:
    """The metric rows of a finished run, by round; a :class:`ConfigError` if the run has not finished."""
    rows = read_rows(path)
    if not rows or not is_finished(path):
        raise ConfigError("run", str(path), "a finished run (run it first)")
    return sorted(rows, key=lambda r: r["round"])
