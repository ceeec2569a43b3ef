"""Fang et al.'s full-knowledge attack on Krum (USENIX Security 2020): the largest step against the honest direction
that Krum still selects, found by halving an upper bound."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import pairwise_sqdist
from phalanx.aggregators.base import as_compute_dtype
from phalanx.aggregators.krum import krum_order, krum_scores
from phalanx.attacks._common import check_real, honest_mean, repeat_row
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["FangKrum", "FangKrumSearch", "fang_krum_bound", "krum_picks_byzantine"]

@dataclass(frozen=True)
class FangKrumSearch:
    """What :meth:`FangKrum.search` found in one round."""

    lam: float
    """The λ the Byzantine workers send ``−λ·s`` with (rounded to the honest dtype, as sent)."""
    bound: float
    """The search's start λ₀ (:func:`fang_krum_bound`)."""
    accepted: bool
    """Whether Krum (with the context's ``f``), computed as the server computes it on the honest rows and the rows
    sent, selects a Byzantine row at ``lam`` — also when the search gave up (``lam`` below ``threshold · bound``);
    False when it had nothing to search (``s = 0``, λ₀ = 0 or not finite, no Byzantine row)."""
    evaluations: int
    """How many candidate λ the search tried (one that overflows the honest dtype counts, unchecked)."""


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
    are Euclidean (not squared), computed in float64 on the rows divided by a power of two near their largest
    entry (exact), so that no square overflows and none underflows because of the rows' scale; the result is
    ``nan``/``inf`` only for non-finite rows, or where the bound itself exceeds float64's range (rows within a
    factor of about ``h`` of its largest value).
    """
    x = honest.detach().to(torch.float64)
    scale = _power_of_two_scale(x)
    xs = x / scale
    return _scaled_bound(xs, pairwise_sqdist(xs), n_byzantine) * scale


def _power_of_two_scale(x: Tensor) -> float:
    """A power of two ``σ`` with ``1 ≤ max|xᵢⱼ|/σ < 2`` (1 for zero, empty or non-finite rows). Dividing by it is
    exact (short of results below float64's normal range), and the scaled rows' squared norms and distances are at
    most ``16d``: none overflows, whatever the rows' scale."""
    top = float(x.abs().max()) if x.numel() else 0.0
    if top == 0.0 or not math.isfinite(top):
        return 1.0
    return math.ldexp(1.0, math.frexp(top)[1] - 1)


def _scaled_bound(xs: Tensor, sqdist: Tensor, n_byzantine: int) -> float:
    """:func:`fang_krum_bound` of float64 rows ``xs`` (``(h, d)``) whose squared distances ``sqdist`` are given."""
    h, d = xs.shape
    k = min(max(h - 2, 0), h - 1)
    nearest = 0.0
    if k > 0:
        dist = sqdist.clamp_min(0.0).sqrt()
        dist.fill_diagonal_(float("inf"))
        nearest = float(torch.topk(dist, k, dim=1, largest=False).values.sum(dim=1).min())
    divisor = max(h + n_byzantine - 2 * n_byzantine - 1, 1)
    farthest = float(torch.linalg.vector_norm(xs, dim=1).max())
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
        \lambda^\star = \max\big\{\lambda_0 2^{-k} \ge \tau\lambda_0 :
        \mathrm{Krum}_f(x_1, \dots, x_h, y, \dots, y) \in \{y\}\big\},

    λ₀ from :func:`fang_krum_bound`, ``τ = threshold`` (10⁻⁵, the paper's value, here relative to λ₀), ``Krum_f``
    Phalanx's Krum with the context's ``f`` (:func:`krum_picks_byzantine`). The search halves λ from λ₀ until Krum
    selects a Byzantine row; when λ falls below τλ₀ first, it gives up and sends :math:`-\lambda s` with that λ
    (almost the zero update, the paper's unchanged global model). That last λ is checked too, so
    :attr:`FangKrumSearch.accepted` is what Krum does with the rows sent; at most ⌊log₂(1/τ)⌋ + 2 candidates (18 at
    the default), whatever the rows' scale. Each candidate costs O(n²): the honest rows' distances
    (:func:`~phalanx.aggregators._numerics.pairwise_sqdist`, once) and
    :math:`\lVert x_i + \lambda s\rVert^2 = \lVert x_i\rVert^2 + 2\lambda\langle x_i, s\rangle + \lambda^2\lVert
    s\rVert^2` are computed in float64 before the search, on the rows divided by a power of two near their largest
    entry (so that none over- or underflows), with λ rounded to the honest dtype as it is sent. A λ the search
    accepts, and the one it gives up with, are then checked once, O(n²d), by Krum computed as the server computes
    it on the stacked rows (:func:`_server_krum_picks_sent`): on an exact tie the two roundings can differ, and the
    server's choice is the one that counts — a λ it rejects is halved like any other.

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
    * The threshold is relative: the search stops below τλ₀, where the paper stops below an absolute τ = 10⁻⁵ in
      units of model parameters — Phalanx's own choice. The vectors sent (gradients, pseudo-gradients) have no
      fixed scale: an absolute τ would make the attack depend on it (with rows 10⁻⁶ times the tests' standard
      setting, λ₀ < 10⁻⁵ and it would check nothing and send a row Krum rejects; with rows of norm 10³⁰ it would
      make 120 Krum checks). Relative, it is the same attack at every scale.
    * Giving up sends :math:`-\lambda s` with the first λ below τλ₀; Shejwalkar & Houmansadr's and Blades' code
      send :math:`\bar g - \lambda s` there, and measure the bound's second term from ḡ instead of from the zero
      update.
    * Where the paper's Krum is undefined or the dtype cannot carry λ, Phalanx's own choices: ``n − f − 2 < 0``
      (a Krum the server's rule refuses to run) counts 0 neighbours, so the tie-break decides; a λ that overflows
      the honest dtype (float32 or half precision) would be sent as ±inf, so it is skipped (counted, never
      accepted) and halved.
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
        x = honest.to(torch.float64)
        scale = _power_of_two_scale(x)  # the search runs in units of `scale`: no distance over- or underflows
        xs = x / scale
        honest_sqdist = pairwise_sqdist(xs).cpu()  # the search itself runs on the CPU: O(n²) a step
        bound_s = _scaled_bound(xs, honest_sqdist, b)
        bound = bound_s * scale
        s64 = s.to(torch.float64)
        q = float((s64 * s64).sum())
        if b == 0 or q == 0.0 or not math.isfinite(bound_s) or bound_s <= 0.0:  # nothing to send or search
            return FangKrumSearch(0.0, bound, False, 0), s
        norms, inner = (xs * xs).sum(dim=1).cpu(), (xs @ s64).cpu()
        sqdist = torch.zeros((h + b, h + b), dtype=torch.float64)
        sqdist[:h, :h] = honest_sqdist
        lam, floor, evaluations = bound_s, self.threshold * bound_s, 0
        while True:  # ends: λ halves, so it falls below `floor` or rounds to 0 in the honest dtype
            sent = _as_sent(lam * scale, honest.dtype)
            evaluations += 1
            if math.isfinite(sent):  # a λ the dtype cannot carry is not a candidate
                t = sent / scale
                cross = (norms + (2.0 * t) * inner + (t * t) * q).clamp_min(0.0)
                sqdist[:h, h:] = cross[:, None]
                sqdist[h:, :h] = cross[None, :]
                last = lam < floor or sent == 0.0  # smaller λ: below the threshold, or the same zero rows
                if krum_picks_byzantine(sqdist, h, ctx.f) or last:
                    accepted = _server_krum_picks_sent(honest, s, sent, b, ctx.f)
                    if accepted or last:
                        return FangKrumSearch(sent, bound, accepted, evaluations), s
            lam *= 0.5

    def _run(self, ctx: AttackContext) -> Tensor:
        found, s = self.search(ctx)
        return _sent_rows(s, found.lam, ctx.n_byzantine, ctx.honest)


def _sent_rows(s: Tensor, lam: float, b: int, honest: Tensor) -> Tensor:
    """The ``b`` rows ``−λ·s`` the attack sends, in the honest dtype."""
    return repeat_row(s * (-lam), b, honest)


def _server_krum_picks_sent(honest: Tensor, s: Tensor, lam: float, b: int, f: int) -> bool:
    """Whether Krum with ``f``, computed as the server's :class:`~phalanx.aggregators.krum.Krum` computes it (one
    :func:`~phalanx.aggregators._numerics.pairwise_sqdist` of the stacked rows, in the honest dtype or float32 for
    half precision), selects one of the rows sent at ``lam``. O(n²d), once per accepted candidate and once when the
    search gives up: where the search's expanded distances and the server's round differently (exact ties), the
    server's choice is the one reported."""
    rows = torch.cat([honest, _sent_rows(s, lam, b, honest)])
    return krum_picks_byzantine(pairwise_sqdist(as_compute_dtype(rows)), honest.shape[0], f)


def _as_sent(lam: float, dtype: torch.dtype) -> float:
    """``λ`` rounded to ``dtype``, the value each coordinate ``−λ·sᵢ`` of the sent rows carries (``inf`` where it
    overflows the dtype: float32 or half precision)."""
    return float(torch.tensor(lam, dtype=torch.float64).to(dtype))
