"""Worker-stage reports under ``phalanx launch`` (issue 39's trial, finding 3): every parameter-server worker sends
rank 0 its worker stages' measurements of the round with its update (``m/<t>/<r>``, :mod:`phalanx.distributed.wire`),
and rank 0's stage merges the plausible ones into its columns. A report is its sender's claim: one out of the stage's
bounds or of another length or tag is dropped, a plausible lie is counted as reported, and none changes the run.

The honest launch (the columns equal the simulated run's) is
``tests/test_update_clip.py::test_under_phalanx_launch_the_rows_count_every_worker_and_the_run_is_the_simulated_one``.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from phalanx.distributed import wire
from phalanx.experiments import store
from phalanx.training.stages.base import WorkerUpdate
from phalanx.training.stages.update_clip import UpdateClip

JOB_TIMEOUT_S = float(os.environ.get("PHALANX_TEST_JOB_TIMEOUT", "120"))
"""The launch's hard timeout (raise it on a machine shared with other work: PHALANX_TEST_JOB_TIMEOUT=600)."""


def _stage(rows: torch.Tensor, c: float = 1.0, workers: int = 4) -> UpdateClip:
    """Rank 0's stage after its own update of ``rows`` in a round of ``workers`` computing workers."""
    stage = UpdateClip(c=c)
    stage.update(rows.clone(), WorkerUpdate(workers, slice(0, rows.shape[0]), {}))
    return stage


def _report(*values: float) -> bytes:
    return wire.REPORT + struct.pack(f"<{len(values)}d", *values)


def test_a_report_round_trips_and_merges_into_the_columns() -> None:
    worker = _stage(torch.tensor([[3.0, 4.0]]))  # norm 5 > 1: clipped
    assert worker.report() == (1.0, 5.0)
    payload = wire.report_message([worker])
    assert len(payload) == len(wire.REPORT) + 16 and wire.parse_report([worker], payload) == [(1.0, 5.0)]
    idle = _stage(torch.zeros(0, 2))
    assert wire.parse_report([idle], wire.report_message([idle])) == [None]  # no row: no claim
    rank0 = _stage(torch.tensor([[0.3, 0.4]]))  # norm 0.5: not clipped
    dropped = wire.absorb_reports([rank0], {1: payload, 2: wire.report_message([idle])})
    assert dropped == 0
    assert rank0.columns(None) == {"update_clip_clipped": 1, "update_clip_max_norm": 5.0,  # type: ignore[arg-type]
                                   "update_clip_reported": 1}


BAD: list[tuple[str, bytes]] = [
    ("a count above n", _report(5.0, 2.0)), ("a huge count", _report(1e300, 1e300)),
    ("a negative count", _report(-1.0, 0.5)), ("a fractional count", _report(0.5, 2.0)),
    ("a NaN count", _report(math.nan, 2.0)), ("an infinite count", _report(math.inf, 2.0)),
    ("a NaN norm", _report(1.0, math.nan)), ("a negative norm", _report(0.0, -1.0)),
    ("clipped with a norm within C", _report(1.0, 0.5)), ("not clipped with a finite norm above C", _report(0.0, 2.0)),
    ("a report one byte short", _report(1.0, 2.0)[:-1]), ("a report one byte long", _report(1.0, 2.0) + b"\0"),
    ("another tag (a peer of another release)", b"R0" + _report(1.0, 2.0)[2:]), ("empty", b""),
    ("8 MiB", _report(1.0, 2.0) * (1 << 19)),
]
"""Reports a Byzantine rank (or a peer of another release) may send: each is dropped."""


@pytest.mark.parametrize(("case", "payload"), BAD, ids=[b[0] for b in BAD])
def test_a_report_out_of_bounds_is_dropped_and_the_columns_stay_rank_0s(case: str, payload: bytes) -> None:
    rank0 = _stage(torch.tensor([[0.3, 0.4]]))
    before = rank0.columns(None)  # type: ignore[arg-type]
    wire.absorb_reports([rank0], {3: payload})
    assert rank0.columns(None) == before  # type: ignore[arg-type]
    assert before["update_clip_reported"] == 0


def test_a_plausible_lie_is_counted_as_reported_and_an_infinite_norm_is_a_row_left_unclipped() -> None:
    rank0 = _stage(torch.tensor([[0.3, 0.4]]))
    wire.absorb_reports([rank0], {1: _report(1.0, 1.5), 2: _report(0.0, math.inf)})
    cols = rank0.columns(None)  # type: ignore[arg-type]
    assert cols == {"update_clip_clipped": 1, "update_clip_max_norm": math.inf, "update_clip_reported": 2}


def test_the_mutant_that_trusts_every_report_records_what_an_attacker_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a stage that merges every report that parses (no bounds): a Byzantine rank then makes rank 0 record
    a count of 1e300 and a NaN norm, which the test above refuses."""
    monkeypatch.setattr(UpdateClip, "plausible", lambda self, claim: True)
    rank0 = _stage(torch.tensor([[0.3, 0.4]]))
    wire.absorb_reports([rank0], {3: _report(1e300, math.nan)})
    assert rank0.columns(None)["update_clip_clipped"] > 1e299  # type: ignore[arg-type]


RUN: dict[str, Any] = {
    "dataset": "digits", "workers": 4, "byzantine": 1, "f": 1, "aggregator": "cwtm", "attack": "signflip",
    "rounds": 5, "batch_size": 8, "lr": 0.1, "eval_every": 1, "checkpoint_every": 10, "seed": 0,
}


def _launch(tmp: Path, name: str, env: dict[str, str]) -> tuple[list[dict[str, Any]], torch.Tensor, str]:
    cfg = tmp / f"{name}.toml"
    cfg.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in RUN.items()) + "\n[model]\nname = \"mlp\"\n"
                   "hidden = [16]\n[stages.update_clip]\nc = 0.05\n")
    done = subprocess.run([sys.executable, "-m", "phalanx.cli", "launch", "--workers", "4", str(cfg), "--out",
                           str(tmp / name)], capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = [p for p in (tmp / name).iterdir() if p.is_dir()]
    return store.read_rows(run_dir), load_file(str(run_dir / "checkpoint.safetensors"))["theta"], done.stderr


def test_under_phalanx_launch_a_lying_rank_is_a_claim_and_changes_nothing_but_the_reported_columns(
        tmp_path: Path) -> None:
    """A real launch (topology server, 4 ranks, rank 3 signflip): rank 2 sends out-of-bounds reports of five kinds
    (the test hook ``PHALANX_TEST_REPORT``), one a round — each dropped; rank 1 reports (1, 1.0) every round — a
    plausible lie, counted as reported. θ is bit for bit the honest launch's, and the columns are bounded."""
    honest, theta, _ = _launch(tmp_path, "honest", {})
    lied, theta_lied, err = _launch(tmp_path, "lied", {"PHALANX_TEST_REPORT": "2:huge+nan+short+other+huge,1:lie"})
    assert "a huge report (test hook)" in err and "a lie report (test hook)" in err
    assert torch.equal(theta, theta_lied)  # the reports are never read by a decision
    assert [r["update_clip_reported"] for r in honest[1:]] == [2] * 5
    assert [r["update_clip_reported"] for r in lied[1:]] == [1] * 5  # rank 1's lie only: rank 2's dropped
    assert all(0 <= r["update_clip_clipped"] <= 4 and r["update_clip_max_norm"] >= 1.0 for r in lied[1:])
    assert [r["test_accuracy"] for r in lied] == [r["test_accuracy"] for r in honest]
