"""Time a round of decentralized SGD (``algorithm = "gossip"``) in Phalanx against the same round written as a loop
over nodes — the way reference codes write it — side by side in one command.

    .venv/bin/python benchmarks/decentralized.py [--nodes 1000] [--rounds 5] [--quick] [--markdown PATH]

Setting (the same for both): ``--nodes`` nodes on a 2-D torus (the most nearly square one, Metropolis–Hastings
weights), the Fashion-MNIST MLP 784-64-10 (the embedded digits and a 64-32-10 MLP with ``--quick``, or when
Fashion-MNIST is absent), batch 32 per node from an IID split, local momentum 0.9, local learning rate 0.05, no
attack, plain gossip (``aggregator = "mean"``).

* **Phalanx** — the round as ``phalanx run`` runs it (``from_config``, ``Loop.step``): every node's gradient at its
  own parameters in one batched computation (explicit back-propagation with batched matrix products for the MLP),
  the momentum and local step on the stacked ``(n, d)`` state, and the gossip step as one sparse matrix product.
* **loop** — one ``nn.Module`` per node: for each node, forward and backward on its batch (autograd), momentum and
  local step on its parameters; then, for each node, the weighted sum of its closed neighbourhood's parameters.
  The batches are Phalanx's own (the same draw), so both compute the same round; the script checks that, from the
  same state, one round of each gives the same models up to float32 rounding, before timing.

Timing: one warm-up round each, then ``--rounds`` rounds in which the two take turns (so that a change in the
machine's load hits both alike); the median round time of each and their ratio are reported (the issue's target:
Phalanx ≥ 20× the loop at 1,000 nodes). Threads: torch's default (all cores) for both.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from phalanx import data
from phalanx.experiments import from_config, make_config
from phalanx.training.loop import Loop


def config(nodes: int, quick: bool) -> dict[str, Any]:
    """The run's config (the task of the module's docstring)."""
    dataset = "digits"
    if not quick:
        try:
            data.load("fashion-mnist")
            dataset = "fashion-mnist"
        except Exception:  # not on this machine: the embedded digits
            dataset = "digits"
    return {
        "algorithm": "gossip", "graph": "torus", "dataset": dataset, "model": "mlp",
        "model_params": {"hidden": [32 if dataset == "digits" else 64]}, "workers": nodes, "byzantine": 0, "f": 0,
        "aggregator": "mean", "attack": "none", "partition": "iid", "batch_size": 32, "lr": 0.05, "momentum": 0.9,
        "rounds": 10_000, "eval_every": 10_000, "seed": 0,
    }


class NodeLoop:
    """The reference shape of a round: a module per node, a Python loop over nodes for training and for gossip."""

    def __init__(self, loop: Loop) -> None:
        exp = loop.experiment
        self.exp = exp
        self.algo = exp.algorithm
        x = loop.state.theta
        x = x if x.dim() == 2 else x.expand(exp.workers, -1)
        self.modules = []
        for i in range(exp.workers):
            m = _clone(exp.problem.model)
            nn.utils.vector_to_parameters(x[i].clone(), m.parameters())
            self.modules.append(m)
        self.momentum: list[list[torch.Tensor] | None] = [None] * exp.workers
        w = self.algo.mixing
        self.hoods = [(torch.nonzero(w[i]).flatten().tolist(), w[i]) for i in range(exp.workers)]

    def round(self, xb: torch.Tensor, yb: torch.Tensor, lr: float, beta: float) -> None:
        """One round: local steps node by node, then gossip node by node."""
        for i, m in enumerate(self.modules):
            m.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(m(xb[i]), yb[i])
            loss.backward()
            grads = [p.grad for p in m.parameters()]
            buf = self.momentum[i]
            if buf is None:
                buf = [g.detach().clone() for g in grads if g is not None]
                self.momentum[i] = buf
            else:
                for b, g in zip(buf, grads):
                    assert g is not None
                    b.lerp_(g, 1.0 - beta)
            with torch.no_grad():
                for p, b in zip(m.parameters(), buf):
                    p.sub_(lr * b)
        flat = [nn.utils.parameters_to_vector(m.parameters()).detach() for m in self.modules]
        for i, (hood, weights) in enumerate(self.hoods):
            mixed = sum(float(weights[j]) * flat[j] for j in hood)
            assert isinstance(mixed, torch.Tensor)
            nn.utils.vector_to_parameters(mixed, self.modules[i].parameters())

    def state(self) -> torch.Tensor:
        return torch.stack([nn.utils.parameters_to_vector(m.parameters()).detach() for m in self.modules])


def _clone(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smoke test: 16 nodes, digits, 2 rounds")
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)
    nodes, rounds = (16, 2) if args.quick else (args.nodes, args.rounds)
    cfg = make_config(config(nodes, args.quick))
    exp = from_config(cfg)
    fast = Loop(exp)
    fast.open()
    fast.step()  # warm-up; θ is now the (n, d) node state
    ref = NodeLoop(fast)
    nodes_side = fast.transport.workers  # type: ignore[attr-defined]
    # check: one round of each from the same state and the same batches gives the same models
    state = nodes_side.batch_gen.get_state()
    from phalanx.training.algorithms.dsgd import worker_batches
    from phalanx.training.streams import restored

    def batches() -> tuple[torch.Tensor, torch.Tensor]:
        gen = restored(nodes_side.batch_gen.get_state())
        return worker_batches(exp.data, exp.attack, workers=nodes, byzantine=0, batch_size=cfg.batch_size,
                              batch_gen=gen, attack_gen=torch.Generator())

    ref.momentum = [list(_split(row, ref.modules[0])) for row in nodes_side.buffer]
    xb, yb = batches()
    fast.step()
    ref.round(xb, yb, cfg.lr, cfg.momentum)
    diff = float((fast.state.theta - ref.state()).abs().max())
    scale = float(fast.state.theta.abs().max())
    assert diff <= 1e-4 * max(1.0, scale), f"the two rounds differ by {diff:g}"
    del state
    times: dict[str, list[float]] = {"Phalanx": [], "loop": []}
    for _ in range(rounds):
        xb, yb = batches()
        t0 = time.perf_counter()
        ref.round(xb, yb, cfg.lr, cfg.momentum)
        times["loop"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fast.step()
        times["Phalanx"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["loop"] / med["Phalanx"]
    cpu = platform.processor() or platform.machine()
    machine = f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    lines = [
        f"Decentralized SGD, {nodes} nodes on a torus, {cfg.dataset} MLP {cfg.model_params['hidden']}, batch 32, "
        f"{rounds} timed rounds ({machine}); same round checked (max |Δθ| = {diff:.1e})",
        "",
        "| implementation | median s / round | rounds / s |",
        "|---|---|---|",
        *(f"| {k} | {v:.4f} | {1 / v:.2f} |" for k, v in med.items()),
        "",
        f"Phalanx / loop: **{ratio:.1f}×** (target ≥ 20× at 1,000 nodes: {'met' if ratio >= 20 else 'not met'})",
    ]
    text = "\n".join(lines)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    return 0


def _split(row: torch.Tensor, model: nn.Module) -> list[torch.Tensor]:
    """A flat momentum row as per-parameter tensors of ``model``'s shapes."""
    out, off = [], 0
    for p in model.parameters():
        out.append(row[off : off + p.numel()].view_as(p).clone())
        off += p.numel()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
