"""Mimic (Karimireddy, He & Jaggi, ICLR 2022): every Byzantine worker copies one honest worker."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks._common import check_int, repeat_row, work_dtype
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register
from phalanx.errors import ConfigError

__all__ = ["Mimic", "mimic_target"]


def mimic_target(honest: Tensor) -> int:
    r"""Index of the honest row with the largest projection on the honest vectors' top principal direction.

    .. math::
        z = \arg\max_{\lVert z\rVert = 1} \sum_j \langle z, x_j - \bar g\rangle^2, \qquad
        i^\star = \arg\max_i \lvert\langle z, x_i - \bar g\rangle\rvert .

    Computed from the ``(h, h)`` Gram matrix of the centred rows, :math:`K = X_c X_c^\top`: if ``u`` is its top
    eigenvector (eigenvalue λ) then :math:`X_c z = \sqrt{\lambda}\,u`, so :math:`i^\star = \arg\max_i |u_i|`. No
    ``(d, d)`` matrix is formed. Ties and the degenerate case λ = 0 (all rows equal, or ``h = 1``) give the smallest
    index.
    """
    x = honest.detach().to(work_dtype(honest))
    xc = x - x.mean(dim=0, keepdim=True)
    gram = (xc @ xc.T).to(torch.float64)
    if not bool(torch.isfinite(gram).all()):  # a diverging run's honest rows overflow: no direction to follow
        return 0
    values, vectors = torch.linalg.eigh(gram)
    if not bool(values[-1] > 0):
        return 0
    return int(torch.argmax(vectors[:, -1].abs()))


@register
class Mimic(Attack):
    r"""Mimic: all Byzantine workers send a copy of one honest worker's vector, ``y_i = x_{i*}``.

    Karimireddy, He & Jaggi (ICLR 2022, the "mimic" attack) show that on heterogeneous data, over-representing one
    honest worker biases robust rules while every Byzantine vector looks perfectly honest. Their attacker estimates
    the top variance direction z online over a warm-up, picks ``i* = argmax_i ⟨z, g_i⟩`` (the *signed* projection)
    and then keeps copying that worker for the rest of training. Phalanx's own variant is *stateless*: each round,
    ``i*`` is the honest row with the largest *absolute* projection on the top principal direction of that round's
    centred honest vectors (:func:`mimic_target`) — a principal direction has no sign of its own, so the signed
    choice would depend on which of ±z the eigen-solver returns. With ``target=k`` the attackers always copy honest
    row ``k`` (ByzFL's ``Mimic(epsilon=k)``); ``k`` must be below ``h`` at call time.
    """

    name: ClassVar[str] = "mimic"
    reference: ClassVar[str] = (
        "S. P. Karimireddy, L. He, M. Jaggi, 'Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing', "
        "ICLR 2022 (mimic attack); Phalanx's stateless variant: each round's largest |projection|"
    )

    def __init__(self, target: int | None = None) -> None:
        self.target = None if target is None else check_int("target", target, low=0)

    def target_for(self, ctx: AttackContext) -> int:
        """The honest row copied in ``ctx``."""
        if self.target is None:
            return mimic_target(ctx.honest)
        if self.target >= ctx.n_honest:
            raise ConfigError("target", self.target, f"an honest row index in [0, {ctx.n_honest - 1}]")
        return self.target

    def _run(self, ctx: AttackContext) -> Tensor:
        return repeat_row(ctx.honest.detach()[self.target_for(ctx)], ctx.n_byzantine, ctx.honest)
