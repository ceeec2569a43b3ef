"""The Flower side of benchmarks/federated.py: the ClientApp, the timed strategies and one ``run_simulation``.

A module of its own because Flower's simulation engine runs the ClientApp in Ray actors (other processes), which
import it by name: ``benchmarks/`` is on their ``sys.path`` because it is on the driver's.

The task is the benchmark's: the client builds Phalanx's ``mlp`` (``Flatten → Linear → ReLU → Linear``, a plain
``nn.Sequential``), loads the broadcast weights, takes ``local-steps`` steps of ``torch.optim.SGD`` on batches of
``batch-size`` drawn uniformly with replacement from its shard (Phalanx's IID split of the same data, with the same
seed, indexed by the node's ``partition-id``) and replies its weights. What the server sends in the train
``ConfigRecord`` (learning rate, steps, data set, ...) is all the client knows of the task: ``run_simulation`` has no
run configuration.
"""

from __future__ import annotations

import itertools
import os

# Offline and quiet before Flower or Ray is imported (Flower's telemetry, update check and Ray's usage stats reach
# the network otherwise); one BLAS thread per process (the client matmuls are small: multi-threaded BLAS ran them
# 3–10× slower here).
for _var, _value in (("FLWR_TELEMETRY_ENABLED", "0"), ("FLWR_DISABLE_UPDATE_CHECK", "1"),
                     ("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1"), ("RAY_USAGE_STATS_ENABLED", "0"),
                     ("RAY_DEDUP_LOGS", "0"), ("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0"),
                     ("OPENBLAS_NUM_THREADS", "1")):
    os.environ.setdefault(_var, _value)

import time  # noqa: E402
from collections.abc import Iterable, Iterator, Sequence  # noqa: E402
from functools import lru_cache  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.serverapp.strategy import FedTrimmedAvg  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from phalanx import data, models  # noqa: E402
from phalanx.training.streams import generator, stream_seed  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------
# The task (shared with the equivalence check in _bench_federated_runners.py, which runs it without Flower)
# ---------------------------------------------------------------------------------------------------------------


def build_model(input_shape: Sequence[int], num_classes: int, hidden: int, seed: int) -> nn.Module:
    """Phalanx's ``mlp`` with θ₀ exactly as ``phalanx.experiments.from_config`` draws it (the ``init`` stream)."""
    return models.make("mlp", tuple(input_shape), num_classes, generator=generator(seed, "init"), hidden=[hidden])


def partition_seed(seed: int) -> int:
    """The seed ``from_config`` gives ``phalanx.data.partition`` for a run of seed ``seed``."""
    return stream_seed(seed, "partition") % (2**31)


def local_train(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], lr: float) -> float:
    """One client's local training: a ``torch.optim.SGD`` step (no momentum, no weight decay) on the mean
    cross-entropy of each batch; the last batch's loss."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss = torch.zeros(())
    for xb, yb in batches:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    return float(loss.detach())


@lru_cache(maxsize=2)
def client_data(dataset: str, clients: int, seed: int) -> tuple[Tensor, Tensor, list[Tensor], tuple[int, ...], int]:
    """(train_x, train_y, shards, input_shape, num_classes): the data set and Phalanx's IID split of it, loaded once
    per process."""
    ds = data.load(dataset)
    shards = data.partition(ds.train_y, clients, "iid", seed=partition_seed(seed))
    return ds.train_x, ds.train_y, shards, tuple(ds.input_shape), ds.num_classes


@lru_cache(maxsize=2)
def client_model(dataset: str, clients: int, seed: int, hidden: int) -> nn.Module:
    """The client's model object, built once per process (the broadcast weights are loaded into it every round)."""
    _, _, _, shape, classes = client_data(dataset, clients, seed)
    return build_model(shape, classes, hidden, seed)


# ---------------------------------------------------------------------------------------------------------------
# ClientApp
# ---------------------------------------------------------------------------------------------------------------

client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Load the broadcast weights, train ``local-steps`` steps on this node's shard, reply the weights (and, as the
    metric ``client-s``, how long this function took up to building the reply)."""
    t0 = time.perf_counter()
    torch.set_num_threads(1)  # one Ray actor = one CPU
    cfg: Any = msg.content["config"]
    dataset, clients, seed = str(cfg["dataset"]), int(cfg["clients"]), int(cfg["seed"])
    pid = int(context.node_config["partition-id"])
    x, y, shards, _, _ = client_data(dataset, clients, seed)
    model = client_model(dataset, clients, seed, int(cfg["hidden"]))
    arrays: Any = msg.content["arrays"]
    model.load_state_dict(arrays.to_torch_state_dict())
    shard = shards[pid]
    gen = torch.Generator().manual_seed(seed * 1_000_003 + int(cfg["server-round"]) * 10_007 + pid)
    batch, steps = int(cfg["batch-size"]), int(cfg["local-steps"])

    def batches() -> Iterator[tuple[Tensor, Tensor]]:
        for _ in range(steps):
            idx = shard[torch.randint(shard.numel(), (batch,), generator=gen)]
            yield x[idx], y[idx]

    loss = local_train(model, batches(), float(cfg["lr"]))
    state = model.state_dict()
    metrics = MetricRecord({"train_loss": loss, "num-examples": int(shard.numel()),
                            "client-s": time.perf_counter() - t0})
    return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": metrics}), reply_to=msg)


# ---------------------------------------------------------------------------------------------------------------
# Timed strategies
# ---------------------------------------------------------------------------------------------------------------


class Timed:
    """Mixin for a Flower strategy: waits for every node before sampling (else round 1 of a simulation samples only
    ``min_train_nodes``), and records when each ``aggregate_train`` returns, how long it took and how many replies
    it got, and the clients' ``client-s`` metric (their training time). The strategy's own behaviour is unchanged."""

    min_available_nodes: int
    ends: list[float]
    agg_s: list[float]
    replies: list[int]
    client_s: list[float]

    def reset_clock(self) -> None:
        self.ends, self.agg_s, self.replies, self.client_s = [], [], [], []

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        while len(list(grid.get_node_ids())) < self.min_available_nodes:
            time.sleep(0.05)
        return super().configure_train(server_round, arrays, config, grid)  # type: ignore[misc]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        got = list(replies)
        for msg in got:
            if msg.has_content() and "metrics" in msg.content:
                metrics: Any = msg.content["metrics"]
                self.client_s.append(float(metrics.get("client-s", float("nan"))))
        t0 = time.perf_counter()
        out: tuple[ArrayRecord | None, MetricRecord | None] = super().aggregate_train(  # type: ignore[misc]
            server_round, got)
        t1 = time.perf_counter()
        self.agg_s.append(t1 - t0)
        self.ends.append(t1)
        self.replies.append(len(got))
        return out


class TimedFedTrimmedAvg(Timed, FedTrimmedAvg):
    """Flower's own ``FedTrimmedAvg``, timed."""


def _timed_phalanx() -> type:
    from phalanx.flower import PhalanxFedAvg

    class TimedPhalanxFedAvg(Timed, PhalanxFedAvg):
        """Phalanx's Flower strategy, timed."""

    return TimedPhalanxFedAvg


# ---------------------------------------------------------------------------------------------------------------
# One simulation
# ---------------------------------------------------------------------------------------------------------------


def run(settings: dict[str, Any], ray_dir: str) -> dict[str, Any]:
    """One ``run_simulation`` with ``settings['clients']`` supernodes in which both strategies run in turn on the
    same grid: ``warmup`` rounds each, then ``blocks`` blocks of ``block_rounds`` rounds each, the order of the two
    strategies swapped from block to block. Returns per strategy the round intervals of the blocks (the time between
    the ends of consecutive ``aggregate_train`` calls within a block: round k of a block, k ≥ 2), the aggregation
    times, the replies per round and the final weights' test accuracy."""
    import ray
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    s = settings
    clients, per_round = int(s["clients"]), int(s["per_round"])
    out: dict[str, Any] = {"strategies": {}}
    ds = data.load(s["dataset"])
    model = build_model(ds.input_shape, ds.num_classes, int(s["hidden"]), int(s["seed"]))
    config = ConfigRecord({"lr": float(s["lr"]), "local-steps": int(s["local_steps"]),
                           "batch-size": int(s["batch"]), "dataset": str(s["dataset"]), "clients": clients,
                           "seed": int(s["seed"]), "hidden": int(s["hidden"])})
    common: dict[str, Any] = {"fraction_train": per_round / clients, "fraction_evaluate": 0.0,
                              "min_available_nodes": clients}
    strategies: dict[str, Any] = {
        "flower_trimmed": TimedFedTrimmedAvg(**common, beta=float(s["beta"])),
        "flower_phalanx": _timed_phalanx()(**common, aggregator="cwtm", f=int(s["f"])),
    }
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        arrays = {k: ArrayRecord(model.state_dict()) for k in strategies}
        timed: dict[str, dict[str, list[Any]]] = {k: {"intervals": [], "agg_s": [], "replies": [],
                                                      "client_s": []}
                                                  for k in strategies}
        t0 = time.perf_counter()
        for name, strategy in strategies.items():  # warm-up: Ray's actors start, each loads the data once
            strategy.reset_clock()
            arrays[name] = strategy.start(grid=grid, initial_arrays=arrays[name], num_rounds=int(s["warmup"]),
                                          train_config=config).arrays
        out["warmup_s"] = time.perf_counter() - t0
        order = list(strategies)
        for block in range(int(s["blocks"])):
            for name in order if block % 2 == 0 else order[::-1]:
                strategy = strategies[name]
                strategy.reset_clock()
                arrays[name] = strategy.start(grid=grid, initial_arrays=arrays[name],
                                              num_rounds=int(s["block_rounds"]), train_config=config).arrays
                ends = strategy.ends
                timed[name]["intervals"] += [b - a for a, b in itertools.pairwise(ends)]
                timed[name]["agg_s"] += strategy.agg_s
                timed[name]["replies"] += strategy.replies
                timed[name]["client_s"] += strategy.client_s
        for name in strategies:
            final = build_model(ds.input_shape, ds.num_classes, int(s["hidden"]), int(s["seed"]))
            final.load_state_dict(arrays[name].to_torch_state_dict())
            with torch.no_grad():
                acc = float((final(ds.test_x).argmax(1) == ds.test_y).float().mean())
            rounds = int(s["warmup"]) + int(s["blocks"]) * int(s["block_rounds"])
            out["strategies"][name] = {**timed[name], "test_accuracy": acc, "rounds": rounds}

    init_args: dict[str, Any] = {"num_cpus": int(s["ray_cpus"]), "include_dashboard": False, "logging_level": "error",
                 "log_to_driver": False, "_temp_dir": ray_dir}
    t0 = time.perf_counter()
    try:
        run_simulation(server_app=app, client_app=client_app, num_supernodes=clients,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": init_args})
    finally:
        ray.shutdown()
    out["wall_s"] = time.perf_counter() - t0
    return out
