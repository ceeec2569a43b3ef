"""Experiment trackers (issue 25, item 1): TensorBoard, MLflow and W&B receive each run — its config as parameters,
every metric row at step = round, its end — read back from the files each library writes: the TensorBoard event
file with TensorBoard's own reader, the MLflow file store with ``MlflowClient``, the W&B offline run's ``.wandb``
file (its records parsed with W&B's protobufs). A resumed run continues the same tracked run and logs no row twice;
a tracker failing mid-run is dropped with a warning and the run's results are complete; bad input is one line
before anything runs.

Every test that needs a tracker's package skips without it (``pytest.importorskip``); CI installs them all (the
``dev`` extra).
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from phalanx import cli
from phalanx.errors import ConfigError
from phalanx.experiments import grid, signals, store, tracking
from phalanx.experiments.config import apply_overrides, make_config
from phalanx.experiments.tracking import TrackedRun, Tracker, flatten
from phalanx.experiments.tracking.callback import KEPT
from phalanx.experiments.train import train
from phalanx.training.divergence import Diverged
from phalanx.training.loop import Callback, Loop, RoundInfo

TINY: dict[str, Any] = {"dataset": "digits", "model": "logreg", "workers": 5, "byzantine": 1, "f": 1,
                        "aggregator": "cwtm", "attack": "signflip", "rounds": 8, "eval_every": 1, "batch_size": 8,
                        "checkpoint_every": 4}


def rows_of(run: Path) -> list[dict[str, Any]]:
    return store.read_rows(run)


class Boom(Callback):
    """Stops the run after round ``at`` (its rows made and tracked), as a crash would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        if loop.state.round == self.at:
            raise RuntimeError("killed")


def interrupted_then_resumed(cfg: Any, run: Path) -> None:
    """Train ``cfg`` into ``run``, stopped after round 6 (checkpoint at 4), then again to the end (a resume)."""
    with pytest.raises(RuntimeError, match="killed"):
        train(cfg, run, callbacks=[Boom(6)])
    assert not store.is_finished(run)
    train(cfg, run)
    assert store.is_finished(run)


# --- bad input: one line, before anything runs ---------------------------------------------------------------


def test_an_unknown_tracker_is_one_line_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"tracking='mlfow'.*mlflow") as exc:
        make_config({**TINY, "tracking": ["mlfow"]})
    assert "\n" not in str(exc.value) and "did you mean mlflow?" in str(exc.value)


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking.MLflow, "package", "phalanx_no_such_package")
    with pytest.raises(ConfigError, match=r"pip install 'phalanx\[mlflow\]'") as exc:
        make_config({**TINY, "tracking": "mlflow"})
    assert "\n" not in str(exc.value) and exc.value.parameter == "tracking"


def test_a_location_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for uri in (blocker, blocker / "below"):
        with pytest.raises(ConfigError, match=r"tracking_params\.tensorboard\.uri"):
            make_config({**TINY, "tracking": ["tensorboard"], "tracking_params": {"tensorboard": {"uri": str(uri)}}})
    if os.geteuid() != 0:  # root writes everywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigError, match="no permission"):
            make_config({**TINY, "tracking": "tensorboard", "tracking_params": {"tensorboard": {"uri": str(locked)}}})


def test_parameters_are_checked_against_the_tracker() -> None:
    with pytest.raises(ConfigError, match=r"tracker 'wandb' parameter.*project"):
        make_config({**TINY, "tracking": "wandb", "tracking_params": {"wandb": {"projekt": "x"}}})
    with pytest.raises(ConfigError, match=r"tracking_params\.wandb\.mode.*offline, online"):
        make_config({**TINY, "tracking": "wandb", "tracking_params": {"wandb": {"mode": "loud"}}})
    with pytest.raises(ConfigError, match=r"tracking_params\.mlflow\.uri"):
        make_config({**TINY, "tracking": "mlflow", "tracking_params": {"mlflow": {"uri": 5}}})
    with pytest.raises(ConfigError, match="each tracker named once"):
        make_config({**TINY, "tracking": ["tensorboard", "tensorboard"]})
    with pytest.raises(ConfigError, match="tracking_params"):
        make_config({**TINY, "tracking_params": {"tensorbord": {}}})


def test_tracking_changes_no_run_id_and_is_not_a_grid_axis() -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    plain = make_config(TINY)
    tracked = make_config({**TINY, "tracking": ["tensorboard", "mlflow"],
                           "tracking_params": {"mlflow": {"experiment": "e"}}})
    assert grid.run_id(plain) == grid.run_id(tracked) and plain.identity() == tracked.identity()
    assert make_config({**TINY, "tracking": "tensorboard"}).tracking == ["tensorboard"]
    assert len(grid.configs({**TINY, "tracking": ["tensorboard", "mlflow"]})) == 1


def test_track_options_become_overrides() -> None:
    sets = tracking.track_overrides({"tracking": "tensorboard"}, ["mlflow=http://host:5000", "tensorboard"])
    data = apply_overrides({"tracking_params": {"mlflow": {"experiment": "e"}}}, sets)
    assert data["tracking"] == ["tensorboard", "mlflow"]
    assert data["tracking_params"] == {"mlflow": {"experiment": "e", "uri": "http://host:5000"}}
    with pytest.raises(ConfigError, match="--track"):
        tracking.track_overrides({}, ["=x"])


def test_a_tracker_named_by_its_spec_takes_its_uri_from_track() -> None:
    """``--track SPEC=URI`` with a ``module:attr`` spec: its URI is keyed by the whole spec in ``tracking_params`` (the
    key the config reads a spec tracker's parameters under), not split at the spec's dots (extension audit F6:
    ``tracking_params='extaudit' is invalid``); a URI's own ``=`` stays in the URI."""
    spec = "mylab.trackers:CSVTracker"
    sets = tracking.track_overrides({}, [f"{spec}=runs/csv", "mlflow=http://host/?a=b"])
    data = apply_overrides({}, sets)
    assert data["tracking"] == [spec, "mlflow"]
    assert data["tracking_params"] == {spec: {"uri": "runs/csv"}, "mlflow": {"uri": "http://host/?a=b"}}


# --- TensorBoard -------------------------------------------------------------------------------------------


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard reads from a log directory (all its event files), by tag: (step, value)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_event_files_hold_every_row_and_a_resume_adds_none_twice(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    cfg = make_config({**TINY, "tracking": "tensorboard"})
    run = tmp_path / grid.run_id(cfg)
    interrupted_then_resumed(cfg, run)
    rows = rows_of(run)
    got = scalars(run / "tensorboard")
    for key in ("test_accuracy", "test_loss", "agg_error", "byz_share"):
        want = [(r["round"], r[key]) for r in rows if r[key] is not None]
        assert [s for s, _ in got[key]] == [s for s, _ in want], key  # each round once, in order
        assert [v for _, v in got[key]] == pytest.approx([v for _, v in want], rel=1e-6), key
    assert [s for s, _ in got["test_accuracy"]] == list(range(9))
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2  # a file per session
    assert "aggregator" not in got  # the config's columns are parameters, not metrics


def test_a_signed_run_with_tensorboard_files_verifies(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("model_signing")
    from phalanx import signing

    private, public = signing.keygen(tmp_path / "key.pem", tmp_path / "key.pub")
    cfg = make_config({**TINY, "rounds": 2, "tracking": "tensorboard", "sign_key": str(private)})
    run = tmp_path / "run"
    train(cfg, run)
    signing.verify(run, str(public))  # the event files and tracking.json were closed before the signature


# --- MLflow ------------------------------------------------------------------------------------------------


def test_mlflow_store_holds_params_and_the_metric_history_of_one_run_across_a_resume(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    cfg = make_config({**TINY, "tracking": "mlflow", "model": "mlp", "model_params": {"hidden": [16]}})
    run = tmp_path / "out" / grid.run_id(cfg)
    interrupted_then_resumed(cfg, run)
    kept = json.loads((run / KEPT).read_text())["mlflow"]
    client = MlflowClient(tracking_uri=(tmp_path / "out" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("out")  # default: the output directory's name
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [kept["run_id"]]  # the resume continued the same MLflow run
    got = runs[0]
    assert got.info.status == "FINISHED" and got.info.run_name == run.name
    params = got.data.params
    assert params["aggregator"] == "cwtm" and params["workers"] == "5" and params["model_params.hidden"] == "[16]"
    assert params["tracking"] == '["mlflow"]'  # the whole validated config: how it is watched too (issue 39)
    rows = rows_of(run)
    for key in ("test_accuracy", "agg_error", "byz_share", "detection_auc"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(got.info.run_id, key))
        want = [(r["round"], r[key]) for r in rows if r[key] is not None]
        assert [s for s, _ in history] == [s for s, _ in want], key  # every round once
        assert [v for _, v in history] == pytest.approx([v for _, v in want]), key


def test_mlflow_marks_a_diverged_run(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store_dir = tmp_path / "store"
    cfg = make_config({**TINY, "aggregator": "mean", "f": 0, "attack": "inf", "tracking": "mlflow",
                       "tracking_params": {"mlflow": {"uri": str(store_dir), "experiment": "div"}}})
    with pytest.raises(Diverged):
        train(cfg, tmp_path / "run")
    client = MlflowClient(tracking_uri=store_dir.as_uri())
    experiment = client.get_experiment_by_name("div")
    assert experiment is not None
    (got,) = client.search_runs([experiment.experiment_id])
    assert got.info.status == "FAILED" and got.data.tags["phalanx.end"] == "diverged"
    assert [m.step for m in client.get_metric_history(got.info.run_id, "diverged")] == [1]


# --- Weights & Biases, offline -----------------------------------------------------------------------------


def wandb_records(path: Path) -> list[Any]:
    """The records of a W&B run file (``run-<id>.wandb``): a ``:W&B`` header (magic, version), then LevelDB's log
    format — 32 KiB blocks of chunks, each ``crc32c (4) | length (2, little-endian) | type (1: full, 2: first,
    3: middle, 4: last)`` — whose payloads are ``wandb_internal_pb2.Record`` messages."""
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, payloads, pending = 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            payloads.append(pending + chunk)
    return [pb.Record.FromString(p) for p in payloads]


def wandb_history(records: list[Any]) -> list[dict[str, Any]]:
    """The logged rows of a W&B run, as dicts (``_step`` the step)."""
    out = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            out.append({(i.key or ".".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
    return out


def test_wandb_offline_run_holds_config_and_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = make_config({**TINY, "tracking": "wandb", "tracking_params": {"wandb": {"project": "tiny"}}})
    out = tmp_path / "out"
    run = out / grid.run_id(cfg)
    interrupted_then_resumed(cfg, run)
    kept = json.loads((run / KEPT).read_text())["wandb"]
    files = sorted(out.glob(f"wandb/offline-run-*-{kept['id']}/run-{kept['id']}.wandb"))
    assert len(files) == 2  # one offline directory per session, one W&B id (wandb sync merges them)
    rows = {r["round"]: r for r in rows_of(run)}
    logged: dict[int, dict[str, Any]] = {}
    for f in files:
        records = wandb_records(f)
        (first,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert first.run_id == kept["id"] and first.project == "tiny" and first.display_name == run.name
        config = {u.key: json.loads(u.value_json) for u in first.config.update}
        assert config["aggregator"] == "cwtm" and config["workers"] == 5
        for h in wandb_history(records):
            assert h["_step"] not in logged  # no round twice across the two sessions
            logged[h["_step"]] = h
        exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
        assert [e.exit_code for e in exits] in ([1], [0])
    assert sorted(logged) == sorted(rows)
    for step, h in logged.items():
        assert h["test_accuracy"] == pytest.approx(rows[step]["test_accuracy"])
        if rows[step]["agg_error"] is not None:
            assert h["agg_error"] == pytest.approx(rows[step]["agg_error"])


# --- a tracker of one's own; failures ---------------------------------------------------------------------


class Recorder(Tracker):
    """A tracker of one's own (no package): remembers what it was told; ``fail_at`` makes ``log`` raise there,
    ``refuse`` makes ``start`` raise."""

    name = "recorder"
    seen: list[Recorder] = []  # noqa: RUF012 - the instances the test made, across processes' configs

    def __init__(self, uri: str | None = None, fail_at: int = -1, refuse: bool = False) -> None:
        super().__init__(uri)
        self.fail_at, self.refuse = fail_at, refuse
        self.run: TrackedRun | None = None
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.ended: list[str] = []
        Recorder.seen.append(self)

    def start(self, run: TrackedRun) -> Mapping[str, Any]:
        if self.refuse:
            raise ConnectionError("server unreachable")
        self.run = run
        return {"id": "r1"}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if step == self.fail_at:
            raise OSError("disk full")
        self.logged.append((step, dict(metrics)))

    def finish(self, end: str) -> None:
        self.ended.append(end)


SPEC = f"{__name__}:Recorder"


@pytest.fixture(autouse=True)
def _clear() -> None:
    Recorder.seen.clear()


def test_a_tracker_of_ones_own_by_spec_sees_params_rows_and_the_end(tmp_path: Path) -> None:
    cfg = make_config({**TINY, "rounds": 4, "tracking": [SPEC]})
    run = tmp_path / "run"
    rows = train(cfg, run)
    mine = Recorder.seen[-1]
    assert mine.run is not None and mine.run.name == "run" and mine.run.params["aggregator"] == "cwtm"
    assert [s for s, _ in mine.logged] == [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    assert mine.logged[-1][1]["test_accuracy"] == pytest.approx(rows[-1]["test_accuracy"])
    assert mine.ended == ["finished"]
    assert json.loads((run / KEPT).read_text())[SPEC] == {"id": "r1", "through": 4}


def test_a_tracker_is_told_the_whole_config_result_neutral_keys_included(tmp_path: Path) -> None:
    """Issue 39: a tracker receives the validated config whole — the keys the run id leaves out (``tracking``,
    ``download``, ``sign_key`` …) included; the mutant that tells it the identity (as before) drops them."""
    cfg = make_config({**TINY, "rounds": 1, "tracking": [SPEC]})
    train(cfg, tmp_path / "run")
    told = Recorder.seen[-1].run
    assert told is not None and told.params == flatten(cfg.described())
    assert told.params["tracking"] == [SPEC] and told.params["download"] is False
    assert "tracking" not in flatten(cfg.identity())  # the mutant's: what the trackers were told before


def test_a_tracker_is_never_told_a_credential_or_where_the_keys_are(tmp_path: Path) -> None:
    """The whole config, but not :data:`~phalanx.experiments.schema.UNTOLD_KEYS`: a tracker's URI may carry a
    credential and the key paths say where the key material is — a tracking server is told neither; the mutant that
    sends the config whole (``model_dump`` with nothing left out) sends the token."""
    from phalanx.experiments import schema

    secret = "https://alice:s3cr3t-token@tracking.example"
    cfg = make_config({**TINY, "rounds": 1, "tracking": [SPEC], "tracking_params": {SPEC: {"uri": secret}}})
    train(cfg, tmp_path / "run")
    told = Recorder.seen[-1].run
    assert told is not None and "s3cr3t-token" not in repr(told.params)
    assert not {k for k in told.params if k.split(".")[0] in schema.UNTOLD_KEYS}
    assert "s3cr3t-token" in repr(cfg.model_dump(mode="json"))  # the mutant's: the config whole


def test_a_tracker_failing_mid_run_is_dropped_with_a_warning_and_the_run_finishes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = make_config({**TINY, "rounds": 4, "tracking": [SPEC], "tracking_params": {SPEC: {"fail_at": 2}}})
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="phalanx.tracking"):
        train(cfg, run)
    assert store.is_finished(run) and [r["round"] for r in rows_of(run)] == [0, 1, 2, 3, 4]
    mine = Recorder.seen[-1]
    assert [s for s, _ in mine.logged] == [0, 1] and mine.ended == ["failed"]
    (record,) = [r for r in caplog.records if r.name == "phalanx.tracking"]
    assert "failed at round 2" in record.getMessage() and "disk full" in record.getMessage()
    assert "\n" not in record.getMessage()


def test_a_tracker_that_cannot_start_refuses_the_run_before_it_trains(tmp_path: Path) -> None:
    cfg = make_config({**TINY, "tracking": [SPEC], "tracking_params": {SPEC: {"refuse": True}}})
    run = tmp_path / "run"
    with pytest.raises(ConnectionError, match="unreachable"):
        train(cfg, run)
    assert not store.is_finished(run) and not (run / "checkpoint.safetensors").exists()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of the tracker's exception fails too")


class Failing(Tracker):
    """A tracker whose ``log`` from round ``at`` on and ``finish`` raise ``raise_`` (a review's trackers: an
    exception whose message cannot be printed, a client library's ``sys.exit``)."""

    name = "failing"

    def __init__(self, raise_: type[BaseException], at: int = 2) -> None:
        super().__init__(None)
        self.raise_, self.at = raise_, at
        self.logged: list[int] = []

    def start(self, run: TrackedRun) -> Mapping[str, Any]:
        return {}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if step >= self.at:
            raise self.raise_()
        self.logged.append(step)

    def finish(self, end: str) -> None:
        raise self.raise_()


@pytest.mark.parametrize(("raise_", "said"), [(Unprintable, "Unprintable, whose message cannot be printed"),
                                              (SystemExit, "SystemExit")])
def test_a_tracker_whose_error_cannot_be_printed_or_that_exits_is_dropped_and_the_run_finishes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, raise_: type[BaseException], said: str,
) -> None:
    """Before, ``_one_line`` raised on the first and ``SystemExit`` went through ``except Exception``: the run was
    lost (its directory FAILED, no metrics)."""
    from phalanx.experiments.build import from_config

    mine, run = Failing(raise_), tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="phalanx.tracking"):
        train(from_config(make_config({**TINY, "rounds": 4})), run, tracking=[mine])
    assert store.is_finished(run) and [r["round"] for r in rows_of(run)] == [0, 1, 2, 3, 4]
    assert mine.logged == [0, 1]
    (record,) = [r for r in caplog.records if r.name == "phalanx.tracking"]
    assert "failed at round 2" in record.getMessage() and f"({said})" in record.getMessage()
    caplog.clear()
    ends = Failing(raise_, at=99)  # logs every row, fails to finish
    with caplog.at_level(logging.WARNING, logger="phalanx.tracking"):
        train(from_config(make_config({**TINY, "rounds": 4})), tmp_path / "ends", tracking=[ends])
    assert store.is_finished(tmp_path / "ends") and ends.logged == [0, 1, 2, 3, 4]
    (record,) = [r for r in caplog.records if r.name == "phalanx.tracking"]
    assert "could not finish its run" in record.getMessage() and f"({said})" in record.getMessage()


@pytest.mark.parametrize("raise_", [KeyboardInterrupt, signals.StopRequested])
def test_a_tracker_interrupted_by_a_signal_still_stops_the_run(tmp_path: Path, raise_: type[BaseException]) -> None:
    """Ctrl-C or the grid's stop arriving while a tracker logs is the process being stopped, not the tracker
    failing: it ends the run, which resumes from its checkpoint."""
    from phalanx.experiments.build import from_config

    class Stopped(Failing):
        def log(self, step: int, metrics: Mapping[str, float]) -> None:
            if step >= 2:
                raise raise_(2) if raise_ is signals.StopRequested else raise_()

        def finish(self, end: str) -> None:
            pass

    run = tmp_path / "run"
    with pytest.raises(raise_):
        train(from_config(make_config({**TINY, "rounds": 4})), run, tracking=[Stopped(raise_)])
    assert not store.is_finished(run)


def test_a_tracker_that_exits_while_starting_refuses_the_run_with_one_error(tmp_path: Path) -> None:
    from phalanx.experiments.build import from_config

    class ExitsAtStart(Failing):
        def start(self, run: TrackedRun) -> Mapping[str, Any]:
            raise SystemExit(3)

    with pytest.raises(RuntimeError, match=r"^tracker .* exited while starting its run \(SystemExit: 3\)$"):
        train(from_config(make_config({**TINY, "rounds": 4})), tmp_path / "run", tracking=[ExitsAtStart(SystemExit)])


def test_trackers_for_a_run_built_from_objects(tmp_path: Path) -> None:
    from phalanx.experiments.build import from_config

    mine = Recorder()
    rows = train(from_config(make_config({**TINY, "rounds": 2})), tmp_path / "run", tracking=[mine])
    assert [s for s, _ in mine.logged] == [r["round"] for r in rows] and mine.ended == ["finished"]


# --- the command line --------------------------------------------------------------------------------------


def test_cli_track_option_and_its_errors(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    config = tmp_path / "tiny.toml"
    config.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in {**TINY, "rounds": 2}.items()))
    logs = tmp_path / "tb"
    runner = CliRunner()
    res = runner.invoke(cli.app, ["run", str(config), "--out", str(tmp_path / "out"),
                                  "--track", f"tensorboard={logs}"])
    assert res.exit_code == 0, res.output
    (run,) = [p for p in (tmp_path / "out").iterdir() if (p / "config.json").exists()]
    assert [s for s, _ in scalars(logs / run.name)["test_accuracy"]] == [0, 1, 2]
    res = runner.invoke(cli.app, ["run", str(config), "--out", str(tmp_path / "o2"), "--track", "tensorbored"])
    assert isinstance(res.exception, ConfigError)  # `phalanx` prints it as one line (cli.main)
    assert "tracking='tensorbored'" in str(res.exception) and "did you mean tensorboard?" in str(res.exception)
    assert not (tmp_path / "o2").exists()  # refused before anything was written


def test_a_quick_resume_waits_for_a_second_of_its_own_so_wandb_does_not_overwrite_the_last_session(
        tmp_path: Path) -> None:
    """W&B names a session's folder by its start second: a resume in the same second as its last session would
    overwrite that session's record. The tracker starts only once the second has no folder of that id."""
    from datetime import datetime

    from phalanx.experiments.tracking.wandb import _wait_for_a_fresh_second

    folder = tmp_path / "wandb"
    stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
    (folder / f"offline-run-{stamp}-abc").mkdir(parents=True)
    _wait_for_a_fresh_second(folder, "abc")
    assert datetime.now().strftime("%Y%m%d_%H%M%S") > stamp
    _wait_for_a_fresh_second(folder, "other")  # another run's id: nothing to wait for


def test_a_hostile_kept_file_keeps_nothing_and_never_raises(tmp_path: Path) -> None:
    """``tracking.json`` is not in the manifest: whoever can write the run directory can plant one. 200,000 nested
    brackets made a resume raise RecursionError, and a link to /dev/zero was read whole (an attacker's review); now
    a file that is not a small JSON object in a regular file keeps nothing."""
    import os

    from phalanx.experiments.tracking.callback import KEPT_BYTES, read_kept

    kept = tmp_path / KEPT
    for text in ("[" * 200_000, "[1, 2]", "{" + " " * KEPT_BYTES + "}", "not json"):
        kept.write_text(text)
        assert read_kept(tmp_path) == {}
    kept.unlink()
    os.symlink("/dev/zero", kept)
    assert read_kept(tmp_path) == {}
    kept.unlink()
    kept.write_text('{"tensorboard": {"id": "r1", "through": 4}, "x": 2}')
    assert read_kept(tmp_path) == {"tensorboard": {"id": "r1", "through": 4}}
