"""Time Phalanx's simulated training round against ByzFL 0.0.11's own DSGD loop and a per-worker loop, in one command.

    .venv/bin/python benchmarks/training.py [--quick] [--threads 1|all|both] [--no-byzfl] [--network-only]
                                            [--markdown PATH]

Setting (the same for all three): Fashion-MNIST (``phalanx.data.load("fashion-mnist")``, Debian's
``dataset-fashion-mnist``), the 784-100-10 ReLU MLP (ByzFL's ``fc_mnist``; Phalanx's ``mlp`` with
``hidden=(100,)``), batch 32 per worker, IID split, worker momentum 0.9, server SGD with lr 0.1 and no weight decay,
n workers of which b = n/10 send sign-flipped vectors (ByzFL ``SignFlipping``, Phalanx ``signflip``), coordinate-wise
trimmed mean with f = n/10 (ByzFL ``TrMean``, Phalanx ``cwtm``).

The three implementations of one round:

* **ByzFL** — the body of the DSGD branch of ByzFL's own training loop (``byzfl/benchmark/train.py``,
  ``start_training``), called on ByzFL's own ``Client``/``Server``/``ByzantineClient``/``DataDistributor`` objects:
  every honest client draws a batch from its ``DataLoader`` and back-propagates, the flat momentum vectors are
  collected, the attack appends its vectors, the server aggregates (``RobustAggregator``) and takes an SGD step,
  and the new model is loaded into every client. ByzFL's evaluation, logging and file writing are not timed (none
  happens in the rounds between two evaluations).
* **loop** — Phalanx's round (:meth:`phalanx.training.Loop.step`, in-process transport) with the honest gradients
  from :meth:`Problem.grads_loop` (one ``torch.func.grad`` call per worker) instead of the single batched call.
  Everything else (sampling, momentum, attack, rule, step) is Phalanx's: the ratio isolates vectorisation.
* **Phalanx** — the round as ``phalanx run`` runs it (``phalanx.experiments.from_config``, ``Loop.step``). For this
  MLP the per-worker gradients come from explicit back-propagation (:mod:`phalanx.training.linear_stack`: batched matrix
  products fused with the momentum update).
* **vmap** — the same round with the gradients from the generic ``vmap(grad)`` path (``Problem(per_worker="vmap")``),
  the one every other model (CNN, ResNet) takes: how fast Phalanx is on models without the fast path.

n ∈ {10, 50, 200} for all four and n = 1000 for Phalanx and vmap; ByzFL and the loop at n = 1000 are run for 2
rounds (after 1 warm-up round) when their time, extrapolated linearly from n = 200, stays under 60 s, else reported
as that extrapolation (marked ≈; it is a lower bound on their time: ByzFL's sort grows faster than n). Each thread
setting (1 and all cores) runs in its own subprocess of this script, with the OMP/MKL/OPENBLAS thread variables set
before torch is imported (and ``torch.set_num_threads``). Timing: ``warmup`` rounds, then ``rounds`` rounds in which the
implementations take turns (ByzFL, loop, vmap, Phalanx, ByzFL, …) so that a change in the machine's load hits
them alike; the median of each is reported. The split of Phalanx's round (gradients / aggregation / rest) is
measured in the same rounds by thin timing wrappers around the gradient call (``Problem.accumulate_grads``: the
gradients fused with the momentum update) and the rule.

Before timing, the implementations are checked to compute the same round: same parameter count and layout, and, from the
same θ with the same batches, two rounds of each (ByzFL's momentum convention m₀ = 0 given to Phalanx) give the same
θ up to float32 rounding. What still differs between them is printed below the tables.

``--quick`` (smoke test): the embedded ``digits`` data set (8×8 images, MLP 64-100-10), n = 10, 1 thread, Phalanx
and the loop only, 3 rounds. ``--profile N``: also print torch.profiler's top operators over 3 Phalanx rounds at n=N.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import all_threads, emit
from _bench_peers import STUBBED, load_byzfl
from _bench_training_report import TITLE as TITLE  # re-exported: the tests read it on this module
from _bench_training_report import build_rows, notes, print_report, setting_line, write_markdown
from _bench_training_report import fmt_ratio as fmt_ratio  # re-exported: the tests read it on this module
from _bench_training_runners import ByzflRunner, PhalanxRunner, check_equivalence
from _bench_training_setting import BIG_N, BIG_N_BUDGET_S, FULL_NS, IMPLS, QUICK_N, byzantine_of
from _subprocess import run_worker


def tune_malloc() -> str:
    """Apply the training engine's allocator setting (``phalanx.training.memory.tune_allocator``), as ``train()`` does.

    It is process-wide, so ByzFL and the loop, which run in the same process, get it too (the comparison stays fair).
    """
    from phalanx.training.memory import tune_allocator

    if tune_allocator():
        return "mallopt(M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=2 GiB) for all three, as phalanx.training.train does"
    return "allocator setting not applied (not glibc, or PHALANX_NO_MALLOC_TUNING set)"



# ---------------------------------------------------------------------------------------------------------------
# One thread setting (runs in a subprocess)
# ---------------------------------------------------------------------------------------------------------------

def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _measure(runners: dict[str, Any], warmup: int, rounds: int) -> dict[str, list[float]]:
    """Warm up every runner, then time ``rounds`` rounds of each, taking turns."""
    for _ in range(warmup):
        for r in runners.values():
            r.round()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(rounds):
        for k, r in runners.items():
            times[k].append(r.round(record=True))
    return times


def network_only(on: bool) -> None:
    """``--network-only``: the coordinate-wise rules sort by the network at every n in this process."""
    if on:
        from phalanx.aggregators import coordinatewise

        coordinatewise.SELECT_MIN_ROWS = 2**31


def run_thread_setting(args: argparse.Namespace, threads: int, out: str) -> None:
    """Measure every n at ``threads`` threads; write one JSON line per n to ``out``."""
    malloc = "" if args.no_tune_malloc else tune_malloc()
    import torch

    torch.set_num_threads(threads)
    from phalanx import data

    network_only(args.network_only)

    dataset = data.load(args.dataset)
    emit(out, {"type": "env", "threads": threads, "torch_threads": torch.get_num_threads(),
                "load_start": os.getloadavg()[0], "torch": torch.__version__, "malloc": malloc,
                "features": math.prod(dataset.input_shape), "classes": dataset.num_classes})
    use_byzfl = not args.no_byzfl
    if use_byzfl:
        try:
            load_byzfl()
            emit(out, {"type": "stubs", "stubbed": STUBBED})
        except Exception as exc:  # not installed: the table says so
            emit(out, {"type": "byzfl_missing", "error": f"{type(exc).__name__}: {exc}"})
            use_byzfl = False
    measured: dict[str, dict[int, float]] = {k: {} for k in IMPLS}
    for n in args.ns:
        rec: dict[str, Any] = {"type": "row", "n": n, "threads": threads, "b": byzantine_of(n)}
        big = n > max(FULL_NS)
        t_build = time.perf_counter()
        runners: dict[str, Any] = {}
        peers = [k for k in ("byzfl", "loop") if k != "byzfl" or use_byzfl]
        if big:  # the slow implementations only when their extrapolated time fits the budget
            for k in list(peers):
                ref = [m for m in measured[k] if m <= max(FULL_NS)]
                if not ref:
                    peers.remove(k)
                    continue
                n0 = max(ref)
                est = measured[k][n0] * n / n0
                rec[f"{k}_estimate"] = est
                rec[f"{k}_estimate_from"] = n0
                if args.big_peers == "estimate" or (args.big_peers == "auto" and 3 * est > BIG_N_BUDGET_S):
                    peers.remove(k)
        if "byzfl" in peers:
            runners["byzfl"] = ByzflRunner(n, dataset)
        if "loop" in peers:
            runners["loop"] = PhalanxRunner(n, dataset, args.dataset, loop=True)
        runners["vmap"] = PhalanxRunner(n, dataset, args.dataset, loop=False, per_worker="vmap")
        phalanx = PhalanxRunner(n, dataset, args.dataset, loop=False)
        runners["phalanx"] = phalanx
        rec["build_s"] = time.perf_counter() - t_build
        if "loop" in runners and not big:
            rec["check"] = check_equivalence(phalanx, runners["loop"], runners.get("byzfl"), runners["vmap"])
        warmup, rounds = (1, 2) if big else (args.warmup, args.rounds)
        if big:
            rounds_by = {k: (args.big_rounds if k in ("phalanx", "vmap") else 2) for k in runners}
        else:
            rounds_by = {k: rounds for k in runners}
        # take turns while every runner still has rounds to do, then finish Phalanx's extra rounds alone
        common = min(rounds_by.values())
        times = _measure(runners, warmup, common)
        extra = {k: rounds_by[k] - common for k in runners}
        for _ in range(max(extra.values())):  # Phalanx's (and vmap's) extra rounds, still taking turns
            for k, r in runners.items():
                if extra[k] > 0:
                    times[k].append(r.round(record=True))
                    extra[k] -= 1
        for k in runners:
            rec[k] = _median(times[k])
            rec[f"{k}_times"] = times[k]
            if rec[k] is not None:
                measured[k][n] = rec[k]
        rec["split_grads"] = _median(phalanx.split.grads)
        rec["split_agg"] = _median(phalanx.split.agg)
        rec["split_grads_vmap"] = _median(runners["vmap"].split.grads)
        rec["faults"] = statistics.median(phalanx.split.faults) if phalanx.split.faults else None
        rec["rounds"] = {k: len(v) for k, v in times.items()}
        rec["dim"] = phalanx.model_problem.dim
        rec["load"] = os.getloadavg()[0]
        emit(out, rec)
        del runners, phalanx
    if args.profile:
        emit(out, {"type": "profile", "n": args.profile, "threads": threads,
                    "table": profile_phalanx(args.profile, dataset, args.dataset)})
    emit(out, {"type": "env_end", "threads": threads, "load_end": os.getloadavg()[0]})


def profile_phalanx(n: int, dataset: Any, dataset_name: str) -> str:
    """torch.profiler's operators (by self CPU time) over 3 Phalanx rounds at n workers, after 2 warm-up rounds."""
    from torch.profiler import ProfilerActivity, profile

    runner = PhalanxRunner(n, dataset, dataset_name, loop=False)
    for _ in range(2):
        runner.round()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            runner.round()
    return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


# ---------------------------------------------------------------------------------------------------------------
# Parent: subprocesses, table, notes
# ---------------------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: digits, n=10, 1 thread, Phalanx and the loop only, 3 rounds")
    ap.add_argument("--threads", choices=["1", "all", "both"], default="both",
                    help="thread settings to run (default: both 1 and all cores)")
    ap.add_argument("--no-byzfl", action="store_true", help="do not run ByzFL (Phalanx and the loop only)")
    ap.add_argument("--ns", help=f"comma-separated worker counts (default: {','.join(map(str, FULL_NS))},{BIG_N})")
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds per implementation (default 20)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up rounds per implementation (default 2)")
    ap.add_argument("--big-rounds", type=int, default=5, help="timed Phalanx rounds at n > 200 (default 5)")
    ap.add_argument("--big-peers", choices=["auto", "run", "estimate"], default="auto",
                    help=f"ByzFL and the loop at n > 200: run 2 rounds if extrapolated ≤ {BIG_N_BUDGET_S:.0f} s "
                         "(auto), always (run), or only extrapolate (estimate)")
    ap.add_argument("--dataset", default=None, help="data set (default fashion-mnist; digits with --quick)")
    ap.add_argument("--network-only", action="store_true",
                    help="the coordinate-wise rules sort by the network at every n (no selection from "
                         "coordinatewise.SELECT_MIN_ROWS rows): the A/B for selection's share of the round")
    ap.add_argument("--no-tune-malloc", action="store_true",
                    help="skip the training engine's allocator setting (mallopt; applied by default, process-wide)")
    ap.add_argument("--profile", type=int, metavar="N", help="also profile 3 Phalanx rounds at n=N")
    ap.add_argument("--markdown", metavar="PATH", help="also write the tables and notes as Markdown to PATH")
    ap.add_argument("--json", metavar="PATH", help="also write every raw measurement as JSON to PATH")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per thread setting (default 3600)")
    ap.add_argument("--width", type=int, help="table width (default: terminal width, or 200 when not a terminal)")
    ap.add_argument("--_worker", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.no_byzfl = True
        args.dataset = args.dataset or "digits"
        args.ns = args.ns or str(QUICK_N)
        args.rounds = min(args.rounds, 3)
        args.warmup = min(args.warmup, 1)
        if args.threads == "both":
            args.threads = "1"
    args.dataset = args.dataset or "fashion-mnist"
    args.ns = [int(x) for x in args.ns.split(",")] if isinstance(args.ns, str) else [*FULL_NS, BIG_N]
    if args.rounds < 1 or args.warmup < 0 or args.big_rounds < 1:
        ap.error("--rounds and --big-rounds must be >= 1, --warmup >= 0")
    if args.dataset != "fashion-mnist" and not args.no_byzfl:
        ap.error("ByzFL's fc_mnist takes 28×28 images: use --dataset fashion-mnist or --no-byzfl")
    return args


def _forwarded(args: argparse.Namespace) -> list[str]:
    cmd = ["--ns", ",".join(map(str, args.ns)), "--rounds", str(args.rounds), "--warmup", str(args.warmup),
           "--big-rounds", str(args.big_rounds), "--big-peers", args.big_peers, "--dataset", args.dataset]
    if args.no_byzfl:
        cmd.append("--no-byzfl")
    if args.no_tune_malloc:
        cmd.append("--no-tune-malloc")
    if args.network_only:
        cmd.append("--network-only")
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    return cmd


def run_subprocess(args: argparse.Namespace, threads: int, tmp: Path) -> list[dict[str, Any]]:
    """One thread setting in a fresh interpreter; its JSON records (plus an ``error`` record if it failed)."""
    out = tmp / f"t{threads}.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", str(threads), "--_out", str(out),
           *_forwarded(args)]
    error = run_worker(cmd, threads, args.timeout)
    recs = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if error:
        recs.append({"type": "error", "threads": threads, "error": error})
    return recs



def main(argv: list[str] | None = None) -> int:
    """Run every thread setting in a subprocess and print one combined report."""
    args = parse_args(argv)
    if args._worker:
        run_thread_setting(args, args._worker, args._out)
        return 0
    if args.dataset == "fashion-mnist":
        from phalanx import data
        from phalanx.data.base import DatasetNotFoundError

        try:
            data.load("fashion-mnist")
        except DatasetNotFoundError as exc:
            print(f"{exc}\n(apt-get install dataset-fashion-mnist, or run with --quick)", file=sys.stderr)
            return 2
    command = ".venv/bin/python benchmarks/training.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    thread_settings = list(dict.fromkeys({"1": [1], "all": [all_threads()], "both": [1, all_threads()]}[args.threads]))
    recs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-training-") as tmp:
        for threads in thread_settings:
            recs += run_subprocess(args, threads, Path(tmp))
    wall = time.perf_counter() - t0
    rows = build_rows(recs)
    note_lines = notes(recs, rows, args, wall, command.strip())
    profiles = [r for r in recs if r.get("type") == "profile"]
    setting = setting_line(recs)
    print_report(rows, note_lines, args.width, profiles, setting)
    if args.markdown:
        write_markdown(args.markdown, rows, note_lines, profiles, setting)
    if args.json:
        Path(args.json).write_text(json.dumps({"records": recs, "wall_s": wall, "command": command}, indent=1))
    failed = any(r.get("type") == "error" for r in recs)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
