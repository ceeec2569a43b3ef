"""The LoRA study (phalanx.studies.lora, `phalanx experiment lora`; issue 35 items 3 and 6): the grid and its
configurations, the paired price, rescue and backdoor lift with their Holm-corrected verdicts, and one tiny
end-to-end run through the CLI on the embedded model."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests._raw import assert_rebuilt, fake_values

from phalanx import studies
from phalanx.errors import ConfigError
from phalanx.studies import raw
from phalanx.studies.base import distinct

pytest.importorskip("transformers")
pytest.importorskip("peft")

from phalanx.studies import lora


def test_quick_grid_is_modes_by_rules_by_arms_by_seeds_of_valid_configs() -> None:
    p = lora.preset("quick")
    cells, runs = lora.Lora().plan(p, {})
    cfgs = [r.cfg for r in runs]
    assert len(cells) == len(p.modes) * len(p.rules) * 3 * len(p.seeds) == len(cfgs) == 54
    for c, cfg in zip(cells, cfgs):
        assert cfg.model == "hf:phalanx-bert-tiny" and cfg.model_params["aggregation"] == c.mode
        assert cfg.aggregator == c.rule and cfg.f == p.f and cfg.seed == c.seed and cfg.algorithm == "fedavg"
        assert cfg.eval_every == cfg.rounds == p.rounds and cfg.dataset == "sent140-sample"
        if c.arm == "vector":
            assert (cfg.attack, cfg.byzantine) == ("signflip", p.byzantine)
        else:  # the clean arm is the backdoor with nobody poisoning: its rows carry the clean model's measures
            assert cfg.attack == "phrase-backdoor" and cfg.byzantine == (0 if c.arm == "none" else p.byzantine)
            assert cfg.attack_params["trigger"] == [207, 947]  # "good morrow" in the embedded model's tokenizer
    assert studies.resolve("lora") is lora.Lora
    assert tuple(f.name for f in dataclasses.fields(lora.Final)) == lora.MEASURES  # collect fills them in order
    assert lora.preset("gpu").device == "cuda" and lora.preset("gpu").fallback_dataset == "sent140-sample"


@pytest.mark.parametrize(("changes", "key"), [
    ({"rules": ("cwtm", "cwmed")}, "rules"), ({"rules": ("mean", "cwtm", "cwtm")}, "rules"),
    ({"modes": ("factors", "lowrank")}, "modes"), ({"byzantine": 3}, "byzantine"), ({"byzantine": 0}, "byzantine"),
    ({"f": 5, "byzantine": 5}, "byzantine"), ({"vector_attack": "phrase-backdoor"}, "vector_attack"),
    ({"phrase": " "}, "phrase"), ({"target": 2}, "target"), ({"seeds": (0,)}, "seeds"),
])
def test_preset_errors_name_the_field(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        lora.preset("quick", **changes)
    assert exc.value.parameter == key


def test_keys_the_grid_sets_itself_are_refused_as_run_overrides() -> None:
    """By the study's plan (the command line's) and by one cell's ``config_for`` alike; the mutant plan without the
    check lets ``--set seed=5`` make both seeds one run, so that the paired statistics pair a run with itself."""
    p = lora.preset("quick", modes=("update",), seeds=(0, 1))
    with pytest.raises(ConfigError, match="preset's fields") as exc:
        lora.Lora().plan(p, {"attack": "alie"})
    assert exc.value.parameter == "--set"
    with pytest.raises(ConfigError, match="preset's fields"):
        lora.config_for(p, lora.Cell("shared", "mean", "none", 0), {"attack": "alie"}, trigger=[207])
    with pytest.raises(ConfigError, match="preset's fields"):
        lora.Lora().plan(p, {"seed": 5})
    class Unchecked(lora.Lora):  # the mutant: the study without its check hook
        functions = dataclasses.replace(lora.Lora.functions, check=None)

    cells, runs = Unchecked().plan(p, {"seed": 5})
    assert {r.cfg.seed for r in runs} == {5} and len(distinct(runs)) == len(cells) // 2


def _finals(acc: dict[tuple[str, str], list[float]], success: dict[tuple[str, str], list[float]],
            flip: dict[tuple[str, str], list[float | None]]) -> dict[lora.Cell, lora.Final]:
    out: dict[lora.Cell, lora.Final] = {}
    for rule in ("mean", "cwtm"):
        for arm in lora.ARMS:
            for seed in range(3):
                out[lora.Cell("shared", rule, arm, seed)] = lora.Final(
                    test_accuracy=acc[(rule, arm)][seed], attack_success=success.get((rule, arm), [None] * 3)[seed],
                    attack_flip=flip.get((rule, arm), [None] * 3)[seed], attack_flip_base=10.0)
    return out


def test_price_rescue_and_lift_are_paired_by_seed_and_the_lift_is_over_the_clean_model() -> None:
    p = lora.preset("quick", modes=("shared",), rules=("mean", "cwtm"))
    acc = {("mean", "none"): [0.80, 0.70, 0.75], ("cwtm", "none"): [0.70, 0.61, 0.64],  # price 10, 9, 11 points
           ("mean", "vector"): [0.50, 0.40, 0.45], ("cwtm", "vector"): [0.70, 0.61, 0.64],
           ("mean", "phrase"): [0.8] * 3, ("cwtm", "phrase"): [0.7] * 3}
    # the mean: a biased clean model already sends 94-96 % there, the poisoned one 95-97 % — no backdoor shown;
    # cwtm: 10-12 % clean, 60-64 % poisoned — a backdoor
    success = {("mean", "none"): [0.94, 0.95, 0.96], ("mean", "phrase"): [0.95, 0.95, 0.97],
               ("cwtm", "none"): [0.10, 0.11, 0.12], ("cwtm", "phrase"): [0.60, 0.62, 0.64]}
    flip: dict[tuple[str, str], list[float | None]] = {
        ("mean", "none"): [0.0, None, 0.1], ("mean", "phrase"): [0.2, 0.5, 0.1],  # seed 1: nothing left to flip
        ("cwtm", "none"): [0.05, 0.06, 0.04], ("cwtm", "phrase"): [0.55, 0.59, 0.60]}
    cs = lora.comparisons(_finals(acc, success, flip), p)
    by = {(c.what, c.rule): c for c in cs}
    price, rescue = by[("price", "cwtm")], by[("rescue", "cwtm")]
    assert price.estimate is not None and price.estimate.mean == pytest.approx(0.10)
    assert rescue.estimate is not None and rescue.estimate.mean == pytest.approx((0.2 + 0.21 + 0.19) / 3)
    mean_lift, cwtm_lift = by[("lift", "mean")], by[("lift", "cwtm")]
    assert mean_lift.estimate is not None and mean_lift.estimate.mean == pytest.approx(0.02 / 3)
    assert mean_lift.verdict == "no lift shown"  # 95 % success, but the clean model's is 95 % too
    assert cwtm_lift.verdict == "backdoor shown"
    # mutant: the success rate read alone (the lift over a clean model of 0) calls the mean's bias a backdoor
    alone = lora.comparisons(_finals(acc, {**success, ("mean", "none"): [0.0] * 3}, flip), p)
    assert {(c.what, c.rule): c for c in alone}[("lift", "mean")].verdict == "backdoor shown"
    flip_mean = by[("flip lift", "mean")]
    assert flip_mean.estimate is not None and flip_mean.estimate.k == 2  # the seed with nothing to flip is left out
    # one Holm family: a price, a rescue, two lifts, one flip lift (the mean's, from 2 seeds, decides nothing)
    assert all(c.estimate is None or c.estimate.p_adjusted is None or c.estimate.family == 5 for c in cs)
    text = lora.backdoor_markdown(_finals(acc, success, flip), cs, p)
    assert "| shared | cwtm | 11.0 ± 2.5 | 62.0 ± 5.0 | +51.0 ± 2.5 |" in text
    assert "over the 5 comparisons" in lora.report_markdown(_finals(acc, success, flip), cs, p, command="c",
                                                            wall_seconds=None, runs=18)


TINY = ["rounds=1", "workers=6", "byzantine=1", "f=1", "local_steps=1", "modes=['update']", "rules=['mean','cwtm']",
        "batch_size=4"]


def test_cli_runs_a_tiny_grid_and_writes_the_report_and_the_per_run_csv(tmp_path: Path) -> None:
    """The tiny grid trained through the CLI; its ``runs.csv`` made into the report again (``--results``, nothing
    trained) gives the same ``report.md`` and ``cells.csv`` byte for byte as the command run again on the finished
    runs (which, like a report from a file, gives no wall time)."""
    out = tmp_path / "lora"
    cmd = [sys.executable, "-m", "phalanx.cli", "experiment", "lora", "--seeds", "2", "--out", str(out), "-j", "1",
           *(a for s in TINY for a in ("--set", s))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert_rebuilt("lora", out, 2, TINY)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # every run finished: no wall time
    assert again.returncode == 0 and "12 of 12 runs had finished" in again.stdout, again.stderr[-3000:]
    from_file = tmp_path / "from-file"
    cmd_file = [*cmd[:cmd.index("--out") + 1], str(from_file), *cmd[cmd.index("--out") + 2:],
                "--results", str(out / "runs.csv")]
    proc = subprocess.run(cmd_file, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "nothing trained" in proc.stdout, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert not (from_file / "runs").exists()
    for name in ("report.md", "cells.csv", "runs.csv"):
        assert (from_file / name).read_bytes() == (out / name).read_bytes(), name
    report = (out / "report.md").read_text()
    assert "| update | cwtm |" in report and "signflip (b = 1)" in report and "phrase backdoor (b = 1)" in report
    assert "no verdict (2 seeds, 3 needed)" in report
    rows = list(csv.DictReader((out / "cells.csv").open()))
    assert len(rows) == 2 * 3 * 2 and {r["arm"] for r in rows} == set(lora.ARMS)
    assert all(r["attack_success"] != "" for r in rows if r["arm"] != "vector")  # the clean arm measures it too
    assert all(r["lora_residual"] != "" for r in rows)  # mode update records its truncation
    assert (out / "lora.png").stat().st_size > 0
    assert len(list((out / "runs").glob("*/DONE"))) == 12


def test_the_gpu_preset_is_a_workload_of_the_gpu_benchmark(tmp_path: Path) -> None:
    """``benchmarks/gpu.py --workload lora`` times the gpu preset's round (mode update, cwtm) — here at toy sizes on
    the CPU, with a random BERT of the tiny architecture since nothing is downloaded."""
    from _scripts import load_script

    bench = load_script("benchmarks/gpu.py", "phalanx_bench_gpu_lora")
    full = {w.name: w for w in bench.workloads(quick=False)}["lora"]
    p = lora.preset("gpu")
    assert (full.config["model"], full.config["workers"], full.config["f"]) == (p.model, 30, 6)
    assert full.config["model_params"] == {"r": 8, "aggregation": "update"} and full.shape == (64,)
    out = tmp_path / "gpu.json"
    assert bench.main(["--device", "cpu", "--quick", "--workload", "lora", "--rounds", "1", "--warmup", "0",
                       "--json", str(out)]) == 0
    (rec,) = json.loads(out.read_text())["records"]
    assert rec["workload"] == "lora" and rec["finite"] and rec["rounds_per_s"] > 0


def _tiny_plan(**changes: object) -> tuple[list[lora.Cell], list[str]]:
    p = lora.preset("quick", modes=("update",), **changes)  # type: ignore[arg-type]
    cells, runs = lora.Lora().plan(p, {})
    return cells, raw.run_ids(runs)


def _edited(path: Path, lines: list[str], column: str, text: str, row: int = 1) -> Path:
    rows = [next(csv.reader([line])) for line in lines]
    rows[row][rows[0].index(column)] = text
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path.write_text(buf.getvalue())
    return path


@pytest.mark.parametrize(("column", "text", "says"), [
    ("test_accuracy", "1.5", r"a number in \[0, 1\] in the column test_accuracy"),
    ("test_accuracy", "-0.0625", r"in \[0, 1\]"),
    ("test_accuracy", "inf", r"in \[0, 1\]"),
    ("test_accuracy", "nan", "not NaN"),
    ("test_accuracy", "", "a float"),  # the accuracy is always there (a diverged run's is 0)
    ("attack_success", "-inf", r"in \[0, 1\] in the column attack_success"),
    ("attack_flip", "nan", "not NaN"),
    ("attack_clean_target", "1e308", r"in \[0, 1\]"),
    ("attack_flip_base", "inf", "in the column attack_flip_base"),
    ("attack_flip_base", "-1", "in the column attack_flip_base"),
    ("lora_residual", "inf", "in the column lora_residual"),
    ("seed", "7", "rows of the planned cells only"),
    ("run", "0" * 16, "run id of the planned configuration"),
])
def test_a_hostile_raw_results_file_is_one_line_naming_results(tmp_path: Path, column: str, text: str,
                                                              says: str) -> None:
    """Whatever a file can make the report print is what a run can give: a share in [0, 1], a finite count; a cell
    the plan does not have, or a run id not its cell's configuration's, is refused — one typed line, no report."""
    cells, ids = _tiny_plan()
    lines = raw.write(cells, ids, fake_values(lora.Final, cells), lora.Final).splitlines()
    path = _edited(tmp_path / "runs.csv", lines, column, text)
    with pytest.raises(ConfigError, match=says) as exc:
        raw.read(path, cells, ids, lora.Final)
    assert exc.value.parameter == "results" and str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_the_bounds_are_the_check_a_final_without_them_reads_a_share_of_150_percent(tmp_path: Path) -> None:
    """The mutant: the same measures without their ``raw.within`` bounds let an accuracy of 150 % and an infinite
    success into the report."""
    cells, ids = _tiny_plan()
    lines = raw.write(cells, ids, fake_values(lora.Final, cells), lora.Final).splitlines()
    path = _edited(_edited(tmp_path / "runs.csv", lines, "test_accuracy", "1.5"),
                   (tmp_path / "runs.csv").read_text().splitlines(), "attack_success", "inf")
    unbounded = dataclasses.make_dataclass("Unbounded", [(f.name, f.type) for f in dataclasses.fields(lora.Final)],
                                           frozen=True)
    got = raw.read(path, cells, ids, unbounded)
    assert got[cells[0]].test_accuracy == 1.5 and got[cells[0]].attack_success == float("inf")
    with pytest.raises(ConfigError):
        raw.read(path, cells, ids, lora.Final)


def test_a_raw_results_file_of_other_settings_another_study_or_too_large_is_refused(tmp_path: Path) -> None:
    cells, ids = _tiny_plan()
    values = fake_values(lora.Final, cells)
    path = tmp_path / "runs.csv"
    for changes in ({"rounds": 7}, {"lr": 0.5}, {"phrase": "good night"}):  # the same cells, other runs
        other_cells, other_ids = _tiny_plan(**changes)
        changed = {c.arm for c, a, b in zip(cells, ids, other_ids) if a != b}
        assert other_cells == cells and changed == ({"none", "phrase"} if "phrase" in changes else set(lora.ARMS))
        path.write_text(raw.write(cells, other_ids, values, lora.Final))
        with pytest.raises(ConfigError, match="run id of the planned configuration"):
            raw.read(path, cells, ids, lora.Final)
    # the committed quick preset's raw results (docs/lora.md's tables are made from them) are this study's: the
    # quick preset's 54 cells, each with its planned run id, every value within its bounds; the tiny grid's are not
    committed = Path(__file__).resolve().parent.parent / "docs" / "results" / "lora_quick_runs.csv"
    study = lora.Lora()
    quick, sets = study.configure("quick", 3, [])
    quick_cells, quick_ids = study.raw_cells(quick, *study.plan(quick, sets))
    assert len(raw.read(committed, quick_cells, quick_ids, lora.Final)) == 54
    with pytest.raises(ConfigError):
        raw.read(committed, cells, ids, lora.Final)
    path.write_text(raw.write(cells, ids, values, lora.Final) + "#" * raw.MAX_BYTES)  # bounded before it is read
    with pytest.raises(ConfigError, match=f"at most {raw.MAX_BYTES} bytes"):
        raw.read(path, cells, ids, lora.Final)
    path.write_text(raw.write(cells, ids, values, lora.Final))
    assert raw.read(path, cells, ids, lora.Final) == values


def test_the_command_refuses_a_hostile_results_file_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    """Through the command line: the tiny grid's file with one accuracy of 150 % is exit status 2 and one line naming
    ``results`` and the cell — no traceback, nothing trained, no report written."""
    study = lora.Lora()
    p, overrides = study.configure("quick", 2, TINY)
    cells, ids = study.raw_cells(p, *study.plan(p, overrides))
    lines = raw.write(cells, ids, fake_values(lora.Final, cells), lora.Final).splitlines()
    path = _edited(tmp_path / "runs.csv", lines, "test_accuracy", "1.5", row=3)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "phalanx.cli", "experiment", "lora", "--seeds", "2", "--out", str(out),
           *(a for s in TINY for a in ("--set", s)), "--results", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in said, said[-3000:]
    (line,) = [x for x in said.splitlines() if x.startswith("error:")]
    cell = ",".join(lines[3].split(",")[:4])  # mode,rule,arm,seed of the edited row
    assert "results=" in line and "in [0, 1] in the column test_accuracy" in line and cell in line
    assert not (out / "runs").exists() and not (out / "report.md").exists()
