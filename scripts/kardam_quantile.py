"""Why Kardam's Lipschitz filter does not hold always-first sign flippers ×10 (docs/async.md, Kardam): a measurement.

The filter (:mod:`phalanx.training.algorithms.kardam`, as the paper's abstract and Phalanx read it) keeps each
worker's *latest* empirical Lipschitz coefficient k = ‖g − ĝ‖ / ‖θ − θ̂‖, accepted or not, and accepts an update
whose k is at most the ((n − f)/n)-quantile of them. An honest update judged against a Byzantine reference ĝ (the
last accepted update, often a flipped one) has a k as large as a Byzantine update's, is rejected — and its k stays
in the set, raising the quantile the next Byzantine update is judged by.

This script runs the docs' setting (digits, logreg, n = 10, b = 2 always-first ``signflip(scale=10)``, FedBuff's
K = 4, ``filter_f = 2``, 30 steps, lr 0.5, 1 thread) with the filter as built, and with a variant of ours that
keeps a worker's coefficient only when its update is accepted (a worker's first coefficient is kept either way), and
prints per seed the Byzantine and honest updates rejected and the final accuracy. The variant is an instrument to
test the mechanism, not a proposed defence: it is not in the algorithm's parameters.

    PYTHONPATH=src python scripts/kardam_quantile.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from phalanx.experiments import make_config, train
from phalanx.training.algorithms import kardam

SETTING: dict[str, Any] = {
    "dataset": "digits", "model": "logreg", "workers": 10, "byzantine": 2, "f": 0, "aggregator": "mean",
    "attack": "signflip", "attack_params": {"scale": 10.0}, "algorithm": "kardam",
    "algorithm_params": {"buffer_size": 4, "filter_f": 2, "byzantine_timing": "always_first"},
    "rounds": 30, "lr": 0.5, "schedule": "constant", "partition": "dirichlet", "eval_every": 25,
}


@contextmanager
def accepted_only() -> Iterator[None]:
    """The variant: a rejected update's coefficient does not replace its worker's (the filter's own code runs; the
    worker's previous coefficient is put back after each rejection)."""
    screen = kardam.Kardam.screen

    def variant(self: Any, run: Any, own: dict[str, torch.Tensor], theta: torch.Tensor, t: int, ids: torch.Tensor,
                updates: torch.Tensor, versions: torch.Tensor, ring: torch.Tensor,
                workers: int | None = None) -> Any:
        out = updates, torch.zeros(0, dtype=torch.bool), dict(own)
        keep = torch.zeros(ids.numel(), dtype=torch.bool)
        state = dict(own)
        for i in range(ids.numel()):  # one update at a time, so a rejected one's coefficient can be put back
            before = state["kardam_lip"].clone()
            _, ok, state = screen(self, run, state, theta, t, ids[i:i + 1], updates[i:i + 1], versions[i:i + 1],
                                  ring, workers)
            keep[i] = bool(ok[0])
            w = int(ids[i])
            if not keep[i] and not math.isnan(float(before[w])):
                lips = state["kardam_lip"].clone()
                lips[w] = before[w]
                state = {**state, "kardam_lip": lips}
        out = updates, keep, state
        return out

    kardam.Kardam.screen = variant  # type: ignore[method-assign]
    try:
        yield
    finally:
        kardam.Kardam.screen = screen  # type: ignore[method-assign]


def measure(seed: int, variant: bool) -> dict[str, float]:
    """One run of :data:`SETTING` with ``seed``: Byzantine and honest updates rejected, final accuracy (%)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the docs' runs are one-thread runs (a result depends on the thread count)
    try:
        cfg = make_config({**SETTING, "seed": seed})
        if variant:
            with accepted_only():
                rows = train(cfg)
        else:
            rows = train(cfg)
    finally:
        torch.set_num_threads(before)
    last = rows[-1]
    return {"byzantine_rejected": float(last["byzantine_rejected"]), "honest_rejected": float(last["honest_rejected"]),
            "accuracy": 100 * float(last["test_accuracy"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    print("| filter | seed | Byzantine rejected (of 60) | honest rejected | final accuracy % |")
    print("|---|---|---|---|---|")
    for variant in (False, True):
        for seed in args.seeds:
            m = measure(seed, variant)
            name = "accepted coefficients only (ours)" if variant else "as built (every latest coefficient)"
            print(f"| {name} | {seed} | {m['byzantine_rejected']:.0f} | {m['honest_rejected']:.0f} | "
                  f"{m['accuracy']:.1f} |")


if __name__ == "__main__":
    main()
