"""Nearest-neighbour mixing, NNM (Allouah et al., AISTATS 2023): replace each row by the mean of its n − f nearest."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import pairwise_sqdist
from phalanx.aggregators._rowops import mix_rows
from phalanx.aggregators.base import PreAggregator, as_compute_dtype
from phalanx.aggregators.registry import register

__all__ = ["NNM", "nnm_matrix"]


def nnm_matrix(sqdist: Tensor, f: int) -> Tensor:
    """The ``(n, n)`` float64 NNM mixing matrix on the CPU: ``M[i, j] = 1/(n − f)`` for the ``n − f`` rows ``j``
    nearest to row ``i`` (row ``i`` itself always first), 0 elsewhere.

    Neighbours are ranked by squared distance with a stable sort, so equal distances go to the smaller index.
    A bad row (infinite distance to everything) is nobody's neighbour while enough finite rows exist; its own
    neighbour set is itself and then the smallest indices.
    """
    d = sqdist.detach().to(device="cpu", dtype=torch.float64).clone()
    n = d.shape[0]
    k = n - f
    d.fill_diagonal_(-1.0)  # itself first, whatever the ties
    order = torch.sort(d, dim=1, stable=True).indices[:, :k]
    m = torch.zeros(n, n, dtype=torch.float64)
    m.scatter_(1, order, 1.0 / k)
    return m


@register
class NNM(PreAggregator):
    r"""Nearest-neighbour mixing: each row becomes the average of its ``n − f`` nearest rows (itself included).

    .. math::
        y_i = \frac{1}{n - f} \sum_{j \in N_i} x_j, \qquad y = M x,

    where :math:`N_i` holds the :math:`n - f` rows nearest to :math:`x_i` in Euclidean distance, :math:`x_i`
    included (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan, "Fixing by Mixing: A Recipe for Optimal
    Byzantine ML under Heterogeneity", AISTATS 2023, Algorithm 1). Requires :math:`n > 2f`.

    Memory ``O(n² + n d)``: one Gram matrix gives all distances, the ``(n, n)`` mixing matrix ``M`` is built on the
    host and ``y = M x`` is one matrix product (no ``(n, n − f, d)`` tensor, unlike ByzFL). Ties in distance go to
    the smaller index (stable sort). The provenance matrix is ``M`` itself.

    Bad rows: with at most ``f`` bad rows every finite row has ``n − f`` finite neighbours, so its output is finite
    and exactly the honest formula; a bad row stays bad (its output is NaN), which every rule downstream treats as
    one of the at most ``f`` bad rows it tolerates. The product skips bad rows, so a NaN never leaks through a zero
    weight.
    """

    subnormals_as_zero = True  # subnormal arithmetic made it tens of times slower on a CPU: flush to zero (_subnormals)
    name: ClassVar[str] = "nnm"
    floor = "gemm"
    pairwise_matrices = 5
    reference: ClassVar[str] = (
        "Y. Allouah, S. Farhadkhani, R. Guerraoui, N. Gupta, R. Pinot, J. Stephan, 'Fixing by Mixing: A Recipe for "
        "Optimal Byzantine ML under Heterogeneity', AISTATS 2023, Algorithm 1 (nearest neighbor mixing)"
    )
    requirement = "n > 2f"

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, **context: Any) -> tuple[Tensor, Tensor]:
        xc = as_compute_dtype(x)
        dist = pairwise_sqdist(xc)
        m = nnm_matrix(dist, self.f).to(x.device)
        bad = ~torch.isfinite(dist.diagonal())
        # No bad row: one matrix product. Otherwise the product skips the bad rows (blocks of good rows).
        y = mix_rows(m, xc, bad) if bool(bad.any()) else m.to(xc.dtype) @ xc
        return y.to(x.dtype), m
