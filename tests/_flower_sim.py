"""Shared by the Flower tests: run an example's offline simulation script (Flower's simulation engine, Ray) in its
own session, end every process it left (found by the Ray directory on their command lines), and return its JSON
result."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = 300
"""Seconds the simulation may take on a loaded 2-core machine before the test fails."""


def processes_mentioning(text: str) -> list[int]:
    """The pids whose command line contains ``text`` (from /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def run_offline(script: Path, args: list[str], tmp_path: Path, prefix: str) -> tuple[Any, Path]:
    """Run ``script args --result … --log-path … --ray-dir …`` and return (its JSON result, the contributions log's
    path); fail the test if it times out, fails or leaves Ray processes behind (they are killed first)."""
    ray_dir = tempfile.mkdtemp(prefix=prefix)  # a short path: Ray's socket paths are limited to 107 bytes
    result, log_path = tmp_path / "result.json", tmp_path / "contributions.jsonl"
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_HOME": str(tmp_path / "flwr-home"), "RAY_USAGE_STATS_ENABLED": "0", "OPENBLAS_NUM_THREADS": "1"}
    cmd = [sys.executable, str(script), *args, "--result", str(result), "--log-path", str(log_path),
           "--ray-dir", ray_dir]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the Flower run did not finish in {TIMEOUT} s:\n" + output[-3000:])
    finally:
        leftovers = processes_mentioning(ray_dir)
        for pid in leftovers:  # started by this test: end them before failing
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert proc.returncode == 0, output[-3000:]
    assert not leftovers, f"Ray processes left running: {leftovers}"
    return json.loads(result.read_text()), log_path
