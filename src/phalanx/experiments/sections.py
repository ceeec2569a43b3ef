"""Each component's config section — a round algorithm's, an attack's — read from its constructor
(scikit-learn's ``get_params`` rule: the constructor *is* the configuration), not listed anywhere else.

A section is the constructor's keyword parameters (``inspect.signature``), each with its type (the annotation), its
default, and the config key that sets it: a built-in algorithm (:data:`~phalanx.training.algorithms.builtin.BUILT_IN`)
reads flat keys of the run config — the parameter's own name where the config has that key, or the key its class
declares for it (:attr:`~phalanx.training.algorithms.base.RoundAlgorithm.section_keys`: gossip's ``weights`` is
``gossip_weights``); any other algorithm reads ``algorithm_params.<p>``, and also the flat key of that name where
the built-in algorithms have one (:func:`phalanx.experiments.legacy.client_keys`: SCAFFOLD's ``clients_per_round``).
The default shown is what a config that leaves the key unset gets (for a flat key the algorithm's declared
default, :attr:`~phalanx.training.algorithms.base.RoundAlgorithm.config_defaults`, else the config's; the
constructor's for ``algorithm_params``). An attack's section is its class's constructor, each parameter set by
``attack_params.<p>``. ``phalanx list algorithms`` and ``phalanx list attacks`` print the sections.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from phalanx.experiments.schema import RunConfig
from phalanx.training.algorithms import builtin

__all__ = ["Param", "algorithm_section", "attack_section"]

UNSET = "required"
"""How a parameter with no default shows its default (gossip's graph: built from ``graph`` and ``graph_params``)."""


@dataclass(frozen=True)
class Param:
    """One parameter of a section: ``name`` (the constructor's), ``type`` (its annotation, as text), ``default`` (as
    text) and ``keys``, the config keys that set it (the first is the one to write)."""

    name: str
    type: str
    default: str
    keys: tuple[str, ...]

    def text(self) -> str:
        """One line: ``name: type = default (key, …)``."""
        return f"{self.name}: {self.type} = {self.default} ({', '.join(self.keys)})"


def _shown(value: Any) -> str:
    return UNSET if value is inspect.Parameter.empty else repr(value)


def _parameters(cls: type) -> Iterator[tuple[str, str, Any]]:
    """``(name, type as text, default)`` of each keyword parameter of ``cls``'s constructor (none when ``inspect``
    cannot read it)."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a class inspect cannot read: no section to show
        return
    for p in signature.parameters.values():
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            continue
        if p.annotation is inspect.Parameter.empty:
            annotation = "Any"
        else:
            annotation = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "Any")
        yield p.name, str(annotation), p.default


def algorithm_section(name: str) -> list[Param]:
    """The config section of ``algorithm = name`` (a one-line :class:`~phalanx.errors.ConfigError` naming
    ``algorithm`` for an unknown name): every keyword parameter of its class's constructor, in order."""
    cls = builtin.algorithm_class(name)
    fields = RunConfig.model_fields
    built_in = name in builtin.BUILT_IN
    flat_of_own = set(builtin.own_keys())
    out = []
    for param, annotation, default in _parameters(cls):
        if built_in:
            key = cls.section_keys.get(param, param)
            if key in fields:
                shown = _shown(cls.config_defaults.get(key, fields[key].get_default(call_default_factory=True)))
                out.append(Param(param, annotation, shown, (key,)))
            else:
                out.append(Param(param, annotation, _shown(default), ("set by the run",)))
            continue
        keys = (f"algorithm_params.{param}", *((param,) if param in flat_of_own else ()))
        out.append(Param(param, annotation, _shown(default), keys))
    return out


def attack_section(name: str) -> list[Param]:
    """The config section of ``attack = name`` (a one-line :class:`~phalanx.errors.ConfigError` naming ``attack``
    for an unknown name): every keyword parameter of its class's constructor, each set by ``attack_params.<p>``."""
    from phalanx import attacks

    cls = attacks.get_class(name)
    return [Param(p, annotation, _shown(default), (f"attack_params.{p}",))
            for p, annotation, default in _parameters(cls)]
