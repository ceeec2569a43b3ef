"""Smoke test of benchmarks/lora.py (issue 35, "Speed and memory"): a tiny BERT layout, every mode beside the mean,
each time with its ratios printed. No time is asserted (the machine is shared); only that every row is there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from _scripts import load_script

pytest.importorskip("transformers")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "lora.py"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the benchmark reads /proc (Linux)")
def test_the_lora_benchmark_prints_every_mode_beside_the_mean_with_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("benchmarks/lora.py", "phalanx_bench_lora")
    bench.main(["--hidden", "64", "--layers", "1", "--r", "2", "--workers", "5", "--repeat", "1"])
    out = capsys.readouterr().out
    assert "frozen parameters; adapters r = 2 on query, value" in out
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines()
            if line.split()[:1] in (["factors"], ["update"], ["shared"])}
    assert set(rows) == {(m, r) for m in ("factors", "update", "shared") for r in ("mean", "cwtm")}
    for (mode, rule), cells in rows.items():
        assert cells[2] == "5"
        assert cells[5].endswith("×") and cells[6].endswith("×")
        if rule == "mean":  # × mean: the mean against itself
            assert cells[5] == "1.0×"
        if mode == "factors":  # × factors: the mode against itself
            assert cells[6] == "1.0×"
    assert int(rows["shared", "mean"][3]) < int(rows["factors", "mean"][3])  # B alone: fewer coordinates travel
