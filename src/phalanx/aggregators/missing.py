"""The rule for a round in which m of the n expected vectors are missing: configured for f − m.

Each missing worker is one the adversary could have controlled, so at most f − m of the n − m received vectors are
Byzantine, and the rule's requirement (n > 2f for the trimmed mean, n > 2f + 2 for Krum …) still holds for
(n − m, f − m) whenever it held for (n, f). The rule for f′ is rebuilt once from the configured one
(:meth:`~phalanx.aggregators.base.Aggregator.with_f`, every other parameter kept) and kept for later rounds. The
simulated and torchrun server (:class:`phalanx.training.server.Server`) and the Flower strategy
(:class:`phalanx.flower.strategy.PhalanxFedAvg`) both take their rule from here; each says in its own terms why a
round cannot be aggregated (a :class:`MissingTooMany`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phalanx.errors import PhalanxError

__all__ = ["MissingTooMany", "RulesForMissing", "min_workers", "rule_name"]


class MissingTooMany(PhalanxError):
    """The round's received vectors cannot be aggregated: more missing than f, the rule undefined for f − m, or
    fewer vectors than the rule for f − m needs. ``detail`` says which (empty when m > f)."""

    def __init__(self, detail: str, reason: str = "") -> None:
        super().__init__(detail or "more workers missing than f")
        self.detail = detail
        self.reason = reason
        """The rule's own error, when it is not defined for f − m."""


def min_workers(rule: Any) -> int:
    """The fewest vectors ``rule`` is defined on (1 for a user's callable that does not say)."""
    declared = getattr(rule, "min_workers", None)
    return int(declared()) if callable(declared) else 1


def rule_name(rule: Any) -> str:
    """How errors name ``rule``: its chain spec, its name, or its class."""
    return str(getattr(rule, "spec", None) or getattr(rule, "name", None) or type(rule).__name__)


class RulesForMissing:
    """The configured ``rule`` and, built on first need and kept, the same rule for each f′ < f.

    ``build(f′)`` makes the rule for f′ (default: ``rule.with_f``; a user's callable without ``with_f`` keeps its
    own f — it cannot be reconfigured, and a larger f than needed trims more, never less); ``name``: how errors name
    the rule (default :func:`rule_name`)."""

    def __init__(self, rule: Any, build: Callable[[int], Any] | None = None, name: str | None = None) -> None:
        self.rule = rule
        self.name = name or rule_name(rule)
        self.f: int = int(getattr(rule, "f", 0))
        with_f = getattr(rule, "with_f", None)
        self._build = build or (with_f if callable(with_f) else (lambda _f: rule))
        self._rules: dict[int, Any] = {self.f: rule}

    def for_f(self, f: int) -> Any:
        """The rule configured for ``f`` (≤ the configured f), built once; a :class:`MissingTooMany` naming the rule
        and f when it is not defined there."""
        if f < 0:
            raise MissingTooMany("")
        if f not in self._rules:
            try:
                self._rules[f] = self._build(f)
            except PhalanxError as exc:
                raise MissingTooMany(f"aggregator {self.name!r} with f={f}: {exc}", str(exc)) from None
        return self._rules[f]

    def for_missing(self, missing: int, received: int) -> Any:
        """The rule for ``missing`` absent workers with ``received`` vectors: :meth:`for_f` of f − m, checked against
        the vectors it needs (a :class:`MissingTooMany` otherwise)."""
        f = self.f - missing
        rule = self.for_f(f)
        self.check(rule, f, received)
        return rule

    def check(self, rule: Any, f: int, received: int) -> None:
        """A :class:`MissingTooMany` when ``received`` is fewer vectors than ``rule`` (configured for ``f``) needs."""
        need = min_workers(rule)
        if received < need:
            raise MissingTooMany(f"aggregator {self.name!r} with f={f} needs {need} vectors, got {received}")
