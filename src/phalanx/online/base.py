"""The online-learning interface of :mod:`phalanx.online` and its input checks.

An online learner on ℝ^d plays ``w_t = predict()``, then receives a (sub)gradient ``g_t`` through ``update(g_t)``;
its regret against a comparator ``u`` after T rounds is :math:`R_T(u) = \\sum_t \\langle g_t, w_t - u\\rangle`.
Its whole state is a dict of tensors (:meth:`OnlineLearner.state_dict`), so a checkpoint can carry it and a learner
restored from it continues bit for bit.

A gradient is data, not configuration: when it comes from a server's aggregate a Byzantine majority may have made it
anything. A gradient of the wrong shape is a programming error (:class:`~phalanx.errors.ConfigError`, raised before
any state changes); a non-finite one (NaN, ±Inf) is an attack, and the learners *skip* it — the round is played as if
the gradient were 0 (every state but the round counter and the skip counter is left as it was). In the corruption
model of Zhang & Cutkosky (ICML 2025) such a round costs at most one unit of the budget k, since the true gradient
had norm ≤ G.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.validate import check_int, check_real

__all__ = ["OnlineLearner", "ScalarLearner", "as_gradient", "check_bound", "load_scalars", "scalars"]

DTYPE = torch.float64


def check_bound(name: str, value: Any) -> float:
    """A gradient bound (or any scale): a finite number > 0."""
    return check_real(name, value, low=0.0, low_open=True)


def check_dim(value: Any) -> int:
    """The dimension d of a learner on ℝ^d: an integer ≥ 1."""
    return check_int("dim", value, low=1)


def as_gradient(g: Any, dim: int) -> tuple[Tensor, bool]:
    """``g`` as a float64 vector of shape ``(dim,)`` and whether it is finite (a non-finite one comes back as
    zeros). A tensor of another shape, or anything that is not a tensor, is refused with a
    :class:`~phalanx.errors.ConfigError` naming ``gradient``."""
    if not isinstance(g, Tensor):
        raise ConfigError("gradient", type(g).__name__, f"a tensor of shape ({dim},)")
    if g.shape != (dim,) and not (dim == 1 and g.dim() == 0):
        raise ConfigError("gradient", tuple(g.shape), f"a tensor of shape ({dim},)")
    if g.is_complex() or g.dtype == torch.bool:
        raise ConfigError("gradient", str(g.dtype), "a real floating-point (or integer) tensor")
    v = g.detach().to(device="cpu", dtype=DTYPE).reshape(dim)
    if not bool(torch.isfinite(v).all()):
        return torch.zeros(dim, dtype=DTYPE), False
    return v, True


def scalars(prefix: str, **values: float) -> dict[str, Tensor]:
    """Named Python floats as 0-d float64 tensors (exact: a Python float is a float64)."""
    return {f"{prefix}{k}": torch.tensor(float(v), dtype=DTYPE) for k, v in values.items()}


def load_scalars(state: dict[str, Tensor], prefix: str, names: tuple[str, ...], who: str) -> dict[str, float]:
    """The floats :func:`scalars` saved under ``prefix``; a missing or malformed entry is a
    :class:`~phalanx.errors.ConfigError` (the checkpoint is not this learner's)."""
    out = {}
    for n in names:
        t = state.get(prefix + n)
        if not isinstance(t, Tensor) or t.numel() != 1:
            raise ConfigError("learner state", prefix + n, f"a one-element tensor (the state of {who})")
        out[n] = float(t.reshape(-1)[0].to(DTYPE))
    return out


def check_keys(state: dict[str, Tensor], expected: set[str], who: str) -> None:
    """Refuse a state dict whose keys are not exactly ``expected``."""
    if set(state) != expected:
        extra, missing = sorted(set(state) - expected), sorted(expected - set(state))
        raise ConfigError("learner state", {"unexpected": extra, "missing": missing}, f"the keys of {who}")


def sub(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of ``state`` under ``prefix``, with the prefix removed."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def prefixed(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """``state`` with every key under ``prefix``."""
    return {prefix + k: v for k, v in state.items()}


def finite(x: float) -> bool:
    return math.isfinite(x)


class ScalarLearner(ABC):
    """A 1-D online learner in float64 (Python floats): ``predict() -> float``, ``update(g: float)``."""

    @abstractmethod
    def predict(self) -> float:
        """The point w_t played this round."""

    @abstractmethod
    def update(self, g: float) -> None:
        """Receive the round's (sub)gradient g_t (finite; callers sanitise and clip)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Tensor]:
        """The state as 0-d float64 tensors."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore a state saved by :meth:`state_dict`."""


class OnlineLearner(ABC):
    """An online learner on ℝ^d: ``predict() -> Tensor`` (float64, shape ``(d,)``), ``update(g)``, tensor state."""

    dim: int

    @abstractmethod
    def predict(self) -> Tensor:
        """The point w_t played this round (a new float64 tensor of shape ``(dim,)``)."""

    @abstractmethod
    def update(self, g: Tensor) -> None:
        """Receive the round's (sub)gradient: shape ``(dim,)``; non-finite ones are skipped (see the module)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Tensor]:
        """The state as named tensors (clones: changing them does not change the learner)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore a state saved by :meth:`state_dict` of a learner built with the same arguments."""
