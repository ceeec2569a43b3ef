"""A TOML config is read from one descriptor, checked to be a regular file of at most ``MAX_CONFIG_BYTES``, before a
byte of it is read: an attacker's review handed ``phalanx run`` a 3 GB sparse file (read whole: a MemoryError
traceback) and swapped a FIFO in after the existence check (the read blocked for ever). Each is one ConfigError line
naming the file (docs/config.md, "Errors"; docs/security.md, "Hostile files")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.errors import ConfigError
from phalanx.experiments import config

SRC = Path(__file__).resolve().parent.parent / "src"


def _child(code: str, *args: str) -> str:
    """``code`` run in a child Python under a 2 GiB address space, killed after 120 s (a read blocked on a FIFO fails
    the test, it does not hang it); its output."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    prelude = "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
    try:
        run = subprocess.run([sys.executable, "-c", prelude + code, *args], capture_output=True, text=True,
                             timeout=120, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("still blocked after 120 s")
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


LOAD = ("import sys\nfrom phalanx.experiments.config import load_toml\n"
        "try: load_toml(sys.argv[1])\nexcept Exception as e: print(type(e).__name__, e)\n")


def test_a_sparse_config_of_gigabytes_is_refused_from_its_size(tmp_path: Path) -> None:
    path = tmp_path / "huge.toml"
    with open(path, "wb") as fh:
        fh.write(b"# ")
        fh.truncate(3_000_000_000)
    out = _child(LOAD, str(path))
    assert out == (f"ConfigError config={str(path)!r} is invalid: allowed a regular file of at most 16,777,216 bytes "
                   "(3,000,000,000 bytes, more than the 16,777,216 such a file may have (not read))\n"), out


def test_a_fifo_swapped_in_after_the_existence_check_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('dataset = "digits"\n')
    swap = ("import os, pathlib\nreal = pathlib.Path.is_file\n"
            "def is_file(self, *a, **k):\n"
            "    found = real(self, *a, **k)\n"
            "    if self.name == 'run.toml' and found:\n"
            "        os.unlink(self); os.mkfifo(self)\n"
            "    return found\n"
            "pathlib.Path.is_file = is_file\n")
    out = _child(swap + LOAD, str(path))
    assert out == (f"ConfigError config={str(path)!r} is invalid: allowed a regular file of at most 16,777,216 bytes "
                   "(not a regular file)\n"), out


def test_a_config_over_the_cap_is_refused_and_one_within_it_is_read(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.toml"
    path.write_text('dataset = "digits"\n')  # 19 bytes
    assert config.load_toml(path) == {"dataset": "digits"}
    monkeypatch.setattr(config, "MAX_CONFIG_BYTES", 18)
    with pytest.raises(ConfigError, match=r"19 bytes, more than the 18 such a file may have \(not read\)") as caught:
        config.load_toml(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
