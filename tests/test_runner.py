"""The grid runner: per-round progress from parallel worker processes, shared configurations run once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phalanx import data
from phalanx.data import DatasetNotFoundError
from phalanx.errors import ConfigError
from phalanx.experiments import grid, runner, runstate, status, store, train
from phalanx.experiments.config import RunConfig, make_config


def _cfg(**kw: object) -> RunConfig:
    return make_config({"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 30, "eval_every": 10,
                        "batch_size": 4, **kw})


def test_parallel_runs_report_rounds_before_done(tmp_path: Path) -> None:
    cfgs = [_cfg(seed=0), _cfg(seed=1), _cfg(seed=0)]  # the third is the first again: one run, one directory
    events: list[tuple[str, int | str]] = []
    dirs = runner.run_grid(
        cfgs, tmp_path, jobs=2,
        on_round=lambda c, t, total: events.append((grid.run_id(c), t)),
        on_done=lambda c, status: events.append((grid.run_id(c), status)),
    )
    assert dirs[0] == dirs[2] and len(set(dirs)) == 2
    assert all(store.is_finished(d) for d in dirs)
    for c in cfgs[:2]:
        key = grid.run_id(c)
        mine = [e for k, e in events if k == key]
        assert mine[-1] == "done" and mine.count("done") == 1
        rounds = [e for e in mine if isinstance(e, int)]
        assert rounds and rounds[-1] == c.rounds and rounds == sorted(rounds)  # progress came from the worker


def test_dataset_loaded_once_per_process() -> None:
    a = runner.dataset_for(_cfg(seed=0))
    b = runner.dataset_for(_cfg(seed=5, alpha=0.3))
    assert a is b


def test_download_key_reaches_the_loader_and_does_not_rename_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bool] = []
    real_load = data.load

    def spy(name: str, root: Any = None, download: bool = False, params: Any = None) -> data.Dataset:
        calls.append(download)
        return real_load(name, root=root, params=params)

    monkeypatch.setattr(data, "load", spy)
    plain, dl = _cfg(rounds=2, eval_every=2), _cfg(rounds=2, eval_every=2, download=True)
    assert grid.run_id(plain) == grid.run_id(dl)  # a result-neutral key: the same run
    assert "download" not in plain.identity()
    train(dl, tmp_path / "r")
    assert calls == [True]
    train(plain, tmp_path / "r")  # the same run directory accepts the config without the key
    assert store.is_finished(tmp_path / "r")
    with pytest.raises(ConfigError, match="download"):
        make_config({"download": "maybe"})


def test_phalanx_errors_survive_pickling() -> None:
    import pickle

    from phalanx.data.base import DataFormatError, DatasetNotFoundError
    from phalanx.errors import InputError

    for err in (ConfigError("f", 9, "an integer < n/2", "hint"), DatasetNotFoundError("cifar10", ["/a", "/b"], "how"),
                InputError("x", "(3,)", "(n, d)"), DataFormatError("/p", "bad magic")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__


def test_a_grid_whose_data_is_missing_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PHALANX_DATA", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(empty))
    cfgs = [_cfg(seed=s, dataset="cifar10", model="logreg", data_root=str(empty)) for s in range(6)]
    with pytest.raises(DatasetNotFoundError, match="cifar10"):
        runner.run_grid(cfgs, tmp_path / "out", jobs=2)
    assert not (tmp_path / "out").exists()


BOOM = """
from phalanx.data import DatasetNotFoundError
from phalanx.errors import ConfigError


class Boom:
    \"\"\"A rule that fails when it is called (only a run's rounds call it: the grid's checks do not).\"\"\"

    def __init__(self, f=0):
        self.f = f

    def __call__(self, x):
        raise ConfigError("boom", x.shape[0], "a rule that works")
"""


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_run_does_not_stop_the_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int) -> None:
    (tmp_path / "boomrule.py").write_text(BOOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the worker processes import the rule too
    bad = [_cfg(seed=s, aggregator="boomrule:Boom") for s in range(2)]
    good = [_cfg(seed=s) for s in range(2)]
    out = tmp_path / "out"
    with pytest.raises(runner.GridFailed, match="2 of 4 runs did not finish: 2 failed") as exc:
        runner.run_grid([bad[0], good[0], bad[1], good[1]], out, jobs=jobs)
    assert "boom=4 is invalid" in str(exc.value)  # the worker's own error, not a broken pool
    assert str(exc.value).count("boom=4 is invalid") == 1 and " and 1 more: " in str(exc.value)  # said once
    failed = exc.value.outcome.failed
    assert sorted(failed) == sorted(out / grid.run_id(c) for c in bad)
    assert all(type(e) is ConfigError for e in failed.values())
    for c in good:
        assert runstate.state(out / grid.run_id(c)).status == "done"
    for c in bad:
        st = runstate.state(out / grid.run_id(c))
        assert st.status == "failed" and st.detail.startswith("ConfigError: boom=4 is invalid")
    rows = {r.run: r.status for r in status.grid_status(out)}
    assert sorted(rows.values()) == ["done", "done", "failed", "failed"]


def test_a_grid_of_one_failing_run_raises_its_own_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "boomrule.py").write_text(BOOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="boom=") as exc:
        runner.run_grid([_cfg(aggregator="boomrule:Boom")], tmp_path / "out")
    assert type(exc.value) is ConfigError
