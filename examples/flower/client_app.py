"""The example's ClientApp: honest clients train on their shard; the last ``num-byzantine`` clients attack.

Attacks (the ``attack`` value of the server's train config — in a real deployment an attacker chooses by itself;
the simulation sends the choice along so that one command sets up the whole experiment):

- ``"flip"``: the client's honest update Δ = w_local − w, sent back flipped and scaled: w − ``attack-scale``·Δ.
- ``"nan"``: a model full of NaN.
- ``"malformed"``: a model with the wrong shapes (a structure error: Phalanx drops it, Flower's FedAvg stops).
"""

from __future__ import annotations

import numpy as np
import task
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


def _ids(context: Context) -> tuple[int, int]:
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training from the broadcast model; a Byzantine client then replaces its reply by its attack."""
    config = msg.content["config"]
    pid, clients = _ids(context)
    model = msg.content["arrays"].to_numpy_ndarrays()
    x, y = task.shard(pid, clients)
    local, loss = task.train(model, x, y, float(config.get("lr", 0.5)), int(config.get("local-steps", 5)))
    if pid >= clients - int(config.get("num-byzantine", 0)):
        attack = str(config.get("attack", "flip"))
        if attack == "flip":
            scale = float(config.get("attack-scale", 10.0))
            local = [g - scale * (m - g) for g, m in zip(model, local)]
        elif attack == "nan":
            local = [np.full_like(m, np.nan) for m in local]
        elif attack == "malformed":
            local = [np.zeros(3, np.float32), *local[1:]]
        loss = 0.0  # and it claims to be perfect
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord(local), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Accuracy of the broadcast model on the client's own shard."""
    pid, clients = _ids(context)
    x, y = task.shard(pid, clients)
    acc = task.accuracy(msg.content["arrays"].to_numpy_ndarrays(), x, y)
    return Message(RecordDict({"metrics": MetricRecord({"accuracy": acc, "num-examples": len(y)})}), reply_to=msg)
