"""Adaptive robust clipping (ARC, Allouah et al., ICLR 2025)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import clip_scales, row_norms, scale_rows, scale_rows_
from phalanx.aggregators.base import PreAggregator, RuleTags, as_compute_dtype
from phalanx.aggregators.registry import register

__all__ = ["ARC", "arc_clipped_count"]


def arc_clipped_count(n: int, f: int) -> int:
    """Number of rows ARC clips: ``k = ⌊2 · (f/n) · (n − f)⌋`` (computed exactly in integers)."""
    return (2 * f * (n - f)) // n


@register
class ARC(PreAggregator):
    r"""Adaptive robust clipping: clip the ``k`` longest rows to the norm of the ``(k+1)``-th longest.

    With :math:`k = \lfloor 2\,(f/n)\,(n-f) \rfloor` and :math:`\pi` sorting the rows by non-increasing norm,
    :math:`\lVert x_{\pi(1)}\rVert \ge \dots \ge \lVert x_{\pi(n)}\rVert`, the threshold is
    :math:`C = \lVert x_{\pi(k+1)}\rVert` and

    .. math:: y_i = x_i \cdot \min\big(1, C / \lVert x_i\rVert\big).

    Allouah, Guerraoui, Gupta, Jellouli, Rizk & Stephan, "Adaptive gradient clipping for robust federated
    learning", ICLR 2025 (arXiv 2405.14432; earlier versions titled "Boosting robustness by clipping gradients in
    distributed learning" and "The vital role of gradient clipping in Byzantine-resilient distributed learning"),
    Algorithm 1 (ARC). The formula for ``k`` and the choice of the ``(k+1)``-th largest norm agree with ByzFL
    0.0.11 (``ARC``, by the same group). Since ``k ≥ f`` whenever ``n ≥ 2f``, every one of up to ``f`` Byzantine
    rows is among the clipped ones or already shorter than ``C``. With ``f = 0`` nothing is clipped.

    Bad rows (NaN/Inf, or a norm that overflows) count as the longest rows and are passed through unchanged, so
    they stay bad for the rule downstream. Provenance ``M = I``. The input is never modified (ByzFL's ``ARC`` and
    ``Clipping`` modify their input in place), except through :meth:`mix_`, for a caller that owns it: then ``x`` is
    scaled in place, with the same values (``tests/test_inplace_pre.py``).
    """

    name: ClassVar[str] = "arc"
    floor = "copy"
    reference: ClassVar[str] = (
        "Y. Allouah, R. Guerraoui, N. Gupta, A. Jellouli, G. Rizk, J. Stephan, 'Adaptive gradient clipping for "
        "robust federated learning', ICLR 2025 (arXiv 2405.14432), Algorithm 1 (ARC)"
    )
    requirement = "n > 2f"
    tags = RuleTags(translation=False, scale=False)

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _scales(self, xc: Tensor) -> Tensor | None:
        """The factors ``min(1, C/‖xᵢ‖)`` (float64 ``(n,)``), or ``None`` when nothing is clipped (``k = 0``)."""
        norms, bad = row_norms(xc)
        k = arc_clipped_count(xc.shape[0], self.f)
        if k == 0:
            return None
        key = torch.where(bad, torch.full_like(norms, float("inf")), norms)
        threshold = torch.sort(key, descending=True).values[k]
        return clip_scales(norms, bad, threshold)

    def _run(self, x: Tensor, **context: Any) -> tuple[Tensor, Tensor]:
        xc = as_compute_dtype(x)
        scales = self._scales(xc)
        y = xc.clone() if scales is None else scale_rows(xc, scales)
        return y.to(x.dtype), torch.eye(x.shape[0], dtype=torch.float64, device=x.device)

    def _run_(self, x: Tensor, **context: Any) -> tuple[Tensor, Tensor]:
        if x.dtype not in (torch.float32, torch.float64):
            return self._run(x, **context)  # half precision is computed in float32: a new tensor anyway
        scales = self._scales(x)
        y = x if scales is None else scale_rows_(x, scales)
        return y, torch.eye(x.shape[0], dtype=torch.float64, device=x.device)
