"""Parameter validation and the small numeric helpers every attack shares.

Nothing here depends on the aggregators: the attack package is part of the numeric core and stands on its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from phalanx.aggregators._rowops import column_mean
from phalanx.errors import ConfigError

__all__ = [
    "check_choice",
    "check_int",
    "check_real",
    "coordinate_std",
    "honest_mean",
    "repeat_row",
    "standard_normal",
    "uniform",
    "work_dtype",
]


def _describe_range(kind: str, low: float | None, low_open: bool, high: float | None, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return f"a finite {kind}" + (" " + " and ".join(parts) if parts else "")


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    low_open: bool = False,
    high: float | None = None,
    high_open: bool = False,
) -> float:
    """Validate a finite real parameter inside an (optionally half-open) interval; return it as a float."""
    allowed = _describe_range("number", low, low_open, high, high_open)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, value, allowed)
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(name, value, allowed)
    if low is not None and (v < low or (low_open and v == low)):
        raise ConfigError(name, value, allowed)
    if high is not None and (v > high or (high_open and v == high)):
        raise ConfigError(name, value, allowed)
    return v


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Validate an integer parameter in ``[low, high]`` (either bound optional)."""
    allowed = "an integer" + (f" >= {low}" if low is not None else "") + (
        f"{' and' if low is not None else ''} <= {high}" if high is not None else ""
    )
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, allowed)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(name, value, allowed)
    return value


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Validate a string parameter against a fixed set of choices."""
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        raise ConfigError(name, value, "one of " + ", ".join(repr(c) for c in options))
    return value


def work_dtype(x: Tensor) -> torch.dtype:
    """The dtype attacks compute in: float64 stays float64, everything else is computed in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def honest_mean(x: Tensor) -> Tensor:
    """Coordinate-wise mean ``ḡ`` of the honest rows, shape ``(d,)``, in :func:`work_dtype` (one matrix-vector
    product, :func:`~phalanx.aggregators._rowops.column_mean`)."""
    return column_mean(x.detach().to(work_dtype(x)))


def coordinate_std(x: Tensor) -> Tensor:
    """Coordinate-wise sample standard deviation of the rows (divisor ``h − 1``), shape ``(d,)``.

    The sample (unbiased-variance) form is the one ByzFL and Shejwalkar & Houmansadr's code use
    (``torch.std``). With a single row it is defined as 0 (there is no spread to hide in). Computed in two passes,
    σ² = (1/(h − 1)) Σᵢ (xᵢ − x̄)², each column sum a matrix-vector product
    (:func:`~phalanx.aggregators._rowops.column_mean`): ``torch.std(dim=0)`` reduces along the strided axis and was
    the slowest step of an ALIE round (docs/benchmarks.md).
    """
    w = x.detach().to(work_dtype(x))
    h = w.shape[0]
    if h < 2:
        return torch.zeros(w.shape[1], dtype=w.dtype, device=w.device)
    centred = w - column_mean(w)
    return (column_mean(centred.square_()) * (h / (h - 1))).sqrt_()


def repeat_row(vector: Tensor, rows: int, like: Tensor) -> Tensor:
    """``rows`` copies of ``vector`` (a new tensor, never a view), with the dtype and device of ``like``."""
    return vector.to(dtype=like.dtype, device=like.device).unsqueeze(0).repeat(rows, 1)


def standard_normal(shape: tuple[int, ...], generator: torch.Generator, like: Tensor) -> Tensor:
    """Standard normal samples drawn on the CPU in float64 from ``generator``, then moved to ``like``'s device.

    Drawing on the CPU in one fixed dtype makes the values depend only on the generator's state, not on the
    device or dtype of the honest vectors.
    """
    z = torch.randn(shape, generator=generator, dtype=torch.float64)
    return z.to(device=like.device, dtype=work_dtype(like))


def uniform(shape: tuple[int, ...], generator: torch.Generator, like: Tensor) -> Tensor:
    """Uniform samples in ``[0, 1)`` drawn like :func:`standard_normal`."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return u.to(device=like.device, dtype=work_dtype(like))
