"""The BatchNorm-under-heterogeneity experiment (phalanx.studies.hbn, `phalanx experiment hbn`): the grid, its
configurations, the statistics of the tables, the outputs, and one tiny end-to-end run through the CLI."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from tests._raw import assert_rebuilt

from phalanx.errors import ConfigError
from phalanx.studies import hbn


def test_quick_grid_is_norms_by_rules_by_alphas_by_seeds_of_valid_federated_configs() -> None:
    p = hbn.preset("quick")
    assert p.norms == ("group", "batch", "fedbn", "hybrid")
    cells, runs = hbn.HBN().plan(p, {})
    cfgs = [r.cfg for r in runs]
    assert len(cells) == 4 * 2 * 3 * 3 == len(cfgs)
    for c, cfg in zip(cells, cfgs):
        assert cfg.algorithm == "fedavg" and cfg.attack == "none" and cfg.byzantine == 0
        assert cfg.model_params["norm"] == c.norm and cfg.alpha == c.alpha and cfg.aggregator == c.rule
        assert cfg.clients_per_round == 10 and cfg.workers == 100 and cfg.batch_size == 4
        assert cfg.rounds == 70 and cfg.eval_every == 70  # one evaluation at the end (and round 0)
        assert cfg.eval_clients == (10 if c.norm == "fedbn" else 100)
    paper = hbn.preset("paper")
    cfg = hbn.HBN().run(paper, hbn.Cell("hybrid", "mean", 0, 0.1, 0)).cfg
    assert cfg.dataset == "cifar10" and cfg.local_epochs == 1.0 and cfg.stats_momentum == 0.002
    assert cfg.model_params == {"channels": [16, 32, 64], "kernel_size": 3, "hidden": 128, "norm": "hybrid"}


@pytest.mark.parametrize(("changes", "match"), [
    ({"seeds": (0,)}, "at least two distinct seeds"),
    ({"norms": ("instance",)}, "norms"),
    ({"norms": ("fedbn-global",)}, "norms"),
    ({"alphas": ()}, "non-empty"),
    ({"rounds_per_epoch": 3}, "preset field"),
])
def test_preset_errors(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        hbn.preset("quick", **changes)
    with pytest.raises(ConfigError, match="preset"):
        hbn.preset("huge")


def test_table_cells_and_paired_differences() -> None:
    p = hbn.preset("quick", norms=("batch", "hybrid"), rules=(("mean", 0),), alphas=(0.1,), seeds=(0, 1, 2))
    acc = {"batch": [0.70, 0.72, 0.68], "hybrid": [0.75, 0.76, 0.74]}
    cells = hbn.cells(p)
    results = hbn.tabulate(cells, {c: acc[c.norm][c.seed] for c in cells})
    r = results[("hybrid", "mean", 0, 0.1)]
    assert r.estimate.mean == pytest.approx(0.75)
    (d,) = hbn.differences(results, p)
    diffs = [0.05, 0.04, 0.06]
    sd = math.sqrt(sum((x - 0.05) ** 2 for x in diffs) / 2)
    assert d.estimate.mean == pytest.approx(0.05) and d.estimate.half_width == pytest.approx(4.302653 * sd / 3 ** 0.5,
                                                                                                rel=1e-3)
    assert d.verdict == "Hybrid BN better"
    md = hbn.differences_markdown([d])
    assert "| Hybrid BN − BatchNorm | mean | 0.1 | +5.00 |" in md


def test_fedbn_rows_and_differences_on_both_of_its_measures() -> None:
    """FedBN's cells are its own-label-mix accuracy; its whole-test-set accuracy is a second row; FedBN − BatchNorm is
    paired on both."""
    p = hbn.preset("quick", norms=("batch", "fedbn"), rules=(("mean", 0),), alphas=(0.5,), seeds=(0, 1))
    cells = hbn.cells(p)
    acc = {c: {"batch": 0.70, "fedbn": 0.80}[c.norm] + 0.01 * c.seed for c in cells}
    acc.update({hbn.Cell(hbn.FEDBN_GLOBAL, c.rule, c.f, c.alpha, c.seed): 0.65 + 0.02 * c.seed
                for c in cells if c.norm == "fedbn"})
    results = hbn.tabulate(cells, acc)
    assert results[(hbn.FEDBN_GLOBAL, "mean", 0, 0.5)].estimate.mean == pytest.approx(0.66)
    ds = hbn.differences(results, p)
    assert [(d.a, d.b) for d in ds] == [("fedbn", "batch"), (hbn.FEDBN_GLOBAL, "batch")]
    assert ds[0].estimate.mean == pytest.approx(0.10) and ds[1].estimate.mean == pytest.approx(-0.045)
    table = hbn.table_markdown(results, p)
    # two seeds: the means, and no interval (a t-interval from two is wider than the accuracy scale)
    assert "| mean | FedBN | 80.5 (2 seeds: no interval) |" in table
    assert "| mean | FedBN, whole test set | 66.0 (2 seeds: no interval) |" in table
    assert all(d.verdict == "no verdict (2 seeds, 3 needed)" for d in ds)
    assert "FedBN, whole test set − BatchNorm" in hbn.differences_markdown(ds)
    report = hbn.report_markdown(results, ds, p, command="x", wall_seconds=None, runs=4)
    assert "re-weighted to that client's label mix" in report


def test_cli_runs_a_tiny_grid_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "hbn"
    cmd = [sys.executable, "-m", "phalanx.cli", "experiment", "hbn", "--seeds", "2", "--out", str(out), "-j", "1",
           "--set", "dataset=digits", "--set", "rounds=2", "--set", "eval_every=2", "--set", "clients=6",
           "--set", "clients_per_round=3", "--set", "local_steps=2", "--set", "alphas=[1.0]",
           "--set", "norms=['batch','fedbn','hybrid']", "--set", "rules=[['mean',0]]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    report = (out / "report.md").read_text()
    assert "| mean | BatchNorm |" in report and "| mean | Hybrid BN |" in report
    assert "| mean | FedBN |" in report and "| mean | FedBN, whole test set |" in report
    assert "Hybrid BN − BatchNorm" in report and "FedBN − BatchNorm" in report
    assert (out / "hbn.png").stat().st_size > 0
    assert len((out / "cells.csv").read_text().splitlines()) == 5
    assert len(list((out / "runs").glob("*/DONE"))) == 6
    assert_rebuilt("hbn", out, 2, ["dataset=digits", "rounds=2", "eval_every=2", "clients=6", "clients_per_round=3",
                                   "local_steps=2", "alphas=[1.0]", "norms=['batch','fedbn','hybrid']",
                                   "rules=[['mean',0]]"])


def test_the_differences_are_one_holm_family_and_a_verdict_reads_the_adjusted_p(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hybrid − BatchNorm, Hybrid − GroupNorm and BatchNorm − GroupNorm at two α are read together: one Holm family
    of 6 (the report says so). A difference whose interval excludes 0 alone (p ≈ 0.035) is no verdict among them; the
    mutant — the same differences uncorrected — calls it "Hybrid BN better", and this test rejects it."""
    p = hbn.preset("quick", norms=("group", "batch", "hybrid"), rules=(("mean", 0),), alphas=(0.1, 1.0),
                   seeds=(0, 1, 2))
    cells = hbn.cells(p)
    noise = [0.03, -0.02, 0.01]  # the other differences span 0 widely
    lift = {("hybrid", 0.1): [0.03, 0.06, 0.045], ("hybrid", 1.0): [-0.01, 0.02, 0.0]}
    acc = {c: 0.7 + lift.get((c.norm, c.alpha), [0.0] * 3)[c.seed] + (noise[c.seed] if c.norm == "group" else 0.0)
           for c in cells}
    results = hbn.tabulate(cells, acc)
    ds = hbn.differences(results, p)
    assert len(ds) == 6 and all(d.estimate.family == 6 for d in ds)
    (target,) = [d for d in ds if (d.a, d.b, d.alpha) == ("hybrid", "batch", 0.1)]
    assert target.estimate.p_value() < 0.05 < (target.estimate.p_adjusted or 0.0)
    assert target.verdict != "Hybrid BN better"  # adjusted: no verdict
    monkeypatch.setattr(hbn, "holm_family", lambda items: items)  # the mutant: no correction
    (uncorrected,) = [d for d in hbn.differences(results, p) if (d.a, d.b, d.alpha) == ("hybrid", "batch", 0.1)]
    assert uncorrected.verdict == "Hybrid BN better"  # what the test above would let through
