"""The Slurm folder holds the pickles the nodes load: a folder, or a directory above it, that someone else can change
is refused before anything is written (phalanx.experiments.private_folder)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.errors import ConfigError
from phalanx.experiments.private_folder import private_folder

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_folder_is_created_only_you_can_write(tmp_path: Path) -> None:
    folder = private_folder("slurm.folder", tmp_path / "out" / "slurm")
    assert folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0
    assert private_folder("slurm.folder", folder) == folder  # an existing safe one is taken as it is


def _refused(folder: Path, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        private_folder("slurm.folder", folder)
    text = str(info.value)
    assert "slurm.folder" in text and words in text and "\n" not in text


def test_a_link_planted_in_the_folders_place_is_refused(tmp_path: Path) -> None:
    (tmp_path / "attacker").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "slurm").symlink_to(tmp_path / "attacker")
    _refused(tmp_path / "out" / "slurm", "symbolic link")
    assert list((tmp_path / "attacker").iterdir()) == []


def test_a_folder_or_a_directory_above_it_that_others_can_write_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # a shared runs/ directory: a co-user could rename slurm/ away and plant a link after submission
    _refused(out / "slurm", "writable by others (mode 0777)")
    assert not (out / "slurm").exists()  # refused before anything is written
    out.chmod(0o1777)  # the sticky bit: others cannot rename or delete what is not theirs
    assert private_folder("slurm.folder", out / "slurm").is_dir()
    (out / "slurm").chmod(0o775)  # the folder itself: nobody else may write it, sticky or not
    _refused(out / "slurm", "writable by others (mode 0775)")


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder someone else's needs root")
def test_a_folder_or_a_directory_above_it_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 4242, 4242)
    _refused(theirs / "slurm", "owned by uid 4242")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    os.chown(mine, 4242, 4242)
    _refused(mine, "owned by uid 4242")


def test_a_sweep_onto_a_planted_slurm_folder_submits_nothing(tmp_path: Path) -> None:
    """The attack of the review: a co-user plants OUT/slurm as a link to a folder of theirs; before, submitit wrote
    the task's pickle there, and the node unpickles it when the task starts (code execution as the victim)."""
    pytest.importorskip("submitit")
    bin_dir, attacker, out = tmp_path / "bin", tmp_path / "attacker", tmp_path / "out"
    for d in (bin_dir, attacker, out):
        d.mkdir()
    sbatch = bin_dir / "sbatch"  # stands in for Slurm: the submission must never get this far
    sbatch.write_text("#!/bin/sh\necho 'Submitted batch job 4242'\n")
    sbatch.chmod(0o755)
    (out / "slurm").symlink_to(attacker)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "sweep", str(ROOT / "src/phalanx/configs/default.toml"), "--executor",
         "slurm", "--detach", "--set", "aggregator=mean", "--set", "attack=none", "--set", "seed=0", "--set",
         "rounds=2", "--set", "workers=4", "--set", "byzantine=0", "--set", "f=0", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text, text
    assert "slurm.folder" in text and "symbolic link" in text
    assert list(attacker.rglob("*")) == []  # no pickle in the attacker's folder


def test_submitits_tags_are_refused(tmp_path: Path) -> None:
    """``folder=/shared/%j``: submitit writes the pickles above the tag — in ``/shared``, where an attacker can
    pre-create the next job id's folder (ids are sequential; a review of the first version of this check)."""
    for tag in ("%j", "%A", "x_%a"):
        _refused(tmp_path / tag, "submitit's tags")


def test_under_a_group_friendly_umask_nothing_the_tasks_load_is_within_others_reach(tmp_path: Path) -> None:
    """umask 002 (a shared cluster's default): the missing directories above the folder are made 0700 one at a time
    (os.makedirs gave them 0775, and the next check refused the folder it had just accepted), and an existing 0755
    folder is made 0700, so the 0775 job folders and 0664 pickles submitit creates in it are out of others' reach."""
    old = os.umask(0o002)
    try:
        folder = private_folder("slurm.folder", tmp_path / "new1" / "new2" / "slurm")
        for d in (tmp_path / "new1", tmp_path / "new1" / "new2", folder):
            assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
        assert private_folder("slurm.folder", folder) == folder  # accepted again
        existing = tmp_path / "logs"
        existing.mkdir(mode=0o755)
        existing.chmod(0o755)
        assert stat.S_IMODE(private_folder("slurm.folder", existing).stat().st_mode) == 0o700
    finally:
        os.umask(old)
