"""Parameter validation and the small numeric helpers every attack shares.

Nothing here depends on the aggregators: the attack package is part of the numeric core and stands on its own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from phalanx.aggregators._rowops import column_mean
from phalanx.validate import check_choice, check_int, check_real

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


def work_dtype(x: Tensor) -> torch.dtype:
    """The dtype attacks compute in: float64 stays float64, everything else is computed in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def honest_mean(x: Tensor) -> Tensor:
    """Coordinate-wise mean ``ḡ`` of the honest rows, shape ``(d,)``, in :func:`work_dtype` (the rows added in
    row order in one pass, :func:`~phalanx.aggregators._rowops.column_mean`)."""
    return column_mean(x.detach().to(work_dtype(x)))


def coordinate_std(x: Tensor) -> Tensor:
    """Coordinate-wise sample standard deviation of the rows (divisor ``h − 1``), shape ``(d,)``.

    The sample (unbiased-variance) form is the one ByzFL and Shejwalkar & Houmansadr's code use
    (``torch.std``). With a single row it is defined as 0 (there is no spread to hide in). Computed in two passes,
    σ² = (1/(h − 1)) Σᵢ (xᵢ − x̄)², each column sum one pass over the rows
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
