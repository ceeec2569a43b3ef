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

import difflib
import inspect
import re
from typing import Any, TypeVar

from phalanx.aggregators.base import Aggregator, PreAggregator, _Component, check_f
from phalanx.aggregators.chain import Chain
from phalanx.errors import ConfigError

_RULES: dict[str, type[Aggregator]] = {}
_PRE: dict[str, type[PreAggregator]] = {}

C = TypeVar("C", bound=type[_Component])


def register(cls: C) -> C:
    """Class decorator: make a rule or pre-aggregator known to :func:`make` under ``cls.name``."""
    name = cls.name
    if name in _RULES or name in _PRE:
        raise RuntimeError(f"aggregator name {name!r} registered twice")
    if issubclass(cls, Aggregator):
        _RULES[name] = cls
    elif issubclass(cls, PreAggregator):
        _PRE[name] = cls
    else:  # pragma: no cover - programming error
        raise TypeError(f"{cls!r} is neither an Aggregator nor a PreAggregator")
    return cls


def names(kind: str | None = None) -> list[str]:
    """Names :func:`make` accepts: ``kind="rule"``, ``kind="pre"`` or both (default), sorted."""
    if kind not in (None, "rule", "pre"):
        raise ConfigError("kind", kind, "'rule', 'pre' or None")
    out: list[str] = []
    if kind in (None, "rule"):
        out += sorted(_RULES)
    if kind in (None, "pre"):
        out += sorted(_PRE)
    return out


def get_class(name: str) -> type[_Component]:
    """The class registered under ``name``; a :class:`ConfigError` with suggestions otherwise."""
    if name in _RULES:
        return _RULES[name]
    if name in _PRE:
        return _PRE[name]
    close = difflib.get_close_matches(name, list(_RULES) + list(_PRE), n=3)
    hint = f"did you mean {', '.join(close)}?" if close else None
    raise ConfigError("aggregator", name, "one of " + ", ".join(names()), hint)


_ITEM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$", re.S)


def _parse_value(text: str) -> Any:
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    return t


def parse_spec(spec: str) -> list[tuple[str, dict[str, Any]]]:
    """Split a spec into ``[(name, params), ...]``, pre-aggregators first, the rule last."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("aggregator", spec, "a rule name or a chain such as 'nnm>cwtm'")
    items: list[tuple[str, dict[str, Any]]] = []
    for part in spec.split(">"):
        m = _ITEM.match(part)
        if m is None:
            raise ConfigError("aggregator", spec, "elements of the form name or name(key=value, ...) joined by '>'")
        name, arg_text = m.group(1), m.group(2)
        params: dict[str, Any] = {}
        if arg_text and arg_text.strip():
            for kv in arg_text.split(","):
                if "=" not in kv:
                    raise ConfigError("aggregator", spec, f"parameters as key=value, got {kv.strip()!r}")
                key, value = kv.split("=", 1)
                params[key.strip()] = _parse_value(value)
        items.append((name, params))
    return items


def _construct(cls: type[_Component], f: int, params: dict[str, Any]) -> Any:
    # An element may carry its own f ("nnm(f=2)>cwtm"): NNM's f and the rule's f are separate choices
    # (Yang, Shi & Li, ICML 2025, Tables 5-6 vary f_NNM under a rule configured for f = 7).
    params = dict(params)
    own_f = params.pop("f", f)
    check_f(own_f)
    try:
        return cls(f=own_f, **params)
    except TypeError as exc:
        accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "f")]
        bad = sorted(set(params) - set(accepted))
        raise ConfigError(
            f"{cls.name} parameter", bad or params, f"parameters of {cls.name}: {', '.join(accepted) or 'none'}",
        ) from exc


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
    for name, _ in items:
        get_class(name)
    *pre_items, (rule_name, rule_params) = items
    if rule_name not in _RULES:
        raise ConfigError("aggregator", spec, f"a chain that ends in a rule ({', '.join(names('rule'))})")
    for name, _ in pre_items:
        if name not in _PRE:
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
    pre = [_construct(_PRE[name], f, p) for name, p in pre_items]
    rule = _construct(_RULES[rule_name], f, rule_params)
    if not pre:
        return rule
    return Chain(pre, rule)
