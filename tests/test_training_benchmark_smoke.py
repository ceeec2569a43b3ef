"""Smoke test of benchmarks/training.py: quick mode (embedded digits, n=10, Phalanx and the loop, no ByzFL)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from _scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "training.py"


def _load_script():
    return load_script("benchmarks/training.py", "phalanx_bench_training")


@pytest.mark.skipif(not SCRIPT.exists(), reason="benchmark script missing")
def test_quick_training_benchmark(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bench = _load_script()
    md = tmp_path / "training.md"
    raw = tmp_path / "training.json"
    assert bench.main(["--quick", "--markdown", str(md), "--json", str(raw)]) == 0
    out = capsys.readouterr().out
    assert bench.TITLE in out
    assert "MLP 64-100-10" in out  # digits: 8×8 inputs
    rows = [line for line in out.splitlines() if re.match(r"^│\s+10\s+│\s+1\s+│", line)]
    assert len(rows) == 2, out  # one row in the main table, one in the split table
    main, split = rows
    cells = [c.strip() for c in main.split("│")[1:-1]]
    assert cells[2] == "—"  # no ByzFL in quick mode
    time_cell = r"\d+(\.\d+)? (µs|ms|s)"
    assert all(re.fullmatch(time_cell, cells[k]) for k in (3, 4, 5))  # loop, vmap, Phalanx
    assert re.fullmatch(r"\d+(\.\d+)?×", cells[8])  # speed-up vs the loop
    assert cells[9] == "—"  # vmap vs ByzFL: no ByzFL
    assert "n < 50" in cells[10]
    assert split.count("%") == 3
    assert re.fullmatch(time_cell, [c.strip() for c in split.split("│")[1:-1]][4])  # the gradients by vmap
    # the loop, vmap and Phalanx computed the same two rounds
    assert "Equivalence (same round ✓)" in out
    text = md.read_text()
    assert "| 10 | 1 | — |" in text and "### Where Phalanx's round goes" in text
    assert '"type": "row"' in raw.read_text()


def test_table_logic_without_running() -> None:
    """Rows, ratios, estimates and the target column from hand-made records."""
    bench = _load_script()
    recs = [
        {"type": "row", "n": 50, "threads": 1, "b": 5, "byzfl": 0.2, "loop": 0.08, "phalanx": 0.01,
         "vmap": 0.04, "split_grads": 0.005, "split_grads_vmap": 0.02, "split_agg": 0.003, "faults": 0},
        {"type": "row", "n": 200, "threads": 1, "b": 20, "byzfl": 1.0, "loop": 0.4, "phalanx": 0.2,
         "split_grads": 0.1, "split_agg": 0.05, "faults": 256},
        {"type": "row", "n": 1000, "threads": 1, "b": 100, "byzfl_estimate": 5.0, "byzfl_estimate_from": 200,
         "loop": 2.0, "phalanx": 1.0, "split_grads": 0.5, "split_agg": 0.2, "faults": None},
    ]
    rows = bench.build_rows(recs)
    assert [r["n"] for r in rows] == [50, 200, 1000]
    assert rows[0]["x_byzfl_cell"] == "20.0×" and rows[0]["target"] == "✓"
    assert rows[0]["x_vmap_cell"] == "5.0×" and rows[0]["split"][1] == "20.0 ms" and rows[1]["vmap_cell"] == "—"
    assert rows[1]["x_byzfl_cell"] == "5.0×" and rows[1]["target"] == "✗"
    assert rows[1]["split"] == ["100.0 ms (50%)", "—", "50.0 ms (25%)", "50.0 ms (25%)", "1 MiB"]
    assert rows[2]["byzfl_cell"] == "≈5.00 s" and rows[2]["x_byzfl_cell"] == "≈5.0×"
    assert rows[2]["target"] == "✗ (≈)" and rows[2]["loop_cell"] == "2.00 s†"
    assert bench.fmt_ratio(9.98) == "9.98×" and bench.fmt_ratio(10.04) == "10.0×" and bench.fmt_ratio(5.26) == "5.3×"
    assert bench.byzantine_of(10) == 1 and bench.byzantine_of(1000) == 100


def test_network_only_reaches_the_worker_and_turns_selection_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--network-only`` is forwarded to each thread setting's subprocess, whose rules then never select."""
    bench = _load_script()
    assert "--network-only" in bench._forwarded(bench.parse_args(["--quick", "--network-only"]))
    assert "--network-only" not in bench._forwarded(bench.parse_args(["--quick"]))
    from phalanx.aggregators import _sortnet, coordinatewise

    monkeypatch.setattr(coordinatewise, "SELECT_MIN_ROWS", coordinatewise.SELECT_MIN_ROWS)
    x = torch.zeros(1000, 8)
    bench.network_only(False)
    assert coordinatewise._use_select(x, _sortnet.MODE_TRIMMED, 800, False) == coordinatewise.HAVE_SELECT
    bench.network_only(True)
    assert not coordinatewise._use_select(x, _sortnet.MODE_TRIMMED, 800, False)
