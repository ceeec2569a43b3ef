"""The Python examples of the README and the docs run as published (each block in a fresh namespace, in order, so
a block may use the names of the blocks before it in the same file)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = ["README.md", "docs/training.md", "docs/tracking.md"]


def blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("name", FILES)
def test_python_blocks_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = blocks(ROOT / name)
    assert found, f"no python block in {name}"
    monkeypatch.chdir(tmp_path)  # examples that write (runs/…) write here
    namespace: dict[str, object] = {}
    for code in found:
        exec(compile(code, f"{name}:python-block", "exec"), namespace)
    assert os.getcwd() == str(tmp_path)
