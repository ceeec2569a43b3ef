"""phalanx.flower.byzantine: Phalanx's attacks inside Flower clients — the ClientApp mod driven with real Flower
Message / RecordDict / ArrayRecord objects, the colluders' rendezvous, the data-poisoning helper, the configured
mod, and one real offline Flower run (run_simulation, Ray) of examples/flower-app where the mod's Byzantine clients
wreck Flower's FedAvg and PhalanxFedAvg survives them."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from _flower_sim import run_offline
from phalanx import attacks
from phalanx.errors import ConfigError, PhalanxError
from phalanx.training.streams import generator

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
flwr = pytest.importorskip("flwr")  # CI installs it with the dev extra; the guard only serves a bare install

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402

from phalanx.flower.byzantine import ByzantineMod, Rendezvous, from_config, poison  # noqa: E402
from phalanx.flower.replies import Layout, read_reply  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "flower-app"


# ------------------------------------------------------------------------------------------------------- helpers


def global_model(seed: int = 0) -> dict[str, np.ndarray]:
    """A model of mixed arrays: float32 weights, a float64 bias and an int64 counter (kept as integers)."""
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3),
            "steps": np.array([7, 9], dtype=np.int64)}


def instruction(arrays: dict[str, np.ndarray], server_round: int = 1, run_id: int = 5,
                message_type: str = MessageType.TRAIN) -> Message:
    """A train instruction as FedAvg sends it: the model under "arrays", the round in the config record."""
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                          "config": ConfigRecord({"server-round": server_round, "lr": 0.1})})
    meta = Metadata(run_id=run_id, message_id=f"i{server_round}", src_node_id=0, dst_node_id=11,
                    reply_to_message_id="", group_id=str(server_round), created_at=time.time(), ttl=3600.0,
                    message_type=message_type)
    return Message(content=content, metadata=meta)


def context(node_config: dict[str, Any] | None = None, run_config: dict[str, Any] | None = None) -> Context:
    return Context(run_id=5, node_id=11, node_config=node_config or {}, state=RecordDict(),
                   run_config=run_config or {})


def honest_client(delta: dict[str, np.ndarray]) -> Any:
    """A ClientApp function that 'trains' by adding ``delta`` to the model it is sent (ints: rounded)."""
    def train(msg: Message, ctx: Context) -> Message:
        arrays = msg.content["arrays"]
        local = {k: (arrays[k].numpy() + delta[k]).astype(arrays[k].numpy().dtype) for k in arrays}
        content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in local.items()}),
                              "metrics": MetricRecord({"train_loss": 0.25, "num-examples": 40})})
        return Message(content, reply_to=msg)
    return train


def deltas(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": (0.1 * rng.standard_normal((4, 3))).astype(np.float32), "b": 0.1 * rng.standard_normal(3),
            "steps": np.array([1, 2], dtype=np.int64)}


def flat(d: dict[str, np.ndarray], dtype: Any = np.float64) -> np.ndarray:
    return np.concatenate([d[k].astype(dtype).ravel() for k in ("w", "b", "steps") if k in d])


def sent_update(reply: Message, w: dict[str, np.ndarray]) -> np.ndarray:
    """What the server reads from the reply: Δ = wᵢ − w, flattened in the global record's key order."""
    layout = Layout.of(ArrayRecord({k: Array(v) for k, v in w.items()}))
    parsed = read_reply(reply, layout, "arrays", "num-examples")
    assert parsed.update is not None, parsed.dropped
    return parsed.update


def run_mod(mod: Any, w: dict[str, np.ndarray], delta: dict[str, np.ndarray], server_round: int = 1,
            ctx: Context | None = None) -> Message:
    return mod(instruction(w, server_round), ctx or context(), honest_client(delta))


# --------------------------------------------------------------------------------------------- one client alone


def test_signflip_alone_sends_the_attack_on_its_own_update_with_the_replys_structure() -> None:
    """The mod lets the client train, forms Δ = wᵢ − w, and sends w + attack(Δ): for signflip(s) −s·Δ, computed by
    the attack's own code; the reply keeps its keys, order, shapes, dtypes and metrics."""
    w, d = global_model(), deltas(1)
    reply = run_mod(ByzantineMod("signflip", {"scale": 4.0}), w, d)
    record = reply.content["arrays"]
    assert list(record.keys()) == ["w", "b", "steps"]
    assert [record[k].numpy().dtype for k in record] == [np.float32, np.float64, np.int64]
    assert [record[k].numpy().shape for k in record] == [(4, 3), (3,), (2,)]
    assert reply.content["metrics"]["train_loss"] == 0.25 and reply.content["metrics"]["num-examples"] == 40
    honest = flat(d, np.float64)
    ctx = attacks.AttackContext(torch.from_numpy(honest[None]), n_byzantine=1, f=0, aggregator=None,
                                generator=torch.Generator(), knowledge="colluders")
    want = attacks.make("signflip", scale=4.0)(ctx)[0].numpy()
    got = sent_update(reply, w)
    # float32 weights: one rounding of w + Δ to float32 (|w| < 5); the int counter is rounded back to integers
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(got[:12], want[:12], rtol=0, atol=16 * eps * 5)
    np.testing.assert_allclose(got[12:15], want[12:15], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got[15:], np.rint(want[15:]))


@pytest.mark.parametrize("name, check", [
    ("nan", lambda x: np.isnan(x).all()),
    ("inf", lambda x: np.isposinf(x[:15]).all()),
    ("gaussian", lambda x: np.isfinite(x).all()),
    ("ipm", lambda x: np.isfinite(x).all()),
    ("foe", lambda x: np.isfinite(x).all()),
    ("none", lambda x: np.isfinite(x).all()),
])
def test_every_solo_attack_runs_and_the_server_reads_the_reply(name: str, check: Any) -> None:
    """NaN, Inf and the rest reach PhalanxFedAvg's reader as an update (values are the rule's business)."""
    w, d = global_model(), deltas(2)
    w = {k: v for k, v in w.items() if k != "steps"}  # an int array cannot hold NaN or Inf
    d = {k: v for k, v in d.items() if k != "steps"}
    layout = Layout.of(ArrayRecord({k: Array(v) for k, v in w.items()}))
    reply = ByzantineMod(name)(instruction(w), context(), honest_client(d))
    parsed = read_reply(reply, layout, "arrays", "num-examples")
    assert parsed.update is not None, parsed.dropped
    assert check(parsed.update)


def test_gaussian_zero_and_large_values_are_gaussian_parameters() -> None:
    """Zero updates (sigma = 0) and huge values (a large mu) are the Gaussian attack's parameters."""
    w, d = global_model(), deltas(3)
    w.pop("steps"), d.pop("steps")
    zero = sent_update(run_mod(ByzantineMod("gaussian", {"sigma": 0.0}), w, d), w)
    assert np.array_equal(zero, np.zeros_like(zero))
    big = sent_update(run_mod(ByzantineMod("gaussian", {"sigma": 0.0, "mu": 1e30}), w, d), w)
    assert np.all(big > 1e29)


def test_a_stochastic_attack_is_deterministic_given_the_seed_and_the_round() -> None:
    w, d = global_model(), deltas(4)
    w.pop("steps"), d.pop("steps")

    def noise(seed: int, server_round: int) -> np.ndarray:
        return sent_update(run_mod(ByzantineMod("gaussian", seed=seed), w, d, server_round), w)

    assert np.array_equal(noise(3, 2), noise(3, 2))
    assert not np.array_equal(noise(3, 2), noise(3, 3))
    assert not np.array_equal(noise(3, 2), noise(4, 2))


def test_evaluate_messages_and_error_replies_pass_unchanged() -> None:
    w, d = global_model(), deltas(5)
    mod = ByzantineMod("signflip")
    evaluated = mod(instruction(w, message_type=MessageType.EVALUATE), context(), honest_client(d))
    np.testing.assert_array_equal(evaluated.content["arrays"]["w"].numpy(), w["w"] + d["w"])

    def failing(msg: Message, ctx: Context) -> Message:
        return Message(Error(code=3, reason="out of memory"), reply_to=msg)

    failed = mod(instruction(w), context(), failing)
    assert failed.has_error() and failed.error.reason == "out of memory"


def test_a_reply_that_does_not_fit_the_global_model_is_a_clear_error() -> None:
    w = global_model()

    def wrong(msg: Message, ctx: Context) -> Message:
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(3, np.float32))})}), reply_to=msg)

    with pytest.raises(PhalanxError, match="does not fit the global model"):
        ByzantineMod("signflip")(instruction(w), context(), wrong)


def test_it_runs_as_a_mod_of_a_real_client_app() -> None:
    """ClientApp(mods=[...]) routes a train message through the mod (Flower's own make_ffn chain)."""
    w, d = global_model(), deltas(6)
    app = ClientApp(mods=[ByzantineMod("signflip", {"scale": 2.0})])
    app.train()(honest_client(d))
    reply = app(instruction(w), context())
    got = sent_update(reply, w)
    np.testing.assert_allclose(got[:12], -2.0 * flat(d)[:12], rtol=0, atol=1e-5)


def test_the_solo_flag_is_what_the_attacks_compute() -> None:
    """``solo`` marks the attacks whose vectors depend on the honest rows through their mean alone (or not at all):
    for those, the rows of 6 honest vectors and the single row of their mean give the same attack — so a lone
    client's own update is a complete input. The others (ALIE, min-max, min-sum, Fang, mimic) give another vector
    from the mean alone: they need the spread or the rows. ``none`` is solo for another reason (it replays an
    honest row: a lone client's is its own); ``optimal`` calls the server's rule."""
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def sent(name: str, rows: torch.Tensor) -> torch.Tensor:
        ctx = attacks.AttackContext(rows, n_byzantine=1, f=0, aggregator=None, workers=7,
                                    generator=torch.Generator().manual_seed(1), knowledge="colluders")
        return attacks.make(name)(ctx)

    solo = {n for n in attacks.names("vector") if getattr(attacks.get_class(n), "solo", False)}
    # read from the classes' own flags (a new attack needs no edit here), each checked below against what it computes;
    # the ones the loop cannot check by computing are named: none replays an honest row, optimal and evade read the
    # server's rule
    assert "none" in solo and not {"optimal", "evade"} & solo and {"signflip", "gaussian"} <= solo
    # evade: a function of the mean only where no filter is shown to it; it reads the server's filter (an oracle a
    # lone worker does not have), so it is not solo
    for name in sorted(set(attacks.names("vector")) - {"optimal", "intermittent", "none", "evade"}):
        same = torch.allclose(sent(name, x), sent(name, x.mean(0, keepdim=True)), rtol=0, atol=1e-12,
                              equal_nan=True)
        assert same == (name in solo), name
    assert attacks.make("intermittent", attack="signflip").solo and not attacks.make("intermittent",
                                                                                      attack="alie").solo


# ---------------------------------------------------------------------------------------------- refused attacks


@pytest.mark.parametrize("kwargs, parameter, words", [
    (dict(attack="alie"), "attack", "honest updates other than"),
    (dict(attack="minmax"), "attack", "honest updates other than"),
    (dict(attack="fang"), "attack", "honest updates other than"),
    (dict(attack="mimic"), "attack", "honest updates other than"),
    (dict(attack="optimal"), "attack", "server's aggregator"),
    # its rows round away in the reply's weights w + y: the reply was the global model (an attacker's review)
    (dict(attack="subnormal"), "attack", "round away"),
    (dict(attack="nosuchattack"), "attack", ""),
    (dict(attack="signflip", params={"scale": -1.0}), "scale", ""),
    (dict(attack="signflip", params={"sclae": 1.0}), "signflip parameter", ""),
    (dict(attack="signflip", seed=-1), "seed", ""),
    (dict(attack="signflip", f=-2), "f", ""),
    (dict(attack=""), "attack", ""),
    (dict(attack=attacks.make("signflip"), params={"scale": 2.0}), "params", ""),
])
def test_what_a_client_cannot_run_is_a_one_line_config_error(kwargs: dict[str, Any], parameter: str,
                                                             words: str) -> None:
    attack = kwargs.pop("attack")
    with pytest.raises(ConfigError) as info:
        ByzantineMod(attack, **kwargs)
    assert info.value.parameter == parameter
    assert "\n" not in str(info.value) and words in str(info.value)
    if parameter == "attack" and words:
        assert repr(attack) in str(info.value)  # it names the attack


def test_colluder_settings_are_checked(tmp_path: Path) -> None:
    for kwargs, parameter in [(dict(colluders=0, index=0), "colluders"), (dict(colluders=2, index=2), "colluder"),
                              (dict(colluders=2, index=0, timeout=0.0), "timeout"),
                              (dict(colluders=2, index=0, on_timeout="wait"), "on_timeout")]:
        with pytest.raises(ConfigError) as info:
            Rendezvous(tmp_path, **kwargs)  # type: ignore[arg-type]
        assert info.value.parameter == parameter
    two = Rendezvous(tmp_path, 2, 0)
    with pytest.raises(ConfigError, match="reads no honest vector"):
        ByzantineMod("nan", rendezvous=two)
    with pytest.raises(ConfigError, match="data attack"):
        ByzantineMod("labelflip", rendezvous=two)
    with pytest.raises(ConfigError) as info:
        ByzantineMod("alie", rendezvous=two, workers=2)
    assert info.value.parameter == "workers"


# -------------------------------------------------------------------------------------------------- colluders


def collude(tmp_path: Path, name: str, k: int, params: dict[str, Any] | None = None, seed: int = 0,
            workers: int | None = None, server_round: int = 1) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """k colluders, one thread each (as k SuperNodes would be k processes), sharing a rendezvous: their honest
    updates and what each sent."""
    w = {k_: v for k_, v in global_model().items() if k_ != "steps"}
    honest = [{k_: v for k_, v in deltas(10 + i).items() if k_ != "steps"} for i in range(k)]
    mods = [ByzantineMod(name, params, seed=seed, workers=workers, rendezvous=Rendezvous(tmp_path, k, i, timeout=60))
            for i in range(k)]
    sent: list[Any] = [None] * k

    def one(i: int) -> None:
        sent[i] = run_mod(mods[i], w, honest[i], server_round)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(s is not None for s in sent), "a colluder did not finish"
    return [flat(h, np.float32).astype(np.float64) for h in honest], [sent_update(s, w) for s in sent]


def test_alie_colluders_estimate_the_spread_from_their_own_updates_and_agree(tmp_path: Path) -> None:
    """Three colluders share their honest updates; each sends ALIE's vector ḡ − zσ of the three (the attack's own
    code, knowledge = "colluders", n = workers) — the same vector from all of them."""
    own, sent = collude(tmp_path, "alie", 3, workers=10)
    honest = torch.tensor(np.stack(own), dtype=torch.float32)
    ctx = attacks.AttackContext(honest, n_byzantine=3, f=0, aggregator=None, generator=torch.Generator(),
                                workers=10, knowledge="colluders")
    want = attacks.make("alie")(ctx)[0].double().numpy()
    eps = float(np.finfo(np.float32).eps)
    for s in sent:
        np.testing.assert_allclose(s, want, rtol=0, atol=64 * eps)
    assert np.array_equal(sent[0], sent[1]) and np.array_equal(sent[1], sent[2])
    assert not np.allclose(want, honest.double().mean(0).numpy(), atol=1e-3)  # it does shift away from the mean


def test_stochastic_colluders_send_their_own_rows_of_one_seeded_draw(tmp_path: Path) -> None:
    """Fang draws per attacker: every colluder draws the same (k, d) matrix (same seed, same round, same rows)
    and sends its own row; a rerun sends the same."""
    own, sent = collude(tmp_path / "a", "fang", 2, seed=7)
    _, again = collude(tmp_path / "b", "fang", 2, seed=7)
    assert not np.array_equal(sent[0], sent[1])
    ctx = attacks.AttackContext(torch.tensor(np.stack(own), dtype=torch.float32), n_byzantine=2, f=0,
                                aggregator=None, generator=generator(7, "flower-attack:1"), knowledge="colluders")
    want = attacks.make("fang")(ctx).double().numpy()
    for s, row in zip(sent, want):
        np.testing.assert_allclose(s, row, rtol=0, atol=64 * float(np.finfo(np.float32).eps))
    for s, a in zip(sent, again):
        np.testing.assert_array_equal(s, a)


def test_a_colluder_that_waits_in_vain_fails_clearly_or_attacks_with_those_present(tmp_path: Path) -> None:
    w = {k: v for k, v in global_model().items() if k != "steps"}
    d = {k: v for k, v in deltas(20).items() if k != "steps"}
    lonely = ByzantineMod("ipm", rendezvous=Rendezvous(tmp_path / "fail", 2, 0, timeout=0.2))
    with pytest.raises(PhalanxError, match=r"colluders \[1\] did not publish their round-1 update within 0.2 s"):
        run_mod(lonely, w, d)
    present = ByzantineMod("ipm", {"epsilon": 0.5},
                           rendezvous=Rendezvous(tmp_path / "present", 2, 0, timeout=0.2, on_timeout="present"))
    got = sent_update(run_mod(present, w, d), w)
    np.testing.assert_allclose(got, -0.5 * flat(d), rtol=0, atol=1e-6)


def test_a_colluder_removes_its_file_of_two_rounds_before(tmp_path: Path) -> None:
    w = {k: v for k, v in global_model().items() if k != "steps"}
    d = {k: v for k, v in deltas(21).items() if k != "steps"}
    mod = ByzantineMod("ipm", rendezvous=Rendezvous(tmp_path, 2, 0, timeout=0.05, on_timeout="present"))
    for r in (1, 2, 3):
        run_mod(mod, w, d, server_round=r)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.npy"))
    assert files == ["run-5/round-2/colluder-0.npy", "run-5/round-3/colluder-0.npy"]


def test_lone_stochastic_attackers_draw_their_own_noise_colluders_one_draw() -> None:
    """b lone Gaussian attackers are b independent draws (each node its own stream), as in a Phalanx run; the same
    node in the same round draws the same (a retried round sends what it sent)."""
    from flwr.app import RecordDict

    own = np.zeros(5, dtype=np.float32)

    def sent(node: int, server_round: int = 3) -> np.ndarray[Any, Any]:
        ctx = Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})
        return ByzantineMod("gaussian", {"sigma": 1.0}).update(own, server_round, context=ctx)

    assert not np.array_equal(sent(11), sent(12))
    np.testing.assert_array_equal(sent(11), sent(11))
    assert not np.array_equal(sent(11, 3), sent(11, 4))


def test_a_colluders_file_is_written_privately_and_a_planted_link_is_neither_followed_nor_read(tmp_path: Path) -> None:
    """The rendezvous may be a shared directory: a link planted where a colluder writes is replaced, not followed
    (its target untouched); a link planted as another colluder's file is refused, not read."""
    own = np.arange(3, dtype=np.float32)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    first = Rendezvous(tmp_path / "rdv", 2, 0, timeout=0.05, on_timeout="present")
    mine = first._path(1, 1, 0)
    mine.parent.mkdir(parents=True)
    mine.symlink_to(victim)
    rows, row = first.exchange(1, 1, own)
    assert victim.read_text() == "precious" and not mine.is_symlink() and (mine.stat().st_mode & 0o077) == 0
    np.testing.assert_array_equal(rows[row], own)
    other = first._path(1, 2, 1)
    other.parent.mkdir(parents=True)
    other.symlink_to(victim)
    with pytest.raises(PhalanxError, match="cannot read"):
        first.exchange(1, 2, own)


def test_a_colluders_file_claiming_a_huge_array_allocates_nothing(tmp_path: Path) -> None:
    own = np.zeros(3, dtype=np.float32)
    rdv = Rendezvous(tmp_path, 2, 0, timeout=5)
    path = rdv._path(1, 1, 1)
    path.parent.mkdir(parents=True)
    with path.open("wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (10**13,)})
    with pytest.raises(PhalanxError, match=r"shape \(10000000000000,\)"):
        rdv.exchange(1, 1, own)
    with path.open("wb") as fh:  # the right header, too little data
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (3,)})
        fh.write(b"\0" * 4)
    with pytest.raises(PhalanxError, match="cut short"):
        rdv.exchange(1, 1, own)


# ------------------------------------------------------------------------------------------------ data attacks


def test_poison_uses_the_data_attacks_own_transform_on_numpy_data() -> None:
    x = np.random.default_rng(0).standard_normal((20, 64)).astype(np.float32)
    y = np.arange(20) % 10
    px, py = poison("labelflip", x, y, 10)
    assert isinstance(px, np.ndarray) and isinstance(py, np.ndarray)
    np.testing.assert_array_equal(py, 9 - y)
    np.testing.assert_array_equal(px, x)
    bx, by = poison("backdoor", x, y, 10, params={"target": 3, "poison_fraction": 0.5, "size": 2}, seed=1)
    stamped = np.all(bx[:, -4:] == 2.5, axis=1)
    assert stamped.sum() == 10 and np.all(by[stamped] == 3)
    np.testing.assert_array_equal(bx[~stamped], x[~stamped])
    again = poison("backdoor", x, y, 10, params={"target": 3, "poison_fraction": 0.5, "size": 2}, seed=1)
    np.testing.assert_array_equal(again[0], bx)  # deterministic given the seed and the round
    tx, ty = poison("labelflip", torch.from_numpy(x), torch.from_numpy(y), 10)
    assert isinstance(tx, torch.Tensor) and torch.equal(ty, torch.from_numpy(9 - y))


def test_poison_honours_stop_round_and_refuses_what_does_not_fit() -> None:
    x, y = np.zeros((4, 64), np.float32), np.array([0, 1, 2, 3])
    _, late = poison("backdoor", x, y, 10, params={"stop_round": 2}, server_round=3)
    assert late is y  # Phalanx's round 2 = Flower's round 3: the attack has stopped
    with pytest.raises(ConfigError, match="size"):
        poison("backdoor", x, y, 10, params={"size": 9})  # 81 trigger features > 64
    with pytest.raises(ConfigError, match="data attack"):
        poison("signflip", x, y, 10)
    with pytest.raises(ConfigError) as info:
        poison("labelflip", x, y, 10, server_round=0)
    assert info.value.parameter == "server_round"


def test_a_data_attacks_boost_is_applied_to_the_reply_by_the_mod() -> None:
    w, d = global_model(), deltas(30)
    w.pop("steps"), d.pop("steps")
    got = sent_update(run_mod(ByzantineMod("backdoor", {"boost": 5.0}), w, d), w)
    np.testing.assert_allclose(got, 5.0 * flat(d), rtol=0, atol=1e-5)
    plain = sent_update(run_mod(ByzantineMod("labelflip"), w, d), w)
    np.testing.assert_allclose(plain, flat(d), rtol=0, atol=1e-6)


def test_neurotoxin_masks_with_the_global_models_last_step_kept_in_the_nodes_state() -> None:
    """Round 1 has no previous step (nothing masked); round 2 masks the coordinates the last step moved most."""
    w1 = {"w": np.zeros((4, 3), np.float32)}
    w2 = {"w": np.arange(12, dtype=np.float32).reshape(4, 3)}  # the server's step: coordinate j moved by j
    d = {"w": np.ones((4, 3), np.float32)}
    mod, ctx = ByzantineMod("neurotoxin", {"keep": 25.0}), context()
    first = sent_update(mod(instruction(w1, 1), ctx, honest_client(d)), w1)
    np.testing.assert_array_equal(first, np.ones(12))
    second = sent_update(mod(instruction(w2, 2), ctx, honest_client(d)), w2)
    np.testing.assert_array_equal(second, (np.arange(12) < 3).astype(float))  # the 25 % least moved kept


# ------------------------------------------------------------------------------------------------ from_config


def test_the_configured_mod_attacks_only_the_nodes_the_config_says() -> None:
    w, d = global_model(), deltas(40)
    w.pop("steps"), d.pop("steps")
    mod = from_config()
    run = {"byzantine-attack": "signflip", "byzantine-params": "{\"scale\": 1.0}", "byzantine-params.scale": 3.0}
    honest = sent_update(mod(instruction(w), context({}, run), honest_client(d)), w)
    np.testing.assert_allclose(honest, flat(d), rtol=0, atol=1e-6)
    byz = sent_update(mod(instruction(w), context({"byzantine": True}, run), honest_client(d)), w)
    np.testing.assert_allclose(byz, -3.0 * flat(d), rtol=0, atol=1e-5)
    node = {"byzantine": True, "byzantine-params": '{"scale": 5.0}'}  # a node's own config overrides the run's
    own = sent_update(mod(instruction(w), context(node, run), honest_client(d)), w)
    np.testing.assert_allclose(own, -5.0 * flat(d), rtol=0, atol=1e-5)
    nan = {"byzantine": True, "byzantine-attack": "nan", "byzantine-params": "{}"}  # '{}' drops the run's scale
    assert np.isnan(sent_update(mod(instruction(w), context(nan, run), honest_client(d)), w)).all()
    with pytest.raises(ConfigError) as info:
        mod(instruction(w), context({"byzantine": "yes"}, run), honest_client(d))
    assert info.value.parameter == "byzantine"
    with pytest.raises(ConfigError) as info:
        mod(instruction(w), context({"byzantine": True, "byzantine-colluders": 2}, run), honest_client(d))
    assert info.value.parameter == "byzantine-rendezvous"
    with pytest.raises(ConfigError) as info:
        mod(instruction(w), context({"byzantine": True}, {**run, "byzantine-params": "{scale"}), honest_client(d))
    assert info.value.parameter == "byzantine-params"


def test_the_example_apps_task_is_the_examples_task() -> None:
    """A Flower app bundle holds only its own directory (and skips symlinks), so examples/flower-app carries a copy of
    examples/flower/task.py: the two must not drift apart."""
    assert (APP / "task.py").read_bytes() == (ROOT / "examples" / "flower" / "task.py").read_bytes()


# ------------------------------------------------------------------------------ a real offline Flower simulation


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks for leftover processes in /proc")
def test_a_real_offline_flower_run_where_the_mods_attackers_wreck_fedavg_not_phalanx(tmp_path: Path) -> None:
    """examples/flower-app/simulate.py: Flower's simulation engine (run_simulation, Ray), 6 clients of which the last
    2 run the mod with signflip(scale=10); Flower's FedAvg and then PhalanxFedAvg(cwtm, f=2), 3 rounds each, on the
    same clients. FedAvg ends far from the honest clients' FedAvg (beyond the honest model's own norm); Phalanx
    ends near it and classifies as well as it, and logged every reply as used."""
    pytest.importorskip("ray")
    args = ["--strategy", "both", "--rounds", "3", "--clients", "6", "--byzantine", "2", "--f", "2", "--attack",
            "signflip", "--params", '{"scale": 10.0}']
    (fedavg, phalanx), log_path = run_offline(APP / "simulate.py", args, tmp_path, "rayb")
    assert (fedavg["strategy"], phalanx["strategy"]) == ("fedavg", "phalanx")
    assert fedavg["distance_to_honest"] > fedavg["honest_norm"], fedavg
    assert fedavg["test_accuracy"] < 0.5 * fedavg["honest_accuracy"], fedavg
    assert phalanx["distance_to_honest"] < 0.25 * phalanx["honest_norm"], phalanx
    assert phalanx["test_accuracy"] > 0.85, phalanx
    rows = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(rows) == phalanx["contributions"] == 18 and all(r["status"] == "used" for r in rows)
    for r in (1, 2, 3):  # the attackers' updates reached the server: two per round, 10× the honest ones' norm
        norms = sorted(row["update_norm"] for row in rows if row["round"] == r)
        assert norms[-2] > 5 * norms[-3] and norms[-3] < 2 * norms[0], norms
