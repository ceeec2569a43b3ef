"""A sweep killed halfway (SIGKILL) and started again ends with the same results as an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _processes import HOLD, _alive, _children

CONFIG = """
dataset = "digits"
model = "logreg"
workers = 6
byzantine = 1
f = 1
aggregator = ["cwmed", "holdrule:HoldingMedian", "geomed"]
attack = "signflip"
rounds = 40
batch_size = 8
eval_every = 5
checkpoint_every = 5
seed = 1
"""



def _sweep(cfg: Path, out: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", "sweep", str(cfg), "--out", str(out), "--jobs", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120", **env},
    )


def _results(out: Path) -> dict[str, list[tuple[int, float]]]:
    res = {}
    for run in sorted(p for p in out.iterdir() if p.is_dir()):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        res[run.name] = [(r["round"], r["test_accuracy"]) for r in rows]
    return res


def test_killed_sweep_resumes_to_the_same_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep runs its three runs in one process; it is SIGKILLed in the 12th round of its second run (after the
    round-10 checkpoint), at a point a test rule signals — an event, not a race with the sweep's speed."""
    (tmp_path / "holdrule.py").write_text(HOLD)
    monkeypatch.syspath_prepend(str(tmp_path))
    path_env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(CONFIG)
    from phalanx.experiments import grid, load_toml, runner

    cfgs = grid.configs(load_toml(cfg))
    runner.run_grid(cfgs, tmp_path / "ref")  # the uninterrupted reference, in-process
    assert len(list((tmp_path / "ref").glob("*/DONE"))) == 3

    out = tmp_path / "killed"
    proc = _sweep(cfg, out, {**path_env, "HOLD_AT": f"12:{tmp_path}"})
    deadline = time.monotonic() + 240
    while not (tmp_path / "holding").exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the sweep never reached the hold"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(list(out.glob("*/DONE"))) == 1
    assert len(list(out.glob("*/checkpoint.safetensors"))) == 2  # the second run's round-10 checkpoint
    again = _sweep(cfg, out, path_env)
    assert again.wait(timeout=300) == 0, again.stderr.read() if again.stderr else ""
    assert _results(out) == _results(tmp_path / "ref")
    assert len(list(out.glob("*/DONE"))) == 3




@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_worker_processes_end_with_a_killed_parallel_sweep(tmp_path: Path) -> None:
    """`phalanx sweep --jobs 2` SIGKILLed while its workers train: the workers end too (each watches its parent),
    instead of training on unseen; the run directories they leave resume as usual."""
    (tmp_path / "holdrule.py").write_text(HOLD)
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(CONFIG)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "HOLD_AT": f"3:{tmp_path}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", "sweep", str(cfg), "--out", str(tmp_path / "out"), "--jobs", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120", **env},
    )
    deadline = time.monotonic() + 240
    while not (tmp_path / "holding").exists():  # a worker is inside a run (its rule holds there)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the sweep never reached the hold"
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert len(workers) >= 2  # the pool's processes (and the manager's)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while any(_alive(w) for w in workers):
        left = [(w, Path(f"/proc/{w}/cmdline").read_bytes().replace(b"\0", b" ")[:200]) for w in workers if _alive(w)]
        assert time.monotonic() < deadline, f"still running after their sweep died: {left}"
        time.sleep(0.05)


LAUNCH = """
dataset = "digits"
model = "logreg"
workers = 3
batch_size = 4
rounds = 40
eval_every = 10
aggregator = "holdrule:HoldingMedian"
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_ranks_end_with_a_killed_launch(tmp_path: Path, sig: signal.Signals) -> None:
    """`phalanx launch` killed (SIGKILL: the ranks' parent-death signal) or terminated (SIGTERM: it stops them and
    says so) while its ranks train: no rank is left running."""
    (tmp_path / "holdrule.py").write_text(HOLD)
    cfg = tmp_path / "launch.toml"
    cfg.write_text(LAUNCH)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "HOLD_AT": f"3:{tmp_path}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", "launch", str(cfg), "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200", **env},
    )
    deadline = time.monotonic() + 240
    while not (tmp_path / "holding").exists():  # rank 0 is inside round 3 (its rule holds there)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "the job never reached the hold"
        time.sleep(0.05)
    ranks = _children(proc.pid)
    assert len(ranks) == 3
    proc.send_signal(sig)
    output = proc.communicate(timeout=120)[0].decode()
    deadline = time.monotonic() + 60
    while any(_alive(r) for r in ranks):
        assert time.monotonic() < deadline, f"ranks still running after phalanx launch ended: {ranks}"
        time.sleep(0.05)
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, output
        assert "interrupted by SIGTERM" in output and "Traceback" not in output
