"""RLR (Ozdayi, Kantarcioglu & Gel, AAAI 2021): the sign-agreement learning rate, coordinate by coordinate."""

from __future__ import annotations

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators.rlr import RobustLR, sign_agreement
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config
from phalanx.testing import check_aggregator


def reference(x: torch.Tensor, theta: int) -> torch.Tensor:
    """The paper's rule written coordinate by coordinate (plain Python)."""
    n, d = x.shape
    out = torch.empty(d, dtype=torch.float64)
    for k in range(d):
        votes = sum(1 if float(v) > 0 else -1 if float(v) < 0 else 0 for v in x[:, k])
        lr = 1.0 if abs(votes) >= theta else -1.0
        out[k] = lr * float(x[:, k].double().sum()) / n
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("theta", [1, 3, 5])
def test_matches_the_coordinate_by_coordinate_definition(seed: int, theta: int) -> None:
    x = torch.randn(7, 40, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x[0, :5] = 0.0  # a zero casts no vote
    got = RobustLR(threshold=theta)(x)
    torch.testing.assert_close(got, reference(x, theta), rtol=1e-12, atol=1e-12)


def test_a_few_rows_pushing_a_coordinate_get_it_stepped_away_from() -> None:
    g = torch.Generator().manual_seed(0)
    honest = torch.randn(8, 10, generator=g)
    honest[:, 0] = 1.0  # every honest row agrees on coordinate 0
    backdoor = torch.zeros(2, 10)
    backdoor[:, 9] = 50.0  # two rows push coordinate 9, which the honest rows are indifferent about
    honest[:, 9] = torch.tensor([1.0, -1.0] * 4) * 0.01
    x = torch.cat([honest, backdoor])
    out = RobustLR(f=2)(x)  # θ = 3
    mean = x.mean(0)
    torch.testing.assert_close(out[[0, 9]], torch.stack([mean[0], -mean[9]]))
    assert out[9] < 0


def test_default_threshold_and_requirement() -> None:
    rule = aggregators.make("rlr", f=2)
    assert rule.theta == 3 and rule.min_workers() == 5
    assert aggregators.make("rlr(threshold=8)", f=2).min_workers() == 8
    assert rule.with_f(1).theta == 2  # missing workers: θ follows f unless set
    assert aggregators.make("rlr(threshold=4)", f=2).with_f(1).theta == 4
    with pytest.raises(ConfigError, match="n"):
        rule(torch.randn(4, 3))


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True])
def test_bad_threshold_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="threshold"):
        aggregators.make("rlr", f=0, threshold=bad)


def test_bad_rows_are_left_out_of_the_votes_and_the_mean() -> None:
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    with_bad = torch.cat([x, torch.full((1, 5), float("nan")), torch.full((1, 5), float("inf"))])
    out, share = RobustLR(f=2).aggregate(with_bad)
    torch.testing.assert_close(out, RobustLR(f=2)(x))
    assert share[6:].eq(0).all() and float(share.sum()) == pytest.approx(1.0)
    assert torch.equal(sign_agreement(with_bad, torch.tensor([True] * 6 + [False] * 2)),
                       sign_agreement(x, torch.ones(6, dtype=torch.bool)))


def test_passes_the_property_checks() -> None:
    check_aggregator("rlr", trials=12)


def test_from_toml() -> None:
    cfg = make_config({"dataset": "digits", "model": "mlp", "model_params": {"hidden": [8]}, "workers": 10,
                       "byzantine": 2, "f": 2, "aggregator": "rlr(threshold=4)", "algorithm": "fedavg",
                       "clients_per_round": 8, "rounds": 2, "attack": "backdoor"})
    rule = from_config(cfg).rule
    assert isinstance(rule, RobustLR) and rule.theta == 4 and rule.f == 2
