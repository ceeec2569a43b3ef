"""The ``phalanx`` command line. Nothing in the package imports this module."""

from __future__ import annotations

import functools
import inspect
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import torch
import typer
from rich.console import Console
from typer.core import TyperGroup

from phalanx import __version__, aggregators
from phalanx.cli.output import FormatOption, Tabular, check_format, emit, emit_all
from phalanx.distributed import cli as distributed_cli
from phalanx.errors import ConfigError, PhalanxError
from phalanx.executor_cli import ExecutorChoice, executor_options

if TYPE_CHECKING:
    import click

    from phalanx.experiments.config import RunConfig
    from phalanx.studies import Study

app = typer.Typer(
    name="phalanx", help="Byzantine-robust distributed learning: robust aggregators, attacks, price of robustness.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    suggest_commands=False,  # click suggests the closest command itself: typer's own made it say so twice
)
list_app = typer.Typer(help="List what Phalanx provides.", no_args_is_help=True)
app.add_typer(list_app, name="list")


class _StudyGroup(TyperGroup):
    """A command group whose study commands are made when one is asked for, from the study registry
    (:mod:`phalanx.studies`): a study's module — a plug-in's too — is imported only then."""

    prefix: ClassVar[str]
    """The group's command line, as a study's report quotes it."""
    aliases: ClassVar[dict[str, str] | None] = None
    """Command → study; None: every study :func:`phalanx.studies.names` lists, under its own name, and any
    ``module:attr`` spec of a study."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        from phalanx import studies

        return [*super().list_commands(ctx), *(studies.names() if self.aliases is None else self.aliases)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        if self.aliases is None:  # an unknown study is the registry's one-line error (the studies, the closest)
            return _study_command(cmd_name, f"{self.prefix} {cmd_name}")
        study = self.aliases.get(cmd_name)
        return None if study is None else _study_command(study, f"{self.prefix} {cmd_name}")

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                           list[str]]:
        from click.exceptions import NoSuchCommand

        try:
            return super().resolve_command(ctx, args)
        except NoSuchCommand as exc:  # "Did you mean" among every command, the study commands made on demand too
            raise NoSuchCommand(exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None


class _Experiments(_StudyGroup):
    prefix = "phalanx experiment"


class _Tension(_StudyGroup):
    prefix = "phalanx tension"
    aliases: ClassVar[dict[str, str] | None] = {"paper": "tension", "convergence": "convergence"}


tension_app = typer.Typer(cls=_Tension, help="The price of robustness (Yang, Shi & Li, ICML 2025).",
                          no_args_is_help=True)
app.add_typer(tension_app, name="tension")
experiment_app = typer.Typer(cls=_Experiments, help="Experiments of the field as presets: grids, tables with "
                             "intervals, plots. NAME is a study below, an installed plug-in's, or a module:attr spec "
                             "of a phalanx.studies.Study subclass.", no_args_is_help=True)
app.add_typer(experiment_app, name="experiment")


def _console() -> Console:
    """The CLI's console. Rich wraps everything to 80 columns when standard output is not a terminal (a pipe, a log,
    a batch job): table headers shrank to "co…" and rows wrapped onto five lines. There — unless ``COLUMNS`` says
    how wide — tables keep their natural width and no line is wrapped."""
    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(width=PIPE_WIDTH)
    return out


PIPE_WIDTH = 100_000
"""The console's width when standard output is not a terminal: wider than any table, so none is cut or wrapped."""
console = _console()
_STDERR = Console(stderr=True, width=None if Console(stderr=True).is_terminal else PIPE_WIDTH)
"""Where a command's progress and notes go when ``--format`` asks for its tables alone on stdout."""
app.command("launch")(distributed_cli.launch)
app.add_typer(distributed_cli.keys_app, name="keys")
app.command("audit")(distributed_cli.audit)


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "—"
    if v != v or v == float("inf"):
        return "∞" if v == float("inf") else "nan"
    return f"{v:.{digits}g}"


def _print_version(value: bool) -> None:
    if value:
        console.print(f"phalanx {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", is_eager=True,
                                          callback=_print_version)] = False,
) -> None:
    """Byzantine-robust distributed learning: robust aggregators, attacks, price of robustness."""


def _references(table: Tabular, rows: list[tuple[list[str], str]], fmt: str) -> None:
    """Fill ``table`` with ``rows`` (cells, reference), each row ending in its reference's number ``[k]``
    (identical references share one), and add the numbered references to its notes, printed below the table: a
    reference folded into a narrow column takes 5-10 lines at 80 columns, a list under the table one or two. In csv
    and json (data, without notes) the cell holds the reference itself."""
    numbers: dict[str, int] = {}
    for cells, reference in rows:
        k = numbers.setdefault(reference, len(numbers) + 1)
        table.add(*cells, reference if fmt in ("csv", "json") else f"[{k}]")
    table.notes[:0] = [f"[{k}] {ref}" for ref, k in numbers.items()]


@list_app.command("aggregators")
def list_aggregators(
    workers: Annotated[int, typer.Option("--workers", "-n", min=1, help="n, for the ε and κ columns.")] = 16,
    f: Annotated[int, typer.Option("--f", "-f", min=0, help="f, the number of Byzantine workers tolerated.")] = 3,
    fmt: FormatOption = "table",
) -> None:
    """Rules and pre-aggregators with their requirement on n, ε and κ at (n, f), and their references."""
    fmt = check_format(fmt)
    if 2 * f >= workers:
        raise ConfigError("--f", f, f"< n/2 = {workers / 2:g} with -n {workers} (f ≥ n/2 is beyond any robust rule)")
    table = Tabular(f"Phalanx aggregators (ε, κ at n={workers}, f={f})",
                    ("name", "kind", "requirement", "ε", "κ", "ref."), whole=("name",))  # names stay whole (grep-able)
    rows: list[tuple[list[str], str]] = []
    for name in aggregators.names():
        cls = aggregators.get_class(name)
        try:
            comp = cls(f=f)
        except PhalanxError as exc:
            rows.append(([name, "?", str(exc), "", ""], cls.reference))
            continue
        info = comp.describe(workers)
        rows.append(([name, info["kind"], info["requirement"], _fmt(info.get("epsilon")), _fmt(info.get("kappa"))],
                     info["reference"]))
    from phalanx.decentralized import robust_gossip

    for name in robust_gossip.names():  # a node's rule over its graph neighbourhood
        rows.append(([name, "gossip", "gossip only; 2f+1 ≤ deg+1", "", ""], robust_gossip.get_class(name).reference))
    _references(table, rows, fmt)
    table.notes.append(f"ε, κ: the values the literature proves (— where none; describe() names each statement). "
                       f"`phalanx epsilon SPEC -n {workers} --f {f}` and `phalanx kappa SPEC -n {workers} -f {f}` "
                       "measure certified lower bounds.")
    emit(table, fmt, console)


@app.command()
def demo(
    workers: Annotated[int, typer.Option("--workers", "-n", min=3, help="Number of workers n.")] = 20,
    byzantine: Annotated[int, typer.Option("--byzantine", "-b", min=0, help="Workers that actually attack.")] = 4,
    f: Annotated[int, typer.Option("--f", min=0, help="Byzantine workers the rules are configured for.")] = 4,
    dim: Annotated[int, typer.Option("--dim", "-d", min=1, help="Vector dimension d.")] = 100_000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    fmt: FormatOption = "table",
) -> None:
    """Aggregation demo: every rule on the same honest vectors, with no attack, an ALIE attack and NaN rows.

    Prints, per rule, the error of its output against the honest mean (relative to the honest spread, the
    quantity whose worst case is ε), the share of the output it gave to the Byzantine rows, and its speed.
    """
    from phalanx.analysis import aggregation_error, lower_bound

    fmt = check_format(fmt)
    if byzantine >= workers:
        raise typer.BadParameter(f"--byzantine={byzantine} must be < --workers={workers}")
    gen = torch.Generator().manual_seed(seed)
    honest = torch.randn(workers - byzantine, dim, generator=gen) * 0.5 + torch.randn(dim, generator=gen)
    mu, sigma = honest.mean(0), honest.std(0)
    # ALIE (Baruch et al., NeurIPS 2019): every Byzantine row sends mean − z·std with z = 1.
    alie = torch.cat([honest, (mu - 1.0 * sigma).expand(byzantine, dim)])
    nan = torch.cat([honest, torch.full((byzantine, dim), float("nan"))])
    clean = torch.cat([honest, honest[:byzantine] + 0.01 * torch.randn(byzantine, dim, generator=gen)])
    (console if fmt == "table" else _STDERR).print(
        f"[bold]Phalanx {__version__} aggregation demo[/bold]: n={workers}, {byzantine} Byzantine, rules configured "
        f"for f={f}, d={dim}. The errors below are on one random input; ε is a rule's worst case over every input, "
        f"and any f-robust rule's ε ≥ f/(n−f) = {lower_bound(workers, f):.3f} (Yang, Shi & Li, ICML 2025) — a "
        "bound on that worst case, which a typical input's error may lie far below."
    )
    cols = ("rule", "ε (proven)", "error, no attack", "error, ALIE", "error, NaN rows", "Byz. share (ALIE)", "ms")
    table = Tabular("error = ‖Agg − honest mean‖² / honest spread (lower is better)", cols, right=cols[1:])
    specs = [s for s in ("mean", "cwmed", "cwtm", "meamed", "krum", "multikrum", "geomed", "mda", "bulyan", "cc",
                         "nnm>cwtm", "bucketing>cwtm", "arc>cwtm", "dnc", "signguard", "clippedclustering")
             if s.split(">")[-1] in aggregators.names("rule") and all(p in aggregators.names() for p in s.split(">"))]
    for spec in specs:
        try:
            rule = aggregators.make(spec, f=f)
            rule(clean)  # warm-up (first call of a kernel)
            t0 = time.perf_counter()
            out_clean = rule(clean)
            ms = (time.perf_counter() - t0) * 1e3
            out_alie, contrib = rule.aggregate(alie)
            out_nan = rule(nan)
        except PhalanxError as exc:
            table.add(spec, "", str(exc), "", "", "", "")
            continue
        byz_share = float(contrib[workers - byzantine:].sum()) if byzantine else 0.0
        table.add(
            spec, _fmt(rule.epsilon(workers)), _fmt(aggregation_error(out_clean, clean)),
            _fmt(aggregation_error(out_alie, honest)), _fmt(aggregation_error(out_nan, honest)), f"{byz_share:.2f}",
            f"{ms:.1f}",
        )
    emit(table, fmt, console)


@app.command("epsilon")
def epsilon_cmd(
    spec: Annotated[str, typer.Argument(help="Aggregator spec, e.g. cwtm or nnm>krum.")],
    workers: Annotated[int, typer.Option("--workers", "-n", min=1, help="Number of workers n.")] = 16,
    f: Annotated[int, typer.Option("--f", min=0, help="Byzantine workers tolerated.")] = 3,
    trials: Annotated[int, typer.Option("--trials", min=0, help="Random inputs to try.")] = 200,
    budget: Annotated[int, typer.Option("--budget", min=0, help="Rule evaluations of the CMA-ES search.")] = 2000,
    dim: Annotated[int, typer.Option("--dim", "-d", min=1, help="Dimension of the inputs.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
) -> None:
    """A certified lower bound on a rule's no-attack aggregation error factor ε (known constructions, random inputs
    and a CMA-ES search, the best input recomputed exactly), beside its proven ε or upper bound; exit status 1 when
    the measured value is above a proven bound (a bug)."""
    from phalanx.analysis import epsilon

    est = epsilon(aggregators.make(spec, f=f), workers, d=dim, trials=trials, seed=seed, budget=budget)
    proven = (f"proven ε = {est.theory:.4g} ({est.theory_source})" if est.theory is not None else
              f"nothing proven; ε ≤ {est.upper:.4g}, {est.upper_source}" if est.upper is not None else
              "nothing proven, no proven upper bound")
    console.print(
        f"{spec} (n = {workers}, f = {f}): measured ε ≥ {est.value:.4g} — a certified lower bound ({est.verdict}; "
        f"worst input: {est.worst_input}; {est.evaluations} rule evaluations, seed {seed}); {proven}; every "
        f"(f, κ)-robust rule has ε ≥ f/(n−f) = {est.lower_bound:.4g}", soft_wrap=True, highlight=False, markup=False,
    )
    if est.above_upper:
        raise typer.Exit(1)


def _ranges(rows: tuple[int, ...]) -> str:
    """Increasing row indices as ranges: ``0–7, 9``."""
    parts: list[str] = []
    start = prev = None
    for i in [*rows, None]:
        if i is not None and prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}–{prev}")
        start = prev = i
    return ", ".join(parts)


@app.command("kappa")
def kappa_cmd(
    spec: Annotated[str, typer.Argument(help="Aggregator spec, e.g. cwtm or nnm>krum.")],
    workers: Annotated[int, typer.Option("--workers", "-n", help="Number of workers n.")] = 10,
    f: Annotated[int, typer.Option("--f", "-f", help="Byzantine workers f (0 <= f < n/2).")] = 2,
    dim: Annotated[int, typer.Option("--dim", "-d", help="Dimension d of the inputs.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    budget: Annotated[int, typer.Option("--budget", help="Rule evaluations the search may spend.")] = 2000,
) -> None:
    """Measure a certified lower bound on a rule's (f, κ)-robustness coefficient (Allouah et al., AISTATS 2023):
    the worst input a search finds, beside the proven upper bound and the bound f/(n−2f) of every rule."""
    from phalanx.analysis import kappa
    from phalanx.analysis.kappa import check_setting

    check_setting(workers, f, dim, budget, seed)  # before the rule is built: an unknown rule comes after
    est = kappa(aggregators.make(spec, f=f), workers, d=dim, budget=budget, seed=seed)
    upper = "unknown" if est.upper_bound is None else f"{est.upper_bound:.4g}"
    measured = (f"unbounded (the ratio reaches {est.value:.3g} and grows with the Byzantine rows' distance)"
                if est.unbounded else f"≥ {est.value:.3g} (float64 rounding: no larger error found)" if est.rounding
                else f"≥ {est.value:.4f} (certified)")
    if not est.unbounded_tested:
        measured += " — whether it is bounded was not tested: the budget ended before the far inputs (raise --budget)"
    console.print(
        f"{spec} (n={workers}, f={f}, d={dim}): measured κ {measured}; proven κ ≤ {upper}; every rule has "
        f"κ ≥ f/(n−2f) = {est.lower_bound:.4f}", soft_wrap=True, highlight=False)
    console.print(
        f"worst input: {est.worst_input}; set S = rows {_ranges(est.honest)}; "
        f"{'exact' if est.exact else 'float64'}, {est.evaluations} evaluations, seed {seed}",
        soft_wrap=True, highlight=False, markup=False)
    if est.above_upper:
        console.print(f"[red]BUG:[/red] the measured κ exceeds the proven bound {upper} by more than the float64 "
                      f"rounding {est.slack:.3g}", soft_wrap=True, highlight=False)
        raise typer.Exit(1)


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


def _eta(elapsed: float, done: int, total: int, before: int) -> str:
    """The time left, extrapolated from the rounds this command trained (``done − before``: not the rounds found
    done — skipped runs, the rounds before a resumed run's checkpoint — which would make a resumed grid look fast),
    or "unknown" before the first one."""
    trained = done - before
    if trained <= 0 or elapsed <= 0:
        return "unknown"
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


def _train(
    cfgs: list[RunConfig], out: Path, jobs: int, executor: ExecutorChoice | None = None,
    slurm_table: dict[str, Any] | None = None, *, plain: bool = False,
) -> None:
    """Run validated configurations into ``out`` (finished runs skipped) under a rich progress bar with ETA, on the
    executor the command line chose (``slurm_table``: the grid config's ``[slurm]`` settings). When stdout is not a
    terminal (a batch job's log, a pipe) the progress is plain lines instead (:class:`_LogProgress`); with
    ``plain`` (a table format asked for: stdout holds the tables alone) plain lines on stderr.

    The first SIGINT (Ctrl-C) or SIGTERM stops the grid cleanly (:class:`~phalanx.experiments.runner.Interrupted`:
    one line, exit status 130 or 143); the same command, started again, resumes.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from phalanx.experiments import grid, runner

    _check_out(out)
    choice = executor or ExecutorChoice()
    chosen = choice.make(jobs, slurm_table)  # Slurm settings validated before anything runs
    announce = None if choice.executor == "slurm" else functools.partial(_announce, jobs=jobs, err=plain)

    if plain or not _stdout_is_terminal():
        echo = functools.partial(typer.echo, err=True) if plain else typer.echo
        log = _LogProgress({grid.run_id(c): c.rounds for c in cfgs}, echo=echo)
        try:
            with runner.stop_on_signals():
                runner.run_grid(
                    cfgs, out, executor=chosen, on_round=lambda cfg, t, rounds: log.round(grid.run_id(cfg), t),
                    on_done=lambda cfg, status: log.run_ended(grid.run_id(cfg), _short(cfg), status), before=announce,
                )
        finally:
            log.close()
        return

    total = sum(c.rounds for c in cfgs)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} rounds"),
               TimeElapsedColumn(), _trained_eta())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("training", total=total, before=0)
        offsets: dict[str, int] = {}
        before = [0]  # rounds found done (skipped runs, the rounds before a resumed checkpoint): not this speed

        def on_round(cfg: RunConfig, t: int, rounds: int) -> None:
            key = grid.run_id(cfg)
            if key not in offsets:  # the first round this command trains: the ones before it were done earlier
                before[0] += max(0, t - 1)
            bar.advance(task, t - offsets.get(key, 0))
            offsets[key] = t
            bar.update(task, description=_short(cfg), before=before[0])

        def on_done(cfg: RunConfig, status: str) -> None:
            key = grid.run_id(cfg)
            if status != "done":  # skipped, failed, diverged: its rounds left were not trained here
                before[0] += cfg.rounds - offsets.get(key, 0)
            bar.advance(task, cfg.rounds - offsets.get(key, 0))
            offsets[key] = cfg.rounds
            bar.update(task, before=before[0])

        with runner.stop_on_signals():
            runner.run_grid(cfgs, out, executor=chosen, on_round=on_round, on_done=on_done, before=announce)


BUDGET_ENV = "PHALANX_BUDGET_MINUTES"
"""The environment variable that sets how long a grid may be estimated to take before the command says so first."""
DEFAULT_BUDGET_MINUTES = 5.0


def _announce(todo: list[tuple[RunConfig, Path]], *, jobs: int, err: bool) -> None:
    """Before the first run: when the grid's estimate (:func:`phalanx.experiments.estimate.estimate`) is over the
    budget (``PHALANX_BUDGET_MINUTES``, default 5; ``off``: no estimate), one line saying so and how to make it
    smaller. It does not stop the grid (a script's long run is no mistake): Ctrl-C stops it cleanly, and the same
    command resumes."""
    from phalanx.experiments import estimate

    raw = os.environ.get(BUDGET_ENV, "")
    if raw == "off":  # no estimate at all (the test suite's many small grids)
        return
    try:
        budget = float(raw) if raw else DEFAULT_BUDGET_MINUTES
    except ValueError:
        raise ConfigError(BUDGET_ENV, raw, "a number of minutes, e.g. 30, or off") from None
    if not math.isfinite(budget) or budget <= 0:
        raise ConfigError(BUDGET_ENV, raw, "a number of minutes > 0")
    guess = estimate.estimate(todo, jobs, _short)
    if guess is None or guess.seconds <= 60 * budget:
        return
    (_STDERR if err else console).print(
        f"[yellow]This grid should take {guess.text()}[/yellow] — over the {budget:g} min budget "
        f"({BUDGET_ENV}). To make it smaller: fewer seeds or list values, fewer rounds (--set rounds=…), a smaller "
        "preset (--preset quick), or more processes (--jobs); Ctrl-C stops it cleanly and the same command resumes.",
        soft_wrap=True, highlight=False)


def _devices(cfgs: list[RunConfig], executor: ExecutorChoice | None) -> str:
    """Where the runs train, for the header: the resolved devices (``cpu``, ``cuda:0 (NVIDIA H200)``; a device this
    machine lacks is the one-line error naming ``device``, before any run), or for a Slurm array the configs' own
    (resolved on the nodes)."""
    from phalanx.experiments.build import resolve_device
    from phalanx.training import devices

    if executor is not None and executor.executor == "slurm":
        return "device " + ", ".join(sorted({c.device for c in cfgs})) + " (resolved on the Slurm nodes)"
    return ", ".join(sorted({devices.label(resolve_device(c)) for c in cfgs}))


def _split_slurm(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A grid config without its ``[slurm]`` table, and the table (``None`` if there is none)."""
    data = dict(data)
    return data, data.pop("slurm", None)


def _run_grid(
    config: Path | None, overrides: list[str], out: Path, jobs: int, executor: ExecutorChoice | None = None,
    fmt: str = "table",
) -> None:
    """Train the grid of a config: in this process's workers (``engine = "simulated"``), on a Slurm job array
    (``--executor slurm``), or — ``engine = "torchrun"`` — one process per worker, exactly as ``phalanx launch``
    does."""
    from phalanx.errors import ConfigError
    from phalanx.experiments import grid, report

    data, slurm_table = _split_slurm(_load_grid(config, overrides))
    cfgs = grid.configs(data)  # every point validated before anything runs
    _check_out(out)
    engines = {c.engine for c in cfgs}
    if engines == {"torchrun"}:
        if executor is not None and executor.executor != "local":
            raise ConfigError("--executor", executor.executor, "local for engine = \"torchrun\" (one job per run: "
                              "`phalanx launch` inside your own sbatch script)")
        distributed_cli.launch(config=config, workers=None, set_=overrides, out=out)
        return
    if len(engines) > 1:
        raise ConfigError("engine", sorted(engines), "one engine for the whole grid (run the torchrun points with "
                          "`phalanx launch`)")
    say = console if fmt == "table" else _STDERR  # with --format, stdout holds the tables alone
    say.print(f"[bold]{len(cfgs)} run(s)[/bold] → {out} on {_devices(cfgs, executor)}")
    _train(list(cfgs), out, jobs, executor, slurm_table, plain=fmt != "table")
    result = report.write_report(out)
    tables = [_summary_table(result)]
    if result["tradeoff"]:
        tables.append(_tradeoff_table(result["tradeoff"]))
    if result.get("mixed"):
        tables[0].notes.append(report.mixed_line(result["mixed"]).replace("**", ""))
    emit_all(tables, fmt, console)
    say.print(f"report: {out / 'report.md'}; plots: " + ", ".join(str(p) for p in result["plots"]))


def _summary_table(result: dict[str, Any]) -> Tabular:
    """A grid's final accuracy per setting (seeds pooled), best first, from :func:`report.write_report`'s result."""
    several = any(s["seeds"] > 1 for s in result["summary"])
    keys = result["keys"]
    diverged = sum(s.get("diverged", 0) for s in result["summary"])
    cols = [*keys, "final %", "agg. error", "Byz. share", "seeds"] + (["diverged"] if diverged else [])
    title = "Final test accuracy (seeds pooled" + ("; ± the standard deviation over seeds)" if several else ")")
    table = Tabular(title, cols, right=cols[len(keys):], compact=True)
    for s in sorted(result["summary"], key=lambda s: -s["final_accuracy"]):
        acc = f"{100 * s['final_accuracy']:.1f}" + (f" ± {100 * s['final_accuracy_std']:.1f}" if s["seeds"] > 1 else "")
        table.add(*[str(s.get(k)) for k in keys], acc, _fmt(s["agg_error"]), _fmt(s["byz_share"], 2), s["seeds"],
                  *([f"{s.get('diverged', 0)}/{s['seeds']}"] if diverged else []))
    if diverged:
        table.notes.append(f"{diverged} run(s) diverged (the model became non-finite; final accuracy counted as 0; "
                           "`phalanx status` says at which round)")
    return table


def _tradeoff_table(tradeoffs: list[Any]) -> Tabular:
    """The price and rescue of every robust rule against the mean (:func:`phalanx.experiments.report.tradeoff`),
    each ± its half-width with its Holm-adjusted p, and the sentence saying what they are."""
    from phalanx.experiments import report

    keys = report.tradeoff_keys(tradeoffs)
    cols = ["rule", *keys, "attack", "price (pts)", "p (price)", "rescue (pts)", "p (rescue)", "seeds", "verdict"]
    table = Tabular("The price and rescue of robustness (vs mean, paired by seed)", cols, compact=True,
                    right=("price (pts)", "p (price)", "rescue (pts)", "p (rescue)", "seeds"), wrap=("verdict",))
    for t in report.sorted_tradeoffs(tradeoffs):
        ctx = dict(t.context)
        table.add(t.rule, *(str(ctx[k]) for k in keys), t.attack, report.points_pm(t.price),
                  t.price.estimate.holm_text(), report.points_pm(t.rescue), t.rescue.estimate.holm_text(),
                  len(t.seeds), t.verdict)
    table.notes.append(report.TRADEOFF_MEANING.replace("*", ""))
    return table


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
    fmt: FormatOption = "table",
    executor: ExecutorChoice | None = None,
) -> None:
    """Train: one run, or one per combination of the list-valued keys; print the comparison, write report + plots.

    With engine = "torchrun" every worker is its own process, as with `phalanx launch`.
    """
    _force(force)
    _run_grid(config, _tracked(config, set_ or [], track), out, jobs, executor, check_format(fmt))


@app.command()
@executor_options
def sweep(
    config: Annotated[Path, typer.Argument(help="TOML config; every list-valued key is a grid axis.")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key (repeatable).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("runs/sweep"),
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Parallel worker processes.")] = 2,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    track: Annotated[list[str] | None, typer.Option("--track", help=TRACK_HELP)] = None,
    fmt: FormatOption = "table",
    executor: ExecutorChoice | None = None,
) -> None:
    """Run a grid in parallel processes or as a Slurm job array; finished runs are skipped, unfinished ones
    resume."""
    _force(force)
    _run_grid(config, _tracked(config, set_ or [], track), out, jobs, executor, check_format(fmt))


@app.command("report")
def report_cmd(
    directory: Annotated[Path, typer.Argument(help="A run or sweep output directory.")],
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
) -> None:
    """Write report.md and PNG plots for the runs under a directory."""
    from phalanx.errors import ConfigError
    from phalanx.experiments import report

    _force(force)
    if not directory.is_dir():
        raise ConfigError("DIR", str(directory), "an existing directory of runs (a run's or a sweep's --out)")
    result = report.write_report(directory)
    if result.get("incomplete"):
        console.print(f"[bold yellow]{result['incomplete']}[/bold yellow]", soft_wrap=True)
    console.print(f"{directory / 'report.md'}; plots: " + ", ".join(str(p) for p in result["plots"]))


@app.command("status")
def status_cmd(
    directory: Annotated[Path, typer.Argument(help="A sweep's or experiment's output directory (its --out).")],
    all_runs: Annotated[bool, typer.Option("--all", help="List finished runs too (default: the others).")] = False,
    fmt: FormatOption = "table",
) -> None:
    """Every run of a grid: done, diverged, running (who), queued (Slurm), failed (the error), stopped, pending."""
    from phalanx.errors import ConfigError
    from phalanx.experiments import slurm, status

    fmt = check_format(fmt)
    if not directory.is_dir():
        raise ConfigError("DIR", str(directory), "an existing directory of runs (a sweep's --out)")
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
    table.notes.append(", ".join(f"{counts[k]} {k}" for k in order if counts.get(k)))
    if queued is None:
        table.notes.append("(the Slurm queue could not be read: queued runs show as pending)")
    emit(table, fmt, console)


@app.command("keygen")
def keygen_cmd(
    private: Annotated[Path, typer.Argument(help="Where to write the private key (PEM, mode 0600).")],
    public: Annotated[Path, typer.Argument(help="Where to write the public key (PEM).")],
    curve: Annotated[str, typer.Option("--curve", help="P-256, P-384 or P-521.")] = "P-256",
) -> None:
    """Make an elliptic-curve key pair for `phalanx sign` / `phalanx verify` (neither file may exist)."""
    from phalanx import signing

    key, pub = signing.keygen(private, public, curve=curve)
    console.print(f"private key {key} (keep it to yourself), public key {pub}", soft_wrap=True)


@app.command("sign")
def sign_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (sign it once it has finished).")],
    key: Annotated[Path | None, typer.Option("--key", help="PEM private key (phalanx keygen).")] = None,
    certificate: Annotated[Path | None, typer.Option("--certificate", help="The key's X.509 signing "
                                                                            "certificate (PEM).")] = None,
    chain: Annotated[list[Path] | None, typer.Option("--chain", help="Certificates between it and the CA "
                                                                     "(repeatable).")] = None,
    keyless: Annotated[bool, typer.Option("--keyless", help="Sigstore keyless signing (needs the network).")] = False,
) -> None:
    """Sign every file of a run directory (model-signing: an in-toto statement of per-file SHA-256, in phalanx.sig)."""
    from phalanx import signing

    if key is None and not keyless:
        raise typer.BadParameter("give --key KEY.pem (or --keyless for Sigstore, which needs the network)")
    path = signing.sign(run_dir, key, certificate=certificate, certificate_chain=tuple(chain or ()), keyless=keyless)
    console.print(f"signed {len(signing.covered_files(run_dir))} files of {run_dir} → {path}", soft_wrap=True)
    if key is not None:  # what the signature vouches for, beyond the bytes
        from phalanx.experiments import provenance

        found = provenance.inspect(run_dir, signing.public_key_of(key))
        if not found.proven:
            console.print(f"note: {found.lines()[0]} — the signature vouches for these files, not for how they were "
                          "trained; `phalanx verify` says so (exit 1)", soft_wrap=True, highlight=False)


@app.command("verify")
def verify_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A signed run directory.")],
    key: Annotated[Path | None, typer.Option("--key", help="PEM public key paired with the signing key.")] = None,
    chain: Annotated[list[Path] | None, typer.Option("--chain", help="Trusted CA certificates (certificate mode, "
                                                                     "repeatable).")] = None,
    identity: Annotated[str | None, typer.Option("--identity", help="Keyless: the signer's identity.")] = None,
    issuer: Annotated[str | None, typer.Option("--issuer", help="Keyless: its OpenID Connect issuer.")] = None,
) -> None:
    """Check a run directory against its signature, then (with --key) its provenance: which rounds were trained
    under the key. Exit 0: the files are the signed ones and every round was trained under the key; 1: the files are
    the signed ones, but not every round is proven to be trained under the key (the lines say which); 2: the
    signature does not hold (one line)."""
    from phalanx import signing
    from phalanx.experiments import provenance

    signing.verify(run_dir, key, certificate_chain=None if chain is None else tuple(chain), identity=identity,
                   oidc_issuer=issuer)
    console.print(f"{run_dir}: signature verified ({len(signing.covered_files(run_dir))} files): they are the files "
                  "that were signed", soft_wrap=True, highlight=False)
    if key is None:
        console.print("provenance: not checked (each training session is signed with the run's sign_key: check it "
                      "with --key PUB.pem)", soft_wrap=True, highlight=False)
        return
    found = provenance.inspect(run_dir, key)
    for line in found.lines():
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    if not found.proven:
        raise typer.Exit(1)


@list_app.command("attacks")
def list_attacks(fmt: FormatOption = "table") -> None:
    """Attacks with their reference."""
    from phalanx import attacks
    from phalanx.attacks.base import DataAttack

    fmt = check_format(fmt)
    table = Tabular("Phalanx attacks", ("name", "kind", "ref."))

    def kind(cls: type) -> str:
        if getattr(cls, "baseline", False):  # honest, none: no attack at all
            return "baseline: no attack (" + ("real gradients on own data" if issubclass(cls, DataAttack)
                                             else "replays honest rows") + ")"
        return "data: poisons its batches" if issubclass(cls, DataAttack) else "vector: sends rows"

    rows = [([name, kind(attacks.get_class(name))], attacks.get_class(name).reference) for name in attacks.names()]
    from phalanx.decentralized import gossip_attacks

    rows += [([name, "vector, over a graph (gossip, anytime)"], gossip_attacks.get_class(name).reference)
             for name in gossip_attacks.names()]
    _references(table, rows, fmt)
    emit(table, fmt, console)


@list_app.command("stages")
def list_stages(fmt: FormatOption = "table") -> None:
    """The round's stages (docs/design.md, 'Stages'): each with its side, how a config turns it on, its config
    section (its parameters) and its reference."""
    from phalanx.experiments import legacy
    from phalanx.training.stages import registry

    fmt = check_format(fmt)
    table = Tabular("Phalanx stages", ("name", "side", "turned on by", "section: its parameters", "ref."),
                    whole=("name",))
    rows = []
    for name in registry.names():
        cls = registry.get(name)
        on = cls.brought_by or legacy.FLAT_STAGES.get(name) or f"{legacy.TREE}.{name} (a TOML table)"
        section = "\n".join(f"{p}: {text}" for p, text in cls.parameters.items()) or "—"
        rows.append(([name, cls.side, on, section], cls.reference or "—"))
    _references(table, rows, fmt)
    emit(table, fmt, console)


@list_app.command("datasets")
def list_datasets(fmt: FormatOption = "table") -> None:
    """Data sets Phalanx can load."""
    from phalanx import data

    emit(Tabular("Phalanx data sets", ("name",), [[name] for name in data.names()]), check_format(fmt), console)


@list_app.command("models")
def list_models(fmt: FormatOption = "table") -> None:
    """Models Phalanx can build."""
    from phalanx import models

    emit(Tabular("Phalanx models", ("name",), [[name] for name in models.names()]), check_format(fmt), console)


@tension_app.command("theory")
def tension_theory(
    workers: Annotated[int, typer.Option("--workers", "-n", min=2, help="Number of workers n.")] = 16,
    rules: Annotated[str, typer.Option("--rules", help="Comma-separated aggregator specs.")] = ",".join(
        ("cwtm", "cwmed", "geomed", "krum", "multikrum", "meamed", "nnm>cwtm")
    ),
    measure: Annotated[bool, typer.Option("--measure", help="Also measure ε (worst cases + random search) and a "
                                          "certified lower bound on κ (phalanx kappa).")] = False,
    trials: Annotated[int, typer.Option("--trials", min=0, help="Random inputs per (rule, f) when measuring.")] = 100,
    kappa_budget: Annotated[int, typer.Option("--kappa-budget", min=1, help="Rule evaluations per (rule, f) of the "
                                              "κ search when measuring.")] = 300,
    budget: Annotated[int, typer.Option("--budget", min=0, help="Rule evaluations per (rule, f) of the ε search's "
                                        "CMA-ES when measuring.")] = 2000,
    dim: Annotated[int, typer.Option("--dim", "-d", min=1, help="Dimension of the measured inputs.")] = 8,
    fmt: FormatOption = "table",
) -> None:
    """For f = 0 … ⌊(n−1)/2⌋: each rule's ε and κ beside the lower bounds ε ≥ f/(n−f) and κ ≥ f/(n−2f) (and with
    --measure the measured ε and the certified lower bound on κ)."""
    from phalanx.analysis import tension

    fmt = check_format(fmt)
    specs = [r.strip() for r in rules.split(",") if r.strip()]
    rows = tension.theory_table(workers, specs, measure=measure, trials=trials, kappa_budget=kappa_budget, d=dim,
                                budget=budget)
    if fmt == "md":  # the analysis's own Markdown (its columns and notes), as the docs quote it
        console.print(tension.to_markdown(rows, workers), markup=False, highlight=False, soft_wrap=True)
        return
    if fmt in ("csv", "json"):  # the analysis's own columns, every value (the terminal table rounds them)
        import csv
        import io

        data = list(csv.reader(io.StringIO(tension.to_csv(rows))))
        emit(Tabular(f"Price of robustness at n = {workers}", data[0], data[1:]), fmt, console)
        return
    cols = ["rule", "f", "bound f/(n−f)", "ε proven"]
    cols += (["ε measured", "worst input", "κ bound f/(n−2f)", "κ proven", "κ measured"] if measure else
             ["κ proven"])
    table = Tabular(f"Price of robustness at n = {workers}: no-attack error ε vs the bound f/(n−f)", cols,
                    right=[c for c in cols if c not in ("rule", "worst input")])
    for r in rows:
        cells = [r.rule, str(r.f), _fmt(r.lower_bound, 4), tension.epsilon_cell(r)]
        if measure:
            cells += [tension.measured_cell(r) if r.note is None else "—", r.worst_input or (r.note or ""),
                      _fmt(r.kappa_bound, 4), _fmt(r.kappa, 4), tension.kappa_cell(r)]
        else:
            cells.append(_fmt(r.kappa, 4))
        table.add(*cells)
    table.notes.append("Measured values (≥) are certified lower bounds. Proven values:")
    table.notes.extend(f"  {line}" for line in tension.sources(rows))
    emit(table, fmt, console)


def _cpu_jobs() -> int:
    import os

    return max(1, os.cpu_count() or 1)


def _study_options(study: type[Study[Any, Any, Any]]) -> list[inspect.Parameter]:
    """The options every study command has, with the study's defaults and help."""
    help_preset = study.preset_help or "One of " + ", ".join(study.presets) + "."
    options: dict[str, tuple[Any, Any]] = {
        "preset_name": (Annotated[str, typer.Option("--preset", help=help_preset)], study.default_preset),
        "out": (Annotated[Path, typer.Option("--out", help="Output directory.")], Path(study.out)),
        "seeds": (Annotated[int, typer.Option("--seeds", min=2, help="Seeds per cell (0 … seeds−1).")], 3),
        "jobs": (Annotated[int | None, typer.Option("--jobs", "-j", min=1, help="Processes (default: cores).")], None),
        "set_": (Annotated[list[str] | None, typer.Option("--set", help="Override a preset field or run key: --set "
                                                          f"{study.set_example}.")], None),
    }
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
            for name, (annotation, default) in options.items()]


@functools.cache
def _study_command(name: str, path: str) -> click.Command:
    """The command ``path`` (``phalanx experiment hbn``) that runs the study ``name`` resolves to (a registered
    name, an entry point, a ``module:attr`` spec): the shared options (:func:`_study_options`) and the executor's
    (:func:`~phalanx.executor_cli.executor_options`), then :func:`_run_study`."""
    from phalanx import studies

    study = studies.resolve(name)

    def command(*, preset_name: str, out: Path, seeds: int, jobs: int | None, set_: list[str] | None,
                executor: ExecutorChoice | None = None) -> None:
        _run_study(study(), path, preset_name, out, seeds, jobs, set_ or [], executor)

    params = _study_options(study)
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    single = typer.Typer(add_completion=False)
    single.command(path.rsplit(" ", 1)[-1], help=study.help)(executor_options(command))
    return typer.main.get_command(single)


def _run_study(
    study: Study[Any, Any, Any], path: str, preset_name: str, out: Path, seeds: int, jobs: int | None,
    sets: list[str], executor: ExecutorChoice | None,
) -> None:
    """One study command, the same for every study: its preset from the options, its grid trained into
    ``out/runs`` (finished runs skipped), then its tables, files and terminal output from the ended runs."""
    from phalanx.experiments import grid, store

    p, overrides = study.configure(preset_name, seeds, sets)
    cells, cfgs = study.plan(p, overrides)
    runs = study.runs(cfgs)
    console.print(study.summary(p, cells, runs, out))
    named = study.presets.get(p.name)
    if named is not None:  # the description above is the preset's as named: say what --set changed in it
        changed = [f"{k}={getattr(p, k)!r}" for k in p.__dataclass_fields__
                   if k not in ("seeds", "dataset") and getattr(p, k) != getattr(named, k)]
        changed += [f"{k}={v!r}" for k, v in overrides.items()]  # run keys set on every run
        if changed:
            console.print(f"[bold]changed from preset {p.name}[/bold] (its description above does not say so): "
                          + ", ".join(changed), soft_wrap=True)
    note = study.data_note
    if note is not None:
        console.print(f"[bold yellow]warning:[/bold yellow] {note}", soft_wrap=True)
    t0 = time.perf_counter()
    runs_dir = out / "runs"
    done_before = sum(store.is_finished(runs_dir / grid.run_id(c)) for c in runs)
    _train(runs, runs_dir, jobs or _cpu_jobs(), executor)
    # the wall time of the whole grid, or none: a resumed command timed only what was left
    wall = time.perf_counter() - t0 if not done_before else None
    if done_before:
        console.print(f"{done_before} of {len(runs)} runs had finished before this command: the report gives no wall "
                      "time (this command timed only the rest)", soft_wrap=True)
    command = f"{path} --preset {preset_name} --seeds {seeds}" + "".join(f" --set {o}" for o in sets)
    report = study.report(p, cells, study.collect(cells, cfgs, runs_dir), out, command=command, wall_seconds=wall,
                          runs=len(runs), overrides=overrides)
    if note is not None:  # the report says it too, under its title, where a reader of the file sees it first
        from phalanx.experiments.store import atomic_write_text

        md = out / "report.md"
        if md.exists():
            title, _, rest = md.read_text().partition("\n")
            atomic_write_text(md, f"{title}\n\n> **Warning: {note}.**\n{rest}")
    for item in report.terminal:
        if isinstance(item, str):
            typer.echo(item)
        else:
            console.print(item)
    if note is not None:
        console.print(f"[bold yellow]warning:[/bold yellow] {note}", soft_wrap=True)
    console.print("written: " + ", ".join(str(w) for w in report.files))


@tension_app.command("plan")
@executor_options
def tension_plan(
    config: Annotated[Path | None, typer.Argument(help="Your run config (TOML; default: the built-in job).")] = None,
    expect: Annotated[int, typer.Option("--expect-byzantine", "-k", min=0, help="Byzantine workers you expect.")] = 1,
    rules: Annotated[str | None, typer.Option("--rules", help="Comma-separated aggregator specs.")] = None,
    fs: Annotated[str | None, typer.Option("--f", help="Comma-separated f values (default: K/2, K, 2K).")] = None,
    attacks_: Annotated[str | None, typer.Option("--attacks", help="Comma-separated attacks.")] = None,
    tolerance: Annotated[float | None, typer.Option(
        "--tolerance", min=0, max=50, help="Accuracy points within which worst cases count as equal (default: one "
        "test sample, or the seeds' 95 % spread of the worst cases when wider).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key of the config (repeatable).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("runs/plan"),
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help="Processes (default: cores).")] = None,
    fmt: FormatOption = "table",
    executor: ExecutorChoice | None = None,
) -> None:
    """Your task, every rule × f, with no attack and under strong attacks: the trade-off table and a recommendation."""
    from phalanx import data as data_module
    from phalanx.studies import planner

    fmt = check_format(fmt)
    say = console if fmt == "table" else _STDERR  # with --format, stdout holds the table alone

    def split(text: str | None) -> list[str] | None:
        return None if text is None else [t.strip() for t in text.split(",") if t.strip()]

    f_values = split(fs)
    try:
        f_list = None if f_values is None else [int(v) for v in f_values]
    except ValueError:
        raise typer.BadParameter(f"--f={fs!r}: comma-separated integers, e.g. 1,2,4") from None
    data, slurm_table = _split_slurm(_load_grid(config, set_ or []))
    if config is None:  # the built-in job's comparison lists are not a plan's: the planner's own attacks, one seed
        given = {o.split("=", 1)[0].strip() for o in set_ or []}
        for key in ("attack", "seed"):
            if isinstance(data.get(key), list) and key not in given:
                data.pop(key)
    plan = planner.make_plan(data, expect=expect, rules=split(rules), fs=f_list,
                             attacks=split(attacks_))
    say.print(f"[bold]plan[/bold]: rules {', '.join(plan.rules)}; f ∈ {plan.fs}; attacks "
              f"{', '.join(plan.attacks) if expect else '(none: K = 0)'}; K = {expect}; seeds {plan.seeds}; "
              f"{len(plan.configs)} runs → {out}")
    for note in plan.skipped:
        say.print(f"[yellow]skipped[/yellow] {note}")
    _train(plan.configs, out / "runs", jobs or _cpu_jobs(), executor, slurm_table, plain=fmt != "table")
    rows = planner.final_rows(plan, out / "runs")
    first = plan.configs[0]
    test_samples = len(data_module.load(first.dataset, root=first.data_root).test_y)
    tol = planner.derived_tolerance(rows, test_samples) if tolerance is None else tolerance / 100
    rec = planner.recommend(rows, expect, tol, workers=first.workers)
    heads = ["rule", "f", "no attack %", "cost", "agg. error"] + ([*plan.attacks, "worst %"] if expect else [])
    table = Tabular(f"Price of robustness on your task (n = {plan.configs[0].workers}, K = {expect})",
                    [*heads, "seeds", "pick"], right=[*heads[1:], "seeds"], compact=True)
    for r in rows:
        cells = [r.rule, r.f_label, planner.with_interval(r.no_attack, r.no_attack_ci), f"{100 * r.cost:+.1f}",
                 _fmt(r.agg_error)]
        if expect:
            cells += [f"{100 * r.under_attack[a]:.1f}" if a in r.under_attack else "—" for a in plan.attacks]
            cells.append(planner.with_interval(r.worst, r.worst_ci) if r.worst is not None else "—")
        cells += [str(r.seeds), "★" if (r.rule, r.f) == (rec.rule, rec.f) else ""]
        table.add(*cells)
    table.notes += [f"{rule}: its output does not depend on f (checked on random rows), so it ran once (f: any)"
                    for rule in sorted(plan.f_free)]
    table.notes.append(f"★ {rec.text}")
    emit(table, fmt, console)
    written = planner.write_outputs(rows, plan, rec, out)
    say.print("written: " + ", ".join(str(w) for w in written))


def main() -> None:
    """Entry point of the ``phalanx`` script: configuration errors become one clear line, exit code 2; a grid stopped
    by SIGINT / SIGTERM one line too (how many runs finished, how to resume), exit code 130 / 143."""
    import signal
    import sys

    from rich.markup import escape

    try:
        app()
    except PhalanxError as exc:
        # one line, as the error says it: no wrapping at the terminal's width, no markup read from the message
        code = getattr(exc, "exit_code", None)
        prefix = "[red]error:[/red] " if code is None else ""
        console.print(f"{prefix}{escape(str(exc))}", soft_wrap=True, highlight=False)
        raise SystemExit(2 if code is None else code) from None
    except BaseException as exc:
        signals = sys.modules.get("phalanx.experiments.signals")  # loaded by every command that handles signals
        if signals is None or not isinstance(exc, signals.StopRequested):
            raise
        # a signal between two steps of a command (outside a run): every file written so far is complete
        console.print(f"interrupted by {signal.Signals(exc.signum).name}: run the same command again to go on "
                      "(finished runs are skipped)", soft_wrap=True, highlight=False)
        raise SystemExit(128 + exc.signum) from None


if __name__ == "__main__":  # pragma: no cover
    main()
