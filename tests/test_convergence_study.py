"""The convergence study (phalanx.studies.convergence) at small sizes: its cells, Theorem 4.5's construction for the
rules it runs (stall or escape, with the reason), Proposition 3's matching its closed form, the real problems' floors
beside bounds from a proven ε only, the 80-column table, the report, the plot, the command line and its one-line
errors."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from tests._raw import assert_rebuilt

from phalanx import studies
from phalanx.errors import ConfigError
from phalanx.studies import convergence as cs

SMALL = dataclasses.replace(
    cs.PRESETS["quick"], workers=8, rules=("mean", "cwtm", "geomed"), fs=(1, 3), alphas=(0.5,), rounds=12,
    hidden=8, construction_rules=("cwtm", "cwmed"), construction_fs=(1, 3), construction_steps=10,
    paper_rules=("cwtm", "krum", "mean"),
)


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> tuple[cs.ConvergenceStudy, list[cs.Cell], dict[cs.Cell, Any],
                                                           Path, Any]:
    study = cs.ConvergenceStudy()
    cells, configs = study.plan(SMALL, {})
    assert configs == []  # nothing to train: every GD run is in process
    collected = study.collect(cells, configs, Path("unused"))
    out = tmp_path_factory.mktemp("convergence")
    report = study.report(SMALL, cells, collected, out, command="phalanx experiment convergence", wall_seconds=None,
                          runs=0, overrides={})
    return study, cells, collected, out, report


def test_the_study_is_registered_and_reachable_from_both_groups() -> None:
    assert studies.resolve("convergence") is cs.ConvergenceStudy
    from typer.testing import CliRunner

    from phalanx import cli

    for args in (["experiment", "convergence", "--help"], ["tension", "convergence", "--help"]):
        res = CliRunner().invoke(cli.app, args, env={"COLUMNS": "200"})
        assert res.exit_code == 0, res.output
        assert "quick (minutes on 2 cores)" in res.output and "runs/convergence-quick" in res.output


def test_the_cells_cover_the_grid(done) -> None:  # type: ignore[no-untyped-def]
    _, cells, collected, _, _ = done
    cons = [c for c in cells if c.problem == "construction"]
    assert {(c.rule, c.f) for c in cons} == {("cwtm", 1), ("cwtm", 3), ("cwmed", 1), ("cwmed", 3)}
    paper = [c for c in cells if c.problem == cs.PAPER]
    assert {(c.rule, c.f) for c in paper} == {("cwtm", 1), ("cwtm", 3), ("krum", 1), ("mean", 1), ("mean", 3)}
    real = [c for c in cells if c.problem not in ("construction", cs.PAPER)]
    # mean and geomed once (f does not matter), cwtm at both f; three problems, one α, three seeds
    assert len(real) == 3 * 1 * (1 + 2 + 1) * 3
    assert set(collected) == set(cells)


def test_the_construction_meets_its_closed_form(done) -> None:  # type: ignore[no-untyped-def]
    _, cells, collected, _, _ = done
    for c in cells:
        if c.problem == "construction":
            o = collected[c]
            assert abs(o.floor - o.bound) <= o.tolerance
            assert len(o.curve) == SMALL.construction_steps + 1
    o = collected[cs.Cell("construction", 0.0, "cwtm", 3, 0)]
    assert o.ratio == pytest.approx(3 / 5) and o.epsilon == pytest.approx(3 / 5) and o.epsilon_source == "proven"


def test_theorem_45_stalls_the_robust_rules_and_not_the_mean(done) -> None:  # type: ignore[no-untyped-def]
    _, _, collected, _, report = done
    for rule, f in (("cwtm", 1), ("cwtm", 3), ("krum", 1)):
        o = collected[cs.Cell(cs.PAPER, 0.0, rule, f, 0)]
        assert o.verdict.startswith("stalls: in the theorem's class") and abs(o.floor - o.bound) <= o.tolerance
        assert o.limit == pytest.approx(f / (8 - f) / (2 * 8 / math.sqrt(f * (8 - f))))  # (f/(n−f))G²/(2μ), μ = 2c
    for f in (1, 3):
        o = collected[cs.Cell(cs.PAPER, 0.0, "mean", f, 0)]
        assert o.verdict.startswith("escapes: not (f, κ)-robust") and abs(o.floor - o.bound) > o.tolerance
    text = "\n".join(report.terminal)
    assert "Theorem 4.5 (Yang, Shi & Li)" in text and "Proposition 3 (Phalanx's own" in text


def test_the_bounds_use_a_proven_epsilon_only() -> None:
    assert cs.rule_epsilon("cwtm", 3, 16) == (pytest.approx(3 / 13), "proven")
    eps, source = cs.rule_epsilon("krum", 5, 16)  # nothing proven: its κ, by Theorem 3.2
    assert source == "kappa" and eps == pytest.approx(6 * (1 + 5 / 6))
    eps, source = cs.rule_epsilon("multikrum", 5, 16)  # neither: no bound, never a measured ε
    assert source == "none" and math.isnan(eps)


def test_the_real_floors_have_bounds_and_intervals(done) -> None:  # type: ignore[no-untyped-def]
    _, _, collected, _, _ = done
    rows = cs.rows(SMALL, collected)
    assert len(rows) == 3 * 4
    for r in rows:
        assert r.floor.k == 3 and r.floor.low <= r.floor.mean <= r.floor.high
        if r.rule == "mean":
            assert r.epsilon == 0 and r.verdict() == "ε = 0: no bound"
        elif r.rule == "krum":
            assert r.epsilon_source == "kappa" and (r.verdict() in ("below the bound", "above the bound",
                                                                    "inconclusive")
                                                    or r.verdict().startswith("above the bound (seed "))
        else:
            assert r.bound.mean > 0 and r.epsilon > 0
            assert (r.verdict() in ("below the bound", "above the bound", "inconclusive")
                    or r.verdict().startswith("above the bound (seed "))
            assert 0 <= r.ratio.mean <= r.epsilon * (1 + 1e-9)  # the realised error is at most ε
    # cwtm configured for more f costs more: ε is f/(n − f)
    eps = {r.f: r.epsilon for r in rows if r.rule == "cwtm"}
    assert eps == {1: pytest.approx(1 / 7), 3: pytest.approx(3 / 5)}


def test_verdicts_need_three_seeds_and_an_interval_on_one_side_of_1() -> None:
    e = cs.mean_ci([0.1, 0.2])
    below = cs.mean_ci([-0.1, -0.2])  # a seed above its bound is reported whatever the count (one seed suffices)
    assert cs.Row("mlp", 0.5, "cwtm", 1, e, e, below, e, 0.1, "proven").verdict().startswith("no verdict (2 seeds")
    assert cs.Row("mlp", 0.5, "mda", 1, e, e, e, e, math.nan, "none").verdict() == "no proven ε: no bound"

    def row(shares: list[float]) -> cs.Row:
        logs = cs.mean_ci([math.log(v) for v in shares])
        return cs.Row("mlp", 0.5, "cwtm", 1, e, e, logs, e, 0.1, "proven")

    assert row([0.01, 0.02, 0.03]).verdict() == "below the bound"
    assert row([2.0, 3.0, 4.0]).verdict() == "above the bound (the seed at index 0)"
    assert row([0.5, 1.0, 2.0]).verdict() == "above the bound (the seed at index 2)"  # one seed suffices
    assert row([0.3, 0.9, 0.6]).verdict() == "inconclusive"
    assert row([0.5, 0.5, 0.5]).verdict().startswith("no verdict (zero width")


def test_the_terminal_tables_fit_80_columns(done) -> None:  # type: ignore[no-untyped-def]
    _, _, _, _, report = done
    text = "\n".join(report.terminal)
    assert "Theorem 4.5" in text and "Proposition 3" in text and "Real problems" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_report_files(done) -> None:  # type: ignore[no-untyped-def]
    _, cells, _, out, report = done
    assert {p.name for p in report.files} == {"report.md", "cells.csv", "convergence.png"}
    md = (out / "report.md").read_text()
    assert "## Proposition 3: Phalanx's own" in md and "## Real problems" in md and "convergence.png" in md
    assert "4 of 4 (rule, f) end within the rounding tolerance" in md
    assert "## Theorem 4.5: the paper's construction, every rule" in md
    assert "Verdicts: 2 escapes, 3 stalls (class)." in md
    assert "| mean | 1 | escapes: not (f, κ)-robust for any κ" in md
    with (out / "cells.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(cells)
    assert (out / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("changes", "parameter"), [
    ({"fs": (4,)}, "f"),
    ({"construction_fs": (8,)}, "f"),
    ({"workers": 2}, "workers"),
    ({"alphas": (0.0,)}, "alphas"),
    ({"problems": ("svm",)}, "problems"),
    ({"lam": 0.0}, "lam"),
    ({"rounds": 0}, "rounds"),
    ({"construction_lr": 2.0}, "construction_lr"),
    ({"construction_lr": "fast"}, "construction_lr"),
    ({"mlp_lam": -1.0}, "mlp_lam"),
    ({"rules": ("nosuchrule",)}, "aggregator"),
    ({"construction_rules": ("krum",)}, "construction_rules"),
    ({"paper_rules": ("nosuchrule",)}, "aggregator"),
])
def test_bad_presets_are_one_line_before_anything_runs(changes: dict[str, Any], parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        cs.check_preset(dataclasses.replace(SMALL, **changes))
    assert info.value.parameter == parameter and "\n" not in str(info.value)


def test_run_keys_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="trains no run directories"):
        cs.ConvergenceStudy().plan(SMALL, {"lr": 0.1})


def test_the_command_line_says_a_bad_value_in_one_line() -> None:
    from typer.testing import CliRunner

    from phalanx import cli

    res = CliRunner().invoke(cli.app, ["experiment", "convergence", "--set", "fs=[9]"])
    assert res.exit_code != 0  # phalanx.cli.main prints such an error as its one line, exit status 2
    assert isinstance(res.exception, ConfigError) and "\n" not in str(res.exception)
    assert str(res.exception).startswith("f=9 is invalid: allowed an integer with 0 <= f < n/2 = 8")


def test_the_f_trend_is_paired_by_seed(done) -> None:  # type: ignore[no-untyped-def]
    _, _, collected, _, report = done
    ts = cs.trends(SMALL, collected)
    assert [(t.problem, t.rule, t.low_f, t.high_f) for t in ts] == [(p, "cwtm", 1, 3) for p in SMALL.problems]
    for t in ts:
        logs = [math.log(collected[cs.Cell(t.problem, t.alpha, "cwtm", 3, s)].floor
                         / collected[cs.Cell(t.problem, t.alpha, "cwtm", 1, s)].floor) for s in SMALL.seeds]
        assert t.log_ratio.mean == pytest.approx(sum(logs) / 3) and t.log_ratio.k == 3
        assert t.verdict() in ("holds", "contradicted", "inconclusive")
    assert "Does more f stall higher?" in "\n".join(report.terminal)


def test_the_command_runs_end_to_end(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from phalanx import cli

    sets = ["workers=8", "rules=['mean','cwtm']", "fs=[1,3]", "alphas=[0.5]", "problems=['least-squares']",
            "rounds=5", "construction_rules=['cwtm']", "construction_fs=[1]", "construction_steps=5",
            "paper_rules=['cwtm','mean']"]
    args = ["tension", "convergence", "--seeds", "3", "--out", str(tmp_path)]
    res = CliRunner().invoke(cli.app, [*args, *(a for s in sets for a in ("--set", s))], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "Theorem 4.5" in res.output and "Proposition 3" in res.output and "Does more f stall higher?" in res.output
    assert "changed from preset quick" in res.output  # the CLI says what --set changed
    assert {p.name for p in tmp_path.iterdir()} >= {"report.md", "cells.csv", "convergence.png"}
    report = (tmp_path / "report.md").read_text()
    assert "`phalanx tension convergence --preset quick --seeds 3 --set workers=8" in report
    assert_rebuilt("convergence", tmp_path, 3, sets)
    again = tmp_path / "again"  # the same command from its runs.csv: nothing run, the same cells
    res = CliRunner().invoke(cli.app, [*args[:-1], str(again), "--results", str(tmp_path / "runs.csv"),
                                       *(a for s in sets for a in ("--set", s))], env={"COLUMNS": "80"})
    assert res.exit_code == 0 and "nothing trained" in res.output, res.output
    assert (again / "cells.csv").read_bytes() == (tmp_path / "cells.csv").read_bytes()


def test_the_more_f_trends_are_holm_corrected(done) -> None:  # type: ignore[no-untyped-def]
    """The report reads every "does more f stall higher?" comparison, so they are one Holm family: each decided
    estimate carries the family's size and an adjusted p-value no smaller than its own, and its verdict is decided
    on it — a ratio whose own p is below 0.05 but whose adjusted p is not is inconclusive (the mutant that reads the
    per-comparison interval would say it holds). The documented quick table (docs/tension.md, rebuilt by the docs
    check from its committed runs) pins the corrected verdicts of the real preset."""
    _, _, collected, _, _ = done
    bounded = [r for r in cs.rows(SMALL, collected) if r.bounded]
    assert len(bounded) >= 2 and {r.share.family for r in bounded} == {len(bounded)}  # the rows' own family
    ts = cs.trends(SMALL, collected)
    decided = [t for t in ts if t.log_ratio.p_adjusted is not None]
    assert len(decided) >= 2 and {t.log_ratio.family for t in decided} == {len(decided)}
    for t in decided:
        assert t.log_ratio.p_adjusted >= t.log_ratio.p_value()  # type: ignore[operator]
    # a family of five: each ratio's own p ≈ 0.013, adjusted ≈ 0.064 — inconclusive, though each interval is above 1
    logs = cs.mean_ci([math.log(v) for v in (1.9, 2.2, 2.6)])
    assert logs.low > 0 and (logs.p_value() or 1) < 0.05
    five = cs.holm_family([cs.Trend("mlp", 0.5, "cwtm", 1, 3, logs)] * 5, "log_ratio")
    uncorrected = dataclasses.replace(five[0], log_ratio=dataclasses.replace(five[0].log_ratio, p_adjusted=None))
    assert uncorrected.verdict() == "holds"
    assert {t.verdict() for t in five} == {"inconclusive"}


def test_the_real_problem_panels_draw_each_rule_in_its_colour(done, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                                             tmp_path: Path) -> None:
    """The mean was blue and cwtm orange here while every other figure draws cwtm blue and the mean red
    (``plots.rule_colours``); each rule's curve and its dashed bound now take the rule's colour. Mutant: the former
    positional ``C{i}`` (the first rule drawn, the mean, in C0 — cwtm's colour)."""
    import matplotlib.pyplot as plt

    from phalanx.experiments import plots

    _, _, collected, _, _ = done
    drawn: list[tuple[str, str]] = []

    def capture(fig: Any, path: Path, dpi: int = 100) -> Path:
        drawn.extend((str(line.get_label()), str(line.get_color())) for ax in fig.axes[1:] for line in ax.get_lines())
        plt.close(fig)
        return path

    monkeypatch.setattr(plots, "save_figure", capture)
    cs.plot(SMALL, collected, tmp_path / "c.png")
    colours = plots.rule_colours(list(SMALL.rules))
    curves = [(label.split()[0], colour) for label, colour in drawn if not label.startswith("_") and label.split()[0]
              in colours]
    assert {rule for rule, _ in curves} == set(SMALL.rules)
    assert all(colour == colours[rule] for rule, colour in curves), curves
    assert colours["mean"] != "C0"  # the mutant's colour for the first rule drawn


def test_the_construction_panel_draws_cwtm_in_shades_of_its_blue(done, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                                                  tmp_path: Path) -> None:
    """The construction panel's curves are cwtm at growing f: each a shade of cwtm's colour (same hue), light to
    dark, distinct. Mutant: the viridis map it used (cwtm f = 1 in krum's purple) fails the hue check."""
    import colorsys

    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    from phalanx.experiments import plots

    _, _, collected, _, _ = done
    seen: list[Any] = []

    def capture(fig: Any, path: Path, dpi: int = 100) -> Path:
        seen.extend(line.get_color() for line in fig.axes[0].get_lines()
                    if str(line.get_label()).startswith("cwtm f="))
        plt.close(fig)
        return path

    monkeypatch.setattr(plots, "save_figure", capture)
    cs.plot(SMALL, collected, tmp_path / "c.png")
    assert len(seen) >= 2 and len({tuple(to_rgb(c)) for c in seen}) == len(seen)
    hue = colorsys.rgb_to_hsv(*to_rgb(plots.rule_colours(["cwtm"])["cwtm"]))[0]
    assert all(abs(colorsys.rgb_to_hsv(*to_rgb(c))[0] - hue) < 0.01 for c in seen), seen
    viridis_first = colorsys.rgb_to_hsv(*plt.get_cmap("viridis")(0.0)[:3])[0]
    assert abs(viridis_first - hue) > 0.05  # what the check rejects: the map's first colour is not cwtm's hue


def test_one_seed_above_its_proven_bound_is_reported_before_the_mean() -> None:
    """The bound is deterministic, per seed: a seed whose floor is 1.5 × its bound contradicts it, though the mean of
    log(floor/bound) over five seeds is below 0 (the t-test alone said "below the bound")."""
    from phalanx.studies.reporting import holm_family

    shares = [-2.0, -2.1, -1.9, -2.0, math.log(1.5)]
    e = cs.mean_ci([1.0])
    row = cs.Row("least-squares", 0.1, "cwtm", 2, e, e, cs.mean_ci(shares), e, 0.1429, "proven")
    [row] = holm_family([row], "share")
    assert row.share.verdict("negative") == "holds"  # the statistical verdict alone would say below
    assert row.verdict() == "above the bound (the seed at index 4)"
    named = cs.Row("least-squares", 0.1, "cwtm", 2, e, e, cs.mean_ci(shares), e, 0.1429, "proven",
                   (0, 1, 2, 3, 7))
    assert named.verdict() == "above the bound (seed 7)"
    below = cs.Row("least-squares", 0.1, "cwtm", 2, e, e, cs.mean_ci(shares[:4]), e, 0.1429, "proven")
    assert holm_family([below], "share")[0].verdict() == "below the bound"


def test_a_seed_above_its_bound_is_not_hidden_by_a_seed_whose_floor_is_zero(done) -> None:  # type: ignore[no-untyped-def]
    """A review: a seed whose floor is 0 (or whose bound is 0) made the shares infinite, the row's share an estimate
    with no samples, and another seed 10 × above its bound was no longer reported. Each seed is now held to its bound
    before any logarithm."""
    _, _, collected, _, _ = done
    first = next(r for r in cs.rows(SMALL, collected) if r.bounded)
    key = (first.problem, first.alpha, first.rule, first.f)
    cells = sorted((c for c in collected if (c.problem, c.alpha, c.rule, c.f) == key), key=lambda c: c.seed)
    forged = dict(collected)
    forged[cells[0]] = dataclasses.replace(collected[cells[0]], floor=0.0)
    forged[cells[1]] = dataclasses.replace(collected[cells[1]], floor=10 * collected[cells[1]].bound)
    row = next(r for r in cs.rows(SMALL, forged) if (r.problem, r.alpha, r.rule, r.f) == key)
    assert row.verdict() == f"above the bound (seed {cells[1].seed})"
