"""What the asynchronous filters' guarantees become against an attacker who knows their test (docs/async.md).

Runs docs/async.md's filter setting — digits, logreg, n = 10, b = 2 always-first Byzantine workers (half of every
buffer), FedBuff's K = 4 and the mean, 30 server steps, lr 0.5 constant, 1 thread — for Kardam (``filter_f = 2``),
Zeno++ and AFLGuard at their defaults, under no attack, the plain ``signflip(scale=10)`` and the filter-adaptive
``evade`` (:mod:`phalanx.attacks.evade`: the most harmful update the filter's oracle accepts, towards the same ×10 sign
flip, or towards a fixed drift orthogonal to the honest mean), and prints per filter and attack the final test
accuracy (mean ± 95 % half-width over the seeds, :func:`phalanx.analysis.stats.mean_ci`) and the Byzantine updates
rejected per seed (of 60).

    PYTHONPATH=src python scripts/evade_filters.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from phalanx.analysis.stats import mean_ci
from phalanx.experiments import make_config, train

SETTING: dict[str, Any] = {
    "dataset": "digits", "model": "logreg", "workers": 10, "byzantine": 2, "f": 0, "aggregator": "mean",
    "rounds": 30, "lr": 0.5, "schedule": "constant", "partition": "dirichlet", "eval_every": 30,
}
"""The docs' ``phalanx run`` setting (the CLI's default partition is Dirichlet: its ``signflip(scale=10)`` rows are
the ``phalanx run`` reports' quoted in docs/async.md)."""
FILTERS: dict[str, dict[str, Any]] = {"kardam": {"filter_f": 2}, "zenopp": {}, "aflguard": {}}
ATTACKS: list[tuple[str, str, dict[str, Any]]] = [
    ("none", "none", {}),
    ("signflip(scale=10)", "signflip", {"scale": 10.0}),
    ("evade(target=signflip, scale=10)", "evade", {"target": "signflip", "scale": 10.0}),
    ("evade(target=drift, scale=10)", "evade", {"target": "drift", "scale": 10.0}),
]


def measure(algorithm: str, attack: str, params: dict[str, Any], seed: int) -> dict[str, float]:
    """One run of :data:`SETTING`: the final accuracy (%) and the Byzantine and honest updates rejected."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the docs' runs are one-thread runs (a result depends on the thread count)
    try:
        cfg = make_config({**SETTING, "byzantine": 0 if attack == "none" else 2, "attack": attack,
                           "attack_params": params, "algorithm": algorithm, "seed": seed,
                           "algorithm_params": {"buffer_size": 4, "byzantine_timing": "always_first",
                                                **FILTERS[algorithm]}})
        last = train(cfg)[-1]
    finally:
        torch.set_num_threads(before)
    return {"accuracy": 100 * float(last["test_accuracy"]), "byzantine_rejected": float(last["byzantine_rejected"]),
            "honest_rejected": float(last["honest_rejected"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--filters", nargs="+", default=list(FILTERS), choices=list(FILTERS))
    args = parser.parse_args()
    print("| filter | attack | accuracy % | Byzantine rejected, per seed | honest rejected, per seed |")
    print("|---|---|---|---|---|")
    for algorithm in args.filters:
        for label, attack, params in ATTACKS:
            runs = [measure(algorithm, attack, params, seed) for seed in args.seeds]
            acc = mean_ci([r["accuracy"] for r in runs]).show()
            byz = "—" if attack == "none" else ", ".join(f"{r['byzantine_rejected']:.0f}" for r in runs)
            hon = ", ".join(f"{r['honest_rejected']:.0f}" for r in runs)
            print(f"| {algorithm} | {label} | {acc} | {byz} | {hon} |", flush=True)


if __name__ == "__main__":
    main()
