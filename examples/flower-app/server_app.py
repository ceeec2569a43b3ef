"""The app's ServerApp: Phalanx's robust drop-in for FedAvg, Flower's own FedAvg, or both one after the other on the
same nodes (``strategy = "both"``: the plain mean's damage and the robust rule's survival in one run).

Run configuration (``[tool.flwr.app.config]``, ``flwr run . <superlink> --run-config "key=value ..."``):
``strategy``, ``aggregator``, ``f``, ``server-lr``, ``num-server-rounds``, ``num-clients`` (the nodes to wait for),
``num-byzantine`` (for the honest reference, and who attacks in a simulation), ``lr``, ``local-steps``,
``fraction-evaluate`` (0: no evaluation round on the clients; the server still tests every model), ``log-path``
(the contributions' JSON lines) and ``result-path`` (a JSON list of the outcomes); the ``byzantine-*`` keys are read
by the Byzantine clients (client_app.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import task
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from phalanx.errors import ConfigError
from phalanx.flower import PhalanxFedAvg

app = ServerApp()

DEFAULTS: dict[str, Any] = {
    "strategy": "phalanx", "aggregator": "cwtm", "f": 3, "server-lr": 1.0, "num-server-rounds": 5,
    "num-clients": 10, "num-byzantine": 3, "lr": 0.5, "local-steps": 5, "fraction-evaluate": 1.0, "log-path": "",
    "result-path": "",
}
STRATEGIES = {"phalanx": ["phalanx"], "fedavg": ["fedavg"], "both": ["fedavg", "phalanx"]}


def _one(name: str, grid: Grid, cfg: dict[str, Any]) -> dict[str, Any]:
    clients, rounds = int(cfg["num-clients"]), int(cfg["num-server-rounds"])
    evaluate = float(cfg["fraction-evaluate"])
    common = dict(fraction_train=1.0, fraction_evaluate=evaluate, min_available_nodes=clients, min_train_nodes=clients,
                  min_evaluate_nodes=clients if evaluate > 0 else 0)
    if name == "phalanx":
        strategy: FedAvg = PhalanxFedAvg(
            **common, aggregator=str(cfg["aggregator"]), f=int(cfg["f"]), server_lr=float(cfg["server-lr"]),
            log_path=str(cfg["log-path"]) or None,
        )
    else:
        strategy = FedAvg(**common)
    train_config = ConfigRecord({"lr": float(cfg["lr"]), "local-steps": int(cfg["local-steps"])})

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"test_accuracy": task.accuracy(arrays.to_numpy_ndarrays())})

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(task.initial_model()), num_rounds=rounds,
                            train_config=train_config, evaluate_fn=central)
    final = result.arrays.to_numpy_ndarrays()
    honest = task.honest_reference(rounds, clients, int(cfg["num-byzantine"]), float(cfg["lr"]),
                                   int(cfg["local-steps"]))
    return {
        "strategy": name, "aggregator": str(cfg["aggregator"]) if name == "phalanx" else "mean", "f": int(cfg["f"]),
        "rounds": rounds, "clients": clients, "byzantine": int(cfg["num-byzantine"]),
        "attack": str(cfg.get("byzantine-attack", "")), "test_accuracy": task.accuracy(final),
        "honest_accuracy": task.accuracy(honest), "distance_to_honest": task.distance(final, honest),
        "honest_norm": task.distance(honest, task.initial_model()),
        "contributions": len(getattr(strategy, "contributions", [])),
        "nodes": sorted(int(n) for n in grid.get_node_ids()),
    }


def run(grid: Grid, context: Context) -> list[dict[str, Any]]:
    """Train with the configured strategy (or both); return (and optionally write) the outcomes."""
    cfg = {**DEFAULTS, **context.run_config}
    if cfg["strategy"] not in STRATEGIES:
        raise ConfigError("strategy", cfg["strategy"], "one of " + ", ".join(STRATEGIES))
    outcomes = []
    for name in STRATEGIES[str(cfg["strategy"])]:
        outcome = _one(name, grid, cfg)
        print("RESULT " + json.dumps(outcome), flush=True)
        outcomes.append(outcome)
    if cfg["result-path"]:
        Path(str(cfg["result-path"])).write_text(json.dumps(outcomes) + "\n")
    return outcomes


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp's entry point (``flwr run``)."""
    run(grid, context)
