"""Every study command takes ``--format table|md|csv|json``: its report's tables — rich tables or Markdown pipe
tables in what the report prints — on stdout alone, everything else on stderr."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rich.table import Table
from typer.testing import CliRunner

from phalanx import cli
from phalanx.cli.output import tables_of

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "tension_quick_runs.csv"

MARKDOWN = """**Accuracy (mean ± sd over seeds)**

| rule | attack | accuracy |
|---|---|---:|
| cwtm | alie | 71.2 ± 1.0 |
| a \\| b | none | 80.0 |

Comparisons, Holm-adjusted:

| comparison | p |
|---|---:|
| cwtm vs mean | 0.04 |
the readout line"""


def test_markdown_and_rich_tables_are_read_with_their_titles_and_cells() -> None:
    rich = Table(title="T1: mean")
    rich.add_column("f")
    rich.add_column("α = 0.1")
    rich.add_row("0", "80.9")
    tables, text = tables_of([MARKDOWN, rich])
    assert [t.title for t in tables] == ["Accuracy (mean ± sd over seeds)", "Comparisons, Holm-adjusted:", "T1: mean"]
    assert tables[0].columns == ["rule", "attack", "accuracy"]
    assert tables[0].rows == [["cwtm", "alie", "71.2 ± 1.0"], ["a | b", "none", "80.0"]]  # an escaped pipe kept
    assert tables[1].rows == [["cwtm vs mean", "0.04"]]
    assert tables[2].rows == [["0", "80.9"]]
    assert text == ["**Accuracy (mean ± sd over seeds)**", "Comparisons, Holm-adjusted:", "the readout line"]


def test_a_line_of_pipes_without_a_separator_is_prose_not_a_table() -> None:
    tables, text = tables_of(["| not a table |\njust words"])
    assert tables == [] and text == ["| not a table |", "just words"]


def test_a_study_prints_its_tables_alone_on_stdout_in_each_format(tmp_path: Path) -> None:
    """``tension paper`` rebuilt from its committed raw results (nothing trained): csv and json parse whole, the
    progress and the 'written:' line are on stderr."""
    args = ["tension", "paper", "--preset", "quick", "--results", str(RESULTS), "--out", str(tmp_path)]
    res = CliRunner().invoke(cli.app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    titles = [t["title"] for t in data["tables"]]
    assert titles[0].startswith("T3: ") and any(t.startswith("Trends") for t in titles)
    assert "written:" in res.stderr and "written:" not in res.stdout
    res = CliRunner().invoke(cli.app, [*args, "--format", "csv"])
    assert res.exit_code == 0, res.output
    blocks = res.stdout.split("\n\n")
    assert len(blocks) == len(titles)
    first = list(csv.reader(line for line in blocks[0].partition("\n")[2].splitlines() if not line.startswith("# ")))
    assert first[0][0] == "f" and len(first) > 2
    res = CliRunner().invoke(cli.app, [*args, "--format", "xml"])
    assert res.exit_code != 0 and "--format='xml'" in res.output


def test_an_untitled_table_in_markdown_has_no_empty_bold_line() -> None:
    """A report's second table under one heading has no title: ``--format md`` printed ``****`` above it (the
    backdoor study's trend table)."""
    from phalanx.cli.output import Tabular, render

    assert render(Tabular("", ["rule", "p"], [["cwtm", "1"]]), "md").splitlines()[0] == "| rule | p |"
    assert render(Tabular("T", ["rule"], [["cwtm"]]), "md").splitlines()[:2] == ["**T**", ""]


def test_an_aggregation_error_at_rounding_level_is_shown_as_such() -> None:
    """The mean with no attack returned the honest mean up to the order of a float sum (4.75e-16, then 4.72e-16 after
    an unrelated change): a quoted table changed with it. Below 1e-12 it is shown as ``< 1e-12``; a real error keeps
    its three digits (the mutant threshold 1e-2 would hide 0.00774, the mean's error under attack)."""
    from phalanx.experiments.report import format_agg_error

    assert [format_agg_error(v) for v in (4.75e-16, 0.0, 4.72e-16)] == ["< 1e-12"] * 3
    assert [format_agg_error(v) for v in (0.00774, 2e-12, None, float("inf"))] == ["0.00774", "2e-12", "—", "∞"]


def test_an_untitled_study_table_takes_the_reports_heading_and_says_what_its_cells_are() -> None:
    """Issue 38: backdoor's, privacy's and the neighbours' first tables printed untitled, so "92.2 ± 2.2" never said
    it was a 95 % half-width; tension paper's rich tables lost their titles on the terminal. Now an untitled table
    takes the heading above the same header row in report.md, and the report's "Cells: …" sentence as its note; a
    rich table keeps its own title. Mutants: ``pieces`` alone (no title, no note); blanking every title."""
    import io

    from rich.console import Console
    from rich.table import Table

    from phalanx.cli import output

    report = ("# A study\n\nSetup: n = 20. Cells: final test accuracy %, mean ± 95 % Student-t half-width over the "
              "seeds. Seeds [0, 1, 2].\n\n## Final test accuracy %\n\n"
              "| rule | no DP |\n|---|---|\n| cwtm | 94.6 ± 1.2 |\n")
    terminal = ["| rule | no DP |\n|---|---|\n| cwtm | 94.6 ± 1.2 |"]
    (got,) = [p for p in output.titled(terminal, report) if isinstance(p, output.Tabular)]
    assert got.title == "Final test accuracy %"
    assert got.notes == ["Cells: final test accuracy %, mean ± 95 % Student-t half-width over the seeds."]
    (bare,) = [p for p in output.pieces(terminal) if isinstance(p, output.Tabular)]
    assert bare.title == "" and not bare.notes  # what the check rejects
    rich = Table(title="T3 — Multi-Krum, f = 0 … 7")
    rich.add_column("f")
    rich.add_row("0")
    buf = io.StringIO()
    output.emit_terminal(output.titled([rich], ""), Console(file=buf, width=100))
    assert "T3 — Multi-Krum" in buf.getvalue()
