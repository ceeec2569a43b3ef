"""Training from the command line: ``phalanx run``, ``phalanx sweep``, ``phalanx report``, ``phalanx status`` —
a grid's progress, its estimate before it starts, its summary and trade-off tables."""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from phalanx.cli.common import _STDERR, app, console
from phalanx.cli.grid_tables import grid_tables, print_report
from phalanx.cli.output import FormatOption, Tabular, check_format, emit, emit_all
from phalanx.distributed import cli as distributed_cli
from phalanx.errors import ConfigError
from phalanx.executor_cli import ExecutorChoice, executor_options

if TYPE_CHECKING:

    from phalanx.experiments.config import RunConfig, ValidRun


def _load_grid(config: Path | None, overrides: list[str]) -> dict[str, object]:
    from phalanx.experiments.config import load_grid

    return load_grid(config, overrides)


def _check_out(out: Path) -> None:
    """``--out`` must be (or become) a directory: an :class:`OutputError` before anything runs if it, or a folder
    above it, is an existing file."""
    from phalanx.errors import OutputError

    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise OutputError(str(out), f"{blocker} is a file, not a directory", "choose another --out, or move that "
                          "file away")


def _stdout_is_terminal() -> bool:
    """Whether the console writes to a terminal (a TTY), whatever ``FORCE_COLOR`` says: only there may a progress
    bar redraw itself."""
    try:
        return bool(console.file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _LogProgress:
    """Progress of a grid as plain lines, for a log (stdout not a terminal: a batch job, a pipe): never a
    carriage-return redraw. A line when a run ends (``[12:00:05] done: cwtm / alie (RUN): 37/120 rounds (30 %), 2/4
    runs done, ETA 0:02:10``), and between those a progress line every ``every_s`` seconds or every ``step`` of
    the grid's rounds, whichever comes first (none while no round was trained since the last line); runs skipped as
    already ended are counted in one line.

    The ETA extrapolates the rounds trained by this command (not those found done: skipped runs, the rounds before a
    resumed run's checkpoint; nor those a failed or diverged run left) over the rounds left. ``clock`` gives seconds
    (monotonic), ``echo`` prints a line."""

    def __init__(self, runs: dict[str, int], *, every_s: float = 60.0, step: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, echo: Callable[[str], None] = typer.echo) -> None:
        self.rounds = runs  # run id → its rounds (distinct runs)
        self.total = max(1, sum(runs.values()))
        self.every_s, self.step, self.clock, self.echo = every_s, step, clock, echo
        self.done: dict[str, int] = {}
        self.ended: set[str] = set()
        self.before = 0  # rounds done before this command: not part of the rate
        self.skipped: dict[str, int] = {}
        self.start = self.last_time = clock()
        self.last_rounds = 0
        self.next_mark = step * self.total

    def _completed(self) -> int:
        return sum(self.done.values())

    def _state(self) -> str:
        done = self._completed()
        pct = int(100 * done / self.total)
        text = f"{done}/{self.total} rounds ({pct} %), {len(self.ended)}/{len(self.rounds)} runs done"
        elapsed = self.clock() - self.start
        if done >= self.total:
            return text + f", in {_duration(elapsed)}"
        return text + f", ETA {_eta(elapsed, done, self.total, self.before)}"

    def _line(self, text: str) -> None:
        self.echo(f"[{time.strftime('%H:%M:%S')}] {text}")
        done = self._completed()
        self.last_time, self.last_rounds = self.clock(), done
        while self.next_mark <= done:
            self.next_mark += self.step * self.total

    def _flush_skipped(self) -> None:
        if self.skipped:
            parts = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            self.skipped = {}
            self._line(f"skipped, already ended: {parts}; {self._state()}")

    def round(self, key: str, t: int) -> None:
        if key in self.ended:
            return
        if key not in self.done:  # the first round this command trains: the rounds before it were done earlier
            self.before += max(0, t - 1)
        self.done[key] = max(t, self.done.get(key, 0))
        self._flush_skipped()
        done = self._completed()
        if done >= self.total:  # the last run's own line follows
            return
        if done > self.last_rounds and (done >= self.next_mark or self.clock() - self.last_time >= self.every_s):
            self._line(self._state())

    def run_ended(self, key: str, label: str, status: str) -> None:
        if key in self.ended:
            return
        if status != "done":  # skipped, failed, diverged, busy: its rounds left were not trained here
            self.before += self.rounds[key] - self.done.get(key, 0)
        self.done[key] = self.rounds[key]
        self.ended.add(key)
        if status.startswith("skipped"):
            why = status.removeprefix("skipped").strip(" ()") or "skipped"
            self.skipped[why] = self.skipped.get(why, 0) + 1
            return
        self._flush_skipped()
        self._line(f"{status}: {label} ({key}): {self._state()}")

    def close(self) -> None:
        self._flush_skipped()


ETA_AFTER = 0.1
"""The share of its rounds a command trains before its progress gives an ETA ("—" until then)."""


def _eta(elapsed: float, done: int, total: int, before: int) -> str:
    """The time left, extrapolated from the rounds this command trained (``done − before``: not the rounds found
    done — skipped runs, the rounds before a resumed run's checkpoint — which would make a resumed grid look fast),
    or "—" until it trained :data:`ETA_AFTER` of the rounds it has to train: a run's first rounds pay one-time costs
    (kernels' first calls, first batches; 15 s and 8 s against a steady 1.5 s for step 2 of docs/start.md), and an
    ETA from them alone said 37:05:24 on the first line (issue 38; ``tests/test_reports.py``)."""
    trained = done - before
    if trained <= 0 or elapsed <= 0 or trained < ETA_AFTER * (total - before):
        return "—"
    return _duration(elapsed / trained * max(0, total - done))


def _trained_eta() -> Any:
    """A progress-bar column: :func:`_eta` from the task's elapsed time and its ``before`` field (the rounds found
    done), instead of rich's own estimate, which counts a resumed run's jump as speed (rich imported here, late)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class TrainedETA(ProgressColumn):
        def render(self, task: Any) -> Text:
            before = int(task.fields.get("before", 0))
            return Text(f"ETA {_eta(task.elapsed or 0.0, int(task.completed), int(task.total or 0), before)}")

    return TrainedETA()


def _duration(seconds: float) -> str:
    """Seconds as H:MM:SS."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _short(cfg: RunConfig) -> str:
    """A run's name on a progress line: its rule and attack (and, for a decentralized run, its algorithm, graph and
    number of nodes)."""
    from phalanx.experiments.config import DECENTRALIZED

    where = f" ({cfg.algorithm}, {cfg.graph}, n={cfg.workers})" if cfg.algorithm in DECENTRALIZED else ""
    return f"{cfg.aggregator} / {cfg.attack}{where}"


def _calibration_round(threads: int) -> float:
    """Seconds a round of the default job (its ``cwtm`` run, no attack, seed 0) takes here at ``threads`` threads
    (:func:`phalanx.experiments.estimate.time_rounds`: nothing written, the random state restored)."""
    import torch

    from phalanx.experiments import estimate, grid
    from phalanx.experiments.config import load_grid

    run = grid.runs(load_grid(None, ["aggregator=cwtm", "attack=none", "seed=0"]))[0]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return estimate.time_rounds(run, rounds=CALIBRATION_ROUNDS)[0]
    finally:
        torch.set_num_threads(before)


CALIBRATION_ROUNDS = 5
"""Rounds of the default job timed per thread count (after one warm-up round) the first time a machine runs."""


def _choose_threads(executor: Any, jobs: int, threads: int | None, *, err: bool) -> None:
    """Give the local executor its runs' thread count (:func:`phalanx.experiments.threads.choose`) and say it in one
    line: ``--threads``, ``PHALANX_THREADS``, cores / jobs, or the count measured fastest on this machine (once,
    stored)."""
    from phalanx.experiments.threads import choose

    say = _STDERR if err else console
    note = functools.partial(say.print, soft_wrap=True, highlight=False, markup=False)
    picked = choose(jobs=jobs, override=threads, measure=_calibration_round, say=note)
    executor.threads = picked.threads
    note(picked.line())


THREADS_HELP = ("Intra-op threads per run (default: PHALANX_THREADS, else cores / --jobs, else for one process the "
                "count measured fastest on this machine, once). Results depend on it.")


def _train(
    points: Sequence[RunConfig | ValidRun], out: Path, jobs: int, executor: ExecutorChoice | None = None,
    slurm_table: dict[str, Any] | None = None, *, plain: bool = False, threads: int | None = None,
    choose_threads: bool = False, smaller: str | None = None,
) -> None:
    """Run validated runs (configs are validated here, once) into ``out`` (finished runs skipped) under a rich
    progress bar with ETA, on the executor the command line chose (``slurm_table``: the grid config's ``[slurm]``
    settings). When stdout is not a terminal (a batch job's log, a pipe) the progress is plain lines instead
    (:class:`_LogProgress`); with ``plain`` (a table format asked for: stdout holds the tables alone) plain lines on
    stderr.

    The first SIGINT (Ctrl-C) or SIGTERM stops the grid cleanly (:class:`~phalanx.experiments.runner.Interrupted`:
    one line, exit status 130 or 143); the same command, started again, resumes.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from phalanx.experiments import runner
    from phalanx.experiments.config import ValidRun, validate

    runs = [p if isinstance(p, ValidRun) else validate(p) for p in points]
    ids = {id(r.cfg): r.run_id for r in runs}  # the hooks receive each run's config: its id, not hashed again
    _check_out(out)
    choice = executor or ExecutorChoice()
    chosen = choice.make(jobs, slurm_table)  # Slurm settings validated before anything runs
    if choose_threads and choice.executor == "local":  # phalanx run / sweep (a study keeps its own counts)
        _choose_threads(chosen, jobs, threads, err=plain)
    announce = None if choice.executor == "slurm" else functools.partial(
        _announce, jobs=jobs, err=plain, threads=_run_threads(chosen, jobs, len(runs)), smaller=smaller)

    if plain or not _stdout_is_terminal():
        echo = functools.partial(typer.echo, err=True) if plain else typer.echo
        log = _LogProgress({r.run_id: r.cfg.rounds for r in runs}, echo=echo)
        try:
            with runner.stop_on_signals():
                runner.run_grid(
                    runs, out, executor=chosen, on_round=lambda cfg, t, rounds: log.round(ids[id(cfg)], t),
                    on_done=lambda cfg, status: log.run_ended(ids[id(cfg)], _short(cfg), status), before=announce,
                )
        finally:
            log.close()
        return

    total = sum(r.cfg.rounds for r in runs)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} rounds"),
               TimeElapsedColumn(), _trained_eta())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("training", total=total, before=0)
        offsets: dict[str, int] = {}
        before = [0]  # rounds found done (skipped runs, the rounds before a resumed checkpoint): not this speed

        def on_round(cfg: RunConfig, t: int, rounds: int) -> None:
            key = ids[id(cfg)]
            if key not in offsets:  # the first round this command trains: the ones before it were done earlier
                before[0] += max(0, t - 1)
            bar.advance(task, t - offsets.get(key, 0))
            offsets[key] = t
            bar.update(task, description=_short(cfg), before=before[0])

        def on_done(cfg: RunConfig, status: str) -> None:
            key = ids[id(cfg)]
            if status != "done":  # skipped, failed, diverged: its rounds left were not trained here
                before[0] += cfg.rounds - offsets.get(key, 0)
            bar.advance(task, cfg.rounds - offsets.get(key, 0))
            offsets[key] = cfg.rounds
            bar.update(task, before=before[0])

        with runner.stop_on_signals():
            runner.run_grid(runs, out, executor=chosen, on_round=on_round, on_done=on_done, before=announce)


BUDGET_ENV = "PHALANX_BUDGET_MINUTES"
"""The environment variable that sets how long a grid may be estimated to take before the command says so first."""
DEFAULT_BUDGET_MINUTES = 5.0


GRID_SMALLER = ("fewer seeds or list values, fewer rounds (--set rounds=…), or more processes (--jobs); Ctrl-C stops "
                "it cleanly and the same command resumes.")
"""How to make a grid of ``phalanx run`` or ``sweep`` smaller, said with its estimate over the budget (a grid has
no preset; a study's own advice is :func:`study_smaller`)."""


def smaller_preset(preset: str, smallest: str | None) -> str:
    """``, a smaller preset (--preset SMALLEST)`` — only when the study has one (``smallest``) and the command is not
    already running it (issue 38: ``--preset quick`` was suggested to a command running ``quick``); else ``""``."""
    return f", a smaller preset (--preset {smallest})" if smallest is not None and smallest != preset else ""


def study_smaller(preset: str, smallest: str | None) -> str:
    """How to make a study (``phalanx experiment NAME``, ``tension paper``) smaller: fewer seeds, fewer rounds, more
    processes — and a smaller preset where :func:`smaller_preset` has one."""
    return (f"fewer seeds (--seeds …), fewer rounds (--set rounds=…){smaller_preset(preset, smallest)}, or more "
            "processes (--jobs); Ctrl-C stops it cleanly and the same command resumes.")


def _budget() -> float | None:
    """The budget in minutes (``PHALANX_BUDGET_MINUTES``, default 5), or None for ``off`` (no estimate at all: the
    test suite's many small grids); anything else is a :class:`ConfigError` naming the variable."""
    raw = os.environ.get(BUDGET_ENV, "")
    if raw == "off":
        return None
    try:
        budget = float(raw) if raw else DEFAULT_BUDGET_MINUTES
    except ValueError:
        raise ConfigError(BUDGET_ENV, raw, "a number of minutes, e.g. 30, or off") from None
    if not math.isfinite(budget) or budget <= 0:
        raise ConfigError(BUDGET_ENV, raw, "a number of minutes > 0")
    return budget


def _forewarn(what: str, timing: str, guess: Callable[[], Any], smaller: str, *, err: bool) -> None:
    """The line every grid and study prints before its first run, its estimate against the budget
    (:func:`_budget`): first that ``timing`` (what the probe times) is under way — under load that is minutes — then
    ``guess()`` (an estimate with ``seconds`` and ``text()``, or None: none made), within the budget or, when over,
    with ``smaller`` (how to make it smaller). ``what`` is ``grid`` or ``study``. It stops nothing (a script's long
    run is no mistake)."""
    budget = _budget()
    if budget is None:
        return
    say = _STDERR if err else console
    say.print(f"[dim]Timing {timing} to estimate the {what} ({BUDGET_ENV}=off skips this)…[/dim]", soft_wrap=True,
              highlight=False)
    est = guess()
    if est is None:
        return
    text = est.text()
    if not hasattr(est, "load"):  # a study's or a measurement's estimate: the load now, as a grid's names its own
        from phalanx.experiments.estimate import at_load, load_now  # (torch is loaded: the guess above needed it)

        text += at_load(load_now())
    if est.seconds <= 60 * budget:  # said too: "Timing …" with no estimate after it read as lost (a first-hour review)
        say.print(f"[dim]This {what} should take {text}, within the {budget:g} min budget.[/dim]", soft_wrap=True,
                  highlight=False)
        return
    say.print(f"[yellow]This {what} should take {text}[/yellow] — over the {budget:g} min budget "
              f"({BUDGET_ENV}). To make it smaller: {smaller}", soft_wrap=True, highlight=False)


def _run_threads(executor: Any, jobs: int, runs: int) -> int | None:
    """The intra-op threads each run of a local grid trains with (:class:`phalanx.experiments.local.LocalExecutor`):
    the executor's count, else ``cores // jobs`` in worker processes, else (one process) None: this process's."""
    threads = getattr(executor, "threads", None)
    if threads is not None:
        return int(threads)
    return max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 and runs > 1 else None


def _announce(todo: list[tuple[ValidRun, Path]], *, jobs: int, err: bool, threads: int | None = None,
              smaller: str | None = None) -> None:
    """Before the first run: when the grid's estimate (:func:`phalanx.experiments.estimate.estimate`, its probe at
    ``threads``, the runs' own count) is over the budget, one line saying so and how to make it smaller
    (``smaller``, default :data:`GRID_SMALLER`; :func:`_forewarn`). Ctrl-C stops the grid cleanly, and the same
    command resumes."""
    from phalanx.experiments import estimate

    budget = _budget()  # a bad budget is its one-line error even with nothing to do
    if budget is None or not todo:
        return
    _forewarn("grid", "a few rounds of the first run", lambda: estimate.estimate(todo, jobs, _short, threads=threads),
              smaller or GRID_SMALLER, err=err)


def _devices(runs: list[ValidRun], executor: ExecutorChoice | None) -> str:
    """Where the runs train, for the header: the resolved devices (``cpu``, ``cuda:0 (NVIDIA H200)``; a device this
    machine lacks is the one-line error naming ``device``, before any run), or for a Slurm array the configs' own
    (resolved on the nodes)."""
    from phalanx.experiments.build import resolve_device
    from phalanx.training import devices

    if executor is not None and executor.executor == "slurm":
        return "device " + ", ".join(sorted({r.cfg.device for r in runs})) + " (resolved on the Slurm nodes)"
    return ", ".join(sorted({devices.label(resolve_device(r.specs.device)) for r in runs}))


def _split_slurm(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A grid config without its ``[slurm]`` table, and the table (``None`` if there is none)."""
    data = dict(data)
    return data, data.pop("slurm", None)


def _validated_grid(config: Path | None, overrides: list[str]) -> tuple[dict[str, Any], dict[str, Any] | None,
                                                                        list[Any]]:
    """The grid of a config as ``phalanx run`` and ``sweep`` take it — the table (with its spelling), its
    ``[slurm]`` table, and its runs, every point validated once (:func:`phalanx.experiments.grid.runs`) before
    anything runs. ``phalanx config show`` goes through here too, so it never prints a config ``run`` refuses, and
    refuses it with the same one line (``tests/test_config_show.py``)."""
    from phalanx.experiments import grid

    data, slurm_table = _split_slurm(_load_grid(config, overrides))
    return data, slurm_table, grid.runs(data)


def _run_grid(
    config: Path | None, overrides: list[str], out: Path, jobs: int, executor: ExecutorChoice | None = None,
    fmt: str = "table", threads: int | None = None,
) -> None:
    """Train the grid of a config: in this process's workers (``engine = "simulated"``), on a Slurm job array
    (``--executor slurm``), or — ``engine = "torchrun"`` — one process per worker, exactly as ``phalanx launch``
    does."""
    from phalanx.errors import ConfigError

    _, slurm_table, runs = _validated_grid(config, overrides)  # every point validated, once, before anything runs
    _check_out(out)
    engines = {r.cfg.engine for r in runs}
    if engines == {"torchrun"}:
        if executor is not None and executor.executor != "local":
            raise ConfigError("--executor", executor.executor, "local for engine = \"torchrun\" (one job per run: "
                              "`phalanx launch` inside your own sbatch script)")
        distributed_cli.launch(config=config, workers=None, set_=overrides, out=out)
        print_report(out, fmt, [r.run_id for r in runs])
        return
    if len(engines) > 1:
        raise ConfigError("engine", sorted(engines), "one engine for the whole grid (run the torchrun points with "
                          "`phalanx launch`)")
    say = console if fmt == "table" else _STDERR  # with --format, stdout holds the tables alone
    say.print(f"[bold]{len(runs)} run(s)[/bold] → {out} on {_devices(runs, executor)}")
    if over := over_budget_line(runs):
        say.print(over)
    _train(runs, out, jobs, executor, slurm_table, plain=fmt != "table", threads=threads,
           choose_threads=True)
    print_report(out, fmt, [r.run_id for r in runs])


def over_budget_line(runs: list[Any]) -> str | None:
    """One line when robust runs of the grid face more attackers than their rule is configured for (``byzantine >
    f``, the mean left out: it tolerates none whatever its f) — a study may want that, but a newcomer's typo runs
    silently outside every guarantee the rules state (a first-hour review); None otherwise."""
    over = [r.cfg for r in runs if r.cfg.aggregator != "mean" and r.cfg.byzantine > r.cfg.f]
    if not over:
        return None
    b, f = max((c.byzantine, c.f) for c in over)
    return (f"note: {len(over)} run(s) have more attacking workers than their rule is configured for (e.g. byzantine "
            f"= {b} > f = {f}): the rules' guarantees do not cover them")


@app.command("launch")
@functools.wraps(distributed_cli.launch)
def launch(*args: Any, **kwargs: Any) -> None:
    """``phalanx launch``: the job (:func:`phalanx.distributed.cli.launch`), then the comparison of ``--out`` as
    ``phalanx run`` prints it — a newcomer's launch ended without a table, and ``phalanx report`` had to be found."""
    ran = distributed_cli.launch(*args, **kwargs)
    print_report(kwargs["out"], runs=ran)  # typer passes every option by name, --out's default included


FORCE_HELP = "Use run-directory files whose SHA-256 differs from their manifest's (changed since written)."


TRACK_HELP = ("Also send every run to a tracker: tensorboard, mlflow, wandb, or NAME=URI (MLflow: a directory or a "
              "server; TensorBoard / W&B: a directory). Repeatable; adds to the config's `tracking` "
              "(docs/tracking.md).")


def _tracked(config: Path | None, overrides: list[str], track: list[str] | None) -> list[str]:
    """``--track`` as ``--set`` overrides (the names added to the config's ``tracking``), so that every path of a
    grid — worker processes, Slurm tasks, torchrun ranks — reads them from the config."""
    if not track:
        return overrides
    from phalanx.experiments import tracking

    return [*overrides, *tracking.track_overrides(_load_grid(config, overrides), track)]


def _force(force: bool) -> None:
    """``--force``: the integrity checks of run directories let changed files through (here and in the worker
    processes, which inherit the environment)."""
    if force:
        os.environ["PHALANX_FORCE"] = "1"


@app.command()
@executor_options
def run(
    config: Annotated[Path | None, typer.Argument(help="TOML config (default: the built-in default job).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set f=2 (repeatable).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("runs/default"),
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Parallel worker processes.")] = 1,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    track: Annotated[list[str] | None, typer.Option("--track", help=TRACK_HELP)] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help=THREADS_HELP)] = None,
    fmt: FormatOption = "table",
    executor: ExecutorChoice | None = None,
) -> None:
    """Train: one run, or one per combination of the list-valued keys; print the comparison, write report + plots.

    With engine = "torchrun" every worker is its own process, as with `phalanx launch`.
    """
    _force(force)
    _run_grid(config, _tracked(config, set_ or [], track), out, jobs, executor, check_format(fmt), threads)


@app.command()
@executor_options
def sweep(
    config: Annotated[Path, typer.Argument(help="TOML config; every list-valued key is a grid axis.")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key (repeatable).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("runs/sweep"),
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Parallel worker processes.")] = 2,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    track: Annotated[list[str] | None, typer.Option("--track", help=TRACK_HELP)] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help=THREADS_HELP)] = None,
    fmt: FormatOption = "table",
    executor: ExecutorChoice | None = None,
) -> None:
    """Run a grid in parallel processes or as a Slurm job array; finished runs are skipped, unfinished ones
    resume."""
    _force(force)
    _run_grid(config, _tracked(config, set_ or [], track), out, jobs, executor, check_format(fmt), threads)


@app.command("report")
def report_cmd(
    directory: Annotated[Path, typer.Argument(help="A run or sweep output directory.")],
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    fmt: FormatOption = "table",
) -> None:
    """Write report.md and PNG plots for the runs under a directory; print its tables (as `phalanx run` does)."""
    fmt = check_format(fmt)
    say = console if fmt == "table" else _STDERR  # with --format, stdout holds the tables alone
    _force(force)
    if not directory.is_dir():  # before torch is imported: a wrong path is its one line at once
        raise ConfigError("DIR", str(directory), "an existing directory of runs (a run's or a sweep's --out)")
    from phalanx.experiments import report

    result = report.write_report(directory)
    emit_all(grid_tables(result), fmt, console)
    if result.get("incomplete"):
        say.print(f"[bold yellow]{result['incomplete']}[/bold yellow]", soft_wrap=True)
    say.print(f"{directory / 'report.md'}; plots: " + ", ".join(str(p) for p in result["plots"]))


@app.command("status")
def status_cmd(
    directory: Annotated[Path, typer.Argument(help="A sweep's or experiment's output directory (its --out).")],
    all_runs: Annotated[bool, typer.Option("--all", help="List finished runs too (default: the others).")] = False,
    fmt: FormatOption = "table",
) -> None:
    """Every run of a grid: done, diverged, running (who), queued (Slurm), failed (the error), stopped, pending."""
    fmt = check_format(fmt)
    if not directory.is_dir():  # before torch is imported: a wrong path is its one line at once
        raise ConfigError("DIR", str(directory), "an existing directory of runs (a sweep's --out)")
    from phalanx.experiments import slurm, status

    base = directory / "runs" if (directory / "runs").is_dir() and not status.runs_of(directory) else directory
    queued = slurm.queued_runs(base)
    rows = status.grid_status(base, queued or {})
    if not rows:
        raise ConfigError("DIR", str(directory), "a directory a grid has written into (no runs found)")
    table = Tabular(f"{base}: {len(rows)} runs", ("run", "status", "round", "detail"), right=("round",))
    for r in rows:
        if r.status == "done" and not all_runs:
            continue
        where = "—" if r.round is None else f"{r.round}/{r.rounds}" if r.rounds else str(r.round)
        table.add(r.run, r.status, where, r.detail)
    counts = status.counts(rows)
    order = ("done", "diverged", "running", "queued", "stopped", "failed", "pending")
    done = counts.get("done", 0)
    table.notes.append(", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))
                       + (f" (the {done} done not listed: --all lists them)" if done and not all_runs else ""))
    if queued is None:
        table.notes.append("(the Slurm queue could not be read: queued runs show as pending)")
    emit(table, fmt, console)
