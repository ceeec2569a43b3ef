"""The Slurm executor of a grid: one Slurm job array per grid, submitted with ``submitit``.

Each array task trains ``runs_per_task`` runs of the grid one after the other, each into its own run directory on the
shared file system, exactly as a local run does (lock, checkpoints, ``FAILED`` marker, ``DONE``). The run directories
are the whole truth, so the grid resumes however its array ended: submitting the same grid again skips finished runs,
resumes stopped and failed ones from their checkpoints, and leaves alone the runs another job is training (their
directories are locked). A task that reaches its time limit is requeued by ``submitit`` (``max_requeues`` times) and
its runs resume from their checkpoints; a cancelled task (``scancel``) stops its run at once (SIGTERM: the run keeps
its last checkpoint).

The command that submitted the array waits for it (``detach = false``): it follows the runs' rounds on the shared
file system (a progress bar), and once the array has left the queue it reports the runs that did not finish — failed
(with their error), or cancelled / timed out / killed (with the task's log). Ctrl-C only stops the watching: the
array goes on (``phalanx status OUT`` follows it, ``scancel JOB`` stops it). With ``detach = true`` the command
returns once the array is submitted.

Slurm settings (``[slurm]`` table of a grid config, ``--slurm KEY=VALUE`` on the command line, or the dedicated flags):
see :class:`SlurmOptions`.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError, OutputError, PhalanxError
from phalanx.experiments import runstate, signals, status
from phalanx.experiments.config import RunConfig, ValidRun, validate
from phalanx.experiments.executor import Hooks, Outcome, dataset_for
from phalanx.experiments.private_folder import private_folder
from phalanx.training.divergence import Diverged
from phalanx.validate import check_int, check_real

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time(value: Any) -> int:
    """A Slurm time limit as whole minutes: an integer number of minutes, or one of Slurm's forms ``MM``,
    ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    if isinstance(value, bool):
        raise ConfigError("slurm.time", value, "minutes, or HH:MM:SS / D-HH:MM:SS")
    if isinstance(value, int):
        return check_int("slurm.time", value, low=1)
    m = _TIME.match(str(value).strip())
    if m is None:
        raise ConfigError("slurm.time", value, "minutes, or HH:MM:SS / D-HH:MM:SS (Slurm's time formats)")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        parts += [0] * (3 - len(parts))
        seconds = int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 3:  # HH:MM:SS
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 2:  # MM:SS
        seconds = parts[0] * 60 + parts[1]
    else:  # MM
        seconds = parts[0] * 60
    if seconds < 1:
        raise ConfigError("slurm.time", value, "a positive time limit")
    return math.ceil(seconds / 60)


@dataclass(frozen=True)
class SlurmOptions:
    """Where and how the array runs.

    ``partition``, ``account``, ``qos``, ``constraint``: as ``sbatch`` takes them (the cluster's defaults when
    unset). ``time``: each task's time limit (minutes or ``HH:MM:SS``). ``cpus_per_task``: cores per task (the
    runs' torch threads); ``gpus_per_task``: GPUs per task (``sbatch --gpus-per-task``; none by default) — give the
    runs ``device = "auto"`` or ``"cuda"`` to train on them (docs/cluster.md, GPUs); ``mem_gb``: memory per task.
    ``runs_per_task``: runs trained one after the other by one array task (fewer, longer tasks for grids of short
    runs). ``array_parallelism``: tasks running at once.
    ``max_requeues``: times a task that reaches its time limit is requeued (its runs resume from their checkpoints).
    ``setup``: shell lines run before each task (``module load …``, activating the environment). ``python``: the
    interpreter on the nodes (default: this one — the same environment on a shared file system). ``sbatch``: any
    other ``sbatch`` option, ``{"exclude": "node3"}``. ``folder``: the tasks' logs and submitit's files (default
    ``OUT/slurm``; it must be a folder only you can write, in directories only you can change: the nodes unpickle
    what it holds, :mod:`phalanx.experiments.private_folder`). ``poll_seconds``: how often the waiting command
    looks at the run directories and the queue.
    ``detach``: return once submitted.
    """

    partition: str | None = None
    time: int = 60
    cpus_per_task: int = 2
    gpus_per_task: int | None = None
    mem_gb: float | None = None
    runs_per_task: int = 1
    array_parallelism: int = 256
    max_requeues: int = 3
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    setup: tuple[str, ...] = ()
    python: str | None = None
    sbatch: Mapping[str, Any] = field(default_factory=dict)
    folder: str | None = None
    poll_seconds: float = 5.0
    detach: bool = False

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SlurmOptions:
        """Validated options from a ``[slurm]`` table (or flags): unknown keys and values out of range are a
        :class:`ConfigError` naming ``slurm.<key>``."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ConfigError(f"slurm.{key}", values[key], "a Slurm setting: " + ", ".join(sorted(known)))
        v = {k: x for k, x in values.items() if x is not None}
        out: dict[str, Any] = {}
        for key in ("partition", "account", "qos", "constraint", "python", "folder"):
            if key in v:
                if not isinstance(v[key], str) or not v[key].strip():
                    raise ConfigError(f"slurm.{key}", v[key], "a non-empty string")
                out[key] = v[key].strip()
        if "time" in v:
            out["time"] = parse_time(v["time"])
        for key, low in (("cpus_per_task", 1), ("gpus_per_task", 1), ("runs_per_task", 1), ("array_parallelism", 1),
                         ("max_requeues", 0)):
            if key in v:
                out[key] = check_int(f"slurm.{key}", v[key], low=low)
        if "mem_gb" in v:
            out["mem_gb"] = check_real("slurm.mem_gb", v["mem_gb"], low=0.0, low_open=True)
        if "poll_seconds" in v:
            out["poll_seconds"] = check_real("slurm.poll_seconds", v["poll_seconds"], low=0.0, low_open=True)
        if "detach" in v:
            if not isinstance(v["detach"], bool):
                raise ConfigError("slurm.detach", v["detach"], "true or false")
            out["detach"] = v["detach"]
        if "setup" in v:
            lines = [v["setup"]] if isinstance(v["setup"], str) else v["setup"]
            if not isinstance(lines, list | tuple) or not all(isinstance(x, str) for x in lines):
                raise ConfigError("slurm.setup", v["setup"], "shell lines (a string or a list of strings)")
            out["setup"] = tuple(lines)
        if "sbatch" in v:
            if not isinstance(v["sbatch"], Mapping) or not all(isinstance(k, str) for k in v["sbatch"]):
                raise ConfigError("slurm.sbatch", v["sbatch"], 'a table of sbatch options, e.g. {exclude = "node3"}')
            out["sbatch"] = dict(v["sbatch"])
        return cls(**out)

    def submitit_parameters(self, job_name: str) -> dict[str, Any]:
        """The parameters of ``submitit.SlurmExecutor.update_parameters``."""
        params: dict[str, Any] = {
            "job_name": job_name, "time": self.time, "cpus_per_task": self.cpus_per_task, "ntasks_per_node": 1,
            "array_parallelism": self.array_parallelism, "signal_delay_s": 120, "setup": list(self.setup),
        }
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(self, key) is not None:
                params[key] = getattr(self, key)
        if self.gpus_per_task is not None:
            params["gpus_per_task"] = self.gpus_per_task
        if self.mem_gb is not None:
            params["mem"] = f"{max(1, math.ceil(self.mem_gb * 1024))}M"
        if self.sbatch:
            params["additional_parameters"] = dict(self.sbatch)
        return params


class SlurmUnavailableError(PhalanxError, RuntimeError):
    """The Slurm executor cannot submit from here: ``submitit`` is not installed, or ``sbatch`` is not on the PATH."""


def _submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise SlurmUnavailableError(
            "--executor slurm needs the optional dependency submitit: pip install 'phalanx[slurm]'"
        ) from None
    return submitit


def chunks(todo: list[tuple[RunConfig, Path]], size: int) -> list[list[tuple[RunConfig, Path]]]:
    """The runs of each array task: ``size`` consecutive runs of the grid per task."""
    return [todo[i:i + size] for i in range(0, len(todo), size)]


def run_task(runs: list[tuple[dict[str, Any], str]], threads: int) -> dict[str, str]:
    """One array task (on a node): train each run into its directory, one after the other; return how each ended.

    A run that fails leaves its ``FAILED`` marker and the task goes on with the next; a run another process holds
    is left to it. SIGTERM (``scancel``, the end of the allocation) stops the run in progress at once, keeping its
    last checkpoint, and ends the task.
    """
    import torch

    from phalanx.experiments.train import train

    torch.set_num_threads(max(1, threads))
    ended: dict[str, str] = {}
    try:
        with signals.stop_on_signals():
            for cfg_json, run_dir in runs:
                run = validate(cfg_json)
                try:
                    train(run, run_dir, dataset=dataset_for(run.specs.data))
                except Diverged as exc:
                    ended[run_dir] = f"diverged at round {exc.round}"
                except runstate.RunInUse as exc:
                    ended[run_dir] = f"busy: {exc}"
                except Exception as exc:
                    ended[run_dir] = f"failed: {type(exc).__name__}: {exc}"
                else:
                    ended[run_dir] = "done"
    except signals.StopRequested as stop:
        print(f"[phalanx] stopped by signal {stop.signum}: the run in progress keeps its last checkpoint",
              file=sys.stderr, flush=True)
    return ended


def _task_callable(submitit: Any) -> Any:
    """``run_task`` as a submitit ``Checkpointable``: a task about to reach its time limit is requeued with the same
    runs (finished ones are skipped when it starts again, the others resume from their checkpoints)."""

    class GridTask(submitit.helpers.Checkpointable):
        def __call__(self, runs: list[tuple[dict[str, Any], str]], threads: int) -> dict[str, str]:
            return run_task(runs, threads)

    return GridTask()


def queued_tasks(job_ids: list[str]) -> dict[str, str] | None:
    """The tasks of ``job_ids`` (array job ids) still in Slurm's queue: ``{"JOB_TASK": state}``; ``None`` when the
    queue cannot be read (no ``squeue``, controller down)."""
    if not job_ids:
        return {}
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    proc = subprocess.run([squeue, "-h", "-r", "-j", ",".join(job_ids), "-o", "%i %T"], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:  # every job has left the queue and its record is gone
            return {}
        return None
    tasks = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            tasks[parts[0]] = parts[1]
    return tasks


def queued_runs(out: Path) -> dict[str, str] | None:
    """The runs of ``out`` whose Slurm task is still in the queue, with the task and its state (``"1234_5
    PENDING"``), from the jobs ``grid.json`` records; ``None`` when the queue cannot be read."""
    jobs = status.read_grid(out)["slurm_jobs"]
    if not jobs:
        return {}
    tasks = queued_tasks(sorted({str(j["job"]) for j in jobs}))
    if tasks is None:
        return None
    runs: dict[str, str] = {}
    for j in jobs:
        for i, names in enumerate(j.get("runs", [])):
            task = f"{j['job']}_{i}"
            if task in tasks:
                runs.update({name: f"{task} {tasks[task]}" for name in names})
    return runs


@dataclass
class SlurmExecutor:
    """Run a grid as one Slurm job array (see the module's docstring)."""

    options: SlurmOptions = field(default_factory=SlurmOptions)
    name: str = "slurm"
    interrupted_detail: str | None = None
    job_id: str | None = None
    folder: Path = field(default=Path("slurm"), repr=False)  # the array's log folder, once submitted

    def run(self, runs: list[tuple[ValidRun, Path]], out: Path, hooks: Hooks) -> Outcome:
        outcome = Outcome()
        todo = [(r.cfg, d) for r, d in runs]  # the nodes validate each config they read (the objects stay here)
        busy = [(c, d) for c, d in todo if runstate.holder(d) is not None]  # a job of an earlier submission
        for c, d in busy:
            outcome.busy[d] = f"in use by {runstate.describe_holder(runstate.holder(d) or {})}"
            hooks.done(c, "in use by another process")
        todo = [(c, d) for c, d in todo if (c, d) not in busy]
        if not todo:
            return outcome
        submitit = _submitit()
        if shutil.which("sbatch") is None:
            raise SlurmUnavailableError("--executor slurm: sbatch is not on the PATH (run on a Slurm login node)")
        folder = self.folder = private_folder("slurm.folder", Path(self.options.folder) if self.options.folder
                                              else out / "slurm")
        ex = submitit.SlurmExecutor(folder=str(folder / "%j"), max_num_timeout=self.options.max_requeues,
                                    python=self.options.python)
        ex.update_parameters(**self.options.submitit_parameters(f"phalanx-{out.name}"[:64]))
        groups = chunks(todo, self.options.runs_per_task)
        args = [[(c.model_dump(mode="json"), str(d)) for c, d in g] for g in groups]
        jobs = ex.map_array(_task_callable(submitit), args, [self.options.cpus_per_task] * len(args))
        self.job_id = str(jobs[0].job_id).split("_")[0]
        follow = f"`phalanx status {out}` follows it, `scancel {self.job_id}` stops it"
        print(f"submitted Slurm job array {self.job_id}: {len(groups)} task(s), {len(todo)} run(s); logs in "
              f"{folder}; {follow}", flush=True)
        try:  # (after the submission: an error here must not read as "run the command again", which submits twice)
            status.record_slurm_job(out, self.job_id, [[d.name for _, d in g] for g in groups], str(folder))
        except OutputError as exc:
            print(f"[phalanx] warning: Slurm job array {self.job_id} was submitted and runs, but {out / status.GRID} "
                  f"does not list it ({exc}); `squeue -j {self.job_id}` follows it", file=sys.stderr, flush=True)
        if self.options.detach:
            outcome.submitted = {d: self.job_id for _, d in todo}
            return outcome
        self.interrupted_detail = f"stopped watching; the Slurm job array {self.job_id} goes on: {follow}"
        with signals.recording(hooks.stopped):
            self._watch(todo, groups, hooks, outcome)
        return outcome

    def _watch(self, todo: list[tuple[RunConfig, Path]], groups: list[list[tuple[RunConfig, Path]]], hooks: Hooks,
               outcome: Outcome) -> None:
        """Follow the runs until the array has left the queue (or a signal arrives); then sort out the runs that
        did not finish."""
        assert self.job_id is not None
        reported: dict[Path, int] = {}
        final: set[Path] = set()
        unreadable_since: float | None = None
        while not hooks.stopped:
            for c, d in todo:
                if d in final:
                    continue
                t = runstate.last_round(d)
                if t is not None and t != reported.get(d):
                    reported[d] = t
                    hooks.round(c, t)
                if runstate.is_final(d):
                    final.add(d)
                    hooks.done(c, runstate.state(d).status)
            tasks = queued_tasks([self.job_id])
            if tasks is None:  # the controller does not answer: try again, give up after 10 minutes
                unreadable_since = unreadable_since or time.monotonic()
                if time.monotonic() - unreadable_since > 600:
                    raise SlurmUnavailableError(f"squeue has not answered for 10 minutes; the Slurm job array "
                                                f"{self.job_id} may go on: `phalanx status` follows it")
            else:
                unreadable_since = None
                if not tasks:
                    break
            _sleep(self.options.poll_seconds, hooks.stopped)
        if hooks.stopped:
            return
        for i, group in enumerate(groups):
            for c, d in group:
                if runstate.is_final(d):
                    if d not in final:
                        hooks.done(c, runstate.state(d).status)
                    continue
                fail = runstate.failure(d)
                if fail is not None:
                    outcome.failed[d] = f"{fail.get('error')}: {fail.get('message')}"
                    hooks.done(c, "failed")
                else:
                    log = self.folder / f"{self.job_id}_{i}"
                    outcome.unfinished[d] = (f"its Slurm task {self.job_id}_{i} ended before the run did (cancelled, "
                                             f"out of time or killed; log: {log})")
                    hooks.done(c, "not finished")


def _sleep(seconds: float, stopped: list[int]) -> None:
    """Sleep ``seconds``, waking early once a signal is recorded in ``stopped`` (a signal interrupts the sleep)."""
    end = time.monotonic() + seconds
    while not stopped and (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.2))


def slurm_environment() -> dict[str, str]:
    """The Slurm variables of this process (empty outside Slurm), for the run's manifest."""
    return {k: v for k, v in os.environ.items() if k in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
                                                         "SLURM_JOB_PARTITION", "SLURM_NODELIST")}
