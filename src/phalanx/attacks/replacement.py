"""Norm-bounded model replacement: a boosted backdoored update projected onto the norm ball the defence clips to."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from phalanx.attacks.backdoor import Backdoor
from phalanx.attacks.neurotoxin import project_to_ball
from phalanx.attacks.registry import register
from phalanx.validate import check_real

__all__ = ["ModelReplacement"]


@register
class ModelReplacement(Backdoor):
    r"""Norm-bounded (projected) model replacement: boost the backdoored update, then project it onto the ℓ2 ball
    the defence clips to.

    Bagdasaryan, Veit, Hua, Estrin & Shmatikov, "How To Backdoor Federated Learning", AISTATS 2020: model
    replacement scales the attacker's update by :math:`\gamma = n/\eta` (Eq. 3) so that it replaces the global model
    after averaging, and the constrain-and-scale attacker bounds the scaled update's norm by what the server's
    anomaly detector accepts (§4.2, Eq. 4; the norm-bounded attacker of Sun, Kairouz, Suresh & McMahan, "Can you
    really backdoor federated learning?", 2019):

    .. math:: \Delta_{\text{sent}} = \gamma\Delta \cdot \min\Bigl(1, \frac{B}{\|\gamma\Delta\|}\Bigr),

    the Euclidean projection of :math:`\gamma\Delta` onto :math:`\{\|v\| \le B\}`, where :math:`\Delta` is the
    attacker's pseudo-gradient trained on triggered batches (:class:`Backdoor`) and ``boost`` = γ. With ``norm_bound``
    equal to the defence's clipping threshold (``clip(threshold=B)``) the update passes the clipping unchanged:
    the attacker spends the whole budget the defence allows, in the backdoor's direction. Federated rounds only.
    ``stop_round`` ends the attack (durability); ``attack_success`` is logged beside the accuracy.
    """

    name: ClassVar[str] = "replacement"
    reference: ClassVar[str] = (
        "E. Bagdasaryan et al., 'How To Backdoor Federated Learning', AISTATS 2020, Eq. 3 (model replacement) and "
        "§4.2 (constrain-and-scale); Z. Sun et al., 'Can You Really Backdoor Federated Learning?', 2019 (norm bound)"
    )
    threat: ClassVar[str] = "data and its own update: trains on triggered inputs, boosts and bounds what it sends"
    shapes_update: ClassVar[bool] = True

    def __init__(
        self, target: int = 0, size: int = 2, value: float = 2.5, poison_fraction: float = 0.5, boost: float = 10.0,
        norm_bound: float = 1.0, stop_round: int | None = None,
    ) -> None:
        super().__init__(target=target, size=size, value=value, poison_fraction=poison_fraction, boost=boost,
                         stop_round=stop_round)
        self.norm_bound = check_real("norm_bound", norm_bound, low=0.0, low_open=True)

    def params(self) -> dict[str, Any]:
        out = super().params()
        out["norm_bound"] = self.norm_bound
        return out

    def update(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        """``boost`` × ``rows``, each row projected onto the ball of radius ``norm_bound`` (in place)."""
        return project_to_ball(rows.mul_(self.boost), self.norm_bound)
