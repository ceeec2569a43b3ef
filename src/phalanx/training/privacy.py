"""Client-level differential privacy at the worker — moved to :mod:`phalanx.training.stages.privacy` (a worker
stage); this path keeps working for code that imports it from here."""

from phalanx.training.stages.privacy import COLUMNS, STREAM, ClientDP

__all__ = ["COLUMNS", "STREAM", "ClientDP"]
