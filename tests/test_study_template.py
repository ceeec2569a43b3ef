"""The study template (:mod:`phalanx.studies.template`): a study on it plans runs validated once, which the command
line trains as they are — each run's components are built once from ``phalanx experiment`` to the trained run; the
mutant that validates each planned run again (as a study whose builder returns configs does) builds every run's
twice."""

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


def _run(tmp_path: Path, name: str) -> None:
    from typer.testing import CliRunner

    from phalanx.cli import app

    result = CliRunner().invoke(app, [*ARGS, "--out", str(tmp_path / name)])
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
