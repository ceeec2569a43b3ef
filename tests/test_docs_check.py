"""Docs that cannot drift (``scripts/docs_check.py``): every output the README and docs/ quote under a ``regenerate``
marker is produced again by its command and compared; the quick ones here, the full ones by ``make docs-check``.

The check must be able to fail: a quoted number changed by one digit, a line that is not in the output, a marker
with nothing to compare, a command that fails — each is reported (the mutants below)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from _scripts import load_script

dc = load_script("scripts/docs_check.py", "docs_check")
ALL = [c for page in dc.pages() for c in dc.claims(page)]
QUICK = [c for c in ALL if c.quick]  # quick, or read from committed raw results


def test_every_marker_parses_and_the_docs_have_claims_of_both_tiers() -> None:
    """Every page's markers parse (a malformed one raises at collection) and the README's own table is among them."""
    assert any(c.path.name == "README.md" for c in ALL)
    assert {c.tier for c in ALL} == {"quick", "full"}


@pytest.mark.parametrize("claim", QUICK, ids=[c.where for c in QUICK])
def test_quick_claims_hold(claim: object) -> None:
    assert dc.compare(claim, dc.run(claim)) == []


def _page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def _command(tmp_path: Path, body: str) -> str:
    """A command that runs ``body`` (a marker's command may not hold ';': it separates the options)."""
    script = tmp_path / f"cmd{len(list(tmp_path.glob('cmd*.py')))}.py"
    script.write_text(body)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"  # a folder name may hold a space


@pytest.fixture
def echo(tmp_path: Path) -> str:
    """A command that prints a three-line table."""
    return _command(tmp_path, "print('| rule | ε |')\nprint('| cwtm | 0.0667 |')\nprint('| krum | 1.31 |')\n")


def test_a_changed_digit_is_caught(tmp_path: Path, echo: str) -> None:
    """The mutant: the quoted table with one digit changed."""
    good = dc.claims(_page(tmp_path, f"<!-- regenerate: {echo} -->\n| rule | ε |\n| cwtm | 0.0667 |\n"))
    assert dc.compare(good[0], dc.run(good[0])) == []
    bad = dc.claims(_page(tmp_path, f"<!-- regenerate: {echo} -->\n| rule | ε |\n| cwtm | 0.0668 |\n"))
    (problem,) = dc.compare(bad[0], dc.run(bad[0]))
    assert "0.0668" in problem


def test_an_excerpt_keeps_order_and_an_elision_is_not_compared(tmp_path: Path, echo: str) -> None:
    page = f"<!-- regenerate: {echo} -->\n```text\n| rule | ε |\n…\n| krum | 1.31 |\n```\n"
    (claim,) = dc.claims(_page(tmp_path, page))
    assert dc.compare(claim, dc.run(claim)) == []
    swapped = f"<!-- regenerate: {echo} -->\n```text\n| krum | 1.31 |\n| cwtm | 0.0667 |\n```\n"
    (claim,) = dc.claims(_page(tmp_path, swapped))
    assert dc.compare(claim, dc.run(claim))  # the order matters


def test_a_number_in_prose_is_checked_with_expect(tmp_path: Path, echo: str) -> None:
    (ok,) = dc.claims(_page(tmp_path, f"Krum reaches 1.31 <!-- regenerate: {echo}; expect: 1.31 -->.\n"))
    assert dc.compare(ok, dc.run(ok)) == []
    (wrong,) = dc.claims(_page(tmp_path, f"Krum reaches 1.0 <!-- regenerate: {echo}; expect: | krum | 1.0 | -->.\n"))
    assert dc.compare(wrong, dc.run(wrong))


@pytest.mark.parametrize("page, says", [
    ("<!-- regenerate: echo hi -->\nno block here\n", "must be followed by a fenced block or a table"),
    ("<!-- regenerate: echo hi; tier: slow -->\n| a |\n", "tier 'slow'"),
    ("<!-- regenerate: echo hi; colour: red -->\n| a |\n", "unknown option 'colour'"),
    ("<!-- regenerate: echo hi -->\n```text\n…\n```\n", "the quoted block is empty"),
    ("<!-- regenerate:  -->\n| a |\n", "without a command"),
])
def test_a_marker_that_cannot_be_checked_is_an_error(tmp_path: Path, page: str, says: str) -> None:
    with pytest.raises(dc.ClaimError, match=says):
        dc.claims(_page(tmp_path, page))


def test_a_failing_command_or_a_missing_file_is_a_disagreement(tmp_path: Path, echo: str) -> None:
    failing = _command(tmp_path, "import sys\nsys.exit(3)\n")
    (claim,) = dc.claims(_page(tmp_path, f"<!-- regenerate: {failing} -->\n| a |\n"))
    with pytest.raises(dc.ClaimError, match="exited with 3"):
        dc.run(claim)
    (claim,) = dc.claims(_page(tmp_path, f"<!-- regenerate: {echo}; file: {{out}}/report.md -->\n| a |\n"))
    with pytest.raises(dc.ClaimError, match="wrote no file"):
        dc.run(claim)
    assert dc.main([str(tmp_path / "page.md")]) == 1


def test_a_table_read_from_committed_raw_results_is_checked_against_them(tmp_path: Path) -> None:
    """``results: FILE``: checked without --full by running the command with ``--results FILE`` (the report made again
    from the committed raw results); a changed digit in the file is caught, a missing file is an error."""
    results = tmp_path / "runs.csv"
    results.write_text("| cwtm | 0.0667 |\n")
    reader = _command(tmp_path, "import sys\nif '--results' not in sys.argv: sys.exit(3)\n"
                                "print(open(sys.argv[sys.argv.index('--results') + 1]).read())\n")
    page = _page(tmp_path, f"<!-- regenerate: {reader}; results: {results}; tier: full -->\n| cwtm | 0.0667 |\n")
    (claim,) = dc.claims(page)
    assert claim.quick and dc.compare(claim, dc.run(claim)) == []
    with pytest.raises(dc.ClaimError, match="exited with 3"):  # --full runs the command as written (retrains)
        dc.run(claim, full=True)
    results.write_text("| cwtm | 0.0668 |\n")  # the mutant: the committed results no longer give the quoted table
    assert dc.compare(claim, dc.run(claim))
    assert dc.main([str(page)]) == 1  # and without --full the check runs it
    with pytest.raises(dc.ClaimError, match="does not exist"):
        dc.claims(_page(tmp_path, f"<!-- regenerate: {reader}; results: {tmp_path}/none.csv -->\n| a |\n"))


def test_markers_of_one_command_run_it_once(tmp_path: Path) -> None:
    """Several tables quoted from one command's output (the tension report's seven) run it once per process; the
    mutant without the cache would count two runs here."""
    count = tmp_path / "count"
    command = _command(tmp_path, f"from pathlib import Path\np = Path({str(count)!r})\n"
                                 "p.write_text(p.read_text() + 'x' if p.exists() else 'x')\nprint('| a |')\n")
    page = _page(tmp_path, f"<!-- regenerate: {command} -->\n| a |\n\n<!-- regenerate: {command} -->\n| a |\n")
    first, second = dc.claims(page)
    assert dc.compare(first, dc.run(first)) == [] and dc.compare(second, dc.run(second)) == []
    assert count.read_text() == "x"


def test_a_documented_command_runs_on_one_thread_whatever_the_machine_chose(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's result depends on its thread count, and a single run otherwise takes the count stored for its machine
    (``phalanx.experiments.threads``), so a quoted figure would depend on what that machine once measured. The
    check runs every command with one (``PHALANX_THREADS=1`` beside ``OMP_NUM_THREADS=1``), whatever the caller's
    environment says (the mutant that sets only torch's variable passes the caller's 2 through and fails here)."""
    monkeypatch.setenv("PHALANX_THREADS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    show = _command(tmp_path, "import os\n"
                    "print('|', os.environ['PHALANX_THREADS'], '|', os.environ['OMP_NUM_THREADS'], '|')\n")
    (claim,) = dc.claims(_page(tmp_path, f"<!-- regenerate: {show} -->\n| 1 | 1 |\n"))
    assert dc.compare(claim, dc.run(claim)) == []


def test_a_folder_name_with_a_space_stays_one_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite runs in any folder: an interpreter or an output folder whose path holds a space is one argument
    (a first-hour review's clone in "my folder/phalanx copy" failed seven tests of this file). Mutant: ``{out}``
    filled in unquoted splits it."""
    monkeypatch.setattr(sys, "executable", "/opt/my env/bin/python")
    assert dc.argv("{python} -c pass --out {out}/runs", "/tmp/a b") == [
        "/opt/my env/bin/python", "-c", "pass", "--out", "/tmp/a b/runs"]
    assert dc.argv('sh -c "{python} x.py {out}/leaf"', "/tmp/a b") == [
        "sh", "-c", "'/opt/my env/bin/python' x.py '/tmp/a b'/leaf"]
