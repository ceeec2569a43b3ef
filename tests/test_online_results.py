"""The regret check's raw results (phalanx.online.results): ``--out`` writes points.csv and report.md, ``--results``
makes the same report from points.csv without running a game, byte for byte, and a hostile or mismatched points file
is refused in one line naming the file — each guard of the reader played by the file it must refuse (its mutant)."""

from __future__ import annotations

import os
import re
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


CAL = ["--horizons", "60", "120", "--budgets", "0", "3", "--norms", "0", "2", "--seeds", "100",
       "--held-out-seeds", "102"]
"""A tiny calibration grid (12 cells: 12 fit points on seed 100, 12 held out on seed 102; about a second)."""


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calibration")
    assert check.main([*CAL, "--calibrate", str(out / "constants.json"), "--out", str(out)]) == 0
    return out


def test_calibrate_out_then_results_gives_the_report_byte_for_byte(calibrated: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``--calibrate … --out`` writes every point (fit and held-out apart, by role) and the report; ``--results``
    makes the same report, points file and fitted constants from that file, without a game."""
    rows = (calibrated / "points.csv").read_text().splitlines()
    assert rows[0] == ",".join(results.CALIBRATION_HEADER) and len(rows) == 1 + 12 + 12
    assert [r.split(",")[7] for r in rows[1:]] == ["fit"] * 12 + ["held-out"] * 12
    assert {r.split(",")[5] for r in rows[1:13]} == {"100"} and {r.split(",")[5] for r in rows[13:]} == {"102"}
    report = (calibrated / "report.md").read_bytes()
    capsys.readouterr()

    def no_game(*a: object, **k: object) -> None:
        raise AssertionError("--results ran a game")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(check, "measure", no_game)
        assert check.main([*CAL, "--calibrate", str(tmp_path / "c.json"), "--results",
                           str(calibrated / "points.csv"), "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(report.decode())
    assert (tmp_path / "report.md").read_bytes() == report
    assert (tmp_path / "points.csv").read_bytes() == (calibrated / "points.csv").read_bytes()
    first, again = bound.load(calibrated / "constants.json"), bound.load(tmp_path / "c.json")
    assert (again.sqrt_term, again.k_term, again.calibration) == (first.sqrt_term, first.k_term, first.calibration)
    assert first.seeds() == {100} and first.calibration["held_out_seeds"] == [102]


def _fit_problems(argv: list[str], folder: Path) -> list[str]:
    """What shows that points other than the ``--seeds`` ones entered the fit of the calibration written to
    ``folder`` by ``argv`` (empty: none did): (1) the report's fit line names other seeds or another count than the
    fit rows of points.csv; (2) A₁, A₂ in the report (full digits) are not :func:`bound.fit` of the fit rows alone;
    (3) the report made again from a points file whose *held-out* regrets were raised tenfold fits other constants
    (or the file is refused: its bounds moved with the held-out data)."""
    out: list[str] = []
    seeds = sorted(int(s) for s in argv[argv.index("--seeds") + 1:argv.index("--held-out-seeds")])
    rows = [r.split(",") for r in (folder / "points.csv").read_text().splitlines()[1:]]
    fit_rows = [r for r in rows if r[7] == "fit"]
    report = (folder / "report.md").read_text()
    m = re.search(r"fit: A1 = \S+, A2 = \S+ \((\S+), (\S+)\), fitted on the (\d+) points of seeds \[([\d, ]*)\]",
                  report)
    if m is None:
        return ["no fit line in the report"]
    said = sorted(int(s) for s in m.group(4).split(", ") if s)
    if said != seeds or int(m.group(3)) != len(fit_rows) or {int(r[5]) for r in fit_rows} != set(seeds):
        out.append(f"the fit saw seeds {said} ({m.group(3)} points), not only {seeds} ({len(fit_rows)})")
    refit = bound.fit([(int(r[2]), int(r[3]), float(r[4]), float(r[8])) for r in fit_rows], check.G, 1.0)
    if refit != (float(m.group(1)), float(m.group(2))):
        out.append(f"A1, A2 = {m.group(1)}, {m.group(2)}, not the fit rows' {refit}")
    raised = folder / "raised.csv"
    lines = (folder / "points.csv").read_text().splitlines()
    raised.write_text("\n".join([lines[0], *[",".join([*r[:8], repr(float(r[8]) * 10), r[9]]) if r[7] == "held-out"
                                            else ",".join(r) for r in rows]]) + "\n")
    try:
        check.main([*argv, "--calibrate", str(folder / "raised.json"), "--results", str(raised), "--out",
                    str(folder / "raised")])
    except ConfigError as exc:
        return [*out, f"raising held-out regrets moved the bounds: {exc}"]
    if (folder / "raised" / "report.md").read_text().split("\nfit: ")[1].split("\n")[0] != \
            report.split("\nfit: ")[1].split("\n")[0]:
        out.append("raising held-out regrets changed the fitted constants")
    return out


def test_the_held_out_points_never_enter_the_fit_and_the_mutant_that_fits_them_is_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """"Fix constants before you look at the data they check": the calibration fits A₁, A₂ on the ``--seeds``
    points only and checks the held-out ones against them. Two mutants fit the held-out points too — one that says
    so (its constants record the held-out seed) and one that hides it (records only the fitting seeds) — and
    :func:`_fit_problems` catches each; the held-out verdict can fail (raised held-out regrets are REJECTED)."""
    argv = [*CAL, "--problems", "convex", "linear", "--attacks", "none", "push"]
    real = tmp_path / "real"
    assert check.main([*argv, "--calibrate", str(real / "c.json"), "--out", str(real)]) == 0
    assert _fit_problems(argv, real) == []
    raised = (real / "raised" / "report.md").read_text()
    assert "\nheld-out: R/B in" in raised and "REJECTED" in raised.split("\nheld-out: ")[1]
    assert check.main([*argv, "--calibrate", str(real / "r.json"), "--results", str(real / "raised.csv")]) == 1

    real_split, real_calibrate = check.split, check.calibrate

    def open_split(points: list[check.Point], fit_seeds: list[int]) -> tuple[list[check.Point], list[check.Point]]:
        fit, held = real_split(points, fit_seeds)
        return [*fit, *held], held  # the held-out points enter the fit

    monkeypatch.setattr(check, "split", open_split)
    loud = tmp_path / "loud"
    check.main([*argv, "--calibrate", str(loud / "c.json"), "--out", str(loud)])
    assert "ENTERED THE FIT: no held-out verdict" in (loud / "report.md").read_text()
    assert any("the fit saw seeds [100, 102]" in p for p in _fit_problems(argv, loud))

    def hiding(points: list[check.Point], margin: float, command: str) -> bound.Constants:
        c = real_calibrate(points, margin, command)
        fit = [p for p in points if p.seed == 100]
        return bound.Constants(c.sqrt_term, c.k_term, c.margin, {**c.calibration, "seeds": [100],
                                                                 "cells": len(fit)}, c.command)

    monkeypatch.setattr(check, "calibrate", hiding)
    quiet = tmp_path / "quiet"
    check.main([*argv, "--calibrate", str(quiet / "c.json"), "--out", str(quiet)])
    assert "none of them in the fit" in (quiet / "report.md").read_text()  # it hides it in the report...
    assert _fit_problems(argv, quiet)  # ...and is caught from the raw results
    capsys.readouterr()


CAL_HOSTILE: dict[str, tuple[Callable[[str], str], str]] = {
    "a fit regret edited": (_edit(lambda ls: _cell(ls, 2, 8, "1000.0")), "the constants its fit rows give"),
    "a fit row made held-out": (_edit(lambda ls: _cell(ls, 1, 7, "held-out")), "rows of the planned points only"),
    "a held-out row dropped": (_edit(lambda ls: ls[:-2] + ls[-1:]), "a row for every planned point"),
    "an infinite regret": (_edit(lambda ls: _cell(ls, 2, 8, "inf")), "a finite number in the column regret"),
    "a regret above the proven bound at u = 0": (_edit(lambda ls: _cell(ls, 1, 8, "1e9")),
                                                 "regrets a calibration can fit"),
    "a check's points file": (_edit(lambda ls: [",".join(results.HEADER), *ls[1:]]), "CSV with the header"),
    "a row without its role": (_edit(lambda ls: [ls[0], ls[1].replace(",fit,", ","), *ls[2:]]),
                               "10 columns on every row"),
}


@pytest.mark.parametrize("name", list(CAL_HOSTILE))
def test_a_hostile_calibration_file_is_refused_in_one_line(calibrated: Path, tmp_path: Path, name: str) -> None:
    forge, says = CAL_HOSTILE[name]
    bad = tmp_path / "points.csv"
    bad.write_text(forge((calibrated / "points.csv").read_text()))
    with pytest.raises(ConfigError) as err:
        check.main([*CAL, "--calibrate", str(tmp_path / "c.json"), "--results", str(bad)])
    assert err.value.parameter == "results" and str(bad) in str(err.value) and says in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "c.json").exists()


def test_held_out_seeds_are_a_calibrations_and_disjoint_from_its_fit(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="held-out-seeds"):
        check.main([*GRID, "--held-out-seeds", "5"])
    with pytest.raises(ConfigError, match="seeds other than the fitted ones"):
        check.main([*CAL, "--seeds", "100", "102", "--calibrate", str(tmp_path / "c.json")])


DOCUMENTED = ["--problems", "convex", "linear", "--attacks", "none", "push", "flip", "bias", "--horizons", "500",
              "2000", "8000", "--budgets", "0", "4", "16", "64", "--norms", "0", "3", "30", "--seeds", "100", "101",
              "--held-out-seeds", "102", "--margin", "1.25"]
"""The calibration of docs/online.md ("Calibration, once, on data no check runs") as bound_constants.json records it."""


def test_the_committed_constants_are_the_fit_of_the_committed_calibration_points(tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture[str]
                                                                                 ) -> None:
    """``bound_constants.json`` is what the committed raw results of its command give: the fit rows of
    docs/results/online_calibration_points.csv (seeds 100 and 101 only) fitted again, no game run, give A₁ and A₂
    to the last bit, the same grid, seeds and tightest cell; and that command is the one the file records."""
    committed = bound.load()
    assert " ".join(DOCUMENTED) in committed.command and "--out" in committed.command
    out = tmp_path / "c.json"
    check.main([*DOCUMENTED, "--calibrate", str(out), "--results",
                str(ROOT / "docs" / "results" / "online_calibration_points.csv")])
    again = bound.load(out)
    assert (again.sqrt_term, again.k_term, again.margin, again.calibration) == (
        committed.sqrt_term, committed.k_term, committed.margin, committed.calibration)
    assert committed.seeds() == {100, 101} and committed.calibration["held_out_seeds"] == [102]
    capsys.readouterr()
