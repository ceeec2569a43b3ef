"""The code that trained a run (``phalanx.code_digest``, recorded in its manifest) and the line a grid says when it
reuses or goes on with runs that other code started: ``__version__`` does not change with every commit that
changes results, so a grid could mix code versions silently (a review)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import phalanx
from phalanx.experiments import make_config, runner
from phalanx.experiments.runner import run_grid

BASE = {"dataset": "digits", "model": "logreg", "workers": 5, "f": 1, "aggregator": "cwtm", "rounds": 2,
        "eval_every": 2}


def test_the_digest_covers_every_source_file_and_changes_with_one(tmp_path: Path) -> None:
    digest = phalanx.code_digest()
    assert len(digest) == 64 and digest == phalanx.code_digest()
    # the same function over a copy of the package with one byte changed gives another digest
    import shutil

    copy = tmp_path / "phalanx"
    shutil.copytree(Path(phalanx.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    namespace: dict[str, object] = {"__file__": str(copy / "__init__.py"), "__name__": "copy"}
    exec(compile((copy / "__init__.py").read_text(), "copy", "exec"), namespace)
    same = namespace["code_digest"]()  # type: ignore[operator]
    assert same == digest
    for target in (copy / "aggregators" / "mean.py", copy / "configs" / "default.toml"):  # source, and data
        saved = target.read_bytes()
        target.write_bytes(saved + b"\n")
        namespace["code_digest"].cache_clear()  # type: ignore[attr-defined]
        assert namespace["code_digest"]() != digest  # type: ignore[operator]
        target.write_bytes(saved)


def test_a_grid_says_when_it_reuses_runs_other_code_trained(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    configs = [make_config({**BASE, "seed": s}) for s in (0, 1)]
    dirs = run_grid(configs, tmp_path / "out")
    for d in dirs:
        assert json.loads((d / "manifest.json").read_text())["code"] == phalanx.code_digest()
    capsys.readouterr()
    run_grid(configs, tmp_path / "out")  # the same code: reused without a word
    assert "other code" not in capsys.readouterr().err
    monkeypatch.setattr(runner, "code_digest", lambda: "0" * 64)  # as if the installation had changed
    run_grid(configs, tmp_path / "out")
    err = capsys.readouterr().err
    assert "2 of the 2 run(s)" in err and "started by other code" in err and err.count("\n") == 1


def test_an_unreadable_manifest_is_unknown_code_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line informs; it never stops a grid. A review found one run directory with a damaged manifest stopping
    every run of the grid here, before anything trained (the run's own resume reports the damage, or --force passes
    it)."""
    damaged = tmp_path / "run_a"
    damaged.mkdir()
    (damaged / "manifest.json").write_text("garbage")
    assert runner.say_other_code([damaged]) == 1
    assert "1 of the 1 run(s)" in capsys.readouterr().err
