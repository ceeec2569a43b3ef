"""Errors of the torchrun engine (:class:`WorkersLostError` is raised by the training loop, so it lives in
:mod:`phalanx.errors`; it is re-exported here)."""

from __future__ import annotations

from phalanx.errors import PhalanxError, WorkersLostError

__all__ = ["TransportError", "WorkersLostError"]


class TransportError(PhalanxError, RuntimeError):
    """The ranks could not connect (the store or the process group); nothing was trained."""
