"""The study template (:mod:`phalanx.studies.template`): a study on it plans runs validated once, which the command
line trains as they are — each run's components are built once from ``phalanx experiment`` to the trained run; the
mutant that validates each planned run again (as a study whose builder returns configs does) builds every run's
twice. The same count for ``phalanx tension paper`` (its lr₀ chosen on tuning seeds, then the reported seeds: one
grid), whose cells share runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from phalanx.experiments.config import validate
from phalanx.studies import template
from phalanx.training.algorithms import base

ARGS = ["experiment", "privacy", "--preset", "quick", "--seeds", "2", "-j", "1", "--set", "rounds=2", "--set",
        "noises=[0]", "--set", "rules=['mean','cwtm']"]
RUNS = 2 * 2 * 1 * 2  # rules × attacked or not × noises × seeds


def _rules_built(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times a run's rule is built (validation builds it; a second validation builds it again)."""
    built: Counter[str] = Counter()
    original = base.RoundAlgorithm.make_rule.__func__  # type: ignore[attr-defined]

    def counting(*args: Any, **kwargs: Any) -> Any:
        built["rule"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(base.RoundAlgorithm, "make_rule", classmethod(counting))
    return built


def _run(tmp_path: Path, name: str, args: list[str] = ARGS) -> None:
    from typer.testing import CliRunner

    from phalanx.cli import app

    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / name)])
    assert result.exit_code == 0, result.output


def test_a_template_study_validates_each_run_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("dp_accounting")
    monkeypatch.setenv("PHALANX_BUDGET_MINUTES", "off")
    built = _rules_built(monkeypatch)
    _run(tmp_path, "once")
    assert built["rule"] == RUNS
    original = template.GridStudy.plan

    def again(self: Any, preset: Any, overrides: dict[str, Any]) -> Any:  # the mutant: each run validated again
        cells, runs = original(self, preset, overrides)  # (the module studies' way: make_config, then validate)
        return cells, [validate(r.cfg) for r in runs]

    monkeypatch.setattr(template.GridStudy, "plan", again)
    built.clear()
    _run(tmp_path, "twice")
    assert built["rule"] == 2 * RUNS


def test_cells_that_share_a_run_share_one_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The async study's always-first sync cells run what its vector-attack sync cells run: the plan validates
    that run once and gives both cells the same value; the mutant that validates cell by cell validates it twice."""
    from phalanx.experiments import config
    from phalanx.studies import asynchrony
    from phalanx.studies.base import distinct

    calls: Counter[str] = Counter()
    original = config.validate

    def counting(data: Any) -> Any:
        calls["validate"] += 1
        return original(data)

    monkeypatch.setattr(config, "validate", counting)
    study = asynchrony.Asynchrony()
    p = study.preset("quick", rules=("mean", "cwmed"), seeds=(0, 1))
    cells, runs = study.plan(p, {})
    shared = sum(c.mode == "sync" and c.attack == "always_first" for c in cells)
    assert shared > 0 and len(distinct(runs)) == len(cells) - shared
    assert calls["validate"] == len(distinct(runs)) == len({id(r) for r in runs})
    calls.clear()
    monkeypatch.setattr(template.GridStudy, "plan", lambda self, p, o: (  # the mutant: one validation per cell
        self.functions.cells(p), [self.run(p, c, o) for c in self.functions.cells(p)]))
    cells, runs = study.plan(p, {})
    assert calls["validate"] == len(cells) > len(distinct(runs))


TENSION = ["tension", "paper", "--preset", "quick", "--seeds", "2", "-j", "1", "--set", "dataset=digits", "--set",
           "workers=4", "--set", "rounds=1", "--set", "eval_every=1", "--set", "alphas=[1.0]", "--set", "lrs=[0.1]",
           "--set", "tuning_seeds=[1000]"]
TENSION_RUNS = (1 + 4) * (2 + 1)  # (the shared mean row + f = 1 of the four tables) × (2 reported + 1 tuning seed)
TENSION_CELLS = 4 * 2 * (2 + 1)  # tables × (f = 0, 1) × seeds: the four f = 0 cells of a seed share one run


def test_the_tension_study_validates_each_run_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``phalanx tension paper`` on the template: lr₀'s two stages (chosen on the tuning seeds, then the reported
    seeds at it) are one grid of runs, each distinct run validated once from the command line to the trained run —
    the four tables' shared f = 0 run too; the mutant that validates each planned run again (the study's old way:
    ``make_config``, then ``validate``) builds every rule twice."""
    from phalanx.studies import tension

    monkeypatch.setenv("PHALANX_BUDGET_MINUTES", "off")
    built = _rules_built(monkeypatch)
    _run(tmp_path, "once", TENSION)
    assert len([d for d in (tmp_path / "once" / "runs").iterdir() if d.is_dir()]) == TENSION_RUNS
    assert built["rule"] == TENSION_RUNS
    original = tension.Tension.plan

    def again(self: Any, preset: Any, overrides: dict[str, Any]) -> Any:  # the mutant: each run validated again
        cells, runs = original(self, preset, overrides)
        return cells, [validate(r.cfg) for r in runs]

    monkeypatch.setattr(tension.Tension, "plan", again)
    built.clear()
    _run(tmp_path, "twice", TENSION)
    assert built["rule"] == TENSION_RUNS + TENSION_CELLS  # every cell's run validated again, a shared one per cell


LORA_SETS = ["rounds=1", "workers=6", "byzantine=1", "f=1", "local_steps=1", "modes=['update']",
             "rules=['mean','cwtm']", "batch_size=4"]  # tests/test_lora_study.py's tiny grid
LORA = ["experiment", "lora", "--seeds", "2", "-j", "1", *(a for s in LORA_SETS for a in ("--set", s))]
LORA_RUNS = 1 * 2 * 3 * 2  # modes × rules × arms × seeds, every cell its own run


def test_the_lora_study_validates_each_run_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``phalanx experiment lora`` on the template: each run of a tiny grid (the embedded tiny BERT, one round) is
    validated once from the command line to the trained run — one rule built per run; the mutant that validates each
    planned run again (the study's old way: ``make_config`` in the module's plan, then ``validate``) builds every
    rule twice. The mutant runs on the finished runs (nothing is trained again; the plan alone builds them)."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from phalanx.studies import lora

    monkeypatch.setenv("PHALANX_BUDGET_MINUTES", "off")
    built = _rules_built(monkeypatch)
    _run(tmp_path, "once", LORA)
    assert len([d for d in (tmp_path / "once" / "runs").iterdir() if d.is_dir()]) == LORA_RUNS
    assert built["rule"] == LORA_RUNS
    original = lora.Lora.plan

    def again(self: Any, preset: Any, overrides: dict[str, Any]) -> Any:  # the mutant: each run validated again
        cells, runs = original(self, preset, overrides)
        return cells, [validate(r.cfg) for r in runs]

    monkeypatch.setattr(lora.Lora, "plan", again)
    built.clear()
    _run(tmp_path, "once", LORA)
    assert built["rule"] == 2 * LORA_RUNS
