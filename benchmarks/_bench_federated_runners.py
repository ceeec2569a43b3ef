"""The two implementations benchmarks/federated.py times in one process: Phalanx's federated round
(:class:`PhalanxRunner`) and the FedAvg branch of ByzFL's training loop (:class:`ByzflRunner`), and the check
that they, and the Flower client's training with Flower's ``trim_mean``, compute the same round
(:func:`check_equivalence`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from _bench_federated_task import Task


def phalanx_config(task: Task) -> Any:
    from phalanx.experiments import make_config

    never = 10**9  # no round of the benchmark evaluates or measures
    return make_config({
        "algorithm": "fedavg", "dataset": task.dataset, "model": "mlp", "model_params": {"hidden": [task.hidden]},
        "workers": task.clients, "clients_per_round": task.per_round, "local_steps": task.local_steps,
        "batch_size": task.batch, "lr": task.lr, "momentum": 0.0, "weight_decay": 0.0, "aggregator": "cwtm",
        "f": task.f, "byzantine": 0, "attack": "none", "partition": "iid", "seed": task.seed, "rounds": never,
        "eval_every": never,
    })


class PhalanxRunner:
    """Phalanx's federated round, built from the config as ``phalanx run`` builds it."""

    name = "phalanx"

    def __init__(self, task: Task, dataset: Any) -> None:
        from phalanx.experiments import from_config
        from phalanx.training import Loop

        self.exp = from_config(phalanx_config(task), dataset)
        self.loop = Loop(self.exp)
        self.loop.open()
        self.rounds = 0

    @property
    def theta(self) -> Any:
        return self.loop.state.theta

    def round(self) -> float:
        t0 = time.perf_counter()
        self.loop.step()
        self.rounds += 1
        return time.perf_counter() - t0

    def accuracy(self, dataset: Any) -> float:
        acc, _ = self.exp.problem.evaluate(self.theta, dataset.test_x, dataset.test_y)
        return float(acc)


MODEL_NAME = "phalanx_bench_mlp"
"""The name Phalanx's MLP is registered under in ``byzfl.fed_framework.models`` (ByzFL builds models by name)."""


class ByzflRunner:
    """The FedAvg branch of ByzFL's ``start_training``, on its own objects, configured like the Phalanx run."""

    name = "byzfl"

    def __init__(self, task: Task, dataset: Any, theta0: Any) -> None:
        import random

        import numpy as np
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        from _bench_peers import load_byzfl
        from phalanx import models

        byzfl = load_byzfl()
        from byzfl.fed_framework import models as byz_models

        shape, classes = tuple(dataset.input_shape), int(dataset.num_classes)
        setattr(byz_models, MODEL_NAME, lambda: models.make("mlp", shape, classes, hidden=[task.hidden]))
        self.task = task
        self.h, self.b = task.clients, 0

        class WithTargets(TensorDataset):  # what DataDistributor reads: dataset.targets
            def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
                super().__init__(x, y)
                self.targets = y

        random.seed(task.seed)  # DataDistributor's IID split uses Python's random
        np.random.seed(task.seed)
        torch.manual_seed(task.seed)
        loaders = byzfl.DataDistributor({
            "data_distribution_name": "iid", "nb_honest": self.h,
            "data_loader": DataLoader(WithTargets(dataset.train_x, dataset.train_y)), "batch_size": task.batch,
        }).split_data()
        common = {"model_name": MODEL_NAME, "device": "cpu", "optimizer_name": "SGD", "learning_rate": task.lr,
                  "weight_decay": 0.0, "milestones": [], "learning_rate_decay": 1.0}
        self.clients = [
            byzfl.Client({**common, "loss_name": "CrossEntropyLoss", "LabelFlipping": False,
                          "training_dataloader": loaders[i], "momentum": 0.0, "nb_labels": classes,
                          "store_per_client_metrics": False})
            for i in range(self.h)
        ]
        self.server = byzfl.Server({
            **common, "test_loader": DataLoader(WithTargets(dataset.test_x[:64], dataset.test_y[:64])),
            "aggregator_info": {"name": "TrMean", "parameters": {"f": task.f}}, "pre_agg_list": [],
        })
        self.attacker = byzfl.ByzantineClient({"name": "NoAttack", "f": 0, "parameters": {}})
        # as train.py computes it: int(nb_honest * proportion_selected_clients)
        self.nb_clients_to_sample = int(self.h * (task.per_round / task.clients))
        self.load(theta0)
        self.rounds = 0

    def load(self, theta: Any) -> None:
        """Set the server's model to θ and send it to every client (train.py's "Send Initial Model")."""
        self.server.set_parameters(theta.clone())
        new_model = self.server.get_dict_parameters()
        for client in self.clients:
            client.set_model_state(new_model)

    @property
    def theta(self) -> Any:
        import torch

        return torch.cat([p.detach().reshape(-1) for p in self.server.model.parameters()]).clone()

    def round(self) -> float:
        """One round of the FedAvg branch of ``byzfl.benchmark.train.start_training``; its wall time."""
        import numpy as np

        t0 = time.perf_counter()
        idx_selected_clients = np.random.choice(range(self.h + self.b), size=int(self.nb_clients_to_sample),
                                                replace=False)
        idx_honest_clients = idx_selected_clients[idx_selected_clients < self.h]
        count_byz_clients = len(idx_selected_clients) - len(idx_honest_clients)
        train_loss_per_client = np.zeros(len(idx_honest_clients))
        honest_weights = []
        for idx, i in enumerate(idx_honest_clients):
            train_loss_per_client[idx] = self.clients[i].compute_model_update(self.task.local_steps)
            honest_weights.append(self.clients[i].get_flat_parameters())
        train_loss_per_client.mean()
        self.attacker.f = count_byz_clients
        byz_weights = self.attacker.apply_attack(honest_weights)
        self.server.update_model_with_weights(honest_weights + byz_weights)
        new_model = self.server.get_dict_parameters()
        for client in self.clients:
            client.set_model_state(new_model)
        self.rounds += 1
        return time.perf_counter() - t0

    def accuracy(self, dataset: Any) -> float:
        import torch

        with torch.no_grad():
            return float((self.server.model(dataset.test_x).argmax(1) == dataset.test_y).float().mean())


@contextmanager
def _recording(runner: PhalanxRunner) -> Iterator[dict[str, Any]]:
    """Record the clients and the batches of Phalanx's next round (``FedAvgClients.sample``,
    ``fedavg.sample_batches_of``)."""
    from phalanx.training.algorithms import fedavg

    rec: dict[str, Any] = {"ids": None, "batches": []}
    clients = runner.loop.transport.workers  # type: ignore[attr-defined]
    original_sample, original_batches = clients.sample, fedavg.sample_batches_of

    def sample() -> Any:
        rec["ids"] = original_sample()
        return rec["ids"]

    def batches(data: Any, ids: Any, batch: int, gen: Any) -> Any:
        xb, yb = original_batches(data, ids, batch, gen)
        rec["batches"].append((xb.clone(), yb.clone()))
        return xb, yb

    clients.sample = sample
    fedavg.sample_batches_of = batches
    try:
        yield rec
    finally:
        del clients.sample
        fedavg.sample_batches_of = original_batches


def check_equivalence(task: Task, dataset: Any, phalanx: PhalanxRunner, byz: ByzflRunner | None) -> dict[str, Any]:
    """Phalanx's first round, replayed (same θ₀, clients and batches) through the Flower client's training and
    Flower's ``trim_mean``, and through ByzFL's clients and server: max |θ₁ − θ₁_Phalanx|."""
    import numpy as np
    import torch

    theta0 = phalanx.theta.clone()
    with _recording(phalanx) as rec:
        phalanx.round()
    theta1 = phalanx.theta.clone()
    ids = [int(i) for i in rec["ids"]]
    batches = rec["batches"]
    out: dict[str, Any] = {"dim": int(theta0.numel()), "clients": ids,
                           "update_max_abs": float((theta1 - theta0).abs().max())}
    try:
        from flwr.serverapp.strategy.fedtrimmedavg import trim_mean

        import _bench_federated_flower as fl
    except ImportError as exc:
        out["flower_error"] = f"{type(exc).__name__}: {exc}"
    else:
        model0 = fl.build_model(dataset.input_shape, dataset.num_classes, task.hidden, task.seed)
        flat0 = torch.cat([p.detach().reshape(-1) for p in model0.parameters()])
        out["flower_same_theta0"] = bool(torch.equal(flat0, theta0))
        states = []
        for j in range(len(ids)):
            model = fl.build_model(dataset.input_shape, dataset.num_classes, task.hidden, task.seed)
            fl.local_train(model, [(xb[j], yb[j]) for xb, yb in batches], task.lr)
            states.append([v.detach().numpy() for v in model.state_dict().values()])
        agg = [np.asarray(trim_mean(np.stack([s[k] for s in states]), task.beta)) for k in range(len(states[0]))]
        theta_flower = torch.cat([torch.from_numpy(a).reshape(-1) for a in agg])
        out["flower_max_abs"] = float((theta_flower - theta1).abs().max())
    if byz is not None:
        byz.load(theta0)
        weights = []
        for j, cid in enumerate(ids):
            client = byz.clients[cid]
            feed = iter([(xb[j], yb[j]) for xb, yb in batches])
            client._sample_train_batch = lambda feed=feed: next(feed)
            client.compute_model_update(task.local_steps)
            del client._sample_train_batch
            weights.append(client.get_flat_parameters())
        byz.server.update_model_with_weights(weights)
        out["byzfl_max_abs"] = float((byz.theta - theta1).abs().max())
        byz.load(byz.theta)
    return out

