"""The regret check's raw results (phalanx.online.results): ``--out`` writes points.csv and report.md, ``--results``
makes the same report from points.csv without running a game, byte for byte, and a hostile or mismatched points file
is refused in one line naming the file — each guard of the reader played by the file it must refuse (its mutant)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from phalanx.errors import ConfigError
from phalanx.online import bound, check, results

ROOT = Path(__file__).resolve().parent.parent
GRID = ["--problems", "linear", "--attacks", "none", "push", "--horizons", "40", "--budgets", "0", "4", "--norms",
        "0", "1", "--seeds", "0", "1", "--learners", "robust", "plain"]
"""A tiny grid (6 cells × 2 seeds × 2 learners, well under a second) of the documented B2 form."""


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("online") / "out"
    assert check.main([*GRID, "--out", str(out)]) == 0
    return out


def test_out_then_results_gives_the_report_byte_for_byte(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = (made / "report.md").read_bytes()
    rows = (made / "points.csv").read_text().splitlines()
    assert rows[0] == ",".join(results.HEADER) and len(rows) == 1 + 6 * 2 * 2
    capsys.readouterr()
    assert check.main([*GRID, "--results", str(made / "points.csv")]) == 0
    assert capsys.readouterr().out.encode() == report  # what it prints from the file is the run's report.md
    again = made.parent / "again"
    assert check.main([*GRID, "--results", str(made / "points.csv"), "--out", str(again)]) == 0
    assert (again / "report.md").read_bytes() == report
    assert (again / "points.csv").read_bytes() == (made / "points.csv").read_bytes()


def _edit(fn: Callable[[list[str]], list[str]]) -> Callable[[str], str]:
    return lambda text: "\n".join(fn(text.split("\n")))


def _cell(lines: list[str], row: int, col: int, value: str) -> list[str]:
    parts = lines[row].split(",")
    parts[col] = value
    return [*lines[:row], ",".join(parts), *lines[row + 1:]]


HOSTILE: dict[str, tuple[Callable[[str], str], str]] = {
    "a row dropped": (_edit(lambda ls: ls[:3] + ls[4:]), "a row for every planned point"),
    "a row repeated": (_edit(lambda ls: ls[:3] + ls[2:]), "one row per point"),
    "a row the grid does not plan": (_edit(lambda ls: [*ls[:-1], ls[1].replace(",0,robust,", ",7,robust,"), ""]),
                                     "rows of the planned points only"),
    "a regret that is NaN": (_edit(lambda ls: _cell(ls, 1, 7, "nan")), "not NaN"),
    "a regret that is not a float": (_edit(lambda ls: _cell(ls, 1, 7, "0x1p3")), "floats in the columns"),
    "a bound of other constants": (_edit(lambda ls: _cell(ls, 1, 8, "1e300")), "the bound of the committed"),
    "another header": (lambda t: t.replace("regret", "R", 1), "CSV with the header"),
    "a short row": (_edit(lambda ls: [ls[0], ls[1].rsplit(",", 1)[0], *ls[2:]]), "9 columns on every row"),
    "a line break inside a key": (_edit(lambda ls: [*ls[:-1], '"a\nb",none,40,0,0.0,0,robust,1.0,2.0', ""]),
                                  "rows of the planned points only"),
    "an unclosed quote": (lambda t: t + '"open,', "9 columns on every row"),
    "empty": (lambda t: "", "CSV with the header"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_points_file_is_refused_in_one_line(made: Path, tmp_path: Path, name: str) -> None:
    forge, says = HOSTILE[name]
    bad = tmp_path / "points.csv"
    bad.write_text(forge((made / "points.csv").read_text()))
    with pytest.raises(ConfigError) as err:
        check.main([*GRID, "--results", str(bad)])
    assert err.value.parameter == "results" and str(bad) in str(err.value) and says in str(err.value)
    assert "\n" not in str(err.value)


def test_a_points_file_too_large_or_not_utf8_is_refused(made: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "points.csv"
    bad.write_bytes(b"\xff\xfe" + (made / "points.csv").read_bytes())
    with pytest.raises(ConfigError, match="UTF-8"):
        check.main([*GRID, "--results", str(bad)])
    monkeypatch.setattr(results, "MAX_BYTES", 100)
    with pytest.raises(ConfigError, match="at most 100 bytes"):
        check.main([*GRID, "--results", str(made / "points.csv")])
    with pytest.raises(ConfigError, match="an existing file"):
        check.main([*GRID, "--results", str(tmp_path / "absent.csv")])


def test_the_bound_guard_is_what_refuses_a_file_of_other_constants(made: Path) -> None:
    """Mutant of the reader: without the bound comparison, a file made under other constants (here a check file of
    a grid whose bound was another) would be read as if it were this one's."""
    planned = check.plan(check.cells(["linear"], ["none", "push"], [40], [0, 4], [0.0, 1.0]), [0, 1],
                         ["robust", "plain"])
    c = bound.load(None)
    other = bound.Constants(c.sqrt_term * 2, c.k_term, c.margin, c.calibration, c.command)
    assert results.read(made / "points.csv", planned, c, check.G, 1.0)  # the committed constants read it
    with pytest.raises(ConfigError, match="the bound of the committed constants"):
        results.read(made / "points.csv", planned, other, check.G, 1.0)
    with pytest.raises(ConfigError, match="the bound of the committed constants"):
        results.read(made / "points.csv", planned, c, check.G, 2.0)  # another ε


def test_the_command_refuses_a_hostile_file_in_one_line_and_exit_2(made: Path, tmp_path: Path) -> None:
    bad = tmp_path / "points.csv"
    bad.write_text((made / "points.csv").read_text().replace(",robust,", ",robust,nan,", 1))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "phalanx.online.check", *GRID, "--results", str(bad)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: results=") and str(bad) in done.stderr


def test_calibrate_with_out_or_results_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="calibrate"):
        check.main([*GRID, "--calibrate", str(tmp_path / "c.json"), "--out", str(tmp_path)])
