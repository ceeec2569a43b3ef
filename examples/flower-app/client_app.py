"""The app's ClientApp: every node trains honestly on its shard; the Byzantine ones attack through Phalanx's ClientApp
mod (``phalanx.flower.byzantine``), which replaces their honest update by the Phalanx attack's.

Who attacks: a node whose config says ``byzantine = true`` (``flower-supernode --node-config "... byzantine=true"``);
a node whose config does not say (Flower's simulation engine gives every node the same keys) attacks when its
``partition-id`` is among the last ``num-byzantine`` of ``num-partitions``. With what: the ``byzantine-*`` keys of
the run config (``[tool.flwr.app.config]``), which a node's own config overrides. A data attack (``labelflip``,
``backdoor``…) poisons the node's shard before it trains (``poison``); the mod then applies the attack's update step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import task
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from phalanx.attacks import DataAttack
from phalanx.errors import ConfigError
from phalanx.flower.byzantine import from_config, poison


def _ids(context: Context) -> tuple[int, int]:
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])


def make_app(settings: Mapping[str, Any] | None = None) -> ClientApp:
    """The ClientApp; ``settings``: run-config values for a run without one (``run_simulation``)."""
    defaults = dict(settings or {})

    def is_byzantine(context: Context) -> bool:
        flag = context.node_config.get("byzantine")
        if flag is not None:
            if not isinstance(flag, bool):
                raise ConfigError("byzantine", flag, "true or false (a node's config)")
            return flag
        pid, clients = _ids(context)
        return pid >= clients - int(context.run_config.get("num-byzantine", defaults.get("num-byzantine", 0)))

    mod = from_config(is_byzantine, defaults=defaults)
    app = ClientApp(mods=[mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        """Local training from the broadcast model (on poisoned data under a data attack)."""
        config = msg.content["config"]
        pid, clients = _ids(context)
        x, y = task.shard(pid, clients)
        byzantine = mod.mod_for(context)
        if byzantine is not None and isinstance(byzantine.attack, DataAttack):
            x, y = poison(byzantine.attack, x, y, task.CLASSES, server_round=int(config["server-round"]),
                          seed=byzantine.seed + pid)
        model = msg.content["arrays"].to_numpy_ndarrays()
        local, loss = task.train(model, x, y, float(config.get("lr", 0.5)), int(config.get("local-steps", 5)))
        metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
        return Message(RecordDict({"arrays": ArrayRecord(local), "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        """Accuracy of the broadcast model on the client's own shard."""
        pid, clients = _ids(context)
        x, y = task.shard(pid, clients)
        acc = task.accuracy(msg.content["arrays"].to_numpy_ndarrays(), x, y)
        return Message(RecordDict({"metrics": MetricRecord({"accuracy": acc, "num-examples": len(y)})}),
                       reply_to=msg)

    return app


app = make_app()
