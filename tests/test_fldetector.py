"""FLDetector (Zhang, Cao, Jia & Gong, KDD 2022): the L-BFGS product (compact form), exact 1-D k-means and the gap
statistic, detection on a simulated quadratic problem (attackers flagged, honest clients not), the per-client state
with client sampling, and a resumed FedAvg run with sampled clients equal to an uninterrupted one bit for bit."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx import aggregators
from phalanx.aggregators.fldetector import FLDetector, gap_clusters, kmeans_1d, lbfgs_product
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, store, train
from phalanx.testing import check_aggregator


def _pairs(h: torch.Tensor, m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.randn(m, h.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return s, s @ h  # y_k = H s_k (a quadratic: exact curvature pairs)


def test_lbfgs_meets_the_secant_condition_and_is_exact_for_a_multiple_of_the_identity() -> None:
    h = torch.diag(torch.linspace(0.5, 3.0, 6)).double()
    s, y = _pairs(h, 3, 0)
    torch.testing.assert_close(lbfgs_product(s, y, s[-1:]), y[-1:], rtol=1e-10, atol=1e-10)
    v = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    s2, y2 = _pairs(2.5 * torch.eye(6, dtype=torch.float64), 3, 2)
    torch.testing.assert_close(lbfgs_product(s2, y2, v), 2.5 * v, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scale", [1e-3, -0.05, 7.0])
def test_lbfgs_does_not_depend_on_the_unit_of_the_steps(scale: float) -> None:
    h = torch.diag(torch.linspace(0.5, 3.0, 6)).double() + 0.1
    s, y = _pairs(h, 4, 5)
    v = torch.randn(2, 6, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    torch.testing.assert_close(lbfgs_product(scale * s, y, scale * v), lbfgs_product(s, y, v), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("d", [33, 1210, 4099])
def test_lbfgs_does_not_depend_on_where_its_operands_sit_in_memory(d: int) -> None:
    """The pairs and the vectors given as slices at every float offset of one buffer (the pair table of a run is
    the tail of a concatenation; after a resume it is a fresh tensor read from the checkpoint) give the bits their
    fresh copies give. The CPU BLAS of the AVX2 machines picks its dot-product kernel by the address alignment (a
    version without the copies in ``lbfgs_product`` failed here at 12 of 16 offsets, and failed the resume test
    below)."""
    gen = torch.Generator().manual_seed(d)
    for offset in range(16):
        buffer = torch.randn(9 * d + offset, generator=gen)
        s, y, v = (buffer[offset + a * d: offset + b * d].view(-1, d) for a, b in ((0, 2), (2, 4), (4, 9)))
        assert torch.equal(lbfgs_product(s, y, v), lbfgs_product(s.clone(), y.clone(), v.clone())), offset


def _brute_kmeans(a: list[float], k: int) -> float:
    a = sorted(a)
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(a)), k - 1):
        edges = [0, *cuts, len(a)]
        cost = 0.0
        for lo, hi in itertools.pairwise(edges):
            part = torch.tensor(a[lo:hi], dtype=torch.float64)
            cost += float(((part - part.mean()) ** 2).sum())
        best = min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(5))
def test_one_dimensional_kmeans_is_the_global_optimum(seed: int) -> None:
    v = torch.rand(2, 9, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    within, split = kmeans_1d(v, 4)
    for row in range(2):
        for k in range(1, 5):
            assert float(within[row, k - 1]) == pytest.approx(_brute_kmeans(v[row].tolist(), k), abs=1e-12)
        a = torch.sort(v[row]).values
        i = int(split[row])
        two = float(((a[:i] - a[:i].mean()) ** 2).sum() + ((a[i:] - a[i:].mean()) ** 2).sum())
        assert two == pytest.approx(float(within[row, 1]), abs=1e-12)


def test_the_gap_statistic_sees_two_groups_and_not_one() -> None:
    g = torch.Generator().manual_seed(0)
    one = 1.0 + 0.05 * torch.randn(30, generator=g, dtype=torch.float64)
    two = torch.cat([one, 3.0 + 0.05 * torch.randn(6, generator=g, dtype=torch.float64)])
    assert gap_clusters(two, torch.Generator().manual_seed(1)) >= 2
    assert gap_clusters(torch.rand(30, generator=g, dtype=torch.float64), torch.Generator().manual_seed(1)) == 1
    assert gap_clusters(torch.ones(5, dtype=torch.float64), torch.Generator()) == 1


def _simulate(attack_from: int, seed: int, sampled: int | None = None, rounds: int = 40) -> FLDetector:
    """Gradient descent on a quadratic shared by 20 clients (heterogeneous optima, small noise), 4 attackers (the
    last ids) that send the negated honest mean, scaled, from round ``attack_from``."""
    d, n, byz = 30, 20, 4
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    h = torch.diag(torch.linspace(0.5, 2.0, d)).double()
    opt = 0.3 * torch.randn(n, d, generator=g, dtype=torch.float64)
    w = 3.0 * torch.randn(d, generator=g, dtype=torch.float64)
    rule = aggregators.make("fldetector", f=byz, window=5)
    assert isinstance(rule, FLDetector)
    for t in range(rounds):
        grads = (w - opt) @ h + 0.01 * torch.randn(n, d, generator=g, dtype=torch.float64)
        if t >= attack_from:
            grads[n - byz :] = -2.0 * grads[: n - byz].mean(0) + 0.5 * torch.randn(byz, d, generator=g,
                                                                                      dtype=torch.float64)
        ids = torch.arange(n) if sampled is None else torch.randperm(n, generator=g)[:sampled].sort().values
        w = w - 0.3 * rule(grads[ids], ids=ids, generator=g)
    return rule


@pytest.mark.parametrize("seed", range(4))
def test_attackers_are_flagged_and_honest_clients_are_not(seed: int) -> None:
    flagged = _simulate(10, seed).state_dict()["flagged"]
    assert flagged.nonzero().flatten().tolist() == [16, 17, 18, 19]
    assert not _simulate(10**6, seed).state_dict()["flagged"].any()


def test_flagged_clients_get_no_share() -> None:
    rule = _simulate(10, 0)
    x = torch.randn(20, 30, dtype=torch.float64)
    _, share = rule.aggregate(x, ids=torch.arange(20))
    assert float(share[16:].abs().sum()) == 0.0 and float(share[:16].sum()) == pytest.approx(1.0)


def test_with_client_sampling_the_lag_is_the_sum_of_the_aggregates_since_a_clients_last_round() -> None:
    rule = FLDetector(f=0, window=2, base="mean")
    g = torch.Generator().manual_seed(0)
    outs = []
    for ids in ([0, 1, 2], [1, 2, 3], [2, 3, 4]):
        outs.append(rule(torch.randn(3, 4, generator=g, dtype=torch.float64), ids=torch.tensor(ids)))
    lag = rule.state_dict()["lag"]
    # The next round's model is w_r − η Σ_{k ≥ r} Agg_k for a client that last sent in round r.
    torch.testing.assert_close(lag[0], outs[0] + outs[1] + outs[2], rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(lag[1], outs[1] + outs[2], rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(lag[4], outs[2], rtol=0, atol=0)
    assert rule.state_dict()["s"].shape == (2, 4)  # a pair per round after the first, the last two kept


def test_with_sampled_clients_attackers_are_flagged_and_never_more_than_f() -> None:
    """16 of 20 clients a round: the lag spans several rounds for some clients, their errors are larger, and an
    honest client is sometimes flagged too (docs/aggregators.md) — never more than f = 4 in all."""
    for seed in range(6):
        flagged = set(_simulate(10, seed, sampled=16, rounds=80).state_dict()["flagged"].nonzero().flatten().tolist())
        assert len(flagged & {16, 17, 18, 19}) >= 3 and len(flagged) <= 4, (seed, flagged)
        assert int(_simulate(10**6, seed, sampled=16, rounds=80).state_dict()["flagged"].sum()) <= 4


def test_nothing_is_scored_before_the_window_is_full() -> None:
    rule = FLDetector(f=1, window=3)
    for _ in range(4):  # pairs after rounds 1, 2, 3: the first prediction is in round 4
        rule(torch.randn(5, 3), ids=torch.arange(5))
        assert int(rule.state_dict()["count"].sum()) == 0
    rule(torch.randn(5, 3), ids=torch.arange(5))
    assert rule.state_dict()["count"].tolist() == [1] * 5


def test_state_round_trip_and_reset() -> None:
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(6, 5, generator=g) for _ in range(6)]
    one = FLDetector(f=1, window=2)
    for x in xs[:4]:
        one(x, generator=torch.Generator().manual_seed(0))
    two = FLDetector(f=1, window=2)
    two.load_state_dict(one.state_dict())
    for x in xs[4:]:
        a = one(x, generator=torch.Generator().manual_seed(0))
        assert torch.equal(a, two(x, generator=torch.Generator().manual_seed(0)))
    one.load_state_dict({})
    assert one.state_dict() == {}
    with pytest.raises(ConfigError, match="state"):
        one.load_state_dict({"last": torch.zeros(2, 2)})
    with pytest.raises(ConfigError, match="window"):
        FLDetector(f=1, window=3).load_state_dict(two.state_dict())


@pytest.mark.parametrize(("params", "key"), [({"window": 0}, "window"), ({"window": -2}, "window"),
                                             ({"window": 1.5}, "window"), ({"base": "foolsgold"}, "base"),
                                             ({"base": "nosuchrule"}, "aggregator")])
def test_bad_parameters_are_one_line_errors(params: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key) as exc:
        aggregators.make("fldetector", f=1, **params)
    assert "\n" not in str(exc.value)


def test_requirement_is_the_base_rules() -> None:
    assert aggregators.make("fldetector", f=2).min_workers() == 5
    assert aggregators.make("fldetector", f=2, base="krum").min_workers() == 7
    with pytest.raises(ConfigError, match="n >= 5"):
        aggregators.make("fldetector", f=2)(torch.randn(4, 3))


def test_passes_the_property_checks() -> None:
    check_aggregator("fldetector", trials=12)


FED: dict[str, Any] = {
    "algorithm": "fedavg", "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 12,
    "clients_per_round": 8, "local_steps": 2, "byzantine": 3, "f": 2, "aggregator": "fldetector(window=2)",
    "attack": "signflip", "rounds": 10, "batch_size": 8, "lr": 0.05, "eval_every": 5, "checkpoint_every": 5,
    "seed": 3,
}


def test_a_resumed_fedavg_run_with_sampled_clients_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    """The per-client tables, the scores, the flags and the L-BFGS pairs travel in the checkpoint (``rule.*``), and
    the gap statistic draws from the server's checkpointed stream: interrupted at its round-5 checkpoint and
    resumed, the run ends bit for bit where the uninterrupted one does."""
    cfg = make_config(FED)
    full = tmp_path / "full"
    train(cfg, full)
    part = train_interrupted(make_config(FED), tmp_path / "part", 5)
    train(make_config(FED), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {"rule.last", "rule.lag", "rule.scores", "rule.flagged", "rule.s", "rule.y"} <= set(a)
    assert int(a["rule.count"].sum()) > 0  # clients were scored after the window filled
    assert [r["test_accuracy"] for r in store.read_rows(full)] == [r["test_accuracy"] for r in store.read_rows(part)]
