"""FedBuff's simulated server step at a git revision (A) against the working tree's (B), with the synchronous round,
in one process.

    .venv/bin/python benchmarks/asynchronous_ab.py [--ref main] [--workers N] [--buffer K] [--steps S] [--repeats R]

The setting is :mod:`benchmarks.asynchronous`'s (n = 1,000 workers, MLP 64-100-10 on digits, batch 32, the mean,
one thread): three loops — sync (FedAvg, K clients, one local step), FedBuff with the step's code at ``--ref``, FedBuff
with the working tree's — take turns step by step (A and B alternate which goes first), each step timed with
``time.process_time``; per repeat, the median of ``--steps`` steps of each, the ratios fedbuff / sync per processed
update (both aggregate K updates a step), and B − A. At the end the two FedBuff runs' θ must be equal (the change
must not change the run).

How A runs: the revision's ``clock.py``, ``asynchronous.py`` and ``fedbuff.py`` of
``src/phalanx/training/algorithms`` are executed as modules of their own, and the step's methods of ``Clock``,
``AsyncWorkers`` and ``FedBuff`` (those that do not call ``super()``) are swapped into the classes before each of
A's steps (A's clock makes the revision's own ``Step``) — so A is the revision's step code over the working tree's
everything else (loop, server, rule, gradients). A change to other modules the step calls is not measured by this.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from asynchronous import build

MODULES = {"clock": ("Clock",), "asynchronous": ("AsyncWorkers",), "fedbuff": ("FedBuff",)}


def revision_methods(ref: str) -> dict[tuple[type, str], Any]:
    """The step's methods as ``ref`` wrote them, keyed by (working-tree class, name)."""
    from phalanx.training.algorithms import asynchronous, base, clock, fedbuff

    current = {"clock": clock, "asynchronous": asynchronous, "fedbuff": fedbuff}
    out: dict[tuple[type, str], Any] = {}
    register = base.register
    base.register = lambda cls: cls  # (the revision's FedBuff is not registered again)
    try:
        for name, classes in MODULES.items():
            path = f"{ref}:src/phalanx/training/algorithms/{name}.py"
            src = subprocess.run(["git", "show", path], capture_output=True, text=True, check=True).stdout
            module = types.ModuleType(f"_revision_{name}")
            sys.modules[module.__name__] = module
            exec(compile(src, path, "exec"), module.__dict__)
            ns = module.__dict__
            for key, value in list(ns.items()):  # every other class is the working tree's (isinstance holds)
                if isinstance(value, type) and key not in classes and hasattr(current[name], key):
                    ns[key] = getattr(current[name], key)
            for cname in classes:
                for attr, value in vars(ns[cname]).items():
                    if isinstance(value, types.FunctionType) and "__class__" not in value.__code__.co_freevars:
                        out[(getattr(current[name], cname), attr)] = value
    finally:
        base.register = register
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--ref", default="main", help="the git revision of A (default: main)")
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--buffer", type=int, default=10, help="K: FedBuff's buffer, sync's clients per round")
    ap.add_argument("--steps", type=int, default=301, help="timed steps of each loop per repeat")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    old = revision_methods(args.ref)
    new = {key: key[0].__dict__.get(key[1]) for key in old}

    def use(methods: dict[tuple[type, str], Any]) -> None:
        for (cls, name), fn in methods.items():
            if fn is None:
                delattr(cls, name)  # (a method the working tree's class does not define: its base's)
            else:
                setattr(cls, name, fn)

    use(old)
    a = build(args.workers, args.buffer, "fedbuff")
    use(new)
    b, sync = build(args.workers, args.buffer, "fedbuff"), build(args.workers, args.buffer, "sync")
    for _ in range(5):  # warm-up
        sync.step()
        use(old)
        a.step()
        use(new)
        b.step()
    print(f"n = {args.workers}, K = {args.buffer}, one thread; A = {args.ref}, B = the working tree; medians of "
          f"{args.steps} steps each per repeat, taking turns")
    print("| repeat | sync | fedbuff A | fedbuff B | A / sync | B / sync | B − A |")
    print("|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.repeats):
        times: dict[str, list[float]] = {"sync": [], "A": [], "B": []}
        for i in range(args.steps):
            t0 = time.process_time()
            sync.step()
            times["sync"].append(time.process_time() - t0)
            for name in (("A", "B") if i % 2 else ("B", "A")):
                use(old if name == "A" else new)
                loop = a if name == "A" else b
                t0 = time.process_time()
                loop.step()
                times[name].append(time.process_time() - t0)
        m = {k: statistics.median(v) * 1e6 / args.buffer for k, v in times.items()}  # per processed update
        ratios["A"].append(m["A"] / m["sync"])
        ratios["B"].append(m["B"] / m["sync"])
        print(f"| {r + 1} | {m['sync']:.1f} µs | {m['A']:.1f} µs | {m['B']:.1f} µs | {ratios['A'][-1]:.3f} | "
              f"{ratios['B'][-1]:.3f} | {m['B'] - m['A']:+.1f} µs |")
    use(new)
    print(f"median over repeats: A / sync {statistics.median(ratios['A']):.3f}, "
          f"B / sync {statistics.median(ratios['B']):.3f}")
    if not torch.equal(a.state.theta, b.state.theta):
        print("A and B ended on different θ: the change changed the run")
        return 1
    print("A and B ended on the same θ (bit for bit)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
