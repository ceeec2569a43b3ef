"""The grid runner: per-round progress from parallel worker processes, shared configurations run once."""

from __future__ import annotations

from pathlib import Path

from phalanx.experiments import grid, runner, store
from phalanx.training.config import RunConfig, make_config


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
