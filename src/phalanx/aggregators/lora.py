"""Robust aggregation of LoRA adapters: where the rule acts — on the factors, on each layer's update, or on B alone.

A LoRA adapter of a linear layer (Hu et al., ICLR 2022, Eq. 3) is a pair ``A ∈ ℝ^{r×d_in}``, ``B ∈ ℝ^{d_out×r}``
whose product changes the layer's weight by ``ΔW ∝ BA``. Clients send their factors (as displacements from the
global ones); the server's rule maps the ``(n, d)`` rows to one ``(d,)`` vector. Three modes
(:data:`MODES`; docs/lora.md says what each guarantees):

* ``factors`` — the rule on the flat vector of every A and B (FedIT, FlowerTune): the rule itself, no wrapper.
  Its ε and κ hold in factor space. Averaging the factors is not averaging the updates (Σ BᵢAᵢ ≠ (Σ Bᵢ)(Σ Aᵢ)/n:
  FedEx-LoRA, Singhal et al. 2025; FLoRA, Wang et al., NeurIPS 2024), so what the rule guarantees says nothing
  exact about the model's update.
* ``update`` — :class:`AdapterUpdates`: per adapted layer, the rows ``ΔWᵢ = BᵢAᵢ − BA`` (``d_out × d_in``, one
  layer at a time), the rule on them, and the rank-r truncated SVD of ``BA + ΔW_agg`` as the new factors (the best
  rank-r approximation, Eckart & Young 1936; FlexLoRA, Bai et al., NeurIPS 2024, aggregates ΔW and truncates
  alike). The rule acts where its guarantee means something for the model: applied block by block it keeps its
  (f, κ) and its ε on the concatenation of the layers' updates (the bounds add up over blocks of coordinates), up to
  the truncation, whose residual ‖BA + ΔW_agg − B′A′‖_F is measured (:attr:`AdapterUpdates.last_residual`). Exact
  for the mean whenever the clients' products span at most r directions; otherwise the mean of n rank-r products
  has rank up to n·r and the truncation is the documented price (FedEx-LoRA keeps the residual in the frozen base
  instead, which then travels).
* ``shared`` — A frozen and shared (FFA-LoRA, Sun et al., ICLR 2024): A is not in the vector at all
  (:mod:`phalanx.models.hf` freezes it), the rule acts on B alone, and ΔW = ΔB·A is linear in B: the aggregate is
  exact. With A's rows orthonormal times c (``A Aᵀ = c² I``, as the model makes them, one c per layer)
  ``‖ΔB A‖_F = c ‖ΔB‖_F``: the map to the updates is block-wise scaled (the head unscaled), so a coordinate-wise
  rule's ε and κ hold unchanged for ΔW and any other rule's up to max c²/min c²
  (:func:`phalanx.analysis.lora_kappa.shared_bound`).

The layout (:class:`LoraLayout`) is read from ``peft``'s parameter names — ``<layer>.lora_A.<adapter>.weight`` and
``<layer>.lora_B.<adapter>.weight`` — so it serves a simulated model's θ and a Flower client's ``ArrayRecord`` alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator, RuleTags
from phalanx.errors import ConfigError

__all__ = ["MODES", "AdapterUpdates", "LoraBlock", "LoraLayout", "imbalance", "refactor", "updates_of"]

MODES = ("factors", "update", "shared")
"""Where the rule acts on adapters (module docstring)."""
_UPDATE_CONTEXT = frozenset({"generator", "ids", "center"})
"""Context keys a rule may take in mode ``update`` (a centre is dropped: it lives in factor space)."""


@dataclass(frozen=True)
class LoraBlock:
    """One adapted layer in a flat vector: A ``(rank, d_in)`` at offset ``a``, B ``(d_out, rank)`` at offset ``b``
    (row-major)."""

    name: str
    a: int
    b: int
    rank: int
    d_in: int
    d_out: int


@dataclass(frozen=True)
class LoraLayout:
    """The adapted layers of a flat vector of ``dim`` coordinates; the other coordinates (a classification head,
    a B whose A is frozen) are ``rest``."""

    dim: int
    blocks: tuple[LoraBlock, ...]

    @classmethod
    def of(cls, names: Sequence[str], shapes: Sequence[Sequence[int]], offsets: Sequence[int] | None = None,
           ) -> LoraLayout:
        """The layout of tensors ``names`` with ``shapes`` laid out one after the other (or at ``offsets``): every
        ``…lora_A.…`` paired with its ``…lora_B.…``; an A and B of mismatched rank or width is a ConfigError."""
        if offsets is None:
            offsets, off = [], 0
            for s in shapes:
                offsets.append(off)
                off += _numel(s)
        dim = max((o + _numel(s) for o, s in zip(offsets, shapes)), default=0)
        where = {n: (o, tuple(int(v) for v in s)) for n, s, o in zip(names, shapes, offsets)}
        blocks = []
        for name, (off_a, shape_a) in where.items():
            if ".lora_A." not in name:
                continue
            partner = name.replace(".lora_A.", ".lora_B.")
            if partner not in where:
                continue
            off_b, shape_b = where[partner]
            if len(shape_a) != 2 or len(shape_b) != 2 or shape_a[0] != shape_b[1]:
                raise ConfigError("adapters", f"{name} {shape_a}, {partner} {shape_b}",
                                  "A of shape (r, d_in) and B of shape (d_out, r) with the same r")
            blocks.append(LoraBlock(name.split(".lora_A.")[0], off_a, off_b, shape_a[0], shape_a[1], shape_b[0]))
        return cls(dim, tuple(blocks))

    def rest(self) -> Tensor:
        """A boolean mask of the coordinates in no block."""
        keep = torch.ones(self.dim, dtype=torch.bool)
        for blk in self.blocks:
            keep[blk.a : blk.a + blk.rank * blk.d_in] = False
            keep[blk.b : blk.b + blk.d_out * blk.rank] = False
        return keep

    def factors(self, theta: Tensor, blk: LoraBlock) -> tuple[Tensor, Tensor]:
        """``(B, A)`` of ``blk`` in ``theta`` (views)."""
        a = theta[blk.a : blk.a + blk.rank * blk.d_in].view(blk.rank, blk.d_in)
        b = theta[blk.b : blk.b + blk.d_out * blk.rank].view(blk.d_out, blk.rank)
        return b, a


def _numel(shape: Sequence[int]) -> int:
    out = 1
    for v in shape:
        out *= int(v)
    return out


def updates_of(x: Tensor, theta: Tensor, blk: LoraBlock, sign: int = -1) -> Tensor:
    """The rows ``ΔWᵢ = BᵢAᵢ − BA`` of layer ``blk``, ``(n, d_out·d_in)``: client i's factors are
    ``θ + sign·xᵢ`` (``sign = −1``: ``xᵢ`` is a pseudo-gradient θ − θᵢ, Phalanx's federated convention; ``+1``: an
    update θᵢ − θ, Flower's)."""
    n = x.shape[0]
    b, a = LoraLayout(theta.numel(), (blk,)).factors(theta, blk)
    ai = a + sign * x[:, blk.a : blk.a + blk.rank * blk.d_in].reshape(n, blk.rank, blk.d_in)
    bi = b + sign * x[:, blk.b : blk.b + blk.d_out * blk.rank].reshape(n, blk.d_out, blk.rank)
    return torch.baddbmm((b @ a).neg().expand(n, -1, -1), bi, ai).reshape(n, -1)


def imbalance(b: Tensor, a: Tensor) -> float:
    """``c`` with ``c² = tr(AAᵀ − BᵀB) / r`` (0 when that is negative or not finite), in float64: the scalar that
    gradient flow on the pair (A, B) keeps constant (below, :func:`refactor`). At peft's start (B = 0) it is A's
    root-mean-square row norm."""
    c2 = (float(a.double().pow(2).sum()) - float(b.double().pow(2).sum())) / max(a.shape[0], 1)
    return c2**0.5 if c2 > 0 and c2 != float("inf") else 0.0


def refactor(m: Tensor, rank: int, scale: float) -> tuple[Tensor, Tensor]:
    """``(B′, A′)`` with ``B′A′`` the best rank-``rank`` approximation of ``m`` (truncated SVD, Eckart & Young 1936),
    split so that ``A′A′ᵀ − B′ᵀB′ = c²I`` (``scale`` = c ≥ 0).

    A product has many factorisations, (BG⁻¹, GA); which one the clients start from sets how fast they learn. Local
    gradient steps on (A, B) keep ``AAᵀ − BᵀB`` constant (gradient flow exactly: Du, Hu & Lee, NeurIPS 2018, §2,
    balancedness of linear layers), and peft starts at B = 0, where it is ``A₀A₀ᵀ``. So with ``m = UΣVᵀ``:
    ``A′ = S V_rᵀ``, ``B′ = U_r Σ_r S⁻¹`` with ``s_k² = (c² + √(c⁴ + 4σ_k²)) / 2`` — the one diagonal split with
    ``s_k² − σ_k²/s_k² = c²``. At σ_k = 0 it is ``A′ = c·V_rᵀ``, ``B′ = 0`` (LoRA's B = 0 start); for σ_k ≫ c² it is
    the balanced ``√σ_k`` on both sides. Each column of B′ has norm ``σ_k/s_k ≤ √σ_k`` and each row of A′ norm
    ``s_k ≥ c``: no division by a small number. (Keeping ``A′ = c·V_rᵀ`` and putting all of Σ in B — this
    module's first version — makes a client's step on A scale with ‖B‖ ∝ σ: the product's next change grows like
    σ², and mode ``update`` diverged where ``factors`` learned; docs/lora.md, "Why mode update learned little".)"""
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    c = scale if scale > 0 and scale != float("inf") else 0.0
    sig = s[:rank].double()  # float64: 4σ² and c⁴ of a float32 update cannot overflow here
    c2 = torch.full_like(sig, c * c)
    split = ((c2 + torch.sqrt(c2 * c2 + 4 * sig * sig)) / 2).sqrt()  # s_k ≥ max(c, √σ_k)
    col = torch.where(split > 0, sig / torch.where(split > 0, split, 1.0), 0.0)
    return u[:, :rank] * col.to(m.dtype), vh[:rank] * split.to(m.dtype)[:, None]


class AdapterUpdates(Aggregator):
    """Mode ``update``: ``rule`` on every adapted layer's update ΔWᵢ = BᵢAᵢ − BA, re-factorised to rank r.

    For each block of ``layout``: ``ΔW* = rule(ΔW₁, …, ΔWₙ)`` (rows of ``d_out·d_in``), ``(B′, A′) =``
    :func:`refactor` ``(BA + ΔW*, r, c)`` with c² = tr(AAᵀ − BᵀB)/r of the current factors (:func:`imbalance`,
    kept from round to round: the new factors have it again), and the output's
    coordinates of that block are ``sign·(new − θ)`` — so the server's step ``θ + sign·η·out`` lands exactly on
    (B′, A′) when η = 1 (SGD without momentum; another rate moves part of the way in factor space). The other
    coordinates (the head) get ``rule`` on their rows. Needs the current global vector: context key ``theta`` (the
    server passes it). One layer's ``(n, d_out, d_in)`` rows exist at a time.

    Robustness (docs/lora.md): each block's ΔW* obeys the rule's (f, κ) and ε bound on that block's honest rows;
    summed over blocks the same κ and ε hold for the concatenation of all layers' updates, before truncation. A
    row that is not finite gives non-finite ΔWᵢ, a bad row to the rule; a non-finite aggregate (the mean under
    attack) gives a non-finite output, which the server reports as divergence. ``last_residual``: the largest
    relative truncation error ‖BA + ΔW* − B′A′‖_F / ‖BA + ΔW*‖_F of the last call.
    """

    name: ClassVar[str] = "lora-update"
    reference: ClassVar[str] = ("LoRA: Hu et al., ICLR 2022, Eq. 3; update-space aggregation and rank-r SVD "
                                "re-factorisation: FlexLoRA, Bai et al., NeurIPS 2024, §3")
    tags = RuleTags(translation=False, scale=False, identical=False)

    def __init__(self, rule: Aggregator, layout: LoraLayout, sign: int = -1) -> None:
        if not isinstance(rule, Aggregator):
            raise ConfigError("rule", type(rule).__name__, "a Phalanx rule (phalanx.aggregators.make(...))")
        if rule.stateful:
            raise ConfigError("aggregator", rule.name, "a rule that keeps no state across rounds with adapter "
                              "aggregation 'update' (it is applied once per layer)")
        extra = sorted(set(rule.context_keys) - _UPDATE_CONTEXT)
        if extra:
            raise ConfigError("aggregator", rule.name, "a rule without a server reference (context "
                              f"{', '.join(extra)}) with adapter aggregation 'update': the reference is a factor-space "
                              "gradient, not a layer update", "use aggregation 'factors' or 'shared'")
        if sign not in (-1, 1):
            raise ConfigError("sign", sign, "-1 (rows are θ − θᵢ) or 1 (rows are θᵢ − θ)")
        if not layout.blocks:
            raise ConfigError("adapters", "no LoRA A/B pairs", "a model with LoRA adapters (…lora_A… / …lora_B…)")
        super().__init__(f=rule.f)
        self.rule = rule
        self.layout = layout
        self.sign = sign
        self.requirement = rule.requirement
        self.context_keys = (frozenset(rule.context_keys) - {"center"}) | {"theta"}
        self.last_residual: float = 0.0
        self._rest = layout.rest()

    def min_workers(self) -> int:
        return self.rule.min_workers()

    def with_f(self, f: int) -> AdapterUpdates:
        return AdapterUpdates(self.rule.with_f(f), self.layout, self.sign)

    def params(self) -> dict[str, Any]:
        return {"rule": repr(self.rule), "mode": "update", "layers": len(self.layout.blocks)}

    def contributions(self, x: Any, **context: Any) -> Tensor:
        """Each row's share: with ``theta`` (every server round), the blocks' shares weighted by their sizes. Without
        it — a stage's check probing the rule on i.i.d. rows before the run (fail closed) — the inner rule's shares
        on the rows as given: a row gets no share here only if the inner rule gives it none in *every* block, so the
        rows the inner rule leaves out of i.i.d. rows bound the rows this rule leaves out of them."""
        if context.get("theta") is None:
            return self.rule.contributions(x, **{k: v for k, v in context.items() if k in self.rule.context_keys})
        return super().contributions(x, **context)

    def _inner(self, rows: Tensor, want: bool, context: dict[str, Any]) -> tuple[Tensor, Tensor | None]:
        if want:
            return self.rule.aggregate(rows, **context)
        return self.rule(rows, **context), None

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        theta = context.pop("theta", None)
        if not isinstance(theta, Tensor) or theta.shape != (self.layout.dim,):
            got = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
            raise ConfigError("theta", got, f"the current global vector, shape ({self.layout.dim},)")
        if x.shape[1] != self.layout.dim:
            raise ConfigError("x", tuple(x.shape), f"rows of {self.layout.dim} coordinates (the adapters' layout)")
        context.pop("center", None)
        theta = theta.to(device=x.device, dtype=x.dtype)
        out = torch.empty_like(theta)
        weights: list[tuple[int, Tensor | None]] = []
        rest = self._rest.to(x.device)
        if bool(rest.any()):
            agg, c = self._inner(x[:, rest], want_contributions, context)
            out[rest] = agg
            weights.append((int(rest.sum()), c))
        residual = 0.0
        for blk in self.layout.blocks:
            agg, c = self._inner(updates_of(x, theta, blk, self.sign), want_contributions, context)
            weights.append((blk.d_out * blk.d_in, c))
            b, a = self.layout.factors(theta, blk)
            m = b @ a + agg.view(blk.d_out, blk.d_in)
            a_slice = slice(blk.a, blk.a + blk.rank * blk.d_in)
            b_slice = slice(blk.b, blk.b + blk.d_out * blk.rank)
            if not bool(torch.isfinite(m).all()):  # the rule did not survive (the mean under attack): say so
                out[a_slice] = float("nan")
                out[b_slice] = float("nan")
                continue
            b2, a2 = refactor(m, blk.rank, imbalance(b, a))
            norm = float(m.norm())
            if norm > 0:
                residual = max(residual, float((m - b2 @ a2).norm()) / norm)
            out[a_slice] = (a2 - a).reshape(-1) * self.sign
            out[b_slice] = (b2 - b).reshape(-1) * self.sign
        self.last_residual = residual
        if not want_contributions:
            return out, None
        total = sum(w for w, _ in weights)
        share = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
        for w, c in weights:
            assert c is not None
            share += c.to(share) * (w / total)
        return out, share
