"""A grid says how long it should take before it starts (``phalanx.experiments.estimate``; issue 38: a tutorial
step ran for hours with no warning). Timing is injected (a fake clock): no test asserts a duration."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from phalanx import cli
from phalanx.errors import ConfigError
from phalanx.experiments import estimate, grid, make_config, train

SMALL = {"dataset": "digits", "model": "mlp", "workers": 6, "byzantine": 1, "f": 1, "aggregator": "cwtm",
         "attack": "alie", "rounds": 40, "batch_size": 8, "eval_every": 20, "seed": 3}


class _FakeRounds:
    """A fake clock that a round moves on: round i (counted over the whole probe, warm-up included) takes
    ``seconds[i]`` fake seconds (the last value repeats), so the probe's round costs are chosen, never measured."""

    def __init__(self, seconds: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
        from phalanx.training import Loop

        self.now, self.seconds, self.i = 0.0, seconds, 0
        step = Loop.step

        def timed(loop: Loop) -> object:
            self.now += self.seconds[min(self.i, len(self.seconds) - 1)]
            self.i += 1
            return step(loop)

        monkeypatch.setattr(Loop, "step", timed)

    def __call__(self) -> float:
        return self.now


def test_the_estimate_is_the_steady_round_times_the_rounds_left(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake clock: the probe's rounds cost 100 s, 50 s (one-time costs: the first call of every kernel, the first
    batches), then 10, 14 and 10 s (a loaded machine's noise). The steady round is 10 s: two runs of 40 rounds on one
    process → 800 s; on two processes → 400 s. Mutants: the probe before issue 38's fix (one warm-up round, the mean
    of the three after it: 24.7 s a round) and one that averages every round (36.8 s) both overstate it."""
    cfgs = [make_config({**SMALL, "seed": s}) for s in (0, 1)]
    todo = [(c, tmp_path / grid.run_id(c)) for c in cfgs]
    costs = [100.0, 50.0, 10.0, 14.0, 10.0]
    one = estimate.estimate(todo, jobs=1, clock=_FakeRounds(costs, monkeypatch))
    assert one is not None and one.per_round == pytest.approx(10.0) and one.seconds == pytest.approx(800.0)
    assert one.rounds == 80 and one.runs == 2 and "about 13.3 min" in one.text()
    assert "the median of 3 after 2 warm-up rounds" in one.text()
    two = estimate.estimate(todo, jobs=2, clock=_FakeRounds(costs, monkeypatch))
    assert two is not None and two.seconds == pytest.approx(400.0) and two.parallel == 2
    monkeypatch.setattr(estimate, "steady", lambda s: sum(s) / len(s))  # the mean, not the median
    for warmup, timed, per_round in ((1, 3, (50 + 10 + 14) / 3), (0, 5, (100 + 50 + 10 + 14 + 10) / 5)):
        monkeypatch.setattr(estimate, "WARMUP_ROUNDS", warmup)
        monkeypatch.setattr(estimate, "PROBE_ROUNDS", timed)
        mutant = estimate.estimate(todo, jobs=1, clock=_FakeRounds(costs, monkeypatch))
        assert mutant is not None and mutant.per_round == pytest.approx(per_round)
        assert mutant.seconds > 2.4 * one.seconds  # the overstatement issue 38 found


def test_fast_rounds_are_timed_for_a_second_and_averaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A newcomer's README job on a loaded machine at 2 threads: rounds of 0.7 ms or 80 ms as the other processes ran,
    and the three timed rounds' median said 76 ms where the runs averaged 25 ms (estimates 3–10× too long). Fast
    rounds are now timed for PROBE_SECONDS (up to the run's last round) and averaged: the fake rounds here — two
    warm-up rounds, then 80, 80 and six 0.7 ms rounds, repeating (mean 20.5 ms) — give their mean within the
    pattern's granularity. Mutant: the three-round median (PROBE_SECONDS = 0) says 80 ms, 3.9× too long."""
    cfg = make_config({**SMALL, "rounds": 120})
    todo = [(cfg, tmp_path / grid.run_id(cfg))]
    pattern = [0.08, 0.08] + [0.0007] * 6
    costs = [1.0, 1.0] + pattern * 40
    mean = sum(pattern) / len(pattern)
    est = estimate.estimate(todo, jobs=1, clock=_FakeRounds(costs, monkeypatch))
    assert est is not None and est.timed >= estimate.MEAN_FROM
    timed = costs[2:2 + est.timed]
    assert est.per_round == pytest.approx(sum(timed) / len(timed)) and abs(est.per_round - mean) < 0.2 * mean
    assert f"the mean of {est.timed} after 2 warm-up rounds" in est.text()
    monkeypatch.setattr(estimate, "PROBE_SECONDS", 0.0)
    mutant = estimate.estimate(todo, jobs=1, clock=_FakeRounds(costs, monkeypatch))
    assert mutant is not None and mutant.per_round == pytest.approx(0.08) and mutant.per_round > 3 * est.per_round


def test_each_runs_own_rule_cost_replaces_the_probed_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe times a round of the first run (its rule: cwtm here); a run with a costlier rule pays the difference
    each round. Rule costs injected (cwtm 1 s, geomed 4 s a round; the probe's round 10 s): a cwtm run and a geomed
    run of 40 rounds → 40 × 10 + 40 × (10 − 1 + 4) = 920 s. Mutant: the probed round for every run (800 s). And the
    real timing gives a rule on (m, d) rows a positive cost (an unvalidated config: 0, the probe speaks for it)."""
    from phalanx.experiments.validrun import ValidRun

    cfgs = [make_config({**SMALL, "aggregator": a}) for a in ("cwtm", "geomed")]
    todo = [(c, tmp_path / grid.run_id(c)) for c in cfgs]
    rules = {"cwtm": 1.0, "geomed": 4.0}
    monkeypatch.setattr(estimate, "rule_cost", lambda run, d, clock: rules[str(getattr(run, "cfg", run).aggregator)])
    est = estimate.estimate(todo, jobs=1, clock=_FakeRounds([10.0], monkeypatch))
    assert est is not None and est.seconds == pytest.approx(40 * 10 + 40 * (10 - 1 + 4))
    monkeypatch.setattr(estimate, "rule_cost", lambda run, d, clock: 0.0)
    mutant = estimate.estimate(todo, jobs=1, clock=_FakeRounds([10.0], monkeypatch))
    assert mutant is not None and mutant.seconds == pytest.approx(800.0)
    monkeypatch.undo()
    from phalanx.experiments.config import validate

    valid = validate(cfgs[1])
    assert isinstance(valid, ValidRun) and estimate.rule_cost(valid, 650) > 0
    assert estimate.rule_cost(cfgs[1], 650) == 0.0


def test_a_larger_model_counts_more_and_a_tiny_grid_is_not_timed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    small = make_config(SMALL)
    wide = make_config({**SMALL, "model_params": {"hidden": [400]}})  # more parameters: more work per round
    todo = [(small, tmp_path / "a"), (wide, tmp_path / "b")]
    both = estimate.estimate(todo, jobs=1, clock=_FakeRounds([1.0], monkeypatch))
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


def test_the_probe_trains_at_the_runs_thread_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: the probe timed rounds at this process's torch threads (2 on the 2-core machine) while a study's
    worker processes train at cores // jobs = 1 — on a loaded machine 10–100× slower a round. The probe's rounds run
    at the count it is given, and the process's own count is restored after. Mutant: a probe that ignores ``threads``
    (the count seen inside its rounds is the process's)."""
    from phalanx.cli.runs import _run_threads
    from phalanx.experiments.local import LocalExecutor
    from phalanx.training import Loop

    seen: list[int] = []
    step = Loop.step
    monkeypatch.setattr(Loop, "step", lambda loop: (seen.append(torch.get_num_threads()), step(loop))[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cfgs = [make_config({**SMALL, "seed": s}) for s in (0, 1)]
        todo = [(c, tmp_path / grid.run_id(c)) for c in cfgs]
        assert estimate.estimate(todo, jobs=2, threads=1) is not None
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
        seen.clear()
        assert estimate.estimate(todo, jobs=1) is not None  # None: the process's own count, as one process trains
        assert set(seen) == {2}
    finally:
        torch.set_num_threads(before)
    cores = max(1, (__import__("os").cpu_count() or 1) // 2)
    assert _run_threads(LocalExecutor(2), 2, 5) == cores and _run_threads(LocalExecutor(2, threads=3), 2, 5) == 3
    assert _run_threads(LocalExecutor(1), 1, 5) is None and _run_threads(LocalExecutor(2), 2, 1) is None


def test_the_advice_names_only_what_applies() -> None:
    """Issue 38: every line said "a smaller preset (--preset quick)", to commands already running quick and to
    `phalanx run` grids, which have no preset."""
    from phalanx.cli.runs import GRID_SMALLER, study_smaller

    assert "--preset" not in GRID_SMALLER and "--jobs" in GRID_SMALLER and "--set rounds" in GRID_SMALLER
    assert "--preset" not in study_smaller("quick", "quick") and "--seeds" in study_smaller("quick", "quick")
    assert "a smaller preset (--preset quick)" in study_smaller("paper", "quick")
    assert "--preset" not in study_smaller("default", None)
    # the convergence study's own advice: its {preset} place filled the same way (a full run is told of quick)
    from phalanx.cli.runs import smaller_preset
    from phalanx.studies.convergence import ConvergenceStudy

    own = ConvergenceStudy.smaller
    assert "(--preset quick);" in own.replace("{preset}", smaller_preset("full", "quick"))
    assert "--preset" not in own.replace("{preset}", smaller_preset("quick", "quick"))


def test_the_evaluations_left_are_counted() -> None:
    """Round 0's evaluation when a run has not started, every ``eval_every``-th round and the last
    (``Experiment.evaluates``), counted against the experiment's own rule on every (rounds, left, every)."""
    from phalanx.experiments.estimate import evaluations

    for rounds in range(1, 30):
        for every in range(1, 12):
            for left in range(0, rounds + 1):
                start = rounds - left
                made = sum((t + 1) % every == 0 or t + 1 == rounds for t in range(start, rounds)) + (start == 0)
                assert evaluations(rounds, left, every) == made, (rounds, left, every)


def test_an_evaluation_is_timed_and_counted_at_every_evaluation_left(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A newcomer's study estimates were short by up to 1.75× of CPU: the evaluations were left out. The probe
    times one (a fake 30 s here, on the fake clock) and counts it at each evaluation left: two runs of 40 rounds
    evaluating at rounds 0, 20 and 40 → 6 evaluations, 180 s on top of the rounds' 800 s. Mutant: the evaluation
    not counted (the estimate before)."""
    from phalanx.training.loop import Evaluate

    cfgs = [make_config({**SMALL, "seed": s}) for s in (0, 1)]
    todo = [(c, tmp_path / grid.run_id(c)) for c in cfgs]
    fake = _FakeRounds([100.0, 50.0, 10.0, 10.0, 10.0], monkeypatch)
    row = Evaluate.row

    def slow(loop: object, result: object) -> object:
        fake.now += 30.0
        return row(loop, result)  # type: ignore[arg-type]

    monkeypatch.setattr(Evaluate, "row", staticmethod(slow))
    est = estimate.estimate(todo, jobs=1, clock=fake)
    assert est is not None and est.evaluation == pytest.approx(30.0) and est.evaluations == 6
    assert est.seconds == pytest.approx(800.0 + 6 * 30.0) and "6 evaluations at 30 s each counted" in est.text()
    assert est.seconds - 6 * est.evaluation == pytest.approx(800.0)  # the mutant's figure: 18 % short here


def test_an_estimate_says_the_load_it_was_made_at() -> None:
    """Issue 38: an estimate made at load 1 and one made at load 8 read alike, and a newcomer could not tell why the
    same step was announced at 5 min one day and took 40 the next. The line names the 1-minute load and the cores
    it was measured at (none where the system keeps no load average). Mutant: a text without the load."""
    import os

    from phalanx.experiments.estimate import Estimate

    est = Estimate(600.0, 1.5, "cwtm / none", 400, 2, 1, load=7.25)
    assert f"at load 7.2 on {os.cpu_count()} cores: more if the machine gets busier" in est.text()
    assert "at load" not in Estimate(600.0, 1.5, "cwtm / none", 400, 2, 1, load=None).text()
    fresh = Estimate(600.0, 1.5, "cwtm / none", 400, 2, 1)
    assert fresh.load is not None and fresh.load >= 0.0  # made now: this machine's load average
