"""What must survive every refactor of the config and the spine: today's run ids (a run directory is found by its
id, so a changed id silently retrains, or orphans, every run a user has) and today's run directories (an interrupted
one resumes; a FedBN checkpoint from before the algorithm state had its own prefix included).

The ids were computed by the code of 2026-12-01 (commit 27c44bf) and agree with today's; the run directories under
``tests/data/rundirs`` were written by it (``tests/data/rundirs/configs.json``: their configs), interrupted after the
round-4 checkpoint of 8 rounds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from phalanx.experiments import grid, make_config, store, train

DEFAULT_JOB = {"dataset": "digits", "model": "mlp", "workers": 20, "byzantine": 4, "f": 4, "attack": "alie",
               "partition": "dirichlet", "alpha": 1.0, "rounds": 300, "batch_size": 32, "lr": 0.1, "momentum": 0.9,
               "schedule": "cosine", "seed": 0, "eval_every": 25, "checkpoint_every": 100}
"""The built-in job as it was on 2026-12-01, one point per rule below."""

IDS: list[tuple[str, dict[str, Any], str]] = [
    *[(f"the 2026-12-01 default job, {rule}", {**DEFAULT_JOB, "aggregator": rule}, run_id) for rule, run_id in (
        ("mean", "mean_alie_f4_b4_s0_f8bfc4dd52"), ("cwtm", "cwtm_alie_f4_b4_s0_b7dbde592a"),
        ("krum", "krum_alie_f4_b4_s0_f6b5081305"), ("geomed", "geomed_alie_f4_b4_s0_5a15ece2eb"),
        ("nnm>cwtm", "nnm-cwtm_alie_f4_b4_s0_4c977e18a6"))],
    ("fedavg", {"algorithm": "fedavg", "workers": 20, "clients_per_round": 5, "local_steps": 3, "client_lr": 0.05,
                "aggregator": "cwtm", "f": 1}, "cwtm_none_f1_b0_s0_dfe43117a0"),
    ("fedavg, the clients' rate by its old name", {"algorithm": "fedavg", "workers": 20, "clients_per_round": 5,
                                                   "local_steps": 3, "lr": 0.05, "aggregator": "cwtm", "f": 1},
     "cwtm_none_f1_b0_s0_dfe43117a0"),
    ("gossip", {"algorithm": "gossip", "graph": "ring", "workers": 8, "aggregator": "cwtm", "f": 0, "node_lr": 0.1},
     "cwtm_none_f0_b0_s0_fd95fea554"),
    ("anytime", {"algorithm": "anytime", "graph": "torus", "workers": 9, "aggregator": "mean", "f": 0, "lr": 0.01},
     "mean_none_f0_b0_s0_70536dfa67"),
    ("scaffold", {"algorithm": "scaffold", "algorithm_params": {"clients_per_round": 4, "local_steps": 2},
                  "workers": 10, "aggregator": "cwmed", "f": 1}, "cwmed_none_f1_b0_s0_b5061707a4"),
    ("torchrun serverless", {"engine": "torchrun", "topology": "serverless", "workers": 4, "aggregator": "cwtm",
                             "f": 1}, "cwtm_none_f1_b0_s0_62836d18d9"),
]


@pytest.mark.parametrize(("what", "data", "run_id"), IDS, ids=[case[0] for case in IDS])
def test_todays_run_ids_do_not_change(what: str, data: dict[str, Any], run_id: str) -> None:
    assert grid.run_id(make_config(data)) == run_id, what


FIXTURES = Path(__file__).parent / "data" / "rundirs"


class FirstRound:
    def __init__(self) -> None:
        self.rounds: list[int] = []

    def __call__(self, t: int, rounds: int, row: dict[str, Any] | None) -> None:
        self.rounds.append(t)


@pytest.mark.parametrize("name", ["dsgd", "fedbn"])
def test_a_run_directory_written_by_todays_code_resumes(name: str, tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "configs.json").read_text())[name]
    cfg = make_config(data)
    (written,) = (FIXTURES / name).iterdir()
    assert written.name == grid.run_id(cfg)  # found under the id it was written under
    run = shutil.copytree(written, tmp_path / written.name)
    before = store.read_rows(run)
    seen = FirstRound()
    rows = train(cfg, run, progress=seen)
    assert seen.rounds == [5, 6, 7, 8]  # resumed after the round-4 checkpoint, not trained again
    assert rows[: len(before)] == before and store.is_finished(run)
    assert [r["round"] for r in rows] == [0, 2, 4, 6, 8]
    ckpt = load_file(str(run / "checkpoint.safetensors"))
    assert bool(torch.isfinite(ckpt["theta"]).all())
    if name == "fedbn":  # its table was kept under its old bare name; the new checkpoint has it prefixed
        assert "local_norms" in load_file(str(written / "checkpoint.safetensors"))
        assert "algorithm.local_norms" in ckpt and "local_norms" not in ckpt
