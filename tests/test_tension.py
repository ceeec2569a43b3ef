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
    rows = [line for line in lines if not line.startswith("# ")]  # its title line and its notes (issue 38)
    assert lines[0].startswith("# Price of robustness at n = 6") and len(rows) == 1 + 3
    assert rows[0] == "rule,f,bound f/(n−f),ε proven,κ proven"  # the terminal's columns (issue 38)
    assert rows[2].startswith("cwtm,1,0.2,0.2,")
    res = runner.invoke(cli.app, ["tension", "theory", "-n", "6", "--rules", "cwtm,geomed", "--format", "markdown",
                                  "--measure", "--trials", "5"])
    assert res.exit_code == 0, res.output
    assert "| cwtm | 2 | 0.5 | 0.5 |" in res.output
    res = runner.invoke(cli.app, ["tension", "theory", "--format", "xml"])
    assert res.exit_code != 0


MEASURE = ["tension", "theory", "-n", "6", "--rules", "cwtm,cwmed", "--measure", "--trials", "2", "--budget", "4",
           "--kappa-budget", "4", "--format", "csv"]


def test_measure_says_what_it_measures_and_a_line_per_rule_and_f(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: ``tension theory --measure`` printed nothing for minutes. On stderr (stdout holds the table alone)
    it says what it measures, times a share of one pair per rule, says the total when it is over the budget
    (PHALANX_BUDGET_MINUTES) before the first pair, then a line after each (rule, f). Mutant: a budget it is under
    (``off``) — no timing, no such line."""
    monkeypatch.setenv(cli.BUDGET_ENV, "0.000001")  # every measurement is over a budget of 60 µs
    res = CliRunner().invoke(cli.app, MEASURE)
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("# Price of robustness") and "(rule, f) measured" not in res.stdout
    err = res.stderr.splitlines()
    assert err[0].startswith("Measuring ε (2 random inputs, then 4 rule evaluations of CMA-ES) and a certified lower "
                             "bound on κ (4 rule evaluations) for 2 rule(s) × every f at n = 6, d = 8: 6 (rule, f)")
    assert err[1].startswith("Timing a 0.1 share of one (rule, f) of each rule to estimate the measurement")
    assert err[2].startswith("This measurement should take about ") and "over the 1e-06 min budget" in err[2]
    assert "To make it smaller: fewer rules (--rules), a smaller n (-n)" in err[2]
    assert err[3].startswith("cwtm f=0: 1/6 (rule, f) measured in ") and ", ETA " in err[3]
    pairs = [line for line in err if " (rule, f) measured in " in line]
    assert [p.split(":")[0] for p in pairs] == [f"{r} f={f}" for r in ("cwtm", "cwmed") for f in range(3)]
    assert pairs[-1].startswith("cwmed f=2: 6/6") and "ETA" not in pairs[-1]
    monkeypatch.setenv(cli.BUDGET_ENV, "off")
    res = CliRunner().invoke(cli.app, MEASURE)
    assert res.exit_code == 0 and "should take" not in res.stderr and "Timing" not in res.stderr
    assert len([line for line in res.stderr.splitlines() if " (rule, f) measured in " in line]) == 6


def _fixed_estimate(seconds_a_pair: float) -> object:
    """``cell_costs`` as a mock: every pair of MEASURE's 2 rules × 3 f costs ``seconds_a_pair``; no clock read."""
    return lambda n, rules, **kw: tension.CostEstimate([seconds_a_pair] * 6, dict.fromkeys(rules, seconds_a_pair))


@pytest.mark.parametrize(("budget", "over"), [("0.5", True), ("2", False)])
def test_the_forewarning_fires_above_the_budget_before_the_first_pair(
        monkeypatch: pytest.MonkeyPatch, budget: str, over: bool) -> None:
    """A mocked estimate of 10 s a pair, 6 pairs: 60 s, over a budget of 0.5 min — the forewarning (the grids' own
    path, ``_forewarn``) says so before the first pair, with how to make it smaller; under a budget of 2 min (the
    mutant threshold) it is one dim line with the total, no warning."""
    monkeypatch.setenv(cli.BUDGET_ENV, budget)
    monkeypatch.setattr(tension, "cell_costs", _fixed_estimate(10.0))
    res = CliRunner().invoke(cli.app, MEASURE)
    assert res.exit_code == 0, res.output
    err = res.stderr.splitlines()
    assert err[2].startswith("This measurement should take about 60 s for 6 (rule, f)")
    assert ("over the 0.5 min budget (PHALANX_BUDGET_MINUTES). To make it smaller: fewer rules (--rules)" in err[2]) \
        is over
    assert err[3].startswith("cwtm f=0: 1/6")


def test_the_probe_times_a_share_of_one_pair_per_rule() -> None:
    """A fake clock, one tick per probe: each measurable pair is predicted 1 / 0.1 = 10 ticks; krum at n = 6, f = 2
    (it needs n > 2f + 2) costs nothing — the table notes it, unmeasured."""
    ticks = iter(range(100))
    est = tension.cell_costs(6, ["cwtm", "krum"], trials=2, budget=4, kappa_budget=4, clock=lambda: next(ticks))
    assert est.costs == pytest.approx([10, 10, 10, 10, 10, 0])
    assert est.seconds == pytest.approx(50) and est.probed == pytest.approx({"cwtm": 10, "krum": 10})


def test_the_progress_eta_extrapolates_the_pairs_done() -> None:
    """A fake clock: 10 s a pair, 3 pairs → after the first, 0:00:10 spent and 0:00:20 left."""
    from phalanx.cli.analysis import _TheoryProgress

    ticks, lines = iter([0.0, 10.0, 20.0, 30.0]), []
    progress = _TheoryProgress(3, clock=lambda: next(ticks), echo=lines.append)
    for f in range(3):
        progress("krum", f)
    assert lines[0] == "krum f=0: 1/3 (rule, f) measured in 0:00:10, ETA 0:00:20"
    assert lines[-1] == "krum f=2: 3/3 (rule, f) measured in 0:00:30"


def test_the_eta_weighs_the_pairs_left_by_their_rules_cost() -> None:
    """Issue 38: the first pairs are a cheap rule's (cwtm: 1 s here), the rest a dear one's (10 s each): after the
    first pair the ETA is 20 s, the pairs left's predicted cost scaled by how the first compared with its own — not
    the 2 s that extrapolating the first pair said (the mutant: no costs, the old ETA, 10× off)."""
    from phalanx.cli.analysis import _TheoryProgress

    for costs, eta in (([1.0, 10.0, 10.0], "0:00:20"), (None, "0:00:02")):
        ticks, lines = iter([0.0, 1.0]), []
        progress = _TheoryProgress(3, clock=ticks.__next__, echo=lines.append, costs=costs)
        progress("cwtm", 0)
        assert lines == [f"cwtm f=0: 1/3 (rule, f) measured in 0:00:01, ETA {eta}"]


def test_ctrl_c_is_one_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT during the searches (played: the κ search of the third pair raises KeyboardInterrupt) ends the command
    with one line on stderr saying how far it got, exit status 130, and no table."""
    real, calls = tension.kappa, []

    def interrupted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setenv(cli.BUDGET_ENV, "off")
    monkeypatch.setattr(tension, "kappa", interrupted)
    res = CliRunner().invoke(cli.app, MEASURE)
    assert res.exit_code == 130, res.output
    assert res.stderr.splitlines()[-1].startswith("interrupted after 2 of 6 (rule, f) measured, in ")
    assert "Traceback" not in res.output and res.stdout == ""
