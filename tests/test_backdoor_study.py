"""The backdoor study (phalanx.studies.backdoor, `phalanx experiment backdoor`): the grid and its configurations,
the durability read at the stop round and after, the paired success cut and price and their verdicts, and one tiny
end-to-end run through the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests._raw import assert_rebuilt

from phalanx import studies
from phalanx.errors import ConfigError
from phalanx.studies import backdoor


def _plan(p: backdoor.Preset) -> tuple[list[backdoor.Cell], list[Any]]:
    """The study's cells and their runs' configs."""
    cells, runs = backdoor.BackdoorDefences().plan(p, {})
    return cells, [r.cfg for r in runs]


def test_quick_grid_is_rules_by_attacks_and_none_by_alphas_by_seeds_of_valid_configs() -> None:
    p = backdoor.preset("quick")
    cells, cfgs = _plan(p)
    assert len(cells) == len(p.rules) * (1 + len(p.attacks)) * len(p.alphas) * len(p.seeds) == len(cfgs)
    for c, cfg in zip(cells, cfgs):
        assert (cfg.aggregator, cfg.algorithm, cfg.partition, cfg.alpha, cfg.seed) == (
            c.rule, "fedavg", "dirichlet", c.alpha, c.seed)
        if c.attack == "none":
            assert (cfg.attack, cfg.byzantine, cfg.rounds) == ("none", 0, p.stop_round)
        else:
            assert (cfg.attack, cfg.byzantine, cfg.rounds) == (c.attack, p.byzantine, p.stop_round + p.after)
            assert cfg.attack_params["stop_round"] == p.stop_round
        assert p.stop_round % cfg.eval_every == 0 and cfg.rounds % cfg.eval_every == 0
    assert studies.resolve("backdoor") is backdoor.BackdoorDefences


def test_full_preset_has_every_defence_and_backdoor_attack_and_replacement_projects_onto_the_clip() -> None:
    p = backdoor.preset("full")
    assert set(p.attacks) == set(backdoor.BACKDOORS) and len(p.seeds) >= 3
    assert {"mean", "cwtm", "foolsgold", "flame", "rlr", "fldetector"} <= set(p.rules)
    assert f"clip(threshold={backdoor.CLIP:g})>mean" in p.rules
    cells, cfgs = _plan(p)
    rep = next(cfg for c, cfg in zip(cells, cfgs) if c.attack == "replacement")
    assert rep.attack_params["norm_bound"] == backdoor.CLIP


def test_crfl_cells_are_the_mean_with_the_projection_and_the_report_shows_the_certificate() -> None:
    """``crfl`` among the rules is not an aggregator: its cells run the mean with ``server_projection = 'crfl'`` and
    the preset's ``crfl_params``; the report's CRFL table reads the final rows' smoothed columns."""
    p = backdoor.preset("quick", rules=("mean", "crfl"), attacks=("backdoor",), alphas=(0.5,),
                        crfl_params={"clip": 4.0, "noise": 0.02})
    cells, cfgs = _plan(p)
    for c, cfg in zip(cells, cfgs):
        assert cfg.aggregator == "mean"
        crfl = c.rule == "crfl"
        assert cfg.server_projection == ("crfl" if crfl else None)
        assert cfg.server_projection_params == ({"clip": 4.0, "noise": 0.02} if crfl else {})
    finals = {backdoor.Cell("crfl", a, 0.5, s): backdoor.Final(0.9, 0.5 if a != "none" else None,
                                                               0.2 if a != "none" else None, 0.91, 0.1 * s, 0.99,
                                                               0.05)
              for a in ("none", "backdoor") for s in range(3)}
    table = backdoor.tabulate(finals)
    text = backdoor.crfl_markdown(table, p)
    assert "| backdoor | 0.5 | 91.0 ± 0.0 | 10.0 ± 24.8 | 99.0 ± 0.0 | 0.0500 ± 0.0000 |" in text
    with pytest.raises(ConfigError) as exc:
        backdoor.preset("quick", crfl_params=3)
    assert exc.value.parameter == "crfl_params"


def test_narrowing_the_full_presets_attacks_drops_the_parameters_of_those_left_out() -> None:
    """--set 'attacks=["backdoor"]' on the full preset was refused for the preset's own replacement bound."""
    p = backdoor.preset("full", attacks=("backdoor",))
    assert p.attacks == ("backdoor",) and p.attack_params == {}
    assert backdoor.preset("full", attacks=("replacement",)).attack_params == {"replacement": {"norm_bound": 0.5}}
    with pytest.raises(ConfigError, match="attack_params"):  # a user's own table still names attacks of the grid
        backdoor.preset("full", attacks=("backdoor",), attack_params={"dba": {}})


@pytest.mark.parametrize(("changes", "key"), [
    ({"rules": ("cwtm", "flame")}, "rules"), ({"attacks": ("alie",)}, "attacks"), ({"alphas": (0.0,)}, "alphas"),
    ({"stop_round": 0}, "stop_round"), ({"eval_every": 7}, "eval_every"), ({"byzantine": 0}, "byzantine"),
    ({"seeds": (0,)}, "seeds"), ({"attack_params": {"dba": {"stop_round": 3}}}, "attack_params"),
])
def test_preset_errors_name_the_field(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        backdoor.preset("quick", **changes)
    assert exc.value.parameter == key


def test_a_run_key_the_grid_sets_is_refused() -> None:
    """By the template's ``check`` hook, in the plan and in one cell's run alike."""
    p = backdoor.preset("quick")
    with pytest.raises(ConfigError) as exc:
        backdoor.BackdoorDefences().plan(p, {"rounds": 5})
    assert exc.value.parameter == "rounds"
    with pytest.raises(ConfigError) as exc:
        backdoor.BackdoorDefences().run(p, backdoor.cells(p)[0], {"rounds": 5})
    assert exc.value.parameter == "rounds"


def _table() -> dict[backdoor.Key, dict[str, dict[int, float]]]:
    acc = {"mean": [0.95, 0.94, 0.96], "rlr": [0.90, 0.88, 0.93]}  # rlr: 5, 6, 3 points lower with no attack
    success = {"mean": [1.0, 0.98, 0.99], "rlr": [0.10, 0.20, 0.05]}
    finals = {}
    for rule in ("mean", "rlr"):
        for seed in range(3):
            finals[backdoor.Cell(rule, "none", 0.5, seed)] = backdoor.Final(acc[rule][seed])
            finals[backdoor.Cell(rule, "dba", 0.5, seed)] = backdoor.Final(
                acc[rule][seed], success[rule][seed], success[rule][seed] / 2)
    return backdoor.tabulate(finals)


def test_the_cut_and_the_price_are_paired_by_seed_and_the_tension_is_read_out() -> None:
    table = _table()
    cut = backdoor.paired(table, "rlr", "dba", 0.5, "success")
    price = backdoor.paired(table, "rlr", "none", 0.5, "accuracy")
    assert cut is not None and price is not None
    assert cut.mean == pytest.approx((0.90 + 0.78 + 0.94) / 3)
    assert price.mean == pytest.approx((0.05 + 0.06 + 0.03) / 3)
    assert (backdoor.cut_verdict(cut), backdoor.price_verdict(price)) == ("cuts it", "costs accuracy")
    dur = backdoor.estimate(table, ("mean", "dba", 0.5), "durability")
    assert dur is not None and dur.mean == pytest.approx((0.5 + 0.49 + 0.495) / 3)
    p = backdoor.preset("quick", rules=("mean", "rlr"), attacks=("dba",), alphas=(0.5,))
    text = backdoor.readout(table, p)
    assert "cut the attack success below the mean's at round 30 in 1" in text
    assert "Holm-adjusted p < 0.05 over the 2 comparisons" in text
    assert "1 cost clean accuracy" in text and "shows for rlr at α = 0.5" in text


def test_verdicts_are_corrected_for_the_family_a_report_reads() -> None:
    """A cut whose 95 % interval excludes 0 alone is no verdict among many: the report reads every cut and price as
    one Holm family (the issue: 168 comparisons at 3 seeds, none corrected). The mutant — the same cut read alone,
    uncorrected — says 'cuts it'."""
    finals = {}
    marginal = {"mean": [0.50, 0.52, 0.55], "rlr": [0.46, 0.46, 0.50]}  # cut 4, 6, 5 points: p ≈ 0.013 alone
    for seed in range(3):
        for rule in ("mean", "rlr"):
            finals[backdoor.Cell(rule, "none", 0.5, seed)] = backdoor.Final(0.9)
            finals[backdoor.Cell(rule, "dba", 0.5, seed)] = backdoor.Final(0.9, marginal[rule][seed])
            for i, attack in enumerate(("backdoor", "neurotoxin", "edgecase", "replacement")):
                noise = [0.3, 0.1, -0.2][(seed + i) % 3]  # no cut: the interval spans 0 widely
                finals[backdoor.Cell(rule, attack, 0.5, seed)] = backdoor.Final(
                    0.9, 0.5 + (noise if rule == "rlr" else 0.0))
    table = backdoor.tabulate(finals)
    alone = backdoor.paired(table, "rlr", "dba", 0.5, "success")
    assert backdoor.cut_verdict(alone) == "cuts it"  # uncorrected: the mutant's verdict
    p = backdoor.preset("quick", rules=("mean", "rlr"),
                        attacks=("dba", "backdoor", "neurotoxin", "edgecase", "replacement"), alphas=(0.5,))
    fam = backdoor.family(table, p)
    corrected = fam[("cut", "rlr", "dba", "0.5")]
    assert corrected is not None and corrected.p_adjusted is not None and corrected.family == 5  # 5 cuts; price: 0 wide
    assert corrected.p_adjusted == pytest.approx(5 * corrected.p_value())  # type: ignore[operator]
    assert backdoor.cut_verdict(corrected) == "no cut shown"
    assert "over the 5 comparisons" in backdoor.readout(table, p, fam)


def test_the_price_trend_across_alpha_is_a_per_seed_slope_with_its_own_verdict() -> None:
    """'The price grows with heterogeneity' is tested: per seed, the slope of mean − rule on log₁₀ α."""
    finals = {}
    price = {0.1: [0.10, 0.12, 0.09], 1.0: [0.05, 0.06, 0.05], 10.0: [0.0, 0.01, 0.0]}
    for seed in range(3):
        for alpha, drops in price.items():
            finals[backdoor.Cell("mean", "none", alpha, seed)] = backdoor.Final(0.9)
            finals[backdoor.Cell("rlr", "none", alpha, seed)] = backdoor.Final(0.9 - drops[seed])
    table = backdoor.tabulate(finals)
    e = backdoor.price_trend(table, "rlr", (0.1, 1.0, 10.0))
    assert e is not None and e.mean == pytest.approx(-(0.10 + 0.11 + 0.09) / 3 / 2)
    assert backdoor.trend_verdict(e) == "grows with heterogeneity"
    p = backdoor.preset("quick", rules=("mean", "rlr"), attacks=("dba",), alphas=(0.1, 1.0, 10.0))
    text = backdoor.price_markdown(table, p)
    assert "| rlr | −" not in text and "grows with heterogeneity" in text
    assert backdoor.price_trend(table, "rlr", (1.0,)) is None


def test_two_seeds_or_a_zero_width_interval_give_no_verdict() -> None:
    finals = {backdoor.Cell(r, "none", 1.0, s): backdoor.Final(0.9) for r in ("mean", "cwtm") for s in range(3)}
    price = backdoor.paired(backdoor.tabulate(finals), "cwtm", "none", 1.0, "accuracy")
    assert backdoor.price_verdict(price).startswith("no verdict (zero width")
    two = {k: {m: {s: v for s, v in d.items() if s < 2} for m, d in per.items()} for k, per in _table().items()}
    cut = backdoor.paired(two, "rlr", "dba", 0.5, "success")
    assert backdoor.cut_verdict(cut) == "no verdict (2 seeds, 3 needed)"


def test_cli_runs_a_tiny_grid_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "backdoor"
    cmd = [sys.executable, "-m", "phalanx.cli", "experiment", "backdoor", "--seeds", "2", "--out", str(out),
           "-j", "1", "--set", "stop_round=2", "--set", "after=1", "--set", "eval_every=1", "--set", "workers=6",
           "--set", "byzantine=1", "--set", "f=1", "--set", "rules=['mean','cwtm']", "--set", "attacks=['dba']",
           "--set", "alphas=[1.0]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    report = (out / "report.md").read_text()
    assert "| dba | 1 | mean |" in report and "| dba | 1 | cwtm |" in report and "| cwtm | 1 |" in report
    assert "durability % (1 round after)" in report and "no verdict (2 seeds, 3 needed)" in report
    assert (out / "backdoor.png").stat().st_size > 0
    rows = (out / "cells.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * (3 + 1)  # per rule: accuracy, success, durability under dba; accuracy with none
    assert len(list((out / "runs").glob("*/DONE"))) == 2 * 2 * 2
    assert_rebuilt("backdoor", out, 2, ["stop_round=2", "after=1", "eval_every=1", "workers=6", "byzantine=1", "f=1",
                                        "rules=['mean','cwtm']", "attacks=['dba']", "alphas=[1.0]"])
