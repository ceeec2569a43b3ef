"""A Byzantine vector attack that records what it is given — the honest rows, after their differential-privacy
noise — and sends zeros (``attack = "_dp_spy:Spy"``): what a Byzantine worker, or the server, sees of each honest
update (tests/test_privacy_source.py, tests/test_privacy_noise.py)."""

from __future__ import annotations

import torch
from torch import Tensor

from phalanx.attacks.base import AttackContext

SEEN: list[Tensor] = []


class Spy:
    """Records ``ctx.honest`` every round in :data:`SEEN`; its rows are zeros."""

    reference = "a test's spy"

    def __call__(self, ctx: AttackContext) -> Tensor:
        SEEN.append(ctx.honest.detach().clone())
        return torch.zeros(ctx.n_byzantine, ctx.honest.shape[1], dtype=ctx.honest.dtype)
