"""Neurotoxin: a durable backdoor whose update lives on the coordinates the benign updates change least."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.attacks.backdoor import Backdoor
from phalanx.attacks.registry import register
from phalanx.errors import InputError
from phalanx.validate import check_real

__all__ = ["Neurotoxin", "project_to_ball", "rarely_used"]


def rarely_used(previous: Tensor, keep: float) -> Tensor:
    """The bool mask of the ``keep`` % coordinates of smallest ``|previous|`` (at least one): the coordinates the
    last global update changed least. Ties are broken by index (a stable sort), so the mask is deterministic."""
    d = previous.numel()
    kept = max(1, min(d, round(keep / 100.0 * d)))
    order = torch.argsort(previous.detach().abs().reshape(-1), stable=True)
    mask = torch.zeros(d, dtype=torch.bool, device=previous.device)
    mask[order[:kept]] = True
    return mask


def project_to_ball(rows: Tensor, bound: float) -> Tensor:
    """Each row scaled onto the ℓ2 ball of radius ``bound`` when it lies outside (in place): the Euclidean
    projection ``v · min(1, bound / ‖v‖)``."""
    norms = torch.linalg.vector_norm(rows.to(torch.float64), dim=1)
    scale = torch.where(norms > bound, bound / norms.clamp_min(torch.finfo(torch.float64).tiny), 1.0)
    return rows.mul_(scale.to(rows.dtype)[:, None])


@register
class Neurotoxin(Backdoor):
    r"""Neurotoxin: the backdoored update projected onto the coordinates the honest updates change least.

    Zhang, Panda, Song, Yang, Mahoney, Mittal, Ramchandran & Gonzalez, "Neurotoxin: Durable Backdoors in Federated
    Learning", ICML 2022, Algorithm 1: the attacker takes the previous round's global update
    :math:`g_{t-1}` as its estimate of the benign direction, keeps the coordinates outside its top-k% largest
    :math:`|g_{t-1}|` — here the ``keep`` % *smallest* — and constrains its update to them,

    .. math:: \Delta_{\text{sent}} = \Pi_{\|\cdot\| \le B}\bigl(\text{boost} \cdot m \odot \Delta\bigr),
              \qquad m_i = [\, |g_{t-1}|_i \text{ among the keep \% smallest} \,],

    where :math:`\Delta` is its pseudo-gradient trained on triggered batches (:class:`Backdoor`'s BadNets pattern and
    ``poison_fraction``) and :math:`\Pi` the optional projection onto the ℓ2 ball of radius ``norm_bound`` (the
    paper's norm constraint). Coordinates the honest clients keep moving would overwrite the backdoor; the rarely used
    ones keep it after the attack stops (durability: ``stop_round``, read as ``attack_success`` on the row with
    ``rounds_since_stop = k``).

    :math:`g_{t-1}` is the previous round's aggregate (the server's last step direction; the loop passes the round
    state's ``previous``, checkpointed, so a resumed run is bit for bit the uninterrupted one); in the first round
    there is none and the update is not masked. The paper projects every local step's gradient; Phalanx projects the
    pseudo-gradient once (the same with ``local_steps = 1``; with more steps the update is still in the mask's
    subspace). Federated rounds only (a DSGD worker's vector is carried into its momentum), in process.
    """

    name: ClassVar[str] = "neurotoxin"
    reference: ClassVar[str] = (
        "Z. Zhang et al., 'Neurotoxin: Durable Backdoors in Federated Learning', ICML 2022, Algorithm 1 (update "
        "projected off the top-k% coordinates of the last global update)"
    )
    threat: ClassVar[str] = "data, its own update and the global model's last step (which every client sees)"
    shapes_update: ClassVar[bool] = True
    needs_previous: ClassVar[bool] = True

    def __init__(
        self, target: int = 0, size: int = 2, value: float = 2.5, poison_fraction: float = 0.5, keep: float = 95.0,
        norm_bound: float | None = None, boost: float = 1.0, stop_round: int | None = None,
    ) -> None:
        super().__init__(target=target, size=size, value=value, poison_fraction=poison_fraction, boost=boost,
                         stop_round=stop_round)
        self.keep = check_real("keep", keep, low=0.0, low_open=True, high=100.0)
        self.norm_bound = None if norm_bound is None else check_real("norm_bound", norm_bound, low=0.0,
                                                                       low_open=True)

    def params(self) -> dict[str, Any]:
        out = super().params()
        out.update(keep=self.keep, norm_bound=self.norm_bound)
        return out

    def update(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        """``rows`` (the poisoned clients' pseudo-gradients) boosted, masked to the rarely used coordinates of
        ``previous`` and projected onto the norm ball (in place)."""
        if self.boost != 1.0:
            rows.mul_(self.boost)
        if previous is not None and self.keep < 100.0:
            if previous.numel() != rows.shape[1]:
                raise InputError("neurotoxin: previous aggregate", f"{previous.numel()} coordinates",
                                 f"{rows.shape[1]}, the length of an update")
            rows[:, ~rarely_used(previous.to(rows.device), self.keep)] = 0
        if self.norm_bound is not None:
            project_to_ball(rows, self.norm_bound)
        return rows
