"""What a user sees when something around a run goes wrong: one line that names the file or key and says what to do,
a meaningful exit status, never a traceback.

Damaged run-directory files (metrics, checkpoint, config) in directories without digests or used with ``--force``;
config files in another encoding; ``--out`` that is a file or read-only; a read-only results directory; a full disk;
a 200-element aggregator chain; Ctrl-C / SIGTERM on a parallel sweep and on ``tension paper``; an ``epsilon`` size
that cannot fit in memory. Process tests wait on events (a file a holding rule writes), never on time.
"""

from __future__ import annotations

import errno
import gc
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from _interrupt import train_interrupted
from _processes import HOLD, _alive, _children
from phalanx.errors import ConfigError, OutputError
from phalanx.experiments import grid, load_toml, make_config, store, train
from phalanx.experiments.config import RunConfig

SMALL: dict[str, Any] = {
    "dataset": "digits", "model": "logreg", "workers": 5, "byzantine": 1, "f": 1, "aggregator": "cwtm",
    "attack": "signflip", "rounds": 8, "batch_size": 8, "lr": 0.1, "eval_every": 4, "checkpoint_every": 4, "seed": 2,
}


def _toml(values: dict[str, Any]) -> str:
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def _as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _cli(*args: str, env: dict[str, str] | None = None, unprivileged: bool = False,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``phalanx ARGS`` in a subprocess. ``unprivileged``: without the capabilities that let root ignore file
    permissions (dropped with setpriv), so that a read-only directory is read-only for it too."""
    cmd = [sys.executable, "-m", "phalanx.cli", *args]
    if unprivileged and _as_root():
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: file permissions cannot be made to apply")
        cmd = [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "100", **(env or {})})


def _one_line(proc: subprocess.CompletedProcess[str], *needles: str, status: int = 2, prefix: str = "error:") -> str:
    """The process exited with ``status`` and printed exactly one line starting with ``prefix``, holding every one
    of ``needles``, and no traceback; that line."""
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    assert proc.returncode == status, text
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, text
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _old_format(d: Path) -> Path:
    """Make ``d`` a run directory as written before digests were recorded (no ``integrity`` in its manifest)."""
    manifest = json.loads((d / "manifest.json").read_text())
    manifest.pop("integrity", None)
    manifest.pop("artifacts", None)
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run (copied by the tests that damage it)."""
    d = tmp_path_factory.mktemp("finished") / "run"
    train(make_config(SMALL), d)
    return d


@pytest.fixture(scope="module")
def partial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped after its round-4 checkpoint (copied by the tests that damage it)."""
    return train_interrupted(make_config(SMALL), tmp_path_factory.mktemp("partial") / "run", 4)


@pytest.fixture(scope="module")
def reference() -> list[dict[str, Any]]:
    """The rows of the run, uninterrupted."""
    return train(make_config(SMALL))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- damaged metrics.jsonl ---------------------------------------------------------------------------------------

GARBAGE = {
    "cut-short": lambda text: text[: len(text) - 20],
    "binary": lambda text: text + "\x00\x01garbage\n",
    "not-a-row": lambda text: text + "[1, 2, 3]\n",
    "no-accuracy": lambda text: text + '{"round": 9}\n',
}


@pytest.mark.parametrize("damage", sorted(GARBAGE))
def test_report_on_damaged_metrics_is_one_line(damage: str, finished: Path, tmp_path: Path) -> None:
    """``phalanx report`` over an old-format directory whose metrics.jsonl is cut short or garbage: one line naming
    the file; with --force on a directory that records digests, the same."""
    sweep = tmp_path / "sweep"
    d = _old_format(_copy(finished, sweep / "run"))
    metrics = d / "metrics.jsonl"
    metrics.write_text(GARBAGE[damage](metrics.read_text()))
    _one_line(_cli("report", str(sweep)), str(metrics), "delete")
    forced = _copy(finished, tmp_path / "forced" / "run")
    (forced / "metrics.jsonl").write_text(GARBAGE[damage]((forced / "metrics.jsonl").read_text()))
    _one_line(_cli("report", str(tmp_path / "forced"), "--force"), "metrics.jsonl", "delete")


def test_resume_with_damaged_metrics_is_a_config_error(partial: Path, tmp_path: Path) -> None:
    d = _old_format(_copy(partial, tmp_path / "run"))
    text = (d / "metrics.jsonl").read_text()
    (d / "metrics.jsonl").write_text(text[:-7])
    with pytest.raises(ConfigError, match=r"metrics\.jsonl.*cut short"):
        train(make_config(SMALL), d)
    (d / "metrics.jsonl").write_text(text.splitlines(keepends=True)[0])  # a whole row lost: fewer than checkpointed
    with pytest.raises(ConfigError, match=r"metrics\.jsonl.*rows are missing"):
        train(make_config(SMALL), d)


# --- damaged checkpoint ------------------------------------------------------------------------------------------

def _damage_checkpoint(ckpt: Path, damage: str) -> None:
    raw = ckpt.read_bytes()
    if damage == "truncated":
        ckpt.write_bytes(raw[: len(raw) // 2])
    elif damage == "empty":
        ckpt.write_bytes(b"")
    elif damage == "header":
        ckpt.write_bytes(b"\xff" * 8 + raw[8:])
    elif damage in ("theta-shape", "momentum-shape"):
        tensors = load_file(str(ckpt))
        name = damage.split("-")[0]
        t = tensors[name]
        tensors[name] = torch.zeros(*t.shape[:-1], t.shape[-1] + 3, dtype=t.dtype)
        save_file(tensors, str(ckpt), metadata={"round": "4", "rows": "2"})
    elif damage == "no-round":
        save_file(load_file(str(ckpt)), str(ckpt), metadata={"rows": "2"})
    else:  # pragma: no cover
        raise AssertionError(damage)


CHECKPOINT_DAMAGE = ["truncated", "empty", "header", "theta-shape", "momentum-shape", "no-round"]


@pytest.mark.parametrize("damage", CHECKPOINT_DAMAGE)
def test_a_damaged_checkpoint_is_a_config_error_without_digests_or_forced(
    damage: str, partial: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = _old_format(_copy(partial, tmp_path / "old"))
    _damage_checkpoint(old / "checkpoint.safetensors", damage)
    with pytest.raises(ConfigError, match=r"checkpoint\.safetensors") as err:
        train(make_config(SMALL), old)
    assert "\n" not in str(err.value) and f"delete {old}" in str(err.value)
    forced = _copy(partial, tmp_path / "forced")
    _damage_checkpoint(forced / "checkpoint.safetensors", damage)
    monkeypatch.setenv("PHALANX_FORCE", "1")
    with pytest.raises(ConfigError, match=r"checkpoint\.safetensors"):
        train(make_config(SMALL), forced)


def _out_with(partial: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A config file and an --out holding its run, stopped at round 4: (config, out, run directory)."""
    cfg = tmp_path / "run.toml"
    cfg.write_text(_toml(SMALL))
    out = tmp_path / "out"
    d = _copy(partial, out / grid.run_id(make_config(SMALL)))
    return cfg, out, d


def test_run_resuming_a_truncated_checkpoint_prints_one_line(partial: Path, tmp_path: Path) -> None:
    cfg, out, d = _out_with(partial, tmp_path)
    _old_format(d)
    _damage_checkpoint(d / "checkpoint.safetensors", "truncated")
    _one_line(_cli("run", str(cfg), "--out", str(out)), str(d / "checkpoint.safetensors"), "truncated",
              f"delete {d}")


def test_garbage_config_json_in_a_run_directory_prints_one_line(partial: Path, tmp_path: Path) -> None:
    cfg, out, d = _out_with(partial, tmp_path)
    _old_format(d)
    (d / "config.json").write_bytes(b"\x89PNG garbage {")
    _one_line(_cli("run", str(cfg), "--out", str(out)), str(d / "config.json"), "not JSON", f"delete {d}")


# --- config files ------------------------------------------------------------------------------------------------

def test_a_bom_prefixed_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + _toml(SMALL).encode())
    assert load_toml(path) == SMALL


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_a_config_in_another_encoding_prints_one_line(encoding: str, tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_bytes((_toml(SMALL) + 'attack_params = {note = "café"}\n').encode(encoding))
    line = _one_line(_cli("run", str(path), "--out", str(tmp_path / "out")), str(path), "UTF-8", "save it as UTF-8")
    assert ("UTF-16" in line) == (encoding == "utf-16")
    assert not (tmp_path / "out").exists()


# --- output directories ------------------------------------------------------------------------------------------

def test_out_naming_a_file_prints_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(_toml(SMALL))
    blocker = tmp_path / "results.txt"
    blocker.write_text("not a directory\n")
    _one_line(_cli("run", str(cfg), "--out", str(blocker)), f"cannot write {blocker}", "is a file", "--out")
    _one_line(_cli("run", str(cfg), "--out", str(blocker / "sub")), f"{blocker} is a file", "--out")
    assert blocker.read_text() == "not a directory\n"


def test_a_read_only_out_prints_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(_toml(SMALL))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        proc = _cli("run", str(cfg), "--out", str(locked / "runs"), unprivileged=True)
        _one_line(proc, f"cannot write {locked / 'runs'}: permission denied", "writable")
        proc = _cli("run", str(cfg), "--out", str(locked), unprivileged=True)
        _one_line(proc, f"cannot write {locked}", "permission denied")
    finally:
        locked.chmod(0o755)


def test_report_on_a_read_only_directory_prints_one_line(finished: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _copy(finished, sweep / "run")
    sweep.chmod(0o555)
    try:
        proc = _cli("report", str(sweep), unprivileged=True)
        _one_line(proc, f"cannot write {sweep}", "permission denied", f"make {sweep} writable")
    finally:
        sweep.chmod(0o755)
    assert not any(p.name.endswith(".tmp") for p in sweep.iterdir())


# --- a full disk -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call", range(1, 10))
def test_a_full_disk_keeps_the_last_checkpoint(
    call: int, partial: Path, reference: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resumed run (rounds 5-8) hits ENOSPC at its ``call``-th fsync — of the metrics, the manifest, the
    checkpoint, the final files: an OutputError naming the file, no temporary file left, a checkpoint that loads,
    and the same command afterwards ends as the uninterrupted run."""
    d = _copy(partial, tmp_path / "run")
    real, calls = os.fsync, [0]

    def fsync(fd: int) -> None:
        calls[0] += 1
        if calls[0] == call:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OutputError, match="no space left on device") as err:
        train(make_config(SMALL), d)
    monkeypatch.undo()
    assert err.value.path.startswith(str(d)) and "\n" not in str(err.value) and "free some space" in str(err.value)
    assert not [p.name for p in d.iterdir() if p.name.endswith(".tmp")]
    snap = store.load_checkpoint(d)
    assert snap is not None and snap.state.round in (4, 8)
    assert train(make_config(SMALL), d) == reference
    store.verify(d, ("config.json", "metrics.jsonl", "checkpoint.safetensors", "metrics.parquet", "DONE"))


def test_a_real_full_file_system_under_the_checkpoint_writer_is_one_line(partial: Path, tmp_path: Path) -> None:
    """A real full file system (a small tmpfs, where this machine may mount one): the resumed run's checkpoint does
    not fit, the kernel refuses the write with ENOSPC inside safetensors' writer — which reports it as text — and
    the run ends with the one-line OutputError, not its traceback; the last good checkpoint stays."""
    small = tmp_path / "small"
    small.mkdir()
    size = 4 * sum(f.stat().st_size for f in partial.rglob("*") if f.is_file()) + (1 << 16)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(small)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root and mount rights)")
    try:
        d = _copy(partial, small / "run")
        checkpoint = (d / "checkpoint.safetensors").stat().st_size
        with open(small / "filler", "wb") as fh:  # leave room for the metrics, not for another checkpoint
            while True:
                st = os.statvfs(small)
                free = st.f_bavail * st.f_frsize
                if free <= checkpoint // 2:
                    break
                try:
                    fh.write(b"\0" * min(1 << 14, free - checkpoint // 2))
                    fh.flush()
                except OSError:
                    break
        with pytest.raises(OutputError, match="no space left on device") as err:
            train(make_config(SMALL), d)
        assert "\n" not in str(err.value) and "free some space" in str(err.value)
        snap = store.load_checkpoint(d)
        assert snap is not None and snap.state.round == 4
        del err, snap  # the loaded checkpoint's tensors map its file: the file system stays busy while they live
    finally:
        gc.collect()
        if subprocess.run(["umount", str(small)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(small)], capture_output=True, check=False)


def test_a_checkpoint_the_writer_left_incomplete_is_not_installed(
    partial: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A checkpoint writer that drops a failed write (as a buffered writer on a full disk does) leaves a short file:
    it is refused before it replaces the last good checkpoint."""
    d = _copy(partial, tmp_path / "run")
    real = store.save_file

    def short(tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str]) -> None:
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as fh:
            fh.truncate(os.path.getsize(filename) // 2)

    monkeypatch.setattr(store, "save_file", short)
    with pytest.raises(OutputError, match="not written completely"):
        train(make_config(SMALL), d)
    monkeypatch.undo()
    assert not [p.name for p in d.iterdir() if p.name.endswith(".tmp")]
    snap = store.load_checkpoint(d)
    assert snap is not None and snap.state.round == 4


# --- long aggregator chains --------------------------------------------------------------------------------------

def _chain_config(length: int, **extra: Any) -> RunConfig:
    spec = ">".join(["clip"] * (length - 1) + ["cwtm"])
    return make_config({**SMALL, "aggregator": spec, **extra})


def test_run_ids_stay_short_and_unique_and_short_ones_do_not_change() -> None:
    long = [_chain_config(200, seed=s) for s in (1, 2)] + [_chain_config(199, seed=1)]
    ids = [grid.run_id(c) for c in long]
    assert all(len(i) <= grid.RUN_ID_MAX for i in ids) and len(set(ids)) == 3
    assert ids[0].startswith("clip-clip-") and "_signflip_f1_b1_s1_" in ids[0]
    # names that fit are as they always were (run directories written before keep resuming)
    assert grid.run_id(make_config(SMALL)) == "cwtm_signflip_f1_b1_s2_" + _digest(make_config(SMALL))
    twelve = _chain_config(12)  # 88 characters: not cut
    assert grid.run_id(twelve) == "-".join(["clip"] * 11 + ["cwtm"]) + "_signflip_f1_b1_s2_" + _digest(twelve)


def _digest(cfg: RunConfig) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(cfg.identity(), sort_keys=True).encode()).hexdigest()[:10]


def test_a_200_element_chain_runs(tmp_path: Path) -> None:
    cfg = tmp_path / "chain.toml"
    values = {**SMALL, "aggregator": ">".join(["clip"] * 199 + ["cwtm"]), "rounds": 2, "eval_every": 2,
              "checkpoint_every": 2}
    cfg.write_text(_toml(values))
    proc = _cli("run", str(cfg), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert len(run.name) <= grid.RUN_ID_MAX and (run / "DONE").exists()


# --- phalanx epsilon sizes ---------------------------------------------------------------------------------------

def test_epsilon_refuses_a_size_that_cannot_fit() -> None:
    _one_line(_cli("epsilon", "krum", "-n", "10000000"), "n=10000000", "n <=", "GB", "available", "smaller n")


def test_epsilon_memory_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx import aggregators

    eps = importlib.import_module("phalanx.analysis.epsilon")  # the package's `epsilon` is the function

    krum = aggregators.make("krum", f=3)
    with pytest.raises(ConfigError, match=r"n=100000 .*n <= \d+ .*400\.0 GB.*16\.0 GB") as err:
        eps.check_memory(krum, 100_000, 8, available=16 * 10**9)
    limit = int(str(err.value).split("n <= ")[1].split()[0])
    eps.check_memory(krum, limit, 8, available=16 * 10**9)  # the limit it names fits
    with pytest.raises(ConfigError):
        eps.check_memory(krum, limit + 1, 8, available=16 * 10**9)
    eps.check_memory(aggregators.make("cwtm", f=3), 100_000, 8, available=16 * 10**9)  # no (n, n) matrix
    eps.check_memory(aggregators.make("nnm>cwtm", f=3), 1000, 8, available=16 * 10**9)
    with pytest.raises(ConfigError, match="nnm>cwtm"):
        eps.check_memory(aggregators.make("nnm>cwtm", f=3), 100_000, 8, available=16 * 10**9)
    with pytest.raises(ConfigError, match=r"^d=10000000000 "):
        eps.check_memory(aggregators.make("cwtm", f=3), 16, 10**10, available=16 * 10**9)
    monkeypatch.setattr(eps, "available_memory", lambda: 10**9)
    with pytest.raises(ConfigError, match=r"^n="):
        eps.epsilon(krum, 100_000)
    assert eps.epsilon(krum, 16, trials=4, budget=100).value >= 0  # small sizes measure as before


# --- Ctrl-C / SIGTERM --------------------------------------------------------------------------------------------

SWEEP = """
dataset = "digits"
model = "logreg"
workers = 6
byzantine = 1
f = 1
aggregator = ["cwmed", "holdrule:HoldingMedian", "geomed"]
attack = "signflip"
rounds = 20
batch_size = 8
eval_every = 5
checkpoint_every = 5
seed = 1
"""


LOOP_HOLD = """
import os
import time

from phalanx.training import loop

CALLS = [0]
_step = loop.Loop.step


def step(self):
    \"\"\"Loop.step; with HOLD_AT=<call>:<dir>, its call number <call> (of this process) writes <dir>/holding and
    waits, forever: the test signals the command there.\"\"\"
    CALLS[0] += 1
    spec = os.environ.get("HOLD_AT")
    if spec and CALLS[0] == int(spec.split(":")[0]):
        open(os.path.join(spec.split(":", 1)[1], "holding"), "w").close()
        while True:
            time.sleep(1)
    return _step(self)


loop.Loop.step = step
"""




def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``phalanx ARGS`` in a session of its own (so that a signal to its process group is what a terminal's Ctrl-C
    sends: to the command and every process it started)."""
    return subprocess.Popen([sys.executable, "-m", "phalanx.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "COLUMNS": "120", **env})


def _wait_for(flag: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 300
    while not flag.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "the command never reached the hold"
        time.sleep(0.05)


def _all_end(pids: set[int]) -> None:
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids):
        left = [(p, Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:200]) for p in pids if _alive(p)]
        assert time.monotonic() < deadline, f"still running after the command ended: {left}"
        time.sleep(0.05)


def _results(out: Path) -> dict[str, list[tuple[int, float]]]:
    res = {}
    for run in sorted(p for p in out.iterdir() if p.is_dir()):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        res[run.name] = [(r["round"], r["test_accuracy"]) for r in rows]
    return res


@pytest.fixture()
def holdrule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    (tmp_path / "holdrule.py").write_text(HOLD)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def sweep_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[int, float]]]:
    """The results of the sweep, uninterrupted, in-process."""
    from phalanx.experiments import runner

    root = tmp_path_factory.mktemp("sweep-ref")
    (root / "holdrule.py").write_text(HOLD)
    (root / "sweep.toml").write_text(SWEEP)
    sys.path.insert(0, str(root))
    try:
        runner.run_grid(grid.configs(load_toml(root / "sweep.toml")), root / "ref")
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("holdrule", None)
    return _results(root / "ref")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
@pytest.mark.parametrize(("jobs", "sig"), [(2, signal.SIGINT), (1, signal.SIGTERM)],
                         ids=["ctrl-c-jobs2", "sigterm-jobs1"])
def test_a_signalled_sweep_stops_cleanly_and_resumes(
    jobs: int, sig: signal.Signals, holdrule: dict[str, str], sweep_reference: dict[str, list[tuple[int, float]]],
    tmp_path: Path,
) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) on `sweep --jobs 2`, or SIGTERM (to the
    sweep alone, as `kill PID` sends it) on `sweep --jobs 1`, while a run holds in its 3rd aggregation: exit status
    130 / 143, one line with the count of finished runs and how to resume, no traceback, no process left; the same
    command then ends with the results of an uninterrupted sweep."""
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(SWEEP)
    out = tmp_path / "out"
    args = ["sweep", str(cfg), "--out", str(out), "--jobs", str(jobs)]
    proc = _start(args, {**holdrule, "HOLD_AT": f"3:{tmp_path}"})
    _wait_for(tmp_path / "holding", proc)
    started = _children(proc.pid)
    if jobs > 1:
        assert len(started) >= 3  # the two workers and the progress queue's manager
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    text = proc.communicate(timeout=300)[0]
    done = len(list(out.glob("*/DONE")))
    _one_line(subprocess.CompletedProcess(args, proc.returncode, text, ""),
              f"{done} of 3 runs finished", "run the same command again to resume", status=128 + sig,
              prefix=f"interrupted by {sig.name}")
    assert done < 3
    _all_end(started)
    assert not list(out.rglob("*.tmp"))
    again = _cli(*args, env=holdrule)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _results(out) == sweep_reference


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_sigterm_on_tension_paper_stops_cleanly(tmp_path: Path) -> None:
    """SIGTERM to `phalanx tension paper` (to its process only, as `kill PID` sends it) while a worker holds in a
    round: exit status 143, one line, no traceback, no process left."""
    (tmp_path / "hold").mkdir()
    (tmp_path / "hold" / "sitecustomize.py").write_text(LOOP_HOLD)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "hold"), os.environ.get("PYTHONPATH", "")]),
           "HOLD_AT": f"3:{tmp_path}"}
    args = ["tension", "paper", "--out", str(tmp_path / "paper"), "--seeds", "2", "--jobs", "2",
            "--set", "dataset=digits", "--set", "workers=4", "--set", "rounds=10", "--set", "eval_every=5",
            "--set", "lrs=[0.1]", "--set", "alphas=[1.0]"]
    proc = _start(args, env)
    _wait_for(tmp_path / "holding", proc)
    started = _children(proc.pid)
    assert len(started) >= 3
    proc.send_signal(signal.SIGTERM)
    text = proc.communicate(timeout=300)[0]
    _one_line(subprocess.CompletedProcess(args, proc.returncode, text, ""), "runs finished",
              "run the same command again to resume", status=143, prefix="interrupted by SIGTERM")
    _all_end(started)
    assert not list((tmp_path / "paper").rglob("*.tmp"))
