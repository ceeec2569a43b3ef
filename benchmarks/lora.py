"""One round of LoRA adapter aggregation per mode (docs/lora.md, "Three aggregation modes"): time and peak memory of
the rule on the factors, on each layer's update (re-factorised by a truncated SVD), and on B alone, beside the mean.

    python benchmarks/lora.py [--hidden 512] [--layers 8] [--r 8] [--workers 20 50] [--rules mean cwtm] [--threads 1]

Beside each time, its ratio to the mean's in the same mode (what robustness costs there) and to the same rule's in
mode ``factors`` (what the mode costs: ``update``'s per-layer truncated SVD).

The adapters are laid out as ``peft`` lays them out on a BERT of the given size (``query`` and ``value`` adapted, a
2-class head; peft's parameter names, so the layout is the one a run reads). The frozen base is counted on a
``meta``-device copy (no weights allocated): it is not aggregated, and a run holds it once per process
(tests/test_lora.py). Each (mode, rule,
workers) runs in a fresh child process: its time is the median of ``--repeat`` calls, ``+peak`` the growth of the
process's peak resident set (``VmHWM``, reset first) during the calls, beyond what it held before them (imports, θ
and the rows); Linux only. Times on
a shared machine are what that machine gave, not the code's floor.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, statistics, sys, time, torch
from phalanx import aggregators
from phalanx.aggregators.lora import AdapterUpdates, LoraLayout
hidden, layers, r, n, mode, rule_name, repeat, threads = sys.argv[1:9]
hidden, layers, r, n, repeat = int(hidden), int(layers), int(r), int(n), int(repeat)
torch.set_num_threads(int(threads))


def status(key):  # kB, from /proc/self/status (Linux)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0
names, shapes = [], []
for i in range(layers):
    for m in ("query", "value"):
        names += [f"l{i}.{m}.lora_A.default.weight", f"l{i}.{m}.lora_B.default.weight"]
        shapes += [(r, hidden), (hidden, r)]
names += ["classifier.weight", "classifier.bias"]
shapes += [(2, hidden), (2,)]
if mode == "shared":  # A frozen: only B and the head travel
    keep = [i for i, name in enumerate(names) if ".lora_A." not in name]
    names, shapes = [names[i] for i in keep], [shapes[i] for i in keep]
layout = LoraLayout.of(names, shapes)
g = torch.Generator().manual_seed(0)
theta = torch.randn(layout.dim, generator=g) * 0.02
x = torch.randn(n, layout.dim, generator=g) * 0.01
f = max(0, (n - 1) // 5)
rule = aggregators.make(rule_name, f=f)
call = (lambda: AdapterUpdates(rule, layout)(x, theta=theta)) if mode == "update" else (lambda: rule(x))
with open("/proc/self/clear_refs", "w") as fh:  # the peak resident set starts again from the current one
    fh.write("5")
before = status("VmRSS")  # imports, θ and the rows
call()
times = []
for _ in range(repeat):
    t = time.perf_counter()
    call()
    times.append(time.perf_counter() - t)
after = status("VmHWM")
print(json.dumps({"dim": layout.dim, "ms": statistics.median(times) * 1e3, "rows_mb": x.numel() * 4 / 2**20,
                  "growth_mb": (after - before) / 1024}))
"""


def base_parameters(hidden: int, layers: int) -> int:
    """Parameters of the frozen base: a BERT of that size built on the ``meta`` device (no weights allocated)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                     intermediate_size=4 * hidden)
    with torch.device("meta"):
        model = BertForSequenceClassification(cfg)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[20, 50])
    parser.add_argument("--rules", nargs="+", default=["mean", "cwtm"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each child")
    args = parser.parse_args(argv)
    print(f"base: BERT hidden {args.hidden}, {args.layers} layers = {base_parameters(args.hidden, args.layers):,} "
          f"frozen parameters; adapters r = {args.r} on query, value")
    print(f"{'mode':8} {'rule':6} {'n':>4} {'d':>9} {'ms':>9} {'× mean':>8} {'× factors':>9} {'rows MB':>8} "
          f"{'+peak MB':>8}")
    for n in args.workers:
        ms: dict[tuple[str, str], float] = {}
        for mode in ("factors", "update", "shared"):
            for rule in args.rules:
                child = [str(v) for v in (args.hidden, args.layers, args.r, n, mode, rule, args.repeat, args.threads)]
                out = subprocess.run([sys.executable, "-c", CHILD, *child], capture_output=True, text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                ms[mode, rule] = got["ms"]
                print(f"{mode:8} {rule:6} {n:4d} {got['dim']:9d} {got['ms']:9.1f} "
                      f"{ratio(got['ms'], ms.get((mode, 'mean'))):>8} {ratio(got['ms'], ms.get(('factors', rule))):>9} "
                      f"{got['rows_mb']:8.1f} {got['growth_mb']:8.0f}")


def ratio(ms: float, baseline: float | None) -> str:
    """``ms`` over the baseline's time (the mean in the same mode; the same rule in mode ``factors``), or ``—``."""
    return "—" if not baseline else f"{ms / baseline:.1f}×"


if __name__ == "__main__":
    main()
