"""One round of Byzantine-robust distributed SGD — the function every engine calls.

Round t (Karimireddy, He & Jaggi, ICML 2021; Allouah et al., AISTATS 2023 — worker momentum):

1. every honest worker i draws a batch from its own shard and computes gᵢ = ∇ℓ(θ; batch) (+ weight decay);
2. it updates its momentum mᵢ ← β mᵢ + (1 − β) gᵢ (m₀ = g₀) and sends mᵢ;
3. Byzantine workers send what their attack says: a vector attack sees the honest vectors of the round
   (omniscient) and the server's rule; a data attack (label flipping) makes the worker compute an honest-looking
   momentum on poisoned batches;
4. the server aggregates the n vectors with the robust rule (centered clipping is given the previous aggregate as
   its centre) and steps θ ← θ − ηₜ · Agg.

Byzantine workers are the last ``byzantine`` indices. The result carries the round's measurements: the
aggregation error ‖Agg − honest mean‖² / honest spread (the price of robustness in this round) and, from the rule's
contributions, the share of the output that came from Byzantine workers and a detection AUC.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.analysis.epsilon import aggregation_error
from phalanx.attacks.base import Attack, AttackContext, DataAttack
from phalanx.training.problem import Problem


@dataclass
class WorkerData:
    """Training data and each worker's shard (indices into it)."""

    x: Tensor
    y: Tensor
    shards: list[Tensor]
    num_classes: int

    def __post_init__(self) -> None:
        # All shards in one index tensor, so that a round's batches are one gather, not a loop over workers.
        self._flat = torch.cat(self.shards) if self.shards else torch.zeros(0, dtype=torch.long)
        sizes = torch.tensor([s.numel() for s in self.shards], dtype=torch.long)
        self._sizes = sizes
        self._starts = torch.cumsum(sizes, 0) - sizes


@dataclass
class RoundState:
    """Everything that changes from round to round (and goes into a checkpoint)."""

    theta: Tensor
    momentum: Tensor | None  # (n, d): rows of honest (and data-attack) workers' momentum, then the Byzantine rows
    # sent this round; None before the first round. run_round updates it in place (one buffer for all rounds).
    previous: Tensor | None  # previous aggregate (centre of centered clipping)
    round: int = 0


@dataclass
class RoundResult:
    """What one round measured (only when asked: it costs the rule's contributions)."""

    agg_error: float
    byz_share: float
    detection_auc: float | None
    agg_norm: float


def detection_auc(contrib: Tensor, byzantine: Tensor) -> float | None:
    """P(a random honest worker got a larger share than a random Byzantine one); ties count ½. None if undefined."""
    honest_c = contrib[~byzantine]
    byz_c = contrib[byzantine]
    if honest_c.numel() == 0 or byz_c.numel() == 0:
        return None
    diff = honest_c[:, None] - byz_c[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


def sample_batches(data: WorkerData, workers: int, batch: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Workers ``0 … workers−1`` each draw ``batch`` samples uniformly (with replacement) from their shard.

    Returns ``(x (W, B, ...), y (W, B))``; one random draw and one gather for all workers.
    """
    sizes = data._sizes[:workers]
    u = torch.rand(workers, batch, generator=gen, dtype=torch.float64)
    pos = torch.minimum((u * sizes[:, None]).long(), sizes[:, None] - 1)
    idx = data._flat[data._starts[:workers, None] + pos]
    return data.x[idx], data.y[idx]


def run_round(
    state: RoundState,
    problem: Problem,
    data: WorkerData,
    rule: Aggregator,
    attack: Attack | DataAttack,
    *,
    workers: int,
    byzantine: int,
    f: int,
    batch_size: int,
    lr: float,
    momentum: float,
    weight_decay: float,
    batch_gen: torch.Generator,
    attack_gen: torch.Generator,
    reference_batch: tuple[Tensor, Tensor] | None = None,
    measure: bool = False,
) -> tuple[RoundState, RoundResult | None]:
    """Run one round and return the new state (and, with ``measure``, the round's measurements).

    The state's momentum buffer is updated in place and handed on (one ``(n, d)`` buffer for the whole run, no
    fresh allocation per round): the old state must not be used afterwards.
    """
    honest_n = workers - byzantine
    data_attack = isinstance(attack, DataAttack)
    computing = workers if data_attack else honest_n
    xb, yb = sample_batches(data, computing, batch_size, batch_gen)
    if data_attack and byzantine:
        assert isinstance(attack, DataAttack)
        xs, ys = xb[honest_n:], yb[honest_n:]
        xb_b, yb_b = [], []
        for i in range(byzantine):
            xi, yi = attack.transform(xs[i], ys[i], data.num_classes, attack_gen)
            xb_b.append(xi)
            yb_b.append(yi)
        xb = torch.cat([xb[:honest_n], torch.stack(xb_b)])
        yb = torch.cat([yb[:honest_n], torch.stack(yb_b)])
    g = problem.grads(state.theta, xb, yb)
    if weight_decay:
        g.add_(state.theta, alpha=weight_decay)
    if state.momentum is None:  # m₀ = g₀; one (n, d) buffer from now on, updated in place
        m = torch.empty(workers, g.shape[1], dtype=g.dtype, device=g.device)
        m[:computing] = g
    else:
        m = state.momentum
        m[:computing].lerp_(g, 1.0 - momentum)  # m ← β m + (1 − β) g
    honest = m[:honest_n]
    if not data_attack and byzantine:
        assert isinstance(attack, Attack)
        ctx = AttackContext(
            honest=honest, n_byzantine=byzantine, f=f, aggregator=rule, generator=attack_gen, round=state.round,
        )
        m[honest_n:] = attack(ctx)
    vectors = m
    context: dict[str, Any] = {}
    if "center" in rule.context_keys and state.previous is not None:
        context["center"] = state.previous
    if "reference" in rule.context_keys:
        assert reference_batch is not None, "rules with a reference gradient need the server's root batch"
        context["reference"] = problem.grads(state.theta, reference_batch[0][None], reference_batch[1][None])[0]
    result = None
    if measure:
        agg, contrib = rule.aggregate(vectors, **context)
        is_byz = torch.zeros(workers, dtype=torch.bool)
        is_byz[honest_n:] = True
        result = RoundResult(
            agg_error=aggregation_error(agg, honest),
            byz_share=float(contrib[honest_n:].sum()) if byzantine else 0.0,
            detection_auc=detection_auc(contrib.cpu(), is_byz),
            agg_norm=float(torch.linalg.vector_norm(agg.double())),
        )
    else:
        agg = rule(vectors, **context)
    theta = state.theta - lr * agg
    return RoundState(theta=theta, momentum=m, previous=agg, round=state.round + 1), result
