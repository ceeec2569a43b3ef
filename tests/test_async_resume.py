"""An asynchronous real run (``phalanx launch``, FedBuff) killed mid-run resumes from its checkpoint and finishes,
with keys and without (docs/async.md "On real processes"). The kill is on an event — rank 0 holding before a step
(a test hook, after the checkpoint it will resume from is written) — never on a sleep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from tests.test_async_processes import ASYNC, killed_while_holding, last_row, launched
from tests.test_distributed import run_dir

from phalanx.distributed.audit import audit
from phalanx.distributed.keys import init_keys
from phalanx.distributed.transcript import TRANSCRIPT, load
from phalanx.distributed.worker import resolve_config


@pytest.mark.parametrize("keyed", [False, True], ids=["store", "keys"])
def test_a_killed_async_run_resumes_from_its_checkpoint_and_finishes(keyed: bool, tmp_path: Path) -> None:
    """Ranks 0–4, K = 2, 20 steps, a checkpoint every 5. Rank 0 holds before step 12 (its checkpoint of step 10 is
    written); every rank is SIGKILLed there. The same job launched again says it resumes from step 10, ends all
    20 steps (a checkpoint of step 20, DONE) and learns; the run directory is the one of the first launch and its
    config is the one asked for (the same run id and identity). With keys, the transcript of the two sessions
    audits."""
    data = {**ASYNC, "workers": 5, "rounds": 20, "eval_every": 5, "checkpoint_every": 5}
    if keyed:
        init_keys(tmp_path / "keys", 5)
        data["keys"] = str(tmp_path / "keys")
    code, errs = killed_while_holding(data, tmp_path, 12)
    assert code != 0, errs[-3000:]
    d = run_dir(tmp_path / "out")
    assert not (d / "DONE").exists()
    with safe_open(str(d / "checkpoint.safetensors"), framework="pt") as fh:
        assert fh.metadata()["round"] == "10"
    code, errs = launched(data, tmp_path, {})
    assert code == 0, errs[-3000:]
    assert "resuming from the checkpoint of round 10" in errs, errs[-3000:]
    assert run_dir(tmp_path / "out") == d and (d / "DONE").exists()
    with safe_open(str(d / "checkpoint.safetensors"), framework="pt") as fh:
        assert fh.metadata()["round"] == "20"
    asked = resolve_config(str(tmp_path / "job.toml"), [])
    assert json.loads((d / "config.json").read_text()) == json.loads(json.dumps(asked.identity()))
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows if "test_accuracy" in r][-1] == 20
    row = last_row(tmp_path / "out")
    assert row["test_accuracy"] > 0.5 and row["staleness_max"] <= 3
    if keyed:  # the transcript of both sessions (two nonces) audits: its steps recomputed, signed by rank 0
        assert "sealed links" in errs and "no keys" not in errs
        report = audit(d)
        assert report.ok, report.problems
        assert report.rounds == 20 and report.results_unchecked == 0
        assert [s["from_round"] for s in load(d / TRANSCRIPT)["sessions"]] == [0, 10]
