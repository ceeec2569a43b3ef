"""Time Phalanx's simulated training round against ByzFL 0.0.11's own DSGD loop and a per-worker loop, in one command.

    .venv/bin/python benchmarks/training.py [--quick] [--threads 1|all|both] [--no-byzfl] [--markdown PATH]

Setting (the same for all three): Fashion-MNIST (``phalanx.data.load("fashion-mnist")``, Debian's
``dataset-fashion-mnist``), the 784-100-10 ReLU MLP (ByzFL's ``fc_mnist``; Phalanx's ``mlp`` with
``hidden=(100,)``), batch 32 per worker, IID split, worker momentum 0.9, server SGD with lr 0.1 and no weight decay,
n workers of which b = n/10 send sign-flipped vectors (ByzFL ``SignFlipping``, Phalanx ``signflip``), coordinate-wise
trimmed mean with f = n/10 (ByzFL ``TrMean``, Phalanx ``cwtm``).

The three implementations of one round:

* **ByzFL** — the body of the DSGD branch of ByzFL's own training loop (``byzfl/benchmark/train.py``,
  ``start_training``), called on ByzFL's own ``Client``/``Server``/``ByzantineClient``/``DataDistributor`` objects:
  every honest client draws a batch from its ``DataLoader`` and back-propagates, the flat momentum vectors are
  collected, the attack appends its vectors, the server aggregates (``RobustAggregator``) and takes an SGD step,
  and the new model is loaded into every client. ByzFL's evaluation, logging and file writing are not timed (none
  happens in the rounds between two evaluations).
* **loop** — Phalanx's round (:meth:`phalanx.training.Loop.step`, in-process transport) with the honest gradients
  from :meth:`Problem.grads_loop` (one ``torch.func.grad`` call per worker) instead of the single batched call.
  Everything else (sampling, momentum, attack, rule, step) is Phalanx's: the ratio isolates vectorisation.
* **Phalanx** — the round as ``phalanx run`` runs it (``phalanx.experiments.from_config``, ``Loop.step``). For this
  MLP the per-worker gradients come from explicit back-propagation (:mod:`phalanx.training.linear_stack`: batched matrix
  products fused with the momentum update).
* **vmap** — the same round with the gradients from the generic ``vmap(grad)`` path (``Problem(per_worker="vmap")``),
  the one every other model (CNN, ResNet) takes: how fast Phalanx is on models without the fast path.

n ∈ {10, 50, 200} for all four and n = 1000 for Phalanx and vmap; ByzFL and the loop at n = 1000 are run for 2
rounds (after 1 warm-up round) when their time, extrapolated linearly from n = 200, stays under 60 s, else reported
as that extrapolation (marked ≈; it is a lower bound on their time: ByzFL's sort grows faster than n). Each thread
setting (1 and all cores) runs in its own subprocess of this script, with the OMP/MKL/OPENBLAS thread variables set
before torch is imported (and ``torch.set_num_threads``). Timing: ``warmup`` rounds, then ``rounds`` rounds in which the
implementations take turns (ByzFL, loop, vmap, Phalanx, ByzFL, …) so that a change in the machine's load hits
them alike; the median of each is reported. The split of Phalanx's round (gradients / aggregation / rest) is
measured in the same rounds by thin timing wrappers around the gradient call (``Problem.accumulate_grads``: the
gradients fused with the momentum update) and the rule.

Before timing, the implementations are checked to compute the same round: same parameter count and layout, and, from the
same θ with the same batches, two rounds of each (ByzFL's momentum convention m₀ = 0 given to Phalanx) give the same
θ up to float32 rounding. What still differs between them is printed below the tables.

``--quick`` (smoke test): the embedded ``digits`` data set (8×8 images, MLP 64-100-10), n = 10, 1 thread, Phalanx
and the loop only, 3 rounds. ``--profile N``: also print torch.profiler's top operators over 3 Phalanx rounds at n=N.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import all_threads, emit, fmt_time, md_row, package_version
from _subprocess import run_worker

FULL_NS = (10, 50, 200)
BIG_N = 1000
QUICK_N = 10
TARGET = 10.0
"""Phalanx should be at least this many times faster than ByzFL at n ≥ :data:`TARGET_FROM_N`."""
TARGET_FROM_N = 50
BIG_N_BUDGET_S = 60.0
"""ByzFL and the loop run at n = 1000 when (1 warm-up + 2 timed rounds) are extrapolated to take at most this."""
DESIGN_BYZFL = {10: 0.013, 50: 0.10, 200: 0.49}
"""ByzFL's DSGD round as first measured on the development machine before Phalanx existed (same setting, 2 threads),
seconds: docs/benchmarks.md, "Peers measured before Phalanx"."""

IMPLS = ("byzfl", "loop", "vmap", "phalanx")
HIDDEN = 100
BATCH = 32
LR = 0.1
MOMENTUM = 0.9
SEED = 0


def byzantine_of(n: int) -> int:
    """b = f = n/10 (at least 1)."""
    return max(1, n // 10)


def _minor_faults() -> int:
    try:
        import resource
    except ImportError:  # pragma: no cover - not Unix
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def tune_malloc() -> str:
    """Apply the training engine's allocator setting (``phalanx.training.memory.tune_allocator``), as ``train()`` does.

    It is process-wide, so ByzFL and the loop, which run in the same process, get it too (the comparison stays fair).
    """
    from phalanx.training.memory import tune_allocator

    if tune_allocator():
        return "mallopt(M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=2 GiB) for all three, as phalanx.training.train does"
    return "allocator setting not applied (not glibc, or PHALANX_NO_MALLOC_TUNING set)"


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

STUBBED: list[str] = []
_BYZFL_IMPORT_ONLY = (  # imported by `import byzfl` (its benchmark and plotting modules), unused by its round
    ("torchvision", ("datasets", "transforms")),
    ("seaborn", ()),
    ("matplotlib", ("pyplot",)),
    ("scipy", ("spatial", "spatial.distance")),
)


def _stub_attr(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return lambda *args, **kwargs: None


def load_byzfl() -> Any:
    """``import byzfl``, with each of its import-time-only dependencies that is not installed stubbed in sys.modules.

    ``byzfl.benchmark.train`` builds torchvision transforms at import time; torchvision is not installed here (it
    would pull another torch). The stubs are empty modules whose attributes are no-op callables (:data:`STUBBED`).
    """
    import importlib.util

    for top, subs in _BYZFL_IMPORT_ONLY:
        if top not in sys.modules and importlib.util.find_spec(top) is None:
            for name in (top, *(f"{top}.{s}" for s in subs)):
                mod = types.ModuleType(name)
                mod.__getattr__ = _stub_attr  # type: ignore[method-assign]
                sys.modules[name] = mod
                parent, _, child = name.rpartition(".")
                if parent:
                    setattr(sys.modules[parent], child, mod)
            STUBBED.append(top)
    import byzfl

    return byzfl


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


# ---------------------------------------------------------------------------------------------------------------
# One thread setting (runs in a subprocess)
# ---------------------------------------------------------------------------------------------------------------

def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _measure(runners: dict[str, Any], warmup: int, rounds: int) -> dict[str, list[float]]:
    """Warm up every runner, then time ``rounds`` rounds of each, taking turns."""
    for _ in range(warmup):
        for r in runners.values():
            r.round()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(rounds):
        for k, r in runners.items():
            times[k].append(r.round(record=True))
    return times


def run_thread_setting(args: argparse.Namespace, threads: int, out: str) -> None:
    """Measure every n at ``threads`` threads; write one JSON line per n to ``out``."""
    malloc = "" if args.no_tune_malloc else tune_malloc()
    import torch

    torch.set_num_threads(threads)
    from phalanx import data

    dataset = data.load(args.dataset)
    emit(out, {"type": "env", "threads": threads, "torch_threads": torch.get_num_threads(),
                "load_start": os.getloadavg()[0], "torch": torch.__version__, "malloc": malloc,
                "features": math.prod(dataset.input_shape), "classes": dataset.num_classes})
    use_byzfl = not args.no_byzfl
    if use_byzfl:
        try:
            load_byzfl()
            emit(out, {"type": "stubs", "stubbed": STUBBED})
        except Exception as exc:  # not installed: the table says so
            emit(out, {"type": "byzfl_missing", "error": f"{type(exc).__name__}: {exc}"})
            use_byzfl = False
    measured: dict[str, dict[int, float]] = {k: {} for k in IMPLS}
    for n in args.ns:
        rec: dict[str, Any] = {"type": "row", "n": n, "threads": threads, "b": byzantine_of(n)}
        big = n > max(FULL_NS)
        t_build = time.perf_counter()
        runners: dict[str, Any] = {}
        peers = [k for k in ("byzfl", "loop") if k != "byzfl" or use_byzfl]
        if big:  # the slow implementations only when their extrapolated time fits the budget
            for k in list(peers):
                ref = [m for m in measured[k] if m <= max(FULL_NS)]
                if not ref:
                    peers.remove(k)
                    continue
                n0 = max(ref)
                est = measured[k][n0] * n / n0
                rec[f"{k}_estimate"] = est
                rec[f"{k}_estimate_from"] = n0
                if args.big_peers == "estimate" or (args.big_peers == "auto" and 3 * est > BIG_N_BUDGET_S):
                    peers.remove(k)
        if "byzfl" in peers:
            runners["byzfl"] = ByzflRunner(n, dataset)
        if "loop" in peers:
            runners["loop"] = PhalanxRunner(n, dataset, args.dataset, loop=True)
        runners["vmap"] = PhalanxRunner(n, dataset, args.dataset, loop=False, per_worker="vmap")
        phalanx = PhalanxRunner(n, dataset, args.dataset, loop=False)
        runners["phalanx"] = phalanx
        rec["build_s"] = time.perf_counter() - t_build
        if "loop" in runners and not big:
            rec["check"] = check_equivalence(phalanx, runners["loop"], runners.get("byzfl"), runners["vmap"])
        warmup, rounds = (1, 2) if big else (args.warmup, args.rounds)
        if big:
            rounds_by = {k: (args.big_rounds if k in ("phalanx", "vmap") else 2) for k in runners}
        else:
            rounds_by = {k: rounds for k in runners}
        # take turns while every runner still has rounds to do, then finish Phalanx's extra rounds alone
        common = min(rounds_by.values())
        times = _measure(runners, warmup, common)
        extra = {k: rounds_by[k] - common for k in runners}
        for _ in range(max(extra.values())):  # Phalanx's (and vmap's) extra rounds, still taking turns
            for k, r in runners.items():
                if extra[k] > 0:
                    times[k].append(r.round(record=True))
                    extra[k] -= 1
        for k in runners:
            rec[k] = _median(times[k])
            rec[f"{k}_times"] = times[k]
            if rec[k] is not None:
                measured[k][n] = rec[k]
        rec["split_grads"] = _median(phalanx.split.grads)
        rec["split_agg"] = _median(phalanx.split.agg)
        rec["split_grads_vmap"] = _median(runners["vmap"].split.grads)
        rec["faults"] = statistics.median(phalanx.split.faults) if phalanx.split.faults else None
        rec["rounds"] = {k: len(v) for k, v in times.items()}
        rec["dim"] = phalanx.model_problem.dim
        rec["load"] = os.getloadavg()[0]
        emit(out, rec)
        del runners, phalanx
    if args.profile:
        emit(out, {"type": "profile", "n": args.profile, "threads": threads,
                    "table": profile_phalanx(args.profile, dataset, args.dataset)})
    emit(out, {"type": "env_end", "threads": threads, "load_end": os.getloadavg()[0]})


def profile_phalanx(n: int, dataset: Any, dataset_name: str) -> str:
    """torch.profiler's operators (by self CPU time) over 3 Phalanx rounds at n workers, after 2 warm-up rounds."""
    from torch.profiler import ProfilerActivity, profile

    runner = PhalanxRunner(n, dataset, dataset_name, loop=False)
    for _ in range(2):
        runner.round()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            runner.round()
    return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


# ---------------------------------------------------------------------------------------------------------------
# Parent: subprocesses, table, notes
# ---------------------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: digits, n=10, 1 thread, Phalanx and the loop only, 3 rounds")
    ap.add_argument("--threads", choices=["1", "all", "both"], default="both",
                    help="thread settings to run (default: both 1 and all cores)")
    ap.add_argument("--no-byzfl", action="store_true", help="do not run ByzFL (Phalanx and the loop only)")
    ap.add_argument("--ns", help=f"comma-separated worker counts (default: {','.join(map(str, FULL_NS))},{BIG_N})")
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds per implementation (default 20)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up rounds per implementation (default 2)")
    ap.add_argument("--big-rounds", type=int, default=5, help="timed Phalanx rounds at n > 200 (default 5)")
    ap.add_argument("--big-peers", choices=["auto", "run", "estimate"], default="auto",
                    help=f"ByzFL and the loop at n > 200: run 2 rounds if extrapolated ≤ {BIG_N_BUDGET_S:.0f} s "
                         "(auto), always (run), or only extrapolate (estimate)")
    ap.add_argument("--dataset", default=None, help="data set (default fashion-mnist; digits with --quick)")
    ap.add_argument("--no-tune-malloc", action="store_true",
                    help="skip the training engine's allocator setting (mallopt; applied by default, process-wide)")
    ap.add_argument("--profile", type=int, metavar="N", help="also profile 3 Phalanx rounds at n=N")
    ap.add_argument("--markdown", metavar="PATH", help="also write the tables and notes as Markdown to PATH")
    ap.add_argument("--json", metavar="PATH", help="also write every raw measurement as JSON to PATH")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per thread setting (default 3600)")
    ap.add_argument("--width", type=int, help="table width (default: terminal width, or 200 when not a terminal)")
    ap.add_argument("--_worker", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.no_byzfl = True
        args.dataset = args.dataset or "digits"
        args.ns = args.ns or str(QUICK_N)
        args.rounds = min(args.rounds, 3)
        args.warmup = min(args.warmup, 1)
        if args.threads == "both":
            args.threads = "1"
    args.dataset = args.dataset or "fashion-mnist"
    args.ns = [int(x) for x in args.ns.split(",")] if isinstance(args.ns, str) else [*FULL_NS, BIG_N]
    if args.rounds < 1 or args.warmup < 0 or args.big_rounds < 1:
        ap.error("--rounds and --big-rounds must be >= 1, --warmup >= 0")
    if args.dataset != "fashion-mnist" and not args.no_byzfl:
        ap.error("ByzFL's fc_mnist takes 28×28 images: use --dataset fashion-mnist or --no-byzfl")
    return args


def _forwarded(args: argparse.Namespace) -> list[str]:
    cmd = ["--ns", ",".join(map(str, args.ns)), "--rounds", str(args.rounds), "--warmup", str(args.warmup),
           "--big-rounds", str(args.big_rounds), "--big-peers", args.big_peers, "--dataset", args.dataset]
    if args.no_byzfl:
        cmd.append("--no-byzfl")
    if args.no_tune_malloc:
        cmd.append("--no-tune-malloc")
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    return cmd


def run_subprocess(args: argparse.Namespace, threads: int, tmp: Path) -> list[dict[str, Any]]:
    """One thread setting in a fresh interpreter; its JSON records (plus an ``error`` record if it failed)."""
    out = tmp / f"t{threads}.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", str(threads), "--_out", str(out),
           *_forwarded(args)]
    error = run_worker(cmd, threads, args.timeout)
    recs = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if error:
        recs.append({"type": "error", "threads": threads, "error": error})
    return recs


def fmt_ratio(x: float) -> str:
    """``5.3×``; two decimals where one would round across the target (9.98 → ``9.98×``, not ``10.0×``)."""
    return f"{x:.2f}×" if (round(x, 1) >= TARGET) != (x >= TARGET) else f"{x:.1f}×"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def build_rows(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One display row per (n, threads): cells for the main table and for the split table."""
    rows = []
    for r in recs:
        if r.get("type") != "row":
            continue
        row: dict[str, Any] = {"n": r["n"], "threads": r["threads"], "b": r["b"]}
        for k in ("byzfl", "loop"):
            t, est = r.get(k), r.get(f"{k}_estimate")
            if t is not None:
                row[k], row[f"{k}_cell"] = t, fmt_time(t) + ("†" if r["n"] > max(FULL_NS) else "")
            elif est is not None:
                row[k], row[f"{k}_cell"] = est, "≈" + fmt_time(est)
            else:
                row[k], row[f"{k}_cell"] = None, "—"
            row[f"{k}_est"] = t is None and est is not None
        p = r.get("phalanx")
        row["phalanx"] = p
        row["phalanx_cell"] = fmt_time(p)
        row["rps"] = f"{1 / p:,.1f}" if p else "—"
        for k in ("byzfl", "loop"):
            x = _ratio(row[k], p)
            row[f"x_{k}"] = x
            row[f"x_{k}_cell"] = "—" if x is None else ("≈" if row[f"{k}_est"] else "") + fmt_ratio(x)
        v = r.get("vmap")
        row["vmap"] = v
        row["vmap_cell"] = fmt_time(v)
        xv = _ratio(row["byzfl"], v)
        row["x_vmap_cell"] = "—" if xv is None else ("≈" if row["byzfl_est"] else "") + fmt_ratio(xv)
        xb = row["x_byzfl"]
        if r["n"] < TARGET_FROM_N:
            row["target"] = "— (n < 50)"
        elif xb is None:
            row["target"] = "—"
        else:
            row["target"] = ("✓" if xb >= TARGET else "✗") + (" (≈)" if row["byzfl_est"] else "")
        g, a = r.get("split_grads"), r.get("split_agg")
        if p and g is not None and a is not None:
            rest = max(0.0, p - g - a)
            row["split"] = [f"{fmt_time(v)} ({100 * v / p:.0f}%)" for v in (g, a, rest)]
        else:
            row["split"] = ["—"] * 3
        row["split"].insert(1, fmt_time(r.get("split_grads_vmap")))
        faults = r.get("faults")
        row["split"].append("—" if faults is None else f"{faults * 4096 / 2**20:,.0f} MiB")
        row["check"] = r.get("check")
        row["rounds"] = r.get("rounds", {})
        rows.append(row)
    rows.sort(key=lambda x: (x["n"], x["threads"]))
    return rows


MAIN_HEADERS = ("n", "threads", "ByzFL s/round", "loop s/round", "vmap s/round", "Phalanx s/round",
                "Phalanx rounds/s", "speed-up vs ByzFL", "speed-up vs loop", "vmap: speed-up vs ByzFL",
                f"≥{TARGET:.0f}× ByzFL (n≥{TARGET_FROM_N})")
SPLIT_HEADERS = ("n", "threads", "Phalanx round", "gradients + momentum", "(same by vmap)", "aggregation (cwtm)",
                 "rest (sampling, attack, step)", "page-faulted per round")


def main_cells(row: dict[str, Any]) -> list[str]:
    return [str(row["n"]), str(row["threads"]), row["byzfl_cell"], row["loop_cell"], row["vmap_cell"],
            row["phalanx_cell"], row["rps"], row["x_byzfl_cell"], row["x_loop_cell"], row["x_vmap_cell"],
            row["target"]]


def split_cells(row: dict[str, Any]) -> list[str]:
    return [str(row["n"]), str(row["threads"]), row["phalanx_cell"], *row["split"]]


DIFFERENCES = (
    "What differs between ByzFL's round and Phalanx's: (1) momentum start — ByzFL m₀ = 0 (its first "
    "vector is 0.1·g₀), Phalanx m₀ = g₀ (the equivalence check gives Phalanx ByzFL's m₀); (2) sampling — ByzFL: "
    "each client's torch DataLoader (shuffled, without replacement, 32 per-sample __getitem__ + collate in "
    "Python); Phalanx: 32 indices with replacement per worker, one gather for all workers; (3) input — ByzFL's "
    "own benchmark reads Fashion-MNIST as PIL images with RandomHorizontalFlip + ToTensor per sample; here it "
    "gets the same standardised float tensors as Phalanx (no augmentation), which favours ByzFL; (4) loss — "
    "ByzFL's fc_mnist ends in log_softmax with NLLLoss, Phalanx's mlp gives logits to cross_entropy: same value "
    "and gradient; (5) ByzFL's round also loads the new model into every client (load_state_dict) — part of "
    "its design, timed; (6) initial weights differ (each library's own init; same shapes); (7) weight decay 0 "
    "in both (ByzFL's benchmark default is 1e-4), no server momentum, lr 0.1 constant in both."
)
"""What differs between the ByzFL round and Phalanx's, printed under the table."""


def notes(recs: list[dict[str, Any]], rows: list[dict[str, Any]], args: argparse.Namespace, wall: float,
          command: str) -> list[str]:
    """The text under the tables: the equivalence check, what differs, how it was measured, the machine."""
    out: list[str] = []
    envs = {r["threads"]: r for r in recs if r.get("type") == "env"}
    ends = {r["threads"]: r for r in recs if r.get("type") == "env_end"}
    errors = [r for r in recs if r.get("type") in ("error", "byzfl_missing")]
    for e in errors:
        out.append(f"⚠ {'ByzFL not available' if e['type'] == 'byzfl_missing' else 'worker failed'}: {e['error']}")
    checks = [r["check"] for r in rows if r.get("check")]
    seen: set[int] = set()
    lines = []
    for c in checks:
        if c["n"] in seen:
            continue
        seen.add(c["n"])
        part = f"n={c['n']}: loop {c.get('loop_max_abs', float('nan')):.1e}"
        if "vmap_max_abs" in c:
            part += f", vmap {c['vmap_max_abs']:.1e}"
        if "byzfl_max_abs" in c:
            part += f", ByzFL {c['byzfl_max_abs']:.1e}"
        lines.append(part + f" (largest |θ₂−θ₀| coordinate {c['update_max_abs']:.1e})")
    if checks:
        c0 = checks[0]
        shapes = " + ".join("×".join(map(str, s)) for s in c0["shapes"])
        same = ""
        if "byzfl_dim" in c0:
            ok = c0["byzfl_shapes"] == c0["shapes"] and c0["byzfl_dim"] == c0["dim"]
            same = f"; ByzFL fc_mnist: {c0['byzfl_dim']:,} ({'same layout' if ok else 'DIFFERENT layout'})"
        worst = max((c.get(k, 0.0) for c in checks for k in ("loop_rel", "vmap_rel", "byzfl_rel")), default=0.0)
        verdict = "same round ✓" if worst < 1e-4 else "⚠ the rounds differ"
        out.append(
            f"Equivalence ({verdict}): parameters {c0['dim']:,} = {shapes}{same}. From the same θ₀ with the same "
            f"batches, 2 rounds (momentum m₀ = 0 for all), max |θ − θ_Phalanx|: " + "; ".join(lines) + "."
        )
    ran_byzfl = any(r["byzfl"] is not None for r in rows)
    if ran_byzfl:
        out.append(DIFFERENCES)
    else:
        out.append("The loop differs from Phalanx only in how the honest gradients are computed "
                   "(Problem.grads_loop: one torch.func.grad call per worker, vs all workers at once).")
    out.append("vmap differs from Phalanx only in the gradients: the generic vmap(grad) path (every model "
               "without a fast path takes it) instead of the MLP's explicit back-propagation.")
    est_rows = [r for r in rows if r["byzfl_est"] or r["loop_est"]]
    big_run = [r for r in rows if r["n"] > max(FULL_NS) and not (r["byzfl_est"] or r["loop_est"])
               and (r["byzfl"] is not None or r["loop"] is not None)]
    if est_rows:
        out.append(
            f"≈: extrapolated linearly from the largest n ≤ {max(FULL_NS)} measured in the same run (not run: 1 "
            f"warm-up + 2 rounds would take more than {BIG_N_BUDGET_S:.0f} s); ByzFL's sort grows faster than n, so "
            "the true time is at least this and the speed-up at least the one shown."
        )
    if big_run:
        out.append(f"†: n > {max(FULL_NS)}: ByzFL and the loop timed over 2 rounds after 1 warm-up round "
                   f"(Phalanx and vmap: {args.big_rounds} rounds).")
    out.append(
        f"Timing: {args.warmup} warm-up round(s), then the median of {args.rounds} rounds per implementation, the "
        "implementations taking turns round by round; speed-up = peer s/round ÷ Phalanx s/round; split measured in "
        "the same Phalanx rounds (rest = round − gradients − aggregation). Page-faulted per round: minor page faults "
        "of the process during one Phalanx round × 4 KiB — memory the kernel had to map and zero again because a block "
        "freed in the previous round was returned to it (glibc unmaps blocks above its mmap threshold, at most "
        "32 MiB by default, on free)."
    )
    malloc = {e.get("malloc", "") for e in envs.values()} - {""}
    if malloc:
        out.append(f"Allocator: every worker process applied {', '.join(sorted(malloc))} "
                   "(all three implementations alike; --no-tune-malloc skips it).")
    missed = [r for r in rows if r["n"] >= TARGET_FROM_N and r["x_byzfl"] is not None and r["x_byzfl"] < TARGET]
    if missed:
        worst_row = min(missed, key=lambda r: r["x_byzfl"])
        out.append(
            f"Target ≥{TARGET:.0f}× ByzFL at n ≥ {TARGET_FROM_N}: missed in {len(missed)} row(s) (lowest "
            f"{worst_row['x_byzfl']:.1f}× at n={worst_row['n']}, {worst_row['threads']} thr); see the split table "
            "and --profile N for where the time goes."
        )
    design = ", ".join(f"n={n}: {t} s" for n, t in DESIGN_BYZFL.items())
    out.append(f"Reference: ByzFL's round at 2 threads was first measured as {design} (docs/benchmarks.md).")
    load = "; ".join(
        f"{t} thr: {envs[t]['load_start']:.1f} → {ends.get(t, {}).get('load_end', float('nan')):.1f}"
        for t in sorted(envs)
    )
    torch_v = next(iter(envs.values()))["torch"] if envs else "?"
    stubbed = sorted({m for r in recs if r.get("type") == "stubs" for m in r["stubbed"]})
    stub = f"; stubbed for `import byzfl` (not installed): {', '.join(stubbed)}" if ran_byzfl and stubbed else ""
    out.append(
        f"Machine: {platform.processor() or platform.machine()}, {all_threads()} cores, Python "
        f"{platform.python_version()}, torch {torch_v}, byzfl {package_version('byzfl')}; 1-min load average "
        f"(start → end of each thread setting) {load}{stub}. Data: {args.dataset}. Wall time {wall:.0f} s. "
        f"Command: {command}"
    )
    return out


def setting_line(recs: list[dict[str, Any]]) -> str:
    """The model and round setting, from what the workers loaded."""
    env = next((r for r in recs if r.get("type") == "env"), {"features": "?", "classes": "?"})
    return (f"MLP {env['features']}-{HIDDEN}-{env['classes']} · batch {BATCH} per worker · cwtm/TrMean f = n/10 · "
            f"signflip on b = n/10 workers · momentum {MOMENTUM} · lr {LR}")


TITLE = "Phalanx training round vs ByzFL 0.0.11 and a per-worker loop"


def print_report(rows: list[dict[str, Any]], note_lines: list[str], width: int | None,
                 profiles: list[dict[str, Any]], setting: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width or (None if sys.stdout.isatty() else 200))
    t = Table(title=f"{TITLE}\n{setting}")
    for h in MAIN_HEADERS:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*main_cells(r))
    console.print(t)
    s = Table(title="Where Phalanx's round goes (median per part)")
    for h in SPLIT_HEADERS:
        s.add_column(h, justify="right")
    for r in rows:
        s.add_row(*split_cells(r))
    console.print(s)
    for line in note_lines:
        console.print(line, highlight=False, markup=False)
    for p in profiles:
        console.print(f"\ntorch.profiler, 3 Phalanx rounds at n={p['n']}, {p['threads']} thr:", markup=False)
        console.print(p["table"], highlight=False, markup=False)


def write_markdown(path: str, rows: list[dict[str, Any]], note_lines: list[str],
                   profiles: list[dict[str, Any]], setting: str) -> None:
    lines = [f"## {TITLE}", "", setting, "", md_row(MAIN_HEADERS), md_row(["---:"] * len(MAIN_HEADERS))]
    lines += [md_row(main_cells(r)) for r in rows]
    lines += ["", "### Where Phalanx's round goes", "", md_row(SPLIT_HEADERS), md_row(["---:"] * len(SPLIT_HEADERS))]
    lines += [md_row(split_cells(r)) for r in rows]
    lines += [""] + [f"- {line}" for line in note_lines]
    for p in profiles:
        lines += ["", f"torch.profiler, 3 Phalanx rounds at n={p['n']}, {p['threads']} thr:", "", "```", p["table"],
                  "```"]
    Path(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run every thread setting in a subprocess and print one combined report."""
    args = parse_args(argv)
    if args._worker:
        run_thread_setting(args, args._worker, args._out)
        return 0
    if args.dataset == "fashion-mnist":
        from phalanx import data
        from phalanx.data.base import DatasetNotFoundError

        try:
            data.load("fashion-mnist")
        except DatasetNotFoundError as exc:
            print(f"{exc}\n(apt-get install dataset-fashion-mnist, or run with --quick)", file=sys.stderr)
            return 2
    command = ".venv/bin/python benchmarks/training.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    thread_settings = list(dict.fromkeys({"1": [1], "all": [all_threads()], "both": [1, all_threads()]}[args.threads]))
    recs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-training-") as tmp:
        for threads in thread_settings:
            recs += run_subprocess(args, threads, Path(tmp))
    wall = time.perf_counter() - t0
    rows = build_rows(recs)
    note_lines = notes(recs, rows, args, wall, command.strip())
    profiles = [r for r in recs if r.get("type") == "profile"]
    setting = setting_line(recs)
    print_report(rows, note_lines, args.width, profiles, setting)
    if args.markdown:
        write_markdown(args.markdown, rows, note_lines, profiles, setting)
    if args.json:
        Path(args.json).write_text(json.dumps({"records": recs, "wall_s": wall, "command": command}, indent=1))
    failed = any(r.get("type") == "error" for r in recs)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
