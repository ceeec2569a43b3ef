"""The small federated config the backdoor attacks' tests share."""

from __future__ import annotations

from typing import Any

FED: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 10, "byzantine": 3, "f": 3,
    "aggregator": "cwtm", "algorithm": "fedavg", "clients_per_round": 10, "local_steps": 2, "rounds": 8,
    "batch_size": 8, "lr": 0.05, "momentum": 0.0, "eval_every": 2, "checkpoint_every": 4, "seed": 2,
}
