"""Phalanx's C kernels open no OpenMP team on inputs where torch would not (``_teams.team_threads``).

GNU libgomp cannot use a team inherited through ``os.fork``: once a team's threads have started, a forked child
hangs in its first parallel region. In a fresh interpreter with 2 torch threads, each rule below runs on a small
input (under torch's grain of 32,768 elements), then the process forks and the child runs a 2-thread product; the
child must finish (an alarm ends a hung child: exit code -14). Before ``team_threads``, `mean` (5 × 5,000),
`cge` and the norm kernel (5 × 16), and `cwtm` (5 × 5,000) each hung the child.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = (
    "import os, signal, torch\n"
    "from phalanx.aggregators import registry\n"
    "torch.set_num_threads(2)\n"
    "registry.make({name!r}, {f})(torch.randn({n}, {d}))\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    signal.alarm(60)\n"
    "    x = torch.randn(4_000_000)\n"
    "    (x * x).sum()\n"
    "    os._exit(0)\n"
    "_, status = os.waitpid(pid, 0)\n"
    "raise SystemExit(os.waitstatus_to_exitcode(status))\n"
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize(
    ("name", "f", "n", "d"),
    [("mean", 0, 5, 5000), ("cge", 1, 5, 16), ("cge", 1, 5, 5000), ("cwtm", 1, 5, 5000)],
)
def test_a_small_call_leaves_a_fork_child_able_to_run(name: str, f: int, n: int, d: int) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = SCRIPT.format(name=name, f=f, n=n, d=d)
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=600)
    assert done.returncode == 0, f"{name} on {n} x {d}: the forked child ended with {done.returncode} (-14: hung)"
