"""Whole training rounds under the ``subnormal`` attack against the same rounds with no attack.

    PYTHONPATH=src .venv/bin/python benchmarks/subnormal_training.py [--threads 1] [--hidden 1500] [--rounds 12]
        [--rules mean,cwtm,krum,geomed,nnm>cwtm,mda] [--workers 20] [--off]

``benchmarks/subnormal_rules.py`` times each rule alone; this times what the server does in a whole round, the rule
and everything around it (the workers' gradients, the attack, the model update, the round's bookkeeping): the
built-in digits data (no network), an MLP with one hidden layer of ``--hidden`` units (d = 65·H + 10(H + 1)
parameters: about 10⁵ at the default), ``--workers`` workers of which a fifth are Byzantine and f = that number,
batch 32, learning rate 0.1, momentum 0.9, seed 0, no evaluation. For each rule, three runs alternate round by round
— ``attack = "none"`` and ``"subnormal"`` with ``values = "subnormal"`` and ``"near"`` (docs/attacks.md) — after
two warm-up rounds each; each prints its median round time less the attack's own time (the Byzantine workers'
computation, which the simulator runs inside the round and a real server does not) and the ratio to the no-attack
run, then the median of the whole rounds' ratios. A ratio near 1 means the Byzantine workers cannot slow the
server's round through subnormal arithmetic; the rules that count subnormals as 0 (``subnormals_as_zero``,
docs/aggregators.md, "Behaviour under attack") are marked; ``--off`` switches that convention off on the runs'
rule instances (the components as they computed before it), which shows what the rounds cost without it. Times are
measured lower bounds under whatever load the machine has; print ``uptime`` beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from phalanx.aggregators import registry
from phalanx.attacks.base import Attack

_ATTACK_SECONDS = [0.0]
"""The attack's own time so far: the Byzantine workers' computation, which the simulator runs in the round but a
real server does not (every worker computes its own vector)."""
_untimed_call = Attack.__call__


def _timed_call(self: Attack, ctx: Any) -> Any:
    t0 = time.perf_counter()
    try:
        return _untimed_call(self, ctx)
    finally:
        _ATTACK_SECONDS[0] += time.perf_counter() - t0


Attack.__call__ = _timed_call  # type: ignore[method-assign]


def _runner(rule: str, attack: str, params: dict[str, Any], args: argparse.Namespace) -> Any:
    from phalanx.experiments import from_config, make_config
    from phalanx.training import Loop

    byzantine = args.workers // 5
    never = 10**9  # no round evaluates
    cfg = make_config({
        "dataset": "digits", "model": "mlp", "model_params": {"hidden": [args.hidden]}, "workers": args.workers,
        "byzantine": byzantine, "f": byzantine, "aggregator": rule, "attack": attack, "attack_params": params,
        "partition": "iid", "batch_size": 32, "lr": 0.1, "momentum": 0.9, "seed": 0, "rounds": never,
        "eval_every": never,
    })
    exp = from_config(cfg)
    if args.off:  # the components as they computed before flush-to-zero
        for component in [exp.rule, *getattr(exp.rule, "pre", [])]:
            component.subnormals_as_zero = False
    loop = Loop(exp)
    loop.open()
    return loop


def _flagged(rule: str) -> bool:
    return any(registry.get_class(name).subnormals_as_zero for name, _ in registry.parse_spec(rule))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, choices=range(1, 65), metavar="T", help="1..64 (default 1)")
    parser.add_argument("--hidden", type=int, default=1500, choices=range(1, 20001), metavar="H",
                        help="hidden units, 1..20000 (default 1500)")
    parser.add_argument("--rounds", type=int, default=12, choices=range(1, 501), metavar="K",
                        help="timed rounds per run, 1..500 (default 12)")
    parser.add_argument("--workers", type=int, default=20, choices=range(5, 1001), metavar="N",
                        help="workers, 5..1000 (default 20)")
    parser.add_argument("--rules", default="mean,cwtm,krum,geomed,nnm>cwtm,mda",
                        help="comma-separated rules or chains (default: mean,cwtm,krum,geomed,nnm>cwtm,mda)")
    parser.add_argument("--off", action="store_true", help="switch flush-to-zero off on the rules (as before it)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kinds = {"none": ("none", {}), "subnormal": ("subnormal", {"values": "subnormal"}),
             "near": ("subnormal", {"values": "near"})}
    d = 65 * args.hidden + 10 * (args.hidden + 1)
    print(f"{args.threads} thread(s); digits, MLP hidden {args.hidden} (d = {d:,}), {args.workers} workers, "
          f"{args.workers // 5} Byzantine; median of {args.rounds} rounds after 2 warm-up rounds"
          + ("; flush-to-zero switched off" if args.off else ""))
    print("each cell: the round less the attack's own time, and its ratio to no attack; last: whole rounds' ratios")
    print(f"{'rule':<12} {'flushes':<8} {'none':>10} {'subnormal':>18} {'near':>18}   whole rounds")
    for rule in [r.strip() for r in args.rules.split(",") if r.strip()]:
        loops = {k: _runner(rule, attack, params, args) for k, (attack, params) in kinds.items()}
        server: dict[str, list[float]] = {k: [] for k in kinds}
        whole: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds + 2):
            for k, loop in loops.items():
                _ATTACK_SECONDS[0] = 0.0
                t0 = time.perf_counter()
                loop.step()
                if r >= 2:
                    whole[k].append(time.perf_counter() - t0)
                    server[k].append(whole[k][-1] - _ATTACK_SECONDS[0])
        med = {k: statistics.median(v) for k, v in server.items()}
        cells = [f"{med[k] * 1e3:7.1f} ms {med[k] / med['none']:5.2f}x" for k in ("subnormal", "near")]
        ratios = [statistics.median(whole[k]) / statistics.median(whole["none"]) for k in ("subnormal", "near")]
        flushes = "no" if args.off or not _flagged(rule) else "yes"
        print(f"{rule:<12} {flushes:<8} {med['none'] * 1e3:7.1f} ms {cells[0]:>18} "
              f"{cells[1]:>18}   {ratios[0]:.2f}x / {ratios[1]:.2f}x")


if __name__ == "__main__":
    main()
