"""The planner (`phalanx tension plan`): the grid it builds, its recommendation rule, and a tiny real run."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phalanx import cli
from phalanx.errors import ConfigError
from phalanx.studies import planner
from phalanx.studies.planner import Row

BASE = {"dataset": "digits", "model": "mlp", "workers": 10, "rounds": 5, "eval_every": 5, "batch_size": 8}


def test_default_fs() -> None:
    assert planner.default_fs(2, 10) == [1, 2, 4]
    assert planner.default_fs(3, 10) == [1, 3]  # 2K = 6 > ⌊9/2⌋
    assert planner.default_fs(0, 16) == [1, 3]


def test_make_plan_grid() -> None:
    plan = planner.make_plan(BASE, expect=2, rules=["cwtm", "krum"], fs=[1, 2, 4], attacks=["alie", "signflip"])
    # krum needs n > 2f + 2: f = 4 is skipped with the reason
    assert any("krum with f=4" in s for s in plan.skipped)
    settings = {(j.rule, j.f) for j in plan.jobs}
    assert ("mean", 0) in settings and ("cwtm", 4) in settings and ("krum", 4) not in settings
    for job, cfg in zip(plan.jobs, plan.configs):
        assert cfg.byzantine == (0 if job.attack == "none" else 2)
        assert cfg.f == job.f and cfg.aggregator == job.rule and cfg.attack == job.attack
    assert len(plan.jobs) == (1 + 3 + 2) * 3  # settings × (none + 2 attacks), one seed


def test_make_plan_takes_lists_from_the_config_and_rejects_others() -> None:
    plan = planner.make_plan({**BASE, "aggregator": ["cwtm", "geomed"], "seed": [0, 1]}, expect=1, fs=[1])
    assert plan.rules == ["cwtm", "geomed"] and plan.seeds == [0, 1]
    with pytest.raises(ConfigError, match="alpha"):
        planner.make_plan({**BASE, "alpha": [0.1, 1.0]}, expect=1)
    with pytest.raises(ConfigError, match="expect_byzantine"):
        planner.make_plan(BASE, expect=10)
    with pytest.raises(ConfigError, match="rules"):
        planner.make_plan(BASE, expect=1, rules=["nosuchrule"])


def _row(rule: str, f: int, no: float, worst: float | None) -> Row:
    return Row(rule, f, no, 0.9 - no, None, {"alie": worst} if worst is not None else {}, worst,
               "alie" if worst is not None else None)


def test_recommend_cheapest_among_equally_robust() -> None:
    rows = [_row("mean", 0, 0.90, 0.10), _row("cwtm", 1, 0.89, 0.50), _row("cwtm", 2, 0.87, 0.80),
            _row("cwtm", 4, 0.80, 0.81), _row("nnm>cwtm", 2, 0.885, 0.805)]
    rec = planner.recommend(rows, expect=2, tolerance=0.01)
    # cwtm f=4 has the best worst case (0.81); cwtm f=2 and nnm>cwtm f=2 are within 1 point; nnm>cwtm is cheapest
    assert (rec.rule, rec.f) == ("nnm>cwtm", 2)
    assert "80.5%" in rec.text and "10.0%" in rec.text
    strict = planner.recommend(rows, expect=2, tolerance=0.0)
    assert (strict.rule, strict.f) == ("cwtm", 4)
    # f below the threat is never recommended, however good it looks
    rows.append(_row("geomed", 1, 0.95, 0.95))
    assert planner.recommend(rows, expect=2).rule != "geomed"
    assert planner.recommend(rows, expect=0).rule == "geomed"
    with pytest.raises(ConfigError, match="tolerance"):
        planner.recommend(rows, expect=1, tolerance=2.0)


def test_recommend_without_candidates_says_so() -> None:
    rec = planner.recommend([_row("mean", 0, 0.9, 0.1), _row("cwtm", 1, 0.88, 0.5)], expect=3)
    assert "f >= 3" in rec.text


def test_tiny_plan_end_to_end(tmp_path: Path) -> None:
    cfg = tmp_path / "task.toml"
    cfg.write_text('dataset = "digits"\nmodel = "logreg"\nworkers = 7\nrounds = 4\neval_every = 2\nbatch_size = 8\n')
    out = tmp_path / "plan"
    res = CliRunner().invoke(cli.app, [
        "tension", "plan", str(cfg), "--expect-byzantine", "1", "--rules", "cwtm,nnm>cwtm", "--f", "1,2",
        "--attacks", "alie,signflip", "--out", str(out), "--jobs", "1",
    ])
    assert res.exit_code == 0, res.output
    assert "use " in res.output
    rows = list(csv.DictReader(io.StringIO((out / "plan.csv").read_text())))
    assert [(r["rule"], r["f"]) for r in rows] == [("mean", "0"), ("cwtm", "1"), ("cwtm", "2"), ("nnm>cwtm", "1"),
                                                   ("nnm>cwtm", "2")]
    for r in rows:
        assert 0 <= float(r["no_attack"]) <= 1 and r["worst_attack"] in ("alie", "signflip")
        assert float(r["worst"]) == min(float(r["alie"]), float(r["signflip"]))
    assert float(rows[0]["cost"]) == 0.0
    assert (out / "plan.png").stat().st_size > 0 and "Robustness plan" in (out / "plan.md").read_text()
    assert len([p for p in (out / "runs").iterdir() if p.is_dir()]) == 5 * 3  # run directories (and grid.json)


def _attacked(rule: str, f: int, no: float, under: dict[str, float]) -> Row:
    worst = min(under, key=lambda a: under[a])
    return Row(rule, f, no, 0.9 - no, None, under, under[worst], worst)


def test_recommend_never_picks_a_rule_worse_than_no_defence() -> None:
    mean = _attacked("mean", 0, 0.90, {"alie": 0.50, "signflip": 0.70})
    cheap = _attacked("cwtm", 2, 0.89, {"alie": 0.40, "signflip": 0.85})  # the best no-attack, worse worst case
    robust = _attacked("nnm>cwtm", 2, 0.85, {"alie": 0.60, "signflip": 0.65})
    rec = planner.recommend([mean, cheap, robust], expect=2, tolerance=0.5)  # a tolerance that would take cwtm
    assert (rec.rule, rec.f) == ("nnm>cwtm", 2)
    assert "Left out as worse than no defence under the attacks tried: cwtm (f=2)." in rec.text


def test_recommend_the_mean_when_every_robust_rule_did_worse() -> None:
    mean = _attacked("mean", 0, 0.90, {"alie": 0.60, "signflip": 0.70})
    everywhere = [_attacked("cwtm", 2, 0.88, {"alie": 0.50, "signflip": 0.65}),
                  _attacked("krum", 2, 0.80, {"alie": 0.55, "signflip": 0.30})]
    rec = planner.recommend([mean, *everywhere], expect=2)
    assert (rec.rule, rec.f) == ("mean", 0)
    assert "use mean (f=0)" in rec.text and "did worse than the plain mean under every attack tried" in rec.text
    assert "60.0% under its worst attack (alie)" in rec.text and "krum with f=2, 55.0%" not in rec.text
    assert "cwtm with f=2, 50.0% under alie" in rec.text
    # better under one attack, worse in the worst case: still the mean, and the text says in what sense
    mixed = [_attacked("cwtm", 2, 0.88, {"alie": 0.50, "signflip": 0.95})]
    rec = planner.recommend([mean, *mixed], expect=2)
    assert rec.rule == "mean" and "in the worst case over the attacks tried" in rec.text
    # a tie with the mean is not worse; the text says the attacks do not separate them
    tie = planner.recommend([mean, _attacked("cwtm", 2, 0.88, {"alie": 0.60, "signflip": 0.60})], expect=2)
    assert tie.rule == "cwtm" and "do not separate it from the mean" in tie.text


def test_skipped_settings_say_what_to_change() -> None:
    plan = planner.make_plan({**BASE, "workers": 10}, expect=2, rules=["krum", "bulyan", "clip>mean"], fs=[2, 4, 5],
                             attacks=["alie"])
    notes = {n.split(":")[0]: n for n in plan.skipped}
    assert notes["krum with f=4"].endswith("with n = 10 use f <= 3 for krum, or n >= 11 workers for f=4")
    assert notes["bulyan with f=2"].endswith("with n = 10 use f <= 1 for bulyan, or n >= 11 workers for f=2")
    # a rule with no requirement of its own: f >= n/2 is still too large
    assert "f >= n/2 leaves no honest majority" in notes["clip>mean with f=5"]
    assert notes["clip>mean with f=5"].endswith("use f <= 4 for clip>mean, or n >= 11 workers for f=5")
    # clip>mean's output does not depend on f: it runs once, at the smallest f >= K it can run with
    assert "clip>mean" in plan.f_free and [f for r, f in {(j.rule, j.f) for j in plan.jobs} if r == "clip>mean"] == [2]
    small = planner.too_large("bulyan", 1, 6)
    assert small is not None and small.endswith("bulyan cannot run with n = 6 at any f >= 1: use n >= 7 workers for "
                                                "f=1")
    assert planner.too_large("krum", 3, 10) is None and planner.largest_f("krum", 10) == 3


def test_recommend_says_what_to_change_when_nothing_tolerates_the_threat() -> None:
    rows = [_row("mean", 0, 0.9, 0.1), _row("cwtm", 4, 0.88, 0.5)]
    rec = planner.recommend(rows, expect=5, workers=10)
    assert rec.rule == "mean" and "Use n >= 11 workers, or plan for at most 4 Byzantine worker(s)" in rec.text
    rec = planner.recommend([_row("mean", 0, 0.9, 0.1), _row("cwtm", 1, 0.88, 0.5)], expect=3, workers=10)
    assert "add f = 3 to the f values (--f) (with n = 10, f can be at most 4" in rec.text


def test_tiny_plan_says_what_to_change_for_the_skipped_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "task.toml"
    cfg.write_text('dataset = "digits"\nmodel = "logreg"\nworkers = 5\nrounds = 2\neval_every = 2\nbatch_size = 8\n')
    out = tmp_path / "plan"
    res = CliRunner().invoke(cli.app, [
        "tension", "plan", str(cfg), "--expect-byzantine", "1", "--rules", "krum", "--f", "1,2,3",
        "--attacks", "signflip", "--out", str(out), "--jobs", "1",
    ])
    assert res.exit_code == 0, res.output
    md = (out / "plan.md").read_text()
    assert "- skipped: krum with f=2: needs n >= 7 (n > 2f + 2), n = 5 — with n = 5 use f <= 1 for krum, or n >= 7 " \
           "workers for f=2" in md
    assert "- skipped: krum with f=3: needs n >= 9" in md
    assert "use krum with f=1" in md or "use mean (f=0) — no defence" in md
    assert "\r" not in res.output and "4/4 runs done" in res.output  # mean, krum f=1: no attack and under attack


def test_what_the_planner_can_know_it_refuses_before_training() -> None:
    with pytest.raises(ConfigError, match=r"expect_byzantine=5 .*< n/2 = 5 .*use n >= 11 workers"):
        planner.make_plan(BASE, expect=5)  # n = 10: no rule tolerates 5 Byzantine workers
    with pytest.raises(ConfigError, match=r"f=\[1, 2\] .*at least one value >= expect_byzantine = 3"):
        planner.make_plan(BASE, expect=3, rules=["cwtm"], fs=[1, 2])
    with pytest.raises(ConfigError, match=r"krum with f=4"):  # the only f >= K krum cannot run with: says why
        planner.make_plan(BASE, expect=4, rules=["krum"], fs=[1, 4])


def test_a_rule_whose_output_does_not_depend_on_f_is_planned_once() -> None:
    assert not planner.f_matters("geomed", 1, 4, 10) and planner.f_matters("krum", 1, 3, 10)
    assert planner.f_matters("cwtm", 1, 4, 10) and not planner.f_matters("cwmed", 1, 4, 10)
    plan = planner.make_plan(BASE, expect=2, rules=["geomed", "cwtm"], fs=[1, 2, 4], attacks=["alie"])
    settings = sorted({(j.rule, j.f) for j in plan.jobs})
    assert settings == [("cwtm", 1), ("cwtm", 2), ("cwtm", 4), ("geomed", 2), ("mean", 0)]
    assert plan.f_free == {"geomed"}
    row = Row("geomed", 2, 0.9, 0.0, None, {"alie": 0.8}, 0.8, "alie", f_free=True)
    rec = planner.recommend([_row("mean", 0, 0.9, 0.1), row], expect=2)
    assert "use geomed (its output does not depend on f)" in rec.text and row.f_label == "any"


def test_intervals_from_three_seeds_and_a_caveat_below() -> None:
    from phalanx.analysis.stats import mean_ci

    ci = mean_ci([0.80, 0.82, 0.84])
    robust = Row("cwtm", 2, 0.88, 0.02, None, {"alie": 0.82}, 0.82, "alie", seeds=3, no_attack_ci=ci, worst_ci=ci)
    mean = Row("mean", 0, 0.90, 0.0, None, {"alie": 0.10}, 0.10, "alie", seeds=3)
    rec = planner.recommend([mean, robust], expect=2)
    assert not rec.text.startswith("From") and planner.with_interval(0.82, ci) == "82.0 ± 5.0"
    one = planner.recommend([_row("mean", 0, 0.9, 0.1), _row("cwtm", 2, 0.88, 0.8)], expect=2)
    assert one.text.startswith("From 1 seed(s) — a suggestion, not a verdict")
    # the tolerance: one test sample (here 1/360), or the seeds' spread of the worst cases when that is wider
    assert planner.derived_tolerance([mean, robust], 360) == pytest.approx(ci.half_width)
    assert planner.derived_tolerance([_row("cwtm", 2, 0.88, 0.8)], 360) == pytest.approx(1 / 360)


def test_coinciding_points_share_one_label() -> None:
    """The plan's plot: a setting that lands on another (here cwtm f=4 on the mean, at the table's 0.1-point
    precision) is named in one label with it, not printed over it; distinct points keep their own 'f=K'."""
    rows = [Row("mean", 0, 0.955, 0.0, None, {"minmax": 0.876}, 0.876, "minmax"),
            Row("cwtm", 4, 0.9551, 0.0, None, {"minmax": 0.8762}, 0.8762, "minmax"),
            Row("cwtm", 8, 0.941, 0.014, None, {"signflip": 0.854}, 0.854, "signflip")]
    labels = {text: (x, y) for x, y, text in planner.point_labels(rows)}
    assert labels == {"mean = cwtm f=4": (95.5, 87.6), "f=8": (94.1, 85.4)}
