"""LoRA adapters in :class:`~phalanx.flower.PhalanxFedAvg`: Phalanx's three adapter modes on Flower's records.

FlowerTune's apps (https://flower.ai/docs/framework/ — the ``flwr new`` FlowerTune templates) send a client's LoRA
adapters as one ``ArrayRecord`` of ``peft``'s ``get_peft_model_state_dict(model)``: one array per ``lora_A`` and
``lora_B`` tensor, named ``<layer>.lora_A.weight`` / ``<layer>.lora_B.weight``, plus any module trained in full (a
classification head). A LoRA adapter of a linear layer (Hu et al., ICLR 2022, Eq. 3) is ``A ∈ ℝ^{r×d_in}``,
``B ∈ ℝ^{d_out×r}``, changing the weight by ``ΔW ∝ BA``. The strategy flattens the record in its key order
(:mod:`phalanx.flower.replies`), so :class:`~phalanx.aggregators.lora.LoraLayout` reads the blocks from the names,
and each client's row is its update ``Δᵢ = θᵢ − θ`` (Flower's sign, ``+1``). The modes are those of
:mod:`phalanx.aggregators.lora` (docs/lora.md), with its code:

* ``factors`` — the rule on the flat vector of every A and B (FedIT, FlowerTune's ``FedAvg``): the rule itself.
* ``update`` — :class:`~phalanx.aggregators.lora.AdapterUpdates` with ``sign=+1``: per adapted layer the rule on
  ``ΔWᵢ = BᵢAᵢ − BA`` and the rank-r truncated SVD of ``BA + ΔW*`` (Eckart & Young 1936; FlexLoRA, Bai et al.,
  NeurIPS 2024, §3) as the new factors; the server's step at rate η = 1 lands on them (the strategy requires
  ``server_lr = 1``). The global vector θ is passed as the rule's context key ``theta``.
* ``shared`` — A frozen and shared (FFA-LoRA, Sun et al., ICLR 2024, §3): :class:`SharedA` applies the rule to
  every coordinate but the A's (the B's and the head) and leaves A where it is. ΔW = ΔB·A is linear in B, so the
  aggregate is exact in ΔW for any rule; with ``A Aᵀ = c² I`` (as ``phalanx.models.make(..., aggregation="shared")``
  makes A, and :func:`shared_a` makes a record's, one c per layer) ``‖ΔB A‖_F = c‖ΔB‖_F``: a coordinate-wise rule
  keeps its ε and κ on the layers' updates, any other up to max c²/min c² over the blocks
  (:func:`phalanx.analysis.lora_kappa.shared_bound`); :attr:`AdapterPlan.skewed` names a layer whose A is not so
  (the strategy warns). A client must send A back unchanged (bit for bit: a frozen tensor is).

**An adapter that does not fit is a void vote** (:meth:`AdapterPlan.check`): a reply whose adapter arrays have
other names (other layers adapted), another shape (another rank r′, another width), or — in mode ``shared`` — an A
other than the broadcast one is dropped with reason ``"adapter"``. Its node is missing, like a node whose vote is
voided by a duplicate, and, like it, never lowers f: federations with heterogeneous ranks exist (HetLoRA, Cho et al.,
EMNLP 2024; FlexLoRA), so another rank is no proof that the sender is one of the f Byzantine nodes, and an honest
client of another rank counted against f would leave all f Byzantine rows facing a rule configured for f − 1.
The declared shapes are checked first (a huge declared array is never deserialised); an adapter whose bytes hold
another shape than it declares is caught by the reader (:mod:`phalanx.flower.replies`) and is an adapter misfit too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message
from torch import Tensor

from phalanx.aggregators.base import Aggregator, RuleTags
from phalanx.aggregators.lora import MODES, AdapterUpdates, LoraLayout
from phalanx.errors import ConfigError
from phalanx.flower.replies import Layout, Reply, _one, shorten

__all__ = ["ADAPTER", "MODES", "ORTHONORMAL_TOL", "AdapterPlan", "SharedA", "is_adapter", "shared_a"]

ADAPTER = "adapter"
"""The drop reason of a reply whose adapters do not fit (``replies-adapter`` in the train metrics)."""


ORTHONORMAL_TOL = 1e-4
"""Largest ``max|A Aᵀ − c² I| / c²`` (c² the mean of A Aᵀ's diagonal) of an A taken as orthonormal times c: float32
rounding of a QR factor is ~10⁻⁷; a random A's is of order 1."""


def shared_a(record: ArrayRecord) -> ArrayRecord:
    """``record`` with every ``lora_A`` (r × d_in, r ≤ d_in) replaced by orthonormal rows times its root-mean-square
    row norm c (``A Aᵀ = c² I``: the Q of Aᵀ's QR factorisation, as ``phalanx.models.hf`` makes A for mode
    ``shared``), in its dtype; every other array as it is. The initial arrays of a ``lora="shared"`` run."""
    out: dict[str, Array] = {}
    for key in record:
        value = record[key].numpy()
        if ".lora_A." in key and value.ndim == 2 and 0 < value.shape[0] <= value.shape[1]:
            a = value.astype(np.float64)
            c = float(np.linalg.norm(a)) / value.shape[0] ** 0.5
            q, _ = np.linalg.qr(a.T)
            value = (q.T * (c if c > 0 else 1.0)).astype(value.dtype)
        out[key] = Array(np.ascontiguousarray(value))
    return ArrayRecord(out)


def _skew(a: np.ndarray[Any, Any]) -> float:
    """``max|A Aᵀ − c² I| / c²`` with c² the mean of A Aᵀ's diagonal (inf for A = 0)."""
    gram = a.astype(np.float64) @ a.astype(np.float64).T
    c2 = float(np.trace(gram)) / max(gram.shape[0], 1)
    return float(np.abs(gram - c2 * np.eye(gram.shape[0])).max()) / c2 if c2 > 0 else float("inf")


def is_adapter(key: str) -> bool:
    """Whether ``key`` names a LoRA factor (``peft``: ``….lora_A.…`` / ``….lora_B.…``)."""
    return ".lora_A." in key or ".lora_B." in key


class SharedA(Aggregator):
    """Mode ``shared``: ``rule`` on the coordinates outside the frozen A's, 0 on the A's (``frozen``: their mask).

    ``out[¬frozen] = rule(x[:, ¬frozen])``, ``out[frozen] = 0``; a row's share is the inner rule's. Context keys are
    the inner rule's; a ``center`` of the full length (centered clipping's previous aggregate) is cut to the same
    coordinates.
    """

    name: ClassVar[str] = "lora-shared"
    reference: ClassVar[str] = ("FFA-LoRA: Sun et al., 'Improving LoRA in privacy-preserving federated learning', "
                                "ICLR 2024, §3 (A frozen and shared, B alone trained and aggregated)")
    tags = RuleTags(translation=False, scale=False, identical=False)

    def __init__(self, rule: Aggregator, frozen: Tensor) -> None:
        if not isinstance(rule, Aggregator):
            raise ConfigError("aggregator", type(rule).__name__, "a Phalanx rule (spec or rule object) with "
                              "lora='shared'")
        super().__init__(f=rule.f)
        self.rule = rule
        self.frozen = frozen
        self.requirement = rule.requirement
        self.context_keys = frozenset(rule.context_keys)

    def min_workers(self) -> int:
        return self.rule.min_workers()

    def with_f(self, f: int) -> SharedA:
        return SharedA(self.rule.with_f(f), self.frozen)

    def params(self) -> dict[str, Any]:
        return {"rule": repr(self.rule), "mode": "shared", "frozen": int(self.frozen.sum())}

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        keep = ~self.frozen.to(x.device)
        center = context.get("center")
        if isinstance(center, Tensor) and center.shape == (x.shape[1],):
            context["center"] = center[keep]
        rows = x[:, keep]
        if want_contributions:
            agg, share = self.rule.aggregate(rows, **context)
        else:
            agg, share = self.rule(rows, **context), None
        out = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
        out[keep] = agg.to(x.dtype)
        return out, share


@dataclass(frozen=True)
class AdapterPlan:
    """The broadcast record's adapters for one round: the mode, the blocks, each adapter array's shape and, in mode
    ``shared``, the mask of the A coordinates."""

    mode: str
    lora: LoraLayout
    shapes: dict[str, tuple[int, ...]]
    frozen: np.ndarray[Any, Any] | None
    theta: np.ndarray[Any, Any]
    skewed: str | None = None
    """Mode ``shared``: the first layer whose A is not orthonormal times c (:data:`ORTHONORMAL_TOL`), else None."""

    @classmethod
    def of(cls, mode: str, layout: Layout) -> AdapterPlan:
        """The plan of the global model ``layout`` (the server's own record: no A/B pair is a ConfigError)."""
        lora = LoraLayout.of(layout.keys, layout.shapes)
        if not lora.blocks:
            raise ConfigError("arrays", f"{len(layout.keys)} arrays without a lora_A/lora_B pair",
                              f"with lora={mode!r}, peft's adapter arrays (get_peft_model_state_dict: "
                              "'<layer>.lora_A.weight' and '<layer>.lora_B.weight')")
        shapes = {k: s for k, s in zip(layout.keys, layout.shapes) if is_adapter(k)}
        frozen, skewed = None, None
        if mode == "shared":
            frozen = np.zeros(lora.dim, dtype=bool)
            for blk in lora.blocks:
                frozen[blk.a: blk.a + blk.rank * blk.d_in] = True
                a = layout.flat[blk.a: blk.a + blk.rank * blk.d_in].reshape(blk.rank, blk.d_in)
                if skewed is None and not _skew(a) <= ORTHONORMAL_TOL:
                    skewed = blk.name
        return cls(mode, lora, shapes, frozen, layout.flat, skewed)

    def rule(self, rule: Any) -> Any:
        """``rule`` as this mode applies it: wrapped for ``update`` and ``shared``, itself for ``factors``."""
        if self.mode == "update":
            return AdapterUpdates(rule, self.lora, sign=1)
        if self.mode == "shared":
            assert self.frozen is not None
            return SharedA(rule, torch.from_numpy(self.frozen))
        return rule

    def context(self, rule: Any, dtype: torch.dtype) -> dict[str, Any]:
        """The rule's context from the plan: θ for ``update``."""
        if "theta" in getattr(rule, "context_keys", ()):
            return {"theta": torch.from_numpy(self.theta).to(dtype)}
        return {}

    def check(self, reply: Reply, msg: Message, arrayrecord_key: str) -> None:
        """Drop ``reply`` (reason :data:`ADAPTER`) when its adapters do not fit; leave it alone otherwise. A reply
        already dropped as malformed is re-read for its adapters' names and declared shapes; a used reply is checked,
        in mode ``shared``, for an A other than the broadcast one (a non-zero update there). Never raises."""
        why: str | None = None
        if reply.reason == "malformed":
            why = self._shape_fault(msg, arrayrecord_key)
            dropped = reply.dropped or ""
            if why is None and any(dropped.startswith(f"wrong shape of {k!r}:") for k in self.shapes):
                why = f"adapter {dropped}"  # declared right, another shape in its bytes (read by the reader)
        elif reply.update is not None and self.frozen is not None:
            changed = int(np.count_nonzero(reply.update[self.frozen] != 0))
            if changed:
                why = f"A changed at {changed} coordinates with lora='shared' (A is frozen: send it back unchanged)"
        if why is not None:
            reply.update, reply.dropped, reply.reason = None, why, ADAPTER

    def _shape_fault(self, msg: Message, arrayrecord_key: str) -> str | None:
        try:
            record = _one(msg.content.array_records, arrayrecord_key)
            if not isinstance(record, ArrayRecord):
                return None
            got = {k for k in record.keys() if is_adapter(k)}
            if got != set(self.shapes):
                missing = sorted(set(self.shapes) - got)[:3]
                extra = sorted(got - set(self.shapes))[:3]
                return shorten(f"other adapters: missing {missing}, unexpected {extra}")
            for key, shape in self.shapes.items():
                declared = tuple(getattr(record[key], "shape", ()))
                if declared != shape:
                    return shorten(f"adapter {key!r} of shape {shorten(declared, 60)}, expected {shape}")
        except Exception:  # an unreadable reply stays "malformed"
            return None
        return None
