"""A tiny grid on disk for the report and status tests: logistic regression on digits, n = 4, the mean and cwtm, with
and without one sign flipper, 2 rounds each (four runs, a few seconds)."""

from __future__ import annotations

from pathlib import Path

BASE = {"dataset": "digits", "model": "logreg", "workers": 4, "f": 1, "byzantine": 1, "rounds": 2, "eval_every": 2,
        "batch_size": 8, "seed": 0}


def tiny_grid(out: Path) -> None:
    """Train the four runs into ``out`` (one directory per run, named by its run id)."""
    from phalanx.experiments import grid, make_config, train

    for rule in ("mean", "cwtm"):
        for attack in ("none", "signflip"):
            cfg = make_config({**BASE, "aggregator": rule, "attack": attack})
            train(cfg, out / grid.run_id(cfg))
