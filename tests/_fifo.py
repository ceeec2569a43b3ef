"""Calling a reader that a FIFO planted in a run directory could block, without letting the test hang if it does.

:func:`unblocked` starts a small helper process first, then makes the call in this thread. After ``wait_s`` seconds
the helper opens the FIFO for writing and closes it again, every 0.2 s, until it is stopped: a reader blocked in an
``open`` by name (the code regressed) returns, and its ``read`` sees the end of the file — so the call ends and the
test fails with what it says, never hangs. A process, not a thread: a library that blocks while holding the GIL
(safetensors' ``safe_open``) would stop a thread of this process from ever unblocking it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HELPER = """
import os, sys, time
fifo, wait = sys.argv[1], float(sys.argv[2])
time.sleep(wait)
end = time.monotonic() + 60.0
while time.monotonic() < end:
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass
    time.sleep(0.2)
"""


def unblocked(call: Callable[[], Any], fifo: Path, wait_s: float = 10.0) -> tuple[Any, bool]:
    """``call()``'s result (or the exception it raised), and whether it was blocked on ``fifo`` for ``wait_s``
    seconds (then the helper unblocked it)."""
    helper = subprocess.Popen([sys.executable, "-c", _HELPER, str(fifo), str(wait_s)])
    start = time.monotonic()
    try:
        try:
            out = call()
        except Exception as exc:  # the caller asserts on it
            out = exc
        return out, time.monotonic() - start >= wait_s
    finally:
        helper.kill()
        helper.wait()
