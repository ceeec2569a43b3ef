"""The price and rescue of robustness in every report: each robust rule against the mean, paired by seed, with no
attack (price) and under an attack (rescue); split by the other keys that vary; no interval from fewer than three
seeds or from seeds that agree exactly; no table when a grid lacks the mean or the no-attack runs; and end to end,
``phalanx run`` prints it and ``report.md`` has it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from phalanx import cli
from phalanx.analysis.stats import mean_ci
from phalanx.cli.grid_tables import grid_tables
from phalanx.experiments import plots, report, store

EPS = sys.float_info.epsilon  # the accuracies are Python floats (float64)


def _row(aggregator: str, attack: str, seed: int, acc: float, **other: Any) -> dict[str, Any]:
    """The last metrics row of one finished run, as :func:`report.collect` gives it."""
    run = "_".join([aggregator, attack, f"s{seed}", *(f"{k}{v}" for k, v in sorted(other.items()))])
    return {"run": run, "round": 10, "test_accuracy": acc, "aggregator": aggregator, "attack": attack, "seed": seed,
            "finished": True, "run_diverged": False, "f": 2, "alpha": 1.0, **other}


# Per seed: the mean and cwtm with no attack and under ALIE. The seeds differ a lot in level (0.6 … 0.9) and little
# in the differences, so the paired interval is narrow where an unpaired one would not be.
ACC = {  # seed: (mean none, cwtm none, mean alie, cwtm alie)
    0: (0.90, 0.88, 0.30, 0.80),
    1: (0.70, 0.69, 0.12, 0.61),
    2: (0.60, 0.57, 0.05, 0.52),
    3: (0.80, 0.78, 0.25, 0.74),
}


def _grid(seeds: list[int], **other: Any) -> list[dict[str, Any]]:
    rows = []
    for s in seeds:
        mn, cn, ma, ca = ACC[s]
        rows += [_row("mean", "none", s, mn, **other), _row("cwtm", "none", s, cn, **other),
                 _row("mean", "alie", s, ma, **other), _row("cwtm", "alie", s, ca, **other)]
    return rows


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=16 * EPS, abs_tol=16 * EPS)


def test_price_and_rescue_are_per_seed_differences_against_the_mean() -> None:
    rows = _grid([3, 0, 2, 1])  # any order: pairing is by seed, not by position
    (t,) = report.tradeoff(rows)
    assert (t.rule, t.attack, t.seeds) == ("cwtm", "alie", (0, 1, 2, 3))
    for s, (mn, cn, ma, ca) in ACC.items():
        assert _close(t.price.per_seed[s], mn - cn) and _close(t.rescue.per_seed[s], ca - ma)
    want = mean_ci([ACC[s][0] - ACC[s][1] for s in range(4)])
    assert _close(t.price.estimate.mean, want.mean) and _close(t.price.estimate.low, want.low)
    assert t.price.estimate.k == t.rescue.estimate.k == 4
    # paired: the interval is that of the differences, far narrower than the spread of the accuracies themselves
    assert t.price.estimate.half_width < 0.05 < mean_ci([ACC[s][1] for s in range(4)]).half_width
    assert t.price.why_no_interval is None and t.rescue.why_no_interval is None
    assert t.verdict == "costs accuracy; rescues"


def test_a_seed_is_compared_only_where_all_four_runs_have_it() -> None:
    rows = [r for r in _grid([0, 1, 2, 3]) if (r["seed"], r["aggregator"], r["attack"]) != (3, "mean", "alie")]
    (t,) = report.tradeoff(rows)
    assert t.seeds == (0, 1, 2) and set(t.price.per_seed) == set(t.rescue.per_seed) == {0, 1, 2}


def test_other_varying_keys_split_the_comparison() -> None:
    # the same rules at f = 2 and f = 4 (and an α the f = 4 runs share): never mixed
    low = _grid([0, 1, 2], f=2)
    high = [{**r, "test_accuracy": r["test_accuracy"] / 2} for r in _grid([0, 1, 2], f=4)]
    ts = report.tradeoff(low + high)
    assert sorted(dict(t.context)["f"] for t in ts) == [2, 4]
    assert report.tradeoff_keys(ts) == ["f"]
    by_f = {dict(t.context)["f"]: t for t in ts}
    for s in (0, 1, 2):
        mn, cn, ma, ca = ACC[s]
        assert _close(by_f[2].price.per_seed[s], mn - cn) and _close(by_f[4].price.per_seed[s], (mn - cn) / 2)
        assert _close(by_f[4].rescue.per_seed[s], (ca - ma) / 2)
    head, lines = report.tradeoff_table(ts)
    assert head[:3] == ["rule", "f", "attack"] and [line[1] for line in lines] == ["2", "4"]


def test_runs_differing_in_a_key_the_report_does_not_tell_apart_are_left_out() -> None:
    rows = _grid([0, 1, 2])
    rows.append({**rows[0], "run": "mean_none_s0_again", "test_accuracy": 0.1})  # a second (mean, none, seed 0)
    (t,) = report.tradeoff(rows)
    assert t.seeds == (1, 2)


def test_no_interval_and_no_verdict_from_fewer_than_three_seeds() -> None:
    (t,) = report.tradeoff(_grid([0, 1]))
    assert t.seeds == (0, 1)
    assert t.price.why_no_interval == "2 seeds, 3 needed" == t.rescue.why_no_interval
    assert t.verdict == "no interval (2 seeds, 3 needed)"  # said once, not twice (a newcomer's 139-column row)
    head, (line,) = report.tradeoff_table([t])
    assert head == ["rule", "attack", "price (pts)", "95 % interval", "Holm p (price)", "rescue (pts)",
                    "95 % interval", "Holm p (rescue)", "seeds", "verdict"]
    assert line[2] == f"{100 * (ACC[0][0] - ACC[0][1] + ACC[1][0] - ACC[1][1]) / 2:+.1f}"  # the numbers, printed
    assert line[3] == line[4] == line[6] == line[7] == "—" and line[8] == "2"  # and no interval, no p
    assert report.points_pm(t.price) == line[2] and "±" not in report.points_pm(t.rescue)
    (one,) = report.tradeoff(_grid([0]))
    assert one.price.why_no_interval == "1 seed, 3 needed"


def test_no_interval_when_every_seed_gives_the_same_difference() -> None:
    rows = [{**r, "test_accuracy": 0.5 if r["aggregator"] == "mean" else 0.25} for r in _grid([0, 1, 2])]
    (t,) = report.tradeoff(rows)
    assert t.price.why_no_interval == "zero width: every seed gives the same difference"
    assert t.verdict.startswith("no interval (zero width")
    assert _close(t.price.estimate.mean, 0.25) and _close(t.rescue.estimate.mean, -0.25)


@pytest.mark.parametrize("drop", ["none", "mean", "alie"])
def test_no_tradeoff_without_the_no_attack_runs_the_mean_or_an_attack(drop: str) -> None:
    rows = [r for r in _grid([0, 1, 2]) if drop not in (r["aggregator"], r["attack"])]
    assert report.tradeoff(rows) == []


def test_unfinished_runs_are_not_compared_and_diverged_ones_are() -> None:
    rows = _grid([0, 1, 2])
    for r in rows:
        if r["seed"] == 2 and r["aggregator"] == "cwtm" and r["attack"] == "none":
            r["finished"] = False
        if r["aggregator"] == "mean" and r["attack"] == "alie":  # diverged: its final accuracy counts as 0
            r.update(finished=False, run_diverged=True, test_accuracy=0.0)
    (t,) = report.tradeoff(rows)
    assert t.seeds == (0, 1)
    assert all(_close(t.rescue.per_seed[s], ACC[s][3]) for s in (0, 1))


def _write_runs(root: Path, rows: list[dict[str, Any]]) -> None:
    for r in rows:
        d = root / r["run"]
        cfg = {k: v for k, v in r.items() if k not in ("run", "round", "test_accuracy", "finished", "run_diverged")}
        store.prepare_run_dir(d, cfg, 0, "synthetic")
        store.finish_run(d, [{**cfg, "round": r["round"], "test_accuracy": r["test_accuracy"]}])


def test_report_md_has_the_table_and_the_plot_only_when_there_is_a_tradeoff(tmp_path: Path) -> None:
    _write_runs(tmp_path / "with", _grid([0, 1, 2]))
    result = report.write_report(tmp_path / "with")
    md = (tmp_path / "with" / "report.md").read_text()
    assert "## The price and rescue of robustness" in md and report.TRADEOFF_MEANING in md
    head = ("| rule | attack | price (pts) | 95 % interval | Holm p (price) | rescue (pts) | 95 % interval | "
            "Holm p (rescue) |")
    assert head in md
    assert ("| cwtm | alie | +2.0 | [-0.5, +4.5] | 0.074 | +48.7 | [+44.9, +52.5] | 0.00066 | 3 | no cost shown; "
            "rescues |") in md
    assert "![price against rescue per rule, against the mean](tradeoff.png)" in md
    assert (tmp_path / "with" / "tradeoff.png").is_file() and len(result["tradeoff"]) == 1
    _write_runs(tmp_path / "without", [r for r in _grid([0, 1, 2]) if r["attack"] != "none"])
    result = report.write_report(tmp_path / "without")
    assert result["tradeoff"] == [] and not (tmp_path / "without" / "tradeoff.png").exists()
    assert "## The price and rescue" not in (tmp_path / "without" / "report.md").read_text()
    # several settings and no comparison: the terminal and report.md say what would make one
    assert report.NO_COMPARISON in (tmp_path / "without" / "report.md").read_text()
    assert report.NO_COMPARISON in grid_tables(result)[0].notes
    assert report.NO_COMPARISON not in grid_tables(report.write_report(tmp_path / "with"))[0].notes


def test_a_rule_has_one_colour_in_every_plot(tmp_path: Path) -> None:
    rows = _grid([0, 1, 2]) + [{**r, "aggregator": "krum"} for r in _grid([0, 1, 2]) if r["aggregator"] == "cwtm"]
    colours = plots.rule_colours([r["aggregator"] for r in rows])
    styles = plots.curve_styles(rows, ["aggregator", "attack"])
    for r in rows:
        label = f"{r['aggregator']}, attack={r['attack']}"
        assert styles[label]["color"] == colours[r["aggregator"]]
    assert styles["cwtm, attack=none"]["linestyle"] != styles["cwtm, attack=alie"]["linestyle"]
    assert styles["cwtm, attack=none"]["linestyle"] == styles["krum, attack=none"]["linestyle"]
    assert report.plot_tradeoff(report.tradeoff(rows), tmp_path / "t.png") == tmp_path / "t.png"


TINY_GRID = {"dataset": "digits", "model": "logreg", "workers": 5, "byzantine": 1, "f": 1, "partition": "iid",
             "aggregator": ["mean", "cwtm"], "attack": ["none", "inf"], "seed": [0, 1, 2], "rounds": 2,
             "eval_every": 1, "checkpoint_every": 2, "batch_size": 8}


def test_phalanx_run_prints_the_tradeoff_and_report_md_has_it(tmp_path: Path) -> None:
    cfg = tmp_path / "grid.toml"
    cfg.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in TINY_GRID.items()) + "\n")
    res = CliRunner().invoke(cli.app, ["run", str(cfg), "--out", str(tmp_path / "out"), "--jobs", "1"])
    assert res.exit_code == 0, res.output
    assert "The price and rescue of robustness" in res.output
    after = res.output.split("The price and rescue of robustness", 1)[1]  # (the summary above has a cwtm/inf row too)
    (line,) = [ln for ln in after.splitlines() if ln.split()[:2] == ["cwtm", "inf"]]  # whatever 2 rounds give
    assert line.split()[-1] != "inf"  # the numbers and the verdict follow
    assert "Price = accuracy of the mean with no attack" in res.output
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## The price and rescue of robustness" in md and "| cwtm | inf |" in md and "| 3 |" in md
    assert (tmp_path / "out" / "tradeoff.png").is_file()


def test_the_default_job_compares_rules_with_no_attack_and_under_one_over_three_seeds_or_more() -> None:
    from phalanx.experiments import grid
    from phalanx.experiments.config import load_grid

    cfgs = grid.configs(load_grid(None, []))
    assert report.MEAN in {c.aggregator for c in cfgs} and len({c.aggregator for c in cfgs}) >= 4
    attacks = {c.attack for c in cfgs}
    assert report.NO_ATTACK in attacks and len(attacks) >= 2
    assert len({c.seed for c in cfgs}) >= report.MIN_SEEDS


def test_prices_and_rescues_are_one_holm_family() -> None:
    """A report reads every price and rescue at once: each is decided by its Holm-adjusted p over all of them — a
    price whose interval excludes 0 alone may show no cost among eight comparisons (the default run's krum)."""
    rows = _grid([0, 1, 2])
    (t,) = report.tradeoff(rows)
    assert t.price.estimate.family == 2 and t.rescue.estimate.family == 2
    p, r = t.price.estimate.p_value(), t.rescue.estimate.p_value()
    assert p is not None and r is not None
    assert t.price.estimate.p_adjusted == pytest.approx(max(min(1.0, 2 * min(p, r)), min(1.0, max(p, r))))


def test_a_rules_price_is_one_test_however_many_attacks_it_is_shown_beside() -> None:
    """A grid with two attacks shows cwtm's price twice (one row per attack), but it is one comparison — the same
    no-attack runs — so the family holds one price and two rescues: 3 tests, not 4 (counting it per attack made a
    first-hour review's Krum price p 0.0147 × 12 instead of × 9). The mutant family of 4 is told apart."""
    rows = _grid([0, 1, 2])
    rows += [{**r, "attack": "signflip", "run": r["run"].replace("alie", "signflip"),
              "test_accuracy": r["test_accuracy"] * 0.9} for r in rows if r["attack"] == "alie"]
    alie, signflip = sorted(report.tradeoff(rows), key=lambda t: t.attack)
    assert alie.price.estimate == signflip.price.estimate  # one test, shown twice
    assert {t.price.estimate.family for t in (alie, signflip)} == {3}
    assert {t.rescue.estimate.family for t in (alie, signflip)} == {3}


@pytest.mark.parametrize(("seeds", "said"), [([0], "over 1 seed\n"), ([0, 1, 2], "over 3 seeds\n")])
def test_the_tradeoff_plot_says_how_many_seeds_in_words(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        seeds: list[int], said: str) -> None:
    """A newcomer read "over 1 seeds" in ``tradeoff.png``'s title: one seed is "1 seed". Mutant: the old title."""
    titles: list[str] = []

    def capture(fig: Any, path: Path, dpi: int = 100) -> Path:
        titles.append(fig._suptitle.get_text())
        return path

    monkeypatch.setattr(report, "save_figure", capture)
    report.plot_tradeoff(report.tradeoff(_grid(seeds)), tmp_path / "t.png")
    assert said in titles[0]


def test_a_point_drawn_under_another_is_named_beside_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 38: geomed (+0.2, +81.3) lay wholly under nnm>cwtm (+0.2, +81.4) in a newcomer's tradeoff.png with
    nothing to say so. krum here has cwtm's accuracies to the digit: its point covers cwtm's, and the panel says
    "cwtm hidden under krum". Mutant: no label (``label_hidden`` a no-op) leaves the pair unnamed."""
    rows = _grid([0, 1, 2]) + [{**r, "aggregator": "krum", "run": r["run"].replace("cwtm", "krum")}
                               for r in _grid([0, 1, 2]) if r["aggregator"] == "cwtm"]
    said: list[str] = []

    def capture(fig: Any, path: Path, dpi: int = 100) -> Path:
        said.extend(t.get_text() for ax in fig.axes for t in ax.texts)
        return path

    monkeypatch.setattr(report, "save_figure", capture)
    report.plot_tradeoff(report.tradeoff(rows), tmp_path / "t.png")
    assert said == ["cwtm hidden under krum"]
    assert report.hidden_pairs([("mean", 0.0, 0.0), ("a", 5.0, 50.0), ("b", 40.0, 90.0)], 40.0, 90.0) == []
    assert report.hidden_pairs([("mean", 0.0, 0.0), ("a", 0.3, 0.5)], 40.0, 90.0) == [("mean", "a")]
    said.clear()
    monkeypatch.setattr(report, "label_hidden", lambda ax, placed, colours: None)
    report.plot_tradeoff(report.tradeoff(rows), tmp_path / "t.png")
    assert said == []  # what the first assertion rejects


def test_the_price_stands_on_honest_runs_where_the_grid_has_them() -> None:
    """The all-honest baseline (``honest``: the would-be Byzantine workers train on their own data) is Yang, Shi &
    Li's "nobody attacks"; ``none`` replays copies of honest rows, which Krum picks (a first-hour review measured the
    default job's Krum price at +10.3 points on ``none`` runs, +4.8 on ``honest`` ones). A grid with both measures
    the price on ``honest`` and reads neither as an attack; a grid with only ``none`` uses it and says so under the
    table. Mutants: ``none`` preferred, or ``honest`` read as an attack, fail it."""
    honest = [{**r, "attack": "honest", "run": r["run"].replace("none", "honest"),
               "test_accuracy": r["test_accuracy"] + (0.01 if r["aggregator"] == "cwtm" else 0.0)}
              for r in _grid([0, 1, 2]) if r["attack"] == "none"]
    (t,) = report.tradeoff(_grid([0, 1, 2]) + honest)
    assert (t.attack, t.baseline) == ("alie", "honest")
    for s in (0, 1, 2):
        assert _close(t.price.per_seed[s], ACC[s][0] - (ACC[s][1] + 0.01))
    assert report.REPLAYED_BASELINE not in report.tradeoff_markdown([t])
    (old,) = report.tradeoff(_grid([0, 1, 2]))
    assert old.baseline == "none" and _close(old.price.per_seed[0], ACC[0][0] - ACC[0][1])
    assert report.REPLAYED_BASELINE in report.tradeoff_markdown([old])
    (_, table) = grid_tables({"summary": [], "keys": [], "tradeoff": [old]})
    assert report.REPLAYED_BASELINE.replace("`", "") in table.notes[-1]


def test_the_default_job_measures_its_price_on_all_honest_runs() -> None:
    from phalanx.experiments import grid
    from phalanx.experiments.config import load_grid

    attacks = {c.attack for c in grid.configs(load_grid(None, []))}
    assert "honest" in attacks and "none" not in attacks


def test_a_later_grid_in_the_same_folder_leaves_no_plot_of_the_earlier_one(tmp_path: Path) -> None:
    """``phalanx run --set …`` without ``--out`` reports into the default job's folder: a grid with no trade-off and
    one setting must not leave the earlier grid's ``tradeoff.png`` and ``heatmap.png`` beside its report, where they
    read as its own (a first-hour review). Mutant: plots only ever added."""
    _write_runs(tmp_path / "all", _grid([0, 1, 2]))
    report.write_report(tmp_path / "all")
    assert (tmp_path / "all" / "tradeoff.png").is_file()
    (tmp_path / "all" / "heatmap.png").write_bytes(b"an earlier grid's heatmap")
    only_cwtm = [r["run"] for r in _grid([0, 1, 2]) if (r["aggregator"], r["attack"]) == ("cwtm", "alie")]
    result = report.write_report(tmp_path / "all", runs=only_cwtm)
    assert result["tradeoff"] == [] and [p.name for p in result["plots"]] == ["accuracy.png"]
    assert sorted(p.name for p in (tmp_path / "all").glob("*.png")) == ["accuracy.png"]


def test_the_report_says_what_every_run_shares(tmp_path: Path) -> None:
    """The tables show only the keys that vary, so a grid run with ``--set attack=alie --set rounds=30`` printed
    neither (a first-hour review): one line names the keys every run shares, and the seeds, in report.md and under
    the terminal's first table. Mutants: a varying key in the line, or no line, fail it."""
    _write_runs(tmp_path / "g", _grid([0, 1, 2]))
    result = report.write_report(tmp_path / "g")
    line = result["setup"]
    assert line.startswith("Setup (every run): ") and line.endswith("; seeds 0, 1, 2")
    assert "f = 2" in line and "alpha = 1.0" in line
    assert "aggregator =" not in line and "attack =" not in line  # they vary: the tables' columns
    assert line + "." in (tmp_path / "g" / "report.md").read_text()
    assert grid_tables(result)[0].notes[0] == line


def test_the_report_as_json_carries_its_numbers(tmp_path: Path) -> None:
    """``phalanx report --format json`` gives a program numbers beside the printed cells (``values``): the final
    accuracy, the aggregation error, each price and rescue with its interval and Holm p — not ``"+2.0 ± 2.5"`` or
    ``"< 1e-12"`` to parse (a first-hour review); a value the table shows as ``—`` is ``null``, never JSON's
    missing ``NaN``. Mutant: values dropped from the json."""
    _write_runs(tmp_path / "g", _grid([0, 1, 2]))
    result = report.write_report(tmp_path / "g")
    res = CliRunner().invoke(cli.app, ["report", str(tmp_path / "g"), "--format", "json"])
    assert res.exit_code == 0, res.output
    summary, trade = json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the json"))["tables"]
    assert len(summary["values"]) == len(summary["rows"]) and len(trade["values"]) == 1
    cwtm = next(v for v in summary["values"] if (v["aggregator"], v["attack"]) == ("cwtm", "alie"))
    assert _close(cwtm["final_pct"], 100 * sum(ACC[s][3] for s in (0, 1, 2)) / 3)
    (t,) = result["tradeoff"]
    v = trade["values"][0]
    assert (v["rule"], v["attack"], v["baseline"], v["seeds"]) == ("cwtm", "alie", "none", 3)
    assert _close(v["price_pts"], 100 * t.price.estimate.mean)
    assert _close(v["rescue_low_pts"], 100 * t.rescue.estimate.low)
    assert v["price_p_holm"] == t.price.estimate.p_adjusted and isinstance(v["rescue_p_holm"], float)


def test_a_value_json_cannot_hold_is_null() -> None:
    from phalanx.cli.output import Tabular, render

    t = Tabular("t", ["rule", "agg. error"])
    t.add("mean", "nan", values={"rule": "mean", "agg_error": math.nan, "inf": math.inf, "none": None, "ok": 0.5,
                                 "inside": [-math.inf, 1.0]})
    assert json.loads(render(t, "json"))["values"] == [{"rule": "mean", "agg_error": "nan", "inf": "inf", "none": None,
                                                        "ok": 0.5, "inside": ["-inf", 1.0]}]


def test_the_summary_groups_rows_by_setting_best_first_within_one(tmp_path: Path) -> None:
    """Sorted by accuracy alone, the rows with no attack and under an attack were interleaved (a first-hour review):
    the rows come grouped by the varying keys other than the rule — the no-attack baseline first — best first within
    a group, in report.md and on the terminal alike. Mutant: accuracy alone."""
    rows = [{**r, "test_accuracy": 0.99} if (r["aggregator"], r["attack"]) == ("cwtm", "alie") else r
            for r in _grid([0, 1, 2])]  # the best row is one under attack: accuracy alone would put it first
    _write_runs(tmp_path / "g", rows)
    result = report.write_report(tmp_path / "g")
    printed = [(r[0], r[1]) for r in grid_tables(result)[0].rows]
    assert printed == [("mean", "none"), ("cwtm", "none"), ("cwtm", "alie"), ("mean", "alie")]
    md = [line.split(" | ")[:2] for line in (tmp_path / "g" / "report.md").read_text().splitlines()
          if line.startswith("| mean |") or line.startswith("| cwtm |")]
    assert [(a.strip("| "), b) for a, b in md][:4] == printed


def test_a_rule_with_only_none_runs_keeps_its_price_beside_a_mean_with_honest_ones() -> None:
    """The default job's folder holds the mean's ``honest`` runs; a later grid of one rule with ``none`` and an attack
    run into it must still give that rule's price, on ``none`` (the baseline both have), not drop its row (an
    attacker's review of this session: the baseline was chosen from the mean's runs alone)."""
    rows = _grid([0, 1, 2])
    rows += [{**r, "attack": "honest", "run": r["run"].replace("none", "honest")}
             for r in _grid([0, 1, 2]) if (r["aggregator"], r["attack"]) == ("mean", "none")]
    (t,) = report.tradeoff(rows)
    assert (t.rule, t.attack, t.baseline) == ("cwtm", "alie", "none")


def test_a_table_whose_rows_stand_on_different_baselines_says_which_row_stands_on_which() -> None:
    """One setting with ``honest`` runs and another with ``none`` only: the tables get a "no-attack runs" column, so
    the note about ``none`` is read against the rows it concerns (an attacker's review: the note covered every row)."""
    rows = _grid([0, 1, 2], alpha=1.0)
    rows += [{**r, "attack": "honest", "run": r["run"].replace("none", "honest")}
             for r in _grid([0, 1, 2], alpha=0.1) if r["attack"] == "none"]
    rows += [r for r in _grid([0, 1, 2], alpha=0.1) if r["attack"] != "none"]
    trades = report.tradeoff(rows)
    head, lines = report.tradeoff_table(trades)
    assert "no-attack runs" in head and "alpha" in head
    by_alpha = {line[head.index("alpha")]: line[head.index("no-attack runs")] for line in lines}
    assert by_alpha == {"0.1": "honest", "1.0": "none"}
    (_, terminal) = grid_tables({"summary": [], "keys": [], "tradeoff": trades})
    assert "no-attack runs" in terminal.columns
    assert report.tradeoff_table(report.tradeoff(_grid([0, 1, 2])))[0] == list(report.TRADEOFF_HEAD)  # one: none
