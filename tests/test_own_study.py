"""A study from the user's own module (examples/plugins/mylab/studies.py, worker momentum against ALIE) runs through
`phalanx experiment` — named by `module:attr` spec, and by its entry point as an installed plug-in is — with the
shared options, the report files and the runs reused; nothing of Phalanx names it."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from tests.test_extending import PLUGINS, env, phalanx, plugin_site

TINY = ["--seeds", "2", "-j", "1", "--set", "rounds=3", "--set", "rules=['cwtm']"]


def test_the_users_study_runs_by_spec_then_by_entry_point_on_the_same_runs(tmp_path: Path) -> None:
    out = tmp_path / "momentum"
    by_spec = phalanx(["experiment", "mylab.studies:Momentum", "--out", str(out), *TINY], env(PLUGINS))
    assert "momentum quick: an MLP on the built-in digits" in by_spec.stdout
    said = " ".join(by_spec.stdout.split())  # (rich folds long lines at 80 columns)
    assert "changed from preset quick (its description above does not say so): rules=('cwtm',), rounds=3" in said
    report = (out / "report.md").read_text()
    assert "Command: `phalanx experiment mylab.studies:Momentum --preset quick --seeds 2 --set rounds=3" in report
    assert "| cwtm | " in report and "momentum 0.9" in report and "Runs: 4," in report
    cells = list(csv.DictReader(io.StringIO((out / "cells.csv").read_text())))
    assert [(c["rule"], float(c["momentum"])) for c in cells] == [("cwtm", 0.0), ("cwtm", 0.9)]
    assert all(0 <= float(c["mean"]) <= 1 for c in cells) and (out / "momentum.png").stat().st_size > 0
    done = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/DONE")}
    assert len(done) == 1 * 2 * 2  # rule × momentum × seed

    site = plugin_site(tmp_path)  # installed: the entry point's name is a command of its own
    listed = phalanx(["experiment", "--help"], env(site, PLUGINS)).stdout
    assert "momentum" in listed and "Worker momentum against ALIE" in listed
    first = (out / "cells.csv").read_text()
    phalanx(["experiment", "momentum", "--out", str(out), *TINY], env(site, PLUGINS))
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/DONE")} == done  # nothing retrained
    assert (out / "cells.csv").read_text() == first
    again = (out / "report.md").read_text()
    assert "Command: `phalanx experiment momentum --preset quick" in again
    # every run had finished before: the command timed none of them, so the report claims no wall time
    assert "wall time" in report and "Runs: 4\n" in again and "wall time" not in again
