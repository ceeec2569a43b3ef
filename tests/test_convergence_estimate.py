"""`phalanx tension convergence` says how long it will take before its first result
(phalanx.studies.convergence_estimate; issue 38: its full preset took 42 min at load 4–14 with no warning, because
its in-process GD runs are no grid runs). Timing is injected (a clock that counts work): no test asserts a
duration."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from phalanx import cli
from phalanx.analysis import problems as pb
from phalanx.errors import ConfigError
from phalanx.studies import convergence as cs
from phalanx.studies import convergence_estimate as ce
from phalanx.studies import convergence_runs as cr

SMALL = dataclasses.replace(
    cs.PRESETS["quick"], workers=8, rules=("mean", "cwtm", "geomed"), fs=(1, 3), alphas=(0.5, 2.0), rounds=12,
    hidden=8, problems=("mlp",), construction_rules=("cwtm",), construction_fs=(1, 3), construction_steps=5,
    paper_rules=("cwtm", "mean"), seeds=(0, 1),
)
SETS = ["workers=8", "rules=['mean','cwtm']", "fs=[1,3]", "alphas=[0.5]", "problems=['least-squares']", "rounds=25",
        "construction_rules=['cwtm']", "construction_fs=[1]", "construction_steps=5", "paper_rules=['cwtm','mean']"]


@pytest.fixture
def rounds_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """A clock that reads the number of GD rounds evaluated so far (calls of ``Problem.worker_gradients``): a timed
    segment "takes" exactly the rounds it evaluated, so an estimate from rounds not run reads 0."""
    calls = [0]
    real = pb.Problem.worker_gradients

    def counted(self: pb.Problem, theta: torch.Tensor) -> Any:
        calls[0] += 1
        return real(self, theta)

    monkeypatch.setattr(pb.Problem, "worker_gradients", counted)
    yield calls


def _rounds_timed_are_rounds_counted(est: ce.Estimate | None, cells: list[cr.Cell]) -> bool:
    """The check: with the rounds clock, every real cell costs its ``rounds + 1`` evaluations at 1 each (the MLP has
    no curvature to build; the constructions evaluate no Problem), so the estimate is exactly the rounds it counts."""
    real = [c for c in cells if c.problem not in (cr.PAPER, cr.CONSTRUCTION)]
    return est is not None and est.rounds == len(real) * (SMALL.rounds + 1) and est.seconds == pytest.approx(est.rounds)


def test_the_estimate_is_the_timed_rounds_times_the_rounds_left(rounds_clock: list[int]) -> None:
    cells = cr.plan_cells(SMALL)
    est = ce.estimate(SMALL, cells, clock=lambda: float(rounds_clock[0]))
    assert _rounds_timed_are_rounds_counted(est, cells), est
    assert est is not None and est.settings == 4  # mean, cwtm f = 1, cwtm f = 3, geomed: each timed on its own
    assert est.checks == sum(c.problem in (cr.PAPER, cr.CONSTRUCTION) for c in cells)
    assert "about" in est.text() and f"{est.cells + est.checks} in-process GD runs" in est.text()


def test_an_estimate_from_rounds_never_run_is_caught(rounds_clock: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the probe times zero GD rounds (its timed ``descend`` evaluates nothing) — the estimate of the real
    problems is then 0, and the check above rejects it."""
    cells = cr.plan_cells(SMALL)
    real = pb.descend

    def none_timed(problem: pb.Problem, rule: Any, eta: float, steps: int) -> Any:
        return None if steps == ce.PROBE_STEPS - 1 else real(problem, rule, eta, steps)

    monkeypatch.setattr(pb, "descend", none_timed)
    est = ce.estimate(SMALL, cells, clock=lambda: float(rounds_clock[0]))
    assert est is not None and est.seconds == 0.0 and not _rounds_timed_are_rounds_counted(est, cells)


def test_the_wall_clock_estimate_counts_every_kind_of_cell() -> None:
    """A clock that ticks 1 s per reading: each timed segment takes 1 s — each rule's first construction of each
    kind (× its cells of that kind), each problem's build (× its (α, seed) groups) and each setting's PROBE_STEPS
    rounds (× its cells' rounds + 1)."""
    ticks = iter(range(10**6))
    cells = cr.plan_cells(SMALL)
    est = ce.estimate(SMALL, cells, clock=lambda: float(next(ticks)))
    real = [c for c in cells if c.problem not in (cr.PAPER, cr.CONSTRUCTION)]
    groups = len({(c.alpha, c.seed) for c in real})
    kinds = len({c.problem for c in cells if c.problem in (cr.PAPER, cr.CONSTRUCTION)})
    want = (len(cells) - len(real)) + groups + len(real) * (SMALL.rounds + 1) / ce.PROBE_STEPS
    assert kinds == 2 and est is not None and est.seconds == pytest.approx(want)
    tiny = dataclasses.replace(SMALL, problems=(), paper_rules=("mean",), construction_rules=(), construction_fs=(1,),
                               construction_steps=1)
    assert ce.estimate(tiny, cr.plan_cells(tiny)) is None  # fewer than MIN_ROUNDS rounds: not worth timing


def _state() -> tuple[torch.Tensor, str, int]:
    return torch.random.get_rng_state(), repr(np.random.get_state()), torch.get_num_threads()


def test_the_probe_changes_no_result_and_no_random_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The study's outcomes (every float of every curve, by repr: NaN included) are the same with and without the
    estimate first; the global random state and thread count come back. Mutant: a probe that draws from the global
    generator without restoring it is seen by the same state check."""
    cells = cr.plan_cells(SMALL)
    plain = repr(sorted(cr.collect_all(SMALL, cells).items(), key=repr))
    before = _state()
    assert ce.estimate(SMALL, cells) is not None
    after = _state()
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:]
    assert repr(sorted(cr.collect_all(SMALL, cells).items(), key=repr)) == plain
    build = ce.group_problem
    monkeypatch.setattr(ce, "group_problem", lambda *a: (torch.rand(1), build(*a))[1])  # draws
    monkeypatch.setattr(torch.random, "fork_rng", lambda **k: contextlib.nullcontext())  # and restores nothing
    ce.estimate(SMALL, cells)
    assert not torch.equal(after[0], torch.random.get_rng_state())


def _command(out: Path) -> list[str]:
    return ["tension", "convergence", "--seeds", "3", "--out", str(out), *(a for s in SETS for a in ("--set", s))]


def test_the_command_says_so_before_its_first_result_and_off_skips_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With a tiny budget the line (what it times, then the estimate, the budget and how to make it smaller) comes
    before the first table; the study's files are byte for byte those of the same command with ``off``, which times
    nothing (its estimate is never called). Mutant: the study without its estimate (``timing`` None, as a study whose
    work the grid estimates) prints no line, and this check sees the difference."""
    monkeypatch.setenv(cli.BUDGET_ENV, "0.0001")  # every study is over a budget of 6 ms
    res = CliRunner().invoke(cli.app, _command(tmp_path / "timed"), env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    said = res.output.index("This study should take about")
    assert res.output.index("Timing a few GD rounds of each (problem, rule, f)") < said
    assert said < res.output.index("Theorem 4.5 (Yang, Shi & Li)")  # before the first result
    assert "over the 0.0001 min budget (PHALANX_BUDGET_MINUTES)" in res.output
    advice = next(line for line in res.output.splitlines() if "To make it smaller" in line)
    assert "fewer seeds" in advice and "--preset" not in advice  # it runs quick already (issue 38)
    monkeypatch.setenv(cli.BUDGET_ENV, "off")
    monkeypatch.setattr(cs.ConvergenceStudy, "estimate", lambda *a: pytest.fail("off times nothing"))
    res = CliRunner().invoke(cli.app, _command(tmp_path / "off"), env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "Timing" not in res.output and "should take" not in res.output
    for name in ("cells.csv", "runs.csv"):
        assert (tmp_path / "timed" / name).read_bytes() == (tmp_path / "off" / name).read_bytes()
    monkeypatch.setenv(cli.BUDGET_ENV, "0.0001")
    monkeypatch.setattr(cs.ConvergenceStudy, "timing", None)  # the mutant: never estimated, never said
    res = CliRunner().invoke(cli.app, _command(tmp_path / "mutant"), env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "This study should take" not in res.output


def test_within_the_budget_it_says_its_estimate_and_no_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A "Timing …" line with nothing after it read as lost (a first-hour review): the estimate follows, within the
    budget, with no advice to make the study smaller."""
    monkeypatch.setenv(cli.BUDGET_ENV, "600")
    res = CliRunner().invoke(cli.app, _command(tmp_path), env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "Timing a few GD rounds" in said and "This study should take about" in said
    assert "within the 600 min budget." in said and "To make it smaller" not in said
    monkeypatch.setenv(cli.BUDGET_ENV, "soon")
    res = CliRunner().invoke(cli.app, _command(tmp_path / "bad"), env={"COLUMNS": "80"})
    assert isinstance(res.exception, ConfigError), res.output  # the entry point prints it as one line
    assert "PHALANX_BUDGET_MINUTES='soon' is invalid: allowed a number of minutes" in str(res.exception)
    assert not (tmp_path / "bad").exists()  # refused before anything ran
