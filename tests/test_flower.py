"""phalanx.flower: the robust drop-in for Flower's FedAvg, driven with real Flower Message / RecordDict / ArrayRecord
objects, and one real offline Flower run (run_simulation with Ray) of examples/flower."""

from __future__ import annotations

import inspect
import io
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from _flower_sim import run_offline
from phalanx import aggregators
from phalanx.errors import ConfigError, PhalanxError

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
flwr = pytest.importorskip("flwr")  # CI installs it with the dev extra; the guard only serves a bare install

from flwr.app import Array, ArrayRecord, Error, Message, MessageType, Metadata, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from phalanx.flower import FlowerNotInstalledError, PhalanxFedAvg  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "flower"
SHAPES = [(4, 3), (3,)]


# ------------------------------------------------------------------------------------------------------- helpers


def meta(node_id: int, server_round: int = 1) -> Metadata:
    """A reply's metadata, as the SuperLink would fill it (a Message built outside a running app needs it)."""
    return Metadata(run_id=1, message_id=f"m{node_id}", src_node_id=node_id, dst_node_id=0, reply_to_message_id="",
                    group_id=str(server_round), created_at=time.time(), ttl=3600.0, message_type=MessageType.TRAIN)


def reply(node_id: int, arrays: list[np.ndarray] | ArrayRecord, num_examples: int | None = 10,
          server_round: int = 1, **metrics: float) -> Message:
    values: dict[str, Any] = {"loss": 0.5, **metrics}
    if num_examples is not None:
        values["num-examples"] = num_examples
    record = arrays if isinstance(arrays, ArrayRecord) else ArrayRecord(arrays)
    content = RecordDict({"arrays": record, "metrics": MetricRecord(values)})
    return Message(content=content, metadata=meta(node_id, server_round))


def error_reply(node_id: int) -> Message:
    return Message(error=Error(code=7, reason="client crashed"), metadata=meta(node_id))


def model(dtype: Any = np.float32, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def honest_models(w: list[np.ndarray], n: int, seed: int = 1) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[a + (0.1 * rng.standard_normal(a.shape)).astype(a.dtype) for a in w] for _ in range(n)]


def strategy_for(w: list[np.ndarray], server_round: int = 1, **kwargs: Any) -> PhalanxFedAvg:
    s = PhalanxFedAvg(**kwargs)
    s.remember_global(server_round, ArrayRecord(w))
    return s


def arrays_of(record: ArrayRecord | None) -> list[np.ndarray]:
    assert record is not None
    return record.to_numpy_ndarrays()


def honest_range(models: list[list[np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    stack = np.stack([m[k] for m in models])
    return stack.min(axis=0), stack.max(axis=0)


# ---------------------------------------------------------------------------------------------- the missing extra


def test_missing_flower_is_a_one_line_error_naming_the_extra() -> None:
    """With flwr unimportable (None in sys.modules: `import flwr` fails as if absent), importing phalanx.flower
    raises FlowerNotInstalledError — an ImportError — whose one line says what to install."""
    code = (
        "import sys\n"
        "for name in [m for m in sys.modules if m == 'flwr' or m.startswith('flwr.')]: del sys.modules[name]\n"
        "sys.modules['flwr'] = None\n"
        "try:\n"
        "    import phalanx.flower\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, isinstance(exc, ImportError))\n"
        "    print(str(exc))\n"
        "else:\n"
        "    print('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "FlowerNotInstalledError True", out.stdout + out.stderr
    assert len(lines) == 2
    assert "pip install 'phalanx[flower]'" in lines[1]
    assert issubclass(FlowerNotInstalledError, ImportError) and issubclass(FlowerNotInstalledError, PhalanxError)


# ------------------------------------------------------------------------------------------------- construction


def test_it_is_a_drop_in_for_fedavg() -> None:
    """Every FedAvg parameter, in FedAvg's order and with FedAvg's default; Phalanx's own are keyword-only."""
    assert issubclass(PhalanxFedAvg, FedAvg)
    ours = inspect.signature(PhalanxFedAvg.__init__).parameters
    theirs = inspect.signature(FedAvg.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    for name, p in theirs.items():
        assert ours[name].default == p.default, name
    for name in ("aggregator", "f", "server_lr", "log_path"):
        assert ours[name].kind is inspect.Parameter.KEYWORD_ONLY
    s = PhalanxFedAvg(0.5, 0.0, 3, 0, 4, "n", "weights", "cfg", aggregator="nnm>cwtm", f=1)
    assert (s.fraction_train, s.min_train_nodes, s.weighted_by_key, s.arrayrecord_key) == (0.5, 3, "n", "weights")
    assert s.f == 1 and s.rule.f == 1


@pytest.mark.parametrize(("kwargs", "parameter"), [
    ({"f": -1}, "f"),
    ({"f": 1.5}, "f"),
    ({"aggregator": "no-such-rule"}, "no-such-rule"),
    ({"aggregator": "fltrust"}, "aggregator"),
    ({"aggregator": 42}, "aggregator"),
    ({"server_lr": 0.0}, "server_lr"),
    ({"server_lr": -1.0}, "server_lr"),
    ({"server_lr": float("nan")}, "server_lr"),
    ({"fraction_train": 1.5}, "fraction_train"),
    ({"min_available_nodes": -2}, "min_available_nodes"),
])
def test_bad_arguments_are_one_line_config_errors(kwargs: dict[str, Any], parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        PhalanxFedAvg(**kwargs)
    assert parameter in str(info.value) and "\n" not in str(info.value)


def test_a_rule_object_or_a_plain_callable_is_accepted() -> None:
    rule = aggregators.make("cwmed", f=2)
    assert PhalanxFedAvg(aggregator=rule).f == 2
    assert PhalanxFedAvg(aggregator=rule, f=1).rule.f == 1
    w = model()
    models = honest_models(w, 5)
    s = strategy_for(w, aggregator=lambda x: x.median(dim=0).values)
    out = arrays_of(s.aggregate_train(1, [reply(i + 1, m) for i, m in enumerate(models)])[0])
    for k in range(len(w)):
        np.testing.assert_allclose(out[k], np.median(np.stack([m[k] for m in models]), axis=0), rtol=1e-6)


# ---------------------------------------------------------------------------------------- aggregation, honest


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_mean_equals_flowers_fedavg_with_equal_weights(dtype: Any) -> None:
    """w + 1·mean(wᵢ − w) = mean(wᵢ), FedAvg's average with equal num-examples, to the dtype's rounding."""
    w = model(dtype)
    models = honest_models(w, 6)
    ours = arrays_of(strategy_for(w, aggregator="mean").aggregate_train(
        1, [reply(i + 1, m) for i, m in enumerate(models)])[0])
    theirs = arrays_of(FedAvg().aggregate_train(1, [reply(i + 1, m) for i, m in enumerate(models)])[0])
    eps = np.finfo(dtype).eps
    for a, b, g in zip(ours, theirs, w):
        assert a.dtype == dtype and a.shape == g.shape
        scale = max(float(np.abs(g).max()), *(float(np.abs(m[0]).max()) for m in models))
        np.testing.assert_allclose(a, b, rtol=0, atol=16 * len(models) * eps * scale)


def test_the_result_keeps_the_global_records_keys_order_shapes_and_dtypes() -> None:
    g = ArrayRecord({"w": Array(np.ones((2, 3), np.float32)), "steps": Array(np.array([5], np.int64)),
                     "b": Array(np.zeros(3, np.float64))})
    s = PhalanxFedAvg(aggregator="mean")
    s.remember_global(1, g)
    replies = []
    for i in range(3):
        r = ArrayRecord({"b": Array(np.full(3, i, np.float64)), "w": Array(np.full((2, 3), 2.0, np.float32)),
                         "steps": Array(np.array([5 + 2 * i], np.int64))})  # another key order: fine
        replies.append(reply(i + 1, r))
    out, _ = s.aggregate_train(1, replies)
    assert out is not None and list(out.keys()) == ["w", "steps", "b"]
    assert [out[k].numpy().dtype for k in out] == [np.float32, np.int64, np.float64]
    np.testing.assert_allclose(out["w"].numpy(), 2.0)
    np.testing.assert_array_equal(out["steps"].numpy(), [7])
    np.testing.assert_allclose(out["b"].numpy(), 1.0)


def test_server_lr_scales_the_step() -> None:
    w = model(np.float64)
    models = honest_models(w, 4)
    out = arrays_of(strategy_for(w, aggregator="mean", server_lr=0.5).aggregate_train(
        1, [reply(i + 1, m) for i, m in enumerate(models)])[0])
    for k, g in enumerate(w):
        np.testing.assert_allclose(out[k], g + 0.5 * (np.mean([m[k] for m in models], axis=0) - g), rtol=1e-12)


def test_num_examples_is_logged_never_used_as_a_weight() -> None:
    """A client claiming 10⁶ examples weighs what the others weigh (with FedAvg it would decide the model)."""
    w = model(np.float64)
    models = honest_models(w, 4)
    counts = [10, 10, 10, 1_000_000]
    s = strategy_for(w, aggregator="mean")
    out = arrays_of(s.aggregate_train(1, [reply(i + 1, m, c) for i, (m, c) in enumerate(zip(models, counts))])[0])
    np.testing.assert_allclose(out[0], np.mean([m[0] for m in models], axis=0), rtol=1e-12)
    assert [c["num_examples"] for c in s.contributions] == counts
    missing = strategy_for(w, aggregator="mean")
    out2 = arrays_of(missing.aggregate_train(1, [reply(i + 1, m, None) for i, m in enumerate(models)])[0])
    np.testing.assert_allclose(out2[0], out[0])
    assert all(c["num_examples"] is None and c["status"] == "used" for c in missing.contributions)


# --------------------------------------------------------------------------------------- aggregation, Byzantine


def test_the_trimmed_mean_survives_a_huge_reply_that_ruins_fedavg() -> None:
    w = model()
    models = honest_models(w, 6)
    byzantine = [np.full_like(a, 1e6) for a in w]
    replies = [reply(i + 1, m) for i, m in enumerate(models)] + [reply(99, byzantine)]
    ours = arrays_of(strategy_for(w, aggregator="cwtm", f=1).aggregate_train(1, replies)[0])
    fedavg = arrays_of(FedAvg().aggregate_train(
        1, [reply(i + 1, m) for i, m in enumerate(models)] + [reply(99, byzantine)])[0])
    for k in range(len(w)):
        low, high = honest_range(models, k)
        assert np.all(ours[k] >= low - 1e-6) and np.all(ours[k] <= high + 1e-6)
        assert np.all(np.abs(fedavg[k]) > 1e4)  # FedAvg is ruined


@pytest.mark.parametrize("spec", ["cwmed", "cwtm"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_go_to_the_rule_and_are_survived(spec: str, bad: float) -> None:
    w = model()
    models = honest_models(w, 6)
    s = strategy_for(w, aggregator=spec, f=1)
    out, metrics = s.aggregate_train(
        1, [reply(i + 1, m) for i, m in enumerate(models)] + [reply(99, [np.full_like(a, bad) for a in w])])
    assert metrics is not None and metrics["aggregated"] == 1 and metrics["replies-dropped"] == 0
    for k, a in enumerate(arrays_of(out)):
        low, high = honest_range(models, k)
        assert np.isfinite(a).all() and np.all(a >= low - 1e-6) and np.all(a <= high + 1e-6)
    assert [c["status"] for c in s.contributions] == ["used"] * 7  # not dropped: the rule handled it


def test_a_rule_that_does_not_survive_keeps_the_global_model() -> None:
    """The mean of a NaN reply is NaN: the round keeps w (and says so) instead of writing NaN into the model."""
    w = model()
    s = strategy_for(w, aggregator="mean")
    out, metrics = s.aggregate_train(1, [reply(1, honest_models(w, 1)[0]), reply(2, [a * np.nan for a in w])])
    for a, g in zip(arrays_of(out), w):
        np.testing.assert_array_equal(a, g)
    assert metrics is not None and metrics["aggregated"] == 0
    assert all(c["status"].startswith("not aggregated: the aggregate is not finite") for c in s.contributions)


def lying_array() -> Array:
    """Declares (4, 3) float32 but holds 5 values."""
    buf = io.BytesIO()
    np.save(buf, np.ones(5, np.float32), allow_pickle=False)
    return Array(dtype="float32", shape=(4, 3), stype="numpy.ndarray", data=buf.getvalue())


def garbage_array() -> Array:
    return Array(dtype="float32", shape=(4, 3), stype="numpy.ndarray", data=b"not an npy file")


def test_replies_with_a_wrong_structure_are_dropped_logged_and_counted_against_f() -> None:
    w = model()
    models = honest_models(w, 7)
    bad = {
        101: reply(101, [np.ones(5, np.float32), w[1]]),                                     # wrong shape
        102: Message(content=RecordDict({"metrics": MetricRecord({"num-examples": 3})}), metadata=meta(102)),
        103: error_reply(103),                                                                # error reply
        104: reply(104, ArrayRecord({"0": Array(w[0]), "x": Array(w[1])})),                   # wrong keys
        105: reply(105, ArrayRecord({"0": lying_array(), "1": Array(w[1])})),                 # shape lies
        106: reply(106, ArrayRecord({"0": garbage_array(), "1": Array(w[1])})),               # unreadable bytes
        107: reply(107, [np.full((4, 3), "x"), w[1]]),                                         # not numbers
    }
    replies = [reply(i + 1, m) for i, m in enumerate(models)] + list(bad.values())
    f = 9
    s = strategy_for(w, aggregator="cwtm", f=f)
    out, metrics = s.aggregate_train(1, replies)
    assert metrics is not None
    assert (metrics["replies-received"], metrics["replies-valid"], metrics["replies-dropped"]) == (14, 7, 7)
    assert metrics["aggregated"] == 1
    # the rule configured for f − 7 = 2 over the 7 valid updates
    x = torch.tensor(np.stack([np.concatenate([(m[k] - w[k]).ravel() for k in range(2)]) for m in models]))
    expected = np.concatenate([a.ravel() for a in w]) + aggregators.make("cwtm", f=2)(x).numpy()
    np.testing.assert_allclose(np.concatenate([a.ravel() for a in arrays_of(out)]), expected, rtol=1e-6, atol=1e-7)
    status = {c["node_id"]: c["status"] for c in s.contributions}
    assert all(status[i + 1] == "used" for i in range(7))
    assert status[101].startswith("dropped: wrong shape of '0'")
    assert status[102].startswith("dropped: no ArrayRecord")
    assert status[103] == "dropped: error reply (code 7): client crashed"
    assert status[104].startswith("dropped: wrong keys")
    assert status[105].startswith("dropped: wrong shape of '0'")
    assert status[106].startswith("dropped: unreadable array '0'")
    assert status[107].startswith("dropped: wrong dtype of '0'")


def test_more_dropped_than_f_still_aggregates_what_the_rule_allows() -> None:
    w = model()
    models = honest_models(w, 3)
    s = strategy_for(w, aggregator="cwtm", f=1)
    out, metrics = s.aggregate_train(1, [reply(i + 1, m) for i, m in enumerate(models)] + [error_reply(8),
                                                                                          error_reply(9)])
    assert metrics is not None and metrics["aggregated"] == 1  # cwtm for f = 0: the mean of the 3
    np.testing.assert_allclose(arrays_of(out)[0], np.mean([m[0] for m in models], axis=0), rtol=1e-5)


def test_too_few_updates_for_the_rule_keep_the_global_model(caplog: pytest.LogCaptureFixture) -> None:
    w = model()
    s = strategy_for(w, aggregator="krum", f=2)  # needs n >= 2f + 3 = 7
    with caplog.at_level(logging.INFO, logger="flwr"):
        out, metrics = s.aggregate_train(1, [reply(i + 1, m) for i, m in enumerate(honest_models(w, 4))])
    for a, g in zip(arrays_of(out), w):
        np.testing.assert_array_equal(a, g)
    assert metrics is not None and metrics["aggregated"] == 0
    assert any("keeps the global model" in r.getMessage() and "needs 7 updates, got 4" in r.getMessage()
               for r in caplog.records)
    no_valid = strategy_for(w, aggregator="cwtm", f=1)
    out2, m2 = no_valid.aggregate_train(1, [error_reply(1), error_reply(2)])
    assert m2 is not None and m2["aggregated"] == 0 and m2["replies-valid"] == 0
    np.testing.assert_array_equal(arrays_of(out2)[0], w[0])


def test_dropped_replies_can_be_left_out_of_f() -> None:
    w = model()
    models = honest_models(w, 5)
    s = strategy_for(w, aggregator="cwtm", f=2, count_dropped_against_f=False)
    out, _ = s.aggregate_train(1, [reply(i + 1, m) for i, m in enumerate(models)] + [error_reply(9)])
    x = torch.tensor(np.stack([np.concatenate([(m[k] - w[k]).ravel() for k in range(2)]) for m in models]))
    expected = np.concatenate([a.ravel() for a in w]) + aggregators.make("cwtm", f=2)(x).numpy()
    np.testing.assert_allclose(np.concatenate([a.ravel() for a in arrays_of(out)]), expected, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------- contributions and metrics


def test_contributions_one_record_per_reply_in_memory_and_in_the_jsonl(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "logs" / "contributions.jsonl"
    w = model()
    s = PhalanxFedAvg(aggregator="nnm>cwtm", f=2, log_path=path)  # two Byzantine replies per round
    with caplog.at_level(logging.INFO, logger="flwr"):
        for rnd in (1, 2):
            s.remember_global(rnd, ArrayRecord(w))
            models = honest_models(w, 5, seed=rnd)
            replies = [reply(i + 1, m, server_round=rnd) for i, m in enumerate(models)]
            replies += [reply(50, [np.full_like(a, np.nan) for a in w], server_round=rnd), error_reply(51)]
            out, _ = s.aggregate_train(rnd, replies)
            w = arrays_of(out)
    assert len(s.contributions) == 14
    keys = {"round", "node_id", "status", "reason", "update_norm", "distance_to_aggregate", "share", "num_examples"}
    assert all(set(c) == keys for c in s.contributions)
    assert [c["round"] for c in s.contributions] == [1] * 7 + [2] * 7
    first = s.contributions[:7]
    assert [c["node_id"] for c in first] == [1, 2, 3, 4, 5, 50, 51]
    assert all(c["status"] == "used" and c["update_norm"] > 0 and np.isfinite(c["distance_to_aggregate"])
               for c in first[:5])
    assert first[5]["status"] == "used" and np.isnan(first[5]["update_norm"])  # the NaN reply went to the rule
    assert first[6]["status"].startswith("dropped: error reply") and first[6]["update_norm"] is None
    assert [c["reason"] for c in first] == ["used"] * 6 + ["error"]
    shares = [c["share"] for c in first[:6]]
    assert all(v is not None for v in shares) and sum(shares) == pytest.approx(1.0)
    assert shares[5] == pytest.approx(0.0, abs=1e-12)  # the NaN row is never trusted
    lines = path.read_text().splitlines()
    assert len(lines) == 14
    rows = [json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}")) for line in lines]
    assert rows[5]["update_norm"] is None and rows[0]["node_id"] == 1
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phalanx: round ")]
    assert len(summaries) == 2 and "7 replies, 6 used, 1 dropped" in summaries[0]


def test_train_metrics_are_the_unweighted_median() -> None:
    """A Byzantine client reporting loss 10⁹ with 10⁶ examples moves FedAvg's loss, not the median."""
    w = model()
    replies = [reply(i + 1, m, loss=0.1 * (i + 1)) for i, m in enumerate(honest_models(w, 4))]
    replies.append(reply(9, w, 1_000_000, loss=1e9))
    _, metrics = strategy_for(w, aggregator="cwtm", f=1).aggregate_train(1, replies)
    assert metrics is not None and metrics["loss"] == pytest.approx(0.3)
    assert "num-examples" not in metrics


def test_a_byzantine_nodes_own_metrics_are_not_reported() -> None:
    """A review of the strategy: one node's keys that no honest node sends (accuracy 1.0, a backdoor's success 0.0,
    100,000 more keys, a list of 2·10⁶ floats) went straight through the median of one value, and Flower logs and
    keeps the record every round. A key now needs 2f + 1 clients' finite values; an oversized record is left out."""
    w = model()
    replies = [reply(i + 1, m, loss=0.1 * (i + 1)) for i, m in enumerate(honest_models(w, 4))]
    byz = reply(9, w, accuracy=1.0, **{"backdoor-success": 0.0}, **{f"k{i}": 1.0 for i in range(300)})
    byz.content["metrics"]["big"] = [1.0] * 5000
    _, metrics = strategy_for(w, aggregator="cwtm", f=1).aggregate_train(1, [*replies, byz])
    assert metrics is not None and metrics["loss"] == pytest.approx(0.25)  # the oversized record is left out whole
    assert not {"accuracy", "backdoor-success", "big", "k0"} & set(metrics.keys())
    _, lone = strategy_for(w, aggregator="cwtm", f=1).aggregate_train(1, [*replies, reply(9, w, accuracy=1.0)])
    assert lone is not None and "accuracy" not in lone  # one node's key alone, without the oversized record


def test_metrics_follow_the_rounds_own_f_when_a_node_is_counted_against_it() -> None:
    """A review: with f = 2 and one of five nodes dropped (counted against f), the update's rule ran for f = 1 but the
    metrics still asked for 2·2 + 1 = 5 clients, so none were reported. They follow the round's f, as its rule does."""
    w = model()
    replies = [reply(i + 1, m, loss=0.1 * (i + 1)) for i, m in enumerate(honest_models(w, 4))]
    replies.append(error_reply(5))
    s = strategy_for(w, aggregator="cwtm", f=2, count_dropped_against_f=True)
    _, metrics = s.aggregate_train(1, replies)
    assert metrics is not None and metrics["loss"] == pytest.approx(0.25)


def test_a_0_d_array_comes_back_0_d() -> None:
    """A review: ``np.ascontiguousarray`` makes a 0-d array 1-d, so a BatchNorm's ``num_batches_tracked`` came back
    with shape (1,) every round."""
    w = [*model(), np.array(7, dtype=np.int64), np.array(0.5, dtype=np.float32)]
    replies = [reply(i + 1, [np.asarray(a) for a in m]) for i, m in enumerate(honest_models(w, 5))]
    arrays, _ = strategy_for(w, aggregator="cwtm", f=1).aggregate_train(1, replies)
    assert [a.shape for a in arrays_of(arrays)[-2:]] == [(), ()]


def test_metrics_that_are_no_finite_float_count_as_missing() -> None:
    """In-process Flower passes a Python int of 400 digits through (gRPC would not): it raised OverflowError in the
    median and TypeError in np.isfinite, and the run ended."""
    w = model()
    replies = [reply(i + 1, m) for i, m in enumerate(honest_models(w, 4))]
    byz = reply(9, w)
    byz.content["metrics"]["loss"] = 10 ** 400
    byz.content["metrics"]["curve"] = [10 ** 400, 10 ** 400]
    _, metrics = strategy_for(w, aggregator="cwtm", f=1).aggregate_train(1, [*replies, byz])
    assert metrics is not None and metrics["loss"] == pytest.approx(0.5)


def test_a_num_examples_too_large_for_a_float_is_missing_and_the_update_is_kept() -> None:
    """num-examples = 10⁴⁰⁰ (in-process Flower passes it through): the reply is used and its num_examples is null,
    as for a missing one. The old code's float() raised OverflowError, and the whole valid update was dropped as an
    'unreadable reply' and counted against f."""
    w = model(np.float64)
    models = honest_models(w, 5)
    replies = [reply(i + 1, m) for i, m in enumerate(models)]
    replies[4].content["metrics"]["num-examples"] = 10 ** 400
    s = strategy_for(w, aggregator="cwtm", f=1)
    _, metrics = s.aggregate_train(1, replies)
    assert metrics is not None and (metrics["replies-valid"], metrics["nodes-dropped"]) == (5, 0)
    assert s.contributions[4]["status"] == "used" and s.contributions[4]["num_examples"] is None


def test_an_integer_array_is_never_rounded_through_the_compute_dtype() -> None:
    """A float32 model with an int64 buffer of 2²⁴ + 1: the strategy gave back 2²⁴ even on a round that kept the
    model (float32 rounding; a review of the strategy). Now an integer array is itself plus the rounded change."""
    w = [*model(), np.array([2 ** 24 + 1, 123_456_789], dtype=np.int64)]
    replies = [reply(i + 1, [*m[:-1], w[-1]]) for i, m in enumerate(honest_models(w[:-1], 5))]
    arrays, _ = strategy_for(w, aggregator="cwtm", f=1).aggregate_train(1, replies)
    assert arrays_of(arrays)[-1].tolist() == [2 ** 24 + 1, 123_456_789]
    kept, _ = strategy_for(w, aggregator="bulyan", f=1).aggregate_train(1, replies)  # too few replies: kept
    assert arrays_of(kept)[-1].tolist() == [2 ** 24 + 1, 123_456_789]


def test_an_integer_array_saturates_instead_of_wrapping_around() -> None:
    """A review: int64 7 + 10³⁰ gave −2⁶³ + 7 and uint8 250 + 10 gave 4 (as before the exact integer path)."""
    from phalanx.flower.replies import _saturated

    big = np.array([7, 2 ** 62, 7], dtype=np.int64)
    assert _saturated(big, np.array([1e30, 2.0 ** 62, -1e30])).tolist() == [2 ** 63 - 1, 2 ** 63 - 1, -2 ** 63]
    assert _saturated(np.array([250, 5], dtype=np.uint8), np.array([10.0, -6.0])).tolist() == [255, 0]
    assert _saturated(np.array([100], dtype=np.int8), np.array([np.nan])).tolist() == [100]


def test_evaluate_replies_are_aggregated_without_crashing_on_bad_ones() -> None:
    good = [Message(content=RecordDict({"metrics": MetricRecord({"accuracy": a, "num-examples": 10})}),
                    metadata=meta(i + 1)) for i, a in enumerate([0.8, 0.9, 0.85])]
    odd = Message(content=RecordDict({"metrics": MetricRecord({"accuracy": 1.0})}), metadata=meta(8))  # no weight
    bad = [error_reply(9), Message(content=RecordDict({}), metadata=meta(10)), odd]
    s = PhalanxFedAvg()
    metrics = s.aggregate_evaluate(1, good + bad)
    assert metrics is not None and metrics["accuracy"] == pytest.approx(0.875)
    with pytest.raises(Exception):  # noqa: B017 - Flower's own FedAvg stops the run on the same replies
        FedAvg().aggregate_evaluate(1, good + bad)


def test_a_byzantine_nodes_own_evaluate_key_is_not_reported() -> None:
    """Evaluation metrics need 2f + 1 clients' values per key, as the train metrics do: with f = 1, two honest nodes
    and one Byzantine node adding ``backdoor-accuracy`` (and claiming accuracy 1.0), the key is left out and the
    accuracy is the median 0.82. A mutant that asked the evaluate median for f = 0 reported the Byzantine key."""
    values = [{"accuracy": 0.8}, {"accuracy": 0.82}, {"accuracy": 1.0, "backdoor-accuracy": 0.0}]
    replies = [Message(content=RecordDict({"metrics": MetricRecord(v)}), metadata=meta(i + 1))
               for i, v in enumerate(values)]
    metrics = PhalanxFedAvg(aggregator="cwtm", f=1).aggregate_evaluate(1, replies)
    assert metrics is not None and dict(metrics) == {"accuracy": pytest.approx(0.82)}


def test_a_metrics_function_that_raises_anything_falls_back_to_the_median() -> None:
    """Flower's own weighted average as ``train_metrics_aggr_fn``, and one reply without ``num-examples``: it raises
    KeyError; the round is still aggregated, its metrics the per-key median. A mutant that caught only
    ZeroDivisionError let the KeyError end the run."""
    from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

    w = model()
    models = honest_models(w, 5)
    replies = [reply(i + 1, m, None if i == 4 else 10, loss=0.1 * (i + 1)) for i, m in enumerate(models)]
    s = strategy_for(w, aggregator="cwtm", f=1, train_metrics_aggr_fn=aggregate_metricrecords)
    _, metrics = s.aggregate_train(1, replies)
    assert metrics is not None and metrics["aggregated"] == 1 and metrics["loss"] == pytest.approx(0.3)


def test_a_declared_shape_that_does_not_fit_is_dropped_before_its_bytes_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reply whose array declares shape (10⁹,) over bytes of the right (4, 3) array: dropped as a wrong shape
    without ``Array.numpy`` being called on it (a huge declared array is never deserialised). A mutant that skipped
    the declared check read the bytes, found (4, 3) and used the reply."""
    w = model()
    calls: list[tuple[int, ...]] = []
    numpy = Array.numpy

    def spy(self: Array) -> np.ndarray:
        calls.append(tuple(self.shape))
        return numpy(self)

    good = Array(w[0])
    lying = Array(dtype=good.dtype, shape=(10 ** 9,), stype=good.stype, data=good.data)
    s = strategy_for(w, aggregator="mean")
    monkeypatch.setattr(Array, "numpy", spy)  # after the broadcast model was read
    s.aggregate_train(1, [reply(7, ArrayRecord({"0": lying, "1": Array(w[1])}))])
    assert s.contributions[-1]["status"] == "dropped: wrong shape of '0': got (1000000000,), expected (4, 3)"
    assert calls == []


def test_centered_clipping_is_centred_on_the_previous_rounds_aggregate() -> None:
    """cc (τ = 0.01, one iteration) over two rounds: round 1's updates are about +1, round 2's about +5. Centred on
    round 1's aggregate, round 2 moves at most τ from it (the rule called with that centre); a mutant that never
    passed the centre started from the median and stepped about +5."""
    w = model(np.float64)
    s = strategy_for(w, aggregator=aggregators.make("cc", f=1, tau=0.01))
    first = [[a + 1.0 for a in m] for m in honest_models(w, 5)]
    out1 = arrays_of(s.aggregate_train(1, [reply(i + 1, m) for i, m in enumerate(first)])[0])
    prev = np.concatenate([a.ravel() for a in out1]) - np.concatenate([a.ravel() for a in w])
    s.remember_global(2, ArrayRecord(out1))
    second = [[a + 5.0 for a in m] for m in honest_models(out1, 5, seed=2)]
    out2 = arrays_of(s.aggregate_train(2, [reply(i + 1, m, server_round=2) for i, m in enumerate(second)])[0])
    got = np.concatenate([a.ravel() for a in out2]) - np.concatenate([a.ravel() for a in out1])
    x = torch.tensor(np.stack([np.concatenate([(m[k] - out1[k]).ravel() for k in range(2)]) for m in second]))
    expected, _ = aggregators.make("cc", f=1, tau=0.01).aggregate(x, center=torch.tensor(prev))
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-9, atol=1e-12)
    assert np.linalg.norm(got - prev) <= 0.01 + 1e-9


def test_a_round_without_replies_keeps_the_model_as_fedavg_does() -> None:
    assert strategy_for(model()).aggregate_train(1, []) == (None, None) == FedAvg().aggregate_train(1, [])


def test_aggregate_train_needs_the_broadcast_model() -> None:
    with pytest.raises(PhalanxError, match="remember_global"):
        PhalanxFedAvg().aggregate_train(3, [])


# ------------------------------------------------------------------------------------------ a real Flower run


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks for leftover processes in /proc")
def test_a_real_offline_flower_run_of_the_example(tmp_path: Path) -> None:
    """examples/flower/run.py: Flower's simulation engine (run_simulation, Ray), 6 clients of which 2 send flipped,
    10×-scaled updates, 3 rounds, the trimmed mean for f = 2. The model ends near the honest clients' FedAvg, every
    reply is logged, and no Ray process is left behind."""
    pytest.importorskip("ray")
    args = ["--only", "phalanx", "--rounds", "3", "--clients", "6", "--byzantine", "2", "--f", "2"]
    (outcome,), log_path = run_offline(EXAMPLE / "run.py", args, tmp_path, "rayt")
    assert outcome["distance_to_honest"] < 0.25 * outcome["honest_norm"], outcome
    assert outcome["test_accuracy"] > 0.85, outcome
    rows = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(rows) == outcome["contributions"] == 18
    assert {r["round"] for r in rows} == {1, 2, 3} and all(r["status"] == "used" for r in rows)
