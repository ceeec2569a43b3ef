# examples/plugins/mylab/rules.py
"""A robust rule of one's own: median of means."""

import torch

from phalanx.aggregators import RuleTags


class MedianOfMeans:
    """Split the n rows into 2f + 1 groups (in order), average each group, take the coordinate-wise median of the
    group means. A Byzantine row spoils at most one group, so up to f of them leave a majority of clean means.
    (Lugosi & Mendelson, "Mean estimation and regression under heavy-tailed distributions", 2019.)

    Phalanx asks two things of a rule: a constructor that takes f, and a call that maps (n, d) to (d,).
    """

    reference = "Lugosi & Mendelson, Found. Comput. Math. 2019 (median-of-means)"
    requirement = "n >= 2f + 1"
    tags = RuleTags(permutation=False)  # the groups follow the order of the rows

    def __init__(self, f: int = 0, groups: int | None = None) -> None:
        self.f = f
        self.groups = groups or 2 * f + 1

    def min_workers(self) -> int:
        return self.groups

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        means = torch.stack([chunk.mean(dim=0) for chunk in x.tensor_split(self.groups)])
        return means.nanmedian(dim=0).values.nan_to_num(0.0, 0.0, 0.0)
