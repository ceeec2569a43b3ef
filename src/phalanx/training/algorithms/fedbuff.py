"""FedBuff: buffered asynchronous aggregation, on the simulated clock, with the run's rule over the buffer.

Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek & Huba, "Federated Learning with Buffered Asynchronous
Aggregation", AISTATS 2022, Algorithm 1. Workers compute at their own pace on the model version they last
received; the server keeps a buffer of K updates and, once it holds K, steps

    x ← x − η_g · Agg( w(s₁)·Δ₁, …, w(s_K)·Δ_K ),    w(s) = 1/√(1 + s),

where sᵢ is update i's staleness (server steps since the version it started from) and w the paper's staleness
scaling (its §5, "we scale each update by 1/√(1 + staleness)"). With ``Agg`` the mean this is the paper's server
update (Δ̄/K); any registry rule may replace it (f < K/2 and the rule's own ``min_workers`` ≤ K, checked) — but a
rule over one buffer bounds only the Byzantine *rows of that buffer*: an attacker who is always first fills it
(docs/async.md, the threat model of time). Here an update is one minibatch gradient at the version's θ (the paper's
local training with one local step — buffered asynchronous SGD); the run's ``lr`` is η_g. Staleness assumption:
none for the scaling itself; updates older than ``max_staleness`` versions are dropped (counted, never aggregated).

Concurrency (the paper's concurrency, its Alg. 1 and §3 as the issue reads them — a fixed number of clients
training at once, a newly sampled one started when an update comes back; the exact text was not retrieved here):
``concurrency = C`` with K ≤ C ≤ n keeps C workers in flight — on the simulated clock C sampled uniformly among the
idle ones after each step (:mod:`~phalanx.training.algorithms.clock`), on processes C credits outstanding
(:mod:`phalanx.distributed.async_credit`); absent, every worker computes. Staleness then scales like C/K.

Config: ``algorithm = "fedbuff"``, ``algorithm_params = {buffer_size = K, max_staleness = S, speeds = "...",
byzantine_timing = "honest" | "always_first", concurrency = C, batch_size = B}``
(:mod:`~phalanx.training.algorithms.asynchronous`, :mod:`~phalanx.training.algorithms.clock`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.algorithms.asynchronous import Asynchronous
from phalanx.training.algorithms.base import Run, register
from phalanx.training.algorithms.clock import as_numpy
from phalanx.validate import check_int


def staleness_weight(staleness: Tensor) -> Tensor:
    """FedBuff's staleness scaling w(s) = 1/√(1 + s) (Nguyen et al., AISTATS 2022, §5), float64."""
    return 1.0 / torch.sqrt(1.0 + staleness.to(torch.float64))


@lru_cache(maxsize=64)
def weight_table(bound: int, dtype: torch.dtype, weight: Callable[[Tensor], Tensor] = staleness_weight) -> Tensor:
    """w(0) … w(S) (S = ``bound``) as ``weight`` (:func:`staleness_weight`) computes them, cast to ``dtype``, on the
    CPU (an elementwise function: the value of w(s) does not depend on the vector it is computed in). Never
    written. Keyed by the function too, so that a replaced :func:`staleness_weight` (a test's mutant) is what
    the table holds."""
    return weight(torch.arange(bound + 1)).to(dtype)


def staleness_weights(staleness: Tensor, bound: int, like: Tensor) -> Tensor:
    """``staleness_weight(staleness).to(like)``, bit for bit: the rows of the cached :func:`weight_table` when every
    staleness (a CPU index tensor) is in 0..``bound`` — the accepted updates of a step; one gather instead of four
    tensor operations a step — computed otherwise (tests/test_async_speed.py)."""
    try:
        w = weight_table(bound, like.dtype, staleness_weight).index_select(0, staleness)
    except (IndexError, RuntimeError):  # a staleness outside 0..S, or not an index tensor on the CPU: computed
        return staleness_weight(staleness).to(like)
    return w if like.is_cpu else w.to(like.device)


@register
@dataclass(frozen=True)
class FedBuff(Asynchronous):
    """FedBuff (see the module's docstring): a buffer of ``buffer_size`` updates, each scaled by 1/√(1 + s)."""

    buffer_size: int = 10
    name = "fedbuff"
    population_key = "algorithm_params.buffer_size"
    real_processes = True
    concurrent = True
    reference = ("Nguyen et al., Federated Learning with Buffered Asynchronous Aggregation, AISTATS 2022, Alg. 1 "
                 "(staleness scaling 1/sqrt(1+s); concurrency C: algorithm_params.concurrency)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("algorithm_params.buffer_size", self.buffer_size, low=1)

    def per_round(self, workers: int) -> int:
        """The rule aggregates the K updates of a full buffer (refused when K > workers)."""
        if self.buffer_size > workers:
            raise ConfigError("algorithm_params.buffer_size", self.buffer_size, f"<= workers = {workers} (a buffer "
                              "of K updates from K distinct workers a step)")
        return self.buffer_size

    def full(self, workers: int, order: Tensor, accepted: Tensor) -> int:
        """The first K accepted deliveries (and the dropped ones among them): one past the K-th accepted position, 0
        when fewer than K are accepted (in NumPy on the CPU mask's view: a per-step cost,
        :mod:`~phalanx.training.algorithms.clock`)."""
        where = as_numpy(accepted).nonzero()[0]
        return int(where[self.buffer_size - 1]) + 1 if where.size >= self.buffer_size else 0

    def assemble(self, run: Run, ids: Tensor, updates: Tensor, staleness: Tensor) -> tuple[Tensor, list[int], Tensor]:
        """Row i is w(sᵢ)·Δᵢ, worker ``ids[i]``'s (``updates`` scaled in place: the caller's own,
        :meth:`Asynchronous.assemble`); the Byzantine rows are its Byzantine updates."""
        w = staleness_weights(staleness, self.max_staleness, updates)
        return updates.mul_(w[:, None]), ids.tolist(), ids >= run.workers - run.byzantine
