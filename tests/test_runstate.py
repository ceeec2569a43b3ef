"""The run directory's lock (one process per run), the FAILED marker, and a run's state as `phalanx status` shows it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _interrupt import train_interrupted
from phalanx import cli
from phalanx.errors import ConfigError
from phalanx.experiments import runner, runstate, status, store
from phalanx.experiments.config import make_config
from phalanx.experiments.train import train

SMALL = {"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 12, "eval_every": 4, "batch_size": 4,
         "checkpoint_every": 4}


def test_a_second_process_on_the_same_run_is_refused(tmp_path: Path) -> None:
    cfg = make_config(SMALL)
    run = tmp_path / "run"
    with runstate.locked(run):
        assert runstate.holder(run) == {"pid": os.getpid(), "host": socket.gethostname(), "slurm_job": None,
                                        "since": runstate.holder(run)["since"]}  # type: ignore[index]
        assert runstate.state(run).status == "running"
        with pytest.raises(runstate.RunInUse, match=f"in use by process {os.getpid()} on {socket.gethostname()}"):
            train(cfg, run)
        assert not (run / "config.json").exists()  # refused before it touched anything
    assert runstate.holder(run) is None
    train(cfg, run)
    assert runstate.state(run).status == "done"


def test_the_cli_refuses_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = make_config(SMALL)
    from phalanx.experiments.grid import run_id

    (tmp_path / "c.toml").write_text("\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in SMALL.items()))
    with runstate.locked(out / run_id(cfg)):
        proc = subprocess.run([sys.executable, "-m", "phalanx.cli", "run", str(tmp_path / "c.toml"), "--out", str(out)],
                              capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("error: ") and f"in use by process {os.getpid()}" in lines[-1], proc.stdout
    assert "--wait" in lines[-1] and "Traceback" not in proc.stdout + proc.stderr


def test_wait_waits_for_the_holder(tmp_path: Path) -> None:
    cfg = make_config(SMALL)
    run = tmp_path / "run"
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with runstate.locked(run):
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    result: list[object] = []
    waiter = threading.Thread(target=lambda: result.append(train(cfg, run, wait=True)))
    waiter.start()
    release.set()
    holder.join()
    waiter.join()
    assert result and store.is_finished(run)


def _held_elsewhere(run: Path, release: threading.Event) -> threading.Thread:
    """The run's lock held by a thread of this process (its own open file, as another process would) until
    ``release``."""
    held = threading.Event()

    def hold() -> None:
        with runstate.locked(run):
            held.set()
            release.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(60)
    return thread


def test_a_ctrl_c_ends_a_wait_for_the_lock(tmp_path: Path) -> None:
    """A SIGINT left pending once the wait has begun (``_thread.interrupt_main``: the state a signal leaves when it
    lands just before a blocking ``flock``, which then waits for the holder): the wait ends with
    ``KeyboardInterrupt`` within a slice of :mod:`phalanx.waits`. A blocking ``flock`` (the code before) ended only
    when the holder let go, here a watchdog 30 s later."""
    import signal

    from _pending_sigint import in_run_lock, interrupt_once_in

    run, release = tmp_path / "run", threading.Event()
    holder = _held_elsewhere(run, release)
    watchdog = threading.Timer(30.0, release.set)
    backstop = threading.Timer(120.0, release.set)  # (whatever happens, the holder lets go: the test never hangs)
    backstop.start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = None
    try:
        with pytest.raises(KeyboardInterrupt):
            watcher = interrupt_once_in(in_run_lock, before=watchdog.start)
            with runstate.locked(run, wait=True):
                pass
        assert not release.is_set(), "the wait for the lock held the Ctrl-C until the holder let go"
    finally:
        if watcher is not None:
            watcher.join()
        watchdog.cancel()
        backstop.cancel()
        release.set()
        signal.signal(signal.SIGINT, previous)
        holder.join(60)
    with runstate.locked(run):  # (the lock is free again: the interrupted wait took nothing)
        pass


def test_a_grid_lock_held_for_ever_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who can open ``OUT/.grid.lock`` (a co-user of a shared folder) can hold it: recording a grid waits
    :data:`~phalanx.experiments.status.GRID_LOCK_TIMEOUT_S` (here 0.5 s), then fails in one line naming the file. The
    code before waited for the holder (here released after 30 s, after which this test fails)."""
    import fcntl

    from phalanx.errors import OutputError

    monkeypatch.setattr(status, "GRID_LOCK_TIMEOUT_S", 0.5)
    out = tmp_path / "out"
    out.mkdir()
    status.record_grid(out, [out / "a"], "local")
    fd = os.open(out / ".grid.lock", os.O_RDONLY)  # (read access is enough to hold a flock)
    fcntl.flock(fd, fcntl.LOCK_EX)
    timer = threading.Timer(30.0, lambda: os.close(fd))
    timer.start()
    try:
        with pytest.raises(OutputError, match=r"\.grid\.lock was held by other processes for 0\.5 s"):
            status.record_grid(out, [out / "b"], "local")
    finally:
        if timer.is_alive():
            timer.cancel()
            os.close(fd)
    status.record_grid(out, [out / "b"], "local")
    assert status.read_grid(out)["runs"] == ["a", "b"]


def test_failed_marker_written_and_cleared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(SMALL)
    run = train_interrupted(cfg, tmp_path / "run", 4)
    assert runstate.state(run).status == "stopped" and runstate.state(run).round == 4
    ckpt = run / "checkpoint.safetensors"
    good = ckpt.read_bytes()
    ckpt.write_bytes(good[:100])  # damaged: the resume fails
    with pytest.raises(Exception, match=r"checkpoint\.safetensors"):
        train(cfg, run)
    st = runstate.state(run)
    assert st.status == "failed" and st.detail.startswith("IntegrityError: ")
    fail = runstate.failure(run)
    assert fail is not None and fail["pid"] == os.getpid()
    ckpt.write_bytes(good)
    train(cfg, run)  # repaired: the run resumes, and the marker goes
    assert runstate.failure(run) is None and runstate.state(run).status == "done"


def test_a_busy_run_does_not_stop_the_grid(tmp_path: Path) -> None:
    cfgs = [make_config({**SMALL, "seed": s}) for s in range(2)]
    out = tmp_path / "out"
    from phalanx.experiments.grid import run_id

    busy = out / run_id(cfgs[0])
    with runstate.locked(busy), pytest.raises(runner.GridFailed, match="1 in use by another process"):
        runner.run_grid(cfgs, out)
    assert runstate.state(out / run_id(cfgs[1])).status == "done"
    assert runstate.state(busy).status == "pending"
    assert [r.status for r in status.grid_status(out)] == ["pending", "done"]


def test_status_command(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfgs = [make_config({**SMALL, "seed": s}) for s in range(2)]
    runner.run_grid(cfgs[:1], out)
    from phalanx.experiments.grid import run_id

    train_interrupted(cfgs[1], out / run_id(cfgs[1]), 8)
    status.record_grid(out, [out / run_id(c) for c in cfgs] + [out / "not-started"], "local")
    res = CliRunner().invoke(cli.app, ["status", str(out)])
    assert res.exit_code == 0, res.output
    assert "1 done, 1 stopped, 1 pending" in res.output and "8/12" in res.output
    res = CliRunner().invoke(cli.app, ["status", str(tmp_path / "nowhere")])
    assert res.exit_code != 0 and isinstance(res.exception, ConfigError)


def test_resume_removes_what_killed_writes_left(tmp_path: Path) -> None:
    cfg = make_config(SMALL)
    run = train_interrupted(cfg, tmp_path / "run", 4)
    stale = [run / ".checkpoint.k2j4x9a1.tmp", run / ".metrics.jsonl.q8w1e2r3.tmp"]
    for p in stale:
        p.write_bytes(b"half a write")
    train(cfg, run)
    assert not any(p.exists() for p in stale) and not list(run.glob(".*.tmp"))
    assert runstate.state(run).status == "done"
