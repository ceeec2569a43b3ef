"""Sign majority vote (signSGD with majority vote)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import COLUMN_CHUNK
from phalanx.aggregators.base import Aggregator, RuleTags, as_compute_dtype
from phalanx.aggregators.registry import register


@register
class SignMajority(Aggregator):
    r"""Sign majority, ``signmaj``: :math:`\mathrm{sign}\big(\sum_i \mathrm{sign}(x_i)\big)`, coordinate-wise.

    Reference: Bernstein, Zhao, Azizzadenesheli & Anandkumar, "signSGD with majority vote is communication
    efficient and fault tolerant", ICLR 2019, Algorithm 1. Each worker votes with the sign of each coordinate; the
    output is the majority sign (0 on a tie). The server's learning rate sets the step size. A NaN entry casts no
    vote; ±Inf votes like any sign, so a Byzantine row has exactly one vote per coordinate. The output is always
    finite. Requirement n > 2f (a majority of honest votes).

    Contributions: the share of coordinates at which the row's sign agreed with a non-zero majority, normalised
    over rows (rows that voted with the majority everywhere share the output equally).
    """

    name: ClassVar[str] = "signmaj"
    reference: ClassVar[str] = (
        "Bernstein, Zhao, Azizzadenesheli & Anandkumar, signSGD with majority vote is communication efficient and "
        "fault tolerant, ICLR 2019 (Algorithm 1)"
    )
    requirement = "n > 2f"
    tags = RuleTags(translation=False, scale=False, identical=False)  # its output is a vector of signs

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        xc = as_compute_dtype(x)
        # Votes column chunk by column chunk (no (n, d) temporary); NaN casts no vote (nansum).
        tally = torch.empty(xc.shape[1], dtype=xc.dtype, device=xc.device)
        for s in range(0, xc.shape[1], COLUMN_CHUNK):
            tally[s : s + COLUMN_CHUNK] = torch.sign(xc[:, s : s + COLUMN_CHUNK]).nansum(dim=0)
        out = torch.sign(tally)
        contrib = None
        if want_contributions:
            votes = torch.nan_to_num(torch.sign(xc), nan=0.0)
            agree = ((votes == out[None, :]) & (out[None, :] != 0)).sum(dim=1).to(torch.float64)
            total = agree.sum()
            n = x.shape[0]
            contrib = agree / total if float(total) > 0 else torch.full((n,), 1.0 / n, dtype=torch.float64,
                                                                          device=x.device)
        return out.to(x.dtype), contrib
