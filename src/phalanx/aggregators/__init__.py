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

# Importing a module registers its rules with make()/names().
from phalanx.aggregators import (  # noqa: F401
    bulyan,
    caf,
    cc,
    cge,
    clippedclustering,
    coordinatewise,
    dnc,
    flame,
    fldetector,
    fltrust,
    foolsgold,
    geomed,
    krum,
    mda,
    mean,
    rlr,
    signguard,
    signmaj,
    smea,
)
from phalanx.aggregators.base import Aggregator, PreAggregator, RuleTags
from phalanx.aggregators.chain import Chain
from phalanx.aggregators.pre import arc, bucketing, clip, nnm  # noqa: F401
from phalanx.aggregators.registry import get_class, get_tags, make, names, parse_spec, register

__all__ = [
    "Aggregator", "Chain", "PreAggregator", "RuleTags", "get_class", "get_tags", "make", "names", "parse_spec",
    "register",
]
