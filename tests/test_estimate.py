"""A grid says how long it should take before it starts (``phalanx.experiments.estimate``; issue 38: a tutorial
step ran for hours with no warning). Timing is injected (a fake clock): no test asserts a duration."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from phalanx import cli
from phalanx.errors import ConfigError
from phalanx.experiments import estimate, grid, make_config, train

SMALL = {"dataset": "digits", "model": "mlp", "workers": 6, "byzantine": 1, "f": 1, "aggregator": "cwtm",
         "attack": "alie", "rounds": 40, "batch_size": 8, "eval_every": 20, "seed": 3}


def _clock(step: float) -> Iterator[float]:
    t = 0.0
    while True:
        yield t
        t += step


def test_the_estimate_is_the_timed_round_times_the_rounds_left(tmp_path: Path) -> None:
    """A fake clock: 30 s between the two readings around 3 timed rounds, so 10 s a round; two runs of 40 rounds
    on one process → 800 s; on two processes → 400 s."""
    cfgs = [make_config({**SMALL, "seed": s}) for s in (0, 1)]
    todo = [(c, tmp_path / grid.run_id(c)) for c in cfgs]
    ticks = _clock(30.0)
    one = estimate.estimate(todo, jobs=1, clock=lambda: next(ticks))
    assert one is not None and one.per_round == pytest.approx(10.0) and one.seconds == pytest.approx(800.0)
    assert one.rounds == 80 and one.runs == 2 and "about 13.3 min" in one.text()
    ticks = _clock(30.0)
    two = estimate.estimate(todo, jobs=2, clock=lambda: next(ticks))
    assert two is not None and two.seconds == pytest.approx(400.0) and two.parallel == 2


def test_a_larger_model_counts_more_and_a_tiny_grid_is_not_timed(tmp_path: Path) -> None:
    small = make_config(SMALL)
    wide = make_config({**SMALL, "model_params": {"hidden": [400]}})  # more parameters: more work per round
    todo = [(small, tmp_path / "a"), (wide, tmp_path / "b")]
    ticks = _clock(3.0)
    both = estimate.estimate(todo, jobs=1, clock=lambda: next(ticks))
    assert both is not None and both.seconds > 1.0 * 80  # the wide run counts for more than its 40 rounds at 1 s
    assert estimate.estimate([(make_config({**SMALL, "rounds": 5}), tmp_path / "c")], jobs=1) is None


def test_timing_a_run_first_leaves_its_results_bit_for_bit(tmp_path: Path) -> None:
    """The probe builds from a copy of the config and restores the global random state: the run trained after it
    is the run trained without it."""
    cfg = make_config({**SMALL, "rounds": 6, "eval_every": 3, "checkpoint_every": 3})
    plain = train(cfg, tmp_path / "plain")
    state = torch.random.get_rng_state()
    estimate.time_rounds(cfg, rounds=2)
    assert torch.equal(state, torch.random.get_rng_state())
    after = train(cfg, tmp_path / "after")
    assert plain == after


def test_the_command_says_so_before_it_starts_and_refuses_a_bad_budget(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.BUDGET_ENV, "0.0001")  # every grid is over a budget of 6 ms
    res = CliRunner().invoke(cli.app, ["run", "--set", "rounds=25", "--set", "workers=6", "--set", "byzantine=1",
                                       "--set", "f=1", "--set", "aggregator=cwtm", "--set", "attack=none",
                                       "--set", "seed=0", "--set", "eval_every=25", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    said = res.output.index("This grid should take about")
    assert res.output.index("Timing a few rounds of the first run") < said  # the probe is announced before it runs
    assert "over the 0.0001 min budget (PHALANX_BUDGET_MINUTES)" in res.output and "fewer rounds" in res.output
    assert said < res.output.index("Final test accuracy")  # before the results, not after
    monkeypatch.setenv(cli.BUDGET_ENV, "soon")
    with pytest.raises(ConfigError, match="PHALANX_BUDGET_MINUTES='soon' is invalid: allowed a number of minutes"):
        cli._announce([(make_config(SMALL), tmp_path / "x")], jobs=1, err=False)


def test_a_study_command_says_so_before_it_starts_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`phalanx tension plan` (the tutorial's step 3) trains through the same grid path as `run`, so a plan over the
    budget is announced before its first run, not only a `run` grid. Mutant: the study path without the announcement
    (``_announce`` a no-op) prints the table with no line before it, and this check sees the difference."""
    config = tmp_path / "task.toml"
    config.write_text("\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in SMALL.items() if k != "attack") + "\n")
    command = ["tension", "plan", str(config), "-k", "1", "--rules", "cwtm", "--f", "1", "--attacks", "alie",
               "-j", "1", "--set", "rounds=20"]
    monkeypatch.setenv(cli.BUDGET_ENV, "0.0001")  # every plan is over a budget of 6 ms
    res = CliRunner().invoke(cli.app, [*command, "--out", str(tmp_path / "plan")])
    assert res.exit_code == 0, res.output
    assert "This grid should take about" in res.output and "over the 0.0001 min budget" in res.output
    assert res.output.index("This grid should take about") < res.output.index("Price of robustness on your task")
    monkeypatch.setattr("phalanx.cli.runs._announce", lambda *a, **k: None)  # the mutant: no announcement
    res = CliRunner().invoke(cli.app, [*command, "--out", str(tmp_path / "mutant")])
    assert res.exit_code == 0, res.output
    assert "This grid should take about" not in res.output
