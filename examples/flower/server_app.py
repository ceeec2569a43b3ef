"""The example's ServerApp: Phalanx's robust drop-in for FedAvg (or Flower's own FedAvg, to compare).

Run configuration (``[tool.flwr.app.config]`` in pyproject.toml, ``flwr run . --run-config "key=value ..."``, or
``run.py``'s options): ``strategy`` ("phalanx" or "fedavg"), ``aggregator``, ``f``, ``server-lr``,
``num-server-rounds``, ``num-clients`` (the nodes to wait for), ``num-byzantine``, ``attack``, ``attack-scale``,
``lr``, ``local-steps``, ``log-path`` (the contributions' JSON lines) and ``result-path`` (a JSON summary).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import task
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from phalanx.flower import PhalanxFedAvg

app = ServerApp()

DEFAULTS: dict[str, Any] = {
    "strategy": "phalanx", "aggregator": "cwtm", "f": 3, "server-lr": 1.0, "num-server-rounds": 5,
    "num-clients": 10, "num-byzantine": 3, "attack": "flip", "attack-scale": 10.0, "lr": 0.5, "local-steps": 5,
    "log-path": "", "result-path": "",
}


def run(grid: Grid, context: Context) -> dict[str, Any]:
    """Train with the configured strategy; return (and optionally write) the outcome."""
    cfg = {**DEFAULTS, **context.run_config}
    clients, rounds = int(cfg["num-clients"]), int(cfg["num-server-rounds"])
    common = dict(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=clients)
    if cfg["strategy"] == "phalanx":
        strategy: FedAvg = PhalanxFedAvg(
            **common, aggregator=str(cfg["aggregator"]), f=int(cfg["f"]), server_lr=float(cfg["server-lr"]),
            log_path=str(cfg["log-path"]) or None,
        )
    else:
        strategy = FedAvg(**common)
    train_config = ConfigRecord({k: cfg[k] for k in ("lr", "local-steps", "num-byzantine", "attack", "attack-scale")})

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"test_accuracy": task.accuracy(arrays.to_numpy_ndarrays())})

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(task.initial_model()), num_rounds=rounds,
                            train_config=train_config, evaluate_fn=central)
    final = result.arrays.to_numpy_ndarrays()
    honest = task.honest_reference(rounds, clients, int(cfg["num-byzantine"]), float(cfg["lr"]),
                                   int(cfg["local-steps"]))
    outcome = {
        "strategy": cfg["strategy"], "aggregator": cfg["aggregator"] if cfg["strategy"] == "phalanx" else "fedavg",
        "f": cfg["f"], "rounds": rounds, "clients": clients, "byzantine": cfg["num-byzantine"],
        "attack": cfg["attack"], "test_accuracy": task.accuracy(final),
        "honest_accuracy": task.accuracy(honest), "distance_to_honest": task.distance(final, honest),
        "honest_norm": task.distance(honest, task.initial_model()),
        "contributions": len(getattr(strategy, "contributions", [])),
    }
    print("RESULT " + json.dumps(outcome), flush=True)
    if cfg["result-path"]:
        Path(str(cfg["result-path"])).write_text(json.dumps(outcome) + "\n")
    return outcome


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp's entry point (``flwr run``)."""
    run(grid, context)
