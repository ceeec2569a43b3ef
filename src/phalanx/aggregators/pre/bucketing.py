"""Bucketing: average random buckets of rows before a robust rule (Karimireddy, He & Jaggi, ICLR 2022)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import mix_rows, row_norms
from phalanx.aggregators.base import PreAggregator, RuleTags, as_compute_dtype, check_positive, random_source
from phalanx.aggregators.registry import register

__all__ = ["Bucketing"]


@register
class Bucketing(PreAggregator):
    r"""Bucketing: shuffle the rows, split them into buckets of ``s``, and average each bucket.

    With a uniformly random permutation :math:`\pi` of :math:`[n]` and :math:`B_i = \{\pi((i-1)s+1), \dots,
    \pi(\min(n, is))\}`,

    .. math:: y_i = \frac{1}{|B_i|} \sum_{j \in B_i} x_j, \qquad i = 1, \dots, \lceil n/s \rceil.

    Karimireddy, He & Jaggi, "Byzantine-robust learning on heterogeneous datasets via bucketing", ICLR 2022,
    Algorithm 1. The paper writes the factor :math:`1/s` for every bucket; we divide the last bucket (smaller when
    ``s`` does not divide ``n``) by its own size, as ByzFL does, so every output row is an average of inputs (rows
    of the provenance matrix add up to 1). Both agree when ``s`` divides ``n``.

    Provenance: ``M[i, j] = 1/|B_i|`` for ``j ∈ B_i``. A bad row (NaN/Inf) poisons only its own bucket (that
    output row is NaN and the rule downstream treats it as bad); a Byzantine row influences at most one bucket, so
    the rule after bucketing is configured with the same ``f`` on ``⌈n/s⌉`` rows.

    Randomness and state: the object owns a CPU ``torch.Generator`` seeded with ``seed`` and draws a *new*
    permutation at every call, so a sequence of calls is reproducible from the seed but two calls on the same input
    generally differ. Pass ``generator=`` per call to draw from your own generator instead (for example one stream
    of an experiment's seed); the object's own generator is then left untouched.
    """

    name: ClassVar[str] = "bucketing"
    reference: ClassVar[str] = (
        "S. P. Karimireddy, L. He, M. Jaggi, 'Byzantine-robust learning on heterogeneous datasets via bucketing', "
        "ICLR 2022, Algorithm 1"
    )
    requirement = "n >= 1; the rule after it sees ceil(n/s) rows, at most f of them influenced by Byzantine rows"
    context_keys = frozenset({"generator"})
    tags = RuleTags(permutation=False)  # the buckets are drawn over the row order

    def __init__(self, f: int = 0, s: int = 2, seed: int = 0) -> None:
        super().__init__(f)
        self.s = int(check_positive("s", s, integer=True))
        self.seed = int(check_positive("seed", seed, integer=True, allow_zero=True))
        self._generator = torch.Generator().manual_seed(self.seed)

    def output_rows(self, n: int) -> int:
        return math.ceil(n / self.s)

    def _run(self, x: Tensor, **context: Any) -> tuple[Tensor, Tensor]:
        gen = random_source(context, self._generator)
        n = x.shape[0]
        k = self.output_rows(n)
        perm = torch.randperm(n, generator=gen, device=gen.device).cpu()
        bucket = torch.arange(n) // self.s
        sizes = torch.bincount(bucket, minlength=k).to(torch.float64)
        m = torch.zeros(k, n, dtype=torch.float64)
        m[bucket, perm] = 1.0 / sizes[bucket]
        m = m.to(x.device)
        xc = as_compute_dtype(x)
        _, bad = row_norms(xc)
        y = mix_rows(m, xc, bad)
        return y.to(x.dtype), m
