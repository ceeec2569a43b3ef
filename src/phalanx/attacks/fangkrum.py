"""Fang et al.'s full-knowledge attack on Krum (USENIX Security 2020): the largest step against the honest direction
that Krum still selects, found by halving an upper bound."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import pairwise_sqdist
from phalanx.aggregators.krum import krum_order, krum_scores
from phalanx.attacks._common import check_real, honest_mean, repeat_row
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["FangKrum", "FangKrumSearch", "fang_krum_bound", "krum_picks_byzantine"]

_MAX_HALVINGS = 2100
"""A cap on the Krum evaluations of one search. It never binds: for any finite float64 bound λ₀ and threshold τ > 0,
λ₀/τ < 2²⁰⁹⁹ (largest double over the smallest subnormal), so λ falls below τ within 2,099 halvings. In practice a
search that gives up makes ⌊log₂(λ₀/τ)⌋ + 1 ≈ 15–35 evaluations and one that succeeds a few (3–7 on the tests'
standard setting), each O(n²) on precomputed distances, none O(d)."""


@dataclass(frozen=True)
class FangKrumSearch:
    """What :meth:`FangKrum.search` found in one round."""

    lam: float
    """The λ the Byzantine workers send ``−λ·s`` with (rounded to the honest dtype, as sent)."""
    bound: float
    """The search's start λ₀ (:func:`fang_krum_bound`)."""
    accepted: bool
    """Whether Krum (with the context's ``f``) selects a Byzantine row at ``lam``; False when the search gave up
    (λ fell below ``threshold``) or had nothing to search (``s = 0`` or λ₀ = 0)."""
    evaluations: int
    """How many candidate λ were checked against Krum."""


def fang_krum_bound(honest: Tensor, n_byzantine: int) -> float:
    r"""The upper bound on λ from which the search starts (Fang et al., USENIX Security 2020, §4, attacking Krum).

    .. math::
        \lambda_0 = \frac{1}{(m - 2c - 1)\sqrt d}\,\min_{i}\sum_{l \in \tilde\Gamma_i}\lVert x_l - x_i\rVert
        + \frac{1}{\sqrt d}\,\max_i \lVert x_i\rVert,

    over the ``h`` honest rows, with ``m = h + c`` vectors of which ``c = n_byzantine`` are crafted, and
    :math:`\tilde\Gamma_i` the ``m − c − 2 = h − 2`` honest rows nearest to :math:`x_i` (none when ``h ≤ 2``). The
    paper's :math:`D(w_i, w_{Re})`, a benign local model's distance to the global model it started from, is the
    norm of the update :math:`x_i` (the global model is the zero update). Where the paper's divisor
    :math:`m - 2c - 1` is not positive (its bound assumes :math:`m > 2c + 1`) Phalanx divides by 1 instead — its
    own choice: the bound only sets where halving starts, each candidate is still checked against Krum. Distances
    are Euclidean (not squared), computed in float64; the result is ``nan``/``inf`` only for non-finite rows.
    """
    x = honest.detach().to(torch.float64)
    h, d = x.shape
    k = min(max(h - 2, 0), h - 1)
    nearest = 0.0
    if k > 0:
        dist = pairwise_sqdist(x).clamp_min(0.0).sqrt()
        dist.fill_diagonal_(float("inf"))
        nearest = float(torch.topk(dist, k, dim=1, largest=False).values.sum(dim=1).min())
    divisor = max(h + n_byzantine - 2 * n_byzantine - 1, 1)
    farthest = float(torch.linalg.vector_norm(x, dim=1).max())
    return (nearest / divisor + farthest) / math.sqrt(d)


def krum_picks_byzantine(sqdist: Tensor, n_honest: int, f: int) -> bool:
    """Whether Phalanx's Krum with ``f`` selects one of the rows after the first ``n_honest`` of the ``(n, n)``
    squared-distance matrix ``sqdist``: :func:`~phalanx.aggregators.krum.krum_scores` with ``n − f − 2`` neighbours
    and :func:`~phalanx.aggregators.krum.krum_order`'s tie-break, exactly as :class:`~phalanx.aggregators.krum.Krum`
    chooses. Where ``n − f − 2 < 0`` (a Krum the server's rule refuses to run) 0 neighbours: the tie-break decides."""
    n = sqdist.shape[0]
    scores = krum_scores(sqdist, min(max(n - f - 2, 0), n - 1))
    return int(krum_order(scores, sqdist)[0]) >= n_honest


@register
class FangKrum(Attack):
    r"""Fang et al.'s full-knowledge attack on Krum: every Byzantine worker sends :math:`-\lambda^\star s`.

    .. math::
        y_1 = \dots = y_b = -\lambda^\star s, \qquad s = \mathrm{sign}(\bar g), \qquad
        \lambda^\star = \max\big\{\lambda_0 2^{-k} \ge \tau :
        \mathrm{Krum}_f(x_1, \dots, x_h, y, \dots, y) \in \{y\}\big\},

    λ₀ from :func:`fang_krum_bound`, ``τ = threshold`` (the paper's 10⁻⁵), ``Krum_f`` Phalanx's Krum with the
    context's ``f`` (:func:`krum_picks_byzantine`). The search halves λ from λ₀ until Krum selects a Byzantine row;
    when λ falls below τ first, it gives up and sends :math:`-\lambda s` with that λ (below τ: almost the zero
    update, the paper's unchanged global model). Each candidate costs O(n²): the honest rows' distances
    (:func:`~phalanx.aggregators._numerics.pairwise_sqdist`, once) and
    :math:`\lVert x_i + \lambda s\rVert^2 = \lVert x_i\rVert^2 + 2\lambda\langle x_i, s\rangle + \lambda^2\lVert
    s\rVert^2` are computed in float64 before the search, with λ rounded to the honest dtype as it is sent.

    Fang, Cao, Jia & Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning", USENIX Security
    2020, Section 4 (attacking Krum, full knowledge): the crafted local model :math:`w'_1 = w_{Re} - \lambda s`,
    the other ``c − 1`` close to it, λ the largest for which Krum selects :math:`w'_1`, found by halving an upper
    bound down to a threshold. What Phalanx does differently:

    * It is applied to the vectors the workers send (gradients or pseudo-gradients, which the server subtracts),
      as Phalanx's ``fang`` is: :math:`w_{Re}` is the zero update and ``s = sign(ḡ)`` — the rule Shejwalkar &
      Houmansadr's and Blades' implementations use (``−λ·sign(mean)``); λ is in the units of the vectors.
      Coordinates where ḡ is 0 get 0.
    * The ``c − 1`` other Byzantine workers send exact copies of :math:`w'_1` — the case the paper's search
      assumes and the one those implementations send; the paper then samples them within a small ε of it.
    * The paper's Krum tolerates ``c`` = the number of attackers; here Krum uses the server's configured ``f``
      (``c = b`` stays in the bound).
    * With ``attack_knowledge = "colluders"`` the rows it sees are the ``b`` colluders' own honest vectors: Krum is
      evaluated on them and the ``b`` crafted ones, and ``s`` is the sign of their mean — the paper's
      partial-knowledge attack, which treats the compromised workers' before-attack models as the benign ones.
    * Giving up sends :math:`-\lambda s` with the first λ below τ; Shejwalkar & Houmansadr's and Blades' code send
      :math:`\bar g - \lambda s` there, and measure the bound's second term from ḡ instead of from the zero update.
    """

    name: ClassVar[str] = "fangkrum"
    reference: ClassVar[str] = (
        "M. Fang, X. Cao, J. Jia, N. Gong, 'Local Model Poisoning Attacks to Byzantine-Robust Federated Learning', "
        "USENIX Security 2020, Section 4 (full-knowledge attack on Krum: w_Re - lambda s, lambda halved from its "
        "upper bound until Krum selects it, threshold 1e-5)"
    )
    threat: ClassVar[str] = (
        "omniscient (full knowledge): sees every honest vector of the round; tailored to Krum with the server's f"
    )

    def __init__(self, threshold: float = 1e-5) -> None:
        self.threshold = check_real("threshold", threshold, low=0.0, low_open=True)

    def search(self, ctx: AttackContext) -> tuple[FangKrumSearch, Tensor]:
        """Run the λ search of this round: the result and ``s``, the sign vector ``(d,)`` in the compute dtype."""
        honest = ctx.honest.detach()
        s = torch.sign(honest_mean(honest))
        h, b = ctx.n_honest, ctx.n_byzantine
        bound = fang_krum_bound(honest, b)
        s64 = s.to(torch.float64)
        q = float((s64 * s64).sum())
        if q == 0.0 or not math.isfinite(bound) or bound <= 0.0:  # no direction, no spread, or non-finite rows
            return FangKrumSearch(0.0, bound, False, 0), s
        x = honest.to(torch.float64)
        norms, inner = (x * x).sum(dim=1).cpu(), (x @ s64).cpu()  # the search itself runs on the CPU: O(n²) a step
        sqdist = torch.zeros((h + b, h + b), dtype=torch.float64)
        sqdist[:h, :h] = pairwise_sqdist(x).cpu()
        lam, evaluations = bound, 0
        while lam >= self.threshold and evaluations < _MAX_HALVINGS:
            sent = _as_sent(lam, honest.dtype)
            evaluations += 1
            if math.isfinite(sent):
                cross = (norms + (2.0 * sent) * inner + (sent * sent) * q).clamp_min(0.0)
                sqdist[:h, h:] = cross[:, None]
                sqdist[h:, :h] = cross[None, :]
                if krum_picks_byzantine(sqdist, h, ctx.f):
                    return FangKrumSearch(sent, bound, True, evaluations), s
            lam *= 0.5
        return FangKrumSearch(_as_sent(lam, honest.dtype), bound, False, evaluations), s

    def _run(self, ctx: AttackContext) -> Tensor:
        found, s = self.search(ctx)
        return repeat_row(s * (-found.lam), ctx.n_byzantine, ctx.honest)


def _as_sent(lam: float, dtype: torch.dtype) -> float:
    """``λ`` rounded to ``dtype``, the value each coordinate ``−λ·sᵢ`` of the sent rows carries (``inf`` where it
    overflows a half-precision dtype)."""
    return float(torch.tensor(lam, dtype=torch.float64).to(dtype))
