"""Comparative Gradient Elimination (Gupta, Liu & Vaidya 2020; Liu, Gupta & Vaidya, PODC 2021): drop the f longest
rows and average the rest."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import smallest_norms_keys, weighted_sum
from phalanx.aggregators.base import Aggregator, RuleTags, as_compute_dtype
from phalanx.aggregators.registry import register

__all__ = ["CGE", "cge_weights"]


def cge_weights(norms: Tensor, f: int) -> Tensor:
    r"""CGE's weights, float64 ``(n,)``: :math:`1/(n-f)` on the :math:`n - f` rows of smallest norm.

    Rows whose norm ties with the :math:`(n-f)`-th smallest share the places left at that norm equally (a tie
    decided by data, not by row order: the weights do not depend on the order of the rows). ``norms`` is
    float64 with ``+inf`` on bad rows, which therefore come last.
    """
    n = norms.shape[0]
    keep = n - f
    key = torch.nan_to_num(norms, nan=float("inf"))
    cut = torch.sort(key).values[keep - 1]
    below = key < cut
    at = key == cut
    left = keep - int(below.sum())
    w = below.to(torch.float64) + at.to(torch.float64) * (left / max(int(at.sum()), 1))
    return w / keep


@register
class CGE(Aggregator):
    r"""Comparative Gradient Elimination: the mean of the :math:`n - f` rows of smallest Euclidean norm.

    .. math::
        \|x_{(1)}\| \le \dots \le \|x_{(n)}\|, \qquad
        \mathrm{CGE}(x) = \frac{1}{n - f} \sum_{j=1}^{n-f} x_{(j)}.

    N. Gupta, S. Liu, N. H. Vaidya, "Byzantine fault-tolerant distributed machine learning using stochastic
    gradient descent (SGD) and norm-based comparative gradient elimination (CGE)", arXiv:2008.04699 (2020), and
    S. Liu, N. Gupta, N. H. Vaidya, "Approximate Byzantine fault-tolerance in distributed optimization", PODC 2021
    (the CGE gradient filter). The papers' server steps along the *sum* of the kept gradients; the rule returns
    their mean (the sum divided by the constant :math:`n - f`, which the learning rate absorbs), so that
    :math:`n` identical rows give that row.

    Rows tied in norm with the :math:`(n-f)`-th smallest share the remaining places equally
    (:func:`cge_weights`), so the output does not depend on the order of the rows. Norms are summed in float64
    (the same decision for a float32 and a float64 copy of an input). A bad row (NaN/Inf, or a norm that
    overflows) has an infinite norm and is dropped first. Requires :math:`n > 2f` (an honest majority; the papers'
    resilience guarantee asks more, a bound on f/n set by the costs' smoothness and strong convexity).
    Contributions: :math:`1/(n-f)` on the kept rows (tied rows: their shares). ε and κ: not known; ``None``.
    """

    name: ClassVar[str] = "cge"
    reference: ClassVar[str] = (
        "N. Gupta, S. Liu, N. H. Vaidya, 'Byzantine fault-tolerant distributed machine learning using SGD and "
        "norm-based comparative gradient elimination (CGE)', arXiv:2008.04699, 2020; S. Liu, N. Gupta, "
        "N. H. Vaidya, 'Approximate Byzantine fault-tolerance in distributed optimization', PODC 2021"
    )
    requirement = "n > 2f"
    tags = RuleTags(translation=False)  # norms are measured from the origin

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        xc = as_compute_dtype(x)
        keys, bad = smallest_norms_keys(xc, x.shape[0] - self.f, exact_cut=False)  # only compared
        weights = cge_weights(keys, self.f)
        out = weighted_sum(weights, xc, bad)
        return out.to(x.dtype), (weights if want_contributions else None)
