"""What holds for every command alike (issue 38, a newcomer's trial): every ``--format`` gives the terminal's table,
``-f`` and ``--f`` are both spellings of f wherever f is an option, no ``--help`` crops a line at 80 columns, and a
misspelt preset gets a "did you mean".

Each check walks the app's commands (the study commands made on demand included), so a command added later is
checked too, and each has a mutant the check must reject."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator

import click
import pytest
import typer
from typer.testing import CliRunner

from phalanx import cli
from phalanx.cli import output
from phalanx.cli.output import Tabular

runner = CliRunner()

CHEAP = [["list", "aggregators"], ["list", "attacks"], ["list", "algorithms"], ["list", "stages"],
         ["list", "datasets"], ["list", "models"], ["list", "sections"], ["demo", "-d", "64"],
         ["tension", "theory", "-n", "6"],
         ["tension", "theory", "-n", "6", "--rules", "cwtm,krum", "--measure", "--trials", "2", "--budget", "4",
          "--kappa-budget", "4"]]
"""Every table-printing command cheap enough for a test (``report``, ``status``, ``audit``, ``run``, ``tension plan``
and the studies need runs: tests/test_format_audit_report.py and tests/test_study_format.py read theirs back)."""


def _terminal_tables(args: list[str], monkeypatch: pytest.MonkeyPatch) -> list[Tabular]:
    """The tables ``args`` draws on the terminal (``--format table``), as the renderer receives them."""
    drawn: list[Tabular] = []
    real = output._terminal
    monkeypatch.setattr(output, "_terminal", lambda t, console: (drawn.append(t), real(t, console))[1])
    monkeypatch.setenv("PHALANX_BUDGET_MINUTES", "off")
    res = runner.invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    monkeypatch.setattr(output, "_terminal", real)
    return drawn


def _as_printed(args: list[str], fmt: str) -> list[tuple[str, list[str], int]]:
    """(title, columns, number of rows) of each table ``args`` prints with ``--format fmt``, read back as a reader
    of that format would: md by the study reports' Markdown table reader, csv with a CSV reader (a ``# title`` line
    before each table), json with a JSON parser."""
    res = runner.invoke(cli.app, [*args, "--format", fmt], env={"PHALANX_BUDGET_MINUTES": "off"})
    assert res.exit_code == 0, res.output
    if fmt == "json":
        return [(t["title"], t["columns"], len(t["rows"])) for t in json.loads(res.stdout)["tables"]]
    if fmt == "md":
        bold = [line.strip("*") for line in res.stdout.splitlines() if line.startswith("**")]
        tables, _ = output.tables_of([res.stdout])
        assert len(bold) == len(tables), res.stdout  # each table under its bold title
        return [(title, list(t.columns), len(t.rows)) for title, t in zip(bold, tables)]
    found: list[tuple[str, list[str], int]] = []
    for block in res.stdout.split("\n\n"):  # a blank line between tables, each after its "# title" line
        title, _, body = block.partition("\n")
        assert title.startswith("# "), res.stdout  # the csv of one table had no title line (issue 38)
        table = "\n".join(line for line in body.splitlines() if not line.startswith("# "))  # its notes: "# " lines
        rows = list(csv.reader(io.StringIO(table)))
        found.append((title[2:], rows[0], len(rows) - 1))
    return found


def _differences(args: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    terminal = [(t.title, list(t.columns), len(t.rows)) for t in _terminal_tables(args, monkeypatch)]
    return [f"{fmt}: {printed} != {terminal}" for fmt in ("md", "csv", "json")
            if (printed := _as_printed(args, fmt)) != terminal]


@pytest.mark.parametrize("args", CHEAP, ids=" ".join)
def test_every_format_gives_the_terminals_table(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """md, csv and json carry the terminal table's title, columns and rows (issue 38: ``tension theory --measure
    --format md`` dropped "worst input", csv and json printed 15 raw fields, and a single table's csv had no
    ``# title`` line)."""
    assert _differences(args, monkeypatch) == []


def test_a_format_dropping_a_column_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: Markdown drops a table's last column — the check above names md."""
    real = output.render

    def dropping(t: Tabular, fmt: str) -> str:
        if fmt != "md":
            return real(t, fmt)
        return real(Tabular(t.title, t.columns[:-1], [r[:-1] for r in t.rows], t.notes, t.right), fmt)

    monkeypatch.setattr(output, "render", dropping)
    found = _differences(["list", "attacks"], monkeypatch)
    assert len(found) == 1 and found[0].startswith("md: ")


def _commands() -> Iterator[tuple[list[str], click.Command]]:
    """Every command of the app with its path, the groups' own and the study commands made on demand."""
    root = typer.main.get_command(cli.app)

    def walk(cmd: click.Command, path: list[str], ctx: click.Context) -> Iterator[tuple[list[str], click.Command]]:
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None:
                    yield from walk(sub, [*path, name], click.Context(sub, parent=ctx, info_name=name))

    yield from walk(root, [], click.Context(root, info_name="phalanx"))


def _one_spelling_of_f(commands: Iterator[tuple[list[str], click.Command]]) -> list[str]:
    """The commands with an f option that lack ``-f`` or ``--f``."""
    return [" ".join(path) for path, cmd in commands for p in cmd.params
            if isinstance(p, click.Option) and {"-f", "--f"} & set(p.opts) and not {"-f", "--f"} <= set(p.opts)]


def test_f_is_both_minus_f_and_minus_minus_f_everywhere() -> None:
    """Issue 38: ``phalanx epsilon cwtm -n 16 -f 3`` said "No such option '-f'" — ``kappa`` took ``-f``, ``epsilon``
    only ``--f``. Every command with an f option takes both (demo, epsilon, kappa, list aggregators, tension plan)."""
    commands = list(_commands())
    with_f = {" ".join(path) for path, cmd in commands for p in cmd.params
              if isinstance(p, click.Option) and "--f" in p.opts}
    assert {"demo", "epsilon", "kappa", "list aggregators", "tension plan"} <= with_f
    assert _one_spelling_of_f(iter(commands)) == []
    res = runner.invoke(cli.app, ["epsilon", "cwtm", "-n", "8", "-f", "2", "--trials", "2", "--budget", "0"])
    assert res.exit_code == 0 and "cwtm (n = 8, f = 2)" in res.output, res.output


def test_a_command_with_one_spelling_of_f_is_caught() -> None:
    """The mutant: the old ``epsilon``, ``--f`` alone."""
    app = typer.Typer()

    @app.command()
    def old(f: int = typer.Option(3, "--f")) -> None:  # pragma: no cover - never run
        """epsilon before issue 38."""

    assert _one_spelling_of_f(iter([(["epsilon"], typer.main.get_command(app))])) == ["epsilon"]


CROP = re.compile(r"[^\s…]…")
"""Rich's crop: a word cut and "…" put in its place (``multik…``); the help's own ellipses (``0 … seeds−1``,
``torchrun … -m``) stand between spaces."""


def _cropped(app: typer.Typer | click.Command, args: list[str]) -> list[str]:
    res = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert res.exit_code == 0, res.output
    return [line for line in res.output.splitlines() if CROP.search(line)]


def test_no_help_crops_a_line_at_80_columns() -> None:
    """Issue 38: ``tension theory --help`` at 80 columns showed "[default: cwtm,cwmed,geomed,krum,multik…"; the
    default now is in the help's words, which wrap. Every command's help, at 80 columns, crops nothing."""
    found = {" ".join(path): lines for path, _ in _commands() if (lines := _cropped(cli.app, path))}
    assert found == {}


RST = re.compile(r":(func|class|mod|meth|attr|data):`|``")
"""reStructuredText markup (a docstring's cross-reference or literal) that a --help page would show as it is."""


def _markup(app: typer.Typer | click.Command, args: list[str]) -> list[str]:
    res = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "100", "TERMINAL_WIDTH": "100"})
    assert res.exit_code == 0, res.output
    return [line.strip() for line in res.output.splitlines() if RST.search(line)]


def test_no_help_shows_source_markup() -> None:
    """A first-hour review: ``audit --help`` showed ":func:`audit_tables`", ``list``, ``config show`` double
    backticks. No command's help shows reStructuredText markup; the mutant (a docstring with ``--tree``) is caught."""
    found = {" ".join(path): lines for path, _ in _commands() if (lines := _markup(cli.app, path))}
    assert found == {}
    app = typer.Typer()

    @app.command()
    def show(flat: bool = False) -> None:  # pragma: no cover - never run
        """Print the config: its tree (``--tree``) or its flat keys."""

    assert _markup(app, []) != []


def test_a_cropped_default_is_caught() -> None:
    """The mutant: the old ``--rules``, its long default shown as a default."""
    from phalanx.cli.analysis import THEORY_RULES

    app = typer.Typer()

    @app.command()
    def theory(rules: str = typer.Option(",".join(THEORY_RULES), "--rules", help="Comma-separated aggregator "
                                         "specs.")) -> None:  # pragma: no cover - never run
        """tension theory before issue 38."""

    assert _cropped(app, []) != []


def test_the_theory_default_rules_are_the_analysis_defaults() -> None:
    """The CLI spells its default rules out (for its help, without importing torch): the same as the analysis."""
    from phalanx.analysis import tension
    from phalanx.cli.analysis import THEORY_RULES

    assert THEORY_RULES == tension.DEFAULT_RULES


@pytest.mark.parametrize("args", [["experiment", "hbn"], ["tension", "paper"]])
def test_a_misspelt_preset_gets_a_did_you_mean(args: list[str], capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: ``--preset quik`` listed the presets and nothing more; now one line with the closest name."""
    monkeypatch.setattr("sys.argv", ["phalanx", *args, "--preset", "quik"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    out = capsys.readouterr().out
    assert "preset='quik' is invalid: allowed one of " in out and "(did you mean quick?)" in out


def test_a_misspelt_preset_field_gets_a_did_you_mean() -> None:
    from phalanx.errors import ConfigError
    from phalanx.studies import hbn
    from phalanx.studies.reporting import pick_preset

    with pytest.raises(ConfigError, match=r"did you mean rules\?"):
        pick_preset(hbn.PRESETS, "quick", {"rulez": ["cwtm"]}, ())


@pytest.mark.parametrize("args", [["epsilon", "cwtm", "-n", "6", "-f", "1", "--trials", "5", "--budget", "20"],
                                  ["kappa", "cwtm", "-n", "6", "-f", "1", "--budget", "20"]])
def test_the_searches_run_at_one_thread(args: list[str]) -> None:
    """``epsilon`` and ``kappa`` search at one intra-op thread (tiny tensors; at two threads a busy machine stalled
    them 25–50×, and one fixed count gives one result everywhere), and give the process its count back when they
    end. Mutant: a command that keeps the process's count searches at 2."""
    import torch

    import phalanx.analysis

    seen: list[int] = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.MonkeyPatch.context() as patch:
            name = args[0]  # the CLI imports the search from phalanx.analysis when it runs
            real = getattr(phalanx.analysis, name)

            def spy(*a: object, **k: object) -> object:
                seen.append(torch.get_num_threads())
                return real(*a, **k)

            patch.setattr(phalanx.analysis, name, spy)
            result = CliRunner().invoke(cli.app, args)
        assert result.exit_code == 0, result.output
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
