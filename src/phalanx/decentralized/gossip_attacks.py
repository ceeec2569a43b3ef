"""Attacks of the decentralized literature: Byzantine nodes that use the graph (``algorithm = "gossip"``).

A Byzantine node may send each honest neighbour i its own vector; these attacks compute it from the honest nodes'
local steps X̃ (the ``(h, d)`` stack, row k = x̃ₖ) and the gossip matrix W (the configured ``gossip_weights``, also
when the nodes combine with a robust rule), for all targets at once. Every Byzantine neighbour of i sends i the same
vector:

- ``dissensus`` (He, Karimireddy & Jaggi, "Byzantine-robust decentralized learning via ClippedGossip", arXiv
  2202.01545, 2022)::

      x_byz→i = x̃ᵢ − ε · [Σ_{k ∈ N(i) honest} Wᵢₖ (x̃ₖ − x̃ᵢ)] / δᵢ,     δᵢ = Σ_{l ∈ N(i) Byzantine} Wᵢₗ

  Under plain gossip node i then gets x̃ᵢ + (1 − ε)·(its honest gossip progress): ε = 1 cancels the progress, ε > 1
  reverses it. Default ε = 1.5, the value of the authors' training scripts (``dissensus1.5``); their consensus
  experiments use ε = 1.
- ``spectral`` (Gaucher, Dieuleveut & Hendrikx, "Unified breakdown analysis for Byzantine robust gossip", ICML
  2025, arXiv 2410.10418)::

      x_byz→i = x̃ᵢ + c · uᵢ · (uᵀ X̃)

  u the unit Fiedler vector (eigenvector of the second smallest eigenvalue) of the weighted Laplacian of the honest
  subgraph, L = diag(W_H 1) − W_H with W_H the honest-to-honest off-diagonal weights: the push is along the slowest
  mixing mode of the honest nodes, apart across the graph's sparsest cut. uᵢ(uᵀX̃) does not depend on u's sign.
  ``scale`` c: a number ≥ 0, or ``"search"`` (the default, as the authors always search): for every target its own
  c, the one of the 16 scales 2⁻³, 2⁻², …, 2¹² (one batched evaluation of the targets' rule per scale) that puts
  the target's new model farthest from its honest gossip result x̃ᵢ + Σ_{k honest} Wᵢₖ (x̃ₖ − x̃ᵢ). The authors'
  line search (``tools.line_maximize``: from 0, doubling while it improves, then shrinking by 0.8; 16 evaluations)
  is meant to maximise the same distance, but their objective subtracts the honest result with a non-in-place
  ``sub`` whose result is dropped, so it maximises ‖Agg‖² instead; we use the intended objective.

In any other algorithm a gossip attack is refused (``configured``: a ConfigError naming ``attack``; called with a
server's :class:`~phalanx.attacks.base.AttackContext` it raises the same error).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.attacks.base import Attack, AttackContext, DataAttack
from phalanx.errors import ConfigError, InputError
from phalanx.plugins import Registry, check_params, import_spec, is_spec
from phalanx.validate import check_real

__all__ = [
    "SEARCH_SCALES", "Dissensus", "GossipAttack", "GossipView", "Spectral", "byzantine_weight", "configured",
    "fiedler_vector", "get_class", "honest_progress", "is_gossip_attack", "make", "names", "register",
]

SEARCH_SCALES = tuple(2.0**k for k in range(-3, 13))
"""The scales ``spectral`` with ``scale = "search"`` tries: 2⁻³ … 2¹², 16 of them."""


@dataclass
class GossipView:
    """What the Byzantine nodes of a gossip round know.

    Attributes
    ----------
    honest: the honest nodes' local steps X̃ ``(h, d)`` (nodes 0 … h − 1).
    mixing: the gossip matrix W ``(n, n)`` of the whole graph (Byzantine nodes are h … n − 1).
    targets: the honest nodes with at least one Byzantine neighbour, increasing ``(T,)`` int64.
    f: what each node's rule is configured to tolerate.
    combine: ``(T, d) messages -> (T, d)``: each target's new model when every Byzantine neighbour sends it its
        row of ``messages`` (the nodes' rule, for adaptive attacks); None when unknown.
    generator: the run's attack stream. round: the training round.
    """

    honest: Tensor
    mixing: Tensor
    targets: Tensor
    f: int = 0
    combine: Callable[[Tensor], Tensor] | None = None
    generator: torch.Generator | None = None
    round: int = 0

    def __post_init__(self) -> None:
        x, w, t = self.honest, self.mixing, self.targets
        if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[0] < 1 or not x.is_floating_point():
            raise InputError("GossipView.honest", getattr(x, "shape", type(x).__name__), "a float (h, d) tensor")
        if not isinstance(w, Tensor) or w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < x.shape[0]:
            raise InputError("GossipView.mixing", getattr(w, "shape", type(w).__name__),
                             f"an (n, n) matrix with n >= h = {x.shape[0]}")
        if not isinstance(t, Tensor) or t.ndim != 1 or (t.numel() and (int(t.min()) < 0 or int(t.max()) >= x.shape[0])):
            raise InputError("GossipView.targets", t, f"a 1-D tensor of honest node indices in [0, {x.shape[0]})")

    @property
    def h(self) -> int:
        """The number of honest nodes."""
        return int(self.honest.shape[0])

    def progress(self) -> Tensor:
        """Every target's honest gossip progress ``(T, d)`` (:func:`honest_progress`)."""
        return honest_progress(self.honest, self.mixing, self.targets)

    def byzantine_weight(self) -> Tensor:
        """δᵢ of every target, float64 ``(T,)`` (:func:`byzantine_weight`)."""
        return byzantine_weight(self.mixing, self.h, self.targets)


def _honest_block(mixing: Tensor, h: int) -> Tensor:
    """W_H: the honest-to-honest weights without the diagonal, float64 ``(h, h)``."""
    w = mixing[:h, :h].to(torch.float64).clone()
    w.fill_diagonal_(0.0)
    return w


def honest_progress(honest: Tensor, mixing: Tensor, targets: Tensor) -> Tensor:
    """Σ_{k ∈ N(i) honest} Wᵢₖ (x̃ₖ − x̃ᵢ) for every target i, ``(T, d)`` in the dtype of ``honest``: one matrix
    product, W_H[T] X̃ − (W_H[T] 1) ⊙ X̃[T]."""
    wh = _honest_block(mixing, honest.shape[0])[targets]
    return wh.to(honest.dtype) @ honest - wh.sum(dim=1).to(honest.dtype)[:, None] * honest[targets]


def byzantine_weight(mixing: Tensor, h: int, targets: Tensor) -> Tensor:
    """δᵢ = Σ_{l ∈ N(i) Byzantine} Wᵢₗ for every target, float64 ``(T,)``."""
    return mixing[targets, h:].to(torch.float64).sum(dim=1)


def fiedler_vector(mixing: Tensor, h: int) -> Tensor:
    """The unit Fiedler vector u of the honest subgraph's weighted Laplacian L = diag(W_H 1) − W_H (float64
    ``(h,)``; ``torch.linalg.eigh``, the eigenvector of the second smallest eigenvalue). Sign: its first entry
    that is not (numerically) 0 is positive. Zero for h < 2. When the second eigenvalue is repeated, u is the
    vector eigh returns for it (any vector of that eigenspace is a Fiedler vector)."""
    if h < 2:
        return torch.zeros(h, dtype=torch.float64)
    wh = _honest_block(mixing, h)
    lap = torch.diag(wh.sum(dim=1)) - wh
    u = torch.linalg.eigh((lap + lap.T) / 2).eigenvectors[:, 1]
    big = u.abs() > 64 * torch.finfo(torch.float64).eps * float(u.abs().max())
    first = int(torch.nonzero(big)[0])
    return -u if float(u[first]) < 0 else u


class GossipAttack(Attack):
    """A vector attack of decentralized rounds: :meth:`messages` gives every target the vector its Byzantine
    neighbours send it. Needs the graph: only with ``algorithm = "gossip"``."""

    threat: ClassVar[str] = (
        "omniscient, decentralized: sees every honest node's local step, the graph and W; sends each honest "
        "neighbour its own vector"
    )
    needs_graph: ClassVar[bool] = True
    """Only with algorithm = "gossip" (a marker for tables and configs)."""
    neighbourhood_only: ClassVar[bool] = False
    """Its message to node i needs only i's closed neighbourhood (and W), so it runs on real processes, where a
    Byzantine node sees its neighbours' steps only; the others (``spectral``: the Fiedler direction of every honest
    row) are refused there."""

    @abstractmethod
    def messages(self, view: GossipView) -> Tensor:
        """The vector every target receives from its Byzantine neighbours, ``(T, d)`` in the honest dtype."""

    def _run(self, ctx: AttackContext) -> Tensor:
        raise ConfigError("attack", self.name, "an attack of `phalanx list attacks` here (a decentralized attack "
                          "needs the graph: algorithm = 'gossip', phalanx.training.algorithms.gossip.Gossip)")


class Dissensus(GossipAttack):
    r"""Dissensus, ``dissensus``: undo (ε = 1) or reverse (ε > 1) each target's honest gossip progress.

    .. math:: x_{\mathrm{byz}\to i} = \tilde x_i - \varepsilon\,\frac{\sum_{k \in N(i)\ \mathrm{honest}} W_{ik}
              (\tilde x_k - \tilde x_i)}{\delta_i}, \qquad \delta_i = \sum_{l \in N(i)\ \mathrm{Byzantine}} W_{il}

    ``eps`` ε ≥ 0, default 1.5 (the authors' training scripts). He, Karimireddy & Jaggi, arXiv 2202.01545, the
    dissensus attack; in their code every Byzantine node has a single (target) neighbour, and the weights are the
    target's gossip weights W (uniform 1/(dᵢ + 1) when its rule is not a gossip one; here always the configured W).
    """

    name: ClassVar[str] = "dissensus"
    neighbourhood_only: ClassVar[bool] = True
    reference: ClassVar[str] = (
        "L. He, S. P. Karimireddy, M. Jaggi, 'Byzantine-robust decentralized learning via ClippedGossip', "
        "arXiv 2202.01545, 2022 (dissensus attack)"
    )

    def __init__(self, eps: float = 1.5) -> None:
        self.eps = check_real("eps", eps, low=0.0)

    def params(self) -> dict[str, Any]:
        return {"eps": self.eps}

    def messages(self, view: GossipView) -> Tensor:
        x = view.honest
        delta = view.byzantine_weight().to(x.dtype)
        safe = torch.where(delta > 0, delta, torch.ones_like(delta))
        return x[view.targets] - (self.eps / safe)[:, None] * view.progress()


class Spectral(GossipAttack):
    r"""Spectral attack, ``spectral``: push each target along the honest subgraph's Fiedler vector.

    .. math:: x_{\mathrm{byz}\to i} = \tilde x_i + c\,u_i\,(u^\top \tilde X)

    u: :func:`fiedler_vector`. ``scale`` c ≥ 0, or ``"search"`` (default): per target, the c of
    :data:`SEARCH_SCALES` that maximises ‖(its new model) − (its honest gossip result)‖ under the nodes' rule (see
    the module's docstring for how this differs from the authors' code). Gaucher, Dieuleveut & Hendrikx, ICML 2025
    (arXiv 2410.10418), the spectral attack.
    """

    name: ClassVar[str] = "spectral"
    reference: ClassVar[str] = (
        "R. Gaucher, A. Dieuleveut, H. Hendrikx, 'Unified breakdown analysis for Byzantine robust gossip', "
        "ICML 2025, arXiv 2410.10418 (spectral attack)"
    )

    needs_aggregator: ClassVar[bool] = True
    """With ``scale = "search"`` it evaluates the nodes' rule (``GossipView.combine``)."""

    def __init__(self, scale: float | str = "search") -> None:
        self.scale: float | str
        if isinstance(scale, str):
            if scale != "search":
                raise ConfigError("scale", scale, "a number >= 0 or 'search'")
            self.scale = scale
        else:
            self.scale = check_real("scale", scale, low=0.0)

    def params(self) -> dict[str, Any]:
        return {"scale": self.scale}

    def direction(self, view: GossipView) -> Tensor:
        """uᵢ (uᵀ X̃) for every target, ``(T, d)``."""
        x = view.honest
        u = fiedler_vector(view.mixing, view.h).to(x.dtype)
        return u[view.targets][:, None] * (u @ x)[None, :]

    def messages(self, view: GossipView) -> Tensor:
        x = view.honest
        base = x[view.targets]
        a = self.direction(view)
        if self.scale != "search":
            return base + float(self.scale) * a
        if view.combine is None:
            raise ConfigError("attack_params.scale", "search", "a number when the nodes' rule is unknown")
        return base + search_scale(view, base, a)[:, None].to(x.dtype) * a


def search_scale(
    view: GossipView, base: Tensor, direction: Tensor, scales: tuple[float, ...] = SEARCH_SCALES,
) -> Tensor:
    """Per target, the scale c of ``scales`` whose message ``base + c·direction`` puts the target's new model
    (``view.combine``) farthest from its honest gossip result x̃ᵢ + progress (float64 ``(T,)``; the first of equal
    ones; a non-finite distance counts as +inf)."""
    assert view.combine is not None
    honest_result = (view.honest[view.targets] + view.progress()).to(torch.float64)
    best = torch.full((base.shape[0],), float("-inf"), dtype=torch.float64)
    chosen = torch.full_like(best, scales[0])
    for c in scales:
        got = view.combine(base + c * direction)
        dist = torch.linalg.vector_norm(got.to(torch.float64) - honest_result, dim=1)
        dist = torch.where(torch.isnan(dist), torch.full_like(dist, float("inf")), dist)
        better = dist > best
        best = torch.where(better, dist, best)
        chosen = torch.where(better, torch.full_like(chosen, c), chosen)
    return chosen


# ---------------------------------------------------------------------------------------------------------- registry


def _accept(obj: Any, name: str) -> type[GossipAttack]:
    if isinstance(obj, type) and issubclass(obj, GossipAttack):
        return obj
    raise ConfigError("attack", name, "a subclass of phalanx.decentralized.gossip_attacks.GossipAttack")


_REGISTRY: Registry[type[GossipAttack]] = Registry("gossip attack", "phalanx.gossip_attacks", _accept)
for _cls in (Dissensus, Spectral):
    _REGISTRY.register(_cls)


def register(cls: type[GossipAttack]) -> type[GossipAttack]:
    """Class decorator: make a :class:`GossipAttack` subclass known to :func:`make` (and ``attack = ...`` with
    ``algorithm = "gossip"``) under ``cls.name``."""
    _REGISTRY.register(cls)
    return cls


def names() -> list[str]:
    """The decentralized attacks' names, sorted."""
    return _REGISTRY.names()


def get_class(name: str) -> type[GossipAttack]:
    """The class of a decentralized attack (a ConfigError naming ``attack`` with close names otherwise)."""
    return _REGISTRY.get(name, "attack")


def is_gossip_attack(name: Any) -> bool:
    """Whether ``name`` names a decentralized attack (registered, or a ``module:attr`` spec of a
    :class:`GossipAttack` subclass)."""
    if not isinstance(name, str):
        return False
    if is_spec(name):
        obj = import_spec(name, "attack")
        return isinstance(obj, type) and issubclass(obj, GossipAttack)
    return name in _REGISTRY.names()


def make(name: str, **params: Any) -> GossipAttack:
    """Build the decentralized attack ``name`` with its parameters (unknown ones refused, naming the accepted)."""
    cls = get_class(name)
    check_params(cls.name, cls.__init__, params)
    return cls(**params)


def configured(name: str, params: dict[str, Any], algorithm: str, decentralized: bool) -> Attack | DataAttack:
    """The attack ``attack = name`` (with ``attack_params``) names in a config of ``algorithm``: a decentralized
    attack when the algorithm is ``decentralized`` (refused otherwise, naming ``attack``), else
    :func:`phalanx.attacks.make`."""
    from phalanx import attacks

    if is_gossip_attack(name):
        if not decentralized:
            raise ConfigError(
                "attack", name, f"an attack of `phalanx list attacks` with algorithm = {algorithm!r} ({name!r} is a "
                "decentralized attack: it needs the graph of a decentralized algorithm, 'gossip' or 'anytime')",
            )
        return make(name, **params)
    return attacks.make(name, **params)
