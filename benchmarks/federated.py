"""Time Phalanx's federated round (FedAvg) against Flower's simulation and ByzFL's FedAvg, in one command.

    .venv/bin/python benchmarks/federated.py [--quick] [--threads 1|all|both] [--no-flower] [--no-byzfl]
                                             [--no-memory] [--markdown PATH] [--json PATH]

The task (the same for all): Fashion-MNIST (``phalanx.data.load("fashion-mnist")``, Debian's
``dataset-fashion-mnist``), Phalanx's ``mlp`` 784-64-10 (``Flatten → Linear → ReLU → Linear``, θ₀ drawn as
``phalanx run`` draws it and given to every implementation), 100 clients with Phalanx's IID split (seed 0), 10
clients sampled per round, 5 local SGD steps of batch 32 with lr 0.05 (no momentum, no weight decay), no Byzantine
client, and the coordinate-wise trimmed mean trimming 1 of the 10 replies from each side (Phalanx ``cwtm`` f = 1,
Flower ``FedTrimmedAvg(beta=0.1)``, ByzFL ``TrMean`` f = 1).

What one round is in each implementation:

* **Phalanx** — the round as ``phalanx run`` runs it with ``algorithm = "fedavg"``
  (``phalanx.experiments.from_config``, :meth:`phalanx.training.Loop.step`): sample 10 of 100 clients, the 5 local
  steps of all 10 as one batched computation, the trimmed mean of their pseudo-gradients, the server step.
* **Flower + FedTrimmedAvg** — ``flwr.simulation.run_simulation`` (Flower 1.42, Ray backend) with 100 supernodes,
  2 Ray actors of 1 CPU each (all cores), and Flower's own ``FedTrimmedAvg`` (``fraction_train=0.1``,
  ``beta=0.1``) in the ServerApp. The ClientApp (``benchmarks/_bench_federated_flower.py``) loads the broadcast
  weights into the same torch MLP, takes 5 ``torch.optim.SGD`` steps on batches of 32 drawn with replacement from
  its shard (indexed by its ``partition-id``) and replies its weights. A round is everything Flower does between the
  end of one ``aggregate_train`` and the end of the next: sampling, messages through the simulation engine (each
  weight array serialised into an ``ArrayRecord`` both ways), the clients' training in the actors, aggregation.
* **Flower + PhalanxFedAvg** — the same simulation (the same run, taking turns block by block) with Phalanx's
  Flower strategy ``phalanx.flower.PhalanxFedAvg(aggregator="cwtm", f=1)`` in place of ``FedTrimmedAvg``: how much
  the strategy itself costs inside Flower.
* **ByzFL** — the body of the FedAvg branch of ByzFL 0.0.11's own training loop (``byzfl/benchmark/train.py``,
  ``start_training``: ``training_algorithm = "FedAvg"`` with ``proportion_selected_clients`` and
  ``local_steps_per_client``), called on ByzFL's own ``Client``/``Server``/``ByzantineClient``/``DataDistributor``
  objects: ``np.random.choice`` of the clients, ``Client.compute_model_update(5)`` for each in a Python loop (its
  ``DataLoader``, shuffled, without replacement), ``Server.update_model_with_weights`` (``TrMean`` of the models),
  and the new model loaded into every one of the 100 clients. The model is Phalanx's MLP registered under a name in
  ``byzfl.fed_framework.models`` (ByzFL builds its models by name; its own ``fc_mnist`` has 100 hidden units) and
  the loss ``CrossEntropyLoss`` (ByzFL's ``fc_mnist`` + ``NLLLoss`` compute the same).

Timing. Phalanx and ByzFL run in one subprocess per thread setting (1 and all cores; the OMP/MKL/OPENBLAS thread
variables set before torch is imported, and ``torch.set_num_threads``): ``warmup`` rounds each, then ``rounds``
rounds in which they take turns, the median of each. Flower runs in its own subprocess: one ``run_simulation`` in
which the two strategies first run ``flower-warmup`` rounds each (Ray and its actors start, each actor loads the data
once: excluded), then ``flower-blocks`` blocks of ``flower-block-rounds`` rounds each, taking turns block by block
(``Strategy.start`` on the same grid, continuing from the block's final weights). Flower's round time is the
interval between the ends of consecutive ``aggregate_train`` calls within a block (rounds 2… of each block); its
median is reported. No evaluation happens inside a timed round of any implementation. Ray runs with its usage stats,
Flower with its telemetry and update check off, both with their files under temporary directories; after the
simulation no process of it may be left (checked in /proc; any found is killed and reported).

Before timing, the computations are checked to agree: from the same θ₀, Phalanx's first round is replayed with the
clients and batches it drew through the Flower client's training function and Flower's own ``trim_mean``, and through
ByzFL's clients and server; the largest difference of the resulting models is printed.

``--memory`` (by default in the full run, not with ``--quick``): Phalanx FedAvg on ResNet-20 (GroupNorm; 269,722
parameters) with 1,000 clients, 100 per round, 1 local step of batch 32, trimmed mean with f = 10, on a synthetic
data set of CIFAR-10's shape and size (50,000 + 10,000 images of 3×32×32, N(0, 1) pixels, random labels: CIFAR-10 is
not on this machine; the numbers do not depend on the pixel values), 2 rounds in a fresh subprocess: peak RSS
(``ru_maxrss``) and seconds per round. One local step because the peak is set by one step's batched forward and
backward pass over the 100 clients × 32 images (the steps of a round run one after another and reuse the same
buffers); more steps only multiply the time. A watchdog kills the run if its RSS approaches the memory available,
and the part is then retried with half as many clients per round.

``--quick`` (smoke test): the embedded ``digits`` data set (8×8 images, MLP 64-64-10), 10 clients, 4 per round (f =
1, beta = 0.25), 2 local steps, 1 thread, a few rounds; Flower with 10 supernodes and 3-round blocks; no ByzFL and no
memory part.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import all_threads
from _bench_federated_report import IMPL_LABELS as IMPL_LABELS  # re-exported: the tests read it on this module
from _bench_federated_report import TITLE as TITLE  # re-exported: the tests read it on this module
from _bench_federated_report import build_rows, notes, print_report, setting_line, write_markdown
from _bench_federated_report import fmt_ratio as fmt_ratio  # re-exported: the tests read it on this module
from _bench_federated_report import main_cells as main_cells  # re-exported: the tests read it on this module
from _bench_federated_task import ALLOCATORS, FULL_TASK, QUICK_TASK, MemoryTask
from _bench_federated_workers import _rss_bytes, run_flower, run_inprocess, run_memory
from _subprocess import THREAD_ENV, run_worker


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


# ---------------------------------------------------------------------------------------------------------------
# Flower (its own process: one run_simulation)
# ---------------------------------------------------------------------------------------------------------------

def _processes_mentioning(text: str) -> list[int]:
    """PIDs of the processes whose command line contains ``text`` (Ray's processes carry its session directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def flower_subprocess(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """The Flower part in a fresh interpreter (1 BLAS thread per process), then the check for leftover processes."""
    out = tmp / "flower.jsonl"
    log = tmp / "flower.log"
    ray_dir = tempfile.mkdtemp(prefix="ray")  # a short path: Ray's socket paths are limited to 107 bytes
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", "flower", "--_out", str(out),
           "--_ray", ray_dir, *_forwarded(args)]
    env = {**os.environ, **{v: "1" for v in THREAD_ENV}}
    recs: list[dict[str, Any]] = []
    error = ""
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
            if rc != 0:
                error = f"worker exited with code {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            error = f"worker stopped after {args.timeout:.0f} s"
    leftovers: list[int] = []
    for _ in range(20):  # Ray's workers are reaped within seconds of ray.shutdown()
        leftovers = _processes_mentioning(ray_dir)
        if not leftovers:
            break
        time.sleep(0.5)
    for pid in leftovers:  # started by this benchmark: end them
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(ray_dir, ignore_errors=True)
    shutil.rmtree(ray_dir + "-flwr-home", ignore_errors=True)
    if out.exists():
        recs = [json.loads(line) for line in out.read_text().splitlines()]
    recs.append({"type": "ray_leftovers", "pids": leftovers})
    if error:
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
        recs.append({"type": "error", "part": "flower", "error": error, "log": tail})
    return recs


# ---------------------------------------------------------------------------------------------------------------
# Memory: ResNet-20, many clients
# ---------------------------------------------------------------------------------------------------------------

def memory_subprocess(args: argparse.Namespace, tmp: Path, allocator: str) -> list[dict[str, Any]]:
    """The memory part in a fresh interpreter, watched: killed when its RSS comes within 1 GiB of what the machine
    had available at the start, then retried with half the clients per round (at most 3 tries)."""
    recs: list[dict[str, Any]] = []
    per_round = args.memory_task.per_round
    avail = _mem_available()
    limit = args.memory_limit_gib * 2**30 if args.memory_limit_gib else (
        (avail - 2**30) if avail else 20 * 2**30)
    for _attempt in range(3):
        out = tmp / f"memory-{allocator}-{per_round}.jsonl"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", "memory", "--_out", str(out),
               "--_per-round", str(per_round), *_forwarded(args)]
        env = {k: v for k, v in os.environ.items() if k != "PHALANX_NO_MALLOC_TUNING"}
        env.update({v: str(all_threads()) for v in THREAD_ENV})
        if allocator == "glibc":
            env["PHALANX_NO_MALLOC_TUNING"] = "1"
        proc = subprocess.Popen(cmd, env=env)
        t0, peak_seen, over = time.perf_counter(), 0, False
        while proc.poll() is None:
            rss = _rss_bytes(proc.pid)
            peak_seen = max(peak_seen, rss)
            if rss > limit:
                proc.kill()
                over = True
            elif time.perf_counter() - t0 > args.timeout:
                proc.kill()
            time.sleep(0.2)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        if rows and proc.returncode == 0:
            recs.append({**rows[-1], "allocator": allocator})
            break
        why = (f"RSS reached {peak_seen / 2**30:.1f} GiB > the limit {limit / 2**30:.1f} GiB" if over
               else f"exit code {proc.returncode}")
        recs.append({"type": "memory_failed", "per_round": per_round, "allocator": allocator, "error": why,
                     "rounds_done": len(rows[-1]["times"]) if rows else 0, "peak_seen": peak_seen,
                     "killed_over_limit": over, "partial": rows[-1] if rows else None})
        per_round //= 2
        if per_round < 3:  # f = max(1, per_round // 10) needs 2f < per_round
            break
    return recs


# ---------------------------------------------------------------------------------------------------------------
# Parent: subprocesses, table, notes
# ---------------------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: digits, 10 clients, 4 per round, 1 thread, few rounds, no ByzFL, no memory part")
    ap.add_argument("--threads", choices=["1", "all", "both"], default="both",
                    help="thread settings for Phalanx and ByzFL (default: both 1 and all cores)")
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds of Phalanx and ByzFL (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up rounds of Phalanx and ByzFL (default 3)")
    ap.add_argument("--flower-warmup", type=int, default=3,
                    help="warm-up rounds per Flower strategy, with Ray's start (default 3)")
    ap.add_argument("--flower-blocks", type=int, default=4, help="timed blocks per Flower strategy (default 4)")
    ap.add_argument("--flower-block-rounds", type=int, default=6,
                    help="rounds per block; the first of each is not timed (default 6)")
    ap.add_argument("--ray-cpus", type=int, default=None, help="CPUs given to Ray (default: all cores)")
    ap.add_argument("--no-flower", action="store_true", help="do not run Flower's simulation")
    ap.add_argument("--no-byzfl", action="store_true", help="do not run ByzFL")
    mem = ap.add_mutually_exclusive_group()
    mem.add_argument("--memory", action="store_true", help="run the ResNet-20 memory part (even with --quick)")
    mem.add_argument("--no-memory", action="store_true", help="skip the ResNet-20 memory part")
    ap.add_argument("--memory-only", action="store_true", help="run only the memory part")
    ap.add_argument("--memory-clients", type=int, default=MemoryTask.clients)
    ap.add_argument("--memory-per-round", type=int, default=MemoryTask.per_round)
    ap.add_argument("--memory-rounds", type=int, default=MemoryTask.rounds)
    ap.add_argument("--memory-allocator", choices=["both", *ALLOCATORS], default="both",
                    help="allocator settings of the memory part: phalanx run's (mallopt), glibc's default, or both "
                         "(default)")
    ap.add_argument("--memory-limit-gib", type=float, default=None,
                    help="kill the memory run above this RSS (default: available memory at the start − 1 GiB)")
    ap.add_argument("--markdown", metavar="PATH", help="also write the tables and notes as Markdown to PATH")
    ap.add_argument("--json", metavar="PATH", help="also write every raw measurement as JSON to PATH")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess (default 1800)")
    ap.add_argument("--width", type=int, help="table width (default: terminal width, or 200 when not a terminal)")
    ap.add_argument("--_worker", choices=["inprocess", "flower", "memory"], help=argparse.SUPPRESS)
    ap.add_argument("--_threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    ap.add_argument("--_ray", help=argparse.SUPPRESS)
    ap.add_argument("--_per-round", dest="_per_round", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.task = QUICK_TASK if args.quick else FULL_TASK
    if args.quick:
        args.no_byzfl = True
        args.rounds = min(args.rounds, 5)
        args.warmup = min(args.warmup, 1)
        args.flower_warmup = min(args.flower_warmup, 1)
        args.flower_blocks = min(args.flower_blocks, 1)
        args.flower_block_rounds = min(args.flower_block_rounds, 3)
        if args.threads == "both":
            args.threads = "1"
    args.ray_cpus = args.ray_cpus or all_threads()
    args.run_memory = args.memory or args.memory_only or not (args.quick or args.no_memory)
    args.memory_task = MemoryTask(clients=args.memory_clients, per_round=args.memory_per_round,
                                  rounds=args.memory_rounds)
    if min(args.rounds, args.flower_blocks, args.memory_rounds) < 1 or args.warmup < 0 or args.flower_warmup < 1:
        ap.error("--rounds, --flower-blocks, --memory-rounds and --flower-warmup must be >= 1, --warmup >= 0")
    if args.flower_block_rounds < 2:
        ap.error("--flower-block-rounds must be >= 2 (the first round of a block is not timed)")
    return args


def _forwarded(args: argparse.Namespace) -> list[str]:
    cmd = ["--rounds", str(args.rounds), "--warmup", str(args.warmup), "--flower-warmup", str(args.flower_warmup),
           "--flower-blocks", str(args.flower_blocks), "--flower-block-rounds", str(args.flower_block_rounds),
           "--ray-cpus", str(args.ray_cpus), "--memory-clients", str(args.memory_clients),
           "--memory-per-round", str(args.memory_per_round), "--memory-rounds", str(args.memory_rounds)]
    if args.quick:
        cmd.append("--quick")
    if args.no_byzfl:
        cmd.append("--no-byzfl")
    return cmd


def inprocess_subprocess(args: argparse.Namespace, threads: int, tmp: Path) -> list[dict[str, Any]]:
    """Phalanx and ByzFL at one thread setting in a fresh interpreter; its records (and an ``error`` record)."""
    out = tmp / f"inprocess-t{threads}.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", "inprocess", "--_threads", str(threads),
           "--_out", str(out), *_forwarded(args)]
    error = run_worker(cmd, threads, args.timeout)
    recs = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if error:
        recs.append({"type": "error", "part": f"Phalanx/ByzFL at {threads} thread(s)", "error": error})
    return recs


def _worker_main(args: argparse.Namespace) -> int:
    runs: dict[str, Callable[[], None]] = {
        "inprocess": lambda: run_inprocess(args, int(args._threads), args._out),
        "flower": lambda: run_flower(args, args._out),
        "memory": lambda: run_memory(args, args._out),
    }
    runs[args._worker]()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run every part in its own subprocess and print one combined report."""
    args = parse_args(argv)
    if args._worker:
        return _worker_main(args)
    if args.task.dataset == "fashion-mnist":
        from phalanx import data
        from phalanx.data.base import DatasetNotFoundError

        try:
            data.load("fashion-mnist")
        except DatasetNotFoundError as exc:
            print(f"{exc}\n(apt-get install dataset-fashion-mnist, or run with --quick)", file=sys.stderr)
            return 2
    command = ".venv/bin/python benchmarks/federated.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    thread_settings = list(dict.fromkeys({"1": [1], "all": [all_threads()],
                                          "both": [1, all_threads()]}[args.threads]))
    recs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-federated-") as tmp:
        if not args.memory_only:
            for threads in thread_settings:
                recs += inprocess_subprocess(args, threads, Path(tmp))
            if not args.no_flower:
                recs += flower_subprocess(args, Path(tmp))
        if args.run_memory:
            for allocator in ALLOCATORS if args.memory_allocator == "both" else [args.memory_allocator]:
                recs += memory_subprocess(args, Path(tmp), allocator)
    wall = time.perf_counter() - t0
    rows = build_rows(recs)
    mem = [r for r in recs if r.get("type") in ("memory", "memory_failed")]
    note_lines = notes(recs, rows, args, wall, command.strip())
    setting = setting_line(args.task, recs)
    print_report(rows, mem, note_lines, args.width, setting)
    if args.markdown:
        write_markdown(args.markdown, rows, mem, note_lines, setting)
    if args.json:
        Path(args.json).write_text(json.dumps({"records": recs, "wall_s": wall, "command": command}, indent=1))
    failed = any(r.get("type") == "error" for r in recs)
    return 1 if failed or not (rows or mem) else 0


if __name__ == "__main__":
    sys.exit(main())
