"""Static norm clipping."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import clip_scales, row_norms, scale_rows
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
    rule downstream. The input is never modified.
    """

    name: ClassVar[str] = "clip"
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
