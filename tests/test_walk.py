"""Walking a handed-over tree (phalanx.walk): no recursion, no link followed, a depth bound — a run directory holding
1,100 nested folders made `phalanx report` and `phalanx verify` die with RecursionError (an attacker's review)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import _rundirs
from phalanx.errors import ConfigError
from phalanx.walk import walk

ROOT = Path(__file__).resolve().parent.parent
finished = _rundirs.finished
keys = _rundirs.keys


def _nest(root: Path, depth: int) -> None:
    """``depth`` folders, one inside the other, under ``root`` (opened level by level: no path too long)."""
    here = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("a", dir_fd=here)
        below = os.open("a", os.O_RDONLY, dir_fd=here)
        os.close(here)
        here = below
    os.close(here)


def _unnest(root: Path) -> None:
    """Remove what :func:`_nest` made, one level at a time (``shutil.rmtree`` recurses, so a tree left behind would
    break the removal of pytest's old temporary folders)."""
    top, spare = root / "a", root / "a-spare"
    while top.is_dir():
        if (top / "a").is_dir():
            os.rename(top / "a", spare)
            os.rmdir(top)
            os.rename(spare, top)
        else:
            shutil.rmtree(top)


def test_walk_yields_every_entry_enters_no_link_and_refuses_a_tree_too_deep(tmp_path: Path) -> None:
    (tmp_path / "b" / "c").mkdir(parents=True)
    (tmp_path / "b" / "c" / "f").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path)  # entered, it would never end
    assert [p.relative_to(tmp_path).as_posix() for p in walk(tmp_path, "DIR")] == ["b", "loop", "b/c", "b/c/f"]
    _nest(tmp_path / "b", 40)
    try:
        with pytest.raises(ConfigError) as info:
            list(walk(tmp_path, "DIR"))
        _rundirs.one_line(info.value, "DIR", "at most 32 levels deep")
    finally:
        _unnest(tmp_path / "b")


def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "phalanx.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text and "RecursionError" not in text, text
    return text


def test_report_and_verify_of_a_run_holding_1100_nested_folders_is_one_line(
        finished: Path, keys: dict[str, Path], tmp_path: Path) -> None:
    from phalanx import signing

    run = tmp_path / "runs" / "run"
    shutil.copytree(finished, run)
    signing.sign(run, keys["key"])
    _nest(run, 1100)
    try:
        assert "at most 32 levels deep" in _cli("report", str(tmp_path / "runs"))
        assert "at most 32 levels deep" in _cli("verify", str(run), "--key", str(keys["pub"]))
    finally:
        _unnest(run)
    assert not (run / "a").exists()


def test_a_folder_that_cannot_be_read_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A co-user's folder of mode 000 in a shared directory (a review: rglob skipped it, walk raised PermissionError
    as a traceback). The refusal is simulated, since root reads every folder."""
    (tmp_path / "locked").mkdir()
    real = os.scandir

    def refusing(path: object) -> object:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(ConfigError) as info:
        list(walk(tmp_path, "DIR"))
    _rundirs.one_line(info.value, "DIR", "locked: Permission denied")
