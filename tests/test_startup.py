"""Start-up of the command line: the commands that compute nothing import no torch (issue 37 item 5).

Importing torch is most of a command's start-up (``benchmarks/startup.py``, docs/benchmarks.md "Start-up"), so the
help pages, ``--version`` and a wrong directory given to ``status`` / ``report`` must answer without it. Each case
runs the command in a fresh interpreter and reads ``sys.modules`` when it ends; the mutant (an eager ``import torch``
in a command module, as ``phalanx.cli.analysis`` had) must fail the same check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LIGHT = (["--help"], ["--version"], ["list", "--help"], ["run", "--help"], ["sweep", "--help"], ["keys", "--help"],
         ["launch", "--help"], ["status", "/nonexistent-phalanx-dir"], ["report", "/nonexistent-phalanx-dir"])
"""Commands that compute nothing: none may import torch."""

_PROBE = """
import atexit, json, sys
atexit.register(lambda: sys.__stderr__.write("\\nMODULES " + json.dumps(sorted(
    m for m in sys.modules if m == "torch" or m.startswith("phalanx"))) + "\\n"))
sys.argv = ["phalanx", *json.loads(sys.argv[1])]
from phalanx.cli import main
main()
"""


def _modules(args: list[str], src: Path = SRC) -> list[str]:
    """The modules (torch and phalanx's) loaded when ``phalanx ARGS`` ends, in a fresh interpreter, with the package
    read from ``src``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(args)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    line = next((x for x in proc.stderr.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, proc.stderr[-2000:]
    return list(json.loads(line.removeprefix("MODULES ")))


@pytest.mark.parametrize("args", LIGHT, ids=" ".join)
def test_commands_that_compute_nothing_import_no_torch(args: list[str]) -> None:
    loaded = _modules(args)
    assert "phalanx.cli" in loaded  # the probe did run the command
    assert "torch" not in loaded, f"phalanx {' '.join(args)} imported torch"


def test_the_check_catches_an_eager_import_of_torch(tmp_path: Path) -> None:
    """Mutant: ``phalanx.cli.analysis`` importing torch at its top again (a copy of the package, that one line
    added) — ``--help`` then loads torch, and the check above sees it."""
    shutil.copytree(SRC / "phalanx", tmp_path / "phalanx", ignore=shutil.ignore_patterns("__pycache__"))
    module = tmp_path / "phalanx" / "cli" / "analysis.py"
    text = module.read_text(encoding="utf-8")
    module.write_text(text.replace("import typer\n", "import torch  # noqa: F401\nimport typer\n", 1),
                      encoding="utf-8")
    loaded = _modules(["--help"], tmp_path)
    assert "phalanx.cli.analysis" in loaded and "torch" in loaded
