"""A grid skips a finished run only if it was trained on the data set the grid loads now.

A run directory is named by its configuration, not by its data: before this check, a run under the same
``data_root`` whose files had changed since was skipped and its rows reported as this grid's (resumes and
``verify`` compared the data set's fingerprint; a skip did not).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.data.base import Dataset
from phalanx.experiments import make_config, runner
from phalanx.experiments.provenance import ProvenanceError
from phalanx.experiments.runner import run_grid

BASE = {"dataset": "digits", "model": "logreg", "workers": 5, "f": 1, "aggregator": "cwtm", "rounds": 2,
        "eval_every": 2, "seed": 0}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("grid")
    run_grid([make_config(BASE)], out)
    return out


def test_the_same_data_is_skipped_and_changed_data_is_refused_in_one_line(
        finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    run_grid([make_config(BASE)], finished, on_done=lambda cfg, status: events.append(status))
    assert events == ["skipped (finished)"]
    monkeypatch.setattr(Dataset, "fingerprint", lambda self: "0" * 64)  # as if the files under data_root changed
    with pytest.raises(ProvenanceError) as info:
        run_grid([make_config(BASE)], finished)
    text = str(info.value)
    assert "\n" not in text and "data set of fingerprint" in text and "000000000000…" in text, text


def test_force_reuses_the_run_and_the_mutant_without_the_check_reports_other_data(
        finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Dataset, "fingerprint", lambda self: "0" * 64)
    monkeypatch.setenv("PHALANX_FORCE", "1")
    events: list[str] = []
    run_grid([make_config(BASE)], finished, on_done=lambda cfg, status: events.append(status))
    assert events == ["skipped (finished)"]
    monkeypatch.delenv("PHALANX_FORCE")
    monkeypatch.setattr(runner, "check_same_data", lambda run_dir, dataset: None)  # the mutant: no comparison
    run_grid([make_config(BASE)], finished)  # reused silently: the check above is what stops it
