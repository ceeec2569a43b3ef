"""Honest reports: file permissions of everything a run writes, progress lines in a log, the report's per-round
panels (accuracy, aggregation error, Byzantine share) and interval bars clipped to 0 … 100 %."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from phalanx import cli, files
from phalanx.experiments import grid, plots, report, runner, store
from phalanx.studies import hbn, tension

TINY = {"dataset": "digits", "model": "logreg", "workers": 4, "byzantine": 1, "f": 1, "aggregator": "cwtm",
        "attack": "signflip", "rounds": 2, "eval_every": 1, "checkpoint_every": 1, "batch_size": 8, "seed": 0}


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- permissions ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_atomic_writes_get_the_mode_of_a_plain_open(tmp_path: Path, mask: int) -> None:
    with umask(mask):
        assert store.file_mode() == 0o666 & ~mask
        store.atomic_write_text(tmp_path / "a.txt", "x")
        with open(tmp_path / "plain.txt", "w") as fh:
            fh.write("x")
    assert _mode(tmp_path / "a.txt") == _mode(tmp_path / "plain.txt") == 0o666 & ~mask


def test_file_mode_without_proc_uses_the_umask_read_at_import(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(files, "_proc_umask", lambda: None)
    monkeypatch.setattr(files, "_UMASK_AT_IMPORT", 0o027)
    assert store.file_mode() == 0o640
    store.atomic_write_bytes(tmp_path / "b.bin", b"x")
    assert _mode(tmp_path / "b.bin") == 0o640


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_a_run_directory_and_its_report_follow_the_umask(tmp_path: Path, mask: int, file_mode: int,
                                                         dir_mode: int) -> None:
    out = tmp_path / "out"
    with umask(mask):
        (run_dir,) = runner.run_grid(grid.configs(TINY), out)
        report.write_report(out)
    names = {p.name for p in run_dir.iterdir()}
    assert {"config.json", "manifest.json", "metrics.jsonl", "checkpoint.safetensors", "metrics.parquet",
            "DONE"} <= names
    assert {"grid.json", "report.md", "accuracy.png"} <= {p.name for p in out.iterdir()}
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if p.name.endswith(".tmp")]
    assert {p.relative_to(out).as_posix(): oct(_mode(p)) for p in files} == {
        p.relative_to(out).as_posix(): oct(file_mode) for p in files}
    assert all(_mode(d) == dir_mode for d in [out, *(p for p in out.rglob("*") if p.is_dir())])


def test_keygen_keeps_the_private_key_private(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from phalanx import signing

    with umask(0o022):
        key, pub = signing.keygen(tmp_path / "key.pem", tmp_path / "pub.pem")
    assert _mode(key) == 0o600 and _mode(pub) == 0o644


# --- progress in a log ---------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _progress(runs: dict[str, int], clock: Clock) -> tuple[Any, list[str]]:
    lines: list[str] = []
    return cli._LogProgress(runs, every_s=60.0, step=0.1, clock=clock, echo=lines.append), lines


def test_log_progress_prints_every_tenth_of_the_rounds_or_every_minute() -> None:
    clock = Clock()
    log, lines = _progress({"a": 10, "b": 10}, clock)
    log.round("a", 1)  # 5 %: nothing yet
    assert lines == []
    clock.t = 20.0
    log.round("a", 2)  # 10 %
    assert len(lines) == 1 and "2/20 rounds (10 %), 0/2 runs done, ETA 0:03:00" in lines[0]
    assert re.match(r"^\[\d\d:\d\d:\d\d\] ", lines[0])
    clock.t = 85.0
    log.round("a", 3)  # 15 %, but a minute since the last line
    assert len(lines) == 2 and "3/20 rounds (15 %)" in lines[1]
    clock.t = 86.0
    log.round("a", 3)  # nothing new
    log.round("a", 4)  # 20 %
    assert len(lines) == 3 and "4/20 rounds (20 %)" in lines[2]
    log.run_ended("a", "cwtm / alie", "done")
    assert "done: cwtm / alie (a): 10/20 rounds (50 %), 1/2 runs done" in lines[3]
    log.round("b", 10)
    log.run_ended("b", "cwtm / none", "failed")
    assert lines[-1].endswith("failed: cwtm / none (b): 20/20 rounds (100 %), 2/2 runs done, in 0:01:26")
    assert not any("\r" in line for line in lines)


def test_no_eta_before_a_tenth_of_the_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: the first progress line of step 2 of docs/start.md said ETA 37:05:24 — one round's one-time costs
    extrapolated over 5,400. Until a command trained a tenth of its rounds its ETA is "—". Mutant: no threshold
    (``ETA_AFTER = 0``) extrapolates the first slow round."""
    from phalanx.cli import runs

    clock = Clock()
    log, lines = _progress({"a": 200, "b": 200}, clock)
    clock.t = 61.0  # a minute: a line, with 1 slow round trained
    log.round("a", 1)
    assert len(lines) == 1 and lines[0].endswith("1/400 rounds (0 %), 0/2 runs done, ETA —")
    assert runs._eta(61.0, 40, 400, 0) == "0:09:09" and runs._eta(61.0, 39, 400, 0) == "—"
    assert runs._eta(61.0, 60, 400, 50) == "—" and runs._eta(61.0, 85, 400, 50) == "0:09:09"  # of those left
    monkeypatch.setattr(runs, "ETA_AFTER", 0.0)
    assert runs._eta(61.0, 1, 400, 0) == "6:45:39"


def test_log_progress_counts_skipped_runs_in_one_line_and_not_in_the_rate() -> None:
    clock = Clock()
    log, lines = _progress({"a": 10, "b": 10, "c": 10}, clock)
    log.run_ended("a", "x", "skipped (finished)")
    log.run_ended("b", "y", "skipped (diverged)")
    assert lines == []  # one line, once the skipping is over
    clock.t = 30.0
    log.round("c", 6)  # resumed from its checkpoint at round 5: 1 round trained in 30 s
    assert lines[0].endswith("skipped, already ended: 1 diverged, 1 finished; 26/30 rounds (86 %), 2/3 runs done, "
                             "ETA 0:02:00")
    log.close()
    assert len(lines) == 1
    # a grid found all ended: the line comes when the grid is over
    log, lines = _progress({"a": 10, "b": 10}, clock)
    log.run_ended("a", "x", "skipped (finished)")
    log.run_ended("b", "x", "skipped (finished)")
    log.close()
    assert len(lines) == 1 and lines[0].endswith("skipped, already ended: 2 finished; 20/20 rounds (100 %), 2/2 "
                                                 "runs done, in 0:00:00")


def test_run_prints_plain_progress_lines_when_stdout_is_not_a_terminal(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    cfg = tmp_path / "grid.toml"
    cfg.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in {**TINY, "seed": [0, 1]}.items()) + "\n")
    args = ["run", str(cfg), "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    assert "\r" not in res.output
    stamped = [line for line in res.output.splitlines() if re.match(r"^\[\d\d:\d\d:\d\d\] ", line)]
    assert sum(line.split("] ", 1)[1].startswith("done: cwtm / signflip") for line in stamped) == 2
    assert any("4/4 rounds (100 %), 2/2 runs done, in " in line for line in stamped)
    again = CliRunner().invoke(cli.app, args)
    assert again.exit_code == 0, again.output
    assert "skipped, already ended: 2 finished; 4/4 rounds (100 %), 2/2 runs done" in again.output


# --- report panels and interval bars -------------------------------------------------------------------------------


def _run_dir(out: Path, name: str, aggregator: str, rows: list[dict[str, Any]]) -> None:
    d = out / name
    store.prepare_run_dir(d, {"aggregator": aggregator, "attack": "alie"}, 0, "synthetic")
    store.finish_run(d, [{"aggregator": aggregator, "attack": "alie", **r} for r in rows])


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, str]]]:
    """The panels (title, y scale) of every figure the report saves."""
    seen: list[list[tuple[str, str]]] = []
    real = plots.save_figure

    def save(fig: Any, path: Path, dpi: int = 100) -> Path:
        seen.append([(ax.get_title(), ax.get_yscale()) for ax in fig.axes])
        return real(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", save)
    return seen


def test_report_plots_aggregation_error_and_byzantine_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _capture(monkeypatch)
    _run_dir(tmp_path, "mean", "mean", [
        {"round": t, "test_accuracy": 0.5, "agg_error": 10.0 ** (3 - t), "byz_share": 0.25} for t in range(1, 5)])
    _run_dir(tmp_path, "cwtm", "cwtm", [  # a run that logged neither: its curves are left out, not zeros
        {"round": t, "test_accuracy": 0.8, "agg_error": None, "byz_share": None} for t in range(1, 5)])
    result = report.write_report(tmp_path)
    assert [p.name for p in result["plots"]] == ["accuracy.png"]
    panels = seen[0]
    assert [t.split()[0] for t, _ in panels] == ["Test", "Aggregation", "Share"]
    assert panels[1][1] == "log"  # 10² … 10⁻¹: more than two decades
    md = (tmp_path / "report.md").read_text()
    assert "![test accuracy, aggregation error, Byzantine share per round](accuracy.png)" in md


def test_report_without_those_values_has_the_accuracy_panel_only(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _capture(monkeypatch)
    _run_dir(tmp_path, "a", "cwtm", [{"round": 1, "test_accuracy": 0.7, "agg_error": None, "byz_share": None}])
    report.write_report(tmp_path)
    assert [t for t, _ in seen[0]] == ["Test accuracy per setting — attack: alie"]  # one attack: the title names it
    assert "![test accuracy per round](accuracy.png)" in (tmp_path / "report.md").read_text()


def _figure(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure the report saves, as the axes (legend texts, y limits) before it is closed."""
    seen: list[Any] = []
    real = plots.save_figure

    def save(fig: Any, path: Path, dpi: int = 100) -> Path:
        seen.append([([t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else [],
                      ax.get_ylim(), ax.get_yscale()) for ax in fig.axes])
        return real(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", save)
    return seen


def test_accuracy_plot_names_diverged_runs_and_rounding_level_errors(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38's misleading accuracy.png: a diverged mean was an unlabelled stub, and one exact rule's 4e-16 error
    stretched the log axis over sixteen decades. Now the legend says "diverged 1/1 at round 1" and "≈ 0", and the
    axis spans six decades below the largest error."""
    seen = _figure(monkeypatch)
    _run_dir(tmp_path, "mean", "mean", [{"round": 0, "test_accuracy": 0.1, "agg_error": None, "byz_share": None},
                                        {"round": 1, "test_accuracy": 0.0, "agg_error": None, "byz_share": None}])
    store.write_artifact(tmp_path / "mean", "DIVERGED", b"round 1\n")  # recorded (a planted one is refused)
    _run_dir(tmp_path, "cwtm", "cwtm", [
        {"round": t, "test_accuracy": 0.8, "agg_error": 0.3 / t, "byz_share": 0.0} for t in range(1, 5)])
    _run_dir(tmp_path, "exact", "nnm>cwtm", [
        {"round": t, "test_accuracy": 0.9, "agg_error": 4e-16, "byz_share": 0.0} for t in range(1, 5)])
    report.write_report(tmp_path)
    accuracy, errors = seen[0][0], seen[0][1]
    assert "mean — diverged 1/1 at round 1" in accuracy[0]
    assert any(label.startswith("nnm>cwtm (≈ 0: < 1e-12, rounding") for label in errors[0])
    assert errors[2] == "log" and errors[1][0] > 1e-8  # six decades below 0.3, not down to 4e-16


def test_curve_styles_tell_attacks_apart_by_line_and_marker() -> None:
    rows = [{"aggregator": a, "attack": t} for a in ("cwtm", "mean") for t in ("inf", "none")]
    styles = plots.curve_styles(rows, ["aggregator", "attack"])
    inf, none = styles["cwtm, attack=inf"], styles["cwtm, attack=none"]
    assert inf["color"] == none["color"] != styles["mean, attack=inf"]["color"]
    assert inf["linestyle"] != none["linestyle"] and inf["marker"] != none["marker"]


def test_heatmap_text_contrasts_with_its_cell() -> None:
    """White numbers on viridis' yellow were hard to read: the text colour follows the cell's luminance."""
    from matplotlib import colormaps

    viridis = colormaps["viridis"]
    assert plots.text_colour(tuple(viridis(1.0))) == "black"  # yellow
    assert plots.text_colour(tuple(viridis(0.0))) == "white"  # dark purple
    assert plots.text_colour((1.0, 1.0, 1.0, 1.0)) == "black" and plots.text_colour((0, 0, 0, 1)) == "white"


def test_clipped_errors() -> None:
    below, above = plots.clipped_errors([95.0, 3.0, 50.0], [88.0, -5.0, -math.inf], [102.0, 9.0, math.inf])
    assert below == [7.0, 3.0, 50.0] and above == [5.0, 6.0, 50.0]


def _errorbars(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """Every (bottom, top) of the error bars drawn."""
    from matplotlib.axes import Axes

    spans: list[tuple[float, float]] = []
    real = Axes.errorbar

    def errorbar(self: Axes, x: Any, y: Any, yerr: Any = None, **kw: Any) -> Any:
        below, above = yerr
        spans.extend((m - b, m + a) for m, b, a in zip(y, below, above))
        return real(self, x, y, yerr=yerr, **kw)

    monkeypatch.setattr(Axes, "errorbar", errorbar)
    return spans


def test_paper_interval_bars_stay_within_0_and_100(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spans = _errorbars(monkeypatch)
    p = tension.preset("quick", seeds=(0, 1, 2))
    cs = tension.cells(p)
    # seeds far apart, next to 100 % (T3, T4) and next to 0 % (T5, T6): the raw 95 % intervals pass both ends
    acc = {c: (0.99 if c.seed < 2 else 0.6) if c.table in ("T3", "T4") else (0.01 if c.seed < 2 else 0.4) for c in cs}
    results = tension.tabulate(cs, acc, p.tuning_seeds)
    assert any(r.estimate.high > 1 for r in results.values()) and any(r.estimate.low < 0 for r in results.values())
    tension.plot(results, p, tmp_path / "t.png")
    assert spans and all(0.0 <= lo <= hi <= 100.0 for lo, hi in spans)
    assert max(hi for _, hi in spans) == 100.0 and min(lo for lo, _ in spans) == 0.0


def test_hbn_interval_bars_stay_within_0_and_100(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spans = _errorbars(monkeypatch)
    p = hbn.preset("quick", norms=("batch", "hybrid"), rules=(("mean", 0),), alphas=(0.1,), seeds=(0, 1, 2))
    cs = hbn.cells(p)
    results = hbn.tabulate(cs, {c: (0.99 if c.seed < 2 else 0.5) for c in cs})
    hbn.plot(results, p, tmp_path / "h.png")
    assert spans and all(0.0 <= lo <= hi <= 100.0 for lo, hi in spans)
    assert max(hi for _, hi in spans) == 100.0


def test_a_report_of_an_unfinished_grid_says_what_it_leaves_out(tmp_path: Path) -> None:
    """'Runs: 4' for a 12-run grid, said as if complete, was a wrong record: the report names the runs still
    unfinished and those of the grid (grid.json) that have no rows yet."""
    from tests._interrupt import train_interrupted

    from phalanx.experiments import make_config, status, train

    base = {"dataset": "digits", "model": "mlp", "workers": 4, "f": 1, "rounds": 4, "eval_every": 2,
            "checkpoint_every": 2}
    cfgs = [make_config({**base, "aggregator": rule}) for rule in ("mean", "cwtm", "cwmed")]
    dirs = [tmp_path / grid.run_id(c) for c in cfgs]
    train(cfgs[0], dirs[0])
    train_interrupted(cfgs[1], dirs[1], 2)
    status.record_grid(tmp_path, dirs, "local")  # the third run has not started
    result = report.write_report(tmp_path)
    says = ("Incomplete: 1 of them not finished (their last evaluated round is what the table shows); 1 more run(s) "
            "of the grid have no results yet.")
    assert result["incomplete"] == says and says in (tmp_path / "report.md").read_text()
    res = CliRunner().invoke(cli.app, ["report", str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and says in res.output
    train(cfgs[1], dirs[1])
    train(cfgs[2], dirs[2])
    assert report.write_report(tmp_path)["incomplete"] is None


def test_runs_that_differ_beyond_the_setting_keys_are_kept_apart_and_said_so(tmp_path: Path) -> None:
    """Two grids written into one directory, differing in rounds and eval_every: their runs were pooled as two seeds
    of one setting, rounds not shown. Now each key they differ in is a column, the report says so, and no two runs
    of different configs are averaged."""
    from phalanx.experiments import make_config, train

    base = {"dataset": "digits", "model": "logreg", "workers": 4, "f": 1, "aggregator": "cwtm", "seed": 0,
            "batch_size": 8}
    short = make_config({**base, "rounds": 2, "eval_every": 1})
    longer = make_config({**base, "rounds": 4, "eval_every": 2})
    for c in (short, longer):
        train(c, tmp_path / grid.run_id(c))
    result = report.write_report(tmp_path)
    assert result["mixed"] == ["eval_every", "rounds"]
    assert {"eval_every", "rounds"} <= set(result["keys"])
    assert sorted((s["rounds"], s["seeds"]) for s in result["summary"]) == [(2, 1), (4, 1)]
    text = (tmp_path / "report.md").read_text()
    assert "also differ in `eval_every`, `rounds`" in text and "| eval_every | rounds |" in text


def test_one_grid_has_no_mixed_line() -> None:
    rows = [{"run": f"r{s}", "round": 1, "test_accuracy": 0.5, "aggregator": "cwtm", "rounds": 2, "seed": s}
            for s in range(3)]
    assert report.other_keys(rows) == []
    assert [s["seeds"] for s in report.summarize(rows)] == [3]
