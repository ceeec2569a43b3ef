"""Static norm clipping."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import clip_scales, row_norms, scale_rows, scale_rows_
from phalanx.aggregators.base import PreAggregator, RuleTags, as_compute_dtype, check_positive
from phalanx.aggregators.registry import register

__all__ = ["Clip"]


@register
class Clip(PreAggregator):
    r"""Static norm clipping: :math:`y_i = x_i \cdot \min\big(1, \tau / \lVert x_i\rVert\big)`.

    Every row longer than the threshold :math:`\tau` is scaled down to norm :math:`\tau`; shorter rows are copied
    unchanged. This is the static clipping pre-aggregation that Allouah et al. (ICLR 2025) use as the baseline that
    ARC (``arc``) makes adaptive (ByzFL calls it ``Clipping``). The output has ``n`` rows and provenance ``M = I``.

    The default ``threshold=1.0`` is only a placeholder: a good τ depends on the scale of your gradients (set it
    near their typical norm); a too small τ biases every update, a too large one does nothing.

    Bad rows (NaN/Inf, or a norm that overflows the dtype) are passed through unchanged, so they stay bad for the
    rule downstream. The input is never modified, except through :meth:`mix_` (a caller that owns it): then ``x``
    is scaled in place, with the same values (``tests/test_inplace_pre.py``).
    """

    name: ClassVar[str] = "clip"
    floor = "copy"
    reference: ClassVar[str] = (
        "static clipping; see Y. Allouah, R. Guerraoui, N. Gupta, A. Jellouli, G. Rizk, J. Stephan, 'Adaptive "
        "gradient clipping for robust federated learning', ICLR 2025 (arXiv 2405.14432), the static clipping baseline"
    )
    requirement = "n >= 1"
    tags = RuleTags(translation=False, scale=False, identical=False)  # a fixed radius around the origin

    def __init__(self, f: int = 0, threshold: float = 1.0) -> None:
        super().__init__(f)
        self.threshold = float(check_positive("threshold", threshold))

    def _run(self, x: Tensor, **context: Any) -> tuple[Tensor, Tensor]:
        xc = as_compute_dtype(x)
        norms, bad = row_norms(xc)
        y = scale_rows(xc, clip_scales(norms, bad, self.threshold))
        n = x.shape[0]
        return y.to(x.dtype), torch.eye(n, dtype=torch.float64, device=x.device)

    def _run_(self, x: Tensor, **context: Any) -> tuple[Tensor, Tensor]:
        if x.dtype not in (torch.float32, torch.float64):
            return self._run(x, **context)  # half precision is computed in float32: a new tensor anyway
        n = x.shape[0]
        rows = n
        if x.device.type == "cpu" and torch.get_num_threads() == 1:
            # a row's factor needs only its own norm: a block of rows at a time (its norms, then its clipped rows
            # while they are still in the last-level cache) reads each clipped row from memory once, not twice
            rows = max(1, CACHE_BLOCK_BYTES // max(1, x.shape[1] * x.element_size()))
        for a in range(0, n, rows):
            block = x[a : a + rows]
            norms, bad = row_norms(block)
            scale_rows_(block, clip_scales(norms, bad, self.threshold))
        return x, torch.eye(n, dtype=torch.float64, device=x.device)


CACHE_BLOCK_BYTES = 8 << 20
"""Bytes of rows that :meth:`Clip.mix_` clips at a time on one CPU thread (two rows of 10⁶ float32: measured 12–22 %
faster than all norms first at n = 50, d = 10⁶, docs/benchmarks.md). The norms of a block are those of the whole
tensor, bit for bit (a row's norm is reduced along that row alone; ``tests/test_inplace_pre.py``)."""
