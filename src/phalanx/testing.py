"""The checks every built-in rule and attack passes, for a user's own: ``check_aggregator`` and ``check_attack``.

>>> from phalanx import aggregators
>>> from phalanx.testing import check_aggregator
>>> check_aggregator("cwtm")  # raises AssertionError naming what failed

A rule is checked on random inputs (float64, several n, d and f) for what every rule promises (an ``(n, d)`` input
gives a ``(d,)`` output of the input's dtype; the input is not modified; float32 in, float32 out; contributions are
``n`` non-negative shares adding up to at most 1) and for the properties it claims in its tags
(:class:`~phalanx.aggregators.RuleTags`; by default all of them, and a rule that by design lacks one says so):
permutation invariance, translation and scale equivariance, identical rows giving that row, and a finite output
with up to ``f`` garbage rows (NaN, ±Inf, ±1e38, denormals, whole rows or single entries). An attack is checked for
its contract: ``(b, d)`` output of the honest dtype, honest vectors untouched, the same output from the same
generator state, nothing but the generator used for randomness.

A rule that keeps state across rounds (``stateful``) is checked as a function of one round: its state is reset
before every call (:func:`one_round`), so that ``rule(x)`` and ``rule(x[π])`` see the same (empty) history.

Failures raise :class:`AssertionError` with the property, the rule and the input's sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from phalanx import aggregators
from phalanx.attacks.base import Attack, AttackContext

__all__ = ["GARBAGE", "check_aggregator", "check_attack", "context_for", "one_round"]

GARBAGE = (float("nan"), float("inf"), -float("inf"), 1e38, -1e38, 1e-42)
"""Values a Byzantine row may hold that a robust rule must survive."""


def _close(a: Tensor, b: Tensor, tol: float) -> bool:
    return bool(torch.allclose(a, b, atol=tol, rtol=tol))


class _Fresh(Mapping[str, Any]):
    """A call's context: a generator in it is handed out as a fresh copy at every call (``**ctx``), so a stochastic
    rule makes the same draws in every call of one check."""

    def __init__(self, items: dict[str, Any]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        value = self._items[key]
        if isinstance(value, torch.Generator):
            copy = torch.Generator(device=value.device)
            copy.set_state(value.get_state())
            return copy
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class _OneRound:
    """A stateful rule seen as a function of one round: its state is reset (``load_state_dict({})``) before every
    call; every other attribute is the rule's."""

    def __init__(self, rule: Any) -> None:
        self._rule = rule

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rule, name)

    def __call__(self, x: Any, **context: Any) -> Tensor:
        self._rule.load_state_dict({})
        out: Tensor = self._rule(x, **context)
        return out

    def aggregate(self, x: Any, **context: Any) -> tuple[Tensor, Tensor]:
        self._rule.load_state_dict({})
        out: tuple[Tensor, Tensor] = self._rule.aggregate(x, **context)
        return out


def one_round(rule: Any) -> Any:
    """``rule`` itself, or for a rule that keeps state across rounds a view of it that starts every call from the
    state before the first round — what the property checks compare (two calls of a history-aware rule on the same
    rows differ by design: the second one sees the first in its history)."""
    return _OneRound(rule) if getattr(rule, "stateful", False) else rule


def context_for(rule: Any, x: Tensor) -> Mapping[str, Any]:
    """The per-call keywords the checks pass to ``rule`` on the rows ``x``, one for each key it accepts (its
    ``context_keys``) that the server would pass: ``reference``, a trusted vector near the rows (the last row, its
    non-finite entries as 0, plus 0.1), and ``generator``, one seeded stream handed out as a fresh copy at every
    call, so that every call of a check makes the same draws. ``center`` is left out: the rule starts from its own
    default centre, so a check sees the rule alone."""
    keys = frozenset(getattr(rule, "context_keys", ()))
    ctx: dict[str, Any] = {}
    if "reference" in keys:
        ctx["reference"] = x[-1].clone().nan_to_num(0.0, 0.0, 0.0) + 0.1
    if "generator" in keys:
        ctx["generator"] = torch.Generator().manual_seed(0)
    return _Fresh(ctx)


def _builder(spec: str) -> Callable[[int], Any]:
    """``make(f)`` for a name or spec: built with the parameters its tags are checked with (``check_params``; a
    parameter the spec gives itself wins)."""
    inline = aggregators.parse_spec(spec)[-1][1]
    params = {k: v for k, v in aggregators.get_tags(spec).check_params.items() if k not in inline}
    return lambda f: aggregators.make(spec, f=f, **params)


def check_aggregator(
    make: Callable[[int], Any] | str, *, min_n: Callable[[int], int] | None = None,
    fs: tuple[int, ...] = (0, 1, 2, 3), permutation: bool | None = None, translation: bool | None = None,
    scale: bool | None = None, identical: bool | None = None, robust: bool | None = None, contributions: bool = True,
    context: Callable[[Tensor], Mapping[str, Any]] | None = None, tol: float | None = None, trials: int = 20,
    seed: int = 0,
) -> None:
    """Check a rule: ``make(f)`` builds it for ``f`` (a class whose constructor takes ``f`` works as ``make``), or
    ``make`` is a name or spec (``"geomed"``, ``"mylab.rules:MedianOfMeans"``, ``"nnm>cwtm"``), built with the
    ``check_params`` of its tags.

    Each property is checked as the rule's tags claim it (:func:`phalanx.aggregators.get_tags`; a rule without tags
    claims them all); ``permutation=False`` (and the others) overrides a claim, ``tol`` the tolerance of the
    symmetry checks. ``min_n(f)`` is the smallest n it is checked on (default: the rule's ``min_workers()``, else
    2f + 1); ``context(x)`` gives the per-call keywords (default: :func:`context_for`, e.g. FLTrust's
    ``reference``).
    """
    if isinstance(make, str):
        make = _builder(make)
    gen = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    def claimed(given: bool | None, declared: bool) -> bool:
        return declared if given is None else given

    for trial in range(trials):
        f = fs[trial % len(fs)]
        rule = one_round(make(f))
        name = getattr(rule, "name", type(rule).__name__)
        tags = aggregators.get_tags(rule)
        within = tags.tol if tol is None else tol
        low = min_n(f) if min_n is not None else _min_workers(rule, f)
        n, d = draw(low, low + 6), draw(1, 12)
        x = torch.randn(n, d, generator=gen, dtype=torch.float64)
        ctx = _Fresh(dict(context(x))) if context else context_for(rule, x)
        where = f"{name} with f={f} on an ({n}, {d}) input"
        before = x.clone()
        out = rule(x, **ctx)
        assert isinstance(out, Tensor) and tuple(out.shape) == (d,), f"{where}: output shape {_shape(out)}, not ({d},)"
        assert out.dtype == x.dtype, f"{where}: output dtype {out.dtype}, input float64"
        assert torch.equal(x, before), f"{where}: the input was modified"
        assert bool(torch.isfinite(out).all()), f"{where}: non-finite output on finite input"
        x32 = x.float()
        out32 = rule(x32, **{k: (lambda v: v.float() if isinstance(v, Tensor) else v)(ctx[k]) for k in ctx})
        assert out32.dtype == torch.float32, f"{where}: float32 input gave {out32.dtype}"
        if contributions and hasattr(rule, "aggregate"):
            _, c = rule.aggregate(x, **ctx)
            assert tuple(c.shape) == (n,), f"{where}: contributions of shape {_shape(c)}, not ({n},)"
            if not bool(torch.isnan(c).all()):  # all NaN: the rule does not report its contributions
                ok = bool((c >= -1e-12).all()) and float(c.sum()) <= 1 + 1e-9
                assert ok, f"{where}: contributions {c.tolist()} (non-negative shares adding up to at most 1)"
        if claimed(permutation, tags.permutation):
            perm = torch.randperm(n, generator=gen)
            assert _close(rule(x[perm], **ctx), out, within), f"{where}: not invariant to the order of the rows"
        if claimed(translation, tags.translation):
            shift = torch.randn(d, generator=gen, dtype=x.dtype)
            assert _close(rule(x + shift, **ctx), out + shift, within), f"{where}: Agg(x + c) ≠ Agg(x) + c"
        if claimed(scale, tags.scale):
            a = (0.5, 3.0, 10.0)[trial % 3]
            assert _close(rule(a * x, **ctx), a * out, within), f"{where}: Agg({a:g}·x) ≠ {a:g}·Agg(x)"
        if claimed(identical, tags.identical):
            same = x[:1].expand_as(x).clone()
            assert _close(rule(same, **ctx), same[0], within), f"{where}: n identical rows do not give that row"
        if claimed(robust, tags.robust) and f >= 1:
            bad = x.clone()
            rows = torch.randperm(n, generator=gen)[: draw(1, f)]
            for r in rows.tolist():
                value = GARBAGE[draw(0, len(GARBAGE) - 1)]
                if draw(0, 1):
                    bad[r] = value
                else:
                    bad[r, draw(0, d - 1)] = value
            ctx_bad = _Fresh(dict(context(bad))) if context else context_for(rule, bad)
            got = rule(bad, **ctx_bad)
            assert bool(torch.isfinite(got).all()), f"{where}: non-finite output with {len(rows)} garbage row(s)"


def _min_workers(rule: Any, f: int) -> int:
    m = getattr(rule, "min_workers", None)
    return int(m()) if callable(m) else 2 * f + 1


def _shape(t: Any) -> Any:
    return tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__


def check_attack(
    attack: Attack, *, trials: int = 10, seed: int = 0, aggregator: Callable[[Tensor], Tensor] | None = None,
) -> None:
    """Check a vector attack's contract on random honest vectors: ``(b, d)`` output in the honest dtype (also for
    ``b = 0``), honest vectors untouched, the same output from the same generator state (randomness only from
    ``ctx.generator``), and the global random generator left alone. ``aggregator`` is passed to attacks that need
    the server's rule (default: the coordinate-wise median)."""
    gen = torch.Generator().manual_seed(seed)
    if aggregator is None:
        aggregator = aggregators.make("cwmed", f=1)
    for trial in range(trials):
        h = int(torch.randint(2, 9, (1,), generator=gen))
        b = trial % 4
        d = int(torch.randint(1, 10, (1,), generator=gen))
        honest = torch.randn(h, d, generator=gen, dtype=torch.float64)
        before = honest.clone()
        name = getattr(attack, "name", type(attack).__name__)
        where = f"{name} with {h} honest vectors of {d}, b={b}"
        state = torch.Generator().manual_seed(seed + trial).get_state()
        outs = []
        global_state = torch.get_rng_state()
        for _ in range(2):
            g = torch.Generator()
            g.set_state(state)
            ctx = AttackContext(honest=honest, n_byzantine=b, f=max(1, b), aggregator=aggregator, generator=g)
            outs.append(attack(ctx))
        out = outs[0]
        assert isinstance(out, Tensor) and tuple(out.shape) == (b, d), f"{where}: output {_shape(out)}, not ({b}, {d})"
        assert out.dtype == honest.dtype, f"{where}: output dtype {out.dtype}, honest float64"
        assert torch.equal(honest, before), f"{where}: the honest vectors were modified"
        assert torch.equal(outs[0].nan_to_num(0.0), outs[1].nan_to_num(0.0)), (
            f"{where}: two calls from the same generator state differ (randomness must come from ctx.generator)"
        )
        assert torch.equal(torch.get_rng_state(), global_state), f"{where}: it drew from torch's global generator"
