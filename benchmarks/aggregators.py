"""Time Phalanx's aggregators against ByzFL 0.0.11, ByzPy 0.1.4 and Flower 1.42 on identical inputs, in one command.

    .venv/bin/python benchmarks/aggregators.py [--quick] [--threads 1|all] [--no-peers] [--markdown PATH]

Settings: (n=50, d=10⁶, f=10) and (n=20, d=10⁵, f=4), each with 1 thread and with all threads (``--quick``: only
n=20, d=10⁴, f=4, 1 thread, 2 repetitions). Each (setting, threads) runs in its own subprocess of this script, with
OMP/OPENBLAS/MKL/NUMBA thread variables set before anything is imported (and ``torch.set_num_threads``,
``numba.set_num_threads``, threadpoolctl inside); the parent gathers their JSON lines and prints one table.

Input: Gaussian rows around a common random mean (float32, seeded), the same tensor for every library (its numpy
view, Flower's list of per-client arrays, or Flower RecordDicts, all built before timing). ``clip`` and ``arc``
appear twice, like against like: ``pre(x)`` (x left as it was) beside ByzFL clipping a copy it makes on the clock
(ByzFL overwrites its input), and ``… in place``, Phalanx's ``mix_`` beside ByzFL, each on a copy of x made before
the clock (a caller that owns its rows and gives them up). Each measurement is a
warm-up call (numba compiles on first call) then the median of k calls (k=5; k=3 at d=10⁶ when a call takes more
than 1 s; a single call when the warm-up or the first timed call takes more than 20 s, marked †).

Columns: speed-up = fastest peer time / Phalanx time (≥ 2: Phalanx at least twice as fast); × floor (kind) = Phalanx
time / the time of that rule's own floor, timed in the rule's own rotation, each call of Phalanx and of the floor
after the same cache scrub (``_bench_worker.floor_contenders``, ``cache_scrub``; ``_bench_floors``: ``pass``
= one ``x.sum(0)``, ``passes(k)`` = k passes for k-iteration rules, ``gemm`` = ``x·xᵀ`` for distance rules,
``copy`` = a fresh ``(n, d)`` copy of x for the clipping pre-aggregators that return new rows; a rule without a
declared kind gets ``pass (undeclared)``); max |Δ| = max abs difference
between Phalanx's output and the peer's (⚠ above 1e-4 relative to max |Phalanx output|, explained below the table,
with a float64 re-run of Phalanx that tells a float32 near-tie from a different definition); target met =
speed-up ≥ 2, and for the coordinate-wise rules (cwmed, cwtm, meamed) also × floor ≤ 3 at n ≤ 64, ≤ 6 above
(issue 37; ``_bench_report.floor_target``), for the norm rules (cge, clip, arc, in place or not) × their own floor
≤ 2.5 (``_bench_report.NORM_FLOOR_TARGET``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_peers import PEER_COLUMNS
from _bench_report import build_rows, disagreements, markdown_table, notes, rich_table, setting_label
from _subprocess import run_worker

FULL_SETTINGS = [(50, 10**6, 10), (20, 10**5, 4)]
QUICK_SETTING = (20, 10**4, 4)


def all_threads() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke test: n=20, d=10^4, f=4, 1 thread, 2 repetitions")
    ap.add_argument("--threads", choices=["1", "all", "both"], default="both",
                    help="thread settings to run (default: both 1 and all)")
    ap.add_argument("--no-peers", action="store_true", help="time Phalanx only (no ByzFL / Flower needed)")
    ap.add_argument("--markdown", metavar="PATH", help="also write the table (and notes) as Markdown to PATH")
    ap.add_argument("--json", metavar="PATH", help="also write every raw measurement as JSON to PATH")
    ap.add_argument("--sizes", help="custom settings instead of the default ones, e.g. 50:1e6:10,20:1e5:4 (n:d:f)")
    ap.add_argument("--rules", help="comma-separated subset of rules (default: all)")
    ap.add_argument("--reps", type=int, help="timed repetitions per measurement (default 5; 2 with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--call-timeout", type=float, default=300.0,
                    help="seconds after which one call is abandoned and reported as a timeout (default 300)")
    ap.add_argument("--setting-timeout", type=float, default=3600.0,
                    help="seconds after which a whole setting's worker is stopped (default 3600)")
    ap.add_argument("--width", type=int, help="table width (default: terminal width, or 250 when not a terminal)")
    # internal: one setting in this process
    ap.add_argument("--_worker", nargs=5, type=int, metavar=("N", "D", "F", "THREADS", "REPS"), help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _worker(args: argparse.Namespace) -> int:
    from _bench_worker import run_setting

    n, d, f, threads, reps = args._worker
    rules = [r.strip() for r in args.rules.split(",")] if args.rules else None
    run_setting(n, d, f, threads, reps, args.seed, not args.no_peers, rules, args._out, args.call_timeout)
    return 0


def _run_setting_subprocess(
    n: int, d: int, f: int, threads: int, reps: int, args: argparse.Namespace, tmp: Path,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:

    out = tmp / f"n{n}_d{d}_f{f}_t{threads}.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", str(n), str(d), str(f), str(threads),
           str(reps), "--_out", str(out), "--seed", str(args.seed), "--call-timeout", str(args.call_timeout)]
    if args.no_peers:
        cmd.append("--no-peers")
    if args.rules:
        cmd += ["--rules", args.rules]
    error = run_worker(cmd, threads, args.setting_timeout)
    setting: dict[str, Any] = {"n": n, "d": d, "f": f, "threads": threads, "floor": None}
    cases: list[dict[str, Any]] = []
    if out.exists():
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "setting":
                setting = rec
            elif rec.get("type") == "stubs":
                setting["stubbed"] = rec["stubbed"]
            else:
                cases.append(rec)
    if error:
        setting["worker_error"] = error
    return setting, cases


def _parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for item in text.split(","):
        n, d, f = item.split(":")
        sizes.append((int(n), int(float(d)), int(f)))
    return sizes


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (every setting in a subprocess) and print one combined table."""
    args = parse_args(argv)
    if args._worker:
        return _worker(args)
    t_start = time.perf_counter()
    if args.quick:
        sizes = [QUICK_SETTING]
        thread_settings = [1] if args.threads in ("1", "both") else [all_threads()]
        reps = args.reps or 2
    else:
        sizes = _parse_sizes(args.sizes) if args.sizes else FULL_SETTINGS
        thread_settings = {"1": [1], "all": [all_threads()], "both": [1, all_threads()]}[args.threads]
        thread_settings = list(dict.fromkeys(thread_settings))
        reps = args.reps or 5
    results = []
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-") as tmpdir:
        for n, d, f in sizes:
            for threads in thread_settings:
                results.append(_run_setting_subprocess(n, d, f, threads, reps, args, Path(tmpdir)))
    wall = time.perf_counter() - t_start
    report(results, args, wall)
    return 0


def report(results: list[tuple[dict[str, Any], list[dict[str, Any]]]], args: argparse.Namespace, wall: float) -> None:
    """Print the combined rich table, the disagreements and the notes; write Markdown / JSON if asked."""
    from rich.console import Console

    width = args.width or (None if sys.stdout.isatty() else 250)
    console = Console(width=width)
    rows = build_rows(results)
    versions = next((st.get("versions") for st, _ in results if st.get("versions")), {})
    vtxt = ", ".join(f"{k} {v}" for k, v in versions.items())
    title = "Phalanx aggregators vs peers (seconds per call; † = single call)"
    console.print(rich_table(rows, title))
    dis = disagreements(rows)
    lines: list[str] = []
    if dis:
        lines.append("Disagreements (max |Δ| > 1e-4 × max |Phalanx output|):")
        for d in dis:
            rel = f"{d['rel']:.1e}" if isinstance(d.get("rel"), float) else "?"
            mx = f"{d['maxabs']:.2e}" if isinstance(d.get("maxabs"), float) else "?"
            lines.append(f"  [{d['setting']}] {d['rule']} vs {d['peer']}: max |Δ| {mx}, relative {rel} — "
                         f"{d['why']}")
    else:
        lines.append("Disagreements (max |Δ| > 1e-4 × max |Phalanx output|): none")
    lines += notes(results)
    thr = "; ".join(f"{setting_label(st)}: {st.get('threads_info')}" for st, _ in results if st.get("threads_info"))
    stubbed = sorted({m for st, _ in results for m in st.get("stubbed", [])})
    lines.append(f"Peers: {', '.join(PEER_COLUMNS)} (BZ/BP/FL/FM in the max |Δ| column). Versions: {vtxt}."
                 + (f" Stubbed for `import byzfl` (not installed, import-time only): {', '.join(stubbed)}."
                    if stubbed else ""))
    lines.append(f"Threads per setting: {thr}")
    lines.append("Phalanx timed through its public call rule(x) / pre(x), which leave x as it was; the rows "
                 "'… in place' through pre.mix_(copy of x), the copy made before the clock, beside peers that "
                 f"overwrite their input. Wall time {wall:.0f} s.")
    for line in lines:
        console.print(line, markup=False, highlight=False)
    if args.markdown:
        md = ["# Phalanx aggregators vs peers", "", f"Command: `{' '.join(sys.argv)}`", "",
              markdown_table(rows), "", *[f"    {line}" if line.startswith("  ") else line for line in lines]]
        Path(args.markdown).write_text("\n".join(md) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps([{"setting": st, "cases": cs} for st, cs in results], indent=1,
                                              default=repr))


if __name__ == "__main__":
    sys.exit(main())
