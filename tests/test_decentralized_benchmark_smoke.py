"""benchmarks/decentralized.py --quick runs (its own check that both implementations compute the same round
included) and prints both rows and the ratio; no timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_decentralized_benchmark(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decentralized.py"), "--quick", "--markdown",
                           str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "| Phalanx |" in text and "| loop |" in text and "Phalanx / loop:" in text
