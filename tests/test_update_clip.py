"""Update clipping at the worker (phalanx.training.stages.update_clip): every computing worker's update leaves it
with norm at most C — the honest ones and a data attack's — while a vector attack's rows are not bound; found by
name with no registry line; turned on by a TOML section from `phalanx run` and by `Experiment(stages=...)`; its bad
parameters one line naming `stages.update_clip.<key>`; a resumed run is the uninterrupted one bit for bit.

Added by a newcomer following docs/design.md, "Add a stage": this file and the stage's module, nothing else."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor
from typer.testing import CliRunner

from _interrupt import train_interrupted
from _processes import JOB_TIMEOUT_S
from phalanx import aggregators, attacks, cli, data, models
from phalanx.errors import ConfigError
from phalanx.experiments import grid, make_config, store, train
from phalanx.training import Experiment, run
from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.stages import registry
from phalanx.training.stages.base import WorkerUpdate
from phalanx.training.stages.update_clip import UpdateClip
from phalanx.training.streams import generator

EPS = torch.finfo(torch.float32).eps
"""Scaling a float32 row by a float64 factor rounds each coordinate once (≤ eps/2 relative) and the factor once:
the clipped norm is at most C·(1 + 2·eps) — 4·eps allowed."""

RUN: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 7, "byzantine": 2, "f": 2,
    "aggregator": "cwtm", "attack": "signflip", "rounds": 8, "batch_size": 8, "lr": 0.1, "eval_every": 2,
    "checkpoint_every": 4, "seed": 3, "stages": {"update_clip": {"c": 0.2}},
}

TOML = """\
[run]
workers = 7
byzantine = 2
rounds = 2
seed = 0
eval_every = 1

[rule]
spec = "cwtm"
f = 2

[attack]
name = "signflip"

[data]
name = "digits"

[model]
name = "mlp"
hidden = [16]

[stages.update_clip]
c = 0.2
"""


def assert_clipped(before: Tensor, after: Tensor, c: float) -> None:
    """The stage's contract on one call: every finite row leaves with norm ≤ C, in its own direction (a factor in
    (0, 1] of the row it came in as), and a row already within C — or of non-finite norm — leaves unchanged."""
    b, a = before.double(), after.double()
    norms = torch.linalg.vector_norm(b, dim=1)
    for i in range(b.shape[0]):
        if not math.isfinite(float(norms[i])) or float(norms[i]) <= c:
            same = torch.equal(after[i].view(torch.int32), before[i].view(torch.int32))  # bit for bit, NaN included
            assert same, f"row {i} within C (or non-finite) was changed"
            continue
        assert float(torch.linalg.vector_norm(a[i])) <= c * (1 + 4 * EPS), f"row {i} left with norm above C"
        s = float(a[i] @ b[i]) / float(norms[i]) ** 2
        assert 0 < s <= 1 and torch.allclose(a[i], s * b[i], rtol=4 * EPS, atol=0), f"row {i} not a clip of itself"


def _call(stage: UpdateClip, rows: Tensor) -> Tensor:
    return stage.update(rows.clone(), WorkerUpdate(rows.shape[0], slice(None), {}))


def test_it_is_found_by_name_with_no_registry_line() -> None:
    assert "update_clip" in registry.names() and registry.get("update_clip") is UpdateClip
    out = CliRunner().invoke(cli.app, ["list", "stages", "--format", "json"]).output
    row = next(r for r in json.loads(out)["tables"][0]["rows"] if r["name"] == "update_clip")
    assert row["side"] == "worker" and "stages.update_clip" in json.dumps(row)


class IgnoresC(UpdateClip):
    """Mutant: sends the update as it came."""

    def update(self, rows: Tensor, u: WorkerUpdate) -> Tensor:
        return rows


class ClipsEveryRow(UpdateClip):
    """Mutant: scales every row to norm C, the short ones up too."""

    def update(self, rows: Tensor, u: WorkerUpdate) -> Tensor:
        return rows * (self.c / torch.linalg.vector_norm(rows, dim=1, keepdim=True))


class ZeroesLongRows(UpdateClip):
    """Mutant: a long row leaves as 0 (norm ≤ C, but not a clip: its direction is lost)."""

    def update(self, rows: Tensor, u: WorkerUpdate) -> Tensor:
        keep = torch.linalg.vector_norm(rows, dim=1, keepdim=True) <= self.c
        return rows * keep


def test_every_update_leaves_with_norm_at_most_c_in_its_own_direction() -> None:
    """Rows of norm 0, below, at and far above C (1e30), and a row of ∞ and one of NaN: the contract holds, and the
    columns count the clipped rows (2: 3.0 and 1e30 — ∞ and NaN are left as they are) and the largest norm seen."""
    rows = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    rows[0] = 0
    rows[1] *= 0.1 / float(rows[1].norm())
    rows[2] *= 1.0 / float(rows[2].norm())  # exactly C in float32 up to one rounding
    rows[3] *= 3.0 / float(rows[3].norm())
    rows[4] *= 1e30 / float(rows[4].norm())
    rows[5, 7] = math.inf
    rows[6, 3] = math.nan
    rows[7] *= 0.5 / float(rows[7].norm())
    stage = UpdateClip(c=1.0)
    after = _call(stage, rows)
    assert_clipped(rows, after, 1.0)
    clipped, largest = stage.last or (None, None)
    finite = torch.linalg.vector_norm(rows.double(), dim=1)
    assert clipped == int(((finite > 1.0) & torch.isfinite(finite)).sum()) and clipped in (2, 3)
    assert largest == math.inf  # the ∞ row's norm: what this process saw, before clipping
    for mutant in (IgnoresC(c=1.0), ClipsEveryRow(c=1.0), ZeroesLongRows(c=1.0)):
        with pytest.raises(AssertionError):
            assert_clipped(rows, _call(mutant, rows), 1.0)


def test_a_process_with_no_rows_reports_none() -> None:
    stage = UpdateClip(c=1.0)
    _call(stage, torch.ones(3, 4))
    assert stage.last == (3, 2.0)
    _call(stage, torch.zeros(0, 4))
    assert stage.last is None and set(stage.columns(None).values()) == {None}  # type: ignore[arg-type]


def _experiment(attack: str = "gaussian", stages: list[Any] | None = None, byzantine: int = 2) -> Experiment:
    ds = data.load("digits")
    model = models.make("mlp", ds.input_shape, ds.num_classes, generator=torch.Generator().manual_seed(0), hidden=[16])
    return Experiment(model=model, dataset=ds, rule=aggregators.make("cwtm", f=2), workers=7, byzantine=byzantine,
                      attack=attacks.make(attack), rounds=2, eval_every=1, lr=0.1, algorithm=DSGD(batch_size=8),
                      stages=stages or [])


def _round_vectors(exp: Experiment) -> Tensor:
    """The m vectors the server receives in round 0 (honest rows first, the Byzantine rows last)."""
    streams = {k: generator(0, k).get_state() for k in ("batches", "attack")}
    theta = exp.problem.initial_theta()
    return exp.algorithm.all_workers(exp, streams, None).round(theta, 0, lambda x: x.mean(0)).vectors


def test_in_a_run_the_honest_updates_are_bound_and_a_vector_attacks_rows_are_not() -> None:
    """Round 0 of DSGD (its momentum starts at 0, so what a worker sends is its clipped gradient): the 5 honest
    rows have norm ≤ C; without the stage the same rows are longer (the check can fail); the 2 Gaussian attack rows
    (σ = 200 by default) are whatever the attack makes."""
    c = 0.05
    plain = torch.linalg.vector_norm(_round_vectors(_experiment()).double(), dim=1)
    assert float(plain[:5].min()) > c  # without the stage every honest row is above C
    clipped = torch.linalg.vector_norm(_round_vectors(_experiment(stages=[UpdateClip(c=c)])).double(), dim=1)
    assert float(clipped[:5].max()) <= c * (1 + 4 * EPS)
    assert float(clipped[5:].min()) > c  # the attack does not run the protocol: nothing at the worker binds it


def test_a_data_attackers_update_is_bound_too() -> None:
    """Label flipping follows the protocol on poisoned data: its workers compute, so their updates are clipped."""
    got = torch.linalg.vector_norm(_round_vectors(_experiment("labelflip", [UpdateClip(c=0.05)])).double(), dim=1)
    assert got.shape == (7,) and float(got.max()) <= 0.05 * (1 + 4 * EPS)


def test_phalanx_run_turns_it_on_from_a_toml_section(tmp_path: Path) -> None:
    """`phalanx run` on a tiny tree config (rounds = 2): every row has the stage's columns, each evaluated round
    clipped at most the 5 honest rows, and the run id is the one make_config gives (the section is in the identity:
    not the id of the same config without it)."""
    (tmp_path / "c.toml").write_text(TOML)
    res = CliRunner().invoke(cli.app, ["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    rows = store.read_rows(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert rows[0]["update_clip_clipped"] is None
    assert all(0 < r["update_clip_clipped"] <= 5 and r["update_clip_max_norm"] > 0.2 for r in rows[1:])
    assert json.loads((run_dir / "config.json").read_text())["stages"] == {"update_clip": {"c": 0.2}}
    without = make_config({**RUN, "rounds": 2, "batch_size": 32, "seed": 0, "eval_every": 1, "checkpoint_every": 10,
                           "stages": {}})
    assert run_dir.name != grid.run_id(without)


def test_the_api_runs_it_as_a_stage_object() -> None:
    """`Experiment(stages=[UpdateClip(c)])` through `phalanx.training.run`: the rows carry the columns, and the run is
    another than the one without the stage."""
    rows = run(_experiment("signflip", [UpdateClip(c=0.05)]))
    assert [r["round"] for r in rows] == [0, 1, 2] and rows[-1]["update_clip_clipped"] == 5
    plain = run(_experiment("signflip"))
    assert "update_clip_clipped" not in plain[-1] and plain[-1]["test_loss"] != rows[-1]["test_loss"]


@pytest.mark.parametrize(("section", "key"), [
    ({"c": 0}, "stages.update_clip.c"), ({"c": -1.0}, "stages.update_clip.c"),
    ({"c": math.inf}, "stages.update_clip.c"), ({"c": "1"}, "stages.update_clip.c"),
    ({"c": True}, "stages.update_clip.c"), ({"cc": 1.0}, "stages.update_clip.cc"),
])
def test_bad_parameters_are_one_line_naming_the_key(section: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_config({**RUN, "stages": {"update_clip": section}})
    assert exc.value.parameter == key and "\n" not in str(exc.value)


def test_the_command_line_names_the_key_of_a_bad_value(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The `phalanx` script: one line naming the key, exit code 2, no run directory made."""
    (tmp_path / "c.toml").write_text(TOML.replace("c = 0.2", "c = 0"))
    monkeypatch.setattr("sys.argv", ["phalanx", "run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    out = capsys.readouterr().out.strip()
    assert out == "error: [stages.update_clip].c=0 is invalid: allowed a finite number > 0"  # a tree: as written
    assert not (tmp_path / "out").exists() or not any(p.is_dir() for p in (tmp_path / "out").iterdir())


def test_an_algorithm_whose_workers_skip_the_stages_refuses_it() -> None:
    """Gossip's nodes do not pass their updates through the worker stages: refused where the config is validated."""
    with pytest.raises(ConfigError, match=r"a stage the workers of Gossip run") as exc:
        make_config({**RUN, "algorithm": "gossip", "graph": "complete", "attack": "none", "byzantine": 0, "f": 0,
                     "aggregator": "mean"})
    assert exc.value.parameter == "stages.update_clip"


def test_a_resumed_run_equals_an_uninterrupted_one_bit_for_bit(tmp_path: Path) -> None:
    cfg = make_config(RUN)
    full = tmp_path / "full"
    train(cfg, full)
    part = train_interrupted(make_config(RUN), tmp_path / "part", 4)
    train(make_config(RUN), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert not any(k.startswith("stage.update_clip") for k in a)  # no state: nothing to carry
    assert store.read_rows(full) == store.read_rows(part)




def test_under_phalanx_launch_the_rows_count_every_worker_and_the_run_is_the_simulated_one(
        tmp_path: Path) -> None:
    """`phalanx launch --workers 4` (topology server: rank 0 serves and computes one worker; 1 signflip rank) with
    both new stages: θ is the simulated run's (up to the all-reduce order: the tolerance of tests/test_distributed),
    the server stage's counts are the simulated run's, and the worker stage's columns count every computing worker
    as the simulated run does — rank 0's own row and the 2 other honest ranks' reports (issue 39's trial, finding 3:
    before, they counted rank 0's row only, at most 1 clipped where the simulated run counts 3)."""
    flat = {**RUN, "workers": 4, "byzantine": 1, "f": 1, "rounds": 2, "eval_every": 1, "checkpoint_every": 10,
            "seed": 0, "batch_size": 8, "stages": {"update_clip": {"c": 0.05}, "adaptive_clip": {"multiplier": 0.5}}}
    sim = tmp_path / "sim"
    sim_rows = train(make_config(flat), sim)
    cfg = tmp_path / "c.toml"
    flat_keys = {k: v for k, v in flat.items() if k not in ("model", "model_params", "stages")}
    cfg.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in flat_keys.items()) + "\n[model]\nname = \"mlp\"\n"
                   "hidden = [16]\n[stages.update_clip]\nc = 0.05\n[stages.adaptive_clip]\nmultiplier = 0.5\n")
    done = subprocess.run([sys.executable, "-m", "phalanx.cli", "launch", "--workers", "4", str(cfg), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    rows = store.read_rows(run_dir)
    got, want = load_file(str(run_dir / "checkpoint.safetensors")), load_file(str(sim / "checkpoint.safetensors"))
    torch.testing.assert_close(got["theta"], want["theta"], atol=1e-5, rtol=1e-4)
    assert [r["adaptive_clip_clipped"] for r in rows] == [r["adaptive_clip_clipped"] for r in sim_rows]
    assert [r["update_clip_clipped"] for r in sim_rows[1:]] == [3, 3]
    assert [r["update_clip_clipped"] for r in rows[1:]] == [3, 3]
    assert [r["update_clip_reported"] for r in rows[1:]] == [2, 2] and [r["update_clip_reported"] for r in
                                                                        sim_rows[1:]] == [0, 0]
    assert [r["update_clip_max_norm"] for r in rows[1:]] == pytest.approx([r["update_clip_max_norm"] for r in
                                                                           sim_rows[1:]], rel=1e-4)
