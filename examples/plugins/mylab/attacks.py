# examples/plugins/mylab/attacks.py
"""An attack of one's own: every Byzantine worker sends the honest mean shifted along the honest spread."""

import torch

from phalanx.attacks import AttackContext


class Shift:
    """y = mean(honest) + offset · std(honest), the same vector from every Byzantine worker.

    Phalanx asks two things of an attack: a constructor that takes its parameters, and a call that maps the round's
    AttackContext (ctx.honest, ctx.n_byzantine, ctx.f, ctx.aggregator, ctx.generator) to (b, d) vectors.
    """

    reference = "example plug-in (mylab)"

    def __init__(self, offset: float = 3.0) -> None:
        self.offset = offset

    def __call__(self, ctx: AttackContext) -> torch.Tensor:
        honest = ctx.honest
        spread = honest.std(dim=0) if honest.shape[0] > 1 else torch.zeros_like(honest[0])
        row = honest.mean(dim=0) + self.offset * spread
        return row.expand(ctx.n_byzantine, -1).clone()
