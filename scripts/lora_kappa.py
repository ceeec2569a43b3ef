"""Issue 35 item 2: each LoRA mode's κ in the space of the layers' updates — a measured lower bound beside the proven
one (``phalanx.analysis.lora_kappa``).

    python scripts/lora_kappa.py [--rules cwtm cwmed krum] [--n 7] [--f 2] [--budget 400] [--seed 0] [--epsilon]

Prints one markdown row per rule and mode (``factors``, ``update`` before the truncation, ``update-truncated``,
``shared``) on two adapted layers (3 × 4 and 5 × 4) of rank 2: the rule's own proven κ, the κ proven in ΔW space, the
certified measured lower bound, the input that attained it, and the verdict; ``--epsilon``: the same for ε (S = every
row). One torch thread.
"""

from __future__ import annotations

import argparse
import math

import torch

from phalanx import aggregators
from phalanx.analysis.lora_kappa import MEASURED_MODES, lora_kappa, proven


def _fmt(v: float | None) -> str:
    if v is None:
        return "none"
    return "+∞" if math.isinf(v) else f"{v:.4g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", nargs="+", default=["cwtm", "cwmed", "krum"])
    ap.add_argument("--n", type=int, default=7)
    ap.add_argument("--f", type=int, default=2)
    ap.add_argument("--budget", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epsilon", action="store_true", help="measure ε (S = every row) instead of κ")
    args = ap.parse_args()
    quantity, sym = ("epsilon", "ε") if args.epsilon else ("kappa", "κ")
    floor = args.f / (args.n - args.f) if args.epsilon else args.f / (args.n - 2 * args.f)
    torch.set_num_threads(1)
    print(f"n = {args.n}, f = {args.f}, layers (d_out × d_in) 3 × 4 and 5 × 4, rank 2, budget {args.budget}, "
          f"seed {args.seed}; {sym} ≥ {floor:.4g} for every (f, κ)-robust rule")
    print()
    print(f"| rule | mode | rule's proven {sym} | proven {sym} in ΔW space | measured lower bound | attained at "
          "| verdict |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.rules:
        rule = aggregators.make(spec, f=args.f)
        for mode in MEASURED_MODES:
            k = lora_kappa(rule, mode, n=args.n, budget=args.budget, seed=args.seed, quantity=quantity)
            own = proven(rule, "update", args.n, quantity)
            # an ε taken from κ (Theorem 3.2: an (f, κ)-robust rule is κ-accurate) is an upper bound, shown as such
            via_kappa = args.epsilon and rule.epsilon(args.n) is None and own is not None

            def shown(v: float | None, via: bool = via_kappa) -> str:
                return f"≤ {_fmt(v)} (κ)" if via and v is not None else _fmt(v)

            print(f"| {spec} | {mode} | {shown(own)} | {shown(k.proven)} | {_fmt(k.value)} | "
                  f"{k.construction} | {k.verdict} |")


if __name__ == "__main__":
    main()
