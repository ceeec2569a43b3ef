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

HOLD = """
import os
import time

import torch

CALLS = [0]


class HoldingMedian:
    \"\"\"The coordinate-wise median; with HOLD_AT=<call>:<dir> set, its call number <call> (of this process) writes
    <dir>/holding and waits, forever: the test kills the process there, at a point it chose.\"\"\"

    def __init__(self, f=0):
        self.f = f

    def __call__(self, x):
        CALLS[0] += 1
        spec = os.environ.get("HOLD_AT")
        if spec and CALLS[0] == int(spec.split(":")[0]):
            open(os.path.join(spec.split(":", 1)[1], "holding"), "w").close()
            while True:
                time.sleep(1)
        return x.median(dim=0).values
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
