"""Run one ``phalanx run`` command several times, each in a fresh process, while other processes keep cores busy, and
compare what the runs recorded: the metric rows bit for bit and every checkpoint tensor (θ, momentum, the random
streams) by its bytes.

    .venv/bin/python scripts/repeat_run.py [--runs 8] [--busy 3] [--keep DIR] -- [phalanx run arguments ...]

Example (the run of issue 33, item 7, under three busy loops):

    .venv/bin/python scripts/repeat_run.py --runs 8 --busy 3 -- --set dataset=digits --set model=mlp \\
        --set workers=12 --set f=2 --set byzantine=2 --set 'aggregator=bucketing(s=2)>cwtm' --set attack=alie \\
        --set seed=5 --set rounds=100

Each run prints its digest (of the metric rows and of the tensors) and the 1-minute load average when it ended; the
summary says how many distinct outcomes there were. The environment passes through, so the same command under
``OMP_NUM_THREADS=1`` or ``PHALANX_NO_KERNEL=1`` prints digests to compare with. Exit status 1 if the runs differ.
The busy loops are started first and waited for (each says it is running), and killed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BUSY = "print('busy', flush=True)\nwhile True:\n    pass\n"


def digest(run_dir: Path) -> tuple[str, str, str]:
    """(rows, tensors, the final row's test loss) of the one run under ``run_dir``."""
    import torch
    from safetensors.torch import load_file

    (run,) = [p for p in run_dir.iterdir() if (p / "metrics.jsonl").exists()]
    rows = (run / "metrics.jsonl").read_bytes()
    h = hashlib.sha256()
    for name, tensor in sorted(load_file(str(run / "checkpoint.safetensors")).items()):
        h.update(name.encode() + b"\0" + tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    last = rows.decode().strip().splitlines()[-1]
    loss = last.split('"test_loss": ', 1)[1].split(",", 1)[0] if '"test_loss": ' in last else "?"
    return hashlib.sha256(rows).hexdigest()[:16], h.hexdigest()[:16], loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=8, help="fresh processes to run the command in (>= 2)")
    ap.add_argument("--busy", type=int, default=3, help="busy-loop processes kept running meanwhile (>= 0)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of `phalanx run`")
    ns = ap.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    if ns.runs < 2 or ns.busy < 0:
        ap.error(f"--runs must be >= 2 and --busy >= 0, got {ns.runs} and {ns.busy}")
    if "--out" in args:
        ap.error("--out is chosen by the script (one directory per run)")
    out = ns.keep if ns.keep is not None else Path(tempfile.mkdtemp(prefix="repeat-run-"))
    busy = [subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
            for _ in range(ns.busy)]
    seen: dict[tuple[str, str], list[int]] = {}
    try:
        for p in busy:
            assert p.stdout is not None and p.stdout.readline().strip() == "busy"
        for i in range(ns.runs):
            run_dir = out / f"run{i}"
            subprocess.run([sys.executable, "-m", "phalanx.cli", "run", *args, "--out", str(run_dir)], check=True,
                           stdout=subprocess.DEVNULL)
            rows, tensors, loss = digest(run_dir)
            seen.setdefault((rows, tensors), []).append(i)
            print(f"run {i}: rows {rows}  tensors {tensors}  final test loss {loss}  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"{ns.runs} runs, {len(seen)} distinct: " + "; ".join(f"rows {r} tensors {t}: runs {v}"
                                                               for (r, t), v in seen.items()))
    if ns.keep is None:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    return 0 if len(seen) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
