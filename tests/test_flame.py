"""FLAME (Nguyen et al., USENIX Security 2022): its clustering step against scikit-learn's HDBSCAN with the
paper's settings, the clipping to the median norm, the noise drawn from the caller's generator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx import aggregators
from phalanx.aggregators.flame import FLAME, cosine_distances, majority_cluster
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config, store, train
from phalanx.testing import check_aggregator


def _case(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(3, 40, (1,), generator=g))
    x = torch.randn(n, 8, generator=g, dtype=torch.float64)
    if seed % 3 == 1:  # a planted majority around one direction
        x[: n // 2 + 2] = torch.randn(1, 8, generator=g, dtype=torch.float64) + 0.3 * x[: n // 2 + 2]
    if seed % 3 == 2:  # integer rows: many equal distances
        x = x.round()
    return x


@pytest.mark.parametrize("seed", range(60))
def test_the_cluster_is_hdbscans_with_the_papers_settings(seed: int) -> None:
    """The paper runs the hdbscan library with min_samples = 1, which scikit-learn (counting the point itself)
    spells min_samples = 2."""
    cluster = pytest.importorskip("sklearn.cluster")
    x = _case(seed)
    n = x.shape[0]
    dist = cosine_distances(x, torch.zeros(n, dtype=torch.bool))
    ref = cluster.HDBSCAN(metric="precomputed", min_cluster_size=n // 2 + 1, min_samples=2,
                          allow_single_cluster=True, copy=True).fit(dist.numpy()).labels_
    assert majority_cluster(dist).tolist() == (ref == 0).tolist()


def test_cosine_distances_and_bad_rows() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0], [float("nan"), 1.0]])
    bad = torch.tensor([False, False, False, False, True])
    d = cosine_distances(x, bad)
    torch.testing.assert_close(d[:3, :3], torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]],
                                                       dtype=torch.float64))
    assert (d[3, :3] == 1).all() and torch.isinf(d[4]).all() and torch.isinf(d[:, 4]).all()


def test_a_colluding_minority_is_left_out_and_the_rest_clipped_to_the_median_norm() -> None:
    g = torch.Generator().manual_seed(0)
    honest = torch.randn(1, 50, generator=g) + 0.5 * torch.randn(7, 50, generator=g)
    honest[0] *= 10.0  # an honest row with a large norm: admitted, clipped
    backdoor = torch.randn(1, 50, generator=g).repeat(3, 1) * 2.0  # far in direction from the honest rows
    x = torch.cat([honest, backdoor])
    gen = torch.Generator().manual_seed(5)
    out, share = FLAME(f=3, noise=0.01).aggregate(x, generator=gen)
    kept = share > 0
    assert not kept[7:].any() and int(kept.sum()) >= 10 // 2 + 1 and bool(kept[0])  # more than half: honest only
    assert torch.allclose(share[kept], torch.full((int(kept.sum()),), 1 / int(kept.sum()), dtype=torch.float64))
    torch.testing.assert_close(kept, majority_cluster(cosine_distances(x, torch.zeros(10, dtype=torch.bool))))
    norms = x.norm(dim=1)
    med = norms.sort().values[4:6].mean()  # n = 10: the mean of the two middle norms
    clipped = x[kept] * torch.clamp(med / norms[kept], max=1.0)[:, None]
    assert clipped[0].norm() == pytest.approx(float(med), rel=1e-5)  # the large honest row, clipped
    z = torch.randn(50, generator=torch.Generator().manual_seed(5), dtype=torch.float64).float()
    torch.testing.assert_close(out, clipped.mean(0) + 0.01 * med * z, rtol=1e-5, atol=1e-5)


def test_noise_comes_from_the_callers_generator_and_is_deterministic() -> None:
    x = torch.randn(9, 20, generator=torch.Generator().manual_seed(1))
    rule = FLAME(f=2)
    own = rule._generator.get_state()
    a = rule(x, generator=torch.Generator().manual_seed(3))
    b = rule(x, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and torch.equal(rule._generator.get_state(), own)
    assert not torch.equal(a, rule(x, generator=torch.Generator().manual_seed(4)))
    assert torch.equal(FLAME(f=2, seed=7)(x), FLAME(f=2, seed=7)(x))  # stand-alone: its own seeded stream


@pytest.mark.parametrize("params, key", [({"noise": 0}, "noise"), ({"noise": -1.0}, "noise"),
                                         ({"noise": float("nan")}, "noise"), ({"seed": -1}, "seed")])
def test_bad_parameters_are_refused(params: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        aggregators.make("flame", f=1, **params)


def test_majority_cluster_refuses_a_size_that_allows_two_clusters() -> None:
    with pytest.raises(ConfigError, match="min_cluster_size"):
        majority_cluster(torch.zeros(6, 6, dtype=torch.float64), min_cluster_size=3)


def test_passes_the_property_checks() -> None:
    check_aggregator("flame", trials=12)


def test_from_toml() -> None:
    cfg = make_config({"dataset": "digits", "model": "mlp", "model_params": {"hidden": [8]}, "workers": 10,
                       "byzantine": 2, "f": 2, "aggregator": "flame(noise=0.01)", "algorithm": "fedavg",
                       "clients_per_round": 8, "rounds": 2, "attack": "backdoor"})
    rule = from_config(cfg).rule
    assert isinstance(rule, FLAME) and rule.noise == 0.01


@pytest.mark.parametrize("spec", ["flame", "rlr(threshold=2)"])
def test_a_resumed_fedavg_run_equals_an_uninterrupted_one(spec: str, tmp_path: Path) -> None:
    """FLAME's noise comes from the server's checkpointed aggregator stream: a federated run interrupted at its
    round-4 checkpoint and resumed ends bit for bit where the uninterrupted one does (RLR beside it)."""
    cfg = {"algorithm": "fedavg", "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]},
           "workers": 12, "clients_per_round": 5, "local_steps": 2, "byzantine": 3, "f": 1, "aggregator": spec,
           "attack": "backdoor", "rounds": 8, "batch_size": 8, "lr": 0.05, "eval_every": 4, "checkpoint_every": 4,
           "seed": 3}
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 4)
    train(make_config(cfg), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["test_accuracy"] for r in store.read_rows(full)] == [r["test_accuracy"] for r in store.read_rows(part)]
