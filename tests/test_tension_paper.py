"""The paper's experiment as a preset (Yang, Shi & Li, ICML 2025): grids, cell tables, trend verdicts, end to end."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from phalanx import aggregators, cli
from phalanx.errors import ConfigError
from phalanx.studies import reporting, tension
from phalanx.studies.base import distinct


def test_spec_for_rows() -> None:
    assert tension.spec_for("T3", 0, 7) == ("mean", 0)
    assert tension.spec_for("T3", 5, 7) == ("multikrum(strict=false)", 5)
    assert tension.spec_for("T4", 7, 7) == ("cwtm", 7)
    assert tension.spec_for("T5", 0, 7) == ("mean", 0)
    assert tension.spec_for("T6", 3, 7) == ("nnm(f=3)>cwtm", 7)
    with pytest.raises(ConfigError, match="table"):
        tension.spec_for("T9", 1, 7)


def test_every_cell_of_the_paper_grid_is_a_valid_config_at_n16() -> None:
    p = tension.preset("cpu")
    assert p.max_f == 7
    cells, runs = tension.Tension().plan(p, {})
    assert len(cells) == 4 * 8 * 3 * 4 * (3 + 3)  # 3 reported and 3 tuning seeds
    # the f = 0 / f_NNM = 0 rows of the four tables are one run each
    assert len(distinct(runs)) == len(cells) - 3 * 3 * 4 * (3 + 3)
    for cfg in (r.cfg for r in distinct(runs)):
        assert cfg.byzantine == 0 and cfg.attack == "none" and cfg.workers == 16 and cfg.batch_size == 16
        assert cfg.schedule == "cosine" and cfg.momentum == 0.9 and cfg.partition == "dirichlet"
        rule = aggregators.make(cfg.aggregator, f=cfg.f)
        assert rule(torch.randn(16, 4)).shape == (4,)  # every rule runs on 16 rows (multikrum f=7 included)


def test_mean_rows_are_the_mean() -> None:
    x = torch.randn(16, 6, dtype=torch.float64)
    mean = x.mean(0)
    for table in tension.TABLES:
        spec, f = tension.spec_for(table, 0, 7)
        assert torch.allclose(aggregators.make(spec, f=f)(x), mean)
    # and the rules behind them at f = 0 / f_NNM = 0 are the mean too (why sharing the cell is exact)
    assert torch.allclose(aggregators.make("multikrum(strict=false)", f=0)(x), mean)
    assert torch.allclose(aggregators.make("cwtm", f=0)(x), mean)
    assert torch.allclose(aggregators.make("nnm(f=0)>cwtm", f=7)(x), mean)


def test_preset_validation() -> None:
    with pytest.raises(ConfigError, match="preset"):
        tension.preset("huge")
    with pytest.raises(ConfigError, match="seeds"):
        tension.preset("quick", seeds=(0,))
    with pytest.raises(ConfigError, match="preset field"):
        tension.preset("quick", epochs=3)
    assert tension.preset("paper").rounds == 31_250  # 160 epochs of CIFAR-10 at 16 × 16 images per round
    fallback = reporting.resolve_dataset(tension.preset("quick"), lambda name: False)
    assert fallback.dataset == "digits"
    assert reporting.resolve_dataset(tension.preset("quick"), lambda name: True).dataset == "fashion-mnist"


def _synthetic(p: tension.Preset, drop: float, nnm_gain: float) -> dict[tension.Cell, float]:
    """Accuracies with known trends: fall `drop·f/α-rank`, NNM gains, small per-seed noise, lr 0.5 best."""
    acc = {}
    alphas = sorted(p.alphas)
    for c in tension.cells(p):
        heterogeneity = len(alphas) - alphas.index(c.alpha)  # 3 for the smallest α
        # per-seed noise that differs between α and between the tables, so that no paired statistic is the same for
        # every seed (a zero-width interval decides nothing)
        noise = 0.001 * ((c.seed * 7 + c.x * 3 + c.seed * alphas.index(c.alpha)) % 5)
        noise += 0.0005 * c.seed * c.x * (c.table in ("T5", "T6")) / p.max_f
        base = 0.9 - (0.02 if c.lr != 0.5 else 0.0) + noise
        if c.table in ("T3", "T4"):
            acc[c] = base - drop * heterogeneity * c.x
        else:  # NNM: smaller f_NNM better, and at f_NNM = F better than the rule alone at F
            acc[c] = base - (drop * heterogeneity * p.max_f - nnm_gain) * c.x / p.max_f
    return acc


def test_tabulate_and_trends_find_planted_trends() -> None:
    p = tension.preset("cpu", seeds=(0, 1, 2))
    cells = tension.cells(p)
    results = tension.tabulate(cells, _synthetic(p, drop=0.01, nnm_gain=0.05), p.tuning_seeds)
    r = results[("T4", 3, 0.1)]
    assert r.lr == 0.5 and set(r.per_seed) == {0, 1, 2}
    assert r.estimate.mean == pytest.approx(0.9 - 0.03 * 3, abs=0.01)
    verdicts = {(t.trend[:3], t.table, t.alpha): t.verdict for t in tension.trends(results, p)}
    assert verdicts[("(a)", "T3", "pooled")] == "holds"
    assert verdicts[("(b)", "T4", "0.1 vs 10")] == "holds"
    assert verdicts[("(c)", "T5", "pooled")] == "holds"
    assert verdicts[("(d)", "T6", "0.1")] == "holds"
    # the opposite data contradict (a): accuracy rising with f
    flipped = tension.tabulate(cells, _synthetic(p, drop=-0.01, nnm_gain=0.0), p.tuning_seeds)
    v2 = {(t.trend[:3], t.table, t.alpha): t.verdict for t in tension.trends(flipped, p)}
    assert v2[("(a)", "T3", "pooled")] == "contradicted"


def test_the_verdicts_are_holm_corrected_as_one_family() -> None:
    """Every trend the report reads is one Holm family: each estimate carries the family's size and its adjusted p,
    and a verdict is decided on it. Planted trends too weak for the correction (each reading's interval excludes 0,
    p between 0.05/26 and 0.05) hold uncorrected and are inconclusive corrected — the mutant that decides on the
    per-comparison interval (the report before the correction) reads them as holding."""
    p = tension.preset("cpu", seeds=(0, 1, 2))
    results = tension.tabulate(tension.cells(p), _synthetic(p, drop=0.01, nnm_gain=0.05), p.tuning_seeds)
    ts = tension.trends(results, p)
    assert len(ts) == 26
    decided = [t for t in ts if t.estimate.p_adjusted is not None]
    assert decided and {t.estimate.family for t in decided} == {len(decided)}
    for t in decided:
        assert t.estimate.p_adjusted >= t.estimate.p_value()
    # weak trends: the synthetic noise made 10× larger relative to the planted drop
    weak = tension.tabulate(tension.cells(p), _synthetic(p, drop=0.0004, nnm_gain=0.0), p.tuning_seeds)
    corrected = tension.trends(weak, p)
    uncorrected = [dataclasses.replace(t, estimate=dataclasses.replace(t.estimate, p_adjusted=None, family=1))
                   for t in corrected]
    held = {(t.trend, t.table, t.alpha) for t in uncorrected if t.verdict == "holds"}
    still = {(t.trend, t.table, t.alpha) for t in corrected if t.verdict == "holds"}
    assert held - still, "no planted trend is weak enough for the correction to matter: the test cannot fail"
    assert still <= held


def test_report_files(tmp_path: Path) -> None:
    p = tension.preset("cpu", seeds=(0, 1, 2))
    results = tension.tabulate(tension.cells(p), _synthetic(p, 0.01, 0.05), p.tuning_seeds)
    written = tension.write_outputs(results, tension.trends(results, p), p, tmp_path, command="x", wall_seconds=1.0,
                                  runs=10)
    md = (tmp_path / "report.md").read_text()
    for table in tension.TABLES:
        assert f"## {table}" in md
    assert "| 0 (mean) |" in md and "**holds**" in md
    rows = list(csv.DictReader(io.StringIO((tmp_path / "cells.csv").read_text())))
    assert len(rows) == 4 * 8 * 3
    assert all(p_.exists() and p_.stat().st_size > 0 for p_ in written)


def test_tiny_end_to_end_cli(tmp_path: Path) -> None:
    """The real command on a tiny grid (n = 6 → f = 0 … 2), digits, 3 rounds; then rerun: nothing is retrained."""
    args = ["tension", "paper", "--preset", "quick", "--out", str(tmp_path), "--seeds", "2", "--jobs", "1",
            "--set", "dataset=digits", "--set", "workers=6", "--set", "rounds=3", "--set", "eval_every=3",
            "--set", "alphas=[0.5,5]", "--set", "lrs=[0.1]"]
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    md = (tmp_path / "report.md").read_text()
    assert "n = 6 workers, digits" in md and "## T6" in md
    cells = list(csv.DictReader(io.StringIO((tmp_path / "cells.csv").read_text())))
    assert len(cells) == 4 * 3 * 2
    assert all(0.0 <= float(c["mean"]) <= 1.0 for c in cells)
    assert all(set(dict(x.split(":") for x in c["per_seed"].split(";"))) == {"0", "1"} for c in cells)
    assert "tuning seeds [1000, 1001, 1002], reported seeds [0, 1]" in md
    runs = sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert len(runs) == (1 + 4 * 2) * 2 * (2 + 3)  # mean + 2 rows per table, × 2 α × (2 reported + 3 tuning seeds)
    stamp = {r: (r / "DONE").stat().st_mtime_ns for r in runs}
    first = (tmp_path / "cells.csv").read_text()
    res2 = CliRunner().invoke(cli.app, args)
    assert res2.exit_code == 0, res2.output
    assert {r: (r / "DONE").stat().st_mtime_ns for r in runs} == stamp
    assert (tmp_path / "cells.csv").read_text() == first  # the tables come from the stored runs
    # the raw per-run results it wrote give the same tables with nothing trained (--results: the docs check's way)
    again = tmp_path / "again"
    res3 = CliRunner().invoke(cli.app, [*args, "--out", str(again), "--results", str(tmp_path / "runs.csv")])
    assert res3.exit_code == 0, res3.output
    assert (again / "cells.csv").read_text() == first and not (again / "runs").exists()
    assert (again / "runs.csv").read_text() == (tmp_path / "runs.csv").read_text()


def test_missing_data_is_one_clear_error_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PHALANX_DATA", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(empty))
    monkeypatch.setattr("sys.argv", ["phalanx", "tension", "paper", "--preset", "paper", "--out", str(tmp_path / "o"),
                                     "--set", f"data_root={empty}"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    out = capsys.readouterr().out
    assert "cifar10" in out and "files not found" in out and "Traceback" not in out
    assert not (tmp_path / "o" / "runs").exists()


def test_federated_rounds_through_the_same_command(tmp_path: Path) -> None:
    """`--set algorithm=fedavg`: the same grids with federated rounds (4 of 6 clients a round, 2 local steps); the
    report says so."""
    args = ["tension", "paper", "--preset", "quick", "--out", str(tmp_path), "--seeds", "2", "--jobs", "1",
            "--set", "dataset=digits", "--set", "workers=6", "--set", "rounds=2", "--set", "eval_every=2",
            "--set", "alphas=[1.0]", "--set", "lrs=[0.1]", "--set", "algorithm=fedavg", "--set", "local_steps=2",
            "--set", "clients_per_round=5"]
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    md = (tmp_path / "report.md").read_text()
    assert "Round: federated averaging — each of the 6 workers is a client, 5 sampled per round, 2 local step(s)" in md
    configs = [json.loads(p_.read_text()) for p_ in (tmp_path / "runs").glob("*/config.json")]
    assert configs and all(c["algorithm"] == "fedavg" and c["local_steps"] == 2 for c in configs)


def test_the_quick_preset_is_a_smaller_grid_and_the_report_says_when_the_lr_search_is_clipped() -> None:
    quick, cpu = tension.preset("quick"), tension.preset("cpu")
    # 522 (1,044) distinct runs at the reported seeds, as many at the tuning seeds
    n_quick, n_cpu = (len(distinct(tension.Tension().plan(p, {})[1])) for p in (quick, cpu))
    assert n_quick == 2 * 522 and n_cpu == 2 * 1044
    cs = tension.cells(quick)
    acc = {c: 0.8 + 0.01 * (c.lr == 1.0) for c in cs}  # the largest rate wins everywhere: clipped at the top
    results = tension.tabulate(cs, acc, quick.tuning_seeds)
    line = tension.lr_edges(results, quick)
    assert line.startswith(f"Learning rate: lr₀ chosen at an edge of its grid {{0.1, 0.3, 1}} in {len(results)} of "
                           f"{len(results)} cells ({len(results)} at the largest, 0 at the smallest)")
    middle = tension.tabulate(cs, {c: 0.8 + 0.01 * (c.lr == 0.3) for c in cs}, quick.tuning_seeds)
    assert tension.lr_edges(middle, quick) == ""
    two = tension.preset("quick", lrs=(0.1, 0.3))
    assert "every choice is at an edge" in tension.lr_edges(tension.tabulate(tension.cells(two), {
        c: 0.8 for c in tension.cells(two)}, two.tuning_seeds), two)


def _disagreeing(p: tension.Preset) -> dict[tension.Cell, float]:
    """The tuning seeds favour lr 0.1, the reported seeds lr 1 (by more): a selector that looks at the reported seeds
    picks 1, an honest one 0.1."""
    tuning = set(p.tuning_seeds)
    return {c: 0.8 + (0.01 * (c.lr == 0.1) if c.seed in tuning else 0.05 * (c.lr == 1.0)) + 0.001 * c.seed % 7
            for c in tension.cells(p)}


def test_lr_is_chosen_on_the_tuning_seeds_and_the_reported_seeds_cannot_move_it() -> None:
    p = tension.preset("quick")
    cs, acc = tension.cells(p), _disagreeing(p)
    results = tension.tabulate(cs, acc, p.tuning_seeds)
    assert all(r.lr == 0.1 and set(r.per_seed) == set(p.seeds) for r in results.values())
    assert all(r.lr_on_reported == 1.0 for r in results.values())  # what the reported seeds would have chosen
    # the attacker's full power over the reported runs: any value (NaN, 1.0, 0) at any rate moves no choice
    for poison in (math.nan, 1.0, 0.0, -math.inf):
        rigged = {c: (poison if c.seed in p.seeds else v) for c, v in acc.items()}
        assert {k: r.lr for k, r in tension.tabulate(cs, rigged, p.tuning_seeds).items()} == {
            k: r.lr for k, r in results.items()}
    note = tension.selection_note(results, p)
    assert f"would differ in {len(results)} of {len(results)} cells" in note and "+5.00 points higher" in note


def test_a_selector_that_peeks_at_the_reported_seeds_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the split hands the reported seeds to the selector too (tuning on all seeds, the old way)."""
    p = tension.preset("quick")
    cs, acc = tension.cells(p), _disagreeing(p)
    monkeypatch.setattr(tension, "split_seeds", lambda by_seed, tuning: (
        dict(by_seed), {s: v for s, v in by_seed.items() if s not in tuning}))
    peeked = tension.tabulate(cs, acc, p.tuning_seeds)
    assert any(r.lr != 0.1 for r in peeked.values())  # the check of the test above fails on it


def test_tuning_seeds_must_be_disjoint_from_the_reported_ones() -> None:
    with pytest.raises(ConfigError, match=r"tuning_seeds.*disjoint"):
        tension.preset("quick", tuning_seeds=(2, 1000))
    with pytest.raises(ConfigError, match="tuning_seeds"):
        tension.preset("quick", tuning_seeds=())
    p = tension.preset("quick")
    cs = [c for c in tension.cells(p) if c.seed in p.seeds]  # no tuning runs: nothing to choose on
    with pytest.raises(ConfigError, match="tuning_seeds"):
        tension.tabulate(cs, {c: 0.5 for c in cs}, p.tuning_seeds)


def test_the_reported_runs_keep_their_run_ids() -> None:
    """Adding tuning seeds changes no reported run's configuration: the ids the docs' runs were trained under."""
    from dataclasses import replace

    from phalanx.experiments import grid

    p = tension.preset("quick")
    cs, runs = tension.Tension().plan(p, {})
    reported = {r.run_id for c, r in zip(cs, runs) if c.seed in p.seeds}
    old = [tension.config_for(p, tension.Cell(t, x, a, lr, s)) for t in tension.TABLES
           for x in range(p.max_f + 1) for a in p.alphas for lr in p.lrs for s in p.seeds]
    assert reported == {grid.run_id(c) for c in old} and len(reported) == 522
    assert "multikrum-strict-false-_none_f1_b0_s0_228d2fe44e" in reported  # an id the quick runs were trained under
    assert replace(p, tuning_seeds=(7, 8)).seeds == p.seeds
