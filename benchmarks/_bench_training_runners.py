"""The implementations of one round that benchmarks/training.py times — Phalanx's round, the same round with
per-worker or ``vmap`` gradients (:class:`PhalanxRunner`) and the DSGD branch of ByzFL's training loop
(:class:`ByzflRunner`) — and the check that they compute the same round (:func:`check_equivalence`)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from _bench_peers import load_byzfl
from _bench_training_setting import BATCH, HIDDEN, LR, MOMENTUM, SEED, byzantine_of


def _minor_faults() -> int:
    try:
        import resource
    except ImportError:  # pragma: no cover - not Unix
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# ---------------------------------------------------------------------------------------------------------------
# Phalanx (fast path, vmap) and the per-worker loop
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Split:
    """Seconds spent in the timed parts of Phalanx's round, accumulated over the rounds that are timed."""

    grads: list[float] = field(default_factory=list)
    agg: list[float] = field(default_factory=list)
    faults: list[int] = field(default_factory=list)
    """Minor page faults of the process during each timed round (memory the kernel had to map and zero)."""


class _TimedProblem:
    """Stands for the experiment's :class:`Problem` in the round: times the gradient call (``loop``: ``grads_loop``).

    The round asks for the gradients fused with the momentum update (``accumulate_grads``); the loop variant
    computes them with one ``grad`` call per worker and then applies the same update.
    """

    def __init__(self, problem: Any, loop: bool, sink: list[float] | None) -> None:
        self.problem = problem
        self.loop = loop
        self.sink = sink

    @property
    def dim(self) -> int:
        return int(self.problem.dim)

    @property
    def norm_stats(self) -> Any:
        return self.problem.norm_stats

    def initial_theta(self) -> Any:
        return self.problem.initial_theta()

    def grads(self, theta: Any, xb: Any, yb: Any) -> Any:
        return self.problem.grads_loop(theta, xb, yb) if self.loop else self.problem.grads(theta, xb, yb)

    def accumulate_grads(self, theta: Any, xb: Any, yb: Any, out: Any, weight: float, weight_decay: float = 0.0) -> Any:
        t0 = time.perf_counter()
        if self.loop:
            g = self.problem.grads_loop(theta, xb, yb)
            if weight_decay:
                g.add_(theta, alpha=weight_decay)
            out.copy_(g) if weight == 1.0 else out.lerp_(g, weight)
        else:
            self.problem.accumulate_grads(theta, xb, yb, out, weight, weight_decay)
        if self.sink is not None:
            self.sink.append(time.perf_counter() - t0)
        return out


class _TimedRule:
    """Stands for the server's aggregator in the round (which only calls it: no round of the benchmark measures)."""

    def __init__(self, rule: Any, sink: list[float] | None) -> None:
        self.rule = rule
        self.sink = sink

    def __call__(self, x: Any, **context: Any) -> Any:
        t0 = time.perf_counter()
        out = self.rule(x, **context)
        if self.sink is not None:
            self.sink.append(time.perf_counter() - t0)
        return out


class PhalanxRunner:
    """Phalanx's round (``loop=False``) or the same round with per-worker gradients (``loop=True``); with
    ``per_worker="vmap"`` the gradients take the generic ``vmap(grad)`` path instead of the MLP's fast path."""

    def __init__(self, n: int, dataset: Any, dataset_name: str, loop: bool, per_worker: str = "auto") -> None:
        from phalanx.experiments import from_config, make_config
        from phalanx.training import Loop
        from phalanx.training.problem import Problem

        b = byzantine_of(n)
        self.n, self.b, self.loop = n, b, loop
        never = 10**9  # no round of the benchmark evaluates or measures
        self.cfg = make_config({
            "dataset": dataset_name, "model": "mlp", "model_params": {"hidden": [HIDDEN]}, "workers": n,
            "byzantine": b, "f": b, "aggregator": "cwtm", "attack": "signflip", "partition": "iid",
            "batch_size": BATCH, "lr": LR, "momentum": MOMENTUM, "weight_decay": 0.0, "seed": SEED,
            "rounds": never, "eval_every": never,
        })
        self.exp = from_config(self.cfg, dataset)
        if per_worker != "auto":
            self.exp.problem = Problem(self.exp.problem.model, per_worker=per_worker)
        self.model_problem = self.exp.problem
        self.split = Split()
        self.problem = _TimedProblem(self.exp.problem, loop, self.split.grads)
        self.rule = _TimedRule(self.exp.rule, self.split.agg)
        self.exp.problem = self.problem  # type: ignore[assignment]
        self.runner = Loop(self.exp)
        self.runner.open()
        self.runner.server.rule = self.rule  # type: ignore[assignment]

    def reset(self, theta: Any, momentum: Any) -> None:
        """Continue from θ with the given ``(n, d)`` momentum rows (the equivalence check)."""
        from phalanx.training import RoundState

        self.runner.state = RoundState(theta=theta, momentum=momentum, previous=None, round=0)
        self.runner.transport.workers.buffer = momentum  # type: ignore[attr-defined]

    def round(self, record: bool = False) -> float:
        """Run one round on the runner's own state; return its wall time."""
        self.problem.sink = self.split.grads if record else None
        self.rule.sink = self.split.agg if record else None
        f0 = _minor_faults()
        t0 = time.perf_counter()
        self.runner.step()
        elapsed = time.perf_counter() - t0
        if record:
            self.split.faults.append(_minor_faults() - f0)
        return elapsed


# ---------------------------------------------------------------------------------------------------------------
# ByzFL
# ---------------------------------------------------------------------------------------------------------------

# ``load_byzfl`` comes from ``_bench_peers`` (one loader for every benchmark: it stubs ByzFL's import-time-only
# dependencies — torchvision, seaborn, matplotlib, scipy — where they are absent, and lists them in ``STUBBED``).


class ByzflRunner:
    """ByzFL's DSGD round on its own objects, configured like the Phalanx run."""

    def __init__(self, n: int, dataset: Any) -> None:
        import random

        import numpy as np
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        byzfl = load_byzfl()
        b = byzantine_of(n)
        self.n, self.b, self.h = n, b, n - b

        class WithTargets(TensorDataset):  # what DataDistributor reads: dataset.targets
            def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
                super().__init__(x, y)
                self.targets = y

        random.seed(SEED)  # DataDistributor's IID split uses Python's random
        np.random.seed(SEED)
        torch.manual_seed(SEED)
        train = WithTargets(dataset.train_x, dataset.train_y)
        loaders = byzfl.DataDistributor({
            "data_distribution_name": "iid", "nb_honest": self.h, "data_loader": DataLoader(train),
            "batch_size": BATCH,
        }).split_data()
        common = {
            "model_name": "fc_mnist", "device": "cpu", "optimizer_name": "SGD", "learning_rate": LR,
            "weight_decay": 0.0, "milestones": [], "learning_rate_decay": 1.0,
        }
        self.clients = [
            byzfl.Client({
                **common, "loss_name": "NLLLoss", "LabelFlipping": False, "training_dataloader": loaders[i],
                "momentum": MOMENTUM, "nb_labels": dataset.num_classes, "store_per_client_metrics": False,
            })
            for i in range(self.h)
        ]
        aggregator_info = {"name": "TrMean", "parameters": {"f": b}}
        self.server = byzfl.Server({
            **common, "test_loader": DataLoader(WithTargets(dataset.test_x[:64], dataset.test_y[:64])),
            "aggregator_info": aggregator_info, "pre_agg_list": [],
        })
        self.attacker = byzfl.ByzantineClient({  # as train.py builds it
            "name": "SignFlipping", "f": b,
            "parameters": {"aggregator_info": aggregator_info, "pre_agg_list": [], "f": b},
        })
        new_model = self.server.get_dict_parameters()  # "Send Initial Model to All Clients"
        for client in self.clients:
            client.set_model_state(new_model)

    def round(self, record: bool = False) -> float:
        """One round of the DSGD branch of ``byzfl.benchmark.train.start_training``; return its wall time."""
        import numpy as np

        t0 = time.perf_counter()
        train_loss_per_client = np.zeros(self.h)
        for i, client in enumerate(self.clients):
            train_loss_per_client[i] = client.compute_gradients()
        train_loss_per_client.mean()
        honest_gradients = [client.get_flat_gradients_with_momentum() for client in self.clients]
        byz_vector = self.attacker.apply_attack(honest_gradients)
        gradients = honest_gradients + byz_vector
        self.server.update_model_with_gradients(gradients)
        new_model = self.server.get_dict_parameters()
        for client in self.clients:
            client.set_model_state(new_model)
        return time.perf_counter() - t0

    def param_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(p.shape) for p in self.server.model.parameters()]


# ---------------------------------------------------------------------------------------------------------------
# Equivalence: the three compute the same round
# ---------------------------------------------------------------------------------------------------------------

@contextmanager
def _forced_batches(xb: Any, yb: Any) -> Iterator[None]:
    """Make the round use the given ``(W, B, ...)`` batches instead of sampling its own."""
    from phalanx.training.algorithms import dsgd

    original = dsgd.sample_batches
    dsgd.sample_batches = lambda data, workers, batch, gen: (xb[:workers], yb[:workers])
    try:
        yield
    finally:
        dsgd.sample_batches = original


def check_equivalence(phalanx: PhalanxRunner, loop: PhalanxRunner, byz: ByzflRunner | None,
                      vmap: PhalanxRunner | None = None, rounds: int = 2) -> dict[str, Any]:
    """Run ``rounds`` rounds of each from the same θ on the same batches; return max |Δθ| (relative to the update).

    Phalanx and the loop start from m₀ = 0 here, ByzFL's convention, so that all three compute the same numbers.
    ByzFL's clients are given the same batches by replacing their ``_sample_train_batch`` for these rounds.
    """
    import torch

    from phalanx.training.shards import sample_batches
    from phalanx.training.streams import generator

    problem = phalanx.model_problem
    h = phalanx.n - phalanx.b
    out: dict[str, Any] = {"n": phalanx.n, "dim": problem.dim, "shapes": [list(s) for s in problem.layout.shapes]}
    theta0 = problem.initial_theta()
    gen = generator(SEED + 1, "check")
    batches = [sample_batches(phalanx.exp.data, h, BATCH, gen) for _ in range(rounds)]
    thetas: dict[str, torch.Tensor] = {}
    mine = [("phalanx", phalanx), ("loop", loop)] + ([("vmap", vmap)] if vmap is not None else [])
    for name, runner in mine:
        runner.reset(theta0.clone(), torch.zeros(phalanx.n, problem.dim))
        for xb, yb in batches:
            with _forced_batches(xb, yb):
                runner.round()
        thetas[name] = runner.runner.state.theta
    if byz is not None:
        out["byzfl_dim"] = sum(math.prod(s) for s in byz.param_shapes())
        out["byzfl_shapes"] = [list(s) for s in byz.param_shapes()]
        saved = [c.momentum_gradient.clone() for c in byz.clients]
        byz.server.set_parameters(theta0.clone())
        for c in byz.clients:
            c.set_model_state(byz.server.get_dict_parameters())
            c.momentum_gradient.zero_()
        for xb, yb in batches:
            for i, c in enumerate(byz.clients):
                c._sample_train_batch = (lambda x=xb[i], y=yb[i]: (x, y))
            byz.round()
        for c, m in zip(byz.clients, saved):
            del c._sample_train_batch
            c.momentum_gradient.copy_(m)
        thetas["byzfl"] = torch.cat([p.detach().reshape(-1) for p in byz.server.model.parameters()]).clone()
    scale = float((thetas["phalanx"] - theta0).abs().max())
    for name in ("loop", "vmap", "byzfl"):
        if name in thetas:
            diff = float((thetas[name] - thetas["phalanx"]).abs().max())
            out[f"{name}_max_abs"] = diff
            out[f"{name}_rel"] = diff / scale if scale > 0 else diff
    out["update_max_abs"] = scale
    return out

