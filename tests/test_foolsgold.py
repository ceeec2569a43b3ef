"""FoolsGold (Fung et al., RAID 2020) and the seam for rules that keep state across rounds: the weights against a
loop-by-loop transcription of Algorithm 1, the history per client id, the server's ids and checkpoints (a resumed
DSGD and FedAvg run equals an uninterrupted one bit for bit), attackers that leave the state alone, and the places
where a stateful rule is refused."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx import aggregators
from phalanx.aggregators.foolsgold import FoolsGold, foolsgold_weights
from phalanx.errors import ConfigError, InputError
from phalanx.experiments import from_config, make_config, store, train
from phalanx.testing import check_aggregator
from phalanx.training import BoundRule, Received, Server

SMALL: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 7, "byzantine": 1, "f": 1,
    "aggregator": "foolsgold", "attack": "signflip", "partition": "dirichlet", "alpha": 1.0, "rounds": 8,
    "batch_size": 8, "lr": 0.1, "eval_every": 4, "checkpoint_every": 4, "seed": 3,
}
FED: dict[str, Any] = {
    **SMALL, "algorithm": "fedavg", "workers": 12, "clients_per_round": 5, "local_steps": 2, "byzantine": 3,
    "attack": "backdoor", "lr": 0.05,
}


def reference_weights(h: torch.Tensor, kappa: float = 1.0) -> list[float]:
    """Algorithm 1's weights, transcribed loop by loop (the paper's pseudo-code, float64, plain Python)."""
    n = h.shape[0]
    rows = [h[i].double() for i in range(n)]
    cs = [[0.0 if i == j else float(rows[i] @ rows[j] / (rows[i].norm() * rows[j].norm())) for j in range(n)]
          for i in range(n)]
    v = [max(cs[i]) for i in range(n)]
    for i in range(n):
        for j in range(n):
            if i != j and v[i] < v[j]:
                cs[i][j] *= v[i] / v[j]
    alpha = [min(1.0, max(0.0, 1 - max(cs[i]))) for i in range(n)]
    top = max(alpha)
    alpha = [min(a / top, 0.99) for a in alpha]
    out = []
    for a in alpha:
        logit = -math.inf if a == 0 else kappa * (math.log(a / (1 - a)) + 0.5)
        out.append(min(1.0, max(0.0, logit)))
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kappa", [1.0, 0.5])
def test_weights_follow_algorithm_1(seed: int, kappa: float) -> None:
    g = torch.Generator().manual_seed(seed)
    honest = torch.randn(6, 30, generator=g, dtype=torch.float64)
    sybil = torch.randn(1, 30, generator=g, dtype=torch.float64) + 0.2 * torch.randn(3, 30, generator=g,
                                                                                    dtype=torch.float64)
    h = torch.cat([honest, sybil])
    got = foolsgold_weights(h, torch.ones(9, dtype=torch.bool), kappa)
    torch.testing.assert_close(got, torch.tensor(reference_weights(h, kappa), dtype=torch.float64), rtol=0,
                               atol=1e-12)


def test_sybils_lose_their_weight_and_honest_clients_keep_it() -> None:
    g = torch.Generator().manual_seed(0)
    rule = FoolsGold()
    target = torch.randn(30, generator=g)
    for _ in range(4):
        honest = torch.randn(6, 30, generator=g)
        sybils = target + 0.05 * torch.randn(3, 30, generator=g)
        out, share = rule.aggregate(torch.cat([honest, sybils]))
    assert (share[6:] == 0).all() and (share[:6] > 0).all()
    torch.testing.assert_close(out, (share[:6, None].float() * honest).sum(0), rtol=1e-5, atol=1e-6)
    assert float(share.sum()) <= 1.0


def test_the_history_is_the_sum_of_each_clients_good_rows_by_id() -> None:
    rule = FoolsGold()
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    rule(a, ids=torch.tensor([3, 1]))
    b = torch.tensor([[1.0, 1.0], [float("nan"), 0.0], [5.0, 0.0]])
    rule(b, ids=[3, 0, 6])
    h = rule.state_dict()["history"]
    assert h.shape == (7, 2) and h.dtype == torch.float32
    torch.testing.assert_close(h[[0, 1, 3, 6]], torch.tensor([[0.0, 0.0], [0.0, 2.0], [2.0, 1.0], [5.0, 0.0]]))
    assert not h[[2, 4, 5]].any()
    before = h
    rule(a, ids=[0, 1])
    assert torch.equal(before, h) and rule.state_dict()["history"] is not before  # replaced, never changed


def test_weights_come_from_the_histories_not_from_the_round_alone() -> None:
    """Two clients whose rounds differ but whose histories are alike are sybils to FoolsGold."""
    rule = FoolsGold()
    e = torch.eye(4)
    rule(torch.stack([e[0], e[1], e[2], e[3]]))  # four orthogonal histories
    _, share = rule.aggregate(torch.stack([e[1], e[0], e[2], e[3]]))  # clients 0 and 1 now have equal histories
    assert share[0] == 0 and share[1] == 0 and share[2] > 0 and share[3] > 0
    fresh = FoolsGold()
    assert (fresh.aggregate(torch.stack([e[1], e[0], e[2], e[3]]))[1] > 0).all()


def test_state_round_trip_and_reset() -> None:
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(5, 8, generator=g) for _ in range(3)]
    one = FoolsGold()
    for x in xs[:2]:
        one(x)
    two = FoolsGold()
    two.load_state_dict(one.state_dict())
    assert torch.equal(one(xs[2]), two(xs[2]))
    one.load_state_dict({})
    assert one.state_dict() == {}
    with pytest.raises(ConfigError, match="history"):
        one.load_state_dict({"histories": torch.zeros(2, 2)})
    with pytest.raises(ConfigError, match="state 'history'"):
        one.load_state_dict({"history": torch.zeros(2, dtype=torch.int64)})
    one(xs[0])
    with pytest.raises(InputError, match="length of the history"):
        one(torch.randn(5, 3))


@pytest.mark.parametrize("ids, match", [([0, 0, 1], "distinct"), ([0, -1, 2], "distinct"), ([0, 1], "distinct"),
                                        (torch.tensor([0.0, 1.0, 2.0]), "float")])
def test_bad_ids_are_refused_in_one_line(ids: Any, match: str) -> None:
    with pytest.raises(ConfigError, match="ids") as exc:
        FoolsGold()(torch.randn(3, 4), ids=ids)
    assert "\n" not in str(exc.value)


def test_bad_parameters_are_refused() -> None:
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(ConfigError, match="confidence"):
            aggregators.make("foolsgold", f=0, confidence=bad)


def test_passes_the_property_checks() -> None:
    check_aggregator("foolsgold", trials=12)


def test_an_attackers_calls_leave_the_servers_history_alone() -> None:
    rule = FoolsGold()
    g = torch.Generator().manual_seed(2)
    rule(torch.randn(4, 6, generator=g))
    before = rule.state_dict()["history"]
    bound = BoundRule(rule, {})
    x = torch.randn(4, 6, generator=g)
    first = bound(x)
    assert torch.equal(bound(x), first)  # the attacker sees the same history every call
    assert rule.state_dict()["history"] is before
    assert torch.equal(rule(x), first)  # ... the history the server then uses
    remote = BoundRule.from_payload(FoolsGold(), bound.payload())  # an attacker in another process
    assert torch.equal(remote(x), first)


def test_the_server_passes_the_sampled_clients_and_the_rule_for_missing_workers_continues() -> None:
    rule = FoolsGold(f=1)
    server = Server(rule, honest=10, problem=None, reference_batch=None,  # type: ignore[arg-type]
                    generator=torch.Generator())
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    server.aggregate(Received(x, rows=[2, 5, 9], state_rows=False), {}, measure=False)
    h = rule.state_dict()["history"]
    assert h.shape[0] == 10 and torch.equal(h[[2, 5, 9]], x) and not h[[0, 1, 3]].any()
    server.aggregate(Received(x[:2], rows=[2, 5], missing=[9], state_rows=False), {}, measure=True)
    torch.testing.assert_close(rule.state_dict()["history"][[2, 5]], 2 * x[:2])  # handed back by the f - 1 rule


def _assert_same_run(a: Path, b: Path) -> None:
    ta, tb = load_file(str(a / "checkpoint.safetensors")), load_file(str(b / "checkpoint.safetensors"))
    assert ta.keys() == tb.keys() and "rule.history" in ta
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    keys = ("round", "test_accuracy", "test_loss", "agg_error", "byz_share", "detection_auc")
    assert [tuple(r.get(k) for k in keys) for r in store.read_rows(a)] == \
        [tuple(r.get(k) for k in keys) for r in store.read_rows(b)]


@pytest.mark.parametrize("cfg", [SMALL, FED], ids=["dsgd", "fedavg"])
def test_a_resumed_run_equals_an_uninterrupted_one_bit_for_bit(cfg: dict[str, Any], tmp_path: Path) -> None:
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 4)
    assert "rule.history" in load_file(str(part / "checkpoint.safetensors"))
    train(make_config(cfg), part)
    _assert_same_run(full, part)


def test_a_fedavg_history_has_a_row_per_client_and_toml_parameters_reach_the_rule(tmp_path: Path) -> None:
    cfg = {**FED, "aggregator": "foolsgold(confidence=0.5)", "rounds": 4}
    exp = from_config(make_config(cfg))
    assert isinstance(exp.rule, FoolsGold) and exp.rule.confidence == 0.5
    train(make_config(cfg), tmp_path / "run")
    h = load_file(str(tmp_path / "run" / "checkpoint.safetensors"))["rule.history"]
    assert h.shape[1] == exp.problem.dim and h.shape[0] <= 12
    assert int((h.abs().sum(1) > 0).sum()) >= 5  # at least one round's sampled clients


@pytest.mark.parametrize("change, match", [
    ({"algorithm": "gossip", "graph": "complete"}, "aggregator"),
    ({"algorithm": "scaffold"}, "aggregator"),
])
def test_a_stateful_rule_is_refused_where_no_one_server_keeps_its_state(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as exc:
        from_config(make_config({**SMALL, **change}))
    assert "state" in str(exc.value) and "\n" not in str(exc.value)


def test_the_flower_strategy_refuses_a_stateful_rule() -> None:
    pytest.importorskip("flwr")
    from phalanx.flower import PhalanxFedAvg

    with pytest.raises(ConfigError, match="aggregator"):
        PhalanxFedAvg(aggregator="foolsgold")
    with pytest.raises(ConfigError, match="aggregator"):
        PhalanxFedAvg(aggregator="clip>foolsgold")


class RoundsSeen:
    """A user's own stateful rule (no Phalanx base class): the mean of the rows, scaled by 1 / (rounds seen so far),
    with a per-worker count of the rounds each worker was in — state a resumed run must carry."""

    stateful = True
    context_keys = frozenset({"ids"})

    def __init__(self, f: int = 0) -> None:
        self.f = f
        self.count = torch.zeros(0)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.count = state.get("count", torch.zeros(0))

    def __call__(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        ids = torch.arange(x.shape[0]) if ids is None else ids
        need = int(ids.max()) + 1
        count = torch.cat([self.count, torch.zeros(max(0, need - self.count.numel()))])
        self.count = count.index_add(0, ids, torch.ones(ids.numel()))
        return x.mean(0) / self.count[ids].mean().to(x.dtype)


def test_a_users_stateful_rule_gets_the_same_seam(tmp_path: Path) -> None:
    """The seam is not FoolsGold's: a user's class declaring ``stateful`` is wrapped with its state forwarded, sees
    the round's client ids and resumes bit for bit; a chain in front of a stateful rule is stateful."""

    assert sys.modules[__name__].RoundsSeen is RoundsSeen  # the spec names this module's class
    spec = f"{__name__}:RoundsSeen"
    rule = aggregators.make(spec, f=0)
    assert rule.stateful and rule.context_keys == {"ids"}
    rule(torch.ones(3, 2), ids=torch.tensor([0, 4, 5]))
    assert rule.state_dict()["count"].tolist() == [1, 0, 0, 0, 1, 1]
    chain = aggregators.make(f"clip(threshold=1)>{spec}", f=0)
    assert chain.stateful and chain.state_dict()["count"].numel() == 0
    cfg = {**FED, "aggregator": spec}
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 4)
    train(make_config(cfg), part)
    ta, tb = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert ta.keys() == tb.keys() and "rule.count" in ta and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert float(ta["rule.count"].sum()) == 8 * FED["clients_per_round"]  # 8 rounds of 5 sampled clients


def test_a_checkpoint_without_the_rules_state_still_resumes(tmp_path: Path) -> None:
    """A checkpoint written before the rule kept state (no ``rule.*`` tensors) resumes: the rule starts from an
    empty history at that round and the run finishes."""
    from safetensors.torch import save_file

    part = train_interrupted(make_config(SMALL), tmp_path / "part", 4)
    ckpt = part / "checkpoint.safetensors"
    old = {k: v for k, v in load_file(str(ckpt)).items() if not k.startswith("rule.")}
    save_file(old, str(ckpt), metadata={"round": "4", "rows": "2"})
    manifest = part / "manifest.json"  # the checkpoint changed on purpose: drop its recorded digests
    data = json.loads(manifest.read_text())
    data.pop("integrity", None), data.pop("artifacts", None)
    manifest.write_text(json.dumps(data))
    train(make_config(SMALL), part)
    assert store.is_finished(part)
    assert "rule.history" in load_file(str(ckpt))
