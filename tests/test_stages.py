"""The stage seam (phalanx.training.stages): a stage of one's own on either side runs through the one loop with its
hooks, state, stream and columns, resumes bit for bit, and is refused where it cannot run; the loop and the
evaluation name no feature; a config turns stages on by section, the built-in ones by their flat keys only."""

from __future__ import annotations

import ast
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

from phalanx import aggregators, attacks, data, models
from phalanx.errors import ConfigError
from phalanx.experiments import grid, make_config, store, train
from phalanx.training import Experiment, Loop, loop
from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.algorithms.scaffold import Scaffold
from phalanx.training.stages.base import Evaluation, ServerRound, ServerStage, WorkerStage, WorkerUpdate
from phalanx.training.streams import generator

SMALL: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 6, "byzantine": 1, "f": 1,
    "aggregator": "cwtm", "attack": "alie", "rounds": 8, "batch_size": 8, "eval_every": 2, "checkpoint_every": 4,
    "seed": 2,
}


class ClipAggregate(ServerStage):
    """A server stage of one's own: the aggregate clipped to norm ``c`` and jittered from its own stream, counting
    the rounds it clipped (its state) and reporting the count (its column)."""

    name: ClassVar[str] = "clip_aggregate_test"
    streams: ClassVar[tuple[str, ...]] = ("clip-jitter-test",)

    def __init__(self, c: float = 0.05) -> None:
        self.c = c
        self.clipped = torch.zeros(1, dtype=torch.int64)

    def aggregated(self, agg: Tensor, r: ServerRound) -> Tensor:
        norm = float(torch.linalg.vector_norm(agg))
        jitter = 1e-4 * torch.randn(agg.shape, generator=r.generators["clip-jitter-test"])
        if norm > self.c:
            self.clipped += 1
            agg = agg * (self.c / norm)
        return agg + jitter.to(agg)

    def state_dict(self) -> dict[str, Tensor]:
        return {"clipped": self.clipped.clone()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.clipped = state["clipped"].clone() if state else torch.zeros(1, dtype=torch.int64)

    def column_names(self) -> tuple[str, ...]:
        return ("clipped_rounds",)

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        return {"clipped_rounds": int(self.clipped)}


class Halve(WorkerStage):
    """A worker stage of one's own: every update halved."""

    name: ClassVar[str] = "halve_test"

    def update(self, rows: Tensor, u: WorkerUpdate) -> Tensor:
        return rows.mul_(0.5)


def _experiment(**kw: Any) -> Experiment:
    ds = data.load("digits")
    model = models.make("mlp", ds.input_shape, ds.num_classes, generator=torch.Generator().manual_seed(0), hidden=[16])
    base: dict[str, Any] = {"model": model, "dataset": ds, "rule": aggregators.make("cwtm", f=1), "workers": 6,
                            "byzantine": 1, "attack": attacks.make("alie"), "rounds": 8, "eval_every": 2, "lr": 0.1}
    return Experiment(**{**base, **kw})


def test_a_server_stage_of_ones_own_acts_on_the_aggregate_with_its_state_stream_and_column(tmp_path: Path) -> None:
    """Every step is at most c (+ jitter) long, the column counts the clipped rounds, the state and the stream are in
    the checkpoint (``stage.<name>.clipped``, ``rng.<stream>``), and a resumed run equals an uninterrupted one."""
    stage = ClipAggregate(c=0.05)
    exp = _experiment(stages=[stage])
    run = Loop(exp, callbacks=[loop.Evaluate()])
    before = exp.problem.initial_theta()
    run.open()
    for _ in range(8):
        theta = run.state.theta.clone()
        run.step()
        step = float(torch.linalg.vector_norm(run.state.theta - theta))
        assert step <= 0.1 * (0.05 + 1e-4 * 40)  # η·(c + the jitter's norm, ≤ 40σ over 1,210 coordinates)
    assert not torch.equal(run.state.theta, before)
    assert run.rows[-1]["clipped_rounds"] == 8
    snap = run.snapshot()
    assert snap.stages["stage.clip_aggregate_test.clipped"].item() == 8 and "clip-jitter-test" in snap.streams
    full, part = tmp_path / "full", tmp_path / "part"
    rows = train(_experiment(stages=[ClipAggregate()]), full, checkpoint_every=4)

    class Stop(loop.Callback):
        def on_round(self, lp: Loop, info: loop.RoundInfo) -> None:
            if lp.state.round == 4:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_experiment(stages=[ClipAggregate()]), part, checkpoint_every=4, callbacks=[Stop()])
    assert train(_experiment(stages=[ClipAggregate()]), part, checkpoint_every=4) == rows
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert "stage.clip_aggregate_test.clipped" in a and "rng.clip-jitter-test" in a


def test_a_worker_stage_of_ones_own_sees_every_update_before_it_leaves() -> None:
    """DSGD with no attack and no momentum: the honest vectors of a run with the halving stage are half the vectors
    of the same run without it (the worker side applies it to the gradient, before momentum)."""
    algo = DSGD(momentum=0.0)
    plain = _experiment(algorithm=algo, attack=attacks.make("none"), byzantine=0)
    halved = _experiment(algorithm=algo, attack=attacks.make("none"), byzantine=0, stages=[Halve()])
    streams = {k: generator(0, k).get_state() for k in ("batches", "attack")}
    theta = plain.problem.initial_theta()
    a = plain.algorithm.all_workers(plain, streams, None).round(theta, 0, lambda x: x.mean(0)).vectors
    b = halved.algorithm.all_workers(halved, streams, None).round(theta, 0, lambda x: x.mean(0)).vectors
    torch.testing.assert_close(b, 0.5 * a)


def test_stages_that_cannot_run_are_refused_when_the_run_is_built() -> None:
    with pytest.raises(ConfigError, match=r"stages=.* is invalid: allowed a Stage"):
        _experiment(stages=["clip"])
    with pytest.raises(ConfigError, match=r"distinct names"):
        _experiment(stages=[ClipAggregate(), ClipAggregate()])

    class Thief(ClipAggregate):
        name: ClassVar[str] = "thief_test"
        streams: ClassVar[tuple[str, ...]] = ("batches",)  # the workers' own stream

    with pytest.raises(ConfigError, match="streams of its own"):
        _experiment(stages=[Thief()])

    class Overwriter(ClipAggregate):  # its own name and stream, but another stage's column
        name: ClassVar[str] = "overwriter_test"
        streams: ClassVar[tuple[str, ...]] = ("overwriter-test",)

    with pytest.raises(ConfigError, match=r"metric columns are distinct \(clipped_rounds is also clip_aggregate_test"):
        _experiment(stages=[ClipAggregate(), Overwriter()])
    with pytest.raises(ConfigError, match="do not pass every update they send through the worker stages"):
        _experiment(algorithm=Scaffold(), attack=attacks.make("none"), byzantine=0,
                    rule=aggregators.make("mean", f=0), stages=[Halve()])
    with pytest.raises(ConfigError, match=r"privacy=.* is invalid: allowed a WorkerStage"):
        _experiment(privacy=ClipAggregate())


def test_a_checkpoint_with_a_state_no_stage_of_the_run_claims_is_refused() -> None:
    exp = _experiment()
    start = loop.fresh_start(exp)
    start.stages = {"stage.somebody.else": torch.zeros(3)}
    with pytest.raises(ConfigError, match=r"start=\['stage.somebody.else'\] is invalid"):
        Loop(exp, start=start).open()


def test_the_loop_and_the_evaluation_name_no_feature() -> None:
    """No stage's name, stream, module or flat config key appears in the loop's code (a loop that branches on
    ``exp.privacy`` again fails here)."""
    tree = ast.parse(inspect.getsource(loop))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    features = {"privacy", "projection", "crfl", "dp", "norm_stats", "stats", "fail_closed", "dp_noise",
                "server_projection", "ClientDP", "CRFL", "PoolStats", "FailClosed", "projection_rng"}
    assert not features & (names | strings)


def test_a_config_turns_stages_on_by_section_and_the_built_ins_by_their_flat_keys_only() -> None:
    with pytest.raises(ConfigError, match=r"stages.norm_stat='norm_stat' is invalid.*norm_stats") as exc:
        make_config({**SMALL, "stages": {"norm_stat": {}}})
    assert exc.value.parameter == "stages.norm_stat"
    # the tree's [stages.crfl] is the flat keys' other spelling (docs/config.md): the same run, the same id
    section = make_config({**SMALL, "stages": {"crfl": {"clip": 1.0}}})
    flat = make_config({**SMALL, "server_projection": "crfl", "server_projection_params": {"clip": 1.0}})
    assert section == flat and grid.run_id(section) == grid.run_id(flat) != grid.run_id(make_config(SMALL))
    with pytest.raises(ConfigError, match=r"stages\.norm_stats"):
        make_config({**SMALL, "stages": {"norm_stats": {}}})
    plain = make_config(SMALL)
    assert "stages" not in plain.model_dump()  # a later key: configs without it keep their run ids


def test_the_checkpoint_keeps_the_keys_it_had_before_the_seam(tmp_path: Path) -> None:
    """CRFL's stream as ``rng.projection``, DP's as ``rng.dp``, the optimizer's state as ``optim.*``."""
    cfg = make_config({**SMALL, "dp_noise": 0.5, "dp_clip": 1.0, "server_projection": "crfl", "server_momentum": 0.5,
                       "server_projection_params": {"clip": 5.0, "noise": 0.01, "samples": 5}})
    train(cfg, tmp_path)
    keys = set(load_file(str(tmp_path / "checkpoint.safetensors")))
    assert {"rng.projection", "rng.dp", "optim.momentum_buffer"} <= keys
    assert not any(k.startswith("stage.") for k in keys)
    assert store.read_rows(tmp_path)[-1]["dp_epsilon"] > 0


def test_phalanx_list_stages_shows_each_with_how_it_is_turned_on_and_its_section(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rich.console import Console
    from typer.testing import CliRunner

    from phalanx import cli

    monkeypatch.setattr("phalanx.cli.listing.console", Console(width=400))
    out = CliRunner().invoke(cli.app, ["list", "stages"]).output
    for text in ("fail_closed", "stages.fail_closed (a TOML table)", "window: W ≥ 1", "crfl", "server_projection",
                 "dp_noise", "norm_stats", "algorithm = 'fedavg'"):
        assert text in out, text
    rows = json.loads(CliRunner().invoke(cli.app, ["list", "stages", "--format", "json"]).output)["tables"][0]["rows"]
    listed = {r["name"]: r["side"] for r in rows}
    built_in = {"byzantine_count": "server", "crfl": "server", "dp": "worker", "fail_closed": "server",
                "lora_residual": "server", "norm_stats": "server"}
    # A subset, not the set: a newcomer's stage (one file, docs/design.md) or an installed plug-in is listed too.
    assert built_in.items() <= listed.items()


def test_a_config_names_only_stages_it_can_turn_on() -> None:
    """``[stages.norm_stats]`` (a stage fedavg brings) is one line that names the key once, lists the stages a config
    turns on and says who brings it; a typo gets "did you mean". Before, the key was doubled
    (``stages.norm_stats.stages.norm_stats``) and the list named stages no config can set."""
    from phalanx.experiments import make_config

    base = {"dataset": "digits", "model": "logreg", "workers": 5, "aggregator": "mean", "f": 0, "rounds": 1}
    with pytest.raises(ConfigError) as info:
        make_config({**base, "stages": {"norm_stats": {}}})
    msg = str(info.value)
    assert info.value.parameter == "stages.norm_stats" and "\n" not in msg and "stages.norm_stats.stages" not in msg
    assert "fail_closed" in info.value.allowed and "byzantine_count" not in info.value.allowed and "brings it" in msg
    with pytest.raises(ConfigError, match="did you mean fail_closed"):
        make_config({**base, "stages": {"fail_closd": {}}})
