"""Keyed jobs on real processes stay available under attack (issue 33), on all three topologies.

* **An outsider with no key** holds hundreds of idle connections, slow handshakes and a flood of garbage and of
  handshakes with another job's key against rank 0's listener from the start — from the ranks' own address and from
  another — and, while rank 0 holds before round 3, a second wave against rank 0's and (mesh) rank 2's listeners:
  every honest rank joins and finishes, and not a bit of θ, the streams or the metric rows differs from the same job
  unattacked (the former accept loop turned the ranks away: the server aborted round 0, gossip nodes exited 2).
* **A listed Byzantine rank** (the test plays it with its own key) floods bad frames: its links are closed at the
  MAX_VIOLATIONS-th, and the run goes on without it, a missing worker — bit for bit the run in which that rank died
  at round 0 (server; gossip: its neighbours' own steps stand in for its messages).

Jobs are small (MLP on digits, 4 or 5 ranks, 6 rounds) under a hard timeout; rank 0 holds before round 3
(``PHALANX_TEST_HOLD``) so the second wave acts at a known point. The outsider's connections are bounded (a few
hundred per wave, floods paced); nothing asserts a duration.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.test_distributed import BASE, run_dir, write_toml
from tests.test_distributed_gossip import JOB as GOSSIP_JOB
from tests.test_distributed_sealed import final, transcript
from tests.test_distributed_sealed import job as sealed_job

from _outsider import Outsider
from _processes import supervised
from phalanx.distributed import launch
from phalanx.distributed.audit import audit
from phalanx.distributed.channel import MAX_VIOLATIONS, PHASED_HEADER, PHASED_MAGIC, Kind, send_frame
from phalanx.distributed.env import free_port
from phalanx.distributed.keys import init_keys, load_identity
from phalanx.distributed.mesh import Mesh
from phalanx.distributed.parameter_server import config_digest
from phalanx.distributed.sealed import SealedWorkerLinks
from phalanx.distributed.worker import resolve_config

SHORT = {"rounds": 6, "eval_every": 3, "checkpoint_every": 3, "round_timeout": 30.0}
JOBS: dict[str, dict[str, Any]] = {
    "server": {**BASE, **SHORT},
    "serverless": {**BASE, **SHORT, "topology": "serverless"},
    "gossip": {**GOSSIP_JOB, **SHORT, "workers": 5, "byzantine": 1, "f": 1, "aggregator": "cwtm", "attack": "alie",
               "round_timeout": 120.0},
}
"""4 ranks (rank 3 Byzantine, ALIE) on the server and serverless topologies; a ring of 5 nodes (node 4 Byzantine).
Gossip's rank 0 waits ``GATHER_SHARE × round_timeout`` for the other nodes' rows at a gathering round and keeps a
late node's earlier rows: on a loaded machine 15 s was not always enough, and the checkpoint then differed."""


TIMEOUT_S = 400.0
"""A job's bound: on the 2-core development machine under other jobs' load, starting 4–5 processes alone took
80 s (measured, the same for the code before issue 33); the attacked jobs are no slower."""


def job(data: dict[str, Any], out: Path, tmp: Path, env: dict[str, str] | None = None,
        script: Any = None) -> tuple[int, str, int]:
    """The sealed tests' job runner (spawn/supervise, ``script(procs, errs, port)`` while it runs) under this
    file's bound."""
    return sealed_job(data, out, tmp, env, script, timeout_s=TIMEOUT_S)


def wait_for(text: str, errs: Path, rank0: subprocess.Popen[bytes]) -> None:
    """Wait until ``text`` is in the ranks' stderr (the job must still run)."""
    deadline = time.monotonic() + TIMEOUT_S
    while text not in errs.read_text():
        assert time.monotonic() < deadline and rank0.poll() is None, f"never saw {text!r}: " + errs.read_text()[-3000:]
        time.sleep(0.05)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    for n in (4, 5):
        init_keys(d / f"job{n}", n)
        init_keys(d / f"other{n}", n)
    return d


def keyed(topology: str, keys: Path) -> dict[str, Any]:
    data = JOBS[topology]
    return {**data, "keys": str(keys / f"job{data['workers']}")}


_CLEAN: dict[str, Path] = {}


def clean(topology: str, keys: Path, tmp: Path) -> Path:
    """The keyed job unattacked (its own Byzantine rank attacking as itself), once per topology."""
    if topology not in _CLEAN:
        code, errs, _ = job(keyed(topology, keys), tmp / "clean", tmp)
        assert code == 0, errs[-3000:]
        _CLEAN[topology] = tmp / "clean"
    return _CLEAN[topology]


def timing(out: Path) -> list[str]:
    """What waiting decided in a run, from its transcript: each gathering's silent ranks and each node's missed
    messages by round (a timeout that fired on a loaded machine shows here)."""
    lines = []
    for entry in transcript(out)["rounds"]:
        lines.append(f"gathering after round {entry['round']}: silent {entry.get('silent')}")
        for node in entry.get("nodes", []):
            missed = {r["round"]: r["missing"] for r in node.get("rounds") or [] if r.get("missing")}
            lines.append(f"  node {node['node']} missed {missed}")
    return lines


def same_bits(a: Path, b: Path) -> None:
    x, y = final(a), final(b)
    assert set(x) == set(y)
    for key in x:
        if not torch.equal(x[key], y[key]):
            rows = [i for i in range(x[key].shape[0]) if not torch.equal(x[key][i], y[key][i])] if x[key].dim() else []
            why = "\n".join([f"{key} differs in rows {rows}", f"{a}:", *timing(a), f"{b}:", *timing(b)])
            raise AssertionError(why)
    rows = [json.loads(r) for r in (run_dir(a) / "metrics.jsonl").read_text().splitlines()]
    assert rows == [json.loads(r) for r in (run_dir(b) / "metrics.jsonl").read_text().splitlines()]


def every_rejection(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every refusal group of a transcript (counted by round, recording rank, sender and kind)."""
    found = [g for entry in doc["rounds"] for g in entry["rejected"]]
    return found + [g for s in doc["sessions"] for g in s.get("after", {}).get("rejected", [])]


def said(group: dict[str, Any]) -> str:
    """What a refusal group says: its kind and its sampled reasons."""
    return " | ".join([group["kind"], *group["samples"]])


@pytest.mark.parametrize("topology", ["server", "serverless", "gossip"])
def test_an_outsider_at_the_start_and_mid_run_changes_no_bit(keys: Path, topology: str, tmp_path: Path,
                                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    data = keyed(topology, keys)
    n = data["workers"]
    foreign = keys / f"other{n}"
    hold = tmp_path / "go"
    outsiders: list[Outsider] = []

    def script(procs: list[subprocess.Popen[bytes]], errs: Path, port: int) -> None:
        # from the start: before rank 0 listens, while the ranks join, and on
        outsiders.append(Outsider(port, idle=150, slow=20, flood=2, foreign=foreign, pace=0.005))
        outsiders.append(Outsider(port, "127.0.0.2", idle=150, slow=20))
        wait_for("holding round 3", errs, procs[0])
        ports = [port]
        found = re.search(r"\[phalanx rank 2\] sealed mesh: listening on 127\.0\.0\.1:(\d+)", errs.read_text())
        if topology != "server":
            assert found, errs.read_text()[-3000:]
            ports.append(int(found.group(1)))
        for p in ports:  # mid-run: a second wave, on rank 0's and rank 2's listeners
            outsiders.append(Outsider(p, idle=150, slow=20, flood=2, foreign=foreign, pace=0.005))
        hold.touch()

    try:
        code, errs, _ = job(data, tmp_path / "out", tmp_path, env={"PHALANX_TEST_HOLD": f"3:{hold}"}, script=script)
    finally:
        for o in outsiders:
            o.close()
    assert code == 0, errs[-3000:]
    assert "Traceback" not in errs and "lost the link" not in errs and "error" not in errs, errs[-3000:]
    assert all(o.opened > 0 for o in outsiders)
    same_bits(clean(topology, keys, tmp_path_factory.mktemp(f"clean-{topology}")), tmp_path / "out")
    doc = transcript(tmp_path / "out")
    reasons = " | ".join(said(g) for g in every_rejection(doc))
    assert "TLS handshake" in reasons and ("shed" in reasons or "not introduced within" in reasons)
    if topology == "server":
        assert all([a["rank"] for a in entry["accepted"]] == [0, 1, 2, 3] for entry in doc["rounds"])
    elif topology == "serverless":
        assert all(len(entry["accepted"]) == 5 and entry["missing"] == [] for entry in doc["rounds"])
    report = audit(run_dir(tmp_path / "out"))
    assert report.ok, report.problems


def spawn_without(data: dict[str, Any], absent: int, tmp: Path, port: int) -> tuple[list[subprocess.Popen[bytes]],
                                                                                     Path]:
    """Start every rank of the job but ``absent`` (which the test plays), as ``phalanx launch`` would."""
    cfg = write_toml(tmp / "job.toml", data)
    errs = tmp / "stderr.txt"
    procs = []
    with errs.open("wb") as fh:
        for rank in range(data["workers"]):
            if rank == absent:
                continue
            env = launch.rank_env(rank, data["workers"], "127.0.0.1", port)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "phalanx.distributed.worker", *launch.worker_args(cfg, [], tmp / "out")],
                env=env, stdout=subprocess.DEVNULL, stderr=fh))
    return procs, errs


def digest_of(data: dict[str, Any], tmp: Path) -> str:
    return config_digest(resolve_config(str(write_toml(tmp / "digest.toml", data)), []).identity())


def finish(procs: list[subprocess.Popen[bytes]]) -> int:
    return supervised(procs, TIMEOUT_S)


def test_a_listed_rank_flooding_bad_vectors_is_cut_off_and_the_server_goes_on_without_it(
    keys: Path, tmp_path: Path,
) -> None:
    data = keyed("server", keys)
    code, errs, _ = job(data, tmp_path / "died", tmp_path, env={"PHALANX_TEST_SLEEP": "3:0:exit"})
    assert code == 0, errs[-3000:]
    port = free_port()
    play = tmp_path / "play"
    play.mkdir()
    procs, err_path = spawn_without(data, 3, play, port)
    wait_for("sealed links: mutual TLS", err_path, procs[0])  # (rank 0 listens: it may take long to start)
    links = SealedWorkerLinks(load_identity(keys / "job4", 3, 4), "127.0.0.1", port, digest_of(data, play), 1 << 20, 4)
    links.init()
    links.ready()
    assert links.up is not None
    sent = 0
    try:  # signed for no run: each is a violation
        for _ in range(500):
            send_frame(links.up, Kind.VECTOR, 0, bytes(64) + bytes(4 * 100))
            sent += 1
    except OSError:
        pass
    code = finish(procs)
    assert code == 0, err_path.read_text()[-3000:]
    assert sent < 500 or links.up.recv(1) == b""  # rank 0 closed the uplink
    a, b = final(tmp_path / "died"), final(play / "out")
    for key in a:
        assert torch.equal(a[key], b[key]), key  # the run went on without rank 3, as if it had died at round 0
    doc = transcript(play / "out")
    assert all(entry["missing"] == [3] for entry in doc["rounds"])
    groups = [g for g in every_rejection(doc) if g["rank"] == 3]
    assert sum(g["count"] for g in groups if "does not verify" in g["kind"]) == MAX_VIOLATIONS, groups
    assert sum(g["count"] for g in groups if "closed after N violations" in g["kind"]) == 1, groups


class _Nothing:
    """The played Byzantine node's sink: it takes what it is sent and uses none of it."""

    def signed(self, *args: Any) -> None:
        return None

    def refused(self, *args: Any) -> None:
        return None

    def gone(self, *args: Any) -> None:
        return None


def test_a_listed_gossip_node_flooding_bad_messages_is_cut_off_and_the_others_finish(
    keys: Path, tmp_path: Path,
) -> None:
    """Node 4 (Byzantine, ring of 5; the test plays it) floods its neighbours 0 and 3 — and rank 0's monitoring link
    — with messages whose signature does not verify: each closes its link at the MAX_VIOLATIONS-th, takes its own step
    in place of node 4's messages, and the run ends bit for bit where it ends when node 4 dies at round 0."""
    data = keyed("gossip", keys)
    code, errs, _ = job(data, tmp_path / "died", tmp_path, env={"PHALANX_TEST_SLEEP": "4:0:exit"})
    assert code == 0, errs[-3000:]
    port = free_port()
    play = tmp_path / "play"
    play.mkdir()
    procs, err_path = spawn_without(data, 4, play, port)
    wait_for("[phalanx rank 0] sealed mesh: listening", err_path, procs[0])
    node = Mesh(load_identity(keys / "job5", 4, 5), "gossip", digest_of(data, play), 5, ("127.0.0.1", 0),
                row_limit=1 << 20, init_limit=1 << 28, monitor_limit=1 << 20)
    node.sink = _Nothing()
    try:
        node.join("127.0.0.1", port)
        node.receive_init(TIMEOUT_S)
        assert node.connect({0, 3}, time.monotonic() + TIMEOUT_S) == {}
        node.ready.set()
        bad = PHASED_HEADER.pack(PHASED_MAGIC, Kind.ROW, 1, 0, 64 + 100) + bytes(64 + 100)
        for peer in (0, 3):
            try:
                for _ in range(200):
                    node.out[peer].sock.sendall(bad)
            except OSError:
                pass
        code = finish(procs)
    finally:
        node.close(wait_for=set(), timeout=1.0)
    assert code == 0, err_path.read_text()[-3000:]
    same_bits(tmp_path / "died", play / "out")
    doc = transcript(play / "out")
    closed = [g for g in every_rejection(doc) if g["rank"] == 4 and "closed after" in g["kind"]]
    assert {g["at"] for g in closed} == {0, 3}, closed  # rank 0's own link, and node 3's (reported)
    assert audit(run_dir(play / "out")).ok


@pytest.mark.parametrize("topology", ["server", "serverless"])
def test_with_a_fixed_sealed_port_torchruns_store_is_left_out(keys: Path, topology: str, tmp_path: Path) -> None:
    """Under torchrun's agent (whose store listens on every interface, and which anyone reaching it may overwrite),
    ``PHALANX_SEALED_PORT`` makes rank 0 listen on ``MASTER_ADDR`` at that port and every rank go there: the store's
    ``sealed/port`` / ``sealed/mesh`` is neither written nor read, and the run audits."""
    import os

    data = {**keyed(topology, keys), "rounds": 4, "eval_every": 2, "checkpoint_every": 2}
    cfg = write_toml(tmp_path / "job.toml", data)
    port = free_port()
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), "-m", "phalanx.distributed.worker", str(cfg), "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=TIMEOUT_S, env={**os.environ, "PHALANX_SEALED_PORT": str(port)},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"127.0.0.1:{port}" in res.stderr  # rank 0's listener: the fixed port, not a free one from the store
    assert audit(run_dir(tmp_path / "out")).ok
