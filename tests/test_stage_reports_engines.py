"""Worker-stage reports on the other engines of ``phalanx launch`` (issue 39, tests/test_stage_reports.py for the
unkeyed server topology): a keyed server job (each worker's report signed with its vector, ``REPORTED_VECTOR``), a
serverless job without keys (each rank's report in its gathered row) and a keyed serverless job (enclosed in its
signed row). Real launches (4 ranks, rank 3 signflip, ``update_clip`` with C = 0.05, 5 rounds):

* honest: the columns count every computing worker, as the simulated run does — ``update_clip_clipped`` and
  ``update_clip_max_norm`` are the simulated run's, ``update_clip_reported`` is 2 (ranks 1 and 2; rank 3 computes no
  update) — and a keyed job's transcript audits;
* lying (``PHALANX_TEST_REPORT``): rank 2 sends out-of-bounds reports of five kinds, one a round (huge, NaN, one
  byte short, another tag) — each dropped — and rank 1 reports (1, 1.0) every round, a plausible lie counted as
  reported: θ and the accuracies are bit for bit the honest launch's, the columns stay bounded, and the keyed audit
  still passes (the reports are under the signatures the transcript records).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _processes import JOB_TIMEOUT_S
from phalanx.distributed.audit import audit
from phalanx.distributed.keys import init_keys
from phalanx.experiments import make_config, store, train

RUN: dict[str, Any] = {
    "dataset": "digits", "workers": 4, "byzantine": 1, "f": 1, "aggregator": "cwtm", "attack": "signflip",
    "rounds": 5, "batch_size": 8, "lr": 0.1, "eval_every": 1, "checkpoint_every": 10, "seed": 0,
}
LIES = "2:huge+nan+short+other+huge,1:lie"
ENGINES = [("server", True), ("serverless", False), ("serverless", True)]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys") / "job"
    init_keys(d, 4)
    return d


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The simulated run's rows (every computing worker in one process: reported 0)."""
    out = tmp_path_factory.mktemp("sim")
    return train(make_config({**RUN, "model": "mlp", "model_params": {"hidden": [16]},
                              "stages": {"update_clip": {"c": 0.05}}}), out)


def _launch(tmp: Path, name: str, extra: dict[str, Any],
            env: dict[str, str]) -> tuple[list[dict[str, Any]], torch.Tensor, str, Path]:
    cfg = tmp / f"{name}.toml"
    cfg.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in {**RUN, **extra}.items()) + "\n[model]\n"
                   "name = \"mlp\"\nhidden = [16]\n[stages.update_clip]\nc = 0.05\n")
    done = subprocess.run([sys.executable, "-m", "phalanx.cli", "launch", "--workers", "4", str(cfg), "--out",
                           str(tmp / name)], capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = [p for p in (tmp / name).iterdir() if p.is_dir()]
    theta = load_file(str(run_dir / "checkpoint.safetensors"))["theta"]
    return store.read_rows(run_dir), theta, done.stderr, run_dir


@pytest.mark.parametrize(("topology", "keyed"), ENGINES, ids=[f"{t}-{'keyed' if k else 'unkeyed'}" for t, k in ENGINES])
def test_the_columns_count_every_worker_and_a_lying_rank_changes_nothing_but_its_claim(
        topology: str, keyed: bool, keys: Path, simulated: list[dict[str, Any]], tmp_path: Path) -> None:
    extra: dict[str, Any] = {"topology": topology, **({"keys": str(keys)} if keyed else {})}
    honest, theta, _, honest_dir = _launch(tmp_path, "honest", extra, {})
    lied, theta_lied, err, lied_dir = _launch(tmp_path, "lied", extra, {"PHALANX_TEST_REPORT": LIES})
    assert "a huge report (test hook)" in err and "a lie report (test hook)" in err
    # honest: every computing worker counted, as the simulated run counts them
    assert [r["update_clip_reported"] for r in honest[1:]] == [2] * 5
    assert [r["update_clip_clipped"] for r in honest] == [r["update_clip_clipped"] for r in simulated]
    assert [r["update_clip_max_norm"] for r in honest[1:]] == pytest.approx(
        [r["update_clip_max_norm"] for r in simulated[1:]], rel=1e-4)
    # lying: θ bit for bit the honest launch's, rank 2's reports dropped, rank 1's lie a bounded claim
    assert torch.equal(theta, theta_lied)
    assert [r["test_accuracy"] for r in lied] == [r["test_accuracy"] for r in honest]
    assert [r["update_clip_reported"] for r in lied[1:]] == [1] * 5
    assert all(0 <= r["update_clip_clipped"] <= 4 and r["update_clip_max_norm"] >= 1.0 for r in lied[1:])
    if keyed:  # the reports travel under the signatures the transcript records: the audit passes on both
        for run_dir in (honest_dir, lied_dir):
            report = audit(run_dir)
            assert report.ok, report.problems
