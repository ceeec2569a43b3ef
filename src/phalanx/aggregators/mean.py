"""The arithmetic mean: the non-robust baseline."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import column_mean
from phalanx.aggregators.base import Aggregator, RuleTags
from phalanx.aggregators.registry import register


@register
class Mean(Aggregator):
    r"""Arithmetic mean :math:`\bar x = \frac1n \sum_i x_i`.

    Not robust: one Byzantine row moves it arbitrarily far, and a NaN or Inf row makes it NaN/Inf. It is the
    documented exception to the finite-output guarantee and the reference point of the no-attack error
    (ε = 0, Yang, Shi & Li, ICML 2025).
    """

    name: ClassVar[str] = "mean"
    reference: ClassVar[str] = "arithmetic mean (federated averaging, McMahan et al., AISTATS 2017)"
    requirement = "n >= 1; tolerates no Byzantine worker"
    tags = RuleTags(robust=False)  # one NaN row makes the output NaN: the documented exception
    epsilon_source = "the output is the mean: ε = 0 (Yang, Shi & Li, ICML 2025, Definition 2.2)"

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n = x.shape[0]
        out = column_mean(x)  # the rows added in row order, one pass (docs/benchmarks.md)
        contrib = torch.full((n,), 1.0 / n, dtype=torch.float64, device=x.device) if want_contributions else None
        return out, contrib

    def epsilon(self, n: int) -> float | None:
        return 0.0
