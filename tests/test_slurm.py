"""``--executor slurm`` against a real single-node Slurm cluster (tests/_slurm.py): a grid submitted as a job array,
one task cancelled mid-run with ``scancel``, the grid re-submitted — and the results equal a local run of the same
grid. Skipped, with the reason, where Slurm cannot start (not root, packages missing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import _slurm
from phalanx.errors import ConfigError
from phalanx.executor_cli import ExecutorChoice
from phalanx.experiments import runstate, slurm, status, store
from phalanx.experiments.slurm import SlurmOptions, parse_time

pytest.importorskip("submitit")

# The rule of the grid: the median, except that the first process to reach its call HOLD_CALL claims the file
# <HOLD_DIR>/held (O_EXCL: exactly one run of the grid) and waits there forever — the test cancels that run's task at
# a point it chose (after its round-5 checkpoint), an event, not a race with the machine's speed.
HOLD_RULE = """
import os
import time

CALLS = [0]


class HoldOnce:
    def __init__(self, f=0):
        self.f = f

    def __call__(self, x):
        CALLS[0] += 1
        if CALLS[0] == int(os.environ["HOLD_CALL"]):
            try:
                fd = os.open(os.path.join(os.environ["HOLD_DIR"], "held"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                while True:
                    time.sleep(0.5)
        return x.median(dim=0).values
"""

GRID = """
dataset = "digits"
model = "logreg"
workers = 4
batch_size = 4
rounds = 12
eval_every = 2
checkpoint_every = 5
aggregator = "holdrule:HoldOnce"
seed = [0, 1, 2]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_slurm.Cluster]:
    try:
        c = _slurm.start(tmp_path_factory.mktemp("slurm"))
    except _slurm.Unavailable as exc:
        pytest.skip(f"no Slurm here: {exc}")
    yield c
    c.stop()


def _wait(what: str, ready: object, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _sweep(cluster: _slurm.Cluster, root: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**cluster.env, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "HOLD_DIR": str(root), "HOLD_CALL": "8"}
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", "sweep", str(root / "grid.toml"), "--out", str(out), "--executor",
         "slurm", "--cpus-per-task", "1", "--slurm", "poll_seconds=0.3", "--time", "10", *extra],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _rows(run_dir: Path) -> list[dict[str, object]]:
    return store.finished_rows(run_dir)


def test_grid_survives_a_cancelled_task_and_resubmission(cluster: _slurm.Cluster, tmp_path: Path) -> None:
    (tmp_path / "holdrule.py").write_text(HOLD_RULE)
    (tmp_path / "grid.toml").write_text(GRID)
    out = tmp_path / "slurm-out"

    first = _sweep(cluster, tmp_path, out)
    _wait("a run to hold", (tmp_path / "held").exists)
    held_pid = int((tmp_path / "held").read_text())
    runs = [out / name for name in status.read_grid(out)["runs"]]
    assert len(runs) == 3
    holders = {d: runstate.holder(d) for d in runs}
    held = next(d for d, h in holders.items() if h and h.get("pid") == held_pid)
    task = holders[held]["slurm_job"]  # type: ignore[index]
    assert task and "_" in task  # an array task: JOB_TASK
    assert runstate.state(held).status == "running" and runstate.last_round(held) == 4
    cluster.run("scancel", task)
    text, _ = first.communicate(timeout=300)
    assert first.returncode == 2, text
    assert "1 of 3 runs did not finish: 1 not finished" in text and f"Slurm task {task}" in text, text
    st = runstate.state(held)
    assert st.status == "stopped" and st.round == 4  # keeps its round-5 checkpoint (metrics up to round 4)
    assert (held / "checkpoint.safetensors").exists()
    assert sorted(r.status for r in status.grid_status(out)) == ["done", "done", "stopped"]

    second = _sweep(cluster, tmp_path, out)
    text, _ = second.communicate(timeout=300)
    assert second.returncode == 0, text
    assert all(runstate.state(d).status == "done" for d in runs)
    assert len(status.read_grid(out)["slurm_jobs"]) == 2  # the re-submission ran only the cancelled run
    assert status.read_grid(out)["slurm_jobs"][1]["runs"] == [[held.name]]

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "HOLD_DIR": str(tmp_path), "HOLD_CALL": "8"}
    local = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "sweep", str(tmp_path / "grid.toml"), "--out", str(tmp_path / "local"),
         "--jobs", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
    )
    assert local.returncode == 0, local.stdout + local.stderr
    for d in runs:
        assert _rows(d) == _rows(tmp_path / "local" / d.name)

    listing = subprocess.run([sys.executable, "-m", "phalanx.cli", "status", str(out), "--all"], env=cluster.env,
                             capture_output=True, text=True)
    assert listing.returncode == 0 and "3 done" in listing.stdout


def test_detach_returns_once_submitted(
    cluster: _slurm.Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])  # squeue, from this process
    (tmp_path / "holdrule.py").write_text(HOLD_RULE)
    (tmp_path / "grid.toml").write_text(GRID.replace("seed = [0, 1, 2]", "seed = [0, 1]"))
    out = tmp_path / "out"
    (tmp_path / "held").write_text("0")  # claimed already: no run holds, they go through
    proc = _sweep(cluster, tmp_path, out, "--detach")
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, text
    assert "2 run(s) submitted" in text and f"phalanx status {out}" in text
    job = status.read_grid(out)["slurm_jobs"][0]["job"]

    def gone() -> bool:
        tasks = slurm.queued_tasks([job])
        return tasks == {}

    _wait("the array to leave the queue", gone)
    assert sorted(r.status for r in status.grid_status(out)) == ["done", "done"]


def test_ctrl_c_stops_watching_not_the_array(
    cluster: _slurm.Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    (tmp_path / "holdrule.py").write_text(HOLD_RULE)
    (tmp_path / "grid.toml").write_text(GRID.replace("seed = [0, 1, 2]", "seed = 0"))
    out = tmp_path / "out"
    proc = _sweep(cluster, tmp_path, out)
    _wait("the run to hold", (tmp_path / "held").exists)  # submitted, and the run will not end by itself
    job = status.read_grid(out)["slurm_jobs"][0]["job"]
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, text
    assert f"stopped watching; the Slurm job array {job} goes on" in text and "Traceback" not in text
    assert slurm.queued_tasks([job])  # still there
    cluster.run("scancel", job)
    _wait("the array to leave the queue", lambda: slurm.queued_tasks([job]) == {})
    assert [r.status for r in status.grid_status(out)] == ["stopped"]


def test_options_are_validated() -> None:
    assert parse_time("1:30:00") == 90 and parse_time("2-00") == 2880 and parse_time(15) == 15
    assert parse_time("0:30") == 1  # 30 seconds: Slurm counts whole minutes
    for bad in ("soon", "1:2:3:4", 0, True):
        with pytest.raises(ConfigError, match=r"slurm\.time"):
            parse_time(bad)
    opts = SlurmOptions.from_mapping({"partition": "gpu", "time": "4:00:00", "runs_per_task": 10, "mem_gb": 8,
                                      "sbatch": {"exclude": "node3"}, "setup": "module load cuda"})
    params = opts.submitit_parameters("phalanx-x")
    assert params["partition"] == "gpu" and params["time"] == 240 and params["mem"] == "8192M"
    assert params["additional_parameters"] == {"exclude": "node3"} and params["setup"] == ["module load cuda"]
    with pytest.raises(ConfigError, match=r"slurm\.partiton"):
        SlurmOptions.from_mapping({"partiton": "gpu"})
    with pytest.raises(ConfigError, match=r"slurm\.runs_per_task"):
        SlurmOptions.from_mapping({"runs_per_task": 0})
    with pytest.raises(ConfigError, match="only apply to --executor slurm"):
        ExecutorChoice(partition="gpu").make(1)
    choice = ExecutorChoice(executor="slurm", slurm=("account=lab",), runs_per_task=3)
    executor = choice.make(1, {"partition": "cpu", "runs_per_task": 1})
    assert executor.options.partition == "cpu" and executor.options.account == "lab"
    assert executor.options.runs_per_task == 3  # the flag wins over the table


def test_grid_json_and_chunks(tmp_path: Path) -> None:
    status.record_grid(tmp_path, [tmp_path / "a", tmp_path / "b"], "local")
    status.record_grid(tmp_path, [tmp_path / "b", tmp_path / "c"], "slurm")
    grid = json.loads((tmp_path / status.GRID).read_text())
    assert grid["runs"] == ["a", "b", "c"] and grid["executor"] == "slurm"
    assert [r.status for r in status.grid_status(tmp_path)] == ["pending"] * 3
    todo = [(None, Path(str(i))) for i in range(5)]
    assert [len(c) for c in slurm.chunks(todo, 2)] == [2, 2, 1]  # type: ignore[arg-type]
