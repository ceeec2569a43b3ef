"""Run one benchmark setting in a fresh interpreter with its thread count fixed before anything is imported."""

from __future__ import annotations

import os
import subprocess

THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def run_worker(cmd: list[str], threads: int, timeout: float) -> str:
    """Run ``cmd`` with every thread-count variable set to ``threads``; return "" or what went wrong."""
    env = dict(os.environ)
    for var in THREAD_ENV:
        env[var] = str(threads)
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"worker stopped after {timeout:.0f} s"
    return f"worker exited with code {proc.returncode}" if proc.returncode != 0 else ""
