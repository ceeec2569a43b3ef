"""A federated run over 10³ and over 10⁶ clients: peak memory and round time, as ratios (measured, not asserted).

    .venv/bin/python benchmarks/scale.py [--populations 1000,1000000] [--per-round 100] [--rounds 10]
                                         [--warm-up 3] [--local-steps 5] [--threads 1]

Each population size runs in a fresh interpreter (so that one's peak resident memory is not the other's): FedProx's
synthetic(0.5, 0.5) population (``phalanx.data.population.SyntheticPopulation``, 100 evaluation clients), 10 % of
it Byzantine running ALIE, ``--per-round`` clients a round, ``--local-steps`` local steps of batch 10, multinomial
logistic regression, the trimmed mean for f = 10 % of the round. It runs ``--warm-up`` rounds, then ``--rounds``
rounds timed one by one (the median is printed), then reads its peak resident set size (``ru_maxrss``: the whole
process, the interpreter and torch included). The two ratios printed — peak RSS at the largest population ÷ at the
smallest, median round time likewise — are the scaling claims of docs/federated.md (target ≤ 1.5× each).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _subprocess import run_worker


def child(population: int, per_round: int, rounds: int, warm_up: int, local_steps: int, out: str) -> None:
    """One population size in this process; its numbers written to ``out`` as JSON."""
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
            now = time.perf_counter()
            if loop.state.round > warm_up:
                times.append(now - self.last)
            self.last = now

    total = warm_up + rounds
    exp = Experiment(
        model=models.make("logreg", pop.input_shape, pop.num_classes, generator=torch.Generator().manual_seed(0)),
        dataset=pop, workers=population, byzantine=population // 10, rule=aggregators.make("cwtm", f=per_round // 10),
        attack=attacks.make("alie"), rounds=total, eval_every=total, lr=1.0,
        algorithm=FedAvg(clients_per_round=per_round, local_steps=local_steps, batch_size=10, lr=0.05),
    )
    clock = Clock()
    Loop(exp, None, [Evaluate(), clock]).run()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    Path(out).write_text(json.dumps({"population": population, "rss": rss, "median": statistics.median(times),
                                     "min": min(times), "max": max(times), "held": exp.data.held}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--populations", default="1000,1000000")
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warm-up", type=int, default=3)
    p.add_argument("--local-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        child(a.child, a.per_round, a.rounds, a.warm_up, a.local_steps, a.out)
        return
    sizes = [int(s) for s in a.populations.split(",")]
    got = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            out = str(Path(tmp) / f"{n}.json")
            cmd = [sys.executable, __file__, "--child", str(n), "--out", out, "--per-round", str(a.per_round),
                   "--rounds", str(a.rounds), "--warm-up", str(a.warm_up), "--local-steps", str(a.local_steps)]
            err = run_worker(cmd, a.threads, timeout=3600)
            if err:
                raise SystemExit(f"population {n}: {err}")
            got.append(json.loads(Path(out).read_text()))
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
