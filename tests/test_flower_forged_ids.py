"""phalanx.flower: replies that claim an identity they do not have — the SuperLink's id 1, a node id no uint64 holds,
an error whose words would flood the logs — with real Flower Messages (the helpers of
``tests/test_flower_identity.py``). None cancels an honest node's vote, counts towards the SecAgg+ refusal, ends the
run or reaches a log or the contributions file as more than one short line."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

flwr = pytest.importorskip("flwr")

from flwr.app import ArrayRecord, Error  # noqa: E402
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode  # noqa: E402

from phalanx.flower import PhalanxFedAvg  # noqa: E402
from test_flower import honest_models, model  # noqa: E402
from test_flower_identity import (  # noqa: E402
    BAD,
    NODES,
    FakeGrid,
    answer,
    by_node,
    forged,
    rule_step,
    secagg_client_replies,
    serverapp_identity,
    shifted,
    start_round,
    step,
    warnings_of,
)

__all__ = ["serverapp_identity"]


def test_the_superlinks_error_for_a_lost_reply_counts_for_the_node_whose_reply_it_lost() -> None:
    """Flower's deployment Grid turns a reply whose objects cannot be pulled into an error reply from the
    SuperLink (src_node_id 1) answering the instruction: it is that node's dropped vote, not an unsampled one."""
    w = model(np.float64)
    models = honest_models(w, 4)
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    lost = forged(ins[BAD], SUPERLINK_NODE_ID, error=Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="unavailable"))
    got, metrics = step(s, 1, [answer(ins[n], m) for n, m in zip(NODES, models)] + [lost], w)
    np.testing.assert_allclose(got, rule_step("cwtm", 0, w, models), rtol=1e-12, atol=1e-14)
    assert (metrics["nodes-dropped"], metrics["replies-unsampled"]) == (1, 0)
    assert by_node(s)[BAD] == [("error", "dropped: error reply (code 3): unavailable")]


def test_a_forged_superlink_error_never_cancels_an_honest_nodes_vote() -> None:
    """An error reply claiming the SuperLink's id 1 on each honest node's instruction, next to those nodes' own
    replies (cwtm, f = 1, a Byzantine +100 from node 105): it only ever says the named node is silent, so every node
    keeps its vote and the round is the rule over all five. The old code took it as the node's own vote: each honest
    node had two, all four were void (replies-duplicate 8) and the round aggregated nothing."""
    w = model(np.float64)
    models = honest_models(w, 4)
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    replies = [answer(ins[n], m) for n, m in zip(NODES, models)] + [answer(ins[BAD], shifted(w, 100.0))]
    lost = Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="unavailable")
    forgeries = [forged(ins[n], SUPERLINK_NODE_ID, error=lost) for n in NODES[:4]]
    got, metrics = step(s, 1, replies + forgeries, w)
    assert (metrics["replies-valid"], metrics["replies-duplicate"], metrics["nodes-void"]) == (5, 0, 0)
    assert (metrics["nodes-dropped"], metrics["aggregated"]) == (0, 1)
    np.testing.assert_allclose(got, rule_step("cwtm", 1, w, [*models, shifted(w, 100.0)]), rtol=1e-12, atol=1e-14)
    assert ("used", "used") in by_node(s)[101]


def test_a_forged_superlink_error_never_counts_in_the_secaggplus_tally() -> None:
    """f = 2: the two Byzantine nodes reply with secaggplus_mod's error and forge the same error as the SuperLink's
    (id 1) on silent honest node 103's instruction. Only a node's own reply counts towards the refusal: two, not
    more than f, and the run goes on. The old code counted the forgery as node 103's and ended the run."""
    w = model(np.float64)
    models = honest_models(w, 2)
    s = PhalanxFedAvg(aggregator="cwtm", f=2, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    fakes = secagg_client_replies([ins[104], ins[BAD]])
    forgery = forged(ins[103], SUPERLINK_NODE_ID, error=fakes[0].error)
    got, metrics = step(s, 1, [answer(ins[n], m) for n, m in zip(NODES, models)] + fakes + [forgery], w)
    assert (metrics["aggregated"], metrics["nodes-dropped"], metrics["replies-duplicate"]) == (1, 3, 0)
    np.testing.assert_allclose(got, rule_step("cwtm", 0, w, models), rtol=1e-12, atol=1e-14)


def test_a_reply_with_content_claiming_the_superlinks_id_is_no_nodes_vote() -> None:
    """Only the SuperLink's *error* reply speaks for the node whose reply it lost: a reply with an update (+10³)
    claiming src_node_id 1 on silent node 101's instruction is unsampled and never aggregated. A mutant that took
    any id-1 reply as the instruction's node's vote used it as node 101's update."""
    w = model(np.float64)
    models = honest_models(w, 4)
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    claim = forged(ins[101], SUPERLINK_NODE_ID, arrays=shifted(w, 1e3))
    got, metrics = step(s, 1, [answer(ins[n], m) for n, m in zip(NODES[1:], models)] + [claim], w)
    assert (metrics["replies-valid"], metrics["replies-unsampled"], metrics["nodes-dropped"]) == (4, 1, 1)
    assert 101 not in by_node(s)
    np.testing.assert_allclose(got, rule_step("cwtm", 0, w, models), rtol=1e-12, atol=1e-14)


def test_at_most_twenty_warning_lines_a_round_for_dropped_replies(caplog: pytest.LogCaptureFixture) -> None:
    """100 replies under 100 unsampled ids: 20 lines, one per node, then one line for the 80 more (the rest is in
    the contributions). A mutant without the cap logged 100 lines a round."""
    w = model(np.float64)
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    spam = [forged(ins[101], 1000 + i, arrays=w) for i in range(100)]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        s.aggregate_train(1, [answer(ins[n], m) for n, m in zip(NODES, honest_models(w, 5))] + spam)
    lines = warnings_of(caplog)
    assert len(lines) == 21 and sum("(unsampled)" in line for line in lines) == 20
    assert lines[-1] == "phalanx: round 1: replies of 80 more nodes dropped (see the contributions)"
    assert len(s.contributions) == 105


def test_a_node_id_outside_uint64_is_unreadable_and_never_ends_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """In-process Flower's Metadata takes any int as src_node_id (a node id is a uint64 on the wire). A reply
    claiming an id of 5,001 digits on node 101's instruction, another of −1, and one with an error code of 5,001
    digits from node 105: the two ids are unreadable (unsampled, node_id null), and every log line and JSON line
    stays short and one line. The old code formatted the id into its 'unsampled' text — Python refuses int → str
    beyond 4,300 digits — and aggregate_train raised; without the sample the JSON lines raised the same way."""
    w = model(np.float64)
    models = honest_models(w, 4)
    huge = 10 ** 5000
    log_path = tmp_path / "c.jsonl"
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5, log_path=str(log_path))
    ins = start_round(s, FakeGrid(NODES), w)
    junk = [forged(ins[101], huge, arrays=shifted(w, 1e3)), forged(ins[101], -1, arrays=shifted(w, 1e3))]
    odd = forged(ins[BAD], BAD, error=Error(code=huge, reason="x\n" * 10_000))
    with caplog.at_level(logging.INFO, logger="flwr"):
        got, metrics = step(s, 1, [answer(ins[n], m) for n, m in zip(NODES, models)] + junk + [odd], w)
    assert (metrics["replies-unsampled"], metrics["replies-valid"], metrics["nodes-dropped"]) == (2, 4, 1)
    np.testing.assert_allclose(got, rule_step("cwtm", 0, w, models), rtol=1e-12, atol=1e-14)
    assert [c["status"] for c in s.contributions if c["node_id"] is None] == \
        ["dropped: unsampled: no readable node id in round 1"] * 2
    assert all(len(r.getMessage()) < 1000 and "\n" not in r.getMessage() for r in caplog.records)
    lines = log_path.read_text().splitlines()
    assert len(lines) == 7 and all(len(line) < 1000 for line in lines)

    bare = PhalanxFedAvg(aggregator="cwtm", f=1, log_path=str(log_path))  # the sample unknown: remember_global only
    bare.remember_global(1, ArrayRecord(w))
    _, metrics = bare.aggregate_train(1, [answer(ins[n], m) for n, m in zip(NODES, models)] + junk[:1])
    assert metrics is not None and bare.contributions[-1]["node_id"] is None
    assert all(len(line) < 1000 for line in log_path.read_text().splitlines())


def test_an_error_reply_with_a_long_multiline_reason_is_one_short_log_and_json_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A sampled node answers with an error reply of an ordinary code (3) whose reason is ``"x\\n"`` 10,000 times:
    a code without the shortening of the reason (a review's mutant of ``read_reply``) logged a 20,148-character
    message of 10,000 lines and wrote a 30,181-character JSON line, and this file's tests all passed on it. Every
    log message and every JSON line of the round is one line of at most 400 characters."""
    w = model(np.float64)
    path = tmp_path / "contributions.jsonl"
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5, log_path=path)
    ins = start_round(s, FakeGrid(NODES), w)
    odd = forged(ins[BAD], BAD, error=Error(code=3, reason="x\n" * 10_000))
    with caplog.at_level(logging.INFO, logger="flwr"):
        step(s, 1, [answer(ins[n], m) for n, m in zip(NODES, honest_models(w, 4))] + [odd], w)
    messages = [r.getMessage() for r in caplog.records]
    assert any("error reply (code 3)" in m for m in messages), messages
    for text in messages + path.read_text().splitlines():
        assert "\n" not in text and len(text) <= 400, (len(text), text[:200])
