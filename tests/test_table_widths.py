"""Terminal tables never lose a digit, a name or a column, at any width (issue 38): at 80 columns the old renderer
cropped ``+7.0`` to ``+7.``, ``any`` to ``an``, ``nnm>cwtm`` to ``nnm>cw`` and headers to ``cos``; at 60 it dropped
the verdict column. :func:`phalanx.cli.output.emit` now folds text at spaces only, keeps names and numbers whole, and
prints one block per row when even that does not fit. The property, at widths 40, 60, 80, 120 and piped: every
word of every cell and header appears whole in the output, no ``…`` is added, and a table's lines fit the width. The
mutant: the cropping renderer it replaced fails the property."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich import box
from rich.console import Console
from rich.table import Table
from tests._tiny_grid import tiny_grid
from typer.testing import CliRunner

from phalanx import cli
from phalanx.cli import listing, runs, studies
from phalanx.cli.output import PIPE_WIDTH, Tabular, emit, tables_of, widths

WIDTHS = (40, 60, 80, 120, PIPE_WIDTH)
_SPLIT = re.compile(r"[\s│┃║]+")


def _plan() -> Tabular:
    """The newcomer's ``tension plan --expect-byzantine 4`` table (the constructor of :mod:`phalanx.cli.studies`)."""
    attacks = ["alie", "foe", "signflip", "minmax"]  # the planner's default attacks
    heads = ["rule", "f", "no attack %", "cost", "agg. error", *attacks, "worst %"]
    t = Tabular("Price of robustness on your task (n = 10, K = 4)", [*heads, "seeds", "pick"],
                right=[*heads[1:], "seeds"], compact=True)
    t.add("mean", "0", "94.7 ± 0.9", "+0.0", "0.0123", "12.3", "9.8", "45.6", "90.1", "9.8 ± 1.2", "3", "")
    t.add("nnm>cwtm", "any", "94.6 ± 0.8", "+7.0", "1.23", "94.6", "93.0", "92.1", "91.0", "91.0 ± 0.7", "3", "★")
    t.add("cwtm", "4", "93.1 ± 1.1", "-1.6", "∞", "—", "92.2", "90.0", "89.9", "89.9 ± 2.0", "3", "")
    t.notes.append("★ nnm>cwtm (f: any): within 1.0 points of the best under every attack")
    return t


def _tradeoff() -> Tabular:
    """``report``'s price-and-rescue table: a verdict sentence in the one column that folds."""
    cols = ["rule", "aggregator_params.tau", "attack", "price (pts)", "p (price)", "rescue (pts)", "p (rescue)",
            "seeds", "verdict"]
    t = Tabular("The price and rescue of robustness (vs mean, paired by seed)", cols, compact=True,
                right=("price (pts)", "p (price)", "rescue (pts)", "p (rescue)", "seeds"), wrap=("verdict",))
    t.add("cwtm", "0.25", "signflip", "−0.4 ± 1.3", "p = 0.41", "+81.9 ± 3.2", "p = 0.002", "5",
          "no measurable price; rescues the mean under attack")
    t.add("geomed", "—", "alie", "−2.1 ± 0.6", "p = 0.01", "+0.3 ± 0.9", "p = 0.52", "5",
          "costs accuracy with no attack and rescues nothing measurable")
    return t


def _status() -> Tabular:
    """``status``: a long run id (a name one greps for) and a detail sentence."""
    t = Tabular("runs/my-very-long-experiment-directory-name: 2 runs", ("run", "status", "round", "detail"),
                right=("round",))
    t.add("aggregator=nnm>cwtm,attack=signflip,seed=0-1a2b3c4d", "failed", "12",
          "ConfigError: aggregator_params.tau=0.7: allowed 0 ≤ tau < 0.5")
    t.add("aggregator=mean,attack=none,seed=1-9f8e7d6c", "done", "200", "")
    return t


TABLES: dict[str, Callable[[], Tabular]] = {"plan": _plan, "tradeoff": _tradeoff, "status": _status}


def _old_emit(t: Tabular, fmt: str, console: Console) -> None:
    """The mutant: the renderer before issue 38's fix — rich's own widths, ``overflow="fold"`` and ``no_wrap`` on the
    compact tables' columns, so a cell wider than its column was cropped."""
    table = (Table(title=t.title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True) if t.compact
             else Table(title=t.title))
    for c in t.columns:
        whole = c in t.whole or (t.compact and c not in t.wrap)
        table.add_column(c, justify="right" if c in t.right else "left", overflow="fold", no_wrap=whole)
    for r in t.rows:
        table.add_row(*r)
    console.print(table)
    for line in t.notes:
        console.print(line, soft_wrap=True, highlight=False, markup=False)


def _render(t: Tabular, width: int, renderer: Callable[[Tabular, str, Console], None] = emit) -> str:
    buf = io.StringIO()
    renderer(t, "table", Console(file=buf, width=width, color_system=None, force_terminal=False))
    return buf.getvalue()


def _missing(t: Tabular, out: str) -> list[str]:
    """What of ``t`` the output lost: a header's or a cell's word that is not a whole word of some line, or a
    ``…`` the table did not hold."""
    tokens = {tok for line in out.splitlines() for tok in _SPLIT.split(line)}
    texts = [*t.columns, *(cell for r in t.rows for cell in r)]
    lost = [w for text in texts for w in text.split() if w not in tokens]
    if "…" in out and not any("…" in text for text in texts):
        lost.append("…")
    return lost


def _whole_cells_lost(t: Tabular, out: str) -> list[str]:
    """Cells of the columns that never fold (names, numbers) that are not on one line of the output as they are."""
    lines = out.splitlines()
    keep = [i for i, c in enumerate(t.columns) if c in t.whole or c in t.right or (t.compact and c not in t.wrap)]
    return [r[i] for r in t.rows for i in keep if r[i] and not any(r[i] in line for line in lines)]


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("width", WIDTHS)
def test_no_table_loses_a_word_at_any_width(name: str, width: int) -> None:
    t = TABLES[name]()
    out = _render(t, width)
    assert _missing(t, out) == [] and _whole_cells_lost(t, out) == [], out
    room = widths(t, width)
    if room is not None and width != PIPE_WIDTH:  # a table, not the blocks: every line fits the terminal
        assert max(len(line) for line in out.splitlines()) <= width, out


def test_the_cropping_renderer_is_caught() -> None:
    """The mutant, the newcomer's figures: at 80 columns ``+7.0``, ``any`` or a header lose characters; at 60 more."""
    for width in (60, 80):
        out = _render(_plan(), width, _old_emit)
        assert _missing(_plan(), out), out
    out = _render(_tradeoff(), 60, _old_emit)
    assert _missing(_tradeoff(), out), out


def test_a_table_too_wide_to_fold_prints_one_block_per_row() -> None:
    """At 40 columns the plan table cannot fit even folded: each row is a block of ``column  value`` lines."""
    t = _plan()
    assert widths(t, 40) is None
    out = _render(t, 40)
    assert "nnm>cwtm" in out and "no attack %  94.6 ± 0.8" in out and "┃" not in out
    assert out.count("\nrule ") == len(t.rows)


def test_a_text_column_folds_at_spaces_and_a_number_column_never_does() -> None:
    """The widths: a foldable column gives way down to its longest word, never below; numbers keep their width."""
    t = _tradeoff()
    natural = widths(t, PIPE_WIDTH)
    assert natural is not None
    narrow = widths(t, sum(natural) - 20)
    assert narrow is not None and sum(narrow) == sum(natural) - 20
    verdict = t.columns.index("verdict")
    assert [n for i, n in enumerate(narrow) if i != verdict] == [n for i, n in enumerate(natural) if i != verdict]
    assert narrow[verdict] >= max(len(w) for r in t.rows for w in r[verdict].split())


def _cli_tables(args: list[str]) -> list[Tabular]:
    """The tables ``args`` prints, read from its ``--format json`` (the one shape, ``{"tables": [...]}``)."""
    res = CliRunner().invoke(cli.app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return [Tabular(d["title"], d["columns"], [[row[c] for c in d["columns"]] for row in d["rows"]])
            for d in json.loads(res.stdout)["tables"]]


def _cli_outputs(args: list[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, str]]:
    for width in WIDTHS:
        buf = io.StringIO()
        term = Console(file=buf, width=width, color_system=None, force_terminal=False)
        monkeypatch.setattr(listing, "console", term)
        monkeypatch.setattr(runs, "console", term)
        monkeypatch.setattr(studies, "console", term)
        res = CliRunner().invoke(cli.app, args)
        assert res.exit_code == 0, res.output
        yield width, buf.getvalue()


@pytest.mark.parametrize("what", ["aggregators", "attacks", "algorithms", "stages", "datasets", "models"])
def test_the_list_commands_lose_nothing_at_any_width(what: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``list`` table's json cells (a reference: its whole text, printed as a note under the table) all appear."""
    (table,) = _cli_tables(["list", what])
    for width, out in _cli_outputs(["list", what], monkeypatch):
        assert _missing(table, out) == [], (width, out)


def test_report_and_status_lose_nothing_at_any_width(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``report`` and ``status`` on a tiny grid (mean and cwtm, with and without a sign flip)."""
    tiny_grid(tmp_path)
    for args in (["report", str(tmp_path)], ["status", str(tmp_path), "--all"]):
        tables = _cli_tables(args)
        assert tables and all(t.rows for t in tables)
        for width, out in _cli_outputs(args, monkeypatch):
            for t in tables:
                assert _missing(t, out) == [], (args, width, out)


def test_the_plan_table_loses_nothing_at_any_width(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tension plan`` on a tiny task (trained once; the other widths reuse the finished runs)."""
    cfg = tmp_path / "task.toml"
    cfg.write_text('dataset = "digits"\nmodel = "logreg"\nworkers = 7\nrounds = 2\neval_every = 2\nbatch_size = 8\n'
                   "seed = [0, 1]\n")
    args = ["tension", "plan", str(cfg), "--expect-byzantine", "1", "--rules", "nnm>cwtm", "--f", "1", "--attacks",
            "alie,foe", "--out", str(tmp_path / "plan"), "--jobs", "1"]
    (table,) = _cli_tables(args)
    assert [r[0] for r in table.rows] == ["mean", "nnm>cwtm"]
    table.compact, table.right = True, table.columns[1:-1]  # as the command builds it: numbers never fold
    for width, out in _cli_outputs(args, monkeypatch):
        assert _missing(table, out) == [] and _whole_cells_lost(table, out) == [], (width, out)


def _committed_plan() -> Tabular:
    """The plan table docs/tension.md commits (``tension plan --expect-byzantine 4`` on the default task, the
    newcomer's command), flagged as :mod:`phalanx.cli.studies` builds it: numbers right-aligned, compact."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "tension.md").read_text()
    tables, _ = tables_of([doc[doc.index("<!-- regenerate: phalanx tension plan --expect-byzantine 4"):]])
    t = tables[0]
    assert t.columns[:2] == ["rule", "f"] and t.columns[-1] == "pick" and len(t.rows) == 11
    t.title, t.compact, t.right = "Price of robustness on your task (n = 20, K = 4)", True, t.columns[1:-1]
    return t


@pytest.mark.parametrize("width", WIDTHS)
def test_the_committed_plan_table_loses_nothing(width: int) -> None:
    t = _committed_plan()
    out = _render(t, width)
    assert _missing(t, out) == [] and _whole_cells_lost(t, out) == [], out


def test_the_cropping_renderer_loses_the_committed_plans_cells_at_80_columns() -> None:
    """The newcomer's finding, as the mutant plays it: at 80 columns a header and cells lose characters; the fix
    keeps it a table there, one space between columns (the mutant of that step, two spaces: one block per row)."""
    t = _committed_plan()
    assert _missing(t, _render(t, 80, _old_emit))
    out = _render(t, 80)
    assert " rule " not in out and out.count("nnm>cwtm") == 3 and "─" in out, out


def test_a_studys_markdown_tables_keep_their_columns_on_a_narrow_terminal() -> None:
    """A study's terminal output holds Markdown pipe tables (``phalanx experiment corrupted-rounds`` printed
    170-character ``| … |`` rows in 60 columns): on the terminal each becomes a table that folds or falls back to one
    block per row — no line wider than the terminal, every header and cell still there. Mutant: the text echoed as it
    is (the former ``typer.echo``)."""
    from phalanx.cli.output import emit_terminal

    wide = ("Verdicts, paired by seed:\n\n| question | a | b | a − b (points) | 95 % interval | p (Holm) | verdict |\n"
            "|---|---|---|---|---|---|---|\n"
            "| second line, attacked | mean + robust-online (attacked) | mean + sgd (attacked) | +83.6 | "
            "[+80.0, +87.2] | 5.4e-06 | a is better |\n\nThe end.")
    buf = io.StringIO()
    emit_terminal([wide], Console(file=buf, width=60, color_system=None, legacy_windows=False))
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 60, out
    for text in ("Verdicts, paired by seed:", "95 % interval", "mean + robust-online (attacked)", "[+80.0, +87.2]",
                 "a is better", "The end."):
        assert text in out, text
    assert "|---|" not in out
    mutant = wide  # what typer.echo printed
    assert max(len(line) for line in mutant.splitlines()) > 60
