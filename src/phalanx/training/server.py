"""The server's side of a round: its per-call context, the rule as an attacker sees it, aggregation with the
round's measurements, and the rule it falls back to when workers are missing.

Context (what a rule gets besides the vectors, ``rule(x, **context)``): centered clipping's centre — the previous
aggregate (Karimireddy, He & Jaggi, ICML 2021, Eq. 3); FLTrust's reference gradient — the gradient at θ of the
server's small trusted root set (Cao et al., NDSS 2021, Alg. 1); a stochastic rule's generator — the run's
``aggregator`` stream, whose state checkpoints hold; a rule that keeps something per worker (FoolsGold's history)
— ``ids``, the worker of each received row (every worker in index order in a DSGD round, the sampled clients of a
federated one). An adaptive attack calls the rule *bound to that same context* (:class:`BoundRule`), so it
optimises against what the server will really compute.

A rule that keeps state across rounds (``rule.stateful``) is one object for the whole run: the loop loads its state
from the start snapshot and saves it in every checkpoint (``rule.<key>``); the rule for f − m missing workers
continues from it and hands its state back; an attacker's calls start from the state of the start of the round and
leave it as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.aggregators.missing import MissingTooMany, RulesForMissing
from phalanx.analysis.epsilon import aggregation_error
from phalanx.errors import PhalanxError
from phalanx.training.problem import Problem
from phalanx.training.state import Received, RoundAborted
from phalanx.training.streams import restored


@dataclass
class RoundResult:
    """What one round measured (only at evaluation rounds: it costs the rule's contributions).

    ``agg_error``: ‖Agg − honest mean‖² / honest spread, the price of robustness in this round (Yang, Shi & Li,
    ICML 2025, Def. 3.1), None where that ratio has no value (:func:`honest_error`);
    ``byz_share``: the share of the output that came from Byzantine rows; ``detection_auc``:
    P(a random honest row got a larger share than a random Byzantine one). Both None for a rule that does not
    report its contributions. ``sampled_byzantine``: how many Byzantine clients a federated round sampled.
    ``contributions``: each received row's share of the output (``rule.contributions``, ``(m,)`` float64; NaN for a
    rule that does not report them), what a server stage that watches the rule reads.
    """

    agg_error: float | None
    byz_share: float | None
    detection_auc: float | None
    sampled_byzantine: int | None = None
    contributions: Tensor | None = None


def honest_error(agg: Tensor, honest: Tensor) -> float | None:
    """``agg``'s aggregation error against the ``honest`` rows (:func:`~phalanx.analysis.epsilon.aggregation_error`),
    or None where the ratio has no value: fewer than two honest rows (none — a buffer of Byzantine updates alone —
    or one), or honest rows with no spread at all (identical rows: the zero rows an asynchronous filter puts in
    place of rejected honest updates) from which a finite ``agg`` differs. Counting that as +∞, the ratio's own
    convention for x/0, made one such step turn a whole run's mean error into ∞. A non-finite ``agg`` stays +∞."""
    if honest.shape[0] < 2:
        return None if bool(torch.isfinite(agg).all()) else float("inf")
    error = aggregation_error(agg, honest)
    if math.isinf(error) and bool(torch.isfinite(agg).all()):
        return None  # a finite output over honest rows with no spread: x/0
    return error


def detection_auc(contrib: Tensor, byzantine: Tensor) -> float | None:
    """P(a random honest worker got a larger share than a random Byzantine one); ties count ½. None if undefined."""
    honest_c = contrib[~byzantine]
    byz_c = contrib[byzantine]
    if honest_c.numel() == 0 or byz_c.numel() == 0:
        return None
    diff = honest_c[:, None] - byz_c[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


class BoundRule:
    """The server's rule with the server's context of one round: ``bound(x) = rule(x, **context)``.

    A stochastic rule's generator is not shared: every call starts from a copy of the server stream's state at the
    start of the round, so an attacker that calls the rule many times sees the draws the server will make and does
    not move the server's stream. A rule that keeps state across rounds is treated alike: every call starts from the
    rule's state at the start of the round and puts back the state it found, so an attacker sees the history the
    server will use and leaves it as it was (it is not told which workers its rows are: ``ids`` is the server's,
    known once the round's vectors have arrived).
    """

    def __init__(self, rule: Callable[..., Tensor], context: dict[str, Any], previous: Tensor | None = None) -> None:
        self.rule = rule
        self.previous = previous
        """The previous round's aggregate (None in the first round): what an attack that shapes its update by the
        global model's last step reads (Neurotoxin's mask); the loop passes the round state's ``previous``."""
        self.context = {k: v for k, v in context.items() if k != "generator"}
        gen = context.get("generator")
        self.generator_state: Tensor | None = None if gen is None else gen.get_state()
        owner: Any = rule
        self.rule_state: dict[str, Tensor] | None = (
            dict(owner.state_dict()) if getattr(rule, "stateful", False) else None
        )

    def __call__(self, x: Tensor) -> Tensor:
        context = dict(self.context)
        if self.generator_state is not None:
            context["generator"] = restored(self.generator_state)
        if self.rule_state is None:
            return self.rule(x, **context)
        rule: Any = self.rule
        found = rule.state_dict()
        rule.load_state_dict(self.rule_state)
        try:
            return self.rule(x, **context)
        finally:
            rule.load_state_dict(found)

    def payload(self) -> dict[str, Tensor]:
        """The context as tensors, for an attacker in another process (:meth:`from_payload` rebuilds it); a
        stateful rule's state travels as ``rule.<key>``."""
        out = {k: v for k, v in self.context.items() if isinstance(v, Tensor)}
        if self.generator_state is not None:
            out["generator"] = self.generator_state
        for k, v in (self.rule_state or {}).items():
            out[f"{RULE_PREFIX}{k}"] = v
        return out

    @classmethod
    def from_payload(cls, rule: Callable[..., Tensor], payload: dict[str, Tensor]) -> BoundRule:
        """The bound rule of another process, from its :meth:`payload`."""
        context: dict[str, Any] = {
            k: v for k, v in payload.items() if k != "generator" and not k.startswith(RULE_PREFIX)
        }
        if "generator" in payload:
            context["generator"] = restored(payload["generator"])
        bound = cls(rule, context)
        if bound.rule_state is not None:
            bound.rule_state = {k.removeprefix(RULE_PREFIX): v for k, v in payload.items() if k.startswith(RULE_PREFIX)}
        return bound


RULE_PREFIX = "rule."
"""The prefix of a stateful rule's tensors in a checkpoint and in a bound rule's payload."""


class Server:
    """Aggregates a round's vectors with the configured rule (or the one for f − m when m workers are missing).

    ``honest`` is the number of honest workers (they are workers ``0 … honest − 1``; the rest are Byzantine), used
    for the measurements. ``rule_for(f')`` builds the rule configured for ``f'`` (default: the rule's own
    :meth:`~phalanx.aggregators.base.Aggregator.with_f`).
    """

    def __init__(
        self, rule: Aggregator, *, honest: int, problem: Problem, reference_batch: tuple[Tensor, Tensor] | None,
        generator: torch.Generator, rule_for: Callable[[int], Aggregator] | None = None,
    ) -> None:
        self.rule = rule
        self.f = rule.f
        self.honest = honest
        self.problem = problem
        self.reference_batch = reference_batch
        self.generator = generator
        self._for_missing = RulesForMissing(rule, rule_for, name=rule.name)
        keys = rule.context_keys
        self._center = "center" in keys
        self._reference = "reference" in keys
        self._generator = "generator" in keys
        self._ids = "ids" in keys
        self._theta = "theta" in keys

    def context(self, theta: Tensor, previous: Tensor | None) -> dict[str, Any]:
        """The rule's context of the round at θ (centre, reference gradient, generator — what the rule accepts)."""
        context: dict[str, Any] = {}
        if self._center and previous is not None:
            context["center"] = previous
        if self._reference:
            if self.reference_batch is None:
                raise PhalanxError(f"{self.rule.name} needs the server's root batch (a reference gradient)")
            x, y = self.reference_batch
            context["reference"] = self.problem.grads(theta, x[None], y[None])[0]
        if self._generator:
            context["generator"] = self.generator
        if self._theta:  # LoRA adapters aggregated per layer update (phalanx.aggregators.lora): the global factors
            context["theta"] = theta
        return context

    def rule_for_missing(self, missing: int, received: int) -> Aggregator:
        """The rule for ``missing`` absent workers: configured for f − m (each missing worker is one the adversary
        could have controlled, so at most f − m of the received vectors are Byzantine and n − m > 2(f − m) still
        holds); :class:`RoundAborted` when m > f or the rule is not defined on what arrived."""
        try:
            rule: Aggregator = self._for_missing.for_missing(missing, received)
        except MissingTooMany as exc:
            raise RoundAborted([], exc.detail) from None
        return rule

    def aggregate(
        self, got: Received, context: dict[str, Any], measure: bool,
    ) -> tuple[Tensor, RoundResult | None]:
        """``Agg`` of the received vectors and (with ``measure``) the round's measurements."""
        vectors = got.vectors
        rule = self.rule
        if got.missing:
            try:
                rule = self.rule_for_missing(len(got.missing), vectors.shape[0])
            except RoundAborted as exc:
                raise RoundAborted(got.missing, exc.detail) from None
        if self._ids:  # the worker of each row: every worker in order, or the round's sampled clients
            ids = torch.arange(vectors.shape[0]) if got.rows is None else torch.tensor(got.rows, dtype=torch.int64)
            context = {**context, "ids": ids}
        handover = rule is not self.rule and self.rule.stateful
        if handover:  # the rule for f − m continues from the run's state and hands it back
            rule.load_state_dict(self.rule.state_dict())
        if not measure:
            out = rule(vectors, **context)
            if handover:
                self.rule.load_state_dict(rule.state_dict())
            return out, None
        agg, contrib = rule.aggregate(vectors, **context)
        if handover:
            self.rule.load_state_dict(rule.state_dict())
        rows = torch.arange(vectors.shape[0]) if got.rows is None else torch.tensor(got.rows)
        is_byz = rows >= self.honest
        any_byz = bool(is_byz.any())
        known = bool(torch.isfinite(contrib).all())  # a user's rule without contributions reports NaN shares
        result = RoundResult(
            agg_error=honest_error(agg, vectors[~is_byz.to(vectors.device)] if any_byz else vectors),
            byz_share=(float(contrib[is_byz.to(contrib.device)].sum()) if any_byz else 0.0) if known else None,
            detection_auc=detection_auc(contrib.cpu(), is_byz) if known else None,
            sampled_byzantine=None if got.state_rows else int(is_byz.sum()), contributions=contrib,
        )
        return agg, result
