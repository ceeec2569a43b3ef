"""Robust gossip rules: how an honest node combines what its neighbours sent, weighted by the gossip matrix W.

Node i holds its local step x̃ᵢ and receives yⱼ from every neighbour j ∈ N(i) (x̃ⱼ from an honest neighbour,
anything from a Byzantine one). Plain gossip is xᵢ ← Σⱼ Wᵢⱼ yⱼ = x̃ᵢ + Σⱼ Wᵢⱼ (yⱼ − x̃ᵢ) (W row stochastic, j
over N(i)). The rules here keep that form and make each difference Dⱼ = yⱼ − x̃ᵢ safe first:

- ``clipped_gossip`` — ClippedGossip (He, Karimireddy & Jaggi, "Byzantine-robust decentralized learning via
  ClippedGossip", arXiv 2202.01545, 2022): xᵢ ← x̃ᵢ + Σⱼ Wᵢⱼ CLIP(Dⱼ, τᵢ), CLIP(v, τ) = min(1, τ/‖v‖) v,
  with the practical adaptive radius τᵢ = √(Σ_{j∈Sᵢ} Wᵢⱼ ‖Dⱼ‖² / bᵢ), Sᵢ the nearest neighbours (and i itself,
  ‖D‖ = 0) up to cumulative weight (Σ_{j∈N(i)∪{i}} Wᵢⱼ) − bᵢ: all but the farthest weight bᵢ.
- ``cs_plus`` — CS+-RG (Gaucher, Dieuleveut & Hendrikx, "Unified breakdown analysis for Byzantine robust gossip",
  ICML 2025, arXiv 2410.10418): xᵢ ← x̃ᵢ + η Σⱼ Wᵢⱼ CLIP(Dⱼ, τᵢ), τᵢ the distance below which the candidates
  (N(i) and i itself) leave weight 2bᵢ above: the weight-2bᵢ farthest differences are clipped to τᵢ, the others
  kept. With unit weights and f Byzantine neighbours: clip to the (2f + 1)-th largest distance.
- ``ios`` — Iterative Outlier Scissor (Wu, Chen & Ling, "Byzantine-resilient decentralized stochastic
  optimization with robust aggregation rules", IEEE Trans. Signal Processing 2023, arXiv 2206.04568): f times,
  drop the remaining neighbour farthest from the W-weighted average of the remaining ones and i; then return that
  average (weights renormalised).
- ``monna`` — MoNNA's Nearest-Neighbour Averaging (Farhadkhani, Guerraoui, Gupta, Hoang, Pinot & Stephan, "Robust
  collaborative learning with linear gradient overhead", ICML 2023, arXiv 2209.10931): keep the candidates N(i) ∪
  {i} nearest to x̃ᵢ up to cumulative weight (Σ_{j∈N(i)∪{i}} Wᵢⱼ) − bᵢ and return their W-weighted average
  (renormalised); with equal weights, the |N(i)| + 1 − f nearest, averaged. The momentum is the node's local step.

bᵢ, the Byzantine weight node i tolerates, comes from the configured f: the sum of the f largest neighbour weights
of row i of W (what f Byzantine neighbours can weigh at most; f/(dᵢ + 1) on a regular graph with
Metropolis–Hastings weights). With f = 0 every rule is plain gossip.

Every rule is a :class:`GossipRule`: an :class:`~phalanx.aggregators.base.Aggregator` whose :meth:`~GossipRule.combine`
works on a batch of nodes at once — ``(B, K, d)`` neighbour rows padded to the largest degree K, their weights
``(B, K)`` (0 on padding) — with no loop over nodes or coordinates. Called as an aggregator, ``rule(x, own=k,
weights=w)`` combines the rows of one closed neighbourhood, row ``k`` being the node's own.

Bad rows (a squared norm that is not finite in the data's dtype: NaN, ±Inf, 1e38) count as infinitely far: with
f ≥ 1 they get weight 0 (CLIP of a NaN difference is 0, as in He et al.'s code). A user's own rule subclasses
:class:`GossipRule` and implements :meth:`~GossipRule.coefficients`.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.decentralized.topology import Graph, check_neighbourhood
from phalanx.errors import ConfigError, InputError
from phalanx.plugins import Registry, check_params, import_spec, is_spec
from phalanx.validate import check_real

__all__ = [
    "IOS", "CSPlus", "ClippedGossip", "GossipRule", "MoNNA", "byzantine_weights", "configured", "get_class",
    "is_gossip_rule", "make", "names", "register",
]

CHUNK_ELEMENTS = 1 << 24
"""The batched combination gathers at most this many elements (B · K · d) at once; larger batches are cut into
chunks of nodes (64 MiB of float32)."""


def byzantine_weights(weights: Tensor, f: int) -> Tensor:
    """bᵢ for every row of ``weights`` ``(B, K)`` (node i's neighbour weights, 0 on padding): the sum of its f
    largest entries, float64 ``(B,)``."""
    w = weights.to(torch.float64)
    k = min(int(f), w.shape[1])
    if k == 0:
        return torch.zeros(w.shape[0], dtype=torch.float64, device=w.device)
    return torch.topk(w, k, dim=1).values.sum(dim=1)


def _tolerance(total: Tensor, slots: int) -> Tensor:
    """How far a cumulative sum of ``slots`` float64 weights may be off: 16 · slots · eps · max(total, 1)."""
    return 16.0 * slots * torch.finfo(torch.float64).eps * total.clamp(min=1.0)


def _sorted_with_self(r: Tensor, w: Tensor, w_self: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The candidates N(i) ∪ {i} by increasing distance: distances ``(B, K+1)`` (the node's own 0 first, bad rows
    +inf), their weights, the cumulative weights, the total (``(B,)``) and the order (sorted slot k is candidate
    ``order[:, k]``; candidate 0 is the node itself, candidate j + 1 its neighbour slot j)."""
    zero = torch.zeros_like(r[:, :1])
    rr = torch.cat([zero, r], dim=1)
    ww = torch.cat([w_self[:, None], w], dim=1)
    rs, order = torch.sort(rr, dim=1, stable=True)
    ws = torch.gather(ww, 1, order)
    cum = torch.cumsum(ws, dim=1)
    return rs, ws, cum, cum[:, -1], order


def _clip_factors(r: Tensor, tau: Tensor) -> Tensor:
    """min(1, τ/r) per slot (1 where r ≤ τ, so 0/0 never happens), float64."""
    return torch.where(r <= tau[:, None], torch.ones_like(r), tau[:, None] / r)


class GossipRule(Aggregator):
    """A robust gossip rule (see the module's docstring): ``xᵢ ← x̃ᵢ + Σⱼ cᵢⱼ (yⱼ − x̃ᵢ)`` with coefficients
    cᵢⱼ ≥ 0 that the rule computes from the differences, the weights Wᵢⱼ and bᵢ.

    ``f`` is the number of Byzantine neighbours a node tolerates (its weight bᵢ: :func:`byzantine_weights`). A
    node's closed neighbourhood must hold 2f + 1 nodes (``min_workers``). Context of a call as an aggregator:
    ``own`` (the index of the node's own row, required) and ``weights`` (the rows' gossip weights, default 1/n).
    """

    requirement = "every closed neighbourhood N(i) ∪ {i} holds >= 2f + 1 nodes"
    context_keys = frozenset({"own", "weights"})
    gossip_only: ClassVar[bool] = True
    """Runs at the nodes of ``algorithm = "gossip"`` only (it needs the node's own row and W)."""

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def check_graph(self, graph: Graph) -> None:
        """Refuse a graph on which some node has fewer than 2f neighbours (a one-line ConfigError naming ``f``)."""
        check_neighbourhood(graph, self.f, self.min_workers(), rule=self.name)

    @abstractmethod
    def coefficients(self, diff: Tensor, r: Tensor, w: Tensor, w_self: Tensor, b: Tensor) -> Tensor:
        """The coefficients cᵢⱼ, float64 ``(B, K)``, of a batch of nodes: ``diff`` the differences yⱼ − x̃ᵢ
        ``(B, K, d)``, ``r`` their norms (float64, +inf for a bad row, 0 on padding), ``w`` the weights Wᵢⱼ (0 on
        padding), ``w_self`` Wᵢᵢ and ``b`` the tolerated Byzantine weight bᵢ (both ``(B,)``)."""

    def combine_with_coefficients(
        self, own: Tensor, rows: Tensor, w: Tensor, w_self: Tensor, b: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """:meth:`combine` and the coefficients it used (float64 ``(B, K)``)."""
        if rows.ndim != 3 or own.ndim != 2 or rows.shape[0] != own.shape[0] or rows.shape[2] != own.shape[1]:
            raise InputError(f"{self.name}: rows", f"shapes {tuple(rows.shape)} and own {tuple(own.shape)}",
                             "rows (B, K, d) and own (B, d)")
        out_dtype = own.dtype
        own_c = own.float() if own.dtype in (torch.float16, torch.bfloat16) else own
        diff = rows.to(own_c.dtype) - own_c[:, None, :]
        r = torch.linalg.vector_norm(diff, dim=2).to(torch.float64)
        r = torch.where(torch.isfinite(r), r, torch.full_like(r, float("inf")))
        w64, ws64, b64 = (t.to(device=r.device, dtype=torch.float64) for t in (w, w_self, b))
        coef = self.coefficients(diff, r, w64, ws64, b64)
        kept = coef != 0
        safe = torch.where(kept[:, :, None], diff, torch.zeros((), dtype=diff.dtype, device=diff.device))
        out = own_c + torch.einsum("bk,bkd->bd", coef.to(diff.dtype), safe)
        return out.to(out_dtype), coef

    def combine(self, own: Tensor, rows: Tensor, w: Tensor, w_self: Tensor, b: Tensor) -> Tensor:
        """The new models ``(B, d)`` of B nodes: ``own`` their local steps ``(B, d)``, ``rows`` what their
        neighbours sent ``(B, K, d)`` (padding: any finite row, e.g. the node's own), ``w`` the weights ``(B, K)``
        (0 on padding), ``w_self`` ``(B,)`` and ``b`` ``(B,)`` (:func:`byzantine_weights`)."""
        return self.combine_with_coefficients(own, rows, w, w_self, b)[0]

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n = x.shape[0]
        own = context.get("own")
        if isinstance(own, Tensor) and own.numel() == 1:
            own = int(own)
        if isinstance(own, bool) or not isinstance(own, int) or not 0 <= own < n:
            raise ConfigError(
                "rule", self.name, "a server rule here (a robust gossip rule runs at the nodes of algorithm = "
                "'gossip', Gossip, called with own=<index of the node's own row> and weights=)",
                f"own={own!r} for {n} rows",
            )
        weights = context.get("weights")
        if weights is None:
            wt = torch.full((n,), 1.0 / n, dtype=torch.float64, device=x.device)
        else:
            wt = torch.as_tensor(weights, dtype=torch.float64, device=x.device).flatten()
            if wt.numel() != n:
                raise InputError(f"{self.name}: weights", f"{wt.numel()} weights", f"one per row ({n})")
        others = torch.tensor([j for j in range(n) if j != own], dtype=torch.long, device=x.device)
        w = wt[others][None]
        out, coef = self.combine_with_coefficients(
            x[own][None], x[others][None], w, wt[own].reshape(1), byzantine_weights(w, self.f),
        )
        if not want_contributions:
            return out[0], None
        share = torch.zeros(n, dtype=torch.float64, device=x.device)
        share[others] = coef[0]
        share[own] = 1.0 - coef[0].sum()
        return out[0], share


class ClippedGossip(GossipRule):
    r"""ClippedGossip with the practical adaptive radius, ``clipped_gossip``.

    .. math:: x_i \leftarrow \tilde x_i + \sum_{j \in N(i)} W_{ij}\,\mathrm{CLIP}(y_j - \tilde x_i, \tau_i),
              \qquad \tau_i = \sqrt{\tfrac{1}{b_i} \textstyle\sum_{j \in S_i} W_{ij} \|y_j - \tilde x_i\|^2}

    S_i: the candidates N(i) ∪ {i} by increasing distance whose cumulative weight stays within
    :math:`\sum_{j \in N(i) \cup \{i\}} W_{ij} - b_i` (all but the farthest weight b_i). τ_i = ∞ when b_i = 0 (plain
    gossip), 0 when only i itself is in S_i. He, Karimireddy & Jaggi (arXiv 2202.01545) prove convergence with the
    oracle radius over the honest neighbours, :math:`\tau_i^2 = \frac{1}{\delta_i}\sum_{j \text{ honest}} W_{ij}
    \|\cdot\|^2`; "all but the farthest weight b" stands in for the unknown honest set (as in Gaucher, Dieuleveut &
    Hendrikx's implementation ``cs_he``, whose S_i stops one candidate earlier: cumulative weight strictly below the
    bound; we include the candidate that reaches it). The guarantee, as the paper's abstract states it (the theorem's
    text was not retrieved): convergence to an O(δ_max ζ²/γ²) neighbourhood of a stationary point for non-convex
    objectives, γ the spectral gap, δ_max the largest Byzantine weight at an honest node, ζ² the heterogeneity; none
    is claimed for the practical radius (docs/decentralized.md).
    """

    name: ClassVar[str] = "clipped_gossip"
    reference: ClassVar[str] = (
        "L. He, S. P. Karimireddy, M. Jaggi, 'Byzantine-robust decentralized learning via ClippedGossip', "
        "arXiv 2202.01545, 2022 (self-centred clipping, practical adaptive tau)"
    )

    def coefficients(self, diff: Tensor, r: Tensor, w: Tensor, w_self: Tensor, b: Tensor) -> Tensor:
        rs, ws, cum, total, _ = _sorted_with_self(r, w, w_self)
        inside = cum <= (total - b + _tolerance(total, rs.shape[1]))[:, None]
        sq = torch.where(inside & torch.isfinite(rs), ws * rs * rs, torch.zeros_like(rs)).sum(dim=1)
        inf = torch.full_like(b, float("inf"))
        tau = torch.where(b > 0, torch.sqrt(sq / torch.where(b > 0, b, torch.ones_like(b))), inf)
        return _finish(w * _clip_factors(r, tau), r, w, b)


class CSPlus(GossipRule):
    r"""CS+-RG, ``cs_plus``: clip the weight-2b farthest differences to the distance below them.

    .. math:: x_i \leftarrow \tilde x_i + \eta \sum_{j \in N(i)} W_{ij}\,\mathrm{CLIP}(y_j - \tilde x_i, \tau_i)

    The candidates N(i) ∪ {i} (i at distance 0) sorted by distance r, cumulative weights c, total C, target
    C − 2b_i; k* the first candidate with c ≥ target: τ_i = r_(k*) if c_(k*) = target (within float64 rounding),
    else r_(k*−1) (0 if k* is the first); τ_i = ∞ when b_i = 0 (plain gossip with W when η = 1). Gaucher,
    Dieuleveut & Hendrikx, ICML 2025 (arXiv 2410.10418), the CS+ summand of their F-RG framework
    xᵢ ← xᵢ − η F({Wᵢⱼ, xᵢ − xⱼ}; bᵢ).

    ``step`` η > 0 (default 1): with W a gossip matrix, η = 1 makes f = 0 exactly plain gossip. Their code uses
    η = 1/λ_max(L) of the honest graph's weighted Laplacian, with unit weights (Wᵢⱼ = 1) in most experiments; with a
    row-stochastic W the Laplacian I − W has λ_max ≤ 2, and η = 1 is the gossip step itself.
    """

    name: ClassVar[str] = "cs_plus"
    reference: ClassVar[str] = (
        "R. Gaucher, A. Dieuleveut, H. Hendrikx, 'Unified breakdown analysis for Byzantine robust gossip', "
        "ICML 2025, arXiv 2410.10418 (CS+-RG)"
    )

    def __init__(self, f: int = 0, step: float = 1.0) -> None:
        super().__init__(f)
        self.step = check_real("step", step, low=0.0, low_open=True)

    def params(self) -> dict[str, Any]:
        return {"f": self.f, "step": self.step}

    def coefficients(self, diff: Tensor, r: Tensor, w: Tensor, w_self: Tensor, b: Tensor) -> Tensor:
        rs, _, cum, total, _ = _sorted_with_self(r, w, w_self)
        slots = rs.shape[1]
        target = total - 2.0 * b
        tol = _tolerance(total, slots)
        k = torch.searchsorted(cum.contiguous(), (target - tol)[:, None].contiguous()).squeeze(1)
        beyond = k >= slots
        kc = k.clamp(max=slots - 1)
        at = torch.gather(rs, 1, kc[:, None]).squeeze(1)
        before = torch.where(kc > 0, torch.gather(rs, 1, (kc - 1).clamp(min=0)[:, None]).squeeze(1),
                             torch.zeros_like(at))
        equal = (torch.gather(cum, 1, kc[:, None]).squeeze(1) - target).abs() <= tol
        tau = torch.where(equal, at, before)
        tau = torch.where((b > 0) & ~beyond, tau, torch.full_like(tau, float("inf")))
        return _finish(self.step * w * _clip_factors(r, tau), r, w, b)


class IOS(GossipRule):
    r"""Iterative Outlier Scissor, ``ios``: drop the f neighbours farthest from the running weighted average.

    .. math:: \text{f times:}\quad \bar x = \frac{W_{ii}\tilde x_i + \sum_{j \in R} W_{ij} y_j}{W_{ii} +
              \sum_{j \in R} W_{ij}},\quad R \leftarrow R \setminus \{\arg\max_{j \in R} \|y_j - \bar x\|\};
              \qquad x_i \leftarrow \bar x \text{ over the final } R

    starting from R = N(i); the node itself is never dropped. Wu, Chen & Ling, "Byzantine-resilient decentralized
    stochastic optimization with robust aggregation rules", IEEE Trans. Signal Processing 71, 2023 (arXiv
    2206.04568), as in the authors' implementation (github.com/Zhaoxian-Wu/IOS, ``D_ios``) and Gaucher et al.'s:
    Metropolis–Hastings weights, f removals (the authors' runs use the true number of Byzantine neighbours; here the
    configured f). Bad rows are dropped first.
    """

    name: ClassVar[str] = "ios"
    reference: ClassVar[str] = (
        "Z. Wu, T. Chen, Q. Ling, 'Byzantine-resilient decentralized stochastic optimization with robust aggregation "
        "rules', IEEE Trans. Signal Processing 71, 2023, arXiv 2206.04568 (iterative outlier scissor)"
    )

    def coefficients(self, diff: Tensor, r: Tensor, w: Tensor, w_self: Tensor, b: Tensor) -> Tensor:
        bad = torch.isinf(r)
        kept = w > 0
        zero = torch.zeros((), dtype=diff.dtype, device=diff.device)
        clean = torch.where(bad[:, :, None], zero, diff)
        minus_inf = torch.full_like(r, float("-inf"))
        for _ in range(self.f):
            use = kept & ~bad
            ww = torch.where(use, w, torch.zeros_like(w))
            centre = torch.einsum("bk,bkd->bd", (ww / (w_self + ww.sum(dim=1))[:, None]).to(diff.dtype), clean)
            score = torch.linalg.vector_norm(clean - centre[:, None, :], dim=2).to(torch.float64)
            score = torch.where(bad, torch.full_like(score, float("inf")), score)
            score = torch.where(kept, score, minus_inf)
            best, drop = score.max(dim=1)
            can = best > float("-inf")
            kept = kept & ~(torch.nn.functional.one_hot(drop, w.shape[1]).bool() & can[:, None])
        ww = torch.where(kept, w, torch.zeros_like(w))
        return ww / (w_self + ww.sum(dim=1))[:, None]


class MoNNA(GossipRule):
    r"""MoNNA's mixing step, ``monna``: the W-weighted average of the candidates nearest to the node's own x̃ᵢ.

    .. math:: x_i \leftarrow \frac{\sum_{j \in N(i) \cup \{i\}} \omega_{ij}\, y_j}{\sum_{j} \omega_{ij}},
              \qquad \omega_{ij} = \min\bigl(W_{ij},\ \max(0,\ C_i - b_i - c_{<j})\bigr)

    (y_i = x̃ᵢ.) The candidates N(i) ∪ {i} sorted by distance ‖yⱼ − x̃ᵢ‖ (i itself first, at 0), c_{<j} the
    cumulative weight of those before j, Cᵢ the total: the nearest are kept up to cumulative weight Cᵢ − bᵢ — all but
    the farthest weight bᵢ, the candidate that crosses the bound with the part of its weight below it — and averaged
    with their weights W, renormalised. Farhadkhani, Guerraoui, Gupta, Hoang, Pinot & Stephan, "Robust collaborative
    learning with linear gradient overhead", ICML 2023 (arXiv 2209.10931): every honest node takes a local step with
    Polyak momentum (x̃ᵢ = xᵢ − η mᵢ, the gossip node's ``momentum``) and then Nearest-Neighbour Averaging, the
    uniform average of the n − f received vectors (its own included) nearest to x̃ᵢ, as in the authors' code
    (github.com/LPD-EPFL/robust-collaborative-learning, ``cva`` with ``honest_index``) and ByzFL's ``MoNNA``
    (github.com/LPD-EPFL/byzfl).

    **Weighted W.** On a d-regular graph with Metropolis–Hastings weights (every Wᵢⱼ = 1/(d + 1), bᵢ = f/(d + 1))
    the kept weight is (d + 1 − f)/(d + 1): exactly the |N(i)| + 1 − f nearest, equal weights — the paper's rule
    on the closed neighbourhood, and on the complete graph (W = J/n) the paper's n − f nearest. With unequal
    weights it keeps exactly the weight Cᵢ − bᵢ: a candidate that straddles the bound keeps the part of its weight
    below it (a weighted trimming, so no more honest weight than bᵢ is dropped); a kept Byzantine neighbour is then
    no farther than some dropped honest one, NNA's argument. Cumulative weights are compared within float64
    rounding (16 · slots · eps), so uniform weights keep whole candidates. bᵢ = 0 (f = 0) keeps every candidate:
    plain gossip Σⱼ Wᵢⱼ yⱼ (W row stochastic). Bad rows (infinitely far) are dropped when bᵢ > 0. Ties in distance
    go to the node itself, then to the neighbours in index order.
    """

    name: ClassVar[str] = "monna"
    reference: ClassVar[str] = (
        "S. Farhadkhani, R. Guerraoui, N. Gupta, L. N. Hoang, R. Pinot, J. Stephan, 'Robust collaborative learning "
        "with linear gradient overhead', ICML 2023, arXiv 2209.10931 (MoNNA: momentum + nearest-neighbour averaging)"
    )

    def coefficients(self, diff: Tensor, r: Tensor, w: Tensor, w_self: Tensor, b: Tensor) -> Tensor:
        rs, ws, cum, total, order = _sorted_with_self(r, w, w_self)
        before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)
        tol = _tolerance(total, rs.shape[1])[:, None]
        room = (total - b)[:, None] - before  # weight still to keep when this candidate comes
        kept = torch.where(room <= tol, torch.zeros_like(ws), torch.where(room >= ws - tol, ws, room))
        kept = torch.where(torch.isinf(rs) & (b > 0)[:, None], torch.zeros_like(kept), kept)  # bad rows
        kept = torch.zeros_like(kept).scatter(1, order, kept)  # back to candidate order: the node, then its slots
        mass = kept.sum(dim=1, keepdim=True)
        coef = torch.where(mass > 0, kept / torch.where(mass > 0, mass, torch.ones_like(mass)), torch.zeros_like(kept))
        return _finish(coef[:, 1:], r, w, b)


def _finish(coef: Tensor, r: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """A bad row's coefficient is 0 when the node tolerates Byzantine weight (b > 0), its weight otherwise (plain
    gossip propagates what it receives); padding (weight 0) stays 0."""
    bad = torch.isinf(r) & (b > 0)[:, None]
    return torch.where(bad | (w == 0), torch.zeros_like(coef), coef)


# ---------------------------------------------------------------------------------------------------------- registry


def _accept(obj: Any, name: str) -> type[GossipRule]:
    if isinstance(obj, type) and issubclass(obj, GossipRule):
        return obj
    raise ConfigError("aggregator", name, "a subclass of phalanx.decentralized.robust_gossip.GossipRule")


_REGISTRY: Registry[type[GossipRule]] = Registry("gossip rule", "phalanx.gossip_rules", _accept)
for _cls in (ClippedGossip, CSPlus, IOS, MoNNA):
    _REGISTRY.register(_cls)


def register(cls: type[GossipRule]) -> type[GossipRule]:
    """Class decorator: make a :class:`GossipRule` subclass known to :func:`make` (and ``aggregator = ...`` with
    ``algorithm = "gossip"``) under ``cls.name``."""
    _REGISTRY.register(cls)
    return cls


def names() -> list[str]:
    """The robust gossip rules' names, sorted."""
    return _REGISTRY.names()


def get_class(name: str) -> type[GossipRule]:
    """The class of a robust gossip rule (a ConfigError naming ``aggregator`` with close names otherwise)."""
    return _REGISTRY.get(name, "aggregator")


def _split(spec: Any) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    from phalanx.aggregators.registry import parse_spec

    items = parse_spec(spec)
    return items, items[-1][0]


def is_gossip_rule(spec: Any) -> bool:
    """Whether an aggregator spec ends in a robust gossip rule (``"cs_plus"``, ``"cs_plus(step=0.5)"``, or a
    ``module:attr`` spec of a :class:`GossipRule` subclass)."""
    if not isinstance(spec, str):
        return False
    try:
        _, last = _split(spec)
    except ConfigError:
        return False
    if is_spec(last):
        obj = import_spec(last, "aggregator")
        return isinstance(obj, type) and issubclass(obj, GossipRule)
    return last in _REGISTRY.names()


def make(spec: str, f: int, **params: Any) -> GossipRule:
    """Build the robust gossip rule ``spec`` (a name, optionally with parameters: ``"cs_plus(step=0.5)"``) for
    ``f``; keyword arguments are more parameters. Pre-aggregators cannot precede it (a ConfigError naming
    ``aggregator``)."""
    from phalanx.aggregators.base import check_f

    check_f(f)
    items, last = _split(spec)
    if len(items) > 1:
        raise ConfigError("aggregator", spec, f"a robust gossip rule alone, without pre-aggregators before {last!r} "
                          "(it combines the raw neighbourhood with the gossip weights)")
    cls = get_class(last)
    kwargs = {**items[0][1], **params}
    kwargs.pop("f", None)
    check_params(cls.name, cls.__init__, kwargs, skip=("f",))
    return cls(f=f, **kwargs)


def configured(spec: str, f: int, algorithm: str, decentralized: bool) -> Aggregator:
    """The rule ``aggregator = spec`` names in a config of ``algorithm``: a robust gossip rule when the algorithm is
    ``decentralized`` (a model per node of a graph; refused otherwise, naming ``aggregator``), else
    :func:`phalanx.aggregators.make`."""
    from phalanx import aggregators

    if is_gossip_rule(spec):
        if not decentralized:
            raise ConfigError(
                "aggregator", spec, f"a rule of `phalanx list aggregators` with algorithm = {algorithm!r} ({spec!r} "
                "is a robust gossip rule: it runs at the nodes of a decentralized algorithm, 'gossip' or 'anytime')",
            )
        return make(spec, f)
    return aggregators.make(spec, f=f)
