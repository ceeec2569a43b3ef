"""The allocator setting of the training engine."""

from __future__ import annotations

import platform
import subprocess
import sys


def _run(code: str, env_extra: dict[str, str]) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if k != "PHALANX_NO_MALLOC_TUNING"}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout


def test_tune_allocator_applies_once_and_can_be_turned_off() -> None:
    code = "from phalanx.training.memory import tune_allocator as t; print(t(), t())"
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert _run(code, {}).split() == ["True", "True"]
    assert _run(code, {"PHALANX_NO_MALLOC_TUNING": "1"}).split() == ["False", "False"]
