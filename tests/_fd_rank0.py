"""Rank 0 of a parameter server under a low file limit, for tests/test_admission.py (attack38's r4 at a small scale):
run as ``python tests/_fd_rank0.py KEYDIR N SOFT HARD MODE``. Under RLIMIT_NOFILE = (SOFT, HARD) it opens rank 0's
sealed links for N ranks, then the descriptors its 2(N − 1) links to the workers hold (socket pairs: what joined
workers cost it), and prints ``{"port": …}``; once it reads a line with the number of idle connections an outsider
made, it waits until its admission has accepted every one (each pending or shed), then opens the 8 files a
checkpoint and the transcript need and prints what it could (one JSON line). MODE ``mutant``: the cap of pending
connections sized as before the fix (``soft − 64``, whatever the process holds)."""

from __future__ import annotations

import functools
import json
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

from phalanx.distributed import admission, sealed
from phalanx.distributed.keys import load_identity
from phalanx.distributed.sealed import SealedLinks

keydir, n, soft, hard, mode = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
if mode == "mutant":
    admission.total_cap = lambda limit=admission.TOTAL, links=0: max(8, min(limit, soft - admission.FD_RESERVE))
# (no connection reaches its deadline while the test counts: the cap, not the deadline, is what is played)
sealed.Admission = functools.partial(admission.Admission, deadline_s=600.0)  # type: ignore[misc]
links = SealedLinks(load_identity(keydir, 0, n), "127.0.0.1", 0, "c0nf1g", 64, n)
links.offer({"config": "c0nf1g", "round": 0, "streams": {}, "momentum": None})
held = [socket.socketpair() for _ in range(n - 1)]  # the workers' 2(n − 1) links
adm = links.admission
assert adm is not None
print(json.dumps({"port": links.port, "cap": adm.total, "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}),
      flush=True)
outsiders = int(sys.stdin.readline())
deadline = time.monotonic() + 120.0
while len(adm.pending) + adm.shed < outsiders and time.monotonic() < deadline:  # (polled: the admission's thread)
    time.sleep(0.01)
files = []
error = ""
try:
    for _ in range(8):
        files.append(tempfile.TemporaryFile())
except OSError as exc:
    error = exc.strerror or type(exc).__name__
print(json.dumps({"accepted": len(adm.pending) + adm.shed, "pending": len(adm.pending), "files": len(files),
                  "error": error}), flush=True)
