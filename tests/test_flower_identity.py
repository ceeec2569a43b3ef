"""phalanx.flower: one vote per sampled node and round, and SecAgg+ refused — with real Flower Messages.

Each round is driven as Flower drives it: ``PhalanxFedAvg.configure_train`` samples the nodes of a Grid and returns
the instructions, the Grid gives each its ``message_id`` in place when it pushes it (as ``InMemoryGrid`` does), and
honest replies are Flower's own ``Message(content, reply_to=instruction)``. Byzantine replies are forged with
``Metadata`` the sender chooses: another node's id, an instruction sent to someone else, a previous round's
instruction, several replies at once.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from phalanx import aggregators
from phalanx.errors import ConfigError

flwr = pytest.importorskip("flwr")

from flwr.app import (  # noqa: E402
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
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402

from phalanx.flower import PhalanxFedAvg  # noqa: E402
from test_flower import honest_models, model  # noqa: E402

NODES = [101, 102, 103, 104, 105]
BAD = 105


# ------------------------------------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def serverapp_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity a running ServerApp process has (Flower's instruction Messages read it when built)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", SUPERLINK_NODE_ID), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


class FakeGrid(Grid):
    """A Grid of connected node ids that gives each pushed instruction a message id in place, as Flower's
    ``InMemoryGrid.push_messages`` does; nothing is delivered (the tests answer the instructions themselves)."""

    def __init__(self, nodes: Iterable[int]) -> None:
        self.nodes = list(nodes)
        self._ids = itertools.count()

    def set_run(self, run: Any) -> None:  # pragma: no cover - not used by the strategy
        raise NotImplementedError

    @property
    def run(self) -> Any:  # pragma: no cover - as above
        raise NotImplementedError

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:  # pragma: no cover - deprecated in Flower
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = f"ins-{next(self._ids)}"
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # pragma: no cover
        return []

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        self.push_messages(messages)  # pragma: no cover
        return []  # pragma: no cover


def start_round(s: PhalanxFedAvg, grid: FakeGrid, w: list[np.ndarray], server_round: int = 1,
                evaluate: bool = False) -> dict[int, Message]:
    """The round's instructions by destination node, after the Grid has pushed them (message ids set)."""
    record, config = ArrayRecord(w), ConfigRecord({"lr": 0.1})
    if evaluate:
        sent = list(s.configure_evaluate(server_round, record, config, grid))
    else:
        sent = list(s.configure_train(server_round, record, config, grid))
    grid.push_messages(sent)
    return {m.metadata.dst_node_id: m for m in sent}


def content(arrays: list[np.ndarray], num_examples: int = 10, **metrics: float) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord(arrays),
                       "metrics": MetricRecord({"loss": 0.5, "num-examples": num_examples, **metrics})})


def answer(ins: Message, arrays: list[np.ndarray], **metrics: float) -> Message:
    """Flower's own reply to ``ins`` (what a ClientApp returns): src, reply_to and group_id from the instruction."""
    return Message(content(arrays, **metrics), reply_to=ins)


def forged(ins: Message, src: int, arrays: list[np.ndarray] | None = None, group_id: str | None = None,
           error: Error | None = None) -> Message:
    """A reply to ``ins`` whose sender claims to be ``src`` (and, optionally, another ``group_id``)."""
    md = ins.metadata
    meta = Metadata(run_id=md.run_id, message_id="", src_node_id=src, dst_node_id=md.src_node_id,
                    reply_to_message_id=md.message_id, group_id=md.group_id if group_id is None else group_id,
                    created_at=md.created_at, ttl=md.ttl, message_type=md.message_type)
    if error is not None:
        return Message(error=error, metadata=meta)
    assert arrays is not None
    return Message(content=content(arrays), metadata=meta)


def shifted(w: list[np.ndarray], by: float) -> list[np.ndarray]:
    return [a + np.asarray(by, dtype=a.dtype) for a in w]


def flat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a).ravel() for a in arrays])


def step(s: PhalanxFedAvg, server_round: int, replies: list[Message], w: list[np.ndarray]
         ) -> tuple[np.ndarray, MetricRecord]:
    """The round's step w_new − w (flat) and its train metrics."""
    out, metrics = s.aggregate_train(server_round, replies)
    assert out is not None and metrics is not None
    return flat(out.to_numpy_ndarrays()) - flat(w), metrics


def rule_step(spec: str, f: int, w: list[np.ndarray], models: list[list[np.ndarray]]) -> np.ndarray:
    """The rule on the honest rows alone, as the strategy forms them (Δᵢ = wᵢ − w in the model's dtype)."""
    x = torch.tensor(np.stack([flat(m) - flat(w) for m in models]))
    return aggregators.make(spec, f=f)(x).numpy()


def by_node(s: PhalanxFedAvg) -> dict[int | None, list[tuple[str, str]]]:
    out: dict[int | None, list[tuple[str, str]]] = {}
    for c in s.contributions:
        out.setdefault(c["node_id"], []).append((c["reason"], c["status"]))
    return out


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "dropped" in r.getMessage()]


# ---------------------------------------------------------------------------------------- one vote per node


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_node_replying_three_times_loses_its_vote_as_a_silent_node_does(dtype: Any) -> None:
    """The measured case: cwtm, f = 1, four honest replies (+0.1) and one node replying three times (+100). Counted
    per reply, the trimmed mean of the seven rows keeps two of the three and steps +40.06; one vote per node drops
    all three and the step is the one of the round where that node was silent: +0.1, the rule on the honest rows.
    Its vote is void, which does not lower f (tests/test_flower_void.py): the rule stays cwtm with f = 1."""
    w = model(dtype)
    honest, bad = shifted(w, 0.1), shifted(w, 100.0)
    per_reply = rule_step("cwtm", 1, w, [honest] * 4 + [bad] * 3)
    np.testing.assert_allclose(per_reply, 40.06, rtol=1e-3)  # what the strategy used to do

    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    replies = [answer(ins[n], honest) for n in NODES[:4]] + [answer(ins[BAD], bad) for _ in range(3)]
    got, metrics = step(s, 1, replies, w)

    silent = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    ins2 = start_round(silent, FakeGrid(NODES), w)
    without, _ = step(silent, 1, [answer(ins2[n], honest) for n in NODES[:4]], w)

    expected = rule_step("cwtm", 1, w, [honest] * 4)  # the honest rows; f kept
    magnitude = float(np.abs(flat(w)).max()) + 0.1
    tol = 8 * float(torch.finfo(torch.float32 if dtype == np.float32 else torch.float64).eps) * magnitude
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol)
    np.testing.assert_allclose(got, without, rtol=0, atol=tol)
    np.testing.assert_allclose(got, 0.1, rtol=0, atol=tol)
    assert (metrics["replies-received"], metrics["replies-valid"], metrics["replies-dropped"]) == (7, 4, 3)
    assert (metrics["replies-duplicate"], metrics["nodes-dropped"], metrics["aggregated"]) == (3, 0, 1)
    assert metrics["nodes-void"] == 1
    assert [r for r, _ in by_node(s)[BAD]] == ["duplicate"] * 3


def test_a_silent_sampled_node_counts_against_f_like_a_missing_worker() -> None:
    """Seven sampled nodes, one silent: the rule for f − 1 on the six replies (the Phalanx server's convention)."""
    w = model(np.float64)
    nodes = [101, 102, 103, 104, 105, 106, 107]
    models = honest_models(w, 6)
    s = PhalanxFedAvg(aggregator="cwtm", f=2, min_available_nodes=7)
    ins = start_round(s, FakeGrid(nodes), w)
    got, metrics = step(s, 1, [answer(ins[n], m) for n, m in zip(nodes, models)], w)
    assert metrics["nodes-dropped"] == 1
    expected = rule_step("cwtm", 1, w, models)
    tol = 8 * float(torch.finfo(torch.float64).eps) * (float(np.abs(flat(w)).max()) + 1.0)
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol)


def test_a_duplicated_node_loses_its_vote_but_not_f_unlike_an_error_reply() -> None:
    """Distinct honest rows: the double-voter's replies are all dropped, and its void vote leaves f = 2 (the second
    reply in its name need not be its own); one error reply from it is its own doing and costs f one — the rule for
    f − 1 on the same honest rows."""
    w = model(np.float64)
    nodes = [101, 102, 103, 104, 105, 106, 107]
    models = honest_models(w, 6)
    s = PhalanxFedAvg(aggregator="cwtm", f=2, min_available_nodes=7)
    ins = start_round(s, FakeGrid(nodes), w)
    honest = [answer(ins[n], m) for n, m in zip(nodes, models)]
    twice = [answer(ins[107], shifted(w, 1e3)), answer(ins[107], shifted(w, -1e3))]
    got, metrics = step(s, 1, [*honest, *twice], w)

    crashed = PhalanxFedAvg(aggregator="cwtm", f=2, min_available_nodes=7)
    ins2 = start_round(crashed, FakeGrid(nodes), w)
    error = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="crashed"), reply_to=ins2[107])
    with_error, m2 = step(crashed, 1, [answer(ins2[n], m) for n, m in zip(nodes, models)] + [error], w)

    np.testing.assert_allclose(got, rule_step("cwtm", 2, w, models), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(with_error, rule_step("cwtm", 1, w, models), rtol=1e-12, atol=1e-14)
    assert (metrics["nodes-dropped"], metrics["nodes-void"]) == (0, 1)
    assert (m2["nodes-dropped"], m2["nodes-void"]) == (1, 0)
    assert metrics["replies-duplicate"] == 2 and m2["replies-duplicate"] == 0
    status = by_node(s)[107]
    assert status == [("duplicate", "dropped: duplicate: node 107 sent 2 replies in round 1; all of them are "
                                    "dropped")] * 2
    assert by_node(crashed)[107] == [("error", "dropped: error reply (code 2): crashed")]


def test_replies_from_nodes_the_round_did_not_sample_are_dropped_and_not_counted_against_f() -> None:
    """A connected node left out of the sample, and an id no node has, both answering a sampled node's
    instruction: dropped before being read, and f is unchanged (made-up ids cannot lower it)."""
    w = model(np.float64)
    nodes = [101, 102, 103, 104, 105, 106]
    s = PhalanxFedAvg(aggregator="cwtm", f=1, fraction_train=0.5, min_train_nodes=5, min_available_nodes=6)
    ins = start_round(s, FakeGrid(nodes), w)
    (left_out,) = set(nodes) - set(ins)
    sampled = sorted(ins)
    models = honest_models(w, 5)
    honest = [answer(ins[n], m) for n, m in zip(sampled, models)]
    spam = [forged(ins[sampled[0]], left_out, shifted(w, 1e6)), forged(ins[sampled[1]], 999, shifted(w, -1e6))]
    got, metrics = step(s, 1, honest + spam, w)
    np.testing.assert_allclose(got, rule_step("cwtm", 1, w, models), rtol=1e-12, atol=1e-14)  # f = 1 kept
    assert (metrics["replies-unsampled"], metrics["nodes-dropped"], metrics["replies-dropped"]) == (2, 0, 2)
    assert by_node(s)[left_out] == [("unsampled", f"dropped: unsampled: node {left_out} was not sampled in round 1")]
    assert by_node(s)[999][0][0] == "unsampled"
    assert all(c["update_norm"] is None and c["num_examples"] is None for c in s.contributions[5:])  # never read


def test_a_reply_claiming_another_nodes_vote_is_dropped() -> None:
    """Node 101 answers the instruction sent to node 102 (a node claiming another node's vote), and a reply claims
    node 103's id on the instruction sent to node 104 (a node claiming another node's id): both dropped as
    impostors, not counted against f; the genuine replies of 101…104 are used."""
    w = model(np.float64)
    models = honest_models(w, 5)
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    honest = [answer(ins[n], m) for n, m in zip(NODES, models)]
    fakes = [forged(ins[102], 101, shifted(w, 1e6)), forged(ins[104], 103, shifted(w, -1e6))]
    got, metrics = step(s, 1, [fakes[0], *honest, fakes[1]], w)
    np.testing.assert_allclose(got, rule_step("cwtm", 1, w, models), rtol=1e-12, atol=1e-14)
    assert (metrics["replies-impostor"], metrics["replies-duplicate"], metrics["nodes-dropped"]) == (2, 0, 0)
    claim = "dropped: impostor: from node {}, but answers the instruction sent to node {}"
    assert by_node(s)[101] == [("impostor", claim.format(101, 102)), ("used", "used")]
    assert by_node(s)[103] == [("used", "used"), ("impostor", claim.format(103, 104))]
    assert [r for r, _ in by_node(s)[102]] == ["used"]


def test_stale_replies_of_the_previous_round_are_dropped() -> None:
    """Round 2: a replay of node 101's round-1 reply, and a reply to a round-2 instruction that names round 1 in
    its group_id, are dropped as stale; node 101's own round-2 reply is still its one vote (a replay cannot
    silence a node)."""
    w = model(np.float64)
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    grid = FakeGrid(NODES)
    ins1 = start_round(s, grid, w)
    old = answer(ins1[101], shifted(w, 1e6))
    s.aggregate_train(1, [answer(ins1[n], m) for n, m in zip(NODES, honest_models(w, 5))])
    ins2 = start_round(s, grid, w, server_round=2)
    assert {m.metadata.group_id for m in ins2.values()} == {"2"}  # FedAvg leaves it empty: the strategy sets it
    models = honest_models(w, 5, seed=2)
    honest = [answer(ins2[n], m) for n, m in zip(NODES, models)]
    relabelled = forged(ins2[102], 102, shifted(w, -1e6), group_id="1")
    got, metrics = step(s, 2, [old, *honest, relabelled], w)
    np.testing.assert_allclose(got, rule_step("cwtm", 1, w, models), rtol=1e-12, atol=1e-14)
    assert (metrics["replies-stale"], metrics["nodes-dropped"], metrics["replies-valid"]) == (2, 0, 5)
    round2 = [c for c in s.contributions if c["round"] == 2]
    assert [c["reason"] for c in round2] == ["stale"] + ["used"] * 5 + ["stale"]
    assert round2[0]["status"].startswith("dropped: stale: answers no instruction of round 2 (reply_to_message_id")
    assert "group_id '1'" in round2[-1]["status"]


def test_a_mixture_is_counted_logged_recorded_and_never_aggregated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """One round with every kind of drop: each is counted under its reason, logged at WARNING with the node id,
    recorded in the contributions and the JSON lines, and f is lowered by the sampled node that lost its vote by
    its own reply (the malformed one: 1) — not by the double-voter, whose vote is void, nor by the replies that were
    nobody's vote."""
    w = model(np.float64)
    nodes = [101, 102, 103, 104, 105, 106, 107, 108, 109]
    path = tmp_path / "contributions.jsonl"
    s = PhalanxFedAvg(aggregator="cwtm", f=3, min_train_nodes=8, fraction_train=0.5, min_available_nodes=9,
                      log_path=path)
    grid = FakeGrid(nodes)
    prev = start_round(s, grid, w)
    s.aggregate_train(1, [answer(m, w) for m in prev.values()])
    ins = start_round(s, grid, w, server_round=2)
    (left_out,) = set(nodes) - set(ins)
    sampled = sorted(ins)
    honest_nodes, dup, broken = sampled[:6], sampled[6], sampled[7]
    stale_node = next(n for n in honest_nodes[:2] + honest_nodes[4:] if n in prev)  # 8 of 9 sampled in each round
    models = honest_models(w, 6)
    huge = shifted(w, 1e9)
    replies = [answer(ins[n], m) for n, m in zip(honest_nodes, models)]
    replies += [answer(ins[dup], huge), answer(ins[dup], huge), answer(ins[dup], huge)]      # duplicate ×3
    replies += [answer(ins[broken], [np.ones(5), w[1]])]                                       # malformed
    replies += [forged(ins[sampled[0]], left_out, huge)]                                       # unsampled
    replies += [answer(prev[stale_node], huge)]                                                # stale
    replies += [forged(ins[sampled[3]], sampled[2], huge)]                                     # impostor
    with caplog.at_level(logging.INFO, logger="flwr"):
        got, metrics = step(s, 2, replies, w)
    np.testing.assert_allclose(got, rule_step("cwtm", 2, w, models), rtol=1e-12, atol=1e-14)  # f − 1 = 2
    counts = {k: metrics[f"replies-{k}"] for k in ("received", "valid", "dropped", "duplicate", "unsampled", "stale",
                                                    "impostor")}
    assert counts == {"received": 13, "valid": 6, "dropped": 7, "duplicate": 3, "unsampled": 1, "stale": 1,
                      "impostor": 1}
    assert (metrics["nodes-dropped"], metrics["nodes-void"]) == (1, 1)
    round2 = [c for c in s.contributions if c["round"] == 2]
    assert [c["reason"] for c in round2] == ["used"] * 6 + ["duplicate"] * 3 + ["malformed", "unsampled", "stale",
                                                                               "impostor"]
    assert all(c["status"].startswith(f"dropped: {c['reason']}") for c in round2[6:] if c["reason"] != "malformed")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["reason"] for r in rows[-13:]] == [c["reason"] for c in round2]
    assert [r["node_id"] for r in rows[-13:]] == [c["node_id"] for c in round2]
    lines = warnings_of(caplog)
    for node, reason in [(dup, "duplicate"), (left_out, "unsampled"), (stale_node, "stale"),
                         (sampled[2], "impostor")]:
        assert any(f"from node {node} ({reason})" in line for line in lines), (node, reason, lines)
    assert any(f"dropped 3 replies from node {dup} (duplicate)" in line for line in lines)
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phalanx: round 2: ")]
    assert "13 replies, 6 used, 7 dropped; cwtm with f=2" in summary[-1]


def test_without_message_ids_the_sample_and_the_round_are_still_checked(caplog: pytest.LogCaptureFixture) -> None:
    """Instructions that were never pushed have no message_id: the check falls back to the sampled nodes and the
    round's group_id (and says so); an impostor is then not detectable — documented."""
    w = model(np.float64)
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    sent = {m.metadata.dst_node_id: m for m in s.configure_train(1, ArrayRecord(w), ConfigRecord(), FakeGrid(NODES))}
    models = honest_models(w, 5)
    replies = [answer(sent[n], m) for n, m in zip(NODES, models)]
    replies += [forged(sent[101], 999, shifted(w, 1e6)), forged(sent[102], 102, shifted(w, 1e6), group_id="7")]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        got, metrics = step(s, 1, replies, w)
    np.testing.assert_allclose(got, rule_step("cwtm", 1, w, models), rtol=1e-12, atol=1e-14)
    assert (metrics["replies-unsampled"], metrics["replies-stale"]) == (1, 1)
    assert any("have no message_id" in r.getMessage() for r in caplog.records)


def test_without_configure_train_only_duplicates_are_dropped() -> None:
    """Driven after remember_global alone, the sample is unknown: a claimed id appearing twice is still one node
    whose vote is void (f kept); an unknown id is taken as it comes."""
    w = model(np.float64)
    models = honest_models(w, 5)
    s = PhalanxFedAvg(aggregator="cwtm", f=2)
    s.remember_global(1, ArrayRecord(w))

    def reply(node: int, arrays: list[np.ndarray]) -> Message:
        meta = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="",
                        group_id="", created_at=0.0, ttl=3600.0, message_type=MessageType.TRAIN)
        return Message(content=content(arrays), metadata=meta)

    got, metrics = step(s, 1, [reply(i + 1, m) for i, m in enumerate(models)] + [reply(9, w), reply(9, w)], w)
    np.testing.assert_allclose(got, rule_step("cwtm", 2, w, models), rtol=1e-12, atol=1e-14)
    assert (metrics["replies-duplicate"], metrics["nodes-void"], metrics["replies-unsampled"]) == (2, 1, 0)
    assert metrics["nodes-dropped"] == 0


def test_evaluation_replies_get_one_vote_per_node_too() -> None:
    """A node reporting accuracy 0 three times would move the median from 0.85 to 0.8; its replies are dropped."""
    w = model()
    s = PhalanxFedAvg(min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w, evaluate=True)
    assert all(m.metadata.message_type == MessageType.EVALUATE for m in ins.values())

    def evaluated(m: Message, accuracy: float) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"accuracy": accuracy, "num-examples": 10})}), reply_to=m)

    honest = [evaluated(ins[n], a) for n, a in zip(NODES[:4], [0.8, 0.9, 0.85, 0.85])]
    metrics = s.aggregate_evaluate(1, honest + [evaluated(ins[BAD], 0.0) for _ in range(3)])
    assert metrics is not None and metrics["accuracy"] == pytest.approx(0.85)


# -------------------------------------------------------------------------------------------------- SecAgg+


def legacy_context(strategy: PhalanxFedAvg, w: list[np.ndarray]) -> Any:
    from flwr.server import ServerConfig
    from flwr.server.compat import LegacyContext
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key

    ctx = LegacyContext(Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                        config=ServerConfig(num_rounds=1), strategy=strategy)  # type: ignore[arg-type]
    ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: 1})
    ctx.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord(w)
    return ctx


def test_secaggplus_workflow_is_refused_with_a_one_line_config_error() -> None:
    """SecAggPlusWorkflow (Flower 1.42's only SecAgg+ server) drives a legacy strategy: its first call,
    configure_fit, is refused — under SecAgg+ the strategy would only ever see the sum of the updates."""
    from flwr.server.workflow import SecAggPlusWorkflow, SecAggWorkflow

    for workflow in (SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2),
                     SecAggWorkflow(reconstruction_threshold=2)):
        with pytest.raises(ConfigError) as info:
            workflow(FakeGrid(NODES), legacy_context(PhalanxFedAvg(), model()))
        text = str(info.value)
        name = type(workflow).__name__
        assert info.value.parameter == "fit_workflow" and info.value.value == name
        assert text.startswith(f"fit_workflow='{name}' is invalid: allowed strategy.start(") and "\n" not in text
        assert "only the sum" in text and "configure_fit" in text


@pytest.mark.parametrize("secagg", [True, False])
def test_defaultworkflow_is_refused_at_its_first_call(secagg: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...)) — how SecAgg+ is run — calls initialize_parameters
    before any round: refused there, naming the fit workflow; a plain DefaultWorkflow is refused as well (the
    strategy has no legacy API)."""
    import flwr.server.workflow.default_workflows as default_workflows
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    done = threading.Event()
    done.set()  # no node-updating thread: the strategy is refused before it would be needed
    monkeypatch.setattr(default_workflows, "start_update_client_manager_thread",
                        lambda grid, cm: (threading.Thread(target=lambda: None), threading.Event(), done))
    fit = SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2) if secagg else None
    with pytest.raises(ConfigError) as info:
        DefaultWorkflow(fit_workflow=fit)(FakeGrid(NODES), legacy_context(PhalanxFedAvg(), model()))
    text = str(info.value)
    assert "\n" not in text and "initialize_parameters" in text and "only the sum" in text
    if secagg:
        assert text.startswith("fit_workflow='SecAggPlusWorkflow' is invalid")
    else:
        assert text.startswith("strategy='PhalanxFedAvg' is invalid") and "DefaultWorkflow" in text


def secagg_client_replies(instructions: Iterable[Message]) -> list[Message]:
    """What Flower sends back from a real ClientApp with ``secaggplus_mod`` on the strategy's own instructions:
    the mod fails (no SecAgg+ config record) and the SuperNode replies with the exception, as run_clientapp does."""
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp

    app = ClientApp(mods=[secaggplus_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:  # pragma: no cover - the mod fails before it
        return Message(msg.content, reply_to=msg)

    replies = []
    for ins in instructions:
        ctx = Context(run_id=1, node_id=ins.metadata.dst_node_id, node_config={}, state=RecordDict(), run_config={})
        try:
            replies.append(app(message=ins, context=ctx))
        except Exception as ex:  # flwr/supernode/runtime/run_clientapp.py: the reason Flower sends
            reason = str(type(ex)) + ":<'" + str(ex) + "'>"
            replies.append(Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=ins))
    return replies


def test_clients_running_secaggplus_mod_are_refused_when_more_than_f_do() -> None:
    w = model()
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    replies = secagg_client_replies(ins.values())
    assert all(r.has_error() and "secaggplus_configs" in r.error.reason for r in replies)
    with pytest.raises(ConfigError) as info:
        s.aggregate_train(1, replies)
    text = str(info.value)
    assert text.startswith("mods='secaggplus_mod' is invalid: allowed a ClientApp without") and "\n" not in text
    assert "5 sampled clients" in text and "only the sum" in text


def test_f_byzantine_clients_faking_the_secaggplus_error_cannot_end_the_run() -> None:
    """The refusal needs more than f distinct sampled nodes (so at least one honest client): f nodes sending that
    error, even many times or under other ids, are dropped replies like any other."""
    w = model(np.float64)
    models = honest_models(w, 3)
    s = PhalanxFedAvg(aggregator="cwtm", f=2, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    fakes = secagg_client_replies([ins[104], ins[105]])
    spam = [forged(ins[101], 900 + i, error=fakes[0].error) for i in range(5)]
    got, metrics = step(s, 1, [answer(ins[n], m) for n, m in zip(NODES[:3], models)] + fakes + spam, w)
    assert metrics["aggregated"] == 1 and metrics["nodes-dropped"] == 2 and metrics["replies-unsampled"] == 5
    np.testing.assert_allclose(got, rule_step("cwtm", 0, w, models), rtol=1e-12, atol=1e-14)
