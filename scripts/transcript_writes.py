"""Bytes rank 0's transcript writes over R rounds, and the Python memory it holds (traced peak), for the review's F7:

    PYTHONPATH=src .venv/bin/python scripts/transcript_writes.py 100 200 400

A parameter-server transcript of 4 ranks, a checkpoint every 5 rounds, fed as the server's hook feeds it (the loop
stubbed; each round line the same size). Runs on this branch's writer (appended: :mod:`phalanx.distributed.chain`)
and on the former one (rewritten whole at every checkpoint, counted through ``write_artifact``), so the two can be
compared on one machine: counts, not times.
"""

from __future__ import annotations

import sys
import tempfile
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from phalanx.distributed import transcript as tr
from phalanx.distributed.keys import init_keys, load_identity


def main(rounds: list[int]) -> None:
    keys = Path(tempfile.mkdtemp()) / "keys"
    init_keys(keys, 4)
    counted = {"bytes": 0}
    write = tr.write_artifact

    def counting(out: Path, name: str, payload: bytes) -> None:
        counted["bytes"] += len(payload) if name == tr.TRANSCRIPT else 0
        write(out, name, payload)

    tr.write_artifact = counting  # type: ignore[assignment]
    entry = [{"rank": r, "sha256": "cd" * 32, "signature": "ef" * 64} for r in range(4)]
    for total in rounds:
        counted["bytes"] = 0
        run = Path(tempfile.mkdtemp())
        (run / "manifest.json").write_text("{}")
        loop: Any = SimpleNamespace(resumed=False, state=SimpleNamespace(round=0),
                                    experiment=SimpleNamespace(rounds=total))
        record = tr.Transcript(run, SimpleNamespace(nonce=b"\1" * 32, new_rejections=list),
                               load_identity(keys, 0, 4), "ab" * 32, 4, 1, lambda t: t % 5 == 0)
        record.on_start(loop)
        tracemalloc.start()
        for t in range(total):
            record.rows(t, entry, [])
            loop.state.round = t + 1
            if (t + 1) % 5 == 0:
                record.binding()
                record.on_round(loop, None)  # type: ignore[arg-type]  (the former writer wrote here)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out = getattr(record, "out", None)
        written = counted["bytes"] + (out.written if out is not None else 0)
        print(f"R = {total}: {written:,} transcript bytes written, the file {(run / tr.TRANSCRIPT).stat().st_size:,} "
              f"bytes, traced peak {peak / 1024:,.0f} KiB")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100, 200, 400])
