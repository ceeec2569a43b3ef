"""A keyed parameter-server job on real processes: the same result as without keys, an impostor campaign run against
it while it trains (none of which changes a bit of the result), the transcript audited, resumed, and tampered with;
torchrun's own agent; the store bound to MASTER_ADDR; a job across machines refused without keys.

Every job is small (MLP on digits, 4 ranks, 10 rounds) and runs under a hard timeout; the campaign acts while rank 0
holds before a chosen round (``PHALANX_TEST_HOLD``), an event, not a race with the machine's speed.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests.test_distributed import BASE, JOB_TIMEOUT_S, run_dir, wait_for, write_toml
from typer.testing import CliRunner

from _processes import HONEST_ROUND_TIMEOUT_S, HONEST_STALL_S, supervised
from phalanx.cli import app
from phalanx.distributed import launch
from phalanx.distributed.audit import audit
from phalanx.distributed.channel import HEADER, MAGIC, Kind, Limits, Violation, client_context, recv_frame, send_frame
from phalanx.distributed.contribution import derive
from phalanx.distributed.env import RankEnv, free_port, open_store
from phalanx.distributed.keys import init_keys, load_identity
from phalanx.distributed.transcript import TRANSCRIPT, load, render, signature_line
from phalanx.distributed.worker import check_identity
from phalanx.errors import ConfigError
from phalanx.experiments import make_config

SEALED = {**BASE, "checkpoint_every": 5}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_keys(d / "job", 4)
    init_keys(d / "other", 4)
    return d


def job(data: dict[str, Any], out: Path, tmp: Path, env: dict[str, str] | None = None,
        script: Any = None, timeout_s: float = JOB_TIMEOUT_S) -> tuple[int, str, int]:
    """Run a job with ``phalanx launch``'s spawn/supervise; ``script(procs, errs, port)`` acts while it runs."""
    cfg = write_toml(tmp / f"job{time.monotonic_ns()}.toml", data)
    errs = tmp / f"stderr{time.monotonic_ns()}.txt"
    port = free_port()
    with errs.open("wb") as fh:
        procs = launch.spawn(data["workers"], launch.worker_args(cfg, [], out), extra_env=env, stderr=fh,
                             stdout=subprocess.DEVNULL, master_port=port)
        code = supervised(procs, timeout_s, None if script is None else lambda: script(procs, errs, port))
    return code, errs.read_text(), port


def final(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir(out) / "checkpoint.safetensors"))


def transcript(out: Path) -> dict[str, Any]:
    """The run's transcript as one document (:func:`phalanx.distributed.transcript.load`)."""
    return load(run_dir(out) / TRANSCRIPT)


def rewrite(run: Path, doc: dict[str, Any], signer: Any = None) -> None:
    """Write ``doc`` as ``run``'s transcript: with ``signer``'s signature, or (None) with the old signature line."""
    body = render(doc)
    last = (run / TRANSCRIPT).read_bytes().splitlines(keepends=True)[-1]
    (run / TRANSCRIPT).write_bytes(body + (last if signer is None else signature_line(body, signer)))


@pytest.fixture(scope="module")
def clean(keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The keyed job, nobody attacking it but its own Byzantine rank (ALIE, as itself). Rank 1 stalls
    (HONEST_STALL_S) in round 4, a loaded machine's stall: it is not missing (the transcript test), and the bits equal
    the plain run's and the impostor campaign's — at the former round_timeout of 5 s it was missing there."""
    tmp = tmp_path_factory.mktemp("clean")
    code, errs, _ = job({**SEALED, "keys": str(keys / "job")}, tmp / "out", tmp,
                        env={"PHALANX_TEST_SLEEP": f"1:4:{HONEST_STALL_S:g}"})
    assert code == 0, errs[-3000:]
    assert "sealed links: mutual TLS" in errs
    return tmp / "out"


def test_a_keyed_job_gives_the_same_result_as_without_keys(clean: Path, tmp_path: Path) -> None:
    code, errs, _ = job(SEALED, tmp_path / "plain", tmp_path)
    assert code == 0, errs[-3000:]
    assert "no keys: messages are not authenticated" in errs  # the one line a run without keys prints
    a, b = final(clean), final(tmp_path / "plain")
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    rows = [json.loads(x) for x in (run_dir(clean) / "metrics.jsonl").read_text().splitlines()]
    plain = [json.loads(x) for x in (run_dir(tmp_path / "plain") / "metrics.jsonl").read_text().splitlines()]
    assert rows == plain


def test_the_transcript_names_every_rank_once_per_round_and_audits(clean: Path) -> None:
    doc = transcript(clean)
    assert [r["round"] for r in doc["rounds"]] == list(range(SEALED["rounds"]))
    for entry in doc["rounds"]:
        assert [a["rank"] for a in entry["accepted"]] == [0, 1, 2, 3]  # the Byzantine rank too: it speaks as itself
        assert entry["missing"] == [] and entry["rejected"] == []
    report = audit(run_dir(clean))
    assert report.ok, report.problems
    assert report.accepted == 4 * SEALED["rounds"] and report.uncontributed == 0
    (session,) = doc["sessions"]  # its nonce: SHA-256 of every rank's contribution
    assert derive([bytes.fromhex(c) for c in session["contributions"]]).hex() == session["nonce"]
    res = CliRunner().invoke(app, ["audit", str(run_dir(clean))])
    assert res.exit_code == 0 and "audit passed" in res.output, res.output


def _impostors(keys: Path, port: int) -> list[str]:
    """Every outsider and stolen-key move of the campaign against a live job; what each one was answered."""
    answers = []
    plain = socket.create_connection(("127.0.0.1", port))  # no TLS: a θ, a stop and a 100× vector, in clear
    plain.sendall(HEADER.pack(MAGIC, Kind.THETA, 3, 8) + b"\x00" * 8 + HEADER.pack(MAGIC, Kind.STOP, 3, 1) + b"X"
                  + HEADER.pack(MAGIC, Kind.VECTOR, 3, 100 << 20))
    plain.close()
    for who, rank, claim in (("other", 1, 1), ("job", 2, 1), ("job", 1, 1), ("job", 3, 1)):
        # another job's key; rank 2's key claiming rank 1; a copy of rank 1's key; the Byzantine rank's key as 1
        try:
            tls = client_context(load_identity(keys / who, rank, 4)).wrap_socket(
                socket.create_connection(("127.0.0.1", port)))
            send_frame(tls, Kind.HELLO, 0, json.dumps({"rank": claim, "link": "up", "config": "x"}).encode())
            _, _, answer = recv_frame(tls, Limits({Kind.REFUSED: 1 << 16}))
            answers.append(answer.decode(errors="replace"))
            tls.close()
        except (ssl.SSLError, OSError, Violation) as exc:
            answers.append(f"{type(exc).__name__}")
    return answers


def test_the_impostor_campaign_changes_nothing(keys: Path, clean: Path, tmp_path: Path) -> None:
    hold = tmp_path / "go"

    def script(procs: list[subprocess.Popen[bytes]], errs: Path, port: int) -> None:
        wait_for("holding round 3", errs, procs[0])
        answers = _impostors(keys, port)
        assert answers[0] == "SSLCertVerificationError", answers  # it cannot even verify the server
        assert "claims rank 1 with rank 2's key" in answers[1], answers
        assert "runs another config" in answers[2], answers  # checked before "already connected": both refuse
        assert "claims rank 1 with rank 3's key" in answers[3], answers
        hold.touch()

    code, errs, _ = job({**SEALED, "keys": str(keys / "job")}, tmp_path / "out", tmp_path,
                        env={"PHALANX_TEST_HOLD": f"3:{hold}"}, script=script)
    assert code == 0, errs[-3000:]
    a, b = final(clean), final(tmp_path / "out")
    for key in a:
        assert torch.equal(a[key], b[key]), key  # not a bit of the result changed
    doc = transcript(tmp_path / "out")
    rejected = [g for entry in doc["rounds"] for g in entry["rejected"]]  # counted by group, with samples
    reasons = " | ".join(s for g in rejected for s in g["samples"])
    assert reasons.count("TLS handshake") >= 2, reasons  # no TLS; another job's key
    assert "claims rank 1 with rank 2's key" in reasons
    assert "claims rank 1 with rank 3's key" in reasons
    assert all(entry["missing"] == [] for entry in doc["rounds"])
    assert all([a["rank"] for a in entry["accepted"]] == [0, 1, 2, 3] for entry in doc["rounds"])
    report = audit(run_dir(tmp_path / "out"))
    assert report.ok, report.problems
    assert sum(report.rejected.values()) == sum(g["count"] for g in rejected) >= 4


def test_an_edited_transcript_fails_the_audit(keys: Path, clean: Path, tmp_path: Path) -> None:
    """Edited without rank 0's key: its signature fails; re-signed with it (the checks isolated), the row's
    signature and the rounds' contiguity fail. Every forged case of issue 33: tests/test_audit.py."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir(clean), copy)
    doc = load(copy / TRANSCRIPT)
    doc["rounds"][4]["accepted"][1]["sha256"] = "0" * 64  # claim rank 1 sent something else in round 4
    rewrite(copy, doc)
    problems = " | ".join(audit(copy).problems)
    assert "not the file the manifest records" in problems
    assert "does not verify with rank 0's key" in problems
    rewrite(copy, doc, load_identity(keys / "job", 0, 4))
    assert "round 4: rank 1's signature does not verify" in " | ".join(audit(copy).problems)
    del doc["rounds"][6]
    rewrite(copy, doc, load_identity(keys / "job", 0, 4))
    assert "round 7 follows round 5" in " | ".join(audit(copy).problems)
    res = CliRunner().invoke(app, ["audit", str(copy)])
    assert res.exit_code == 1 and "audit failed" in res.output


def test_an_audit_against_another_allow_list_fails(clean: Path, keys: Path) -> None:
    report = audit(run_dir(clean), keys / "other" / "allow-list.json")
    assert not report.ok
    assert "another allow-list" in report.problems[0]
    assert any("does not verify" in p for p in report.problems)


def test_a_keyed_run_that_lost_too_many_workers_resumes_and_audits(keys: Path, tmp_path: Path) -> None:
    """Ranks 1 and 2 crash in round 6 (f = 1): seen at once (their connections end, no timeout is waited out), so
    honest ranks get HONEST_ROUND_TIMEOUT_S at no cost — at 2 s, two honest ranks stalled together on a loaded
    machine would have stopped the run in an earlier round."""
    data = {**SEALED, "keys": str(keys / "job"), "byzantine": 0, "attack": "none",
            "round_timeout": HONEST_ROUND_TIMEOUT_S}
    code, errs, _ = job(data, tmp_path / "out", tmp_path, env={"PHALANX_TEST_SLEEP": "1:6:exit,2:6:exit"})
    assert code == 3, errs[-3000:]
    code, errs, _ = job(data, tmp_path / "out", tmp_path)
    assert code == 0, errs[-3000:]
    doc = transcript(tmp_path / "out")
    assert [s["from_round"] for s in doc["sessions"]] == [0, 6]  # the abort checkpointed the start of round 6
    assert [r["round"] for r in doc["rounds"]] == list(range(10))
    report = audit(run_dir(tmp_path / "out"))
    assert report.ok, report.problems
    # each session's nonce follows from every rank's contribution, drawn afresh by the resumed session
    first, second = (s["contributions"] for s in doc["sessions"])
    assert all(c is not None for c in first + second) and not set(first) & set(second)
    for s in doc["sessions"]:
        assert derive([bytes.fromhex(c) for c in s["contributions"]]).hex() == s["nonce"]
    assert report.uncontributed == 0


def test_a_byzantine_ranks_attack_state_that_no_generator_takes_is_refused(keys: Path, tmp_path: Path) -> None:
    """Byzantine rank 3 (alie, its own key) sends 0xff bytes in place of its attack stream's state with every vector
    (``PHALANX_TEST_STATE``). Rank 0 kept them: the checkpoint's attack stream took them and every resume of the run
    failed in ``set_state`` (an attacker's review). Now each such vector is refused — a rejection in the transcript,
    rank 3 missing, counted against f — the run finishes, its checkpoint holds a generator's state, and it audits."""
    code, errs, _ = job({**SEALED, "keys": str(keys / "job")}, tmp_path / "out", tmp_path,
                        env={"PHALANX_TEST_STATE": "3"})
    assert code == 0, errs[-3000:]
    assert "PHALANX_TEST_STATE" in errs
    doc = transcript(tmp_path / "out")
    reasons = " | ".join(s for entry in doc["rounds"] for g in entry["rejected"] for s in g["samples"])
    assert "attack-stream state no random generator takes" in reasons, reasons
    assert all(3 not in [a["rank"] for a in entry["accepted"]] for entry in doc["rounds"])
    states = {k: v for k, v in final(tmp_path / "out").items() if "attack" in k}
    assert states, "the checkpoint keeps the attack stream"
    for state in states.values():
        torch.Generator().set_state(state)  # raised "Invalid mt19937 state" on the checkpoint it replaces
    report = audit(run_dir(tmp_path / "out"))
    assert report.ok, report.problems


@pytest.mark.parametrize(("mutant", "refusing"), [("reuse:" + "ab" * 32, {1, 2, 3}), ("drop:2", {2})])
def test_a_rank_0_that_reuses_a_nonce_or_drops_a_contribution_is_refused(
    keys: Path, tmp_path: Path, mutant: str, refusing: set[int],
) -> None:
    """A mutant rank 0 (``PHALANX_TEST_NONCE``) on real processes: reusing another run's nonce (every contribution
    ignored) — every honest worker stops; dropping rank 2's contribution — rank 2 stops. Each in one line, exit 2,
    no traceback, without waiting for anything; the test then ends the job (the mutant rank 0 would wait out the join
    timeout for the ranks that left)."""
    data = {**SEALED, "keys": str(keys / "job"), "byzantine": 0, "attack": "none"}

    before_kill: list[str] = []

    def script(procs: list[subprocess.Popen[bytes]], errs: Path, port: int) -> None:
        for r in refusing:
            assert procs[r].wait(timeout=JOB_TIMEOUT_S) == 2  # (a configuration-class error: one line, exit 2)
        before_kill.append(errs.read_text())  # (ranks that went on print the server's going away after the kill)
        procs[0].kill()

    job(data, tmp_path / "out", tmp_path, env={"PHALANX_TEST_NONCE": mutant}, script=script)
    errs = before_kill[0]
    # the ranks share one stderr file, so one rank's line may run into another's: read each message, not each line
    refused = re.findall(r"\[phalanx rank (\d+)\] error: rank \d+: refused the start snapshot: ([^\[\n]*)", errs)
    assert {int(rank) for rank, _ in refused} == refusing, errs[-3000:]
    why = "does not follow from the contributions" if mutant.startswith("reuse") else "contribution to the session " \
        "nonce is absent"
    assert all(why in message for _, message in refused) and "Traceback" not in errs, errs[-3000:]


def test_torchruns_agent_store_carries_only_the_listeners_port(keys: Path, tmp_path: Path) -> None:
    data = {**SEALED, "keys": str(keys / "job"), "rounds": 4, "eval_every": 2, "checkpoint_every": 2}
    cfg = write_toml(tmp_path / "job.toml", data)
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), "-m", "phalanx.distributed.worker", str(cfg), "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert audit(run_dir(tmp_path / "out")).ok


def test_the_store_listens_on_master_addr_only() -> None:
    tcp = Path("/proc/net/tcp")
    if not tcp.exists():
        pytest.skip("reads Linux's /proc/net/tcp")
    port = free_port()
    store = open_store(RankEnv(0, 2, 0, "127.0.0.1", port, agent_store=False, run_id="t.0"), 5.0)
    listening = [line.split()[1] for line in tcp.read_text().splitlines()[1:]
                 if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == port]
    assert listening == [f"0100007F:{port:04X}"], listening  # 127.0.0.1, not 0.0.0.0
    del store


def test_ranks_on_several_machines_need_keys_or_insecure(keys: Path) -> None:
    cfg = make_config({**SEALED, "engine": "torchrun"})
    two_machines = RankEnv(1, 4, 1, "10.0.0.1", 29500, agent_store=True, run_id="x.0", local_world_size=2)
    with pytest.raises(ConfigError, match="several machines"):
        check_identity(cfg, two_machines)
    assert check_identity(make_config({**SEALED, "engine": "torchrun", "insecure": True}), two_machines) is None
    keyed = make_config({**SEALED, "engine": "torchrun", "keys": str(keys / "job")})
    assert check_identity(keyed, two_machines).rank == 1  # type: ignore[union-attr]
    one_machine = RankEnv(1, 4, 1, "127.0.0.1", 29500, agent_store=False, run_id="x.0", local_world_size=4)
    assert check_identity(cfg, one_machine) is None


@pytest.mark.parametrize(("keyed", "topology"), [(True, "server"), (False, "server"), (True, "serverless"),
                                                 (False, "serverless")])
def test_a_finished_torchrun_run_is_not_trained_again(keys: Path, tmp_path: Path, keyed: bool, topology: str) -> None:
    """Rank 0 holds the run directory as a simulated run does: started again, a finished run trains nothing, writes
    nothing and releases the other ranks (before, the torchrun engine rewrote its final files)."""
    data = {**SEALED, "rounds": 4, "eval_every": 2, "checkpoint_every": 2, "topology": topology}
    if keyed:
        data["keys"] = str(keys / "job")
    code, errs, _ = job(data, tmp_path / "out", tmp_path)
    assert code == 0, errs[-3000:]
    d = run_dir(tmp_path / "out")
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and not p.name.endswith(".lock")}
    code, errs, _ = job(data, tmp_path / "out", tmp_path)
    assert code == 0, errs[-3000:]
    assert "has finished already: nothing to train" in errs
    after = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and not p.name.endswith(".lock")}
    assert after == before
