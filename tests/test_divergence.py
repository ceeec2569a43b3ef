"""A run whose model becomes non-finite stops with a divergence status: never marked done, never resumed into more
garbage, shown as such by the grid, the report and `phalanx status`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from phalanx import cli
from phalanx.attacks.mimic import mimic_target
from phalanx.experiments import report, runner, runstate, status, store
from phalanx.experiments.config import make_config
from phalanx.experiments.grid import run_id
from phalanx.experiments.train import train
from phalanx.studies import reporting
from phalanx.training.divergence import Diverged

SMALL = {"dataset": "digits", "model": "logreg", "workers": 5, "byzantine": 1, "attack": "inf", "rounds": 12,
         "eval_every": 5, "batch_size": 4, "checkpoint_every": 4}


def test_mean_under_inf_diverges_and_stops(tmp_path: Path) -> None:
    cfg = make_config({**SMALL, "aggregator": "mean"})
    run = tmp_path / "run"
    with pytest.raises(Diverged, match="after round 1 the model has") as exc:
        train(cfg, run)
    assert exc.value.round == 1 and exc.value.bad > 0
    rows = store.read_rows(run)  # the manifest's digest checks them
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[-1]["diverged"] is True and rows[-1]["test_accuracy"] == 0.0 and rows[-1]["test_loss"] is None
    text = (run / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert not store.is_finished(run) and runstate.failure(run) is None
    assert reporting.final_accuracy(run) == 0.0  # an experiment's table counts it (it did not refuse the grid)
    st = runstate.state(run)
    assert st.status == "diverged" and "round 1" in st.detail
    before = json.loads((run / "DIVERGED").read_text())
    with pytest.raises(Diverged, match="after round 1"):  # not trained again: the same end, from the record
        train(cfg, run)
    assert json.loads((run / "DIVERGED").read_text()) == before


def test_a_grid_counts_divergence_as_an_end(tmp_path: Path) -> None:
    cfgs = [make_config({**SMALL, "aggregator": a, "f": f}) for a, f in (("mean", 0), ("cwtm", 1))]
    out = tmp_path / "out"
    events: list[tuple[str, str]] = []
    runner.run_grid(cfgs, out, on_done=lambda c, s: events.append((c.aggregator, s)))  # no error: both ended
    assert events == [("mean", "diverged"), ("cwtm", "done")]
    assert sorted(r.status for r in status.grid_status(out)) == ["diverged", "done"]
    events.clear()
    runner.run_grid(cfgs, out, on_done=lambda c, s: events.append((c.aggregator, s)))
    assert events == [("mean", "skipped (diverged)"), ("cwtm", "skipped (finished)")]
    summary = {s["aggregator"]: s for s in report.write_report(out)["summary"]}
    assert summary["mean"]["diverged"] == 1 and summary["mean"]["final_accuracy"] == 0.0
    assert summary["cwtm"]["diverged"] == 0 and summary["cwtm"]["final_accuracy"] > 0.2  # learning (chance: 0.1)
    assert "| diverged |" in (out / "report.md").read_text()


def test_cli_run_says_it_diverged(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in SMALL.items()))
    res = CliRunner().invoke(cli.app, ["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "out"),
                                       "--set", "aggregator=mean"])
    assert res.exit_code == 0, res.output
    assert "1 run(s) diverged" in res.output
    cfg = make_config({**SMALL, "aggregator": "mean"})
    assert runstate.state(tmp_path / "out" / run_id(cfg)).status == "diverged"


def test_mimic_on_non_finite_rows_does_not_crash() -> None:
    x = torch.tensor([[1.0, 2.0], [float("inf"), 0.0], [0.0, float("nan")]])
    assert mimic_target(x) == 0
