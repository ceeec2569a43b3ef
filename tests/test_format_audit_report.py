"""``phalanx report`` and ``phalanx audit`` take ``--format table|md|csv|json`` like every other table-printing
command (issue 38 item 4; :mod:`phalanx.cli.output`): their tables alone on stdout — csv read back by the csv module,
json by ``json.loads``, md by its header rows — everything else on stderr, the exit code unchanged. The audit's cells
hold text a Byzantine rank can shape (a rejection's kind, a problem line): each format escapes it, so a row reads
back as the one the audit found."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from tests._tiny_grid import tiny_grid
from typer.testing import CliRunner

from phalanx import cli
from phalanx.cli.output import Tabular, tables_of
from phalanx.distributed.audit import AuditReport

FORMATS = ("md", "csv", "json")


def _csv_blocks(stdout: str) -> dict[str, list[list[str]]]:
    """``--format csv`` of several tables: ``# title`` then the table, a blank line between."""
    out: dict[str, list[list[str]]] = {}
    for block in stdout.split("\n\n"):
        title, _, body = block.partition("\n")
        assert title.startswith("# "), block
        rows = "\n".join(line for line in body.splitlines() if not line.startswith("# "))  # its notes: "# " lines
        out[title[2:]] = list(csv.reader(io.StringIO(rows)))
    return out


def _md_tables(stdout: str) -> dict[str, Tabular]:
    """``--format md`` read back by the Markdown table reader of the study reports (a pipe in a cell escaped, a
    newline in a cell a blank): each table by its bold title — an empty table is its header row alone."""
    tables, _ = tables_of([stdout])
    return {t.title: t for t in tables}


def _check_formats(args: list[str], code: int) -> dict[str, Any]:
    """Every format of one command: csv, json and md give the same tables, cell for cell; the json."""
    res = {fmt: CliRunner().invoke(cli.app, [*args, "--format", fmt]) for fmt in FORMATS}
    for fmt, r in res.items():
        assert r.exit_code == code, (fmt, r.output)
    data = json.loads(res["json"].stdout)
    tables = data["tables"]
    blocks = _csv_blocks(res["csv"].stdout)
    md = _md_tables(res["md"].stdout)
    assert list(blocks) == [t["title"] for t in tables] == list(md)
    for t in tables:
        assert blocks[t["title"]] == [t["columns"], *([row[c] for c in t["columns"]] for row in t["rows"])]
        assert list(md[t["title"]].columns) == t["columns"]
        assert md[t["title"]].rows == [[row[c].replace("\n", " ") for c in t["columns"]] for row in t["rows"]]
    return data


def test_report_prints_the_grids_tables_in_every_format(tmp_path: Path) -> None:
    tiny_grid(tmp_path)
    data = _check_formats(["report", str(tmp_path)], 0)
    summary, tradeoff = data["tables"]
    assert summary["title"].startswith("Final test accuracy") and len(summary["rows"]) == 4
    assert {(r["aggregator"], r["attack"]) for r in summary["rows"]} >= {("cwtm", "signflip"), ("mean", "none")}
    assert [(r["rule"], r["attack"]) for r in tradeoff["rows"]] == [("cwtm", "signflip")]
    res = CliRunner().invoke(cli.app, ["report", str(tmp_path), "--format", "json"])
    assert "report.md" in res.stderr and "report.md" not in res.stdout  # stdout holds the tables alone
    res = CliRunner().invoke(cli.app, ["report", str(tmp_path)])  # the terminal's: the tables, then the files
    assert res.exit_code == 0 and "Final test accuracy" in res.stdout and "report.md; plots:" in res.stdout
    res = CliRunner().invoke(cli.app, ["report", str(tmp_path), "--format", "xml"])
    assert res.exit_code != 0 and "--format='xml'" in res.output


HOSTILE = 'a kind, "quoted" | piped\nand on two lines'


def _fake_audit(monkeypatch: pytest.MonkeyPatch, report: AuditReport) -> None:
    monkeypatch.setattr("phalanx.distributed.audit.audit", lambda run_dir, allow_list=None: report)


@pytest.mark.parametrize("ok", [True, False])
def test_audit_prints_its_findings_as_tables_that_read_back_and_keeps_its_exit_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ok: bool,
) -> None:
    """A rejection kind and a problem line shaped to break each format (a comma, quotes, a pipe, a newline) read
    back as they were; a failed audit exits 1 in every format, a passed one 0."""
    report = AuditReport(rounds=5, accepted=15, rejected={HOSTILE: 3, "bad signature": 7}, rejected_at={0: 8, 2: 2},
                         rounds_with_missing=1, most_missing=1, allow_list="keys/allow-list.json")
    if not ok:
        report.problem(f"round 2: {HOSTILE}")
        report.more_problems = 4
    _fake_audit(monkeypatch, report)
    data = _check_formats(["audit", str(tmp_path)], 0 if ok else 1)
    summary, kinds, ranks, problems = data["tables"]
    assert summary["rows"] == [{"rounds": "5", "accepted vectors": "15", "allow-list": "keys/allow-list.json",
                                "rounds with missing ranks": "1", "most missing": "1", "rejected": "10",
                                "results unchecked": "0", "problems": "0" if ok else "5",
                                "result": "passed" if ok else "failed"}]
    assert kinds["rows"] == [{"kind": "bad signature", "count": "7"}, {"kind": HOSTILE, "count": "3"}]
    assert ranks["rows"] == [{"rank": "0", "count": "8"}, {"rank": "2", "count": "2"}]
    assert [r["problem"] for r in problems["rows"]] == ([] if ok else [f"round 2: {HOSTILE}"])
    res = CliRunner().invoke(cli.app, ["audit", str(tmp_path)])  # the terminal's lines, as before
    assert res.exit_code == (0 if ok else 1)
    assert ("audit passed" if ok else "audit failed: 5 problems") in res.stdout


def test_a_pass_with_unchecked_results_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An asynchronous run whose rule has context or state: its steps' results are not recomputed
    (``results_unchecked``), so the pass says how many — in the terminal's line and in the summary table. A pass
    that printed only "audit passed" would claim the results were checked."""
    report = AuditReport(rounds=4, accepted=8, rejected={}, rejected_at={}, rounds_with_missing=0, most_missing=0,
                         allow_list="keys/allow-list.json", results_unchecked=3)
    _fake_audit(monkeypatch, report)
    res = CliRunner().invoke(cli.app, ["audit", str(tmp_path)])
    assert res.exit_code == 0 and "audit passed (3 steps' results unchecked)" in res.stdout, res.stdout
    summary = _check_formats(["audit", str(tmp_path)], 0)["tables"][0]
    assert summary["rows"][0]["results unchecked"] == "3"


def test_audit_refuses_an_unknown_format_before_it_reads_anything(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    def never(*_: object, **__: object) -> AuditReport:
        raise AssertionError("the audit ran")

    monkeypatch.setattr("phalanx.distributed.audit.audit", never)
    res = CliRunner().invoke(cli.app, ["audit", str(tmp_path), "--format", "xml"])
    assert res.exit_code == 2 and "--format='xml'" in res.output
