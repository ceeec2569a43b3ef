"""Keyed serverless and gossip jobs on real processes (the sealed mesh): bit for bit the same result as without keys
(a Byzantine rank attacking as itself included), an impostor campaign against two ranks' listeners while the job
trains that changes no bit of it, every rejection in rank 0's transcript (the rank that refused it named), the
audit passing and catching an edit; a keyed serverless run that loses a rank stops with a checkpoint and resumes to
the same bits (its resumed session's nonce from fresh contributions); a mutant rank 0 at the session nonce refused by
the rank it cheats, and a forged list of contributions failing the audit.

Every job is small (MLP on digits, 4 or 5 ranks, ≤ 10 rounds) and runs under a hard timeout; the campaign acts while
rank 0 holds before round 3 (``PHALANX_TEST_HOLD``), an event, not a race with the machine's speed.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.test_audit import forge
from tests.test_distributed import BASE, JOB_TIMEOUT_S, run_dir, wait_for, write_toml
from tests.test_distributed_gossip import JOB as GOSSIP_JOB
from tests.test_distributed_sealed import final, job, rewrite, transcript
from typer.testing import CliRunner

from _processes import HONEST_ROUND_TIMEOUT_S, HONEST_STALL_S
from phalanx.cli import app
from phalanx.distributed.audit import audit
from phalanx.distributed.channel import (
    PHASED_HEADER,
    PHASED_MAGIC,
    Kind,
    Limits,
    Violation,
    client_context,
    recv_phased,
    send_phased,
)
from phalanx.distributed.contribution import derive
from phalanx.distributed.env import RankEnv, free_port
from phalanx.distributed.keys import init_keys, load_identity
from phalanx.distributed.parameter_server import config_digest
from phalanx.distributed.rendezvous import ADDR_VAR, bind_host
from phalanx.distributed.worker import resolve_config
from phalanx.errors import ConfigError
from phalanx.experiments import make_config

SERVERLESS = {**BASE, "topology": "serverless", "engine": "torchrun", "round_timeout": HONEST_ROUND_TIMEOUT_S}
"""4 ranks, rank 3 Byzantine running ALIE (a vector attack: a second, Byzantine phase every round)."""
GOSSIP = {**GOSSIP_JOB, "workers": 5, "byzantine": 1, "f": 1, "aggregator": "cwtm", "attack": "alie"}
"""A ring of 5 nodes, node 4 Byzantine running ALIE on the rows it is sent, the trimmed mean at every node."""


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    for n in (4, 5):
        init_keys(d / f"job{n}", n)
        init_keys(d / f"other{n}", n)
    return d


def keyed(data: dict[str, Any], keys: Path) -> dict[str, Any]:
    return {**data, "keys": str(keys / f"job{data['workers']}")}


def same_bits(a: Path, b: Path) -> None:
    x, y = final(a), final(b)
    assert set(x) == set(y)
    for key in x:
        assert torch.equal(x[key], y[key]), key
    rows = [json.loads(r) for r in (run_dir(a) / "metrics.jsonl").read_text().splitlines()]
    assert rows == [json.loads(r) for r in (run_dir(b) / "metrics.jsonl").read_text().splitlines()]


def every_rejection(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every group of rejections (counted, with samples) of a transcript."""
    found = [r for entry in doc["rounds"] for r in entry["rejected"]]
    return found + [r for s in doc["sessions"] for r in s.get("after", {}).get("rejected", [])]


def _answer(tls: ssl.SSLSocket, hello: dict[str, Any]) -> str:
    send_phased(tls, Kind.HELLO, 0, 0, json.dumps(hello).encode())
    kind, _, _, answer = recv_phased(tls, Limits({Kind.REFUSED: 1 << 16, Kind.ACK: 0}))
    return answer.decode(errors="replace") if kind == Kind.REFUSED else "ACK"


def campaign(keys: Path, n: int, port: int, digest: str) -> list[str]:
    """Every outsider and stolen-key move against the listener at ``port`` of a live job; what each was answered."""
    plain = socket.create_connection(("127.0.0.1", port))  # no TLS: a row and a stop, in clear, and a huge frame
    plain.sendall(PHASED_HEADER.pack(PHASED_MAGIC, Kind.ROW, 0, 3, 8) + b"\x00" * 8
                  + PHASED_HEADER.pack(PHASED_MAGIC, Kind.STOP, 0, 3, 1) + b"X"
                  + PHASED_HEADER.pack(PHASED_MAGIC, Kind.ROW, 0, 3, 100 << 20))
    plain.close()
    answers = []
    hello = {"listen": ["127.0.0.1", 1], "nonce": "00" * 32}  # (rank 0 asks where one listens, the others the nonce)
    for who, rank, claim in (("other", 1, 1), ("job", 2, 1), ("job", 1, 1), ("job", n - 1, 1)):
        # another job's key; rank 2's key claiming rank 1; a copy of rank 1's key; the Byzantine rank's key as 1
        try:
            tls = client_context(load_identity(keys / f"{who}{n}", rank, n)).wrap_socket(
                socket.create_connection(("127.0.0.1", port)))
            answers.append(_answer(tls, {"rank": claim, "config": digest, **hello}))
            tls.close()
        except (ssl.SSLError, OSError, Violation) as exc:
            answers.append(type(exc).__name__)
    return answers


def live_campaign(keys: Path, data: dict[str, Any], tmp: Path) -> tuple[Path, str]:
    """Run the keyed job while impostors attack rank 0's and rank 2's listeners before round 3."""
    hold = tmp / "go"
    n = data["workers"]
    digest = config_digest(resolve_config(str(write_toml(tmp / "digest.toml", data)), []).identity())

    def script(procs: list[subprocess.Popen[bytes]], errs: Path, port: int) -> None:
        wait_for("holding round 3", errs, procs[0])
        found = re.search(r"\[phalanx rank 2\] sealed mesh: listening on 127\.0\.0\.1:(\d+)", errs.read_text())
        assert found, errs.read_text()[-3000:]
        at0, at2 = campaign(keys, n, port, digest), campaign(keys, n, int(found.group(1)), digest)
        assert at0[0] == at2[0] == "SSLCertVerificationError", (at0, at2)  # it cannot even verify the listener
        assert "claims rank 1 with rank 2's key" in at0[1] and "claims rank 1 with rank 2's key" in at2[1]
        assert "rank 1 is already connected: one connection per rank and run" in at0[2], at0
        assert "another start of the job" in at2[2], at2  # (it cannot know the run's nonce)
        assert f"claims rank 1 with rank {n - 1}'s key" in at0[3] and f"with rank {n - 1}'s key" in at2[3]
        hold.touch()

    out = tmp / "out"
    code, errs, _ = job(data, out, tmp, env={"PHALANX_TEST_HOLD": f"3:{hold}"}, script=script)
    assert code == 0, errs[-3000:]
    return out, errs


def check_campaign_record(out: Path) -> None:
    doc = transcript(out)
    rejected = every_rejection(doc)
    text = " | ".join(s for g in rejected for s in g["samples"])
    for at in (0, 2):  # what rank 0 refused itself, and what rank 2 refused and reported
        mine = " | ".join(s for g in rejected if g["at"] == at for s in g["samples"])
        assert mine.count("TLS handshake") >= 2, text  # no TLS; another job's key
        assert "claims rank 1 with rank 2's key" in mine, text
    report = audit(run_dir(out))
    assert report.ok, report.problems
    assert sum(report.rejected.values()) == sum(g["count"] for g in rejected) >= 10
    assert report.rejected_at[0] >= 5 and report.rejected_at[2] >= 5  # rank 0's own, and what rank 2 reported
    res = CliRunner().invoke(app, ["audit", str(run_dir(out))])
    assert res.exit_code == 0 and "rejected by the rank that refused them: rank 0: " in res.output, res.output


# -- configuration ------------------------------------------------------------------------------------------------

def test_keys_are_taken_on_every_topology_and_the_bind_address_is_explicit_across_machines(keys: Path) -> None:
    for data in (SERVERLESS, GOSSIP):
        assert make_config(keyed(data, keys)).keys is not None  # no longer refused
    with pytest.raises(ConfigError, match="backend='nccl' is invalid: allowed 'auto' or 'gloo' with keys"):
        make_config({**keyed(SERVERLESS, keys), "backend": "nccl"})
    one = RankEnv(1, 4, 1, "127.0.0.1", 29500, agent_store=False, run_id="x.0", local_world_size=4)
    two = RankEnv(1, 4, 1, "10.0.0.1", 29500, agent_store=True, run_id="x.0", local_world_size=2)
    mp = pytest.MonkeyPatch()
    try:
        mp.delenv(ADDR_VAR, raising=False)
        assert bind_host(one) == "127.0.0.1"
        with pytest.raises(ConfigError, match=ADDR_VAR):
            bind_host(two)
        mp.setenv(ADDR_VAR, "10.0.0.2")
        assert bind_host(two) == "10.0.0.2"
    finally:
        mp.undo()


# -- serverless ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def serverless(keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("serverless")
    code, errs, _ = job(keyed(SERVERLESS, keys), tmp / "out", tmp)
    assert code == 0, errs[-3000:]
    assert "sealed mesh: mutual TLS between the 4 ranks (serverless)" in errs and "no keys" not in errs
    return tmp / "out"


def test_a_keyed_serverless_job_gives_the_same_bits_as_without_keys(serverless: Path, tmp_path: Path) -> None:
    code, errs, _ = job(SERVERLESS, tmp_path / "plain", tmp_path)
    assert code == 0, errs[-3000:]
    assert "no keys: messages are not authenticated" in errs
    same_bits(serverless, tmp_path / "plain")


def test_the_serverless_transcript_names_every_row_once_and_audits(serverless: Path) -> None:
    doc = transcript(serverless)
    assert doc["format"] == "phalanx-transcript/3" and doc["topology"] == "serverless"
    assert [r["round"] for r in doc["rounds"]] == list(range(SERVERLESS["rounds"]))
    for entry in doc["rounds"]:  # every rank's row, and the Byzantine rank's attack row (phase 1)
        assert [(a["rank"], a["phase"]) for a in entry["accepted"]] == [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1)]
        assert entry["missing"] == [] and entry["rejected"] == []
    assert all("after" not in s for s in doc["sessions"])  # nothing refused, not even at the goodbyes
    report = audit(run_dir(serverless))
    assert report.ok, report.problems
    assert report.accepted == 5 * SERVERLESS["rounds"]
    # the nonce is not rank 0's alone: its session line lists every rank's contribution, and it follows from them
    (session,) = doc["sessions"]
    assert len(session["contributions"]) == 4 and None not in session["contributions"]
    assert derive([bytes.fromhex(c) for c in session["contributions"]]).hex() == session["nonce"]
    assert report.uncontributed == 0


def test_an_edited_serverless_transcript_fails_the_audit(serverless: Path, keys: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir(serverless), copy)
    doc = transcript(serverless)
    doc["rounds"][4]["accepted"][3]["phase"] = 1  # claim the Byzantine rank's placeholder was its attack row
    del doc["rounds"][2]["accepted"][1]  # and that rank 1 was not heard in round 2
    rewrite(copy, doc)
    problems = " | ".join(audit(copy).problems)
    assert "not the file the manifest records" in problems and "does not verify with rank 0's key" in problems
    rewrite(copy, doc, load_identity(keys / "job4", 0, 4))  # rank 0's key: the row checks isolated
    problems = " | ".join(audit(copy).problems)
    assert "round 4: rank 3's signature does not verify" in problems and "round 4: rank 3 was heard twice" in problems
    assert "round 2: ranks [1] are neither accepted nor missing" in problems
    other = audit(run_dir(serverless), keys / "other4" / "allow-list.json")
    assert not other.ok and "another allow-list" in other.problems[0]


def test_the_impostor_campaign_changes_no_bit_of_a_serverless_job(keys: Path, serverless: Path,
                                                                  tmp_path: Path) -> None:
    out, _ = live_campaign(keys, keyed(SERVERLESS, keys), tmp_path)
    same_bits(serverless, out)
    check_campaign_record(out)
    assert all(len(entry["accepted"]) == 5 and entry["missing"] == [] for entry in transcript(out)["rounds"])


def test_a_keyed_serverless_run_that_loses_a_rank_stops_with_a_checkpoint_and_resumes(keys: Path,
                                                                                     tmp_path: Path) -> None:
    """A rank whose connection ends (it crashed in round 6) is a failed collective, as with gloo: every rank gives
    round 6 up, rank 0 checkpoints its start; the same job started again resumes — a second session, a new nonce —
    and ends bit for bit where the run without keys and without the crash ends."""
    data = {**SERVERLESS, "byzantine": 0, "attack": "none"}  # (a crash is seen at once: no timeout involved)
    code, errs, _ = job(keyed(data, keys), tmp_path / "out", tmp_path, env={"PHALANX_TEST_SLEEP": "1:6:exit"})
    assert code == 3, errs[-3000:]
    assert "round 6: a rank failed or stayed silent" in errs and "rank 1 left before its row of round 6" in errs
    assert "Traceback" not in errs
    code, errs, _ = job(keyed(data, keys), tmp_path / "out", tmp_path)
    assert code == 0, errs[-3000:]
    assert "resuming from the checkpoint of round 6" in errs
    doc = transcript(tmp_path / "out")
    assert [s["from_round"] for s in doc["sessions"]] == [0, 6] and doc["sessions"][0]["nonce"] != doc["sessions"][1][
        "nonce"]
    assert [r["round"] for r in doc["rounds"]] == list(range(10))
    report = audit(run_dir(tmp_path / "out"))
    assert report.ok and report.uncontributed == 0, report.problems
    # the resumed session's nonce follows from fresh contributions of every rank (a new start draws new bytes)
    first, second = (s["contributions"] for s in doc["sessions"])
    assert None not in first + second and not set(first) & set(second)
    for s in doc["sessions"]:
        assert derive([bytes.fromhex(c) for c in s["contributions"]]).hex() == s["nonce"]
    code, errs, _ = job(data, tmp_path / "plain", tmp_path)
    assert code == 0, errs[-3000:]
    same_bits(tmp_path / "out", tmp_path / "plain")


@pytest.mark.parametrize(("mutant", "refusing"), [("reuse:" + "ab" * 32, {1, 2, 3}), ("drop:2", {2}), ("alter:1", {1})])
def test_a_mesh_rank_0_that_reuses_a_nonce_or_drops_or_alters_a_contribution_is_refused(
    keys: Path, tmp_path: Path, mutant: str, refusing: set[int],
) -> None:
    """A mutant serverless rank 0 (``PHALANX_TEST_NONCE``) on real processes: reusing another run's nonce (every
    contribution ignored) — every other rank stops; dropping rank 2's contribution, or altering rank 1's — that rank
    stops. Each in one line, exit 2, no traceback, before it signs anything; the test then ends the job (the others
    would wait out the join timeout for the rank that left)."""
    data = {**keyed(SERVERLESS, keys), "byzantine": 0, "attack": "none"}
    before_kill: list[str] = []

    def script(procs: list[subprocess.Popen[bytes]], errs: Path, port: int) -> None:
        for r in refusing:
            assert procs[r].wait(timeout=JOB_TIMEOUT_S) == 2  # (a configuration-class error: one line, exit 2)
        before_kill.append(errs.read_text())
        procs[0].kill()

    job(data, tmp_path / "out", tmp_path, env={"PHALANX_TEST_NONCE": mutant}, script=script)
    errs = before_kill[0]
    # the ranks share one stderr file, so one rank's line may run into another's: read each message, not each line
    refused = re.findall(r"\[phalanx rank (\d+)\] error: rank (\d+): refused the start snapshot: ([^\[\n]*)", errs)
    assert {int(rank) for rank, _, _ in refused} == refusing and all(a == b for a, b, _ in refused), errs[-3000:]
    why = {"reuse": "does not follow from the contributions", "drop": "contribution to the session nonce is absent",
           "alter": "contribution to the session nonce is altered"}[mutant.split(":")[0]]
    assert all(why in message for _, _, message in refused) and "Traceback" not in errs, errs[-3000:]


def test_a_forged_list_of_contributions_fails_the_audit_of_a_mesh_run(
    serverless: Path, keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a mesh rank 0 that reused another run's nonce would record: its session line with one rank's contribution
    swapped (the nonce, and so every row's signature, kept), re-signed with rank 0's key — the audit recomputes the
    nonce and refuses it in one line; the mutant audit without the recomputation passes it. A mesh transcript written
    before the contributions (none listed) is read as before and labelled "nonce not contributed"."""
    from phalanx.distributed import audit as audit_module

    def swapped(doc: dict[str, Any]) -> None:
        doc["sessions"][0]["contributions"][2] = "5a" * 32

    def older(doc: dict[str, Any]) -> None:
        del doc["sessions"][0]["contributions"]

    rank0 = load_identity(keys / "job4", 0, 4)
    forged = forge(run_dir(serverless), tmp_path / "forged", swapped, rank0)
    report = audit(forged)
    assert report.problems == ["the session from round 0 has a nonce that does not follow from its contributions "
                               "(SHA-256 of them): rank 0 chose it alone"], report.problems
    res = CliRunner().invoke(app, ["audit", str(forged)])
    assert res.exit_code == 1 and "does not follow from its contributions" in res.output, res.output
    old = forge(run_dir(serverless), tmp_path / "old", older, rank0)
    report = audit(old)
    assert report.ok and report.uncontributed == 1, report.problems
    res = CliRunner().invoke(app, ["audit", str(old)])
    assert res.exit_code == 0 and "1 sessions' nonce not contributed" in res.output, res.output
    monkeypatch.setattr(audit_module, "session_problem", lambda rec, n: None)
    assert audit(forged).ok


def test_under_torchruns_agent_the_store_carries_only_rank_0s_address(keys: Path, tmp_path: Path) -> None:
    """torchrun's agent holds MASTER_PORT: rank 0 listens on a free port and publishes [host, port] in the agent's
    store, the other ranks find it there; the run audits."""
    data = {**keyed(SERVERLESS, keys), "rounds": 4, "eval_every": 2, "checkpoint_every": 2}
    cfg = write_toml(tmp_path / "job.toml", data)
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), "-m", "phalanx.distributed.worker", str(cfg), "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "sealed mesh: mutual TLS between the 4 ranks (serverless)" in res.stderr
    assert audit(run_dir(tmp_path / "out")).ok


# -- gossip -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gossip(keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("gossip")
    code, errs, _ = job(keyed(GOSSIP, keys), tmp / "out", tmp)
    assert code == 0, errs[-3000:]
    assert "sealed mesh: mutual TLS between the 5 ranks (gossip)" in errs and "lost the link" not in errs
    return tmp / "out"


def test_a_keyed_gossip_job_gives_the_same_bits_as_without_keys(gossip: Path, tmp_path: Path) -> None:
    code, errs, _ = job(GOSSIP, tmp_path / "plain", tmp_path)
    assert code == 0, errs[-3000:]
    same_bits(gossip, tmp_path / "plain")
    rows = [json.loads(r) for r in (run_dir(gossip) / "metrics.jsonl").read_text().splitlines()]
    assert all(r["missing_messages"] == 0 for r in rows)


def test_the_gossip_transcript_holds_every_nodes_journal_and_audits(gossip: Path, keys: Path, tmp_path: Path) -> None:
    doc = transcript(gossip)
    assert doc["topology"] == "gossip" and all("after" not in s for s in doc["sessions"])
    assert all(entry["rejected"] == [] for entry in doc["rounds"])
    assert [r["round"] for r in doc["rounds"]] == [2, 5]  # the gathering rounds (evaluations, checkpoints)
    for node in range(5):
        rounds = [item for entry in doc["rounds"] for n in entry["nodes"] if n["node"] == node for item in n["rounds"]]
        assert [item["round"] for item in rounds] == list(range(6)), node
        senders = {a["rank"] for item in rounds for a in item["accepted"]}
        # a node hears its ring neighbours; the Byzantine node 4 is sent its neighbours' and their neighbours' steps
        assert senders == ({0, 1, 2, 3} if node == 4 else {(node - 1) % 5, (node + 1) % 5}), node
        assert all(item["missing"] == [] for item in rounds)
    report = audit(run_dir(gossip))
    assert report.ok, report.problems
    assert report.accepted == 6 * (4 * 2 + 4)
    (session,) = doc["sessions"]  # the nonce follows from every node's contribution
    assert len(session["contributions"]) == 5 and None not in session["contributions"] and report.uncontributed == 0
    assert derive([bytes.fromhex(c) for c in session["contributions"]]).hex() == session["nonce"]
    copy = tmp_path / "run"
    shutil.copytree(run_dir(gossip), copy)
    doc["rounds"][0]["nodes"][1]["rounds"][0]["accepted"][0]["rank"] = 3  # node 1 claims it heard node 3
    rewrite(copy, doc, load_identity(keys / "job5", 0, 5))  # even rank 0 cannot change a node's journal
    problems = " | ".join(audit(copy).problems)
    assert "round 2, node 1: its signature does not verify with rank 1's key" in problems, problems


def test_the_impostor_campaign_changes_no_bit_of_a_gossip_job(keys: Path, gossip: Path, tmp_path: Path) -> None:
    out, errs = live_campaign(keys, keyed(GOSSIP, keys), tmp_path)
    assert "lost the link" not in errs
    same_bits(gossip, out)
    check_campaign_record(out)


def test_a_keyed_gossip_neighbour_that_dies_costs_its_messages_and_the_others_finish(keys: Path,
                                                                                     tmp_path: Path) -> None:
    """As without keys (tests/test_distributed_gossip.py): rank 3 of a ring of 4 dies in round 3; ranks 0 and 2
    lose its link (its connections end), take their own steps in its place, count the missing messages, finish; the
    journals in the transcript say whom each node missed, and the run audits. The death is seen at once, so honest
    nodes get HONEST_ROUND_TIMEOUT_S at no cost; rank 1 stalls (HONEST_STALL_S) in round 5, a loaded machine's stall,
    and is missed by nobody — at the former round_timeout of 5 s its neighbours missed it there."""
    data = {**GOSSIP_JOB, "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "round_timeout": HONEST_ROUND_TIMEOUT_S}
    env = {"PHALANX_TEST_SLEEP": f"1:5:{HONEST_STALL_S:g},3:3:exit"}
    code, errs, _ = job(keyed(data, keys), tmp_path / "out", tmp_path, env=env)
    assert code == 0, errs[-3000:]
    assert "[phalanx rank 0] lost the link to rank 3" in errs and "[phalanx rank 2] lost the link to rank 3" in errs
    assert errs.count("lost the link") == 2, errs[-3000:]
    d = run_dir(tmp_path / "out")
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [(r["round"], r["missing_messages"]) for r in rows] == [(0, 0), (4, 2), (8, 8)]
    doc = transcript(tmp_path / "out")
    node0 = [item for entry in doc["rounds"] for n in entry["nodes"] if n["node"] == 0 for item in n["rounds"]]
    assert [item["missing"] for item in node0] == [[]] * 3 + [[3]] * 5
    assert audit(d).ok
