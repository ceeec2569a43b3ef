"""Smoke test of benchmarks/federated.py: quick mode (embedded digits, 10 clients, 4 per round, 1 thread; Phalanx and
one small offline run of Flower's simulation with both strategies; no ByzFL, no memory part)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _scripts import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "federated.py"
NUMBER = r"[\d,]+(\.\d+)?"


@pytest.mark.skipif(not SCRIPT.exists(), reason="benchmark script missing")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the benchmark checks /proc for Ray's processes")
def test_quick_federated_benchmark(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    pytest.importorskip("flwr.simulation")
    md, raw = tmp_path / "federated.md", tmp_path / "federated.json"
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(tmp_path)}  # nothing of Flower's or Ray's in the real home
    cmd = [sys.executable, str(SCRIPT), "--quick", "--width", "250", "--markdown", str(md), "--json", str(raw)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("benchmarks/federated.py --quick did not finish in 240 s:\n" + out[-3000:])
    assert proc.returncode == 0, out[-3000:]
    bench = load_script("benchmarks/federated.py", "phalanx_bench_federated")
    assert bench.TITLE in out
    assert "MLP 64-64-10" in out  # digits: 8×8 inputs
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0] in bench.IMPL_LABELS.values():
            rows[cells[0]] = cells
    phalanx = rows[bench.IMPL_LABELS["phalanx"]]
    for key in ("phalanx", "flower_trimmed", "flower_phalanx"):  # both columns: Phalanx and Flower's simulation
        cells = rows[bench.IMPL_LABELS[key]]
        assert re.fullmatch(r"\d+(\.\d+)? (µs|ms|s)", cells[2]), cells  # s/round
        assert re.fullmatch(NUMBER, cells[3]), cells  # rounds/s
        assert re.fullmatch(NUMBER + "×", cells[4]) and re.fullmatch(NUMBER + "×", cells[5]), cells
    assert phalanx[1] == "1"
    assert rows[bench.IMPL_LABELS["flower_trimmed"]][4] == "1.00×"
    assert "Target ≥ 20× Flower's rounds/s" in out
    assert "Equivalence (same round ✓)" in out  # Flower's client + trim_mean (and ByzFL) compute Phalanx's round
    assert "Ray processes left after it: none" in out
    assert "Memory:" not in out  # no memory part in quick mode
    text = md.read_text()
    assert text.startswith(f"## {bench.TITLE}")
    assert f"| {bench.IMPL_LABELS['phalanx']} | 1 |" in text
    assert f"| {bench.IMPL_LABELS['flower_trimmed']} |" in text and f"| {bench.IMPL_LABELS['flower_phalanx']} |" in text
    recs = json.loads(raw.read_text())["records"]
    flower = [r for r in recs if r.get("type") == "row" and r["impl"].startswith("flower")]
    assert {r["impl"] for r in flower} == {"flower_trimmed", "flower_phalanx"}
    assert all(r["replies"] == [4] and r["timed_rounds"] >= 1 for r in flower)  # 4 of 10 clients every round


def test_rows_and_ratios_without_running() -> None:
    """Rows, ratios against both Flower rows and the target line from hand-made records."""
    bench = load_script("benchmarks/federated.py", "phalanx_bench_federated")
    recs = [
        {"type": "row", "impl": "flower_phalanx", "threads": 2, "median_s": 0.2, "timed_rounds": 20,
         "rounds_run": 27, "test_accuracy": 0.79, "agg_median_s": 0.01, "replies": [10], "client_median_s": 0.004},
        {"type": "row", "impl": "phalanx", "threads": 1, "median_s": 0.01, "timed_rounds": 30, "rounds_run": 34,
         "test_accuracy": 0.8},
        {"type": "row", "impl": "flower_trimmed", "threads": 2, "median_s": 0.25, "timed_rounds": 20,
         "rounds_run": 27, "test_accuracy": 0.79, "agg_median_s": 0.012, "replies": [10], "client_median_s": 0.004},
        {"type": "row", "impl": "phalanx", "threads": 2, "median_s": 0.05, "timed_rounds": 30, "rounds_run": 34,
         "test_accuracy": 0.8},
    ]
    rows = bench.build_rows(recs)
    assert [(r["impl"], r["threads"]) for r in rows] == [("phalanx", 1), ("phalanx", 2), ("flower_trimmed", 2),
                                                         ("flower_phalanx", 2)]
    cells = bench.main_cells(rows[0])
    assert cells[2:6] == ["10.0 ms", "100.0", "25.0×", "20.0×"]
    assert bench.main_cells(rows[2])[4] == "1.00×"
    args = bench.parse_args(["--no-memory"])
    notes = bench.notes(recs, rows, args, 1.0, "cmd")
    target = next(n for n in notes if n.startswith("Target"))
    assert "met (best: 25.0× at 1 thread(s))" in target and "2 thread(s) 5.00× ✗" in target
    assert bench.fmt_ratio(123.4) == "123×" and bench.fmt_ratio(9.876) == "9.88×"
