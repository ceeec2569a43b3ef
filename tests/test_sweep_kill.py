"""A sweep killed halfway (SIGKILL) and started again ends with the same results as an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CONFIG = """
dataset = "digits"
model = "logreg"
workers = 6
byzantine = 1
f = 1
aggregator = ["cwtm", "cwmed", "geomed"]
attack = "signflip"
rounds = 40
batch_size = 8
eval_every = 5
checkpoint_every = 5
seed = 1
"""


def _sweep(cfg: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", "sweep", str(cfg), "--out", str(out), "--jobs", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120"},
    )


def _results(out: Path) -> dict[str, list[tuple[int, float]]]:
    res = {}
    for run in sorted(p for p in out.iterdir() if p.is_dir()):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        res[run.name] = [(r["round"], r["test_accuracy"]) for r in rows]
    return res


def test_killed_sweep_resumes_to_the_same_results(tmp_path: Path) -> None:
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(CONFIG)
    from phalanx.experiments import grid, load_toml, runner

    runner.run_grid(grid.configs(load_toml(cfg)), tmp_path / "ref")  # the uninterrupted reference, in-process

    out = tmp_path / "killed"
    proc = _sweep(cfg, out)
    deadline = time.time() + 240
    # wait until the first run is finished and the second has written a checkpoint, then kill -9
    while time.time() < deadline:
        done = list(out.glob("*/DONE"))
        ckpts = [p for p in out.glob("*/checkpoint.safetensors") if not (p.parent / "DONE").exists()]
        if done and ckpts:
            break
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert killed, "the sweep finished before it could be killed (make it longer)"
    assert len(list(out.glob("*/DONE"))) < 3
    again = _sweep(cfg, out)
    assert again.wait(timeout=300) == 0, again.stderr.read() if again.stderr else ""
    assert _results(out) == _results(tmp_path / "ref")
    assert len(list(out.glob("*/DONE"))) == 3
