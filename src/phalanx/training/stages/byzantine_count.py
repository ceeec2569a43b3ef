"""How many Byzantine clients each round of a population run sampled, against the f its rule is configured for.

When the Byzantine clients are a fraction B / N of a population and a round samples C of the N clients uniformly
without replacement, the number X of Byzantine clients in a round is hypergeometric:

    P(X = k) = C(B, k) · C(N − B, C − k) / C(N, C),    k = max(0, C − N + B) … min(B, C)

(Feller, "An introduction to probability theory and its applications", vol. I, 3rd ed., 1968, §II.6). A robust
rule configured for f keeps its guarantee (every rule's threat model: at most f Byzantine among the vectors it
aggregates, docs/aggregators.md) only in the rounds where X ≤ f.

**The policy.** The rule uses the *configured* f every round; nothing adapts it to the round. Choosing f is choosing
a tail risk, which :func:`tail` states — P(X > f), the probability that a given round is beyond the rule's
guarantee — and :func:`f_for` inverts: the smallest f with P(X > f) ≤ δ (a high-probability bound from the
hypergeometric tail, to configure). This stage records, for every round, the realised X (its state,
``stage.byzantine_count.history``: one count per round, checkpointed, so a resumed run's record is an uninterrupted
one's), and on every metric row: ``byzantine_sampled_max`` (the largest X so far), ``rounds_over_f`` (how many rounds
so far had X > f: each such round is recorded as beyond the guarantee) and ``p_over_f`` (P(X > f) for this run).

The sample is the server's draw (the ``clients`` stream): no client, Byzantine or not, chooses whether it is sampled,
so nothing a client sends changes what is recorded. Federated averaging brings this stage for a population data set
(:meth:`phalanx.training.algorithms.fedavg.FedAvg.stages`); a config does not name it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.stages.base import Evaluation, Plan, ServerRound, ServerStage, Stage
from phalanx.validate import check_int, check_real

COLUMNS = ("byzantine_sampled_max", "rounds_over_f", "p_over_f")
"""The metric columns it fills."""


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def pmf(population: int, byzantine: int, sampled: int) -> list[float]:
    """P(X = k) for k = 0 … ``sampled`` (zero outside the support), X hypergeometric (see the module's docstring);
    each term from log-Gamma in float64, O(C) time and memory."""
    n = check_int("workers", population, low=1)
    b = check_int("byzantine", byzantine, low=0, high=n)
    c = check_int("clients_per_round", sampled, low=0, high=n)
    total = _log_comb(n, c)
    return [math.exp(_log_comb(b, k) + _log_comb(n - b, c - k) - total) if max(0, c - n + b) <= k <= min(b, c)
            else 0.0 for k in range(c + 1)]


def tail(population: int, byzantine: int, sampled: int, f: int) -> float:
    """P(X > f): the probability that a round samples more Byzantine clients than the rule's f."""
    check_int("f", f, low=0)
    p = pmf(population, byzantine, sampled)
    return min(1.0, max(0.0, math.fsum(p[f + 1 :])))


def f_for(population: int, byzantine: int, sampled: int, delta: float) -> int:
    """The smallest f with P(X > f) ≤ ``delta`` (0 < δ < 1): the rule's f that a round exceeds with probability at
    most δ. It may be ≥ C/2 — beyond any robust rule; the run's config then refuses it."""
    check_real("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    p = pmf(population, byzantine, sampled)
    for f in range(len(p)):
        if math.fsum(p[f + 1 :]) <= delta:
            return f
    return len(p) - 1


class ByzantineCount(ServerStage):
    """Record each round's number of sampled Byzantine clients among ``per_round`` of ``workers``, the last
    ``byzantine`` of them (see the module's docstring)."""

    name: ClassVar[str] = "byzantine_count"
    reference: ClassVar[str] = ("Feller, An introduction to probability theory, vol. I, 1968, §II.6 (the "
                                "hypergeometric distribution of a sample without replacement)")
    brought_by: ClassVar[str] = "algorithm = 'fedavg', for a population data set (synthetic, femnist-population)"

    def __init__(self, workers: int, byzantine: int, per_round: int) -> None:
        self.workers = check_int("workers", workers, low=1)
        self.byzantine = check_int("byzantine", byzantine, low=0, high=self.workers - 1)
        self.per_round = check_int("clients_per_round", per_round, low=1, high=self.workers)
        self.history: list[int] = []
        """The realised count of every round so far, in order."""
        self.f = 0
        self.over = 0

    @classmethod
    def configure(cls, section: Mapping[str, Any], plan: Plan) -> Stage:
        """Not set in a config: federated averaging brings it for a population data set."""
        raise ConfigError("stages.byzantine_count", dict(section), "unset (fedavg brings it for a population data "
                          "set)")

    def check(self, plan: Plan) -> None:
        """The run's population and Byzantine clients must be the ones it counts against."""
        if (plan.workers, plan.byzantine) != (self.workers, self.byzantine):
            raise ConfigError(self.parameter("stages.byzantine_count"), repr(self), f"the run's workers = "
                              f"{plan.workers} and byzantine = {plan.byzantine}")
        self.f = plan.f

    def aggregated(self, agg: Tensor, r: ServerRound) -> Tensor:
        """Count the round's sampled Byzantine clients (ids ≥ workers − byzantine); the aggregate is left as it is."""
        x = int((r.ids() >= self.workers - self.byzantine).sum())
        self.history.append(x)
        self.over += int(x > r.f)
        return agg

    def column_names(self) -> tuple[str, ...]:
        return COLUMNS

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        """The largest count so far (None before the first round), the rounds beyond f so far, P(X > f)."""
        p = tail(self.workers, self.byzantine, self.per_round, self.f)
        return {COLUMNS[0]: max(self.history) if self.history else None, COLUMNS[1]: self.over, COLUMNS[2]: p}

    def state_dict(self) -> dict[str, Tensor]:
        return {"history": torch.tensor(self.history, dtype=torch.int32)}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """``history``: a 1-D integer tensor of counts in 0 … clients_per_round (``{}``: fresh); anything else — a
        forged or hostile checkpoint — is refused in one line."""
        if not state:
            self.history, self.over = [], 0
            return
        h = state.get("history")
        ok = (set(state) == {"history"} and isinstance(h, Tensor) and h.dim() == 1 and not h.is_floating_point()
              and not h.is_complex() and h.dtype != torch.bool)
        if ok and h is not None and h.numel():
            ok = bool((h >= 0).all()) and bool((h <= min(self.per_round, self.byzantine)).all())
        if not ok or h is None:
            raise ConfigError("stage.byzantine_count", sorted(state), "{'history': a 1-D integer tensor of counts in "
                              f"0..{min(self.per_round, self.byzantine)}}}")
        self.history = [int(v) for v in h.tolist()]
        self.over = sum(v > self.f for v in self.history)

    def params(self) -> dict[str, Any]:
        return {"workers": self.workers, "byzantine": self.byzantine, "per_round": self.per_round}
