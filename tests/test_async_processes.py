"""The asynchronous server on real processes (phalanx.distributed.async_server, docs/async.md "On real processes"):
a slowed, a silent and a crashed worker never block it; a Byzantine worker with its own valid key is dropped and
recorded move by move; an outsider without a key is refused. Every wait is on an event (a line on stderr, a
message from the server), never on a sleep."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.test_distributed import JOB_TIMEOUT_S, run_dir, wait_for, write_toml

from _processes import supervised
from phalanx.distributed import launch, wire
from phalanx.distributed.channel import Kind, client_context, send_frame
from phalanx.distributed.env import free_port
from phalanx.distributed.keys import init_keys, load_identity
from phalanx.distributed.parameter_server import config_digest
from phalanx.distributed.sealed import SealedWorkerLinks
from phalanx.distributed.worker import resolve_config
from phalanx.experiments.build import from_config

ASYNC: dict[str, Any] = {
    "dataset": "digits", "model": "logreg", "workers": 6, "byzantine": 0, "attack": "none", "aggregator": "mean",
    "f": 0, "algorithm": "fedbuff", "algorithm_params": {"buffer_size": 2, "max_staleness": 3}, "rounds": 30,
    "lr": 0.5, "schedule": "constant", "seed": 0, "eval_every": 10, "checkpoint_every": 10, "round_timeout": 20.0,
}


def last_row(out: Path) -> dict[str, Any]:
    lines = (run_dir(out) / "metrics.jsonl").read_text().splitlines()
    return dict(json.loads(lines[-1]))


def launched(data: dict[str, Any], tmp: Path, env: dict[str, str], ranks: int | None = None,
             script: Any = None) -> tuple[int, str]:
    """Run the job (ranks 0 … ranks−1 of it as processes: the others are the test's); ``script(procs, errs, port)``
    acts while it runs. Rank 0's exit status and every rank's stderr."""
    cfg = write_toml(tmp / "job.toml", data)
    errs = tmp / "stderr.txt"
    port = free_port()
    n = data["workers"] if ranks is None else ranks
    with errs.open("wb") as fh:
        procs = []
        for rank in range(n):
            e = launch.rank_env(rank, data["workers"], "127.0.0.1", port)
            e.update(env)
            procs.append(subprocess.Popen([sys.executable, "-m", "phalanx.distributed.worker",
                                           *launch.worker_args(cfg, [], tmp / "out")], env=e, stderr=fh,
                                          stdout=subprocess.DEVNULL))
        code = supervised(procs, JOB_TIMEOUT_S, None if script is None else lambda: script(procs, errs, port))
    return code, errs.read_text()



def killed_while_holding(data: dict[str, Any], tmp: Path, step: int) -> tuple[int, str]:
    """Launch the job with rank 0 holding before ``step`` (a test hook, after the checkpoint it will resume from is
    written) and SIGKILL every rank there — on the event, never on a sleep. Rank 0's exit status and the stderr."""
    never = tmp / "never"

    def kill_all(procs: list[subprocess.Popen[bytes]], errs: Path, port: int) -> None:
        wait_for(f"holding round {step}", errs, procs[0])
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()

    return launched(data, tmp, {"PHALANX_TEST_HOLD": f"{step}:{never}"}, script=kill_all)

def test_a_slow_a_silent_and_a_crashed_worker_never_block_the_server(tmp_path: Path) -> None:
    """Ranks 1 … 5, K = 2: rank 2 sleeps 2 s before each of versions 1–3 (slow), rank 4 stops answering at version 2
    and is never woken (silent), rank 3 dies at version 3 (crash). The run ends all 30 server steps, and learns."""
    never = tmp_path / "never"
    env = {"PHALANX_TEST_SLEEP": f"2:1:2,2:2:2,2:3:2,4:2:{never},3:3:exit"}
    code, errs = launched(ASYNC, tmp_path, env)
    assert code == 0, errs[-3000:]
    # rank 3 dies at the first version ≥ 3 it is handed (on a loaded machine it may never be handed 3 itself)
    assert "[phalanx rank 3] PHALANX_TEST_SLEEP: exiting in round" in errs
    assert "sleeping until the test wakes it" in errs
    row = last_row(tmp_path / "out")
    assert row["round"] == 30 and row["updates"] == 60
    assert row["staleness_max"] <= 3 and row["test_accuracy"] > 0.5  # chance is 0.1


def test_the_same_faults_stop_a_server_that_waits_for_every_worker(tmp_path: Path) -> None:
    """The mutant: a buffer of K = 5, which needs every worker rank — a server that waits for particular workers.
    The same silent and crashed workers then stop it (no update for round_timeout: checkpoint, exit status 3), so
    the test above would fail on it."""
    never = tmp_path / "never"
    data = {**ASYNC, "algorithm_params": {"buffer_size": 5, "max_staleness": 3}, "round_timeout": 4.0}
    code, errs = launched(data, tmp_path, {"PHALANX_TEST_SLEEP": f"4:2:{never},3:3:exit"})
    assert code == 3, errs[-3000:]
    assert "no update arrived within round_timeout" in errs


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_keys(d / "job", 4)
    init_keys(d / "other", 4)
    return d


def test_a_byzantine_worker_with_its_own_key_is_dropped_and_recorded(keys: Path, tmp_path: Path) -> None:
    """Rank 3 is the test's, holding its own valid key: it sends a zero row, a second update for the same version,
    an update for a version not yet published, one of the wrong length, a NaN row, one from beyond the staleness
    bound, then floods duplicates; an outsider with another job's key knocks. Each is dropped and named on rank 0's
    log, the flood closes rank 3's uplink after 8 violations, and ranks 1–2 finish the run."""
    data = {**ASYNC, "workers": 4, "keys": str(keys / "job"), "rounds": 40,
            "algorithm_params": {"buffer_size": 2, "max_staleness": 2}}
    cfg = resolve_config(str(write_toml(tmp_path / "probe.toml", data)), [])
    digest = config_digest(cfg.identity())
    dim = from_config(cfg).problem.dim
    zero, nan = torch.zeros(dim), torch.full((dim,), float("nan"))
    first, done = threading.Event(), threading.Event()
    hold1, hold6 = tmp_path / "go1", tmp_path / "go6"

    def byzantine(port: int) -> None:
        links = SealedWorkerLinks(load_identity(keys / "job", 3, 4), "127.0.0.1", port, digest, dim * 4 + 32, 4)
        links.init()
        links.ready()
        # A keyed worker signs SHA-256(θ it computed at) ‖ its update (async_server.THETA_DIGEST): rank 3 binds the
        # θ it was sent, so that each bad update below is refused for its own fault, not for naming another θ.
        thetas: dict[int, bytes] = {}
        v, msg = links.next_message(0)  # version 0: the server holds before version 1
        assert msg is not None
        thetas[v] = hashlib.sha256(msg[1:1 + dim * 4]).digest()  # (θ alone: the credits follow it, async_credit)

        def bound(version: int, row: bytes) -> bytes:
            return thetas.get(version, bytes(32)) + row  # (a version never received: no θ to bind)

        links.send_vector(v, bound(v, wire.tensor_bytes(zero)))
        links.send_vector(v, bound(v, wire.tensor_bytes(zero)))  # a second update for one version
        links.send_vector(v + 50, bound(v + 50, wire.tensor_bytes(zero)))  # a version not yet published
        first.set()
        while v < 5:  # (waits on the server's messages, each version broadcast; it holds before version 6)
            v, msg = links.next_message(v + 1)
            assert msg is not None
            thetas[v] = hashlib.sha256(msg[1:1 + dim * 4]).digest()
        links.send_vector(5, bound(5, wire.tensor_bytes(zero)[:-4]))  # the wrong length
        links.send_vector(4, bound(4, wire.tensor_bytes(nan)))
        links.send_vector(0, bound(0, wire.tensor_bytes(zero)))  # beyond the bound (S = 2)
        try:
            for _ in range(30):
                links.send_vector(5, bound(5, wire.tensor_bytes(zero)))  # the flood: one, then duplicates
        except (ssl.SSLError, OSError):
            pass  # (closed by the server)
        done.set()

    def outsider(port: int) -> str:
        try:
            tls = client_context(load_identity(keys / "other", 3, 4)).wrap_socket(
                socket.create_connection(("127.0.0.1", port)))
            send_frame(tls, Kind.HELLO, 0, json.dumps({"rank": 3, "link": "up", "config": digest}).encode())
            tls.recv(1)
            return "answered"
        except (ssl.SSLError, OSError) as exc:
            return type(exc).__name__

    answers: list[str] = []

    def script(procs: list[subprocess.Popen[bytes]], errs: Path, port: int) -> None:
        wait_for("sealed links: mutual TLS", errs, procs[0])
        answers.append(outsider(port))
        threading.Thread(target=byzantine, args=(port,), daemon=True).start()
        assert first.wait(JOB_TIMEOUT_S)
        hold1.touch()
        assert done.wait(JOB_TIMEOUT_S)
        hold6.touch()

    code, errs = launched(data, tmp_path, {"PHALANX_TEST_HOLD": f"1:{hold1},6:{hold6}"}, ranks=3, script=script)
    assert code == 0, errs[-3000:]
    assert answers and answers[0] != "answered"
    for reason in ("second vector in round", "which has not begun", "(version 5): shape", "(version 4): nonfinite",
                   "of rank 3 (version -1): stale", "closed after 8 violations", "TLS handshake"):
        assert reason in errs, (reason, errs[-4000:])
    assert "no keys" not in errs
    row = last_row(tmp_path / "out")
    assert row["round"] == 40 and row["test_accuracy"] > 0.5
    assert row["dropped"] >= 3  # shape, NaN and the stale one, at least (duplicates are the links')
