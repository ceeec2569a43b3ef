"""A chain of pre-aggregators in front of a rule (``"nnm>cwtm"``), itself a rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor

from phalanx.aggregators.base import Aggregator, PreAggregator, RuleTags
from phalanx.errors import ConfigError


def _owned(y: Tensor, x: Tensor) -> bool:
    """Whether ``y`` is rows the chain made itself: not the caller's ``x`` and sharing no memory with it."""
    if y is x:
        return False
    ys, xs = y.untyped_storage(), x.untyped_storage()
    if ys.device != xs.device:
        return True
    y0, x0 = ys.data_ptr(), xs.data_ptr()
    return y0 + ys.nbytes() <= x0 or x0 + xs.nbytes() <= y0


class Chain(Aggregator):
    """``rule ∘ pre_k ∘ … ∘ pre_1``: each pre-aggregator transforms the rows, the rule aggregates the result.

    Contributions are traced back to the original inputs through each pre-aggregator's provenance matrix:
    ``c = c_rule · M_k ⋯ M_1``. The caller's input is never modified; the rows an element makes belong to the
    chain, so the next element gets them through :meth:`~phalanx.aggregators.base.PreAggregator.mix_` (``clip`` and
    ``arc`` then scale in place instead of writing another ``(n, d)`` tensor). The chain claims the properties that
    all its elements claim (their ``tags``): a pre-aggregator's tags say what it keeps of the rule after it.
    """

    name: ClassVar[str] = "chain"
    reference: ClassVar[str] = "composition of the elements' references"

    def __init__(self, pre: list[PreAggregator], rule: Aggregator) -> None:
        if not pre:
            raise ConfigError("pre", pre, "at least one pre-aggregator (use the rule itself otherwise)")
        super().__init__(f=rule.f)
        self.pre = list(pre)
        self.rule = rule
        self.spec = ">".join([p.name for p in self.pre] + [rule.name])
        self.requirement = "; ".join(
            f"{c.name}: {c.requirement}" for c in [*self.pre, rule]
        )
        self.context_keys = frozenset().union(*(c.context_keys for c in [*self.pre, rule]))
        self.tags = RuleTags.all_of(c.tags for c in [*self.pre, rule])
        self.stateful = rule.stateful  # pre-aggregators keep no state: the chain's is its rule's

    def state_dict(self) -> dict[str, Tensor]:
        return self.rule.state_dict()

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.rule.load_state_dict(state)

    def min_workers(self) -> int:
        for n in range(1, 100_000):
            ok = True
            m = n
            for p in self.pre:
                if m < p.min_workers():
                    ok = False
                    break
                m = p.output_rows(m)
            if ok and m >= self.rule.min_workers():
                return n
        return 100_000  # pragma: no cover - no realistic chain needs this

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        provenance = None
        y = x
        for p in self.pre:
            ctx = {k: v for k, v in context.items() if k in p.context_keys}
            # rows an earlier element made are the chain's own: the next element may overwrite them (mix_); the
            # caller's x, or anything sharing its memory (a view an element passed through), never
            y, m = p.mix_(y, **ctx) if _owned(y, x) else p.mix(y, **ctx)
            provenance = m if provenance is None else m @ provenance
        ctx = {k: v for k, v in context.items() if k in self.rule.context_keys}
        assert provenance is not None
        if not want_contributions:
            return self.rule(y, **ctx), None
        out, c = self.rule.aggregate(y, **ctx)
        return out, c @ provenance.to(c.device)

    def with_f(self, f: int) -> Chain:
        """The chain for another ``f``: the rule and every element configured with the chain's ``f`` get the new one;
        an element with its own ``f`` (``"nnm(f=2)>cwtm"``) keeps it."""
        return Chain([p.with_f(f) if p.f == self.f else p for p in self.pre], self.rule.with_f(f))

    def params(self) -> dict[str, Any]:
        return {"spec": self.spec, **{c.name: c.params() for c in [*self.pre, self.rule]}}

    def epsilon(self, n: int) -> float | None:
        return None

    def kappa(self, n: int) -> float | None:
        return None

    def describe(self, n: int | None = None) -> dict[str, Any]:
        info = super().describe(n)
        info["name"] = self.spec
        info["elements"] = [p.describe(n) for p in self.pre] + [self.rule.describe(n)]
        return info

    def __repr__(self) -> str:
        return "Chain(" + " > ".join(repr(c) for c in [*self.pre, self.rule]) + ")"
