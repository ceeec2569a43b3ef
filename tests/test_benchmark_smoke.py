"""Smoke test of benchmarks/aggregators.py: quick mode, Phalanx only (no ByzFL / Flower needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "aggregators.py"


def _load_script():
    return load_script("benchmarks/aggregators.py", "phalanx_bench_aggregators")


@pytest.mark.skipif(not SCRIPT.exists(), reason="benchmark script missing")
def test_quick_benchmark_prints_every_rule(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bench = _load_script()
    from _bench_worker import CASES

    md = tmp_path / "bench.md"
    assert bench.main(["--quick", "--no-peers", "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "Phalanx aggregators vs peers" in out
    assert "n=20 d=10^4 f=4 · 1 thr" in out
    rows = {line.split("│")[2].strip(): line for line in out.splitlines() if line.count("│") > 3}
    for case in CASES:
        if not case.optional:
            assert case.key in rows, f"rule {case.key} missing from the table"
    # the baseline always exists: its row has a time and a ratio to the streaming floor
    assert re.search(r"\d+(\.\d+)? (µs|ms|s)", rows["mean"].split("│")[3])
    assert re.search(r"\d+(\.\d+)?×", rows["mean"])
    # every ratio names its own floor (benchmarks/_bench_floors.py): tests/test_bench_floors.py checks the table
    for rule, kind in [("mean", "(pass)"), ("krum", "(gemm)"), ("cc", "(passes(3))"), ("nnm>mean", "(gemm+pass)")]:
        assert kind in rows[rule], rows[rule]
    assert re.search(r"geomed .*× \(passes\(\d+\)\)", out)
    text = md.read_text()
    assert "| `cwtm` |" in text and "| `mean` |" in text
    assert "max \\|Δ\\| vs Phalanx" in text
