"""Neurotoxin: the backdoored update lives on the coordinates the last global update changed least; resumes bit for
bit (its mask comes from the checkpointed previous aggregate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _backdoor_cfg import FED
from _interrupt import train_interrupted
from phalanx import attacks
from phalanx.attacks.neurotoxin import rarely_used
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config, store, train
from phalanx.training import BoundRule, Loop


def test_the_mask_keeps_the_smallest_coordinates_of_the_last_update() -> None:
    previous = torch.tensor([0.5, -3.0, 0.1, 2.0, 0.0])
    assert rarely_used(previous, 60.0).tolist() == [True, False, True, False, True]
    assert rarely_used(previous, 100.0).all() and int(rarely_used(previous, 1.0).sum()) == 1
    nt = attacks.make("neurotoxin", keep=60.0)
    rows = torch.ones(2, 5)
    out = nt.update(rows.clone(), previous)
    assert torch.equal(out, torch.tensor([[1.0, 0.0, 1.0, 0.0, 1.0]] * 2))
    assert torch.equal(nt.update(rows.clone(), None), rows)  # the first round: nothing to mask by
    bounded = attacks.make("neurotoxin", keep=100.0, norm_bound=1.0).update(rows.clone(), previous)
    torch.testing.assert_close(torch.linalg.vector_norm(bounded, dim=1), torch.ones(2))


def test_in_a_federated_round_the_byzantine_updates_avoid_the_busy_coordinates() -> None:
    exp = from_config(make_config({**FED, "attack": "neurotoxin", "attack_params": {"keep": 80.0}}))
    loop = Loop(exp)
    loop.step()
    previous = loop.state.previous
    assert previous is not None
    workers = loop.transport.workers
    assert workers is not None
    got = workers.round(loop.state.theta, 1, BoundRule(lambda x: x.mean(0), {}, previous))
    assert got.rows is not None
    byz = torch.tensor([r >= exp.honest for r in got.rows])
    busy = ~rarely_used(previous, 80.0)
    assert bool(byz.any()) and bool((got.vectors[byz][:, busy] == 0).all())
    assert bool((got.vectors[~byz][:, busy] != 0).any())  # the honest clients' updates are not masked


def test_bad_parameters_and_where_it_cannot_run() -> None:
    for keep in (0.0, -1.0, 100.5):
        with pytest.raises(ConfigError, match="keep"):
            attacks.make("neurotoxin", keep=keep)
    with pytest.raises(ConfigError, match="norm_bound"):
        attacks.make("neurotoxin", norm_bound=0.0)
    dsgd = {k: v for k, v in FED.items() if k not in ("algorithm", "clients_per_round", "local_steps")}
    with pytest.raises(ConfigError, match="shape a federated client's update"):
        make_config({**dsgd, "attack": "neurotoxin"})


def test_a_neurotoxin_run_with_a_stop_round_resumes_bit_for_bit(tmp_path: Path) -> None:
    cfg = {**FED, "attack": "neurotoxin", "attack_params": {"stop_round": 6}}
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 4)
    train(make_config(cfg), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = store.read_rows(full)
    assert rows == store.read_rows(part)
    assert [r["rounds_since_stop"] for r in rows] == [None, None, None, 0, 2]
    assert all("attack_success" in r for r in rows)
