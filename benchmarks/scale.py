"""A federated run over 10³ and over 10⁶ clients: peak memory and round time, as ratios (measured, not asserted).

    .venv/bin/python benchmarks/scale.py [--populations 1000,1000000] [--per-round 100] [--rounds 10]
                                         [--warm-up 3] [--local-steps 5] [--threads 1] [--device cpu]

Each population size runs in a fresh interpreter (so that one's peak resident memory is not the other's): FedProx's
synthetic(0.5, 0.5) population (``phalanx.data.population.SyntheticPopulation``, 100 evaluation clients), 10 % of
it Byzantine running ALIE, ``--per-round`` clients a round, ``--local-steps`` local steps of batch 10, multinomial
logistic regression, the trimmed mean for f = 10 % of the round. It runs ``--warm-up`` rounds, then ``--rounds``
rounds timed one by one (the median is printed), then reads its peak resident set size (:func:`peak_rss`: the whole
process, the interpreter and torch included). The two ratios printed — peak RSS at the largest population ÷ at the
smallest, median round time likewise — are the scaling claims of docs/federated.md (target ≤ 1.5× each).

``--device cuda``: the rounds compute on CUDA (``Experiment(device=...)``), each round ends with
``torch.cuda.synchronize``, and the peak device memory (``torch.cuda.max_memory_allocated``) is read beside the peak
RSS. ``benchmarks/gpu.py --workload population`` runs the same children through :func:`run_populations`.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _subprocess import run_worker


def peak_rss() -> int:
    """Bytes of this process's peak resident set: ``VmHWM`` of ``/proc/self/status`` where there is one, else
    ``ru_maxrss``. Not ``ru_maxrss`` first: Linux carries it across ``fork`` and ``exec``, so a child started by a
    large parent (``benchmarks/gpu.py`` after its rules workload: 2.9 GiB) reported the parent's peak as its own;
    ``VmHWM`` belongs to the memory map that ``exec`` made afresh."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def child(population: int, per_round: int, rounds: int, warm_up: int, local_steps: int, out: str,
          device: str = "cpu") -> None:
    """One population size in this process, its rounds on ``device``; its numbers written to ``out`` as JSON."""
    import torch

    from phalanx import aggregators, attacks, models
    from phalanx.data.population import SyntheticPopulation
    from phalanx.training import Experiment
    from phalanx.training.algorithms.fedavg import FedAvg
    from phalanx.training.loop import Callback, Evaluate, Loop

    pop = SyntheticPopulation(0.5, 0.5, seed=0)
    times: list[float] = []

    class Clock(Callback):
        def __init__(self) -> None:
            self.last = time.perf_counter()

        def on_round(self, loop: Loop, info: object) -> None:
            if cuda:
                torch.cuda.synchronize(exp.device)
            now = time.perf_counter()
            if loop.state.round > warm_up:
                times.append(now - self.last)
            self.last = now

    total = warm_up + rounds
    cuda = device.startswith("cuda")
    exp = Experiment(
        model=models.make("logreg", pop.input_shape, pop.num_classes, generator=torch.Generator().manual_seed(0)),
        dataset=pop, workers=population, byzantine=population // 10, rule=aggregators.make("cwtm", f=per_round // 10),
        attack=attacks.make("alie"), rounds=total, eval_every=total, lr=1.0,
        algorithm=FedAvg(clients_per_round=per_round, local_steps=local_steps, batch_size=10, lr=0.05),
        device=device,
    )
    clock = Clock()
    Loop(exp, None, [Evaluate(), clock]).run()
    rss = peak_rss()
    peak = torch.cuda.max_memory_allocated(exp.device) if cuda else None
    Path(out).write_text(json.dumps({"population": population, "rss": rss, "median": statistics.median(times),
                                     "min": min(times), "max": max(times), "held": exp.data.held,
                                     "device": str(exp.device), "device_peak": peak}))


def run_populations(sizes: list[int], per_round: int, rounds: int, warm_up: int, local_steps: int, threads: int,
                    device: str = "cpu", timeout: float = 3600) -> list[dict[str, Any]]:
    """Each population size in a fresh interpreter (:func:`child`); their records, in order. A child that fails
    raises ``RuntimeError`` naming its population."""
    got = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            out = str(Path(tmp) / f"{n}.json")
            cmd = [sys.executable, __file__, "--child", str(n), "--out", out, "--per-round", str(per_round),
                   "--rounds", str(rounds), "--warm-up", str(warm_up), "--local-steps", str(local_steps),
                   "--device", device]
            err = run_worker(cmd, threads, timeout=timeout)
            if err:
                raise RuntimeError(f"population {n}: {err}")
            got.append(json.loads(Path(out).read_text()))
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--populations", default="1000,1000000")
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warm-up", type=int, default=3)
    p.add_argument("--local-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="where the rounds compute: cpu, cuda, cuda:N")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        child(a.child, a.per_round, a.rounds, a.warm_up, a.local_steps, a.out, a.device)
        return
    sizes = [int(s) for s in a.populations.split(",")]
    try:
        got = run_populations(sizes, a.per_round, a.rounds, a.warm_up, a.local_steps, a.threads, a.device)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None
    print(f"{'clients':>10} {'peak RSS MB':>12} {'round ms (median)':>18} {'min':>8} {'max':>8}")
    for r in got:
        print(f"{r['population']:>10,} {r['rss'] / 2**20:>12.1f} {1e3 * r['median']:>18.1f} {1e3 * r['min']:>8.1f} "
              f"{1e3 * r['max']:>8.1f}")
    lo, hi = got[0], got[-1]
    print(f"peak RSS  {hi['population']:,} ÷ {lo['population']:,}: {hi['rss'] / lo['rss']:.3f}×")
    print(f"round time {hi['population']:,} ÷ {lo['population']:,}: {hi['median'] / lo['median']:.3f}× "
          f"(median of {a.rounds} rounds each, {a.per_round} clients a round, {a.local_steps} local steps)")


if __name__ == "__main__":
    main()
