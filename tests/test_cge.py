"""Comparative Gradient Elimination (Gupta, Liu & Vaidya 2020; Liu, Gupta & Vaidya, PODC 2021): the n − f shortest
rows averaged, norm ties shared, bad rows dropped first."""

from __future__ import annotations

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators.cge import cge_weights
from phalanx.errors import ConfigError
from phalanx.testing import check_aggregator


@pytest.mark.parametrize("seed", range(6))
def test_the_mean_of_the_n_minus_f_shortest_rows(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n, f = 9, seed % 4
    x = torch.randn(n, 5, generator=g, dtype=torch.float64) * torch.rand(n, 1, generator=g, dtype=torch.float64)
    keep = torch.argsort(x.norm(dim=1))[: n - f]
    out, share = aggregators.make("cge", f=f).aggregate(x)
    torch.testing.assert_close(out, x[keep].mean(0), rtol=0, atol=1e-14)
    assert torch.equal(share > 0, torch.isin(torch.arange(n), keep))
    assert float(share.sum()) == pytest.approx(1.0, abs=1e-15)


def test_rows_tied_at_the_cut_share_the_places_left() -> None:
    # Norms 1, 1.5, √5, √5, √5, 3, 3 with f = 3: two places are left for the three rows of norm √5, 2/3 each.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.5], [1.0, 2.0], [2.0, 1.0], [-1.0, 2.0], [3.0, 0.0], [0.0, 3.0]])
    out, share = aggregators.make("cge", f=3).aggregate(x)
    torch.testing.assert_close(share, torch.tensor([1 / 4, 1 / 4, 1 / 6, 1 / 6, 1 / 6, 0, 0], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([0.25 + 2 / 6, 0.375 + 5 / 6]))
    torch.testing.assert_close(aggregators.make("cge", f=3)(x.flip(0)), out)  # the same rows, whatever their order


def test_bad_rows_are_dropped_first() -> None:
    x = torch.tensor([[1.0, 1.0], [float("nan"), 0.0], [2.0, 0.0], [1e38, 1e38], [0.5, 0.0]])
    out, share = aggregators.make("cge", f=2).aggregate(x)
    torch.testing.assert_close(out, torch.tensor([3.5 / 3, 1.0 / 3]))
    assert share[1] == 0 and share[3] == 0
    w = cge_weights(torch.tensor([1.0, float("inf"), float("nan"), 2.0], dtype=torch.float64), 2)
    torch.testing.assert_close(w, torch.tensor([0.5, 0.0, 0.0, 0.5], dtype=torch.float64))


def test_requirement_and_properties() -> None:
    assert aggregators.make("cge", f=3).min_workers() == 7
    with pytest.raises(ConfigError, match="n >= 7"):
        aggregators.make("cge", f=3)(torch.randn(6, 2))
    check_aggregator("cge", trials=12)
