"""CRFL's clipping and smoothing of the global model, and its certificate — moved to
:mod:`phalanx.training.stages.crfl` (a server stage); this path keeps working for code that imports it from here."""

from phalanx.training.stages.crfl import (
    COLUMNS,
    CRFL,
    SMOOTHING_STREAM,
    Certificate,
    certify,
    hoeffding_bounds,
    radius,
    votes,
)

__all__ = ["COLUMNS", "CRFL", "SMOOTHING_STREAM", "Certificate", "certify", "hoeffding_bounds", "radius", "votes"]
