"""Norm-bounded model replacement: the boosted update projected onto the ball the defence clips to."""

from __future__ import annotations

import pytest
import torch

from _backdoor_cfg import FED
from phalanx import aggregators, attacks
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config
from phalanx.training import Loop


def test_the_update_is_boosted_then_projected_onto_the_ball() -> None:
    mr = attacks.make("replacement", boost=10.0, norm_bound=2.0)
    rows = torch.tensor([[0.3, 0.4], [0.01, 0.0]], dtype=torch.float64)
    out = mr.update(rows.clone(), None)
    torch.testing.assert_close(out[0], torch.tensor([1.2, 1.6], dtype=torch.float64))  # ‖10·[.3,.4]‖ = 5 → 2
    torch.testing.assert_close(out[1], torch.tensor([0.1, 0.0], dtype=torch.float64))  # inside: boosted only
    clip = aggregators.make("clip(threshold=2.0)>mean", f=0)
    torch.testing.assert_close(clip(out), out.mean(0))  # the clipping leaves it as it is


def test_in_a_federated_round_the_byzantine_updates_have_the_bound_as_norm() -> None:
    exp = from_config(make_config({**FED, "attack": "replacement", "attack_params": {"boost": 50.0,
                                                                                    "norm_bound": 0.5}}))
    loop = Loop(exp)
    loop.open()
    workers = loop.transport.workers
    assert workers is not None
    got = workers.round(exp.problem.initial_theta(), 0, lambda x: x.mean(0))
    assert got.rows is not None
    byz = torch.tensor([r >= exp.honest for r in got.rows])
    norms = torch.linalg.vector_norm(got.vectors, dim=1)
    torch.testing.assert_close(norms[byz], torch.full((int(byz.sum()),), 0.5))


def test_bad_parameters_and_dsgd_are_refused() -> None:
    with pytest.raises(ConfigError, match="norm_bound"):
        attacks.make("replacement", norm_bound=0.0)
    with pytest.raises(ConfigError, match="boost"):
        attacks.make("replacement", boost=-1.0)
    dsgd = {k: v for k, v in FED.items() if k not in ("algorithm", "clients_per_round", "local_steps")}
    with pytest.raises(ConfigError, match="boost"):
        make_config({**dsgd, "attack": "replacement"})
    with pytest.raises(ConfigError, match="shape a federated client's update"):
        make_config({**dsgd, "attack": "replacement", "attack_params": {"boost": 1.0}})
