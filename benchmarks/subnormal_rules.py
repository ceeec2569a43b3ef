"""Every rule and pre-aggregator on Byzantine rows of subnormal or tiny values, against honest rows.

    PYTHONPATH=src .venv/bin/python benchmarks/subnormal_rules.py [--threads 1] [--n 20] [--d 50000] [--reps 5]
        [--rules krum,nnm,...] [--flagged] [--off]

On x86 CPUs arithmetic on subnormal numbers (non-zero, below the dtype's smallest normal: 1.2e-38 in float32) goes
through a microcode assist, tens of times slower. A Byzantine worker can send such rows at no cost to itself. This
prints, for each rule (pre-aggregators chained before ``cwtm``, which is not slowed), its time on honest float32
Gaussian rows and on the same rows with the f = n/5 first replaced by

- *subnormal* rows: uniform in [0, 1e-39) (subnormal float32);
- *near* rows: ±1.5e-38 with random signs (normal, just above the smallest normal: their products with honest
  entries below 1 are subnormal);
- *tiny* rows: the honest rows times 1e-30 (normal, their products with each other underflow);

with the ratio to the honest time, and whether the rule computes with flush-to-zero on the CPU
(``subnormals_as_zero``, :mod:`phalanx.aggregators._subnormals`). For those rules the last column is what the
convention costs on honest rows: their time with it against their time with it switched off on the instance.
The inputs alternate, ``--reps`` times, medians; one process, seed 0. A stateful rule (FLDetector: it scores the
workers once its window of rounds is full) is then run again, fresh for each input and with the switch on and
off, for ``--rounds`` rounds; the median of its last five rounds is printed. Times are measured lower bounds under
whatever load the machine has; print ``uptime`` beside them. ``--off`` switches the convention off on every
instance (the components as they computed before it).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from phalanx.aggregators import registry
from phalanx.aggregators.base import Aggregator


def _timed(call: Callable[[torch.Tensor], object], x: torch.Tensor) -> float:
    y = x.clone()
    t0 = time.perf_counter()
    call(y)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, choices=range(1, 65), metavar="T", help="1..64 (default 1)")
    parser.add_argument("--n", type=int, default=20, choices=range(5, 1001), metavar="N", help="rows, 5..1000")
    parser.add_argument("--d", type=int, default=50_000, choices=range(16, 10**7 + 1), metavar="D",
                        help="columns, 16..10^7")
    parser.add_argument("--reps", type=int, default=5, choices=range(1, 101), metavar="R", help="1..100 (default 5)")
    parser.add_argument("--rules", default="", help="comma-separated registry names (default: all)")
    parser.add_argument("--flagged", action="store_true", help="only the components that count subnormals as 0")
    parser.add_argument("--off", action="store_true", help="switch the convention off everywhere (as before it)")
    parser.add_argument("--rounds", type=int, default=16, choices=range(0, 201), metavar="K",
                        help="rounds of each stateful rule, 0..200 (default 16; 0: skip)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, d, f = args.n, args.d, args.n // 5
    g = torch.Generator().manual_seed(0)
    honest = torch.randn(n, d, generator=g)
    subnormal = honest.clone()
    subnormal[:f] = torch.rand(f, d, generator=g) * 1e-39
    near = honest.clone()
    near[:f] = (torch.randint(0, 2, (f, d), generator=g) * 2 - 1) * 1.5e-38
    tiny = honest.clone()
    tiny[:f] = honest[:f] * 1e-30
    inputs = {"honest": honest, "subnormal": subnormal, "near": near, "tiny": tiny}
    print(f"{args.threads} thread(s), n = {n}, d = {d}, f = {f}, float32, medians of {args.reps}")
    print(f"{'rule':22s} {'honest':>10s} {'subnormal rows':>21s} {'near rows':>21s} {'tiny rows':>21s}  "
          "subnormals as 0 (cost)")
    chosen = [r.strip() for r in args.rules.split(",") if r.strip()] or registry.names()
    unknown = sorted(set(chosen) - set(registry.names()))
    if unknown:
        parser.error(f"--rules: unknown {', '.join(unknown)}; allowed: {', '.join(registry.names())}")
    if args.flagged:
        chosen = [r for r in chosen if registry.get_class(r).subnormals_as_zero]
    for name in chosen:
        spec = name if name in registry.names("rule") else f"{name}>cwtm"
        rule = registry.make(spec, f)
        context: dict[str, torch.Tensor] = {"reference": honest[f:].mean(0)} if "reference" in rule.context_keys else {}

        def call(x: torch.Tensor, rule: Aggregator = rule, context: dict[str, torch.Tensor] = context) -> object:
            return rule(x, **context)

        try:
            call(honest.clone())
        except Exception as exc:  # a rule this generic set-up cannot drive: say so, never hide it
            print(f"{spec:22s} not run: {type(exc).__name__}: {str(exc)[:70]}")
            continue
        flagged = [c for c in [rule, *getattr(rule, "pre", [])] if c.subnormals_as_zero]
        if args.off:
            for c in flagged:
                c.subnormals_as_zero = False
            flagged = []
        times: dict[str, list[float]] = {k: [] for k in [*inputs, "honest, convention off"]}
        for _ in range(args.reps):
            for k, x in inputs.items():
                times[k].append(_timed(call, x))
            if flagged:
                for c in flagged:
                    c.subnormals_as_zero = False
                times["honest, convention off"].append(_timed(call, honest))
                for c in flagged:
                    c.subnormals_as_zero = True
        med = {k: statistics.median(v) for k, v in times.items() if v}
        cells = [f"{med[k] * 1e3:8.2f} ms ({med[k] / med['honest']:5.1f}x)" for k in ("subnormal", "near", "tiny")]
        cost = f"yes ({med['honest'] / med['honest, convention off']:.2f}x)" if flagged else "no"
        print(f"{spec:22s} {med['honest'] * 1e3:7.2f} ms {cells[0]:>21s} {cells[1]:>21s} {cells[2]:>21s}  {cost}")

    for name in chosen:
        if not getattr(registry.get_class(name), "stateful", False) or args.rounds == 0:
            continue
        cells = []
        for switch in (False,) if args.off else (True, False):
            for k, x in inputs.items():
                rule = registry.make(name, f)
                rule.subnormals_as_zero = switch
                last = [_timed(rule, x) for _ in range(args.rounds)][-5:]
                cells.append(f"{k} {statistics.median(last) * 1e3:.2f} ms")
            print(f"{name} (stateful, last 5 of {args.rounds} rounds, switch {'on' if switch else 'off'}): "
                  + "; ".join(cells[-len(inputs):]))


if __name__ == "__main__":
    main()
