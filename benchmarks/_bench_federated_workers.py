"""What each worker subprocess of benchmarks/federated.py runs: Phalanx and ByzFL at one thread setting
(:func:`run_inprocess`), both Flower strategies in one ``run_simulation`` (:func:`run_flower`), and the memory
part (:func:`run_memory`); each writes its JSON records to a file."""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _bench_common import all_threads, emit, package_version
from _bench_federated_runners import ByzflRunner, PhalanxRunner, check_equivalence
from _bench_federated_task import SEED, MemoryTask, Task


def _rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process now (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0



# ---------------------------------------------------------------------------------------------------------------
# Phalanx and ByzFL (in one process per thread setting)
# ---------------------------------------------------------------------------------------------------------------

def run_inprocess(args: argparse.Namespace, threads: int, out: str) -> None:
    """Phalanx and ByzFL at ``threads`` threads, taking turns round by round; JSON records to ``out``."""
    from phalanx.training.memory import tune_allocator

    malloc = tune_allocator()  # as phalanx.training.train does; process-wide, so ByzFL gets it too
    import torch

    torch.set_num_threads(threads)
    from phalanx import data

    task: Task = args.task
    dataset = data.load(task.dataset)
    emit(out, {"type": "env", "part": "inprocess", "threads": threads, "torch": torch.__version__,
                "malloc": malloc, "load_start": os.getloadavg()[0], "features": math.prod(dataset.input_shape),
                "classes": dataset.num_classes})
    phalanx = PhalanxRunner(task, dataset)
    runners: dict[str, Any] = {"phalanx": phalanx}
    if not args.no_byzfl:
        try:
            runners["byzfl"] = ByzflRunner(task, dataset, phalanx.theta)
        except Exception as exc:  # not installed: the table says so
            emit(out, {"type": "byzfl_missing", "threads": threads, "error": f"{type(exc).__name__}: {exc}"})
    emit(out, {"type": "check", "threads": threads,
                **check_equivalence(task, dataset, phalanx, runners.get("byzfl"))})
    for _ in range(args.warmup):
        for r in runners.values():
            r.round()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for k, r in runners.items():
            times[k].append(r.round())
    for k, r in runners.items():
        emit(out, {"type": "row", "impl": k, "threads": threads, "median_s": statistics.median(times[k]),
                    "times": times[k], "timed_rounds": len(times[k]), "rounds_run": r.rounds,
                    "test_accuracy": r.accuracy(dataset)})
    emit(out, {"type": "env_end", "part": "inprocess", "threads": threads, "load_end": os.getloadavg()[0]})



# ---------------------------------------------------------------------------------------------------------------
# Flower (its own process: one run_simulation)
# ---------------------------------------------------------------------------------------------------------------

def run_flower(args: argparse.Namespace, out: str) -> None:
    """Both Flower strategies in one ``run_simulation``; JSON records to ``out``."""
    home = Path(args._ray).with_name(Path(args._ray).name + "-flwr-home")
    os.environ["FLWR_HOME"] = str(home)  # ~/.flwr stays untouched
    import torch

    import _bench_federated_flower as fl

    task: Task = args.task
    emit(out, {"type": "env", "part": "flower", "threads": args.ray_cpus, "load_start": os.getloadavg()[0],
                "flwr": package_version("flwr"), "ray": package_version("ray"), "torch": torch.__version__})
    settings = {**asdict(task), "beta": task.beta, "warmup": args.flower_warmup, "blocks": args.flower_blocks,
                "block_rounds": args.flower_block_rounds, "ray_cpus": args.ray_cpus}
    result = fl.run(settings, args._ray)
    if not result.get("strategies"):
        raise RuntimeError("the ServerApp did not finish (see the log above)")
    for name, rec in result["strategies"].items():
        emit(out, {"type": "row", "impl": name, "threads": args.ray_cpus,
                    "median_s": statistics.median(rec["intervals"]) if rec["intervals"] else None,
                    "times": rec["intervals"], "timed_rounds": len(rec["intervals"]), "rounds_run": rec["rounds"],
                    "test_accuracy": rec["test_accuracy"], "agg_median_s": statistics.median(rec["agg_s"]),
                    "replies": sorted(set(rec["replies"])),
                    "client_median_s": statistics.median(rec["client_s"]) if rec["client_s"] else None})
    emit(out, {"type": "flower", "warmup_s": result["warmup_s"], "wall_s": result["wall_s"]})
    emit(out, {"type": "env_end", "part": "flower", "threads": args.ray_cpus, "load_end": os.getloadavg()[0]})



# ---------------------------------------------------------------------------------------------------------------
# Memory: ResNet-20, many clients
# ---------------------------------------------------------------------------------------------------------------

def run_memory(args: argparse.Namespace, out: str) -> None:
    """Phalanx FedAvg on ResNet-20 with ``--_per-round`` clients per round; peak RSS and seconds per round."""
    from phalanx.training.memory import tune_allocator

    malloc = tune_allocator()
    import torch

    torch.set_num_threads(all_threads())
    from phalanx.data.base import Dataset
    from phalanx.experiments import from_config, make_config
    from phalanx.training import Loop

    mt: MemoryTask = args.memory_task
    per_round = int(args._per_round)
    rss_start = _rss_bytes()
    gen = torch.Generator().manual_seed(SEED)
    ds = Dataset.from_tensors(
        "cifar10-shaped", torch.randn(mt.n_train, 3, 32, 32, generator=gen),
        torch.randint(0, 10, (mt.n_train,), generator=gen), torch.randn(mt.n_test, 3, 32, 32, generator=gen),
        torch.randint(0, 10, (mt.n_test,), generator=gen), num_classes=10, source="synthetic N(0, 1)",
    )
    never = 10**9
    f = max(1, per_round // 10)
    cfg = make_config({
        "algorithm": "fedavg", "dataset": "cifar10", "model": "resnet20", "workers": mt.clients,
        "clients_per_round": per_round, "local_steps": mt.local_steps, "batch_size": mt.batch, "lr": 0.05,
        "momentum": 0.0, "aggregator": "cwtm", "f": f, "byzantine": 0, "attack": "none", "partition": "iid",
        "seed": SEED, "rounds": never, "eval_every": never,
    })
    exp = from_config(cfg, ds)
    loop = Loop(exp)
    loop.open()
    rss_ready = _rss_bytes()
    base = {"type": "memory", "clients": mt.clients, "per_round": per_round, "local_steps": mt.local_steps,
            "batch": mt.batch, "f": f, "dim": exp.problem.dim, "threads": torch.get_num_threads(),
            "malloc": malloc, "torch": torch.__version__, "rss_start": rss_start, "rss_ready": rss_ready,
            "load_start": os.getloadavg()[0]}
    times: list[float] = []
    peaks: list[int] = []
    for _ in range(mt.rounds):
        t0 = time.perf_counter()
        loop.step()
        times.append(time.perf_counter() - t0)
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB on Linux
        finite = bool(torch.isfinite(loop.state.theta).all())
        emit(out, {**base, "times": times, "peaks": peaks, "peak_rss": peaks[-1], "rss_end": _rss_bytes(),
                    "finite": finite, "load_end": os.getloadavg()[0]})

