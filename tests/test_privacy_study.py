"""The privacy study (phalanx.studies.privacy, `phalanx experiment privacy`): the grid and its configurations, the
paired price of robustness and its verdicts, and one tiny end-to-end run through the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests._raw import assert_rebuilt

from phalanx import studies
from phalanx.errors import ConfigError
from phalanx.studies import privacy

pytest.importorskip("dp_accounting")


def test_quick_grid_is_rules_by_attack_by_noise_by_seeds_of_valid_configs() -> None:
    p = privacy.preset("quick")
    cells, runs = privacy.Privacy().plan(p, {})
    assert len(cells) == len(p.rules) * 2 * len(p.noises) * len(p.seeds) == len(runs)
    for c, cfg in zip(cells, (r.cfg for r in runs)):
        assert cfg.aggregator == c.rule and cfg.f == (0 if c.rule == "mean" else p.f)
        assert (cfg.attack, cfg.byzantine) == (("alie", p.byzantine) if c.attacked else ("none", 0))
        assert cfg.dp_noise == (c.noise or None) and cfg.dp_clip == (p.clip if c.noise else None)
        assert cfg.algorithm == "dsgd" and cfg.eval_every == cfg.rounds == p.rounds
    assert studies.resolve("privacy") is privacy.Privacy


@pytest.mark.parametrize(("changes", "key"), [
    ({"rules": ("cwtm", "cwmed")}, "rules"), ({"noises": (0.5, 1.0)}, "noises"), ({"noises": (0.0, -1.0)}, "noises"),
    ({"f": 1}, "f"), ({"seeds": (0,)}, "seeds"),
])
def test_preset_errors_name_the_field(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        privacy.preset("quick", **changes)
    assert exc.value.parameter == key


def test_the_price_and_its_growth_are_paired_by_seed() -> None:
    p = privacy.preset("quick", rules=("mean", "cwtm"), noises=(0.0, 1.0), seeds=(0, 1, 2))
    acc = {("mean", 0.0): [0.95, 0.94, 0.96], ("cwtm", 0.0): [0.95, 0.93, 0.96],
           ("mean", 1.0): [0.85, 0.80, 0.90], ("cwtm", 1.0): [0.82, 0.75, 0.88]}
    finals = {privacy.Cell(r, a, s, seed): privacy.Final(acc[(r, s)][seed], None)
              for (r, s) in acc for a in (False, True) for seed in range(3)}
    (g,) = privacy.growth(privacy.tabulate(finals), p)
    assert (g.rule, g.noise) == ("cwtm", 1.0)
    assert g.price.mean == pytest.approx((0.03 + 0.05 + 0.02) / 3)
    assert g.change.mean == pytest.approx((0.03 + 0.04 + 0.02) / 3)  # the price at σ = 0: 0, 0.01, 0
    assert g.verdict == "holds"  # every seed's price grew by 2-4 points
    assert "grew with the DP noise (Holm-adjusted p < 0.05, the change above 0) in 1" in privacy.readout([g], p)
    assert g.change.p_adjusted is not None and g.change.family == 1  # one pair: Holm's family of one
    assert "over the 1 comparisons" in privacy.growth_markdown([g], p)


def test_cli_runs_a_tiny_grid_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "privacy"
    cmd = [sys.executable, "-m", "phalanx.cli", "experiment", "privacy", "--seeds", "2", "--out", str(out), "-j", "1",
           "--set", "rounds=3", "--set", "workers=6", "--set", "byzantine=1", "--set", "f=1",
           "--set", "rules=['mean','cwtm']", "--set", "noises=[0,1]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    report = (out / "report.md").read_text()
    assert "| mean | none |" in report and "| cwtm | alie (b = 1) |" in report and "σ = 1 (ε ≤ " in report
    assert "no verdict (2 seeds, 3 needed)" in report
    assert (out / "privacy.png").stat().st_size > 0
    assert len((out / "cells.csv").read_text().splitlines()) == 1 + 2 * 2 * 2
    assert len(list((out / "runs").glob("*/DONE"))) == 16
    assert_rebuilt("privacy", out, 2, ["rounds=3", "workers=6", "byzantine=1", "f=1", "rules=['mean','cwtm']",
                                       "noises=[0,1]"])
