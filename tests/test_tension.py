"""The theory table of the price of robustness."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from phalanx import cli
from phalanx.analysis import tension
from phalanx.errors import ConfigError


def test_theory_table_values() -> None:
    rows = tension.theory_table(16, ["cwtm", "cwmed", "geomed", "krum"])
    by = {(r.rule, r.f): r for r in rows}
    assert [r.f for r in rows if r.rule == "cwtm"] == list(range(8))
    for f in range(8):
        assert by[("cwtm", f)].lower_bound == pytest.approx(f / (16 - f))
        assert by[("cwtm", f)].epsilon == pytest.approx(f / (16 - f))  # the trimmed mean meets the bound
        assert by[("cwmed", f)].epsilon == pytest.approx(7 / 9)
        assert by[("geomed", f)].epsilon == 1.0
    assert by[("krum", 7)].note is not None and by[("krum", 7)].epsilon is None  # n = 16 < 2·7 + 3


def test_measured_trimmed_mean_meets_the_bound_exactly() -> None:
    rows = tension.theory_table(10, ["cwtm"], measure=True, trials=10)
    for r in rows:
        assert r.measured == pytest.approx(r.lower_bound, abs=1e-12)


def test_bad_input() -> None:
    with pytest.raises(ConfigError, match="workers"):
        tension.theory_table(1)
    with pytest.raises(ConfigError, match="aggregator"):
        tension.theory_table(8, ["nope"])


def test_cli_formats() -> None:
    runner = CliRunner()
    res = runner.invoke(cli.app, ["tension", "theory", "-n", "6", "--rules", "cwtm", "--format", "csv"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("rule,f,lower_bound") and len(lines) == 1 + 3
    assert lines[2].startswith("cwtm,1,0.2,0.2,")
    res = runner.invoke(cli.app, ["tension", "theory", "-n", "6", "--rules", "cwtm,geomed", "--format", "markdown",
                                  "--measure", "--trials", "5"])
    assert res.exit_code == 0, res.output
    assert "| cwtm | 2 | 0.5 | 0.5 |" in res.output
    res = runner.invoke(cli.app, ["tension", "theory", "--format", "xml"])
    assert res.exit_code != 0
