r"""Subnormal input entries count as 0 in the rules that multiply rows together.

A *subnormal* (denormal) number is a non-zero value below the dtype's smallest normal magnitude: below
:math:`2^{-126} \approx 1.2\cdot 10^{-38}` in float32 and bfloat16, below :math:`2^{-1022}` in float64. x86 CPUs
handle arithmetic on them through a microcode assist, tens of times slower than on normal numbers. So a Byzantine
worker that sends a row of them makes every product over that row slow: measured on a 2-core Xeon
(``benchmarks/subnormal_rules.py``), four such float32 rows among twenty made Krum 33× slower and eight other
components 4–28× slower, at no cost to the workers. GPUs do subnormal arithmetic at full speed.

The components whose products over such rows measured far slower set ``subnormals_as_zero`` (on
:class:`~phalanx.aggregators.base.Aggregator` and pre-aggregators); their input then goes through
:func:`flush_subnormals`, on every device, so the same input gives the same decisions on a CPU and a GPU. The
convention changes an output only where an input holds a subnormal entry, by less than the dtype's smallest normal
in each such entry.

Cost without a subnormal entry: one read of ``x`` (on the CPU the C kernel ``subnormal_rows`` of ``_normkernel.c``
decides on the bits, at memory speed), no copy. With one: a copy of ``x`` with those entries zeroed (on the CPU one
pass of the kernel's ``flush_copy``; elsewhere a copy whose flagged rows are rewritten).
Float16 is left alone: CPUs compute it in float32, where its subnormals are normal numbers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from phalanx.aggregators import _rowops
from phalanx.aggregators._numerics import COLUMN_CHUNK

__all__ = ["FLUSHED_DTYPES", "flush_subnormals", "subnormal_rows"]

FLUSHED_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
"""Dtypes whose subnormal entries :func:`flush_subnormals` sets to 0."""


def _kernel_applies(x: Tensor) -> bool:
    return (
        _rowops.HAVE_NORM_KERNEL and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
        and x.dim() == 2 and x.shape[0] > 0 and x.shape[1] > 0 and x.stride(1) == 1
        and (x.stride(0) >= x.shape[1] or x.shape[0] == 1)
    )


def subnormal_rows(x: Tensor) -> Tensor:
    """Boolean ``(n,)`` mask (on ``x``'s device) of the rows of ``x`` (``(n, d)``) holding a subnormal entry; all
    ``False`` for dtypes outside :data:`FLUSHED_DTYPES`. NaN, ±Inf and ±0 are not subnormal."""
    return _scan(x)[0]


def _scan(x: Tensor) -> tuple[Tensor, int]:
    """:func:`subnormal_rows` and how many rows hold one (the kernel counts them in the same pass)."""
    n, d = x.shape
    if x.dtype not in FLUSHED_DTYPES or n == 0 or d == 0:
        return torch.zeros(n, dtype=torch.bool, device=x.device), 0
    if _kernel_applies(x):
        flags = torch.empty(n, dtype=torch.uint8)
        count = _rowops._normkernel.subnormal_rows(
            x.data_ptr(), n, d, max(x.stride(0), d), x.dtype == torch.float64, flags.data_ptr(),
            max(1, torch.get_num_threads()),
        )
        return flags.view(torch.bool), count
    tiny = torch.finfo(x.dtype).tiny
    found = torch.zeros(n, dtype=torch.bool, device=x.device)
    with torch.no_grad():
        for s in range(0, d, COLUMN_CHUNK):  # no (n, d) temporary
            chunk = x[:, s : s + COLUMN_CHUNK]
            found |= ((chunk.abs() < tiny) & (chunk != 0)).any(dim=1)
    return found, int(found.sum())


def flush_subnormals(x: Tensor) -> Tensor:
    """``x`` itself when no entry is subnormal (:func:`subnormal_rows`); otherwise a copy in which every subnormal
    entry is ``+0`` and every other entry keeps its bits (NaN payloads and ``-0`` included). Differentiable: a
    flushed entry gets gradient 0."""
    rows, count = _scan(x)
    if not count:
        return x
    tiny = torch.finfo(x.dtype).tiny
    if torch.is_grad_enabled() and x.requires_grad:
        return torch.where((x.abs() < tiny) & (x != 0), torch.zeros((), dtype=x.dtype, device=x.device), x)
    if _kernel_applies(x):  # one pass: copy, zeroing on the bits
        out = torch.empty(x.shape, dtype=x.dtype)
        _rowops._normkernel.flush_copy(
            x.data_ptr(), x.shape[0], x.shape[1], max(x.stride(0), x.shape[1]), x.dtype == torch.float64,
            out.data_ptr(), max(1, torch.get_num_threads()),
        )
        return out
    idx = rows.nonzero().flatten()
    out = x.clone()
    sub = out.index_select(0, idx)
    out[idx] = torch.where((sub.abs() < tiny) & (sub != 0), torch.zeros((), dtype=x.dtype, device=x.device), sub)
    return out
