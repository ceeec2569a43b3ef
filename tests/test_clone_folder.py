"""The suite in a clone named ``phalanx`` with its virtual environment inside it (issue 38 item 1): a check that
reads a path for ``/phalanx/`` (the package's name) also matches the clone's folder and the venv's own torch frames
below it — it blamed ``.venv/lib/python3.11/site-packages/torch/...`` and four emulated-CUDA tests went red there
while passing in a folder of any other name. Its mutant — the old check, ``"/phalanx/" in filename`` — fails the
same four tests here (and the unit test of the check), as it did in the issue."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _venv_inside(clone: Path) -> Path:
    """``clone/.venv``, a virtual environment whose site-packages *is* this interpreter's (a symbolic link, so its
    modules' paths run through ``clone/.venv/lib/…/site-packages`` as in a venv installed there)."""
    env = clone / ".venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    python = env / "bin" / "python"
    inner = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    shutil.rmtree(inner)
    os.symlink(sysconfig.get_paths()["purelib"], inner)
    return python


@pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None, reason="needs a git checkout")
def test_the_frame_checks_pass_in_a_clone_named_phalanx_with_its_venv_inside(tmp_path: Path) -> None:
    clone = tmp_path / "phalanx"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    python = _venv_inside(clone)
    torch_file = subprocess.run([str(python), "-c", "import torch; print(torch.__file__)"], capture_output=True,
                                text=True, check=True, env={**os.environ, "PYTHONPATH": str(clone / "src")}).stdout
    assert torch_file.startswith(str(clone / ".venv")), torch_file  # the setting of the issue: torch below phalanx/
    env = {**os.environ, "PYTHONPATH": str(clone / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_device.py",
                           "-k", "emulated or frames"], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
