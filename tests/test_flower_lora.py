"""phalanx.flower: LoRA adapters sent as peft's arrays, aggregated in the three modes — with real Flower Messages.

The global record is what a FlowerTune app sends: ``ArrayRecord(get_peft_model_state_dict(model))`` of the embedded
``hf:phalanx-bert-tiny`` with rank-4 adapters on ``query`` and ``value`` (four adapted 64×64 layers, A orthonormal
times c as mode ``shared`` makes it, and the classification head). Each round is driven as Flower drives it
(``configure_train`` on a Grid that sets message ids, the clients' replies Flower's own ``Message(content,
reply_to=instruction)``; the harness of tests/test_flower_identity.py). Each mode plays a Byzantine node whose
adapter is its honest one scaled by 10³ against cwtm with f = 1, and each shows what its mutant does; a node whose
adapter has another rank, other layers, an undeserialisable declared size, or (mode ``shared``) a changed A is a
void vote: missing, never lowering f.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")
flwr = pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402

import phalanx.flower.strategy as strategy_module  # noqa: E402
from phalanx import aggregators, models  # noqa: E402
from phalanx.aggregators.lora import refactor  # noqa: E402
from phalanx.errors import ConfigError  # noqa: E402
from phalanx.flower import PhalanxFedAvg  # noqa: E402
from phalanx.flower.adapters import ORTHONORMAL_TOL, AdapterPlan, SharedA, shared_a  # noqa: E402
from test_flower_identity import FakeGrid, serverapp_identity  # noqa: E402, F401 - the autouse fixture

NODES = [101, 102, 103, 104, 105]
BAD = 105
Arrays = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def peft_arrays() -> Arrays:
    """``get_peft_model_state_dict`` of the embedded model with rank-4 adapters (mode ``shared``'s A: orthonormal
    rows times c), with B made non-zero (peft starts B at 0, where BA would hide every A)."""
    from peft import get_peft_model_state_dict

    torch.manual_seed(0)
    model: Any = models.make("hf:phalanx-bert-tiny", (16,), 2, r=4, aggregation="shared")
    arrays = {k: v.detach().numpy().copy() for k, v in get_peft_model_state_dict(model.net).items()}
    rng = np.random.default_rng(0)
    for k in arrays:
        if ".lora_B." in k:
            arrays[k] = (0.1 * rng.standard_normal(arrays[k].shape)).astype(np.float32)
    return arrays


def _keys(w: Arrays, part: str) -> list[str]:
    return [k for k in w if f".lora_{part}." in k]


def record(w: Arrays) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in w.items()})


def start(s: PhalanxFedAvg, w: Arrays, nodes: list[int] = NODES) -> dict[int, Message]:
    grid = FakeGrid(nodes)
    sent = list(s.configure_train(1, record(w), ConfigRecord({"lr": 0.1}), grid))
    grid.push_messages(sent)
    return {m.metadata.dst_node_id: m for m in sent}


def answer(ins: Message, w: Arrays | ArrayRecord) -> Message:
    rec = w if isinstance(w, ArrayRecord) else record(w)
    return Message(RecordDict({"arrays": rec, "metrics": MetricRecord({"num-examples": 10})}), reply_to=ins)


def honest(w: Arrays, n: int, train_a: bool, seed: int = 1) -> list[Arrays]:
    """n clients' adapters after local training: every B and the head moved by N(0, 0.01²); A too unless frozen."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        out.append({k: v if (".lora_A." in k and not train_a)
                    else v + (0.01 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in w.items()})
    return out


def scaled(w: Arrays, client: Arrays, by: float) -> Arrays:
    """A Byzantine adapter: ``client``'s update scaled by ``by`` (A unchanged where the client kept it)."""
    return {k: (w[k] + np.float32(by) * (client[k] - w[k])).astype(np.float32) for k in w}


def flat(w: Arrays | list[np.ndarray]) -> np.ndarray:
    values = list(w.values()) if isinstance(w, dict) else w
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in values])


def new_model(s: PhalanxFedAvg, replies: list[Message], w: Arrays) -> tuple[Arrays, MetricRecord]:
    out, metrics = s.aggregate_train(1, replies)
    assert out is not None and metrics is not None
    assert list(out.keys()) == list(w)
    return {k: out[k].numpy() for k in out}, metrics


def product(w: Arrays, a_key: str) -> np.ndarray:
    b = w[a_key.replace(".lora_A.", ".lora_B.")].astype(np.float64)
    return b @ w[a_key].astype(np.float64)


def effect(w: Arrays) -> np.ndarray:
    """What the adapters do to the model: every layer's product BA and the head (factor-free: mode ``update``
    re-factorises, so its factors may rotate while BA barely moves)."""
    return np.concatenate([product(w, k).ravel() for k in _keys(w, "A")] +
                          [w[k].astype(np.float64).ravel() for k in w if ".lora_" not in k])


def within(step: np.ndarray, honest: torch.Tensor) -> bool:
    """Every coordinate of ``step`` in the honest rows' range (up to float32 rounding)."""
    low, high = honest.min(0).values.numpy(), honest.max(0).values.numpy()
    return bool(np.all(step >= low - _tol(1.0)) and np.all(step <= high + _tol(1.0)))


def _tol(scale: float) -> float:
    """float32 rounding of rows, rule and step, relative to the values' magnitude (d ≈ 2·10³ coordinates)."""
    return 64 * float(torch.finfo(torch.float32).eps) * scale


def _round(mode: str, w: Arrays, aggregator: str = "cwtm", by: float = 1e3, **kw: Any
           ) -> tuple[Arrays, MetricRecord, list[Arrays]]:
    """One round, nodes 101-104 honest, node 105 sends node 101's adapter scaled by ``by``."""
    clients = honest(w, 4, train_a=mode != "shared")
    s = PhalanxFedAvg(aggregator=aggregator, f=1, min_available_nodes=5, lora=mode, **kw)
    ins = start(s, w)
    replies = [answer(ins[n], c) for n, c in zip(NODES, clients)] + [answer(ins[BAD], scaled(w, clients[0], by))]
    got, metrics = new_model(s, replies, w)
    return got, metrics, [*clients, scaled(w, clients[0], by)]


# ------------------------------------------------------------------------------------------------------- modes


def test_factors_mode_is_the_rule_on_every_factor_and_trims_the_scaled_adapter(peft_arrays: Arrays) -> None:
    """``factors``: w + cwtm(Δ₁…Δ₅) on the flat vector of every A, B and the head, exactly the rule on those rows;
    every coordinate of the step lies in the honest updates' range. The mutant rule (mean) steps by the Byzantine
    adapter's 10³ scale / 5."""
    w = peft_arrays
    got, metrics, rows = _round("factors", w)
    x = torch.tensor(np.stack([flat(r) - flat(w) for r in rows]))
    step = flat(got) - flat(w)
    np.testing.assert_allclose(step, aggregators.make("cwtm", f=1)(x).numpy(), rtol=0, atol=_tol(1.0))
    assert within(step, x[:4])
    assert (metrics["replies-valid"], metrics["replies-adapter"], metrics["aggregated"]) == (5, 0, 1)
    mutant, _, _ = _round("factors", w, aggregator="mean")
    assert np.abs(flat(mutant) - flat(w)).max() > 50 * float(x[:4].abs().max())


def test_update_mode_refactorises_the_rules_layer_update_and_trims_the_scaled_adapter(peft_arrays: Arrays) -> None:
    """``update``: per layer, B′A′ is the best rank-4 approximation of BA + cwtm(BᵢAᵢ − BA) (an SVD computed here in
    float64, not Phalanx's), split with the balance of the start: A′A′ᵀ − B′ᵀB′ = c²I (docs/lora.md).
    Against the Byzantine 10³-scaled adapter the layer's
    step stays within the honest products' spread of the honest mean update; the mutant rule (mean) moves it by
    more than 10³ times that spread."""
    w = peft_arrays
    got, metrics, rows = _round("update", w)
    assert (metrics["replies-valid"], metrics["aggregated"]) == (5, 1)
    cwtm = aggregators.make("cwtm", f=1)
    mutant, _, _ = _round("update", w, aggregator="mean")
    for a_key in _keys(w, "A"):
        base = product(w, a_key)
        dw = np.stack([(product(r, a_key) - base).ravel() for r in rows])
        target = base + cwtm(torch.tensor(dw)).numpy().reshape(base.shape)
        u, sv, vh = np.linalg.svd(target)
        best = (u[:, :4] * sv[:4]) @ vh[:4]
        np.testing.assert_allclose(product(got, a_key), best, rtol=0, atol=_tol(float(np.abs(target).max())))
        a, b = got[a_key].astype(np.float64), got[a_key.replace("lora_A", "lora_B")].astype(np.float64)
        a0, b0 = w[a_key].astype(np.float64), w[a_key.replace("lora_A", "lora_B")].astype(np.float64)
        balance = a @ a.T - b.T @ b  # the global factors' balance c² = tr(A₀A₀ᵀ − B₀ᵀB₀)/r (0 if negative) is kept
        c2 = max(float((a0**2).sum() - (b0**2).sum()) / 4, 0.0)
        np.testing.assert_allclose(balance, c2 * np.eye(4), rtol=0, atol=_tol(float(np.abs(a @ a.T).max())))
        honest_mean = base + dw[:4].mean(0).reshape(base.shape)
        spread = float(np.abs(dw[:4] - dw[:4].mean(0)).max())  # cwtm's ΔW* and the mean lie in the honest range
        assert np.abs(product(got, a_key) - honest_mean).max() <= 2 * spread + np.abs(target - best).max() + _tol(1.0)
        assert np.abs(product(mutant, a_key) - honest_mean).max() > 1e3 * spread


def test_update_mode_is_exact_for_the_mean_when_the_clients_move_b_only(peft_arrays: Arrays) -> None:
    """Clients that change only B (and the head) send products BᵢA of rank ≤ 4 in A's row space: the mean's new
    factors multiply to the mean of the clients' products (docs/lora.md's exactness claim, through Flower)."""
    w = peft_arrays
    clients = honest(w, 5, train_a=False)
    s = PhalanxFedAvg(aggregator="mean", min_available_nodes=5, lora="update")
    ins = start(s, w)
    got, _ = new_model(s, [answer(ins[n], c) for n, c in zip(NODES, clients)], w)
    for a_key in _keys(w, "A"):
        mean = np.mean([product(c, a_key) for c in clients], axis=0)
        np.testing.assert_allclose(product(got, a_key), mean, rtol=0, atol=_tol(float(np.abs(mean).max())))


def test_shared_mode_keeps_a_and_is_the_rule_on_b_and_the_head(peft_arrays: Arrays) -> None:
    """``shared``: every A stays the broadcast one bit for bit; B and the head step by cwtm on their own rows
    (exactly what ``SharedA`` feeds the rule), so each layer's update is cwtm(ΔB)·A — exact in ΔW. The Byzantine
    10³-scaled B is trimmed; the mutant rule (mean) is not."""
    w = peft_arrays
    got, metrics, rows = _round("shared", w)
    assert (metrics["replies-valid"], metrics["replies-adapter"], metrics["aggregated"]) == (5, 0, 1)
    for a_key in _keys(w, "A"):
        np.testing.assert_array_equal(got[a_key], w[a_key])
    trained = [k for k in w if ".lora_A." not in k]
    x = torch.tensor(np.stack([flat([r[k] for k in trained]) - flat([w[k] for k in trained]) for r in rows]))
    step = flat([got[k] for k in trained]) - flat([w[k] for k in trained])
    np.testing.assert_allclose(step, aggregators.make("cwtm", f=1)(x).numpy(), rtol=0, atol=_tol(1.0))
    assert within(step, x[:4])
    mutant, _, _ = _round("shared", w, aggregator="mean")
    assert np.abs(flat(mutant) - flat(w)).max() > 50 * float(x[:4].abs().max())


@pytest.mark.parametrize("value", [np.nan, np.inf, 1e38])
@pytest.mark.parametrize("mode", ["factors", "update"])
def test_a_garbage_adapter_is_survived_in_factor_and_update_space(peft_arrays: Arrays, mode: str, value: float) -> None:
    """Node 105 sends every A and B entry as NaN, +inf or 10³⁸ (its products overflow to ±inf or NaN in float32):
    a bad row for the rule in factor space and in each layer's ΔW. cwtm (f = 1) steps, finite, by less than 10 times
    an honest client's effect on BA; the mean keeps the model (its aggregate is not finite) or, given 10³⁸ factors,
    steps by more than 10³⁰ — without a crash."""
    w = peft_arrays
    clients = honest(w, 4, train_a=True)
    bad = {k: np.full_like(v, value) if ".lora_" in k else v for k, v in clients[0].items()}
    for aggregator in ("cwtm", "mean"):
        s = PhalanxFedAvg(aggregator=aggregator, f=1, min_available_nodes=5, lora=mode)
        ins = start(s, w)
        replies = [answer(ins[n], c) for n, c in zip(NODES, clients)] + [answer(ins[BAD], bad)]
        got, metrics = new_model(s, replies, w)
        assert np.isfinite(flat(got)).all()
        if aggregator == "mean":  # kept (not finite), or — 10³⁸ in factor space: a finite mean — thrown 10³⁰ away
            if metrics["aggregated"] == 0:
                np.testing.assert_array_equal(flat(got), flat(w))
            else:
                assert float(np.abs(flat(got) - flat(w)).max()) > 1e30
            continue
        assert metrics["aggregated"] == 1
        spread = float(np.abs(effect(clients[0]) - effect(w)).max())
        assert float(np.abs(effect(got) - effect(w)).max()) < 10 * spread


def test_shared_mode_voids_a_node_that_changed_a(peft_arrays: Arrays, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that sends back another A (here: trained, N(0, 0.01²) added) is dropped with reason ``adapter``: its B
    was trained against another A. Its vote is void (f stays 1, nodes-dropped 0). The mutant without the A check
    uses the reply."""
    w = peft_arrays
    clients = honest(w, 5, train_a=False)
    clients[4] = honest(w, 1, train_a=True, seed=9)[0]

    def run() -> MetricRecord:
        s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5, lora="shared")
        ins = start(s, w)
        got, metrics = new_model(s, [answer(ins[n], c) for n, c in zip(NODES, clients)], w)
        for a_key in _keys(w, "A"):
            np.testing.assert_array_equal(got[a_key], w[a_key])
        return metrics

    metrics = run()
    assert (metrics["replies-adapter"], metrics["nodes-void"], metrics["nodes-dropped"], metrics["replies-valid"]) \
        == (1, 1, 0, 4)
    monkeypatch.setattr(AdapterPlan, "check", lambda self, reply, msg, key: None)
    assert run()["replies-valid"] == 5


def test_shared_mode_warns_once_on_a_skewed_a_and_shared_a_makes_it_orthonormal(
    peft_arrays: Arrays, caplog: pytest.LogCaptureFixture,
) -> None:
    """The κ claim of mode ``shared`` needs A Aᵀ = c² I. A record whose A is not so (peft's random A: here the
    model's A plus N(0, 0.1²)) gets one WARNING naming the layer over two rounds; ``shared_a`` of it has A Aᵀ = c² I
    with c its root-mean-square row norm (so ‖ΔB A‖_F = c‖ΔB‖_F), every other array untouched, and no warning; the
    model's own A (orthonormal times c) gets none either."""
    rng = np.random.default_rng(3)
    skewed = {k: (v + 0.1 * rng.standard_normal(v.shape)).astype(v.dtype) if ".lora_A." in k else v
              for k, v in peft_arrays.items()}
    fixed = shared_a(record(skewed))
    for w, warned in ((peft_arrays, False), (skewed, True), ({k: fixed[k].numpy() for k in fixed}, False)):
        s = PhalanxFedAvg(lora="shared", min_available_nodes=5)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flwr"):
            s.remember_global(1, record(w))
            s.remember_global(2, record(w))
        lines = [r.getMessage() for r in caplog.records if "not orthonormal" in r.getMessage()]
        assert len(lines) == int(warned)
        if warned:
            assert _keys(w, "A")[0].split(".lora_A.")[0] in lines[0]
    for key in skewed:
        if ".lora_A." not in key:
            np.testing.assert_array_equal(fixed[key].numpy(), skewed[key])
            continue
        a = fixed[key].numpy().astype(np.float64)
        c2 = float((skewed[key].astype(np.float64) ** 2).sum()) / a.shape[0]
        np.testing.assert_allclose(a @ a.T, c2 * np.eye(a.shape[0]), rtol=0, atol=ORTHONORMAL_TOL * c2)
        db = rng.standard_normal((a.shape[1] // 2, a.shape[0]))  # any B, any d_out
        np.testing.assert_allclose(np.linalg.norm(db @ a), c2**0.5 * np.linalg.norm(db), rtol=ORTHONORMAL_TOL)


# ------------------------------------------------------------------------------------- adapters that do not fit


def _other_rank(w: Arrays, client: Arrays, rank: int) -> Arrays:
    """``client``'s adapters at another rank (A padded or cut, B alike): what an honest client of rank ``rank``
    sends."""
    out = dict(client)
    for a_key in _keys(w, "A"):
        b_key = a_key.replace(".lora_A.", ".lora_B.")
        a, b = client[a_key], client[b_key]
        out[a_key] = np.resize(a, (rank, a.shape[1])).astype(np.float32)
        out[b_key] = np.resize(b, (b.shape[0], rank)).astype(np.float32)
    return out


def _huge(w: Arrays, client: Arrays) -> ArrayRecord:
    """An A whose declared shape is (10⁹, 64) over 16 bytes of data: read, it would be 256 GB."""
    arrays = {k: Array(np.ascontiguousarray(v)) for k, v in client.items()}
    key = _keys(w, "A")[0]
    arrays[key] = Array(dtype="float32", shape=(10**9, 64), stype="numpy.ndarray", data=b"\0" * 16)
    return ArrayRecord(arrays)


def _lying_bytes(w: Arrays, client: Arrays) -> ArrayRecord:
    """An A that declares the right shape (4, 64) over the .npy bytes of a (8, 64) array."""
    import io

    arrays = {k: Array(np.ascontiguousarray(v)) for k, v in client.items()}
    key = _keys(w, "A")[0]
    buf = io.BytesIO()
    np.save(buf, np.resize(client[key], (8, client[key].shape[1])).astype(np.float32), allow_pickle=False)
    arrays[key] = Array(dtype="float32", shape=tuple(client[key].shape), stype="numpy.ndarray", data=buf.getvalue())
    return ArrayRecord(arrays)


def _other_layers(w: Arrays, client: Arrays) -> Arrays:
    """One adapted layer fewer: another ``target_modules``."""
    gone = _keys(w, "A")[0]
    return {k: v for k, v in client.items() if k not in (gone, gone.replace(".lora_A.", ".lora_B."))}


_FAULTS = {"rank 8": lambda w, c: _other_rank(w, c, 8), "rank 2": lambda w, c: _other_rank(w, c, 2),
           "declared 10^9 rows": _huge, "one layer fewer": _other_layers, "rank 8 in the bytes": _lying_bytes}


def _lowers_f(*args: Any) -> tuple[int, int]:
    """The mutant counting: a void vote (the misfit adapter's) lowers f like a malformed reply."""
    m, void = _REAL(*args)
    return m + void, 0


_REAL = strategy_module._lost_votes


@pytest.mark.parametrize("fault", sorted(_FAULTS))
@pytest.mark.parametrize("mode", ["factors", "update", "shared"])
@pytest.mark.parametrize("counting", ["fixed", "mutant"])
def test_an_adapter_that_does_not_fit_is_a_void_vote_that_never_lowers_f(
    peft_arrays: Arrays, mode: str, fault: str, counting: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six nodes, cwtm with f = 1: four honest, node 105 Byzantine (10³-scaled), node 106 with an adapter that does
    not fit. Node 106 is dropped with reason ``adapter`` (no crash, no 256 GB read), its vote void: f stays 1 and
    the Byzantine row is trimmed — the step stays within the honest rows' spread. The mutant counting (lowering f
    for it, as for a malformed reply) makes cwtm the mean of five rows and lets the Byzantine adapter through."""
    if counting == "mutant":
        monkeypatch.setattr(strategy_module, "_lost_votes", _lowers_f)
    w = peft_arrays
    nodes = [*NODES, 106]
    clients = honest(w, 5, train_a=mode != "shared")
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=6, lora=mode)
    ins = start(s, w, nodes)
    misfit = _FAULTS[fault](w, clients[4])
    replies = [answer(ins[n], c) for n, c in zip(NODES[:4], clients)]
    replies += [answer(ins[BAD], scaled(w, clients[0], 1e3)), answer(ins[106], misfit)]
    got, metrics = new_model(s, replies, w)
    assert (metrics["replies-adapter"], metrics["replies-valid"], metrics["aggregated"]) == (1, 5, 1)
    assert [c["reason"] for c in s.contributions if c["node_id"] == 106] == ["adapter"]
    spread = float(np.abs(effect(clients[0]) - effect(w)).max())
    moved = float(np.abs(effect(got) - effect(w)).max())
    if counting == "mutant":
        assert moved > 50 * spread
        return
    assert (metrics["nodes-void"], metrics["nodes-dropped"]) == (1, 0)
    assert moved < 10 * spread


# ------------------------------------------------------------------------------------- whole runs (Strategy.start)


class LoopGrid(FakeGrid):
    """A Grid whose ``send_and_receive`` pushes the instructions (message ids set) and answers each with
    ``client(node, arrays)`` as Flower's own reply: Flower's strategy loop, in process."""

    def __init__(self, nodes: list[int], client: Any) -> None:
        super().__init__(nodes)
        self.client = client

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        sent = list(messages)
        self.push_messages(sent)
        return [answer(m, self.client(m.metadata.dst_node_id, {k: v.numpy() for k, v in m.content["arrays"].items()}))
                for m in sent]


def _fit(w: Arrays, target: dict[str, np.ndarray], train_a: bool, steps: int = 10) -> Arrays:
    """Local training: ``steps`` of gradient descent on ½‖BA − W*‖²_F per layer (A frozen unless ``train_a``), each
    at rate 0.5 / max(‖A‖₂², ‖B‖₂²), below 2 / the curvature whatever scale the re-factorisation gives B."""
    out = {k: v.astype(np.float64) for k, v in w.items()}
    for a_key, goal in target.items():
        b_key = a_key.replace(".lora_A.", ".lora_B.")
        for _ in range(steps):
            a, b = out[a_key], out[b_key]
            lr = 0.5 / max(np.linalg.norm(a, 2) ** 2, np.linalg.norm(b, 2) ** 2, 1e-12)
            err = b @ a - goal
            out[b_key] = b - lr * err @ a.T
            if train_a:
                out[a_key] = a - lr * b.T @ err
    return {k: v.astype(np.float32) for k, v in out.items()}


def _loss(w: Arrays, target: dict[str, np.ndarray]) -> float:
    return float(sum(np.linalg.norm(product(w, k) - goal) ** 2 for k, goal in target.items()))


@pytest.mark.parametrize("mode", ["factors", "update", "shared"])
def test_a_whole_run_learns_the_honest_target_under_a_scaled_byzantine_adapter(peft_arrays: Arrays, mode: str) -> None:
    """``strategy.start`` for 4 rounds, four honest nodes fitting every layer's BA to a rank-4 target W* (with A
    frozen in mode ``shared``, W* = B*A then), node 105 sending its honest adapter scaled by 10³. With cwtm (f = 1)
    the loss Σ‖BA − W*‖² ends below a quarter of its start; with the mean (the mutant) it ends above its start or the
    run keeps a model because the aggregate is not finite."""
    w = peft_arrays
    rng = np.random.default_rng(5)
    target = {}
    for a_key in _keys(w, "A"):
        a = w[a_key].astype(np.float64) if mode == "shared" else rng.standard_normal(w[a_key].shape) * 0.1
        target[a_key] = (0.1 * rng.standard_normal(w[a_key.replace(".lora_A.", ".lora_B.")].shape)) @ a

    def client(node: int, arrays: Arrays) -> Arrays:
        with np.errstate(all="ignore"):  # the mutant's model overflows: the clients train on what they get
            fitted = _fit(arrays, target, train_a=mode != "shared")
        return scaled(arrays, fitted, 1e3) if node == BAD else fitted

    start_loss = _loss(w, target)
    losses: dict[str, float] = {}
    for aggregator in ("cwtm", "mean"):
        s = PhalanxFedAvg(aggregator=aggregator, f=1, fraction_evaluate=0.0, min_available_nodes=5, lora=mode)
        result = s.start(grid=LoopGrid(NODES, client), initial_arrays=record(w), num_rounds=4)
        final = {k: result.arrays[k].numpy() for k in result.arrays}
        losses[aggregator] = _loss(final, target)
        if mode == "shared":
            for a_key in _keys(w, "A"):
                np.testing.assert_array_equal(final[a_key], w[a_key])
    assert losses["cwtm"] < start_loss / 4
    mean_kept = not np.isfinite(losses["mean"])
    assert mean_kept or losses["mean"] > start_loss


# ------------------------------------------------------------------------------------------------- refusals


def test_bad_lora_configurations_are_one_line_before_any_round(peft_arrays: Arrays) -> None:
    """An unknown mode; ``update`` at a server rate other than 1 or with a plain callable; a global record without
    any lora_A/lora_B pair: each a ConfigError naming the parameter."""
    with pytest.raises(ConfigError, match="lora"):
        PhalanxFedAvg(lora="ffa")
    with pytest.raises(ConfigError, match="server_lr"):
        PhalanxFedAvg(lora="update", server_lr=0.5)
    for mode in ("update", "shared"):
        with pytest.raises(ConfigError, match="aggregator"):
            PhalanxFedAvg(lora=mode, aggregator=lambda x: x.mean(0))
    PhalanxFedAvg(lora="factors", aggregator=lambda x: x.mean(0))  # a plain callable is the rule itself there
    s = PhalanxFedAvg(lora="factors")
    with pytest.raises(ConfigError, match="arrays"):
        s.remember_global(1, record({"head.weight": np.zeros((2, 3), np.float32)}))
    s.remember_global(1, record(peft_arrays))


def test_shared_wrapper_passes_shares_and_cuts_the_centre() -> None:
    """``SharedA``: the inner rule's shares, 0 on the frozen coordinates, a full-length centre cut to the trained
    ones (centered clipping), refactor untouched (imported, not copied: the ``update`` mode's re-factorisation is
    phalanx.aggregators.lora's)."""
    frozen = torch.tensor([True, False, False, True])
    x = torch.tensor([[9.0, 1.0, 2.0, 9.0], [9.0, 3.0, 4.0, 9.0], [9.0, 5.0, 6.0, 9.0]])
    out, share = SharedA(aggregators.make("mean", f=0), frozen).aggregate(x)
    torch.testing.assert_close(out, torch.tensor([0.0, 3.0, 4.0, 0.0]))
    torch.testing.assert_close(share, torch.full((3,), 1 / 3, dtype=torch.float64))
    inner = aggregators.make("cc", f=1)
    cc = SharedA(inner, frozen)
    assert "center" in cc.context_keys and cc.with_f(0).rule.f == 0
    got = cc(x, center=torch.tensor([100.0, 0.0, 0.0, 100.0]))
    want = inner(x[:, 1:3], center=torch.tensor([0.0, 0.0]))
    torch.testing.assert_close(got, torch.cat([torch.zeros(1), want, torch.zeros(1)]))
    import phalanx.flower.adapters as adapters_module
    assert adapters_module.AdapterUpdates.__module__ == "phalanx.aggregators.lora"
    assert refactor.__module__ == "phalanx.aggregators.lora"
