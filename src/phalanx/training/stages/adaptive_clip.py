"""Adaptive clipping of the aggregate, a server stage: before the step, the aggregate is scaled to norm at most a
threshold read off the round's own received vectors — an order statistic of their norms that at most f Byzantine
rows cannot push above the largest honest norm.

Round t receives m rows x₁ … x_m (at most f of them Byzantine, the rule's threat model: Blanchard et al.,
"Machine learning with adversaries: Byzantine tolerant gradient descent", NeurIPS 2017, and docs/aggregators.md).
With the norms sorted, ν₍₁₎ ≤ … ≤ ν₍ₘ₎ (a non-finite norm counts as +∞), the stage takes::

    k  = min(⌈q·m⌉, m − f)                  q = ``quantile`` (default ½: the median)
    τₜ = κ · ν₍ₖ₎                            κ = ``multiplier`` (default 1)
    a  ← a · min(1, τₜ / ‖a‖₂)               the aggregate the server optimizer steps on

— the quantile-based clipping norm of Andrew, Thakkar, McMahan & Ramaswamy ("Differentially private learning with
adaptive clipping", NeurIPS 2021, §2: clip to the γ-quantile of the round's update norms), here taken exactly from
the round's received norms and capped at rank m − f, so that it holds against f Byzantine rows:

* **Upper bound.** At least m − f rows are honest, so at least m − f norms are honest ones and ν₍ₖ₎ ≤ ν₍ₘ₋f₎ ≤
  max over honest i of ‖xᵢ‖. Hence ‖a‖ ≤ κ · maxᵢ honest ‖xᵢ‖ after the stage, *whatever the f Byzantine rows are and
  whatever the rule returned* (a mean pulled by a 1e38 row, a rule's bias beyond its κ-robustness bound).
* **Lower bound.** When k > f, at most f of the k smallest norms are Byzantine, so ν₍ₖ₎ ≥ the (k − f)-th smallest
  honest norm: f tiny Byzantine rows cannot shrink the step to nothing (with q = ½, m = 7, f = 2: k = 4, τ ≥ κ · the
  second smallest honest norm).

Both are order-statistic facts (the breakdown point of a quantile: Hampel, "A general qualitative definition of
robustness", Ann. Math. Stat. 1971), checked in ``tests/test_adaptive_clip.py`` against f rows of eight kinds (1e38,
∞, NaN, 0, 1e-30, the longest honest row times −1e6 or times 1.5, ∞ and 0 mixed) and an aggregate of 1e30
or ∞, at four (q, κ, m, f); the two mutants (no cap at m − f; the mean of the norms) fail it.

**A non-finite aggregate** (a rule with no robustness, the mean, fed an ∞ row) has no norm to clip to: the stage
replaces it by 0 — the server takes no step along it this round (an optimizer with momentum still moves θ by its
buffer) — and counts the round. Nothing a worker sends makes the stage raise, and it allocates ``(m,)`` norms and
one copy of the aggregate whatever the rows hold.

State: ``stage.adaptive_clip.counts``, ``(2,)`` int64 — the rounds clipped so far and the rounds whose aggregate was
replaced by 0 — so a resumed run counts what an uninterrupted one does. Columns: ``adaptive_clip_threshold`` (the
last round's τ), ``adaptive_clip_clipped`` and ``adaptive_clip_zeroed`` (the two counts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.stages.base import Evaluation, Plan, ServerRound, ServerStage
from phalanx.validate import check_real

COLUMNS = ("adaptive_clip_threshold", "adaptive_clip_clipped", "adaptive_clip_zeroed")
"""The metric columns it fills."""


def threshold(vectors: Tensor, f: int, quantile: float, multiplier: float) -> float:
    """τ = κ · ν₍ₖ₎, k = min(⌈q·m⌉, m − f), over the norms of the m rows of ``vectors`` (non-finite norms as +∞);
    at least rank 1. 0 rows: +∞ (nothing to read a bound from: the aggregate is left as it is)."""
    m = vectors.shape[0]
    if m == 0:
        return math.inf
    norms = torch.linalg.vector_norm(vectors.detach(), dim=1, dtype=torch.float64)
    norms = torch.where(torch.isfinite(norms), norms, torch.full_like(norms, math.inf))
    k = max(1, min(math.ceil(quantile * m), m - f))
    return multiplier * float(torch.kthvalue(norms.cpu(), k).values)


class AdaptiveClip(ServerStage):
    """Clip the aggregate to κ times the k-th smallest received norm, k = min(⌈q·m⌉, m − f) (the module's
    docstring)."""

    name: ClassVar[str] = "adaptive_clip"
    reference: ClassVar[str] = ("G. Andrew, O. Thakkar, H. B. McMahan, S. Ramaswamy, 'Differentially private "
                                "learning with adaptive clipping', NeurIPS 2021, §2 (quantile clipping norm), capped "
                                "at rank m − f against f Byzantine rows (Blanchard et al., NeurIPS 2017, threat model)")
    parameters: ClassVar[Mapping[str, str]] = {
        "quantile": "0 < q ≤ 1: τ is read at rank min(⌈q·m⌉, m − f) of the round's m received norms (default 0.5)",
        "multiplier": "κ > 0: the aggregate is clipped to κ times that norm (default 1)",
    }

    def __init__(self, quantile: float = 0.5, multiplier: float = 1.0) -> None:
        self.quantile = check_real("quantile", quantile, low=0.0, low_open=True, high=1.0)
        self.multiplier = check_real("multiplier", multiplier, low=0.0, low_open=True)
        self.counts = torch.zeros(2, dtype=torch.int64)
        self.last: float | None = None

    def params(self) -> dict[str, Any]:
        return {"quantile": self.quantile, "multiplier": self.multiplier}

    def check(self, plan: Plan) -> None:
        """A run with a server: decentralized rounds have no one aggregate to clip."""
        if plan.algorithm.decentralized:
            raise ConfigError(self.parameter("stages.adaptive_clip"), self.name, f"unset with algorithm = "
                              f"{plan.algorithm.name!r} (it clips the server's aggregate; decentralized rounds have "
                              "a rule per node and no server)")

    def aggregated(self, agg: Tensor, r: ServerRound) -> Tensor:
        """The aggregate scaled to norm at most τ (a new tensor), or 0 when it is not finite."""
        tau = threshold(r.received.vectors, r.f, self.quantile, self.multiplier)
        self.last = tau if math.isfinite(tau) else None  # more than f non-finite rows: no bound read, none recorded
        norm = float(torch.linalg.vector_norm(agg.detach(), dtype=torch.float64))
        if not math.isfinite(norm):
            self.counts[1] += 1
            return torch.zeros_like(agg)
        if norm <= tau:
            return agg.clone()
        self.counts[0] += 1
        return agg * (tau / norm)

    def column_names(self) -> tuple[str, ...]:
        return COLUMNS

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        """The last round's τ (None before the first, or when it was not finite) and the two counts so far."""
        clipped, zeroed = (int(v) for v in self.counts)
        return dict(zip(COLUMNS, (self.last, clipped, zeroed)))

    def state_dict(self) -> dict[str, Tensor]:
        return {"counts": self.counts.clone()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """The counts of a checkpoint: ``counts``, a ``(2,)`` int64 tensor of non-negative counts (``{}``: fresh)."""
        self.last = None
        if not state:
            self.counts = torch.zeros(2, dtype=torch.int64)
            return
        counts = state.get("counts")
        if set(state) != {"counts"} or counts is None or counts.shape != (2,) or counts.dtype != torch.int64 \
                or bool((counts < 0).any()):
            shapes = {k: (tuple(v.shape), str(v.dtype)) for k, v in state.items()}
            raise ConfigError("stage.adaptive_clip", shapes, "counts, a (2,) int64 tensor of non-negative counts "
                              "(the rounds clipped and zeroed)")
        self.counts = counts.cpu().clone()
