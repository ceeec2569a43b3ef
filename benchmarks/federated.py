"""Time Phalanx's federated round (FedAvg) against Flower's simulation and ByzFL's FedAvg, in one command.

    .venv/bin/python benchmarks/federated.py [--quick] [--threads 1|all|both] [--no-flower] [--no-byzfl]
                                             [--no-memory] [--markdown PATH] [--json PATH]

The task (the same for all): Fashion-MNIST (``phalanx.data.load("fashion-mnist")``, Debian's
``dataset-fashion-mnist``), Phalanx's ``mlp`` 784-64-10 (``Flatten → Linear → ReLU → Linear``, θ₀ drawn as
``phalanx run`` draws it and given to every implementation), 100 clients with Phalanx's IID split (seed 0), 10
clients sampled per round, 5 local SGD steps of batch 32 with lr 0.05 (no momentum, no weight decay), no Byzantine
client, and the coordinate-wise trimmed mean trimming 1 of the 10 replies from each side (Phalanx ``cwtm`` f = 1,
Flower ``FedTrimmedAvg(beta=0.1)``, ByzFL ``TrMean`` f = 1).

What one round is in each implementation:

* **Phalanx** — the round as ``phalanx run`` runs it with ``algorithm = "fedavg"``
  (``phalanx.experiments.from_config``, :meth:`phalanx.training.Loop.step`): sample 10 of 100 clients, the 5 local
  steps of all 10 as one batched computation, the trimmed mean of their pseudo-gradients, the server step.
* **Flower + FedTrimmedAvg** — ``flwr.simulation.run_simulation`` (Flower 1.42, Ray backend) with 100 supernodes,
  2 Ray actors of 1 CPU each (all cores), and Flower's own ``FedTrimmedAvg`` (``fraction_train=0.1``,
  ``beta=0.1``) in the ServerApp. The ClientApp (``benchmarks/_bench_federated_flower.py``) loads the broadcast
  weights into the same torch MLP, takes 5 ``torch.optim.SGD`` steps on batches of 32 drawn with replacement from
  its shard (indexed by its ``partition-id``) and replies its weights. A round is everything Flower does between the
  end of one ``aggregate_train`` and the end of the next: sampling, messages through the simulation engine (each
  weight array serialised into an ``ArrayRecord`` both ways), the clients' training in the actors, aggregation.
* **Flower + PhalanxFedAvg** — the same simulation (the same run, taking turns block by block) with Phalanx's
  Flower strategy ``phalanx.flower.PhalanxFedAvg(aggregator="cwtm", f=1)`` in place of ``FedTrimmedAvg``: how much
  the strategy itself costs inside Flower.
* **ByzFL** — the body of the FedAvg branch of ByzFL 0.0.11's own training loop (``byzfl/benchmark/train.py``,
  ``start_training``: ``training_algorithm = "FedAvg"`` with ``proportion_selected_clients`` and
  ``local_steps_per_client``), called on ByzFL's own ``Client``/``Server``/``ByzantineClient``/``DataDistributor``
  objects: ``np.random.choice`` of the clients, ``Client.compute_model_update(5)`` for each in a Python loop (its
  ``DataLoader``, shuffled, without replacement), ``Server.update_model_with_weights`` (``TrMean`` of the models),
  and the new model loaded into every one of the 100 clients. The model is Phalanx's MLP registered under a name in
  ``byzfl.fed_framework.models`` (ByzFL builds its models by name; its own ``fc_mnist`` has 100 hidden units) and
  the loss ``CrossEntropyLoss`` (ByzFL's ``fc_mnist`` + ``NLLLoss`` compute the same).

Timing. Phalanx and ByzFL run in one subprocess per thread setting (1 and all cores; the OMP/MKL/OPENBLAS thread
variables set before torch is imported, and ``torch.set_num_threads``): ``warmup`` rounds each, then ``rounds``
rounds in which they take turns, the median of each. Flower runs in its own subprocess: one ``run_simulation`` in
which the two strategies first run ``flower-warmup`` rounds each (Ray and its actors start, each actor loads the data
once: excluded), then ``flower-blocks`` blocks of ``flower-block-rounds`` rounds each, taking turns block by block
(``Strategy.start`` on the same grid, continuing from the block's final weights). Flower's round time is the
interval between the ends of consecutive ``aggregate_train`` calls within a block (rounds 2… of each block); its
median is reported. No evaluation happens inside a timed round of any implementation. Ray runs with its usage stats,
Flower with its telemetry and update check off, both with their files under temporary directories; after the
simulation no process of it may be left (checked in /proc; any found is killed and reported).

Before timing, the computations are checked to agree: from the same θ₀, Phalanx's first round is replayed with the
clients and batches it drew through the Flower client's training function and Flower's own ``trim_mean``, and through
ByzFL's clients and server; the largest difference of the resulting models is printed.

``--memory`` (by default in the full run, not with ``--quick``): Phalanx FedAvg on ResNet-20 (GroupNorm; 269,722
parameters) with 1,000 clients, 100 per round, 1 local step of batch 32, trimmed mean with f = 10, on a synthetic
data set of CIFAR-10's shape and size (50,000 + 10,000 images of 3×32×32, N(0, 1) pixels, random labels: CIFAR-10 is
not on this machine; the numbers do not depend on the pixel values), 2 rounds in a fresh subprocess: peak RSS
(``ru_maxrss``) and seconds per round. One local step because the peak is set by one step's batched forward and
backward pass over the 100 clients × 32 images (the steps of a round run one after another and reuse the same
buffers); more steps only multiply the time. A watchdog kills the run if its RSS approaches the memory available,
and the part is then retried with half as many clients per round.

``--quick`` (smoke test): the embedded ``digits`` data set (8×8 images, MLP 64-64-10), 10 clients, 4 per round (f =
1, beta = 0.25), 2 local steps, 1 thread, a few rounds; Flower with 10 supernodes and 3-round blocks; no ByzFL and no
memory part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import all_threads, emit, fmt_time, md_row, package_version
from _subprocess import THREAD_ENV, run_worker

TARGET = 20.0
"""Phalanx's rounds per second should be at least this many times Flower's (``FedTrimmedAvg``)."""
SEED = 0
TITLE = "Federated rounds: Phalanx vs Flower's simulation and ByzFL's FedAvg"


@dataclass(frozen=True)
class Task:
    """The federated task every implementation runs."""

    dataset: str = "fashion-mnist"
    clients: int = 100
    per_round: int = 10
    local_steps: int = 5
    batch: int = 32
    lr: float = 0.05
    hidden: int = 64
    f: int = 1
    seed: int = SEED

    @property
    def beta(self) -> float:
        """Flower's ``FedTrimmedAvg`` share trimmed from each side: f of the round's replies."""
        return self.f / self.per_round


FULL_TASK = Task()
QUICK_TASK = Task(dataset="digits", clients=10, per_round=4, local_steps=2)


@dataclass(frozen=True)
class MemoryTask:
    """The memory part: Phalanx FedAvg on ResNet-20 with many clients."""

    clients: int = 1000
    per_round: int = 100
    local_steps: int = 1
    batch: int = 32
    rounds: int = 2
    n_train: int = 50_000
    n_test: int = 10_000


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process now (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


# ---------------------------------------------------------------------------------------------------------------
# Phalanx and ByzFL (in one process per thread setting)
# ---------------------------------------------------------------------------------------------------------------

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

        from phalanx import models
        from training import load_byzfl

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


def run_inprocess(args: argparse.Namespace, threads: int, out: str) -> None:
    """Phalanx and ByzFL at ``threads`` threads, taking turns round by round; JSON records to ``out``."""
    from phalanx.training.memory import tune_allocator

    malloc = tune_allocator()  # as phalanx.training.train does; process-wide, so ByzFL gets it too
    import torch

    torch.set_num_threads(threads)
    from phalanx import data

    task: Task = args.task
    dataset = data.load(task.dataset)
    emit(out, {"type": "env", "part": "inprocess", "threads": threads, "torch": torch.__version__,
                "malloc": malloc, "load_start": os.getloadavg()[0], "features": math.prod(dataset.input_shape),
                "classes": dataset.num_classes})
    phalanx = PhalanxRunner(task, dataset)
    runners: dict[str, Any] = {"phalanx": phalanx}
    if not args.no_byzfl:
        try:
            runners["byzfl"] = ByzflRunner(task, dataset, phalanx.theta)
        except Exception as exc:  # not installed: the table says so
            emit(out, {"type": "byzfl_missing", "threads": threads, "error": f"{type(exc).__name__}: {exc}"})
    emit(out, {"type": "check", "threads": threads,
                **check_equivalence(task, dataset, phalanx, runners.get("byzfl"))})
    for _ in range(args.warmup):
        for r in runners.values():
            r.round()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for k, r in runners.items():
            times[k].append(r.round())
    for k, r in runners.items():
        emit(out, {"type": "row", "impl": k, "threads": threads, "median_s": statistics.median(times[k]),
                    "times": times[k], "timed_rounds": len(times[k]), "rounds_run": r.rounds,
                    "test_accuracy": r.accuracy(dataset)})
    emit(out, {"type": "env_end", "part": "inprocess", "threads": threads, "load_end": os.getloadavg()[0]})


# ---------------------------------------------------------------------------------------------------------------
# Flower (its own process: one run_simulation)
# ---------------------------------------------------------------------------------------------------------------

def run_flower(args: argparse.Namespace, out: str) -> None:
    """Both Flower strategies in one ``run_simulation``; JSON records to ``out``."""
    home = Path(args._ray).with_name(Path(args._ray).name + "-flwr-home")
    os.environ["FLWR_HOME"] = str(home)  # ~/.flwr stays untouched
    import torch

    import _bench_federated_flower as fl

    task: Task = args.task
    emit(out, {"type": "env", "part": "flower", "threads": args.ray_cpus, "load_start": os.getloadavg()[0],
                "flwr": package_version("flwr"), "ray": package_version("ray"), "torch": torch.__version__})
    settings = {**asdict(task), "beta": task.beta, "warmup": args.flower_warmup, "blocks": args.flower_blocks,
                "block_rounds": args.flower_block_rounds, "ray_cpus": args.ray_cpus}
    result = fl.run(settings, args._ray)
    if not result.get("strategies"):
        raise RuntimeError("the ServerApp did not finish (see the log above)")
    for name, rec in result["strategies"].items():
        emit(out, {"type": "row", "impl": name, "threads": args.ray_cpus,
                    "median_s": statistics.median(rec["intervals"]) if rec["intervals"] else None,
                    "times": rec["intervals"], "timed_rounds": len(rec["intervals"]), "rounds_run": rec["rounds"],
                    "test_accuracy": rec["test_accuracy"], "agg_median_s": statistics.median(rec["agg_s"]),
                    "replies": sorted(set(rec["replies"])),
                    "client_median_s": statistics.median(rec["client_s"]) if rec["client_s"] else None})
    emit(out, {"type": "flower", "warmup_s": result["warmup_s"], "wall_s": result["wall_s"]})
    emit(out, {"type": "env_end", "part": "flower", "threads": args.ray_cpus, "load_end": os.getloadavg()[0]})


def _processes_mentioning(text: str) -> list[int]:
    """PIDs of the processes whose command line contains ``text`` (Ray's processes carry its session directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def flower_subprocess(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """The Flower part in a fresh interpreter (1 BLAS thread per process), then the check for leftover processes."""
    out = tmp / "flower.jsonl"
    log = tmp / "flower.log"
    ray_dir = tempfile.mkdtemp(prefix="ray")  # a short path: Ray's socket paths are limited to 107 bytes
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", "flower", "--_out", str(out),
           "--_ray", ray_dir, *_forwarded(args)]
    env = {**os.environ, **{v: "1" for v in THREAD_ENV}}
    recs: list[dict[str, Any]] = []
    error = ""
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
            if rc != 0:
                error = f"worker exited with code {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            error = f"worker stopped after {args.timeout:.0f} s"
    leftovers: list[int] = []
    for _ in range(20):  # Ray's workers are reaped within seconds of ray.shutdown()
        leftovers = _processes_mentioning(ray_dir)
        if not leftovers:
            break
        time.sleep(0.5)
    for pid in leftovers:  # started by this benchmark: end them
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(ray_dir, ignore_errors=True)
    shutil.rmtree(ray_dir + "-flwr-home", ignore_errors=True)
    if out.exists():
        recs = [json.loads(line) for line in out.read_text().splitlines()]
    recs.append({"type": "ray_leftovers", "pids": leftovers})
    if error:
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
        recs.append({"type": "error", "part": "flower", "error": error, "log": tail})
    return recs


# ---------------------------------------------------------------------------------------------------------------
# Memory: ResNet-20, many clients
# ---------------------------------------------------------------------------------------------------------------

def run_memory(args: argparse.Namespace, out: str) -> None:
    """Phalanx FedAvg on ResNet-20 with ``--_per-round`` clients per round; peak RSS and seconds per round."""
    from phalanx.training.memory import tune_allocator

    malloc = tune_allocator()
    import torch

    torch.set_num_threads(all_threads())
    from phalanx.data.base import Dataset
    from phalanx.experiments import from_config, make_config
    from phalanx.training import Loop

    mt: MemoryTask = args.memory_task
    per_round = int(args._per_round)
    rss_start = _rss_bytes()
    gen = torch.Generator().manual_seed(SEED)
    ds = Dataset.from_tensors(
        "cifar10-shaped", torch.randn(mt.n_train, 3, 32, 32, generator=gen),
        torch.randint(0, 10, (mt.n_train,), generator=gen), torch.randn(mt.n_test, 3, 32, 32, generator=gen),
        torch.randint(0, 10, (mt.n_test,), generator=gen), num_classes=10, source="synthetic N(0, 1)",
    )
    never = 10**9
    f = max(1, per_round // 10)
    cfg = make_config({
        "algorithm": "fedavg", "dataset": "cifar10", "model": "resnet20", "workers": mt.clients,
        "clients_per_round": per_round, "local_steps": mt.local_steps, "batch_size": mt.batch, "lr": 0.05,
        "momentum": 0.0, "aggregator": "cwtm", "f": f, "byzantine": 0, "attack": "none", "partition": "iid",
        "seed": SEED, "rounds": never, "eval_every": never,
    })
    exp = from_config(cfg, ds)
    loop = Loop(exp)
    loop.open()
    rss_ready = _rss_bytes()
    base = {"type": "memory", "clients": mt.clients, "per_round": per_round, "local_steps": mt.local_steps,
            "batch": mt.batch, "f": f, "dim": exp.problem.dim, "threads": torch.get_num_threads(),
            "malloc": malloc, "torch": torch.__version__, "rss_start": rss_start, "rss_ready": rss_ready,
            "load_start": os.getloadavg()[0]}
    times: list[float] = []
    peaks: list[int] = []
    for _ in range(mt.rounds):
        t0 = time.perf_counter()
        loop.step()
        times.append(time.perf_counter() - t0)
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB on Linux
        finite = bool(torch.isfinite(loop.state.theta).all())
        emit(out, {**base, "times": times, "peaks": peaks, "peak_rss": peaks[-1], "rss_end": _rss_bytes(),
                    "finite": finite, "load_end": os.getloadavg()[0]})


ALLOCATORS = {"phalanx": "phalanx run's (mallopt)", "glibc": "glibc's default"}
"""The memory part's allocator settings: the training engine's (``phalanx.training.memory.tune_allocator``, which
``phalanx run`` applies) and glibc's default (``PHALANX_NO_MALLOC_TUNING=1``)."""


def memory_subprocess(args: argparse.Namespace, tmp: Path, allocator: str) -> list[dict[str, Any]]:
    """The memory part in a fresh interpreter, watched: killed when its RSS comes within 1 GiB of what the machine
    had available at the start, then retried with half the clients per round (at most 3 tries)."""
    recs: list[dict[str, Any]] = []
    per_round = args.memory_task.per_round
    avail = _mem_available()
    limit = args.memory_limit_gib * 2**30 if args.memory_limit_gib else (
        (avail - 2**30) if avail else 20 * 2**30)
    for _attempt in range(3):
        out = tmp / f"memory-{allocator}-{per_round}.jsonl"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", "memory", "--_out", str(out),
               "--_per-round", str(per_round), *_forwarded(args)]
        env = {k: v for k, v in os.environ.items() if k != "PHALANX_NO_MALLOC_TUNING"}
        env.update({v: str(all_threads()) for v in THREAD_ENV})
        if allocator == "glibc":
            env["PHALANX_NO_MALLOC_TUNING"] = "1"
        proc = subprocess.Popen(cmd, env=env)
        t0, peak_seen, over = time.perf_counter(), 0, False
        while proc.poll() is None:
            rss = _rss_bytes(proc.pid)
            peak_seen = max(peak_seen, rss)
            if rss > limit:
                proc.kill()
                over = True
            elif time.perf_counter() - t0 > args.timeout:
                proc.kill()
            time.sleep(0.2)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        if rows and proc.returncode == 0:
            recs.append({**rows[-1], "allocator": allocator})
            break
        why = (f"RSS reached {peak_seen / 2**30:.1f} GiB > the limit {limit / 2**30:.1f} GiB" if over
               else f"exit code {proc.returncode}")
        recs.append({"type": "memory_failed", "per_round": per_round, "allocator": allocator, "error": why,
                     "rounds_done": len(rows[-1]["times"]) if rows else 0, "peak_seen": peak_seen,
                     "killed_over_limit": over, "partial": rows[-1] if rows else None})
        per_round //= 2
        if per_round < 3:  # f = max(1, per_round // 10) needs 2f < per_round
            break
    return recs


# ---------------------------------------------------------------------------------------------------------------
# Parent: subprocesses, table, notes
# ---------------------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: digits, 10 clients, 4 per round, 1 thread, few rounds, no ByzFL, no memory part")
    ap.add_argument("--threads", choices=["1", "all", "both"], default="both",
                    help="thread settings for Phalanx and ByzFL (default: both 1 and all cores)")
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds of Phalanx and ByzFL (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up rounds of Phalanx and ByzFL (default 3)")
    ap.add_argument("--flower-warmup", type=int, default=3,
                    help="warm-up rounds per Flower strategy, with Ray's start (default 3)")
    ap.add_argument("--flower-blocks", type=int, default=4, help="timed blocks per Flower strategy (default 4)")
    ap.add_argument("--flower-block-rounds", type=int, default=6,
                    help="rounds per block; the first of each is not timed (default 6)")
    ap.add_argument("--ray-cpus", type=int, default=None, help="CPUs given to Ray (default: all cores)")
    ap.add_argument("--no-flower", action="store_true", help="do not run Flower's simulation")
    ap.add_argument("--no-byzfl", action="store_true", help="do not run ByzFL")
    mem = ap.add_mutually_exclusive_group()
    mem.add_argument("--memory", action="store_true", help="run the ResNet-20 memory part (even with --quick)")
    mem.add_argument("--no-memory", action="store_true", help="skip the ResNet-20 memory part")
    ap.add_argument("--memory-only", action="store_true", help="run only the memory part")
    ap.add_argument("--memory-clients", type=int, default=MemoryTask.clients)
    ap.add_argument("--memory-per-round", type=int, default=MemoryTask.per_round)
    ap.add_argument("--memory-rounds", type=int, default=MemoryTask.rounds)
    ap.add_argument("--memory-allocator", choices=["both", *ALLOCATORS], default="both",
                    help="allocator settings of the memory part: phalanx run's (mallopt), glibc's default, or both "
                         "(default)")
    ap.add_argument("--memory-limit-gib", type=float, default=None,
                    help="kill the memory run above this RSS (default: available memory at the start − 1 GiB)")
    ap.add_argument("--markdown", metavar="PATH", help="also write the tables and notes as Markdown to PATH")
    ap.add_argument("--json", metavar="PATH", help="also write every raw measurement as JSON to PATH")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess (default 1800)")
    ap.add_argument("--width", type=int, help="table width (default: terminal width, or 200 when not a terminal)")
    ap.add_argument("--_worker", choices=["inprocess", "flower", "memory"], help=argparse.SUPPRESS)
    ap.add_argument("--_threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    ap.add_argument("--_ray", help=argparse.SUPPRESS)
    ap.add_argument("--_per-round", dest="_per_round", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.task = QUICK_TASK if args.quick else FULL_TASK
    if args.quick:
        args.no_byzfl = True
        args.rounds = min(args.rounds, 5)
        args.warmup = min(args.warmup, 1)
        args.flower_warmup = min(args.flower_warmup, 1)
        args.flower_blocks = min(args.flower_blocks, 1)
        args.flower_block_rounds = min(args.flower_block_rounds, 3)
        if args.threads == "both":
            args.threads = "1"
    args.ray_cpus = args.ray_cpus or all_threads()
    args.run_memory = args.memory or args.memory_only or not (args.quick or args.no_memory)
    args.memory_task = MemoryTask(clients=args.memory_clients, per_round=args.memory_per_round,
                                  rounds=args.memory_rounds)
    if min(args.rounds, args.flower_blocks, args.memory_rounds) < 1 or args.warmup < 0 or args.flower_warmup < 1:
        ap.error("--rounds, --flower-blocks, --memory-rounds and --flower-warmup must be >= 1, --warmup >= 0")
    if args.flower_block_rounds < 2:
        ap.error("--flower-block-rounds must be >= 2 (the first round of a block is not timed)")
    return args


def _forwarded(args: argparse.Namespace) -> list[str]:
    cmd = ["--rounds", str(args.rounds), "--warmup", str(args.warmup), "--flower-warmup", str(args.flower_warmup),
           "--flower-blocks", str(args.flower_blocks), "--flower-block-rounds", str(args.flower_block_rounds),
           "--ray-cpus", str(args.ray_cpus), "--memory-clients", str(args.memory_clients),
           "--memory-per-round", str(args.memory_per_round), "--memory-rounds", str(args.memory_rounds)]
    if args.quick:
        cmd.append("--quick")
    if args.no_byzfl:
        cmd.append("--no-byzfl")
    return cmd


def inprocess_subprocess(args: argparse.Namespace, threads: int, tmp: Path) -> list[dict[str, Any]]:
    """Phalanx and ByzFL at one thread setting in a fresh interpreter; its records (and an ``error`` record)."""
    out = tmp / f"inprocess-t{threads}.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", "inprocess", "--_threads", str(threads),
           "--_out", str(out), *_forwarded(args)]
    error = run_worker(cmd, threads, args.timeout)
    recs = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if error:
        recs.append({"type": "error", "part": f"Phalanx/ByzFL at {threads} thread(s)", "error": error})
    return recs


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}×" if x >= 100 else (f"{x:.1f}×" if x >= 10 else f"{x:.2f}×")


def fmt_gib(b: float | None) -> str:
    return "—" if b is None else f"{b / 2**30:.2f} GiB"


IMPL_LABELS = {
    "phalanx": "Phalanx (Loop.step, fedavg)",
    "byzfl": "ByzFL 0.0.11 FedAvg (its train.py loop)",
    "flower_trimmed": "Flower 1.42 run_simulation + FedTrimmedAvg",
    "flower_phalanx": "Flower 1.42 run_simulation + PhalanxFedAvg",
}
MAIN_HEADERS = ("implementation", "threads / CPUs", "s/round (median)", "rounds/s", "× Flower FedTrimmedAvg",
                "× Flower + PhalanxFedAvg", "timed rounds", "test acc. (after rounds)")


def build_rows(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One display row per (implementation, threads), Phalanx first; ratios of rounds/s against both Flower rows."""
    rows = [r for r in recs if r.get("type") == "row"]
    order = {k: i for i, k in enumerate(IMPL_LABELS)}
    rows.sort(key=lambda r: (order.get(r["impl"], 99), r["threads"]))
    ref = {r["impl"]: r.get("median_s") for r in rows if r["impl"].startswith("flower")}
    out = []
    for r in rows:
        t = r.get("median_s")
        row = dict(r)
        row["rps"] = 1 / t if t else None
        for k in ("flower_trimmed", "flower_phalanx"):
            row[f"x_{k}"] = ref[k] / t if t and ref.get(k) else None
        out.append(row)
    return out


def main_cells(row: dict[str, Any]) -> list[str]:
    acc = row.get("test_accuracy")
    threads = f"{row['threads']} (2 Ray actors × 1)" if row["impl"].startswith("flower") and row["threads"] == 2 \
        else str(row["threads"])
    return [IMPL_LABELS.get(row["impl"], row["impl"]), threads, fmt_time(row.get("median_s")),
            "—" if row["rps"] is None else f"{row['rps']:,.1f}", fmt_ratio(row["x_flower_trimmed"]),
            fmt_ratio(row["x_flower_phalanx"]), str(row.get("timed_rounds", "—")),
            "—" if acc is None else f"{100 * acc:.1f} % ({row.get('rounds_run', '?')})"]


MEMORY_HEADERS = ("model", "parameters", "clients", "per round", "local steps × batch", "threads", "allocator",
                  "peak RSS",
                  "RSS before round 1", "s/round (round 1, then the rest)", "finite θ")


def memory_cells(rec: dict[str, Any]) -> list[str]:
    """A row of the memory table: a finished run, or one that was stopped (its peak then is what the watchdog saw)."""
    failed = rec.get("type") == "memory_failed"
    part = rec.get("partial") if failed else rec
    allocator = ALLOCATORS.get(rec.get("allocator", ""), "?")
    if part is None:
        return ["ResNet-20 (GroupNorm)", "—", "—", str(rec["per_round"]), "—", "—", allocator,
                f"≥ {fmt_gib(rec.get('peak_seen'))} (stopped)", "—", "—", "—"]
    times = part["times"]
    later = f", {fmt_time(statistics.median(times[1:]))}" if len(times) > 1 else ""
    peak = f"≥ {fmt_gib(max(rec['peak_seen'], part['peak_rss']))} (stopped)" if failed else fmt_gib(part["peak_rss"])
    rounds = fmt_time(times[0]) + later + (f" (stopped in round {len(times) + 1})" if failed else "")
    return ["ResNet-20 (GroupNorm)", f"{part['dim']:,}", f"{part['clients']:,}", str(rec["per_round"]),
            f"{part['local_steps']} × {part['batch']}", str(part["threads"]), allocator, peak,
            fmt_gib(part["rss_ready"]), rounds, "yes" if part["finite"] else "NO"]


def setting_line(task: Task, recs: list[dict[str, Any]]) -> str:
    env = next((r for r in recs if r.get("type") == "env" and "features" in r), None)
    shape = f"{env['features']}-{task.hidden}-{env['classes']}" if env else f"?-{task.hidden}-?"
    return (f"{task.dataset} · MLP {shape} · {task.clients} clients, {task.per_round} per round · "
            f"{task.local_steps} local SGD steps of batch {task.batch}, lr {task.lr} · trimmed mean, f = {task.f} of "
            f"{task.per_round} (Flower beta = {task.beta:g}) · no Byzantine client · IID split, seed {task.seed}")


DIFFERENCES = (
    "What differs between the implementations (the computation is the same, see the check above): Phalanx trains "
    "the sampled clients as one batched computation in one process; Flower sends each sampled client a message "
    "through its simulation engine (the weights serialised into an ArrayRecord and back), runs the ClientApp in 2 "
    "Ray actors (1 CPU each; one client after another in each), and its engine polls for messages "
    "(InMemoryGrid.pull_interval = 0.1 s, and the engine's add_messages_to_queue checks for new messages every "
    "0.1 s), so a round also waits on these polls — that is Flower's simulation as its users run it; ByzFL runs its "
    "clients one after another with a torch DataLoader each (per-sample indexing, shuffled, without replacement, "
    "where Phalanx and the Flower client draw with replacement) and loads the new model into all clients every "
    "round (its design, timed). FedTrimmedAvg and ByzFL's TrMean average the clients' models, Phalanx and "
    "PhalanxFedAvg step by the trimmed mean of the updates: the same model (the trimmed mean commutes with the "
    "shift). ByzFL's benchmark defaults that differ from this task (weight decay 1e-4, fc_mnist's 100 hidden units) "
    "are set to the task's."
)


def notes(recs: list[dict[str, Any]], rows: list[dict[str, Any]], args: argparse.Namespace, wall: float,
          command: str) -> list[str]:
    out: list[str] = []
    for e in [r for r in recs if r.get("type") in ("error", "byzfl_missing")]:
        what = "ByzFL not available" if e["type"] == "byzfl_missing" else f"{e.get('part', 'worker')} failed"
        out.append(f"⚠ {what}: {e['error']}" + (" — log: " + " | ".join(e["log"]) if e.get("log") else ""))
    trimmed = {r["threads"]: r for r in rows if r["impl"] == "flower_trimmed"}
    phalanx_rows = [r for r in rows if r["impl"] == "phalanx"]
    if trimmed and phalanx_rows:
        measured = [r for r in phalanx_rows if r["x_flower_trimmed"] is not None]
        parts = [f"{r['threads']} thread(s) {fmt_ratio(r['x_flower_trimmed'])} "
                 f"{'✓' if r['x_flower_trimmed'] >= TARGET else '✗'}" for r in measured]
        best = max(measured, key=lambda r: r["x_flower_trimmed"], default=None)
        verdict = "—" if best is None else (
            f"{'met' if best['x_flower_trimmed'] >= TARGET else 'NOT met'} (best: {fmt_ratio(best['x_flower_trimmed'])}"
            f" at {best['threads']} thread(s))")
        out.append(f"Target ≥ {TARGET:.0f}× Flower's rounds/s (FedTrimmedAvg, same task): {verdict} — Phalanx at "
                   f"{'; '.join(parts)}.")
    ph = {r["impl"]: r for r in rows if r["impl"].startswith("flower")}
    if "flower_trimmed" in ph and "flower_phalanx" in ph:
        a, b = ph["flower_trimmed"], ph["flower_phalanx"]
        client = a.get("client_median_s")
        work = "" if client is None else (
            f" The clients' own work in the actors (load the weights, {args.task.local_steps} SGD steps, the state "
            f"dict) is {fmt_time(client)} per client (median), {fmt_time(client * args.task.per_round)} per round of "
            f"{args.task.per_round} clients over {args.ray_cpus} actors: the rest of Flower's round is messaging, "
            "serialisation and polling.")
        out.append(
            f"Inside Flower, PhalanxFedAvg's round is {fmt_time(b['median_s'])} against FedTrimmedAvg's "
            f"{fmt_time(a['median_s'])}; the strategies' own aggregate_train takes {fmt_time(b['agg_median_s'])} "
            f"(PhalanxFedAvg) and {fmt_time(a['agg_median_s'])} (FedTrimmedAvg) per round (median). Replies per "
            f"round: {a['replies']} and {b['replies']}.{work}"
        )
    checks = [r for r in recs if r.get("type") == "check"]
    if checks:
        c = checks[0]
        parts = []
        if "flower_max_abs" in c:
            parts.append(f"Flower's client + trim_mean {c['flower_max_abs']:.1e}"
                         + ("" if c.get("flower_same_theta0") else " (⚠ its θ₀ differs)"))
        if "byzfl_max_abs" in c:
            parts.append(f"ByzFL's clients + TrMean {c['byzfl_max_abs']:.1e}")
        worst = max((c.get(k, 0.0) for k in ("flower_max_abs", "byzfl_max_abs")), default=0.0)
        ok = worst <= 1e-4 * max(c["update_max_abs"], 1e-12) or worst < 1e-6
        verdict = "same round ✓" if ok and parts else "⚠ the rounds differ" if parts else "not checked"
        out.append(
            f"Equivalence ({verdict}): {c['dim']:,} parameters; Phalanx's first round (clients {c['clients']}) "
            f"replayed from the same θ₀ with the same batches, max |θ₁ − θ₁ Phalanx|: " + "; ".join(parts)
            + f" (largest |θ₁ − θ₀| coordinate {c['update_max_abs']:.1e})."
            + (f" Flower part not checked: {c['flower_error']}" if "flower_error" in c else "")
        )
    if rows:
        out.append(DIFFERENCES)
    fl = next((r for r in recs if r.get("type") == "flower"), None)
    left = next((r for r in recs if r.get("type") == "ray_leftovers"), None)
    inproc = [r for r in rows if not r["impl"].startswith("flower")]
    if inproc:
        out.append(
            f"Timing, Phalanx and ByzFL: {args.warmup} warm-up round(s), then the median of {args.rounds} rounds each, "
            "taking turns round by round, one subprocess per thread setting (the training engine's allocator setting "
            "applied, as phalanx run does). Test accuracy: after all rounds run (warm-up, check and timed), not timed."
        )
    if fl:
        out.append(
            f"Timing, Flower: one run_simulation with {args.task.clients} supernodes, Ray with {args.ray_cpus} CPUs, "
            f"1 CPU per client; excluded: Ray's and the actors' start and {args.flower_warmup} warm-up round(s) per "
            f"strategy ({fl['warmup_s']:.1f} s together), and the first round of each block; then "
            f"{args.flower_blocks} block(s) of {args.flower_block_rounds} rounds per strategy, taking turns; median "
            f"of the intervals between consecutive aggregate_train ends. The whole simulation took "
            f"{fl['wall_s']:.1f} s. Ray processes left after it: "
            + ("none" if left is not None and not left["pids"] else f"{left['pids'] if left else '?'} (killed)") + "."
        )
    mem = [r for r in recs if r.get("type") in ("memory", "memory_failed")]
    for m in mem:
        if m["type"] == "memory_failed":
            out.append(f"⚠ Memory part ({ALLOCATORS[m['allocator']]} allocator) with {m['per_round']} clients per "
                       f"round did not finish: {m['error']} ({m['rounds_done']} round(s) done).")
    done = [m for m in mem if m["type"] == "memory"]
    if done:
        mt = args.memory_task
        gib = (mt.n_train + mt.n_test) * 3 * 32 * 32 * 4 / 2**30
        runs = "; ".join(
            f"{ALLOCATORS[m['allocator']]} allocator: {m['per_round']} clients per round, peak "
            f"{fmt_gib(m['peak_rss'])} (after each round: {', '.join(fmt_gib(p) for p in m.get('peaks', []))}), "
            f"RSS before round 1 {fmt_gib(m['rss_ready'])}, after the last "
            f"{fmt_gib(m['rss_end'])}, rounds {', '.join(f'{t:.1f}' for t in m['times'])} s, load "
            f"{m['load_start']:.1f} → {m['load_end']:.1f}" for m in done)
        out.append(
            f"Memory part: Phalanx FedAvg, ResNet-20 (GroupNorm), {mt.clients:,} clients, {mt.local_steps} local "
            f"step of batch {mt.batch}, trimmed mean with f = a tenth of the clients per round, on synthetic "
            f"CIFAR-10-shaped data ({mt.n_train:,} + {mt.n_test:,} images of 3×32×32, {gib:.2f} GiB as "
            f"float32), {mt.rounds} rounds in a fresh process per allocator setting, {done[0]['threads']} "
            "threads. Peak RSS is ru_maxrss: the whole process — interpreter, torch, data, model, the clients' "
            f"stacked parameters and one local step's activations over all of the round's clients. {runs}."
        )
        by = {m["allocator"]: m for m in done}
        stopped = {(m["allocator"], m["per_round"]): m for m in mem if m["type"] == "memory_failed"}
        if "glibc" in by and ("phalanx", by["glibc"]["per_round"]) in stopped:
            m = stopped[("phalanx", by["glibc"]["per_round"])]
            out.append(
                f"With the allocator setting that phalanx run applies (phalanx.training.memory: mallopt "
                f"M_MMAP_THRESHOLD = 1 GiB, M_TRIM_THRESHOLD = 2 GiB), {m['per_round']} clients per round reached "
                f"{fmt_gib(m['peak_seen'])} and were stopped; with glibc's default the same run peaks at "
                f"{fmt_gib(by['glibc']['peak_rss'])}: freed blocks under 1 GiB stay in the process's heap for reuse "
                "instead of going back to the kernel (which spares page faults: see the training benchmark), so the "
                "peak counts memory the allocator keeps besides the live tensors."
            )
        if "phalanx" in by and "glibc" in by and by["phalanx"]["per_round"] == by["glibc"]["per_round"]:
            out.append(
                f"The allocator setting that phalanx run applies (phalanx.training.memory: mallopt M_MMAP_THRESHOLD = "
                f"1 GiB, M_TRIM_THRESHOLD = 2 GiB) raises this peak from {fmt_gib(by['glibc']['peak_rss'])} to "
                f"{fmt_gib(by['phalanx']['peak_rss'])}: freed blocks under 1 GiB stay in the process's heap for reuse "
                "instead of going back to the kernel (which spares page faults: see the training benchmark), so the "
                "peak counts memory the allocator keeps besides the live tensors."
            )
    envs = [r for r in recs if r.get("type") == "env"]
    torch_v = next((e["torch"] for e in [*envs, *mem] if "torch" in e), "?")
    ends = {(r["part"], r["threads"]): r for r in recs if r.get("type") == "env_end"}
    load = "; ".join(f"{e['part']} {e['threads']}: {e['load_start']:.1f} → "
                     f"{ends.get((e['part'], e['threads']), {}).get('load_end', float('nan')):.1f}" for e in envs)
    out.append(
        f"Machine: {cpu_model()}, {all_threads()} cores, {_mem_total()}, Python {platform.python_version()}, torch "
        f"{torch_v}, flwr {package_version('flwr')}, ray {package_version('ray')}, byzfl {package_version('byzfl')}"
        + (f"; 1-min load average (start → end of each part) {load}" if load else "")
        + f". Wall time {wall:.0f} s. Command: {command}"
    )
    return out


def _mem_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB RAM"
    except (OSError, ValueError):
        pass
    return "? RAM"


def print_report(rows: list[dict[str, Any]], mem: list[dict[str, Any]], note_lines: list[str], width: int | None,
                 setting: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width or (None if sys.stdout.isatty() else 200))
    if rows:
        t = Table(title=f"{TITLE}\n{setting}")
        for h in MAIN_HEADERS:
            t.add_column(h, justify="left" if h == "implementation" else "right")
        for r in rows:
            t.add_row(*main_cells(r))
        console.print(t)
    if mem:
        m = Table(title="Memory: Phalanx FedAvg, ResNet-20, synthetic CIFAR-10-shaped data")
        for h in MEMORY_HEADERS:
            m.add_column(h, justify="right")
        for rec in mem:
            m.add_row(*memory_cells(rec))
        console.print(m)
    for line in note_lines:
        console.print(line, highlight=False, markup=False)


def write_markdown(path: str, rows: list[dict[str, Any]], mem: list[dict[str, Any]], note_lines: list[str],
                   setting: str) -> None:
    lines = [f"## {TITLE}", "", setting, "", md_row(MAIN_HEADERS),
             md_row([":---", *["---:"] * (len(MAIN_HEADERS) - 1)])]
    lines += [md_row(main_cells(r)) for r in rows]
    if mem:
        lines += ["", "### Memory: Phalanx FedAvg, ResNet-20", "", md_row(MEMORY_HEADERS),
                  md_row(["---:"] * len(MEMORY_HEADERS))]
        lines += [md_row(memory_cells(r)) for r in mem]
    lines += [""] + [f"- {line}" for line in note_lines]
    Path(path).write_text("\n".join(lines) + "\n")


def _worker_main(args: argparse.Namespace) -> int:
    runs: dict[str, Callable[[], None]] = {
        "inprocess": lambda: run_inprocess(args, int(args._threads), args._out),
        "flower": lambda: run_flower(args, args._out),
        "memory": lambda: run_memory(args, args._out),
    }
    runs[args._worker]()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run every part in its own subprocess and print one combined report."""
    args = parse_args(argv)
    if args._worker:
        return _worker_main(args)
    if args.task.dataset == "fashion-mnist":
        from phalanx import data
        from phalanx.data.base import DatasetNotFoundError

        try:
            data.load("fashion-mnist")
        except DatasetNotFoundError as exc:
            print(f"{exc}\n(apt-get install dataset-fashion-mnist, or run with --quick)", file=sys.stderr)
            return 2
    command = ".venv/bin/python benchmarks/federated.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    thread_settings = list(dict.fromkeys({"1": [1], "all": [all_threads()],
                                          "both": [1, all_threads()]}[args.threads]))
    recs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-federated-") as tmp:
        if not args.memory_only:
            for threads in thread_settings:
                recs += inprocess_subprocess(args, threads, Path(tmp))
            if not args.no_flower:
                recs += flower_subprocess(args, Path(tmp))
        if args.run_memory:
            for allocator in ALLOCATORS if args.memory_allocator == "both" else [args.memory_allocator]:
                recs += memory_subprocess(args, Path(tmp), allocator)
    wall = time.perf_counter() - t0
    rows = build_rows(recs)
    mem = [r for r in recs if r.get("type") in ("memory", "memory_failed")]
    note_lines = notes(recs, rows, args, wall, command.strip())
    setting = setting_line(args.task, recs)
    print_report(rows, mem, note_lines, args.width, setting)
    if args.markdown:
        write_markdown(args.markdown, rows, mem, note_lines, setting)
    if args.json:
        Path(args.json).write_text(json.dumps({"records": recs, "wall_s": wall, "command": command}, indent=1))
    failed = any(r.get("type") == "error" for r in recs)
    return 1 if failed or not (rows or mem) else 0


if __name__ == "__main__":
    sys.exit(main())
