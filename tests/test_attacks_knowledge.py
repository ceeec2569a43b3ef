"""attack_knowledge: an omniscient attack sees every honest vector; colluders see only the Byzantine workers' own
honest computations (never an honest worker's vector), deterministically and bit for bit across a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx import attacks
from phalanx.attacks import Attack, AttackContext
from phalanx.attacks.optimal import surrogate
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config, store, train
from phalanx.training import Loop
from phalanx.training.streams import generator

DSGD: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 9, "byzantine": 3, "f": 3,
    "aggregator": "cwtm", "attack": "alie", "rounds": 8, "batch_size": 8, "lr": 0.1, "eval_every": 4,
    "checkpoint_every": 4, "seed": 1, "partition": "dirichlet", "alpha": 1.0,
}
FED: dict[str, Any] = {**DSGD, "algorithm": "fedavg", "clients_per_round": 7, "local_steps": 2, "lr": 0.05,
                       "momentum": 0.0}


class Recorder(Attack):
    """Sends the mean of what it sees and records every context."""

    name: ClassVar[str] = "recorder"
    reference: ClassVar[str] = "test double"

    def __init__(self) -> None:
        self.seen: list[AttackContext] = []

    def params(self) -> dict[str, Any]:
        return {}

    def _run(self, ctx: AttackContext) -> torch.Tensor:
        self.seen.append(AttackContext(ctx.honest.clone(), ctx.n_byzantine, ctx.f, None, ctx.generator, ctx.round,
                                       ctx.workers, ctx.knowledge))
        return ctx.honest.mean(0, keepdim=True).repeat(ctx.n_byzantine, 1)


def recorded(cfg_data: dict[str, Any], knowledge: str) -> tuple[Recorder, Any]:
    exp = from_config(make_config({**cfg_data, "attack_knowledge": knowledge}))
    recorder = Recorder()
    exp.attack = recorder
    return recorder, exp


def rows_in(rows: torch.Tensor, among: torch.Tensor) -> list[bool]:
    """For each row of ``rows``: whether it equals some row of ``among``."""
    return [bool((among == r).all(1).any()) for r in rows]


def test_dsgd_colluders_see_their_own_honest_momentum_and_no_honest_workers() -> None:
    recorder, exp = recorded(DSGD, "colluders")
    loop = Loop(exp)
    loop.open()
    h, b = exp.honest, exp.byzantine
    honest_run = from_config(make_config({**DSGD, "attack": "none", "byzantine": 0}))
    reference = Loop(honest_run)
    reference.step()  # round 0 from the same θ₀ and batch draws: every worker honest
    assert reference.state.momentum is not None
    for t in range(4):
        loop.step()
        ctx, state = recorder.seen[t], loop.state
        assert state.momentum is not None
        assert ctx.knowledge == "colluders" and ctx.n_honest == b and ctx.n_workers == exp.workers
        own, honest = state.momentum[h:], state.momentum[:h]
        torch.testing.assert_close(ctx.honest, own, rtol=0, atol=0)  # their own honest rows, kept as momentum
        assert not any(rows_in(ctx.honest, honest))  # no honest worker's vector
        if t == 0:  # what they compute is what honest workers with their shards would send
            torch.testing.assert_close(ctx.honest, reference.state.momentum[h:], rtol=0, atol=0)


def test_dsgd_omniscient_sees_every_honest_vector() -> None:
    recorder, exp = recorded(DSGD, "omniscient")
    loop = Loop(exp)
    loop.step()
    ctx = recorder.seen[0]
    assert loop.state.momentum is not None
    assert ctx.knowledge == "omniscient" and ctx.n_honest == exp.honest and ctx.workers is None
    torch.testing.assert_close(ctx.honest, loop.state.momentum[: exp.honest], rtol=0, atol=0)


def test_fedavg_colluders_see_only_the_sampled_byzantine_clients_own_updates() -> None:
    recorder, exp = recorded(FED, "colluders")
    honest_exp = from_config(make_config({**FED, "attack": "none", "byzantine": 0}))
    streams = {name: generator(exp.seed, name).get_state() for name in ("batches", "attack", "clients")}
    workers = exp.algorithm.all_workers(exp, streams, None)
    everyone = honest_exp.algorithm.all_workers(honest_exp, streams, None)
    theta = exp.problem.initial_theta()
    for t in range(4):
        got = workers.round(theta, t, lambda x: x.mean(0))
        ref = everyone.round(theta, t, lambda x: x.mean(0))  # the same sample and batches, every client honest
        assert got.rows == ref.rows and got.rows is not None
        byz = torch.tensor([r >= exp.honest for r in got.rows])
        if not bool(byz.any()):
            continue
        ctx = recorder.seen[-1]
        assert ctx.knowledge == "colluders" and ctx.n_workers == len(got.rows)
        torch.testing.assert_close(ctx.honest, ref.vectors[byz], rtol=0, atol=0)  # their own honest updates
        assert not any(rows_in(ctx.honest, ref.vectors[~byz]))  # no honest client's update
        torch.testing.assert_close(got.vectors[~byz], ref.vectors[~byz], rtol=0, atol=0)
    assert recorder.seen, "no round sampled a Byzantine client"


@pytest.mark.parametrize(("base", "attack"), [(DSGD, "alie"), (FED, "minmax"), (FED, "optimal")],
                         ids=["dsgd-alie", "fedavg-minmax", "fedavg-optimal"])
def test_colluders_resume_bit_for_bit_and_differ_from_omniscient(base: dict[str, Any], attack: str,
                                                                 tmp_path: Path) -> None:
    cfg = {**base, "attack": attack, "attack_knowledge": "colluders"}
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 4)
    train(make_config(cfg), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = store.read_rows(full)
    assert rows == store.read_rows(part) and rows[-1]["attack_knowledge"] == "colluders"
    again = train(make_config(cfg))
    assert [r["test_accuracy"] for r in again] == [r["test_accuracy"] for r in rows]  # deterministic
    omniscient = train(make_config({**cfg, "attack_knowledge": "omniscient"}))
    assert [r["test_loss"] for r in omniscient] != [r["test_loss"] for r in rows]


def test_the_default_keeps_run_ids_and_colluders_name_a_new_run() -> None:
    plain = make_config(DSGD)
    assert "attack_knowledge" not in plain.identity()
    assert make_config({**DSGD, "attack_knowledge": "omniscient"}).identity() == plain.identity()
    assert make_config({**DSGD, "attack_knowledge": "colluders"}).identity()["attack_knowledge"] == "colluders"


@pytest.mark.parametrize(("change", "match"), [
    ({"attack": "nan"}, r"attack_knowledge='colluders' is invalid: allowed 'omniscient' with attack 'nan'"),
    ({"attack": "gaussian"}, "reads no honest vector"),
    ({"attack": "backdoor"}, "reads no honest vector"),
    ({"algorithm": "gossip", "graph": "complete", "momentum": 0.0}, "attack_knowledge"),
    ({"engine": "torchrun"}, r"'omniscient' with engine = 'torchrun'"),
    ({"algorithm": "scaffold", "algorithm_params": {"clients_per_round": 7}}, "attack_knowledge"),
    ({"attack_knowledge": "partial"}, "attack_knowledge"),
])
def test_where_the_distinction_does_not_exist_colluders_are_refused(change: dict[str, Any], match: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=match):
        make_config({**DSGD, "attack_knowledge": "colluders", **change})


def test_gaussian_around_the_mean_reads_the_honest_vectors() -> None:
    assert attacks.make("gaussian", center="mean").reads_honest
    assert not attacks.make("gaussian").reads_honest and not attacks.make("inf").reads_honest
    make_config({**DSGD, "attack": "gaussian", "attack_params": {"center": "mean"}, "attack_knowledge": "colluders"})


def test_alie_uses_the_servers_n_and_optimal_a_full_size_surrogate() -> None:
    own = torch.randn(2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ctx = AttackContext(own, 2, 2, None, torch.Generator().manual_seed(0), workers=9, knowledge="colluders")
    assert ctx.n_workers == 9
    z = attacks.alie_z_max(9, 2)
    torch.testing.assert_close(attacks.make("alie")(ctx)[0], own.mean(0) - z * own.std(0))
    population = surrogate(own, 7)
    assert population.shape == (7, 5) and torch.equal(population[2], own[0]) and torch.equal(population[3], own[1])
    seen: list[int] = []
    ctx.aggregator = lambda x: (seen.append(x.shape[0]), x.mean(0))[1]
    attacks.make("optimal", evaluations=2)(ctx)
    assert set(seen) == {9}  # the rule sees as many vectors as the server will
    with pytest.raises(ConfigError, match="workers"):
        AttackContext(own, 2, 2, None, torch.Generator(), workers=2)
    with pytest.raises(ConfigError, match="knowledge"):
        AttackContext(own, 2, 2, None, torch.Generator(), knowledge="some")
