"""Name → class registry, the spec parser and :func:`make`.

A *spec* is a rule name, optionally behind a chain of pre-aggregators, each optionally with parameters::

    "cwtm"                      coordinate-wise trimmed mean
    "nnm>cwtm"                  nearest-neighbour mixing, then trimmed mean
    "bucketing(s=2)>krum"       bucketing with buckets of 2, then Krum
    "clip(threshold=5)>nnm>cc(tau=1.0, iterations=3)"
    "nnm(f=2)>cwtm"             an element with its own f (the rule keeps the f given to make)

Keyword arguments of :func:`make` go to the final rule; ``name__param=value`` sends one to a named element.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator, PreAggregator, RuleTags, _Component, check_f
from phalanx.aggregators.chain import Chain
from phalanx.errors import ConfigError, InputError
from phalanx.plugins import CALL, Registry, check_params, split_call

C = TypeVar("C")


def _accept(obj: Any, name: str) -> type[_Component]:
    """A registered rule or pre-aggregator class as is; any other class becomes a rule through :func:`user_rule`."""
    if isinstance(obj, type) and issubclass(obj, (Aggregator, PreAggregator)):
        return obj
    if isinstance(obj, type) or callable(obj):
        return user_rule(obj, name)
    raise ConfigError("aggregator", name, "a class whose constructor takes f and whose call maps (n, d) to (d,)")


_REGISTRY: Registry[type[_Component]] = Registry("aggregator", "phalanx.aggregators", _accept)


def register(cls: C) -> C:
    """Class decorator: make a rule or pre-aggregator known to :func:`make` under ``cls.name`` (for a class that
    does not subclass :class:`Aggregator`: its ``name`` attribute, else its class name)."""
    _REGISTRY.register(cls)
    return cls


def names(kind: str | None = None) -> list[str]:
    """Names :func:`make` accepts: ``kind="rule"``, ``kind="pre"`` or both (default), sorted (installed plug-ins'
    entry points included; a ``module:attr`` spec is accepted too)."""
    if kind not in (None, "rule", "pre"):
        raise ConfigError("kind", kind, "'rule', 'pre' or None")
    out: dict[str, list[str]] = {"rule": [], "pre": []}
    for name in _REGISTRY.names():
        out["pre" if issubclass(get_class(name), PreAggregator) else "rule"].append(name)
    if kind is None:
        return out["rule"] + out["pre"]
    return out[kind]


def get_class(name: str) -> type[_Component]:
    """The class of ``name`` (registered, ``module:attr``, or an entry point); a :class:`ConfigError` with
    suggestions otherwise."""
    return _REGISTRY.get(name, "aggregator")


def get_tags(component: Any) -> RuleTags:
    """The tags a rule or pre-aggregator declares (:class:`~phalanx.aggregators.base.RuleTags`): of an instance, a
    class, or a name or spec :func:`make` accepts (a chain's spec: what all its elements claim, as a built chain
    does). A class that declares none — a user's class without a ``tags`` attribute — has the defaults; a ``tags``
    attribute of another type is a :class:`ConfigError`."""
    if isinstance(component, str):
        items = parse_spec(component)
        if len(items) > 1:
            return RuleTags.all_of(get_tags(get_class(name)) for name, _ in items)
        component = get_class(items[0][0])
    tags = getattr(component, "tags", None)
    if tags is None:
        return RuleTags()
    if not isinstance(tags, RuleTags):
        who = getattr(component, "name", None) or getattr(component, "__name__", type(component).__name__)
        raise ConfigError(f"{who}: tags", type(tags).__name__, "a phalanx.aggregators.RuleTags (or no tags attribute)")
    return tags


def user_rule(obj: Any, spec: str) -> type[Aggregator]:
    """A rule class around a user's class that does not subclass :class:`Aggregator`.

    What is asked of the user's class: its constructor takes ``f`` (and its own keyword parameters) and its
    instances map an ``(n, d)`` tensor to a ``(d,)`` tensor. Optional: ``contributions(x)`` (each row's share; without
    it the rounds' Byzantine share and detection AUC are not measured), ``min_workers()``, class attributes
    ``reference``, ``requirement``, ``context_keys`` (the per-call keywords it accepts, e.g. ``{"center"}``) and
    ``tags`` (a :class:`~phalanx.aggregators.base.RuleTags`: the properties it claims, which the checks test) and
    ``stateful = True`` with ``state_dict()`` / ``load_state_dict(state)`` for a rule that keeps state across rounds
    (:class:`~phalanx.aggregators.base.Aggregator`'s contract).
    The wrapper adds what every rule has: input checks, ``describe``, ``with_f`` and the server's context.
    """
    keys = frozenset(getattr(obj, "context_keys", ()))
    declared = get_tags(obj)

    class UserRule(Aggregator):
        name = spec
        reference = str(getattr(obj, "reference", f"user-defined rule {spec}"))
        requirement = str(getattr(obj, "requirement", "n >= 1"))
        context_keys = keys
        tags = declared
        stateful = bool(getattr(obj, "stateful", False))
        wraps: ClassVar[Any] = obj  # the user's own class or function (whose module says whose rule it is)

        def __init__(self, f: int = 0, **params: Any) -> None:
            super().__init__(f)
            check_params(spec, obj, params, skip=("f",))
            self._params = dict(params)
            try:
                self.inner = obj(f=self.f, **params)
            except TypeError as exc:  # not a class or function taking f (and these parameters): a config error
                raise ConfigError("aggregator", spec, "a class whose constructor takes f and its keyword "
                                  f"parameters ({exc!r})") from None

        def params(self) -> dict[str, Any]:
            return {"f": self.f, **self._params}

        def state_dict(self) -> dict[str, Tensor]:
            return dict(self.inner.state_dict()) if self.stateful else {}

        def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
            if self.stateful:
                self.inner.load_state_dict(dict(state))
            else:
                super().load_state_dict(state)

        def min_workers(self) -> int:
            m = getattr(self.inner, "min_workers", None)
            return int(m()) if callable(m) else 1

        def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
            out = self.inner(x, **context)
            if not isinstance(out, Tensor) or tuple(out.shape) != (x.shape[1],):
                got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise InputError(f"{spec}: output", got, f"a tensor of shape ({x.shape[1]},)")
            out = out.to(dtype=x.dtype, device=x.device)
            if not want_contributions:
                return out, None
            share = getattr(self.inner, "contributions", None)
            if callable(share):
                return out, torch.as_tensor(share(x, **context), dtype=torch.float64, device=x.device)
            return out, torch.full((x.shape[0],), float("nan"), dtype=torch.float64, device=x.device)

    UserRule.__name__ = UserRule.__qualname__ = f"UserRule[{spec}]"
    UserRule.__doc__ = getattr(obj, "__doc__", None)  # the user's description, for help and the listings
    return UserRule


def parse_spec(spec: str) -> list[tuple[str, dict[str, Any]]]:
    """Split a spec into ``[(name, params), ...]``, pre-aggregators first, the rule last."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("aggregator", spec, "a rule name or a chain such as 'nnm>cwtm'")
    items: list[tuple[str, dict[str, Any]]] = []
    for part in spec.split(">"):
        if CALL.match(part) is None:
            several = "," in part and "(" not in part  # "cwtm,krum": a grid over rules is a list, not a chain
            raise ConfigError("aggregator", spec, "elements of the form name or name(key=value, ...) joined by '>'"
                              + ("; several rules to compare are a list: --set 'aggregator=[\"cwtm\", \"krum\"]'"
                                 if several else ""))
        try:
            name, params = split_call(part, "aggregator")
        except ConfigError as exc:
            raise ConfigError("aggregator", spec, exc.allowed) from None
        items.append((name, params))
    return items


def _construct(cls: type[_Component], f: int, params: dict[str, Any], written: str) -> Any:
    """The element ``written`` of a spec (``cc`` in ``"nnm>cc(tau=-1)"``), built; a parameter its constructor
    refuses is named ``aggregator.<element>.<parameter>`` (``aggregator.cc.tau=-1 is invalid: …``), not by its bare
    name, which could be any element's."""
    # An element may carry its own f ("nnm(f=2)>cwtm"): NNM's f and the rule's f are separate choices
    # (Yang, Shi & Li, ICML 2025, Tables 5-6 vary f_NNM under a rule configured for f = 7).
    params = dict(params)
    own = "f" in params  # the element's own f (nnm(f=2)): a bad one is named as the element's too
    own_f = params.pop("f", f)
    check_params(cls.name, cls.__init__, params, skip=("f",))
    try:
        check_f(own_f)
        return cls(f=own_f, **params)
    except ConfigError as exc:
        if exc.parameter not in params and not (own and exc.parameter == "f"):
            raise
        raise ConfigError(f"aggregator.{written}.{exc.parameter}", exc.value, exc.allowed, exc.hint) from None


def make(spec: str, f: int, **params: Any) -> Aggregator:
    """Build a rule, or a chain of pre-aggregators ending in a rule, from a spec.

    Parameters
    ----------
    spec: a rule name (see :func:`names`) or a chain ``"pre>...>rule"``; elements may carry parameters,
        ``"bucketing(s=2)>krum"``.
    f: the number of Byzantine rows every element is configured to tolerate.
    params: parameters of the final rule; ``element__param=value`` targets a named element of the chain.

    Returns an :class:`~phalanx.aggregators.base.Aggregator`; calling it on an ``(n, d)`` float tensor gives ``(d,)``.
    """
    check_f(f)
    items = parse_spec(spec)
    classes = {name: get_class(name) for name, _ in items}
    *pre_items, (rule_name, rule_params) = items
    if not issubclass(classes[rule_name], Aggregator):
        raise ConfigError("aggregator", spec, f"a chain that ends in a rule ({', '.join(names('rule'))})")
    for name, _ in pre_items:
        if not issubclass(classes[name], PreAggregator):
            raise ConfigError(
                "aggregator", spec, f"pre-aggregators ({', '.join(names('pre'))}) before the final rule, got {name!r}",
            )
    element_names = [n for n, _ in items]
    for key, value in params.items():
        if "__" in key:
            target, sub = key.split("__", 1)
            if target not in element_names:
                raise ConfigError(key, value, f"a parameter of an element of {spec!r}: {', '.join(element_names)}")
            for name, p in items:
                if name == target:
                    p[sub] = value
        else:
            rule_params[key] = value
    pre = [_construct(classes[name], f, p, name) for name, p in pre_items]
    rule = _construct(classes[rule_name], f, rule_params, rule_name)
    if not pre:
        return rule
    return Chain(pre, rule)
