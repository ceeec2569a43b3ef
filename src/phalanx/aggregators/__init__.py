"""Robust aggregation rules and pre-aggregators.

>>> import torch
>>> from phalanx import aggregators
>>> agg = aggregators.make("nnm>cwtm", f=2)
>>> agg(torch.randn(10, 5)).shape
torch.Size([5])

:func:`make` builds a rule or a chain from a spec; :func:`names` lists what it accepts. Every component carries its
reference, its requirement on n and f, (where the literature gives them) ε and κ, and the properties it claims
(:class:`RuleTags`, read with :func:`get_tags`). See docs/aggregators.md.
"""

from phalanx.aggregators.base import Aggregator, PreAggregator, RuleTags
from phalanx.aggregators.chain import Chain
from phalanx.aggregators.registry import get_class, get_tags, make, names, parse_spec, register
from phalanx.plugins import import_modules

# Every module of this package (and of pre/) is imported here, in name order, and importing one registers its rules
# with make()/names(): a new rule is its file, with no import to add (tests/test_builtin_discovery.py).
import_modules(__name__, __path__)

__all__ = [
    "Aggregator", "Chain", "PreAggregator", "RuleTags", "get_class", "get_tags", "make", "names", "parse_spec",
    "register",
]
