"""The checks of ``scripts/fault_campaign.py``: what a killed-and-resumed command's output must be — the harness's
event log read back (which state each kill interrupted), the files a kill must not have touched, the order of the
events, and the comparison with the uninterrupted reference, bit for bit (metrics, checkpoints, provenance,
report)."""

from __future__ import annotations

import hashlib
import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any

TRANSIENT = (".tmp", ".lock")


def describe(point: dict[str, Any]) -> str:
    """A write point in words: ``checkpoint 2: torn temp of metrics.jsonl``, ``finish: manifest update recording
    DONE, before rename``."""
    if point.get("ctx"):
        what = f"manifest update recording {point['ctx']}, " + ("torn temp" if point["kind"] == "torn" else
                                                                "before rename")
    elif point["kind"] == "torn":
        what = f"torn temp of {point['file']}"
    else:
        what = f"{point['file']} temp complete, before rename"
    return f"{point['phase']}: {what}"


def read_log(path: Path) -> list[dict[str, Any]]:
    """The harness's events (complete lines only: a process may be writing one)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def state_at(events: list[dict[str, Any]], tag: str, until: float, pid: int | None, sweep: bool) -> str:
    """What a command (or its worker process ``pid``) was doing when it was killed at ``until``: its last event, and
    for a sweep how many runs had finished."""
    mine = [e for e in events if e["tag"] == tag and e["t"] <= until and e["ev"] not in ("proc", "kill")
            and (pid is None or e["pid"] == pid)]
    if not mine:
        text = "before its first write"
    else:
        e = mine[-1]
        text = {"point": lambda: f"last write point {describe(e)}",
                "ckpt-begin": lambda: f"writing checkpoint {e['round']}",
                "ckpt-end": lambda: f"training after checkpoint {e['round']}",
                "load": lambda: f"training from round {e['round'] or 0}",
                "finish-begin": lambda: "finishing", "finish-end": lambda: "run finished"}[e["ev"]]()
    if pid is not None:
        text = f"worker {pid}" + (f" ({mine[-1]['run']})" if mine and "run" in mine[-1] else "") + f": {text}"
    if sweep:
        runs = {e["run"] for e in events if e["ev"] == "finish-end" and e["t"] <= until}
        text += f"; {len(runs)} runs finished"
    return text


def run_dirs(out: Path) -> dict[str, Path]:
    """The run directories under ``out``, by name."""
    return {p.parent.name: p.parent for p in out.glob("*/config.json")} if out.exists() else {}


def _durable(path: Path) -> bool:
    return path.is_file() and not path.name.endswith(TRANSIENT)


def done_files(out: Path) -> dict[str, dict[str, tuple[int, int, int]]]:
    """For each finished run: (inode, size, modification time in ns) of each of its files."""
    snap = {}
    for name, d in run_dirs(out).items():
        if (d / "DONE").exists():
            snap[name] = {p.name: (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
                          for p in d.iterdir() if _durable(p)}
    return snap


def untouched(before: dict[str, Any], after: dict[str, Any], events: list[dict[str, Any]], tag: str) -> list[str]:
    """A run finished before a command must not be touched by it: same files, no checkpoint or finish written."""
    problems = []
    for name, files in before.items():
        if after.get(name) != files:
            changed = sorted(set(files) ^ set(after.get(name, {})) | {f for f in files if
                                                                      after.get(name, {}).get(f) != files[f]})
            problems.append(f"finished run {name} was changed by a later command ({', '.join(changed)})")
        redone = [e["ev"] for e in events if e["tag"] == tag and e.get("run") == name
                  and e["ev"] in ("ckpt-begin", "finish-begin")]
        if redone:
            problems.append(f"finished run {name} was trained again ({', '.join(redone)})")
    return problems


def check_events(events: list[dict[str, Any]]) -> list[str]:
    """Nothing done twice, nothing lost, from the events of every command of a case (in the order they happened)."""
    problems = []
    by_run: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if "run" in e:
            by_run.setdefault(e["run"], []).append(e)
    for run, evs in by_run.items():
        installed: list[int] = []
        begun: int | None = None
        finished = 0
        loads = Counter(e["tag"] for e in evs if e["ev"] == "load")
        if any(n > 1 for n in loads.values()):
            problems.append(f"{run}: opened twice by one command")
        for e in evs:
            if e["ev"] == "ckpt-begin":
                begun = e["round"]
                if finished:
                    problems.append(f"{run}: checkpoint of round {e['round']} written after the run finished")
            elif e["ev"] == "ckpt-end":
                if e["round"] in installed:
                    problems.append(f"{run}: checkpoint of round {e['round']} installed twice (rounds done twice)")
                installed.append(e["round"])
            elif e["ev"] == "load":
                last = installed[-1] if installed else None
                if e["round"] != last and not (e["round"] is not None and e["round"] == begun):
                    problems.append(f"{run}: resumed from round {e['round']}, but the last checkpoint installed was "
                                    f"of round {last}" + (" (rounds lost)" if (e["round"] or 0) < (last or 0) else ""))
            elif e["ev"] == "finish-begin" and finished:
                problems.append(f"{run}: finished twice")
            elif e["ev"] == "finish-end":
                finished += 1
    return problems


def _same(a: Any, b: Any) -> bool:
    """Equal, floats by their bits (NaN equals NaN of the same bits, 0.0 differs from -0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _parquet(path: Path) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]]]:
    import duckdb

    con = duckdb.connect()
    try:
        cur = con.execute("SELECT * FROM read_parquet(?)", [str(path)])
        columns = [(d[0], str(d[1])) for d in cur.description]
        return columns, cur.fetchall()
    finally:
        con.close()


def _checkpoint(path: Path) -> tuple[dict[str, str], dict[str, Any]]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    return meta, load_file(str(path))


def _tensor_bits(t: Any) -> tuple[str, tuple[int, ...], bytes]:
    import torch

    raw = t.detach().contiguous().flatten().view(torch.uint8)
    return str(t.dtype), tuple(t.shape), raw.numpy().tobytes()


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _provenance(run: Path, meta: dict[str, str]) -> list[str]:
    """What is wrong with a finished run's provenance record: none, not starting fresh, or not consistent with the
    run and its checkpoint (one session per command that trained it, contiguous)."""
    from phalanx.errors import PhalanxError
    from phalanx.experiments import provenance

    try:
        chain = provenance.read_chain(run / "checkpoint.safetensors", meta)
        if chain is None or not chain[0].start.fresh:
            return ["the checkpoint's provenance record is missing or does not start at round 0"]
        provenance.check_recorded(run, json.loads((run / "config.json").read_text()))
    except PhalanxError as exc:
        return [f"provenance: {exc}"]
    return []


def compare(ref_out: Path, out: Path, info: dict[str, Any]) -> list[str]:
    """The run directories under ``out`` against the reference's (see the module's docstring); ``info`` gets which
    files are byte-identical too."""
    from phalanx.errors import PhalanxError
    from phalanx.experiments import store

    problems = []
    ref_runs, runs = run_dirs(ref_out), run_dirs(out)
    if set(ref_runs) != set(runs):
        return [f"run directories differ: missing {sorted(set(ref_runs) - set(runs))}, extra "
                f"{sorted(set(runs) - set(ref_runs))}"]
    for name, ref in ref_runs.items():
        got = runs[name]
        bad: list[str] = []
        want = {p.name for p in ref.iterdir() if _durable(p)}
        have = {p.name for p in got.iterdir() if _durable(p)}
        if want != have:
            bad.append(f"files differ (missing {sorted(want - have)}, extra {sorted(have - want)})")
        if not (got / "DONE").exists():
            bad.append("no DONE")
        if bad:
            problems += [f"{name}: {b}" for b in bad]
            continue
        rows = _rows(got / "metrics.jsonl")
        if not _same(rows, _rows(ref / "metrics.jsonl")):
            bad.append("metrics.jsonl rows differ from the reference")
        rounds = Counter(r["round"] for r in rows)
        if any(n != 1 for n in rounds.values()):
            bad.append(f"metrics.jsonl has rounds more than once: {sorted(r for r, n in rounds.items() if n > 1)}")
        if not _same(_parquet(got / "metrics.parquet"), _parquet(ref / "metrics.parquet")):
            bad.append("metrics.parquet content differs from the reference")
        (meta, tensors), (ref_meta, ref_tensors) = _checkpoint(got / "checkpoint.safetensors"), _checkpoint(
            ref / "checkpoint.safetensors")
        bad += _provenance(got, meta)
        meta, ref_meta = ({k: v for k, v in m.items() if k != "provenance"} for m in (meta, ref_meta))
        if meta != ref_meta:
            bad.append(f"checkpoint metadata {meta} differs from the reference's {ref_meta}")
        if set(tensors) != set(ref_tensors):
            bad.append(f"checkpoint tensors {sorted(tensors)} differ from the reference's {sorted(ref_tensors)}")
        else:
            differ = [k for k in tensors if _tensor_bits(tensors[k]) != _tensor_bits(ref_tensors[k])]
            if differ:
                bad.append(f"checkpoint tensors differ from the reference's: {', '.join(sorted(differ))}")
        if json.loads((got / "config.json").read_text()) != json.loads((ref / "config.json").read_text()):
            bad.append("config.json differs from the reference")
        manifest = json.loads((got / "manifest.json").read_text())
        artifacts = manifest.get("artifacts", {})
        for file in sorted(have - {"manifest.json"}):
            entry = artifacts.get(file)
            if entry is None or entry.get("sha256") != hashlib.sha256((got / file).read_bytes()).hexdigest():
                bad.append(f"manifest.json does not record {file} as it is now")
        try:
            store.verify(got, tuple(sorted(artifacts)))
        except PhalanxError as exc:
            bad.append(f"integrity check: {exc}")
        for file in ("metrics.jsonl", "metrics.parquet", "checkpoint.safetensors", "config.json"):
            same = (got / file).read_bytes() == (ref / file).read_bytes()
            info.setdefault("bytes identical", Counter())[file] += int(same)
            info.setdefault("compared", Counter())[file] += 1
        problems += [f"{name}: {b}" for b in bad]
    return problems


def check_report(out: Path) -> list[str]:
    """``phalanx report OUT`` (the command line's own function, in this process) exits 0 and writes report.md."""
    from typer.testing import CliRunner

    from phalanx.cli import app

    (out / "report.md").unlink(missing_ok=True)
    result = CliRunner().invoke(app, ["report", str(out)])
    if result.exit_code != 0 or not (out / "report.md").exists():
        return [f"phalanx report failed (exit {result.exit_code}): {result.exception or result.output[-300:]}"]
    return []


# ----------------------------------------------------------------------------------------------------------- main
