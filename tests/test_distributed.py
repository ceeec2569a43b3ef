"""The torchrun engine on this machine: same numbers as the simulated engine, Byzantine ranks, crashed and silent
workers, too many missing workers (checkpoint + resume), config keys and errors.

Every multi-process test runs real processes (``phalanx launch`` / :mod:`phalanx.distributed.launch`) with gloo and
the c10d TCPStore on 127.0.0.1, on small runs (MLP on digits, 3–4 workers), each under a hard timeout.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _processes import HONEST_ROUND_TIMEOUT_S, HONEST_STALL_S, JOB_TIMEOUT_S, supervised
from phalanx.distributed import launch, wire, worker
from phalanx.distributed.env import RankEnv, free_port, open_store
from phalanx.errors import ConfigError
from phalanx.experiments import grid, make_config, train

BASE: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "workers": 4, "byzantine": 1, "f": 1, "aggregator": "cwtm",
    "attack": "alie", "partition": "dirichlet", "alpha": 1.0, "rounds": 10, "batch_size": 16, "lr": 0.1,
    "seed": 5, "eval_every": 5, "checkpoint_every": 5, "round_timeout": HONEST_ROUND_TIMEOUT_S,
}
"""The small job of this file and of the sealed, mesh and availability tests (which import it). Its runs assert that
nobody was missing, or the same bits as another run: every honest rank must answer every round, so honest ranks get
HONEST_ROUND_TIMEOUT_S (at the former 5 s one stall on CI's loaded 2-core machine made a rank missing, or stopped a
serverless run). A test whose rank is meant to be silent or dead sets its own ``round_timeout`` or wakes it on an
event; a rank that dies is seen at once (its links close), whatever the timeout."""


def write_toml(path: Path, data: dict[str, Any]) -> Path:
    def value(v: Any) -> str:  # JSON scalars and lists are TOML; tables are written inline
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)

    lines = [f"{k} = {value(v)}" for k, v in data.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_dir(out: Path) -> Path:
    found = glob.glob(str(out / "*" / "config.json"))
    assert len(found) == 1, f"expected one run directory under {out}, found {found}"
    return Path(found[0]).parent


def simulated(data: dict[str, Any], out: Path) -> dict[str, torch.Tensor]:
    """The simulated engine's final checkpoint for the same config (distributed-only keys dropped)."""
    plain = {k: v for k, v in data.items() if k not in ("topology", "round_timeout", "backend", "engine")}
    train(make_config(plain), out)
    return load_file(str(out / "checkpoint.safetensors"))


def assert_same_run(dist_dir: Path, sim: dict[str, torch.Tensor], sim_dir: Path) -> None:
    got = load_file(str(dist_dir / "checkpoint.safetensors"))
    assert set(got) == set(sim)
    for key in ("theta", "momentum", "previous"):
        if key in sim:
            torch.testing.assert_close(got[key], sim[key], atol=1e-5, rtol=1e-4, msg=f"{key} differs")
    for key in sim:
        if key.startswith("rng."):
            assert torch.equal(got[key], sim[key]), f"stream {key} differs"
    rows = [json.loads(x) for x in (dist_dir / "metrics.jsonl").read_text().splitlines()]
    sim_rows = [json.loads(x) for x in (sim_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [r["round"] for r in sim_rows]
    for r, s in zip(rows, sim_rows):
        assert r["test_accuracy"] == pytest.approx(s["test_accuracy"], abs=3e-3)
        if s["agg_error"] is not None:
            assert r["agg_error"] == pytest.approx(s["agg_error"], rel=1e-3, abs=1e-6)
    for name in ("config.json", "manifest.json", "metrics.parquet", "DONE", "distributed.json"):
        assert (dist_dir / name).exists(), name


def wait_for(text: str, errs: Path, rank0: subprocess.Popen[bytes]) -> None:
    """Wait until ``text`` is in the ranks' stderr; fail if the job (rank 0) ended without it. Rank 0's state is read
    before the file, so a last line it printed just before it ended (a stop message) is found, not raced."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:
        ended = rank0.poll() is not None
        if text in errs.read_text():
            return
        assert not ended and time.monotonic() < deadline, f"never saw {text!r}: " + errs.read_text()[-3000:]
        time.sleep(0.02)


Script = Callable[[list[subprocess.Popen[bytes]], Path, Any], None]


def wake_when(*steps: tuple[str, Path]) -> Script:
    """A script that, for each (text, file) in turn, waits until rank 0's stderr says ``text`` and then creates
    ``file``: a rank sleeping on that file (``PHALANX_TEST_SLEEP=RANK:ROUND:FILE``) stays silent exactly until the
    server has declared it missing — an event, whatever the machine's speed — and then wakes, so the test pays
    ``round_timeout`` once for that round and not a fixed sleep that must outlast it."""
    def script(procs: list[subprocess.Popen[bytes]], errs: Path, store: Any) -> None:
        for text, path in steps:
            wait_for(text, errs, procs[0])
            path.touch()
    return script


def run_job(
    data: dict[str, Any], out: Path, tmp: Path, env: dict[str, str] | None = None, script: Script | None = None,
) -> tuple[int, str]:
    """Run a job of ``data['workers']`` ranks; ``script(procs, stderr_path, store)`` acts on it while it runs
    (``store``: a client of the job's c10d store). Returns rank 0's exit status and every rank's stderr."""
    cfg_path = write_toml(tmp / f"job{time.monotonic_ns()}.toml", data)
    errs = tmp / f"stderr{time.monotonic_ns()}.txt"
    port = free_port()
    size = data["clients_per_round"] if data.get("algorithm") == "fedavg" else data["workers"]  # a rank per slot
    with errs.open("wb") as fh:
        procs = launch.spawn(size, launch.worker_args(cfg_path, [], out), extra_env=env, stderr=fh,
                             stdout=subprocess.DEVNULL, master_port=port)

        def act() -> None:
            if script is not None:  # a client of the job's store, as a worker rank opens it (same key prefix)
                client = RankEnv(1, size, 1, "127.0.0.1", port, agent_store=False, run_id="local.0")
                script(procs, errs, open_store(client, JOB_TIMEOUT_S))

        code = supervised(procs, JOB_TIMEOUT_S, act)
    return code, errs.read_text()


def dist_log(d: Path) -> list[dict[str, Any]]:
    rounds: list[dict[str, Any]] = json.loads((d / "distributed.json").read_text())["rounds"]
    return rounds


# ---------------------------------------------------------------------------------------------------------------
# config and errors (no processes)
# ---------------------------------------------------------------------------------------------------------------

def test_distributed_keys_do_not_touch_simulated_runs() -> None:
    simulated_cfg = make_config({**BASE, "round_timeout": 30.0})
    dumped = simulated_cfg.model_dump(mode="json")
    assert dumped["engine"] == "simulated"
    assert not {"topology", "round_timeout", "backend"} & set(dumped)  # old run ids and config.json stay valid
    other = make_config({**BASE, "round_timeout": 2.0, "topology": "serverless"})
    assert grid.run_id(simulated_cfg) == grid.run_id(other)
    dist_cfg = make_config({**BASE, "engine": "torchrun", "topology": "serverless"})
    assert dist_cfg.model_dump()["topology"] == "serverless" and grid.run_id(dist_cfg) != grid.run_id(simulated_cfg)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"round_timeout": 0}, "round_timeout"),
        ({"topology": "ring"}, "topology"),
        ({"backend": "mpi"}, "backend"),
        ({"engine": "ray"}, "engine"),
        ({"backend": "nccl", "topology": "server"}, "serverless"),
    ],
)
def test_distributed_config_errors(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_config({**BASE, **change})


def test_simulated_trainer_refuses_a_torchrun_config() -> None:
    with pytest.raises(ConfigError, match="phalanx launch"):
        train(make_config({**BASE, "engine": "torchrun"}))


def test_worker_checks_the_world_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    cfg_path = write_toml(tmp_path / "c.toml", BASE)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert worker.main([str(cfg_path), "--out", str(tmp_path / "o")]) == 2
    assert "WORLD_SIZE=3" in capsys.readouterr().err
    monkeypatch.delenv("RANK")
    assert worker.main([str(cfg_path), "--out", str(tmp_path / "o")]) == 2
    assert "RANK" in capsys.readouterr().err
    grid_path = write_toml(tmp_path / "g.toml", {**BASE, "seed": [1, 2]})
    assert worker.main([str(grid_path)]) == 2
    assert "grid of 2 runs" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# same numbers as the simulated engine
# ---------------------------------------------------------------------------------------------------------------

def test_launch_matches_simulated_with_a_byzantine_rank(tmp_path: Path) -> None:
    """`phalanx launch --workers 4`, parameter server, one Byzantine rank running ALIE on the honest vectors it is
    sent: final θ, momentum, last aggregate, random streams and metric rows equal the simulated engine's."""
    data = {**BASE, "workers": 6}  # --workers 4 overrides it
    cfg_path = write_toml(tmp_path / "job.toml", data)
    out = tmp_path / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "launch", "--workers", "4", str(cfg_path), "--out", str(out),
         "--set", f"round_timeout={HONEST_ROUND_TIMEOUT_S:g}"],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = run_dir(out)
    assert json.loads((d / "config.json").read_text())["engine"] == "torchrun"
    sim = simulated({**data, "workers": 4}, tmp_path / "sim")
    assert_same_run(d, sim, tmp_path / "sim")
    log = dist_log(d)
    assert [r["missing"] for r in log] == [[]] * data["rounds"]
    assert all(r["received"] > 0 and r["sent"] > 0 for r in log)


FED_JOB: dict[str, Any] = {
    **BASE, "algorithm": "fedavg", "workers": 6, "clients_per_round": 3, "byzantine": 3, "f": 1, "local_steps": 3,
    "rounds": 8, "eval_every": 1, "checkpoint_every": 4, "engine": "torchrun", "round_timeout": HONEST_ROUND_TIMEOUT_S,
    "seed": 10,
}
"""Seed 10 samples 2, 1, 3, 2, 2, 0, 1, 2 Byzantine clients in rounds 0–7: rounds with no honest client and with
rank 0's own slot Byzantine are among them."""


@pytest.mark.parametrize("attack", ["alie", "labelflip"])
def test_fedavg_matches_simulated(attack: str, tmp_path: Path) -> None:
    """Federated rounds on the torchrun engine: a process per client slot (3 of 6 clients a round, 3 Byzantine,
    3 local steps). Slot j trains the j-th sampled client; a round's Byzantine slots change, and under ALIE they get
    the attack stream with the honest updates (a round may sample one, two or no Byzantine client — rank 0's own
    slot included). Final θ, every random stream and the metric rows equal the simulated engine's."""
    data = {**FED_JOB, "attack": attack}
    cfg_path = write_toml(tmp_path / "fed.toml", data)
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "launch", str(cfg_path), "--out", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 processes" in proc.stderr
    d = run_dir(tmp_path / "dist")
    sim = simulated(data, tmp_path / "sim")
    assert_same_run(d, sim, tmp_path / "sim")
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    sim_rows = [json.loads(x) for x in (tmp_path / "sim" / "metrics.jsonl").read_text().splitlines()]
    sampled = [r.get("byzantine_sampled") for r in sim_rows]
    assert [r.get("byzantine_sampled") for r in rows] == sampled
    assert {0, 3} <= set(sampled), "the seed no longer samples the rounds this test is about"


@pytest.mark.parametrize("topology", ["server", "serverless"])
def test_adaptive_attack_gets_the_servers_context_on_every_topology(topology: str, tmp_path: Path) -> None:
    """A Byzantine rank running the optimal attack against bucketing + centered clipping calls the rule with the
    server's centre and the server's aggregator stream (sent with the honest vectors, or every rank's own in the
    serverless topology): the run equals the simulated one, random streams included."""
    data = {**BASE, "workers": 5, "aggregator": "bucketing(s=2)>cc", "attack": "optimal",
            "attack_params": {"evaluations": 4}, "topology": topology, "engine": "torchrun",
            "round_timeout": HONEST_ROUND_TIMEOUT_S}
    code, err = run_job(data, tmp_path / "dist", tmp_path)
    assert code == 0, err[-3000:]
    d = run_dir(tmp_path / "dist")
    sim = simulated(data, tmp_path / "sim")
    assert_same_run(d, sim, tmp_path / "sim")
    assert torch.equal(load_file(str(d / "checkpoint.safetensors"))["rng.aggregator"], sim["rng.aggregator"])


def test_serverless_matches_simulated(tmp_path: Path) -> None:
    """Server-free topology (all-gather, every rank aggregates), centered clipping (the previous aggregate as its
    centre) under ALIE: the same run as the simulated engine. Rank 1 stalls (HONEST_STALL_S) in round 4, a loaded
    machine's stall: the serverless run needs every rank, and at the former round_timeout of 5 s it stopped there."""
    data = {**BASE, "workers": 3, "aggregator": "cc", "topology": "serverless", "engine": "torchrun"}
    code, err = run_job(data, tmp_path / "dist", tmp_path, env={"PHALANX_TEST_SLEEP": f"1:4:{HONEST_STALL_S:g}"})
    assert code == 0, err[-3000:]
    sim = simulated(data, tmp_path / "sim")
    assert_same_run(run_dir(tmp_path / "dist"), sim, tmp_path / "sim")


def test_serverless_stops_cleanly_when_a_rank_is_silent(tmp_path: Path) -> None:
    """The server-free topology needs every rank: a rank silent past round_timeout makes the all-gather fail, and
    the run stops with WorkersLostError after rank 0 checkpointed the last finished round. Rank 1 sleeps in round 3
    until the failure is reported; rank 2 stalls (HONEST_STALL_S) in round 1, shorter than round_timeout: a loaded
    machine's stall, which must not stop the run early (it did at the former round_timeout of 1.5 s)."""
    data = {**BASE, "workers": 3, "topology": "serverless", "engine": "torchrun",
            "round_timeout": HONEST_ROUND_TIMEOUT_S, "rounds": 6, "eval_every": 2, "checkpoint_every": 6}
    wake, said = tmp_path / "wake", "round 3: a rank failed or stayed silent longer than round_timeout"
    env = {"PHALANX_TEST_SLEEP": f"2:1:{HONEST_STALL_S:g},1:3:{wake}"}
    code, err = run_job(data, tmp_path / "dist", tmp_path, env=env, script=wake_when((said, wake)))
    assert code == 3, err[-3000:]
    assert f"{said}={HONEST_ROUND_TIMEOUT_S:g} s" in err
    assert "serverless topology needs every rank alive" in err and "Traceback" not in err
    from safetensors import safe_open

    with safe_open(str(run_dir(tmp_path / "dist") / "checkpoint.safetensors"), framework="pt") as fh:
        assert fh.metadata()["round"] == "3"


# ---------------------------------------------------------------------------------------------------------------
# faults (parameter-server topology)
# ---------------------------------------------------------------------------------------------------------------

FAULTS: dict[str, Any] = {
    **BASE, "workers": 3, "byzantine": 0, "attack": "none", "engine": "torchrun", "rounds": 30, "eval_every": 10,
    "checkpoint_every": 5, "round_timeout": HONEST_ROUND_TIMEOUT_S,
}
"""Every fault test asserts which ranks were missing in which round: honest ranks get HONEST_ROUND_TIMEOUT_S, and a
rank meant to be silent sleeps on a file the test creates once the server has declared it missing (:func:`wake_when`).
"""


def test_sleeping_worker_is_left_out_then_rejoins_and_a_sigkilled_one_does_not_stop_training(tmp_path: Path) -> None:
    """n = 4, f = 1. Rank 2 stops answering in round 5: that round is aggregated without it (f − 1 = 0); once it
    wakes it skips ahead and is aggregated again. Then rank 3 is SIGKILLed: training goes on without it to the end.

    Every step waits on an event (test hooks: rank 2 sleeps until a file exists, the server holds before rounds 20
    and 300 until a file exists), so the outcome does not depend on how fast this machine runs the rounds; rank 1
    stalls for HONEST_STALL_S in round 2 (a loaded machine) and is not missing."""
    data = {**FAULTS, "workers": 4, "rounds": 450, "eval_every": 50, "checkpoint_every": 50}
    out = tmp_path / "dist"
    wake, go20, go300 = tmp_path / "wake", tmp_path / "go20", tmp_path / "go300"

    def script(procs: list[subprocess.Popen[bytes]], errs: Path, store: Any) -> None:
        wait_for("holding round 20", errs, procs[0])  # rank 2 was missing from round 5 on, still asleep
        wake.touch()
        while not store.check([wire.key_vector(19, 2)]):  # awake: it skipped to round 19 and sent its vector
            assert procs[2].poll() is None
            time.sleep(0.01)
        go20.touch()  # round 20 waits for rank 2 again (its vector of round 19 arrived)
        wait_for("holding round 300", errs, procs[0])
        assert procs[3].poll() is None
        os.kill(procs[3].pid, signal.SIGKILL)
        procs[3].wait()
        go300.touch()

    env = {"PHALANX_TEST_SLEEP": f"1:2:{HONEST_STALL_S:g},2:5:{wake}", "PHALANX_TEST_HOLD": f"20:{go20},300:{go300}"}
    code, err = run_job(data, out, tmp_path, env=env, script=script)
    assert code == 0, err[-3000:]
    d = run_dir(out)
    assert (d / "DONE").exists()
    log = dist_log(d)
    assert [r["missing"] for r in log[:21]] == [[]] * 5 + [[2]] * 15 + [[]]
    assert "ranks [2] missing; aggregating 3 vectors with f=0" in err and "round 20: every rank is back" in err
    assert all(r["missing"] == [] for r in log if 20 <= r["round"] < 300)
    assert all(r["missing"] == [3] for r in log if r["round"] >= 300)  # aggregated with f − 1 = 0 to the end
    assert "round 300: ranks [3] missing" in err
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["round"] == 450 and rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3


def test_fedavg_slot_missing_is_a_missing_client_and_too_many_stop_the_run(tmp_path: Path) -> None:
    """A client slot silent in round 2 (f = 1): the round is aggregated without the client that slot played, named
    by its client id; with two slots silent in round 5 the run stops with a checkpoint of round 5 that names the
    missing clients (and any client slot 1 played while it was catching up). The silent slots sleep until rank 0 has
    declared them missing; slot 2 stalls (HONEST_STALL_S) in round 1, a loaded machine's stall, and is not missing."""
    data = {**FED_JOB, "attack": "none", "byzantine": 0, "rounds": 8, "checkpoint_every": 1}
    wake2, wake5 = tmp_path / "wake2", tmp_path / "wake5"
    env = {"PHALANX_TEST_SLEEP": f"2:1:{HONEST_STALL_S:g},1:2:{wake2},1:5:{wake5},2:5:{wake5}"}
    script = wake_when(("round 2: clients [", wake2), ("round 5: 2 worker(s) missing", wake5))
    code, err = run_job(data, tmp_path / "dist", tmp_path, env=env, script=script)
    assert code == 3, err[-3000:]
    d = run_dir(tmp_path / "dist")
    sim_rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in sim_rows] == [0, 1, 2, 3, 4, 5]
    log = dist_log(d)
    assert [len(r["missing"]) for r in log[:3]] == [0, 0, 1]  # (then it rejoins once it caught up: timing)
    client = log[2]["missing"][0]  # the second-smallest client sampled in round 2: not a rank number
    assert f"round 2: clients [{client}] missing; aggregating 2 vectors with f=0" in err
    assert "round 5: 2 worker(s) missing (clients " in err and "Traceback" not in err


def test_too_many_missing_stops_with_a_checkpoint_that_resumes(tmp_path: Path) -> None:
    """Ranks 1 and 2 silent in round 7 with f = 1: a clear error naming round_timeout, the round and the ranks,
    a checkpoint of round 7; the same job started again resumes and ends where the simulated engine ends
    (rank 2 is a label-flipping Byzantine rank: a data attack). Ranks 1 and 2 sleep until rank 0 has declared them
    missing; rank 1 stalls (HONEST_STALL_S) in round 2, a loaded machine's stall: not missing, or the resumed run would
    not end where the simulated one ends."""
    data = {**FAULTS, "rounds": 12, "eval_every": 4, "byzantine": 1, "attack": "labelflip"}
    out, wake = tmp_path / "dist", tmp_path / "wake"
    env = {"PHALANX_TEST_SLEEP": f"1:2:{HONEST_STALL_S:g},1:7:{wake},2:7:{wake}"}
    code, err = run_job(data, out, tmp_path, env=env, script=wake_when(("round 7: 2 worker(s) missing", wake)))
    assert code == 3, err[-3000:]
    assert "round 7: 2 worker(s) missing (ranks 1, 2)" in err and f"round_timeout={HONEST_ROUND_TIMEOUT_S:g}" in err
    assert "resume" in err
    d = run_dir(out)
    ckpt = load_file(str(d / "checkpoint.safetensors"))
    from safetensors import safe_open

    with safe_open(str(d / "checkpoint.safetensors"), framework="pt") as fh:
        assert fh.metadata()["round"] == "7"
    assert not (d / "DONE").exists() and ckpt["theta"].numel() > 0
    code, err = run_job(data, out, tmp_path)
    assert code == 0, err[-3000:]
    assert "resuming from the checkpoint of round 7" in err
    sim = simulated(data, tmp_path / "sim")
    assert_same_run(d, sim, tmp_path / "sim")


@pytest.mark.parametrize("case", ["server-fedavg", "serverless"])
def test_a_stateful_rule_keeps_its_history_on_every_topology(case: str, tmp_path: Path) -> None:
    """FoolsGold's per-client history on the torchrun engine: rank 0's server (federated client slots, a new sample
    of clients every round; ALIE's ranks get the history with the honest vectors) or every rank's own copy
    (serverless): the run, its checkpointed history included, equals the simulated one. Three ALIE clients send
    identical rows, whose cosine similarity of 1 is a tie: before the tie rule (phalanx.aggregators.foolsgold.
    similarities) each engine's last bits broke it and θ differed by 10 % on an AVX-512 machine (commit b2841d0);
    seed 10 samples rounds whose participants are all Byzantine twins."""
    if case == "server-fedavg":
        data = {**FED_JOB, "aggregator": "foolsgold", "attack": "alie"}
    else:
        data = {**BASE, "workers": 3, "aggregator": "foolsgold", "topology": "serverless", "engine": "torchrun"}
    code, err = run_job(data, tmp_path / "dist", tmp_path)
    assert code == 0, err[-3000:]
    d = run_dir(tmp_path / "dist")
    sim = simulated(data, tmp_path / "sim")
    assert_same_run(d, sim, tmp_path / "sim")
    got = load_file(str(d / "checkpoint.safetensors"))["rule.history"]
    torch.testing.assert_close(got, sim["rule.history"], atol=1e-5, rtol=1e-4)
    if case == "server-fedavg":  # the Byzantine client was sampled, so ALIE's rank was handed the honest vectors
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        assert any(r.get("byzantine_sampled", 0) >= 1 for r in rows)


@pytest.mark.parametrize("topology", ["server", "serverless"])
def test_client_level_dp_on_torchrun_is_the_simulated_run(topology: str, tmp_path: Path) -> None:
    """Differential privacy at every rank with ``dp_noise_source = "seed"`` asked for (docs/privacy.md; torchrun's
    default is secret noise, tests/test_privacy_source.py): each rank draws the round's whole noise matrix from the
    ``dp`` stream and keeps its own row — the same run as the simulated engine, the dp stream's state included."""
    pytest.importorskip("dp_accounting")
    data = {**BASE, "topology": topology, "engine": "torchrun", "dp_noise": 0.5, "dp_clip": 1.0,
            "dp_noise_source": "seed"}
    code, err = run_job(data, tmp_path / "dist", tmp_path)
    assert code == 0, err[-3000:]
    sim = simulated(data, tmp_path / "sim")
    assert "rng.dp" in sim
    assert_same_run(run_dir(tmp_path / "dist"), sim, tmp_path / "sim")


def test_client_level_dp_on_torchrun_draws_secret_noise_by_default(tmp_path: Path) -> None:
    """Unset ``dp_noise_source`` on torchrun is secret noise (docs/privacy.md): rank 0 says in one line that the run
    is not bit-for-bit resumable, no checkpoint holds a ``dp`` stream, and the model is not the seed-noise run's."""
    pytest.importorskip("dp_accounting")
    data = {**BASE, "topology": "server", "engine": "torchrun", "dp_noise": 0.5, "dp_clip": 1.0, "rounds": 5}
    code, err = run_job(data, tmp_path / "dist", tmp_path)
    assert code == 0, err[-3000:]
    assert err.count("not bit-for-bit resumable") == 1
    got = load_file(str(run_dir(tmp_path / "dist") / "checkpoint.safetensors"))
    sim = simulated(data, tmp_path / "sim")
    assert "rng.dp" in sim and "rng.dp" not in got and set(got) == set(sim) - {"rng.dp"}
    assert float((got["theta"] - sim["theta"]).abs().max()) > 1e-2
