"""Studies as commands: ``phalanx experiment NAME`` and ``phalanx tension paper|convergence`` made on demand from
the study registry, their options from the study's preset, and ``phalanx tension plan``."""

from __future__ import annotations

import functools
import inspect
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import click
import typer
from typer.core import TyperGroup

from phalanx import catalogue
from phalanx.cli.common import _STDERR, app, console
from phalanx.cli.common import console as _console
from phalanx.cli.output import FormatOption, Tabular, check_format, emit, emit_all, emit_terminal, titled
from phalanx.cli.runs import _forewarn, _load_grid, _split_slurm, _train, smaller_preset, study_smaller
from phalanx.executor_cli import ExecutorChoice, executor_options

if TYPE_CHECKING:
    from phalanx.studies import Study



class _StudyGroup(TyperGroup):
    """A command group whose study commands are made when one is asked for, from the study registry
    (:mod:`phalanx.studies`): a study's module — a plug-in's too — is imported only then. The group's own help page
    lists the built-in studies from :mod:`phalanx.catalogue` (name and help, no torch); a plug-in study's line is
    its command's, made from its class."""

    prefix: ClassVar[str]
    """The group's command line, as a study's report quotes it."""
    aliases: ClassVar[dict[str, str] | None] = None
    """Command → study; None: every study :func:`phalanx.studies.names` lists, under its own name, and any
    ``module:attr`` spec of a study."""

    _help_only = False
    """True while the group's own help page is written: its study commands are then listed from the catalogue."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        if self.aliases is not None:
            return [*super().list_commands(ctx), *self.aliases]
        # from the torch-free catalogue: the built-ins, and installed plug-ins' entry points by name, unloaded
        return [*super().list_commands(ctx), *catalogue.names(catalogue.STUDIES, catalogue.STUDY_GROUP)]

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._help_only = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._help_only = False

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        study = cmd_name if self.aliases is None else self.aliases.get(cmd_name)
        if self._help_only and study in catalogue.STUDIES:
            # the group's help lists each command with its help alone: a declared study's, without importing it
            return click.Command(cmd_name, help=catalogue.STUDIES[study].help)
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


def _cpu_jobs() -> int:
    import os

    return max(1, os.cpu_count() or 1)


def _study_options(study: type[Study[Any, Any, Any]]) -> list[inspect.Parameter]:
    """The options every study command has, with the study's defaults and help."""
    help_preset = study.preset_help or "One of " + ", ".join(study.presets) + "."
    options: dict[str, tuple[Any, Any]] = {
        "preset_name": (Annotated[str, typer.Option("--preset", help=help_preset)], study.default_preset),
        "out": (Annotated[Path, typer.Option("--out", help="Output directory.")], Path(study.out)),
        "seeds": (Annotated[int, typer.Option("--seeds", min=2, help="Seeds per cell (0 … seeds−1; they replace "
                                                  "the preset's own seeds).")], 3),
        "jobs": (Annotated[int | None, typer.Option("--jobs", "-j", min=1, help="Processes (default: cores).")], None),
        "set_": (Annotated[list[str] | None, typer.Option("--set", help="Override a preset field or run key: --set "
                                                          f"{study.set_example}.")], None),
    }
    options["fmt"] = (FormatOption, "table")
    if study.raw_value is not None:
        options["results"] = (Annotated[Path | None, typer.Option(
            "--results", help="Report from a raw-results file (the runs.csv a report wrote; docs/results/) instead "
            "of training: no run is trained.")], None)
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
                executor: ExecutorChoice | None = None, results: Path | None = None, fmt: str = "table") -> None:
        _run_study(study(), path, preset_name, out, seeds, jobs, set_ or [], executor, results, fmt)

    params = _study_options(study)
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    single = typer.Typer(add_completion=False)
    single.command(path.rsplit(" ", 1)[-1], help=study.help)(executor_options(command))
    return typer.main.get_command(single)


def _run_study(
    study: Study[Any, Any, Any], path: str, preset_name: str, out: Path, seeds: int, jobs: int | None,
    sets: list[str], executor: ExecutorChoice | None, results: Path | None = None, fmt: str = "table",
) -> None:
    """One study command, the same for every study: its preset from the options, its grid trained into
    ``out/runs`` (finished runs skipped), then its tables, files and terminal output from the ended runs — or, with
    ``results``, from that raw-results file, nothing trained. A study with ``raw_value`` writes ``out/runs.csv``.
    With ``fmt`` other than ``table``, stdout holds the report's tables alone in that format
    (:func:`~phalanx.cli.output.tables_of`) and everything else goes to stderr."""
    from phalanx.experiments import store
    from phalanx.studies import raw

    fmt = check_format(fmt)
    console = _console if fmt == "table" else _STDERR  # with --format, stdout holds the tables alone
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
    command = f"{path} --preset {preset_name} --seeds {seeds}" + "".join(f" --set {o}" for o in sets)
    wall: float | None = None
    if results is not None and study.raw_value is not None:  # the report again from its raw results: no training
        collected = raw.read(results, *study.raw_cells(p, cells, cfgs), study.raw_value)
        console.print(f"from the raw results {results}: nothing trained", soft_wrap=True)
    else:
        smallest = "quick" if "quick" in study.presets else None
        if study.timing is not None:  # its own in-process work, which the grid's estimate never sees
            own = study.smaller.replace("{preset}", smaller_preset(preset_name, smallest))  # (a plug-in's braces kept)
            _forewarn("study", study.timing, functools.partial(study.estimate, p, cells), own, err=fmt != "table")
        t0 = time.perf_counter()
        runs_dir = out / "runs"
        done_before = sum(store.is_finished(runs_dir / i) for i in raw.run_ids(runs))
        _train(runs, runs_dir, jobs or _cpu_jobs(), executor, plain=fmt != "table",
               smaller=study_smaller(preset_name, smallest))
        # the wall time of the whole grid, or none: a resumed command timed only what was left
        wall = time.perf_counter() - t0 if not done_before else None
        if done_before:
            console.print(f"{done_before} of {len(runs)} runs had finished before this command: the report gives no "
                          "wall time (this command timed only the rest)", soft_wrap=True)
        collected = study.collect(cells, cfgs, runs_dir)
    report = study.report(p, cells, collected, out, command=command, wall_seconds=wall, runs=len(runs),
                          overrides=overrides)
    if study.raw_value is not None:
        rows = study.raw_cells(p, cells, cfgs)
        store.atomic_write_text(out / "runs.csv", raw.write(*rows, collected, study.raw_value))
        report = type(report)([*report.files, out / "runs.csv"], report.terminal)
    if note is not None:  # the report says it too, under its title, where a reader of the file sees it first
        from phalanx.experiments.store import atomic_write_text

        md = out / "report.md"
        if md.exists():
            title, _, rest = md.read_text().partition("\n")
            atomic_write_text(md, f"{title}\n\n> **Warning: {note}.**\n{rest}")
    written = out / "report.md"
    items = titled(report.terminal, written.read_text() if written.exists() else "")  # untitled tables: the report's
    if fmt != "table":
        emit_all([t for t in items if isinstance(t, Tabular)], fmt, _console)
    if fmt == "table":
        emit_terminal(items, console)
    if note is not None:
        console.print(f"[bold yellow]warning:[/bold yellow] {note}", soft_wrap=True)
    console.print("written: " + ", ".join(str(w) for w in report.files))


@tension_app.command("plan")
@executor_options
def tension_plan(
    config: Annotated[Path | None, typer.Argument(help="Your run config (TOML; default: the built-in job).")] = None,
    expect: Annotated[int, typer.Option("--expect-byzantine", "-k", min=0, help="Byzantine workers you expect.")] = 1,
    rules: Annotated[str | None, typer.Option("--rules", help="Comma-separated aggregator specs.")] = None,
    fs: Annotated[str | None, typer.Option("--f", "-f", help="Comma-separated f values (default: K/2, K, 2K).")] = None,
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
    from phalanx.experiments.report import format_agg_error
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
    _train(plan.configs, out / "runs", jobs or _cpu_jobs(), executor, slurm_table, plain=fmt != "table",
           smaller="fewer rules (--rules), f values (--f) or attacks (--attacks), fewer seeds or rounds (--set "
           "seed=0, --set rounds=…), or more processes (--jobs); Ctrl-C stops it cleanly and the same command "
           "resumes.")
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
                 format_agg_error(r.agg_error)]
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
