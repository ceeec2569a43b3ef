"""Losses by name (:mod:`phalanx.plugins`): ``loss = "cross_entropy"`` (the default) or a user's own.

A loss is a function ``loss(logits, y) -> scalar``, the mean over the batch's samples (it must be written with
torch operations, so that per-worker gradients can be taken through it with ``torch.func``). Register one with
``@losses.register("name")``, name it by a ``module:attr`` spec, or install it as an entry point of
``phalanx.losses``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.nn.functional as F

from phalanx.errors import ConfigError
from phalanx.plugins import Registry
from phalanx.training.problem import Loss

__all__ = ["get", "names", "register"]

L = TypeVar("L", bound=Callable[..., Any])


def _accept(obj: Any, name: str) -> Loss:
    if not callable(obj):
        raise ConfigError("loss", name, "a function loss(logits, y) -> the batch's mean loss")
    return obj


_REGISTRY: Registry[Loss] = Registry("loss", "phalanx.losses", _accept)
_REGISTRY.register(F.cross_entropy, name="cross_entropy")


def register(name: str) -> Callable[[L], L]:
    """Decorator: make ``loss(logits, y)`` known under ``name``."""

    def deco(fn: L) -> L:
        _REGISTRY.register(fn, name=name)
        return fn

    return deco


def names() -> list[str]:
    """The loss names :func:`get` accepts (a ``module:attr`` spec too)."""
    return _REGISTRY.names()


def get(name: str) -> Loss:
    """The loss registered under ``name`` (or named by a ``module:attr`` spec, or an entry point)."""
    return _REGISTRY.get(name, "loss")
