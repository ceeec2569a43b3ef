"""Bulyan (El Mhamdi, Guerraoui & Rouault, ICML 2018): iterative Krum selection, then a coordinate-wise mean."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._numerics import pairwise_sqdist
from phalanx.aggregators.base import Aggregator, as_compute_dtype
from phalanx.aggregators.coordinatewise import coordinate_window_mean
from phalanx.aggregators.krum import krum_scores
from phalanx.aggregators.registry import register

__all__ = ["Bulyan", "bulyan_selection"]


def bulyan_selection(sqdist: Tensor, f: int, theta: int) -> list[int]:
    """Bulyan's selection phase: ``theta`` row indices chosen one at a time by Krum, in the order chosen.

    Each step runs Krum with the same ``f`` on the ``r`` rows not yet selected (scores from the ``r − f − 2`` nearest
    remaining rows, but at least 1 while another row remains; recomputed from the same distance matrix, see
    :func:`~phalanx.aggregators.krum.krum_scores`), moves the winner into the selection and removes it from the
    remaining rows. A bad row has an infinite score at every step.

    Ties: with one neighbour both rows of the closest remaining pair always have the same score, so an index-based
    tie-break would make the selection depend on the order of the workers. Tied rows are therefore compared on
    their next-nearest distances (the sorted distances to the remaining rows, one after the other), and only rows
    that are still tied go to the smallest index.
    """
    d = sqdist.detach().to(device="cpu", dtype=torch.float64)
    remaining = list(range(d.shape[0]))
    selected: list[int] = []
    for _ in range(theta):
        r = len(remaining)
        idx = torch.tensor(remaining)
        sub = d[idx][:, idx]
        k = min(max(1, r - f - 2), r - 1)
        scores = krum_scores(sub, k)
        tied = torch.nonzero(scores == scores.min()).flatten()
        if tied.numel() > 1 and bool(torch.isfinite(scores.min())):
            others = sub[tied].clone()
            others[torch.arange(tied.numel()), tied] = float("inf")  # drop each row's distance to itself
            nearest = torch.sort(others, dim=1).values
            for col in range(k, r - 1):
                column = nearest[:, col]
                keep = column == column.min()
                tied, nearest = tied[keep], nearest[keep]
                if tied.numel() == 1:
                    break
        winner = remaining.pop(int(tied[0]))  # still tied: the smallest remaining index
        selected.append(winner)
    return selected


@register
class Bulyan(Aggregator):
    r"""Bulyan: select ``θ = n − 2f`` rows by iterated Krum, then average, per coordinate, the ``β = θ − 2f`` selected
    values closest to the coordinate-wise median of the selection.

    .. math::
        S = \{s_1, \dots, s_\theta\},\quad s_t = \mathrm{Krum}_f\big(\{x_i\} \setminus \{x_{s_1}, \dots,
        x_{s_{t-1}}\}\big),\qquad
        \mathrm{Bulyan}(x)_k = \frac{1}{\beta} \sum_{i \in M_k} x_{ik},

    where :math:`M_k` holds the :math:`\beta` indices :math:`i \in S` with the smallest
    :math:`|x_{ik} - \mathrm{median}_{j \in S}\, x_{jk}|`. El Mhamdi, Guerraoui & Rouault, ICML 2018, "The Hidden
    Vulnerability of Distributed Learning in Byzantium", Section 4 (Bulyan, with Krum as the selection rule A).
    Requires :math:`n \ge 4f + 3`.

    The selection is the paper's *iterative* one: each step recomputes Krum scores on the remaining rows (from one
    Gram matrix). It differs from a single Multi-Krum pass that keeps the θ best scores of the full set (Flower's
    Message-API Bulyan). The remaining set shrinks to ``r = 2f + 1`` rows at the last step, below Krum's own
    requirement ``r ≥ 2f + 3`` in the last two steps (as in the paper's iteration); where ``r − f − 2 < 1`` — the last
    step when f ≤ 1, the last two when f = 0 — the score uses 1 neighbour, as Flower's legacy ``aggregate_krum``
    does (``max(1, r − f − 2)``), so an isolated row is still not picked by index alone. Equal scores are resolved
    by the next-nearest distances before the index (see :func:`bulyan_selection`), so the result does not depend on
    the order of the workers. The coordinate-wise stage is
    :func:`~phalanx.aggregators.coordinatewise.coordinate_window_mean` in ``"meamed"`` mode with ``trim = 2f``
    (median of an even count: the midpoint of the two middle values).

    A bad row has an infinite Krum score and is never selected while at most ``f`` bad rows exist, so the
    coordinate-wise stage only sees finite rows. Contributions: each selected row's share of the coordinate-wise
    average (the θ-row contributions mapped back to the n inputs), 0 for rows not selected; they sum to 1.

    κ and ε: not verified for Bulyan in Allouah et al. (AISTATS 2023) or Yang, Shi & Li (ICML 2025): ``None``.
    """

    subnormals_as_zero = True  # subnormal arithmetic made it tens of times slower on a CPU: flush to zero (_subnormals)
    name: ClassVar[str] = "bulyan"
    floor = "gemm"
    pairwise_matrices = 5
    reference: ClassVar[str] = (
        "E. M. El Mhamdi, R. Guerraoui, S. Rouault, 'The Hidden Vulnerability of Distributed Learning in Byzantium', "
        "ICML 2018, Section 4 (Bulyan over Krum)"
    )
    requirement = "n >= 4f + 3"

    def min_workers(self) -> int:
        return 4 * self.f + 3

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n = x.shape[0]
        theta = n - 2 * self.f
        xc = as_compute_dtype(x)
        selected = bulyan_selection(pairwise_sqdist(xc), self.f, theta)
        index = torch.tensor(sorted(selected), dtype=torch.long, device=x.device)
        x_sel = xc.index_select(0, index)
        out, sel_contrib = coordinate_window_mean(x_sel, mode="meamed", trim=2 * self.f,
                                                  want_contributions=want_contributions)
        contrib = None
        if want_contributions:
            assert sel_contrib is not None
            contrib = torch.zeros(n, dtype=torch.float64, device=x.device)
            contrib[index] = sel_contrib.to(device=x.device, dtype=torch.float64)
        return out.to(x.dtype), contrib
