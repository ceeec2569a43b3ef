"""The interfaces of the attack package: the per-round context, vector attacks and data attacks.

A *vector attack* is the Byzantine workers' strategy in one round: given what they know (the honest vectors of the
round, the server's rule, the configured ``f``), it returns the ``b`` vectors they send. A *data attack* changes a
Byzantine worker's batch; the worker then computes an honest-looking gradient on it.

Conventions (docs/design.md, "Conventions"):

* ``n_byzantine`` (``b``) is how many workers actually attack; ``f`` is what the server's aggregator is *configured*
  to tolerate. They are different numbers and both are in the context.
* An attack never modifies ``ctx.honest``; its output is a new ``(b, d)`` tensor with the honest vectors' dtype and
  device (``(0, d)`` when ``b = 0``).
* Randomness comes only from ``ctx.generator`` (the "attack" stream), so an attack is deterministic given it.
* Configuration errors raise :class:`~phalanx.errors.ConfigError` at construction; an attack that needs something
  the context lacks (the aggregator, a worker index out of range) raises it at call time, naming the field.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.errors import ConfigError, InputError
from phalanx.plugins import Component

__all__ = ["KNOWLEDGE", "Attack", "AttackContext", "DataAttack"]

KNOWLEDGE = ("omniscient", "colluders")
"""What a vector attack's context holds (``attack_knowledge``): every honest vector of the round, or only the
Byzantine workers' own honest computations."""


@dataclass
class AttackContext:
    """What the Byzantine workers know in one round.

    Attributes
    ----------
    honest: the honest vectors of this round, shape ``(h, d)``, ``h >= 1`` (the attacker is omniscient).
    n_byzantine: how many vectors to return, ``b >= 0``.
    f: the number of Byzantine workers the server's aggregator is configured to tolerate.
    aggregator: the server's rule ``(n, d) -> (d,)``, for adaptive attacks; ``None`` if unknown.
    generator: a seeded CPU :class:`torch.Generator`, the "attack" random stream.
    round: the training round (for attacks that depend on time; none of the built-in ones do).
    workers: ``n``, the number of vectors the server receives, when it is not ``h + b``: the colluders' knowledge
    (``knowledge = "colluders"``), where ``honest`` holds only the Byzantine workers' own honest computations.
    knowledge: what ``honest`` is: ``"omniscient"`` (every honest worker's vector of the round) or ``"colluders"``
    (the vectors the Byzantine workers would have sent had they been honest, computed on their own data; Baruch et
    al., NeurIPS 2019, §3: the attackers estimate the honest mean and spread from their own samples).
    screen: the server's filter on each update, as an oracle: candidate Byzantine rows ``(b, d)`` → which of them it
    would accept ``(b,)`` bool, judged at the server's state of this step after its honest updates (Kardam's
    Lipschitz quantile, Zeno++'s validation score, AFLGuard's ball: :meth:`Asynchronous.screen
    <phalanx.training.algorithms.asynchronous.Asynchronous.screen>`), nothing committed; ``None`` where the
    server has no filter (every other algorithm). An attack that adapts to the filter reads it (``evade``).
    """

    honest: Tensor
    n_byzantine: int
    f: int
    aggregator: Callable[[Tensor], Tensor] | None
    generator: torch.Generator
    round: int = 0
    workers: int | None = None
    knowledge: str = "omniscient"
    screen: Callable[[Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        x = self.honest
        if not isinstance(x, Tensor):
            raise InputError("AttackContext.honest", type(x).__name__, "a torch.Tensor of shape (h, d)")
        if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
            raise InputError(
                "AttackContext.honest", f"a tensor of shape {tuple(x.shape)}", "shape (h, d) with h >= 1 and d >= 1",
            )
        if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise InputError(
                "AttackContext.honest", f"dtype {x.dtype}", "a floating-point dtype (float16/bfloat16/32/64)",
            )
        for field_name in ("n_byzantine", "f", "round"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(field_name, value, "an integer >= 0")
        if self.knowledge not in KNOWLEDGE:
            raise ConfigError("knowledge", self.knowledge, "one of " + ", ".join(KNOWLEDGE))
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < self.n_byzantine + 1):
            raise ConfigError("workers", self.workers, f"an integer >= n_byzantine + 1 = {self.n_byzantine + 1}")
        if self.aggregator is not None and not callable(self.aggregator):
            raise ConfigError("aggregator", self.aggregator, "a callable (n, d) -> (d,) or None")
        if self.screen is not None and not callable(self.screen):
            raise ConfigError("screen", self.screen, "a callable (b, d) -> (b,) bool or None")
        if not isinstance(self.generator, torch.Generator):
            raise ConfigError("generator", self.generator, "a torch.Generator (seeded, on the CPU)")
        if self.generator.device.type != "cpu":
            raise ConfigError("generator", self.generator, "a CPU torch.Generator")

    @property
    def n_honest(self) -> int:
        """``h``, the number of honest rows."""
        return int(self.honest.shape[0])

    @property
    def n_workers(self) -> int:
        """``n``, the number of vectors the server receives: ``workers`` when given, else ``h + b``."""
        return self.workers if self.workers is not None else self.n_honest + self.n_byzantine

    @property
    def dim(self) -> int:
        """``d``, the length of each vector."""
        return int(self.honest.shape[1])


class _Configurable(Component, ABC):
    """Name, reference, threat model, parameters and their introspection."""

    threat: ClassVar[str] = "omniscient: sees every honest vector of the round"
    """What the attacker knows, as text for tables."""
    needs_aggregator: ClassVar[bool] = False
    """True when the attack calls ``ctx.aggregator`` (adaptive attacks)."""
    kind: ClassVar[str] = "vector"
    baseline: ClassVar[bool] = False
    """True for a no-attack baseline (``none``, ``honest``): its "Byzantine" workers follow the protocol."""
    boost: float = 1.0
    """How much a federated client's pseudo-gradient is scaled before it is sent (model replacement, a backdoor's
    ``boost``); 1 for every other attack."""

    def describe(self) -> dict[str, Any]:
        """Metadata for tables: name, kind, reference, threat model, whether it needs the aggregator, parameters."""
        return {
            "name": self.name, "kind": self.kind, "reference": self.reference, "threat": self.threat,
            "needs_aggregator": self.needs_aggregator, "params": self.params(),
        }

class Attack(_Configurable):
    """A vector attack: ``ctx -> (b, d)`` Byzantine vectors.

    Subclasses implement :meth:`_run`, called only with ``b >= 1`` and under ``torch.no_grad()``; it may return any
    floating dtype on the honest vectors' device, and :meth:`__call__` casts the result to the honest dtype.
    """

    stochastic: ClassVar[bool] = False
    """True when it draws from ``ctx.generator`` (another seed gives other vectors); False for an attack that is a
    function of the honest vectors (and the server's rule) alone."""
    finite: ClassVar[bool] = True
    """Whether its vectors are finite when the honest ones are; False for an attack that sends NaN or ±Inf on
    purpose."""
    through_weights: ClassVar[bool] = True
    """Whether its vectors survive being sent as model weights w + y, as a Flower client replies
    (:mod:`phalanx.flower.byzantine`); False for rows that round away there (``subnormal``: w + y = w)."""
    reads_honest: bool = True
    """Whether its vectors depend on ``ctx.honest``: only then does ``attack_knowledge = "colluders"`` (the
    Byzantine workers' own honest computations instead of every honest vector) change anything; a run refuses it
    for an attack that reads no honest vector (NaN, ±Inf, zero-centred noise)."""
    solo: bool = False
    """Whether one Byzantine worker can run it on its own honest vector alone and still send what the attack is: it
    reads no honest vector, or only their mean ḡ (the mean of one row is that row: sign flip, IPM, noise around ḡ).
    False for an attack that needs the honest spread or several rows (ALIE, min-max, Fang, mimic) or the server's
    rule: a lone Flower client cannot run it (:mod:`phalanx.flower.byzantine`; colluders can)."""

    @abstractmethod
    def _run(self, ctx: AttackContext) -> Tensor:
        """Return the ``(b, d)`` Byzantine vectors for a validated context with ``b >= 1``."""

    def __call__(self, ctx: AttackContext) -> Tensor:
        """The ``ctx.n_byzantine`` Byzantine vectors of this round, shape ``(b, d)``, dtype/device of ``ctx.honest``."""
        if not isinstance(ctx, AttackContext):
            raise InputError(f"{self.name}: ctx", type(ctx).__name__, "a phalanx.attacks.AttackContext")
        honest = ctx.honest
        b, d = ctx.n_byzantine, ctx.dim
        if b == 0:
            return honest.new_empty((0, d))
        with torch.no_grad():
            out = self._run(ctx)
        if tuple(out.shape) != (b, d):  # pragma: no cover - programming error in a subclass
            raise RuntimeError(f"attack {self.name} returned shape {tuple(out.shape)}, expected {(b, d)}")
        return out.to(dtype=honest.dtype, device=honest.device)


class DataAttack(_Configurable):
    """A data attack: transforms a Byzantine worker's batch ``(x, y)``; the worker then trains on it honestly."""

    kind: ClassVar[str] = "data"
    threat: ClassVar[str] = "data only: controls its own training batch, sees nothing else"
    reads_honest: bool = False
    stop_round: int | None = None
    """The round from which its workers behave honestly (None: they attack in every round); see :meth:`active`."""
    shapes_update: ClassVar[bool] = False
    """True when :meth:`update` does more than scale by ``boost`` (a projection: Neurotoxin, norm-bounded model
    replacement) — a federated client's update; refused where a worker's vector is carried into its momentum."""
    needs_previous: ClassVar[bool] = False
    """True when :meth:`update` reads the previous round's aggregate (Neurotoxin's mask): the in-process engine
    passes it (``BoundRule.previous``)."""
    samples_others_data: ClassVar[bool] = False
    """True when its poisoned batches carry samples drawn from the whole training set, honest clients' shards
    included (the edge-case pool): one honest client's data then enter the Byzantine releases too, beyond the
    one-client sensitivity client-level DP accounts for, so a run with DP refuses it."""

    def prepare(self, train_x: Tensor, train_y: Tensor, num_classes: int) -> None:
        """Called once with the training set before the run trains (an edge-case attack picks its rare
        sub-population here); raise :class:`~phalanx.errors.ConfigError` for data it cannot attack (a trigger larger
        than the image). Deterministic: the same data give the same attack."""

    def active(self, round: int) -> bool:
        """Whether the Byzantine workers attack in ``round`` (counted from 0); after it they behave honestly (a
        backdoor's ``stop_round``, for durability)."""
        return self.stop_round is None or round < self.stop_round

    def update(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        """What the poisoned federated clients send, from their pseudo-gradients ``rows`` ``(k, d)`` (trained on
        their poisoned batches; may be changed in place) and the previous round's aggregate (None in the first
        round): ``boost`` × ``rows`` (model replacement's scaling; 1 for most attacks)."""
        return rows.mul_(self.boost) if self.boost != 1.0 else rows

    @abstractmethod
    def _transform(
        self, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        """Transform a validated batch."""

    def _transform_as(
        self, attacker: int, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        """Transform a validated batch of Byzantine worker ``attacker`` (``0 … b−1``); by default every attacker
        alike (:meth:`_transform`). DBA gives each attacker its own part of the trigger."""
        return self._transform(x, y, num_classes, generator)

    def transform(
        self, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None = None, attacker: int = 0,
    ) -> tuple[Tensor, Tensor]:
        """Return the poisoned batch ``(x', y')``; ``x`` and ``y`` are not modified.

        ``y`` holds integer class labels in ``[0, num_classes)``, one per example of ``x`` (dim 0); ``attacker`` is
        which Byzantine worker (``0 … b−1``) poisons it.
        """
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            raise InputError(f"{self.name}: (x, y)", f"{type(x).__name__}, {type(y).__name__}", "two torch.Tensors")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ConfigError("num_classes", num_classes, "an integer >= 1")
        if y.ndim != 1 or (x.ndim >= 1 and x.shape[0] != y.shape[0]):
            raise InputError(
                f"{self.name}: y", f"shape {tuple(y.shape)} for x of shape {tuple(x.shape)}",
                "a 1-D tensor with one label per example of x",
            )
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise InputError(f"{self.name}: y", f"dtype {y.dtype}", "an integer dtype (class labels)")
        if y.numel() > 0 and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            raise InputError(
                f"{self.name}: y", f"labels in [{int(y.min())}, {int(y.max())}]", f"labels in [0, {num_classes - 1}]",
            )
        return self._transform_as(attacker, x, y, num_classes, generator)
