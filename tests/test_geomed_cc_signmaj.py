"""Geometric median, centered clipping and sign majority."""

from __future__ import annotations

import pytest
import torch

from phalanx import aggregators
from phalanx.errors import ConfigError


def _geomed_objective(z: torch.Tensor, x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x.double() - z.double(), dim=1).sum())


def test_geomed_is_a_minimum_of_the_objective() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, 5, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 2, 3, 4, 5], dtype=torch.float64)
    z = aggregators.make("geomed", f=2, tol=1e-12, max_iter=5000)(x)
    best = _geomed_objective(z, x)
    for _ in range(200):  # no nearby point does better
        probe = z + 1e-3 * torch.randn(5, generator=gen, dtype=torch.float64)
        assert _geomed_objective(probe, x) >= best - 1e-9


def test_geomed_collinear_odd_is_the_median_point() -> None:
    x = torch.tensor([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]], dtype=torch.float64)
    z = aggregators.make("geomed", f=1, tol=1e-12, max_iter=10_000)(x)
    assert torch.allclose(z, torch.tensor([1.0, 1.0], dtype=torch.float64), atol=1e-5)


def test_geomed_ignores_bad_rows_and_reports_weights() -> None:
    gen = torch.Generator().manual_seed(2)
    honest = torch.randn(8, 6, generator=gen)
    x = torch.cat([honest, torch.full((1, 6), float("nan")), torch.full((1, 6), 1e38), torch.full((1, 6), -1e38)])
    out, c = aggregators.make("geomed", f=3).aggregate(x)
    ref = aggregators.make("geomed", f=3)(honest)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, ref, atol=1e-5)
    assert (c[8:] == 0).all()
    assert c.sum().item() == pytest.approx(1.0)
    assert torch.allclose((c[:8, None].float() * honest).sum(0), out, atol=1e-5)


def test_geomed_validates_parameters() -> None:
    with pytest.raises(ConfigError, match="tol"):
        aggregators.make("geomed", f=1, tol=0)
    with pytest.raises(ConfigError, match="max_iter"):
        aggregators.make("geomed", f=1, max_iter=2.5)


def test_cc_hand_example() -> None:
    # centre 0, tau 1: (3, 4) (norm 5) is clipped to (0.6, 0.8); (0, 0.5) and (0, 0) are kept; mean over n = 3
    x = torch.tensor([[3.0, 4.0], [0.0, 0.5], [0.0, 0.0]])
    out, c = aggregators.make("cc", f=1, tau=1.0, center="zero").aggregate(x)
    assert torch.allclose(out, torch.tensor([0.6 / 3, 1.3 / 3]), atol=1e-6)
    assert c[0].item() == pytest.approx(0.2 / 3)  # weight 1/5 clipping, / n
    assert c[1].item() == pytest.approx(1 / 3)


def test_cc_is_stateless_and_takes_a_centre_per_call() -> None:
    rule = aggregators.make("cc", f=1, tau=0.5, iterations=3)
    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(rule(x), rule(x))
    centre = torch.ones(4)
    moved = rule(x, center=centre)
    assert not torch.allclose(moved, rule(x))
    with pytest.raises(ConfigError, match="center"):
        rule(x, center=torch.ones(3))
    with pytest.raises(ConfigError, match="center"):
        rule(x, center=torch.full((4,), float("nan")))
    with pytest.raises(ConfigError, match="center"):
        aggregators.make("cc", f=1, center="mean")


def test_cc_survives_garbage() -> None:
    x = torch.randn(10, 5, generator=torch.Generator().manual_seed(4))
    x[0] = float("nan")
    x[1] = float("inf")
    x[2] = 1e38
    out = aggregators.make("cc", f=3, tau=1.0, iterations=5)(x)
    assert torch.isfinite(out).all()
    assert float(torch.linalg.vector_norm(out - x[3:].mean(0))) < 1.0


def test_signmaj() -> None:
    x = torch.tensor([[1.0, -2.0, 0.0, float("nan")], [3.0, -1.0, 1.0, 1.0], [-5.0, 4.0, -1.0, float("inf")]])
    out, c = aggregators.make("signmaj", f=1).aggregate(x)
    assert out.tolist() == [1.0, -1.0, 0.0, 1.0]
    # agreement with non-zero majority: row0: cols 0,1 -> 2; row1: 0,1,3 -> 3; row2: col 3 -> 1
    assert torch.allclose(c, torch.tensor([2 / 6, 3 / 6, 1 / 6], dtype=torch.float64))


@pytest.mark.parametrize(("n", "d"), [(3, 10), (7, 9000), (300, 5000)])
def test_row_distances_are_exact_even_next_to_the_centre(
    n: int, d: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # cc's distances run over reused blocks of differences: here the smallest blocks (4,096 columns, so d = 9000
    # and 5000 take several), one row a hair away from v (1e-4 per coordinate: the Gram expansion
    # ‖x‖² − 2x·v + ‖v‖² loses it to cancellation — the mutant below), and a NaN row that stays non-finite.
    from phalanx.aggregators import _numerics
    from phalanx.aggregators._numerics import row_distances

    monkeypatch.setattr(_numerics, "DISTANCE_CHUNK_BYTES", 1)
    monkeypatch.setattr(_numerics, "DISTANCE_CHUNK_BYTES_THREADED", 1)

    g = torch.Generator().manual_seed(n)
    v = torch.randn(d, generator=g) * 100
    x = torch.randn(n, d, generator=g)
    x[0] = v + 1e-4
    x[-1, d // 2] = float("nan")
    exact = (x.double() - v.double()).norm(dim=1)
    got = row_distances(x, v)
    torch.testing.assert_close(got[:-1], exact[:-1], rtol=1e-5, atol=0)
    assert not torch.isfinite(got[-1])
    gram = (x.square().sum(1) - 2 * (x @ v) + v.square().sum()).clamp_min(0).sqrt().double()
    assert not torch.allclose(gram[0], exact[0], rtol=1e-2, atol=0)
