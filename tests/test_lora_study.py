"""The LoRA study (phalanx.studies.lora, `phalanx experiment lora`; issue 35 items 3 and 6): the grid and its
configurations, the paired price, rescue and backdoor lift with their Holm-corrected verdicts, and one tiny
end-to-end run through the CLI on the embedded model."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx import studies
from phalanx.errors import ConfigError

pytest.importorskip("transformers")
pytest.importorskip("peft")

from phalanx.studies import lora


def test_quick_grid_is_modes_by_rules_by_arms_by_seeds_of_valid_configs() -> None:
    p = lora.preset("quick")
    cells, cfgs = lora.plan(p)
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
    p = lora.preset("quick")
    with pytest.raises(ConfigError, match="preset's fields"):
        lora.config_for(p, lora.Cell("shared", "mean", "none", 0), {"attack": "alie"}, trigger=[207])


def _finals(acc: dict[tuple[str, str], list[float]], success: dict[tuple[str, str], list[float]],
            flip: dict[tuple[str, str], list[float | None]]) -> dict[lora.Cell, lora.Final]:
    out: dict[lora.Cell, lora.Final] = {}
    for rule in ("mean", "cwtm"):
        for arm in lora.ARMS:
            for seed in range(3):
                out[lora.Cell("shared", rule, arm, seed)] = {
                    "test_accuracy": acc[(rule, arm)][seed], "attack_success": success.get((rule, arm), [None] * 3)[
                        seed], "attack_flip": flip.get((rule, arm), [None] * 3)[seed], "attack_clean_target": None,
                    "attack_flip_base": 10.0, "lora_residual": None}
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


def test_cli_runs_a_tiny_grid_and_writes_the_report_and_the_per_run_csv(tmp_path: Path) -> None:
    out = tmp_path / "lora"
    cmd = [sys.executable, "-m", "phalanx.cli", "experiment", "lora", "--seeds", "2", "--out", str(out), "-j", "1",
           "--set", "rounds=1", "--set", "workers=6", "--set", "byzantine=1", "--set", "f=1", "--set", "local_steps=1",
           "--set", "modes=['update']", "--set", "rules=['mean','cwtm']", "--set", "batch_size=4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
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
