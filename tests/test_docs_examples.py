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


def _command_lines(path: Path) -> list[str]:
    """The ``phalanx run|sweep|launch`` lines of the shell blocks of ``path`` that name no placeholder (CONFIG,
    DIR …): what a reader pastes as it is."""
    lines = []
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", path.read_text(), flags=re.S):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if re.match(r"phalanx (run|sweep|launch)\b", command) and not re.search(r"\b[A-Z]{3,}\b|\[", command):
                lines.append(command)
    return lines


def test_the_readmes_command_lines_name_valid_grids() -> None:
    """Every pasteable ``phalanx run|sweep|launch`` line of the README names a grid whose every point validates
    (issue 38: ``phalanx launch --workers 4 --set byzantine=1 --set f=1`` failed — the default grid holds krum,
    which needs n > 2f + 2 = 4). Validated as the command does before anything starts; nothing is trained. Mutant:
    that line as it was is refused."""
    import shlex

    from phalanx.errors import ConfigError
    from phalanx.experiments import grid
    from phalanx.experiments.build import check_points
    from phalanx.experiments.config import load_grid

    def validate(command: str) -> None:
        words = shlex.split(command)[2:]
        config, overrides = None, []
        it = iter(words)
        for word in it:
            if word == "--set":
                overrides.append(next(it))
            elif word in ("--workers", "-n"):
                overrides.append(f"workers={next(it)}")
            elif word in ("--out", "--jobs", "--keys", "--executor", "--partition", "--time"):
                next(it)
            elif not word.startswith("-"):
                config = ROOT / word
        if "launch" in command.split()[1]:
            overrides.append("engine='torchrun'")
        check_points(grid.configs(load_grid(config, overrides)))

    lines = _command_lines(ROOT / "README.md")
    assert any(line.startswith("phalanx launch") for line in lines) and len(lines) >= 3, lines
    for line in lines:
        validate(line)
    with pytest.raises(ConfigError, match="workers=4"):
        validate("phalanx launch --workers 4 --set byzantine=1 --set f=1")
