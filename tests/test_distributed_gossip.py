"""Decentralized rounds on real processes (engine = "torchrun", algorithm = "gossip", topology = "gossip"): one rank
per node, point-to-point messages with its graph neighbours only.

In process (fast): every node's local step and every Byzantine node's messages, computed alone as a rank computes
them, equal the simulated engine's batched round (bit for bit). With processes (`phalanx launch`'s spawner, gloo on
127.0.0.1, a tiny MLP, a few rounds): plain gossip, killed after a checkpoint and resumed, and a robust rule under a
Byzantine rank's vector attack end bit for bit where the simulated engine ends; a rank that dies mid-run costs its
neighbours its messages, and the others finish.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from _processes import HONEST_ROUND_TIMEOUT_S, HONEST_STALL_S, JOB_TIMEOUT_S
from phalanx import aggregators, attacks, data, models
from phalanx.decentralized import gossip_attacks, robust_gossip, topology
from phalanx.errors import ConfigError
from phalanx.experiments import make_config
from phalanx.experiments.build import check_points
from phalanx.training import Experiment
from phalanx.training.algorithms.gossip import AnytimeGossip, Gossip
from phalanx.training.algorithms.gossip_node import AnytimeNode, OneNode, byzantine_inputs
from phalanx.training.loop import fresh_start
from phalanx.training.server import BoundRule
from test_distributed import run_dir, run_job, simulated, wait_for

DS = data.load("digits")


def _exp(graph: topology.Graph, rule: str, f: int, attack: str, byzantine: int, **params: Any) -> Experiment:
    model = models.make("mlp", DS.input_shape, DS.num_classes, generator=torch.Generator().manual_seed(0), hidden=[8])
    agg = robust_gossip.make(rule, f=f) if rule in robust_gossip.names() else aggregators.make(rule, f=f)
    atk = gossip_attacks.make(attack, **params) if attack in gossip_attacks.names() else attacks.make(attack, **params)
    return Experiment(model=model, dataset=DS, workers=graph.n, byzantine=byzantine, rule=agg, attack=atk, rounds=3,
                      lr=1.0, eval_every=3, seed=3,
                      algorithm=Gossip(graph=graph, batch_size=8, lr=0.1, momentum=0.9, weight_decay=1e-3))


@pytest.mark.parametrize(("graph", "rule", "f", "attack", "byzantine"), [
    (topology.make("complete", 5), "cwtm", 2, "gaussian", 2),  # every target has two Byzantine neighbours
    (topology.make("ring", 6), "cs_plus", 1, "dissensus", 2),  # a decentralized attack, a robust gossip rule
    (topology.make("torus", 9), "mean", 0, "alie", 1),
    (topology.make("ring", 4), "mean", 1, "labelflip", 1),  # a data attack: the Byzantine node follows the protocol
])
def test_each_node_alone_computes_its_row_of_the_simulated_round(
    graph: topology.Graph, rule: str, f: int, attack: str, byzantine: int,
) -> None:
    """Rank r's local step is row r of the simulated round, and a Byzantine rank's message to each honest neighbour
    is the one the simulated omniscient attacker sends it — from the rows a Byzantine rank is sent only
    (``byzantine_inputs``) — with the shared attack stream in step on every rank, over two rounds."""
    exp = _exp(graph, rule, f, attack, byzantine)
    n, h = graph.n, graph.n - byzantine
    streams = fresh_start(exp).streams
    sim = exp.algorithm.all_workers(exp, streams, None)
    nodes = [exp.algorithm.one_worker(exp, r, streams, None) for r in range(n)]
    assert all(isinstance(node, OneNode) for node in nodes)
    server = exp.algorithm.make_server(exp, torch.Generator().manual_seed(0))
    theta = exp.problem.initial_theta()
    for t in range(2):
        got = sim.round(theta, t, BoundRule(exp.rule, {}))
        steps = [node.step(theta, t) for node in nodes]
        for r in range(nodes[0].computing):
            step = steps[r]
            assert step is not None and torch.equal(step, got.vectors[r]), (t, r)
        for b in range(h, n):
            node = nodes[b]
            if not node.sends_attack:
                assert steps[b] is not None  # a data attack's node trains (on poisoned batches)
                continue
            assert steps[b] is None
            half = torch.zeros_like(got.vectors)
            known = torch.zeros(n, dtype=torch.bool)
            inputs = byzantine_inputs(node.closed, h, b)
            half[inputs], known[inputs] = got.vectors[inputs], True
            sent = node.attack_messages(half, known, t)
            assert sorted(sent) == [i for i in node.closed[b].tolist() if i < h]
            for i, v in sent.items():
                byz = node.closed[i][node.closed[i] >= h].tolist()
                assert torch.equal(v, got.messages[i][byz.index(b)]), (t, b, i)  # type: ignore[index]
            assert torch.equal(node.attack_gen.get_state(), sim.attack_gen.get_state())
        for node in nodes:
            assert torch.equal(node.batch_gen.get_state(), sim.batch_gen.get_state())
        server.context(theta, None)
        agg, _ = server.aggregate(got, {}, False)
        theta = theta - agg


@pytest.mark.parametrize(("rule", "f", "attack", "byzantine"), [("mean", 0, "none", 0), ("cwtm", 1, "alie", 1)])
def test_each_anytime_node_alone_computes_its_pair_of_the_simulated_round(
    rule: str, f: int, attack: str, byzantine: int,
) -> None:
    """Decentralized Anytime SGD: rank r's message [w̃ᵣ | x̃ᵣ] is row r of the simulated round and a Byzantine rank's
    message is the simulated attacker's, over three rounds (each rank's iterates w are its server's row r, which is
    the simulated server's row r: taken from it here)."""
    graph = topology.make("ring", 5)
    model = models.make("mlp", DS.input_shape, DS.num_classes, generator=torch.Generator().manual_seed(0), hidden=[8])
    agg = aggregators.make(rule, f=f)
    exp = Experiment(model=model, dataset=DS, workers=5, byzantine=byzantine, rule=agg, attack=attacks.make(attack),
                     rounds=3, lr=1.0, eval_every=3, seed=3,
                     algorithm=AnytimeGossip(graph=graph, batch_size=8, lr=0.01, weight_decay=1e-3))
    h = 5 - byzantine
    streams = fresh_start(exp).streams
    sim = exp.algorithm.all_workers(exp, streams, None)
    nodes = [exp.algorithm.one_worker(exp, r, streams, None) for r in range(5)]
    assert all(isinstance(node, AnytimeNode) and node.message_numel == 2 * exp.problem.dim for node in nodes)
    server = exp.algorithm.make_server(exp, torch.Generator().manual_seed(0))
    theta = exp.problem.initial_theta()
    for t in range(3):
        got = sim.round(theta, t, BoundRule(exp.rule, {}))
        steps = [node.step(theta, t) for node in nodes]
        for r in range(h):
            assert torch.equal(steps[r], got.vectors[r]), (t, r)  # type: ignore[arg-type]
        for b in range(h, 5):
            inputs = byzantine_inputs(nodes[b].closed, h, b)
            half, known = torch.zeros_like(got.vectors), torch.zeros(5, dtype=torch.bool)
            half[inputs], known[inputs] = got.vectors[inputs], True
            for i, v in nodes[b].attack_messages(half, known, t).items():
                byz = nodes[b].closed[i][nodes[b].closed[i] >= h].tolist()
                assert torch.equal(v, got.messages[i][byz.index(b)]), (t, b, i)  # type: ignore[index]
        server.context(theta, None)
        agg, _ = server.aggregate(got, {}, False)
        theta = theta - agg
        for node in nodes:
            node.buffer = got.carry.clone()  # type: ignore[union-attr]


def test_refused_and_implied_configurations() -> None:
    base = {"algorithm": "gossip", "graph": "ring", "workers": 6, "byzantine": 1, "f": 1, "aggregator": "cwtm",
            "engine": "torchrun"}
    assert make_config(base).topology == "gossip"  # implied by the algorithm on the torchrun engine
    for change, match in [
        ({"topology": "server"}, "topology='server' is invalid: allowed 'gossip' with algorithm = 'gossip'"),
        ({"attack": "spectral"}, "attack='spectral' is invalid: allowed a Phalanx attack or 'dissensus' with "
                                 "engine = 'torchrun'"),
        ({"backend": "nccl"}, "backend='nccl' is invalid: allowed 'auto' or 'gloo' with topology = 'gossip'"),
    ]:
        with pytest.raises(ConfigError, match=match):
            check_points([make_config({**base, **change})])
    dsgd = {"workers": 4, "engine": "torchrun", "topology": "gossip"}
    with pytest.raises(ConfigError, match="topology='gossip' is invalid: allowed 'server' or 'serverless' with "
                                          "algorithm = 'dsgd'"):
        make_config(dsgd)
    check_points([make_config({**base, "attack": "dissensus"})])  # dissensus needs the target's neighbourhood only


# ---------------------------------------------------------------------------------------------------------------
# real processes
# ---------------------------------------------------------------------------------------------------------------

JOB: dict[str, Any] = {
    "algorithm": "gossip", "engine": "torchrun", "graph": "ring", "dataset": "digits", "model": "mlp",
    "model_params": {"hidden": [16]}, "workers": 4, "byzantine": 0, "f": 0, "aggregator": "mean", "attack": "none",
    "batch_size": 8, "lr": 0.1, "momentum": 0.9, "rounds": 6, "eval_every": 3, "checkpoint_every": 3, "seed": 1,
    "round_timeout": HONEST_ROUND_TIMEOUT_S,
}


SAME_BITS = {**JOB, "round_timeout": 2 * JOB_TIMEOUT_S}
"""JOB for the runs compared bit for bit with the simulated engine, where no rank is meant to be late: a gathering
waits ``GATHER_SHARE`` × round_timeout (10 s at 20 s), and a node late there on a loaded machine would be left out
and the checkpoint differ (a flaky-test review; test_distributed_availability.py moved to 120 s for this). A run
without faults never waits it out; a hung one fails at the job's own bound."""


def assert_same_as_simulated(d: Path, data: dict[str, Any], sim_dir: Path) -> None:
    """Every node's model, momentum and last displacement, the random streams and the metric rows: bit for bit."""
    sim = simulated(data, sim_dir)
    got = load_file(str(d / "checkpoint.safetensors"))
    assert set(got) == set(sim) and got["theta"].shape[0] == data["workers"]
    for key in sim:
        assert torch.equal(got[key], sim[key]), key
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    sim_rows = [json.loads(x) for x in (sim_dir / "metrics.jsonl").read_text().splitlines()]
    keep = ("round", "test_accuracy", "test_loss", "worst_node_accuracy", "consensus_distance")
    assert [{k: r.get(k) for k in keep} for r in rows] == [{k: r.get(k) for k in keep} for r in sim_rows]
    assert all(r["missing_messages"] == 0 for r in rows)
    assert (d / "DONE").exists() and (d / "distributed.json").exists()


def test_plain_gossip_on_a_ring_killed_after_a_checkpoint_resumes_to_the_simulated_bits(tmp_path: Path) -> None:
    """Four ranks on a ring, plain gossip (Metropolis–Hastings W). Rank 0 stops answering in round 3, after the
    checkpoint of round 3 (a test hook); every rank is then SIGKILLed. The same job started again resumes from that
    checkpoint and ends bit for bit where the simulated engine ends."""
    out = tmp_path / "dist"

    def kill_all(procs: list[subprocess.Popen[bytes]], errs: Path, store: Any) -> None:
        wait_for("sleeping until the test wakes it in round 3", errs, procs[0])
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()

    code, err = run_job(SAME_BITS, out, tmp_path, env={"PHALANX_TEST_SLEEP": f"0:3:{tmp_path / 'never'}"},
                        script=kill_all)
    assert code != 0
    d = run_dir(out)
    with safe_open(str(d / "checkpoint.safetensors"), framework="pt") as fh:
        assert fh.metadata()["round"] == "3"
    code, err = run_job(SAME_BITS, out, tmp_path)
    assert code == 0, err[-3000:]
    assert "resuming from the checkpoint of round 3" in err
    assert_same_as_simulated(d, SAME_BITS, tmp_path / "sim")


def test_robust_rule_under_a_byzantine_ranks_attack_equals_the_simulated_engine(tmp_path: Path) -> None:
    """Five ranks on a ring, the trimmed mean at every node (f = 1), rank 4 Byzantine running ALIE: it is sent the
    honest closed neighbourhoods of its two neighbours and sends each its own vector. Bit for bit the simulated
    engine's run."""
    data = {**SAME_BITS, "workers": 5, "byzantine": 1, "f": 1, "aggregator": "cwtm", "attack": "alie"}
    code, err = run_job(data, tmp_path / "dist", tmp_path)
    assert code == 0, err[-3000:]
    assert "lost the link" not in err and "Traceback" not in err and "terminate" not in err, err[-3000:]
    d = run_dir(tmp_path / "dist")
    assert_same_as_simulated(d, data, tmp_path / "sim")
    log = json.loads((d / "distributed.json").read_text())
    assert log["summary"]["topology"] == "gossip" and all(r["missing"] == [] for r in log["rounds"])
    assert all(r["sent"] > 0 and r["received"] > 0 for r in log["rounds"])


def test_anytime_sgd_on_real_processes_equals_the_simulated_engine(tmp_path: Path) -> None:
    """Decentralized Anytime SGD on four ranks of a ring: every message is the pair [w̃ | x̃]; the query points, the
    iterates (the checkpoint's carried rows) and the metric rows end bit for bit where the simulated engine ends."""
    data = {**SAME_BITS, "algorithm": "anytime", "momentum": 0.0, "lr": 0.01}
    code, err = run_job(data, tmp_path / "dist", tmp_path)
    assert code == 0, err[-3000:]
    assert_same_as_simulated(run_dir(tmp_path / "dist"), data, tmp_path / "sim")


def test_a_neighbour_that_dies_mid_run_costs_its_messages_and_the_others_finish(tmp_path: Path) -> None:
    """Four ranks on a ring; rank 3 dies at the start of round 3 (a test hook: the process exits, its sockets
    close). Its neighbours (ranks 0 and 2) take their own local step in place of its message from round 3 on; the run
    finishes, and the metric rows count the missing messages (2 per round); rank 0's distributed.json names rank 3
    from round 3 on. Honest nodes get HONEST_ROUND_TIMEOUT_S: rank 1 stalls (HONEST_STALL_S) in round 5, a loaded
    machine's stall, and is missed by nobody — at the former round_timeout of 5 s its neighbours missed it there. The
    death is seen at once (gloo reports the closed links) and costs no round a wait, nor the end of the run:
    ``Neighbours.close`` ends the sending thread of a lost link instead of waiting round_timeout for it. So
    round_timeout here is twice the job's hard bound (JOB_TIMEOUT_S): any wait for the dead rank — in a round, at a
    gathering, at the end — kills the job (the former close did: this test took 41 s at round_timeout 20 s)."""
    data = {**JOB, "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "round_timeout": 2 * JOB_TIMEOUT_S}
    env = {"PHALANX_TEST_SLEEP": f"1:5:{HONEST_STALL_S:g},3:3:exit"}
    code, err = run_job(data, tmp_path / "dist", tmp_path, env=env)
    assert code == 0, err[-3000:]
    assert "[phalanx rank 0] lost the link to rank 3" in err and "[phalanx rank 2] lost the link to rank 3" in err
    assert err.count("lost the link") == 2, err[-3000:]  # no other link: the others kept each other
    d = run_dir(tmp_path / "dist")
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [(r["round"], r["missing_messages"]) for r in rows] == [(0, 0), (4, 2), (8, 8)]
    log = json.loads((d / "distributed.json").read_text())["rounds"]
    assert [r["missing"] for r in log] == [[]] * 3 + [[3]] * 5
    theta = load_file(str(d / "checkpoint.safetensors"))["theta"]
    assert torch.isfinite(theta).all() and (d / "DONE").exists()
    assert not torch.equal(theta[0], theta[3])  # rank 3 never reported: its row is the start, the others trained


def test_a_silent_neighbour_is_left_out_then_skips_ahead_and_rejoins(tmp_path: Path) -> None:
    """Four ranks on a ring; rank 1 (a neighbour of rank 0) stops answering in round 3 until the test wakes it,
    which it does once rank 0 has finished round 6 and holds before round 7 (a test hook; its neighbours gave rank 1
    up after round_timeout and went on without waiting for it, and have sent their messages of round 5 = 3 + 2 at
    least). Rank 1 then sits the rounds it fell behind out and rejoins: rank 0 takes its messages again, and the run
    finishes. Honest nodes get HONEST_ROUND_TIMEOUT_S: rank 1 stalls (HONEST_STALL_S) in round 1, a loaded machine's
    stall, and is not missing there — at the former round_timeout of 4 s it was. The silence costs one
    round_timeout and a quarter of it for each of rounds 4–6."""
    data = {**JOB, "rounds": 30, "eval_every": 10, "checkpoint_every": 30}
    wake, go7 = tmp_path / "wake", tmp_path / "go7"

    def wake_1(procs: list[subprocess.Popen[bytes]], errs: Path, store: Any) -> None:
        wait_for("sleeping until the test wakes it in round 3", errs, procs[0])
        wait_for("holding round 7", errs, procs[0])
        wake.touch()
        go7.touch()

    env = {"PHALANX_TEST_SLEEP": f"1:1:{HONEST_STALL_S:g},1:3:{wake}", "PHALANX_TEST_HOLD": f"7:{go7}"}
    code, err = run_job(data, tmp_path / "dist", tmp_path, env=env, script=wake_1)
    assert code == 0, err[-3000:]
    assert "lost the link" not in err and "Traceback" not in err and "terminate" not in err
    assert "round 3: no message in time from neighbours [1" in err  # [1] — or [1, 3] if a loaded machine made 3 late
    d = run_dir(tmp_path / "dist")
    log = json.loads((d / "distributed.json").read_text())["rounds"]
    assert [1 in r["missing"] for r in log[:4]] == [False, False, False, True]
    assert all(1 in r["missing"] for r in log[3:7])  # asleep until rank 0 had finished round 6
    assert any(r["missing"] == [] for r in log[7:])  # back: its messages arrive in time again
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["missing_messages"] > 0 and (d / "DONE").exists()
