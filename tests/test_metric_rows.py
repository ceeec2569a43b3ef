"""A metric row is one flat JSON object of scalars (phalanx.training.metric_rows): the rows an attacker writes into a
handed-over run directory neither crash the report nor cost more memory than honest rows of the same size."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import _rundirs
from _rundirs import rehash
from phalanx.errors import ConfigError
from phalanx.experiments import store
from phalanx.training import metric_rows

ROOT = Path(__file__).resolve().parent.parent
finished = _rundirs.finished

HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    # an attacker's review: each made `phalanx report` print a traceback (its round, its accuracy, its settings)
    "a round of 4,001 digits": (lambda r: {**r, "round": 10 ** 4000}, "'round' is not an integer"),
    "a round of 2^1100": (lambda r: {**r, "round": 2 ** 1100}, "'round' is not an integer"),
    "an accuracy of 4,000 digits": (lambda r: {**r, "test_accuracy": int("9" * 4000)}, "beyond ±2^63"),
    "an aggregation error that is a string": (lambda r: {**r, "agg_error": "x"}, "'agg_error' is a string"),
    "a Byzantine share that is a list": (lambda r: {**r, "byz_share": [1, 2]}, "'byz_share' is a list"),
    "a rule that is a dict": (lambda r: {**r, "aggregator": {"a": 1}}, "'aggregator' is a dict"),
    "an accuracy that is a boolean": (lambda r: {**r, "test_accuracy": True}, "is a boolean"),
    "300 columns": (lambda r: {**r, **{f"c{i}": 0 for i in range(300)}}, "more than 256"),
    "a column name of 100 characters": (lambda r: {**r, "k" * 100: 0}, "a column name of 100"),
    "a string of 5,000 characters": (lambda r: {**r, "attack": "a" * 5000}, "longer than 4096"),
    "an escape sequence in a setting": (lambda r: {**r, "attack": "\x1b[2J\x1b]0;title\x07"}, "control character"),
    "a new line in a setting": (lambda r: {**r, "aggregator": "mean\n# injected"}, "control character"),
}


def test_a_file_naming_more_than_1024_distinct_columns_is_refused(tmp_path: Path) -> None:
    """Distinct keys on every row were the costliest shape (7.5× what honest rows cost per byte)."""
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"round": i, **{f"{i}_{j}": 0.5 for j in range(255)}}) + "\n" for i in range(5)))
    with pytest.raises(ConfigError) as info:
        store.read_rows(tmp_path)
    _rundirs.one_line(info.value, "metrics.jsonl", "line 5", "more than 1024 distinct columns")


HOSTILE_REPORT = {**HOSTILE, "a Byzantine share of 1.7e308": (lambda r: {**r, "byz_share": 1.7e308}, "")}
"""Rows the reader takes (a finite number) whose report must still not fail: 1.08 × 1.7e308 overflowed the plot's
axis limit (a review of the row checks)."""


def _plant(run: Path, out: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Path:
    d = out / "run"
    shutil.copytree(run, d)
    lines = (d / "metrics.jsonl").read_text().splitlines()
    last = change(json.loads(lines[-1]))
    (d / "metrics.jsonl").write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    rehash(d)
    return d


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_row_is_one_line_naming_the_file(finished: Path, tmp_path: Path, case: str) -> None:
    change, words = HOSTILE[case]
    d = _plant(finished, tmp_path, change)
    with pytest.raises(ConfigError) as info:
        store.read_rows(d)
    _rundirs.one_line(info.value, "metrics.jsonl", words)


def test_report_of_hostile_rows_is_one_line_not_a_traceback(finished: Path, tmp_path: Path) -> None:
    """Through the command line, as the review ran it (before: OverflowError from the plots, TypeError from the
    table; the code before this check fails here)."""
    for case in ("a round of 2^1100", "a rule that is a dict", "an escape sequence in a setting",
                 "a Byzantine share of 1.7e308"):
        out = tmp_path / case.replace(" ", "_")
        _plant(finished, out, HOSTILE_REPORT[case][0])
        proc = subprocess.run([sys.executable, "-m", "phalanx.cli", "report", str(out)], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        text = proc.stdout + proc.stderr
        assert "Traceback" not in text and "\x1b" not in text, text
        if HOSTILE_REPORT[case][1]:  # refused in one line naming the file
            assert proc.returncode != 0 and "metrics.jsonl" in text, text
        else:  # read and reported
            assert proc.returncode == 0, text


def test_a_row_a_plug_in_makes_with_a_list_column_is_refused_when_made() -> None:
    """The writer holds its rows to the reader's shape: a stage's column that is a list would make a run that
    cannot be read back."""
    assert metric_rows.written({"round": 3, "test_accuracy": 0.5, "rule": "cwtm"})
    with pytest.raises(ValueError, match="'per_class' is a list"):
        metric_rows.written({"round": 3, "test_accuracy": 0.5, "per_class": [0.1, 0.9]})


def _kept_per_byte(d: Path, make: Callable[[int], dict[str, Any]], rows: int) -> tuple[float, int]:
    data = "".join(json.dumps(make(i), separators=(",", ":")) + "\n" for i in range(rows)).encode()
    d.mkdir()
    (d / "metrics.jsonl").write_bytes(data)
    tracemalloc.start()
    kept = store.read_rows(d)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(kept) == rows
    return current / len(data), len(data)


def test_kept_rows_cost_at_most_four_times_an_honest_files_cost_per_byte_plus_a_rows_overhead(
        finished: Path, tmp_path: Path) -> None:
    """The densest shapes the checks let through against honest rows of the same size (a file of 25,000 honest rows;
    the bound, fixed before measuring: 4× the honest cost per byte, plus 256 bytes for each row's own object; a
    review found short distinct strings beyond the shared ones at 5.6×, so those are capped at 64 MiB a file, and its
    shapes are here). Before the checks a row of ``[],[],…`` kept 25× its size."""
    honest = json.loads((finished / "metrics.jsonl").read_text().splitlines()[-1])
    per_byte, _ = _kept_per_byte(tmp_path / "honest", lambda i: {**honest, "round": i, "test_accuracy": i * 1e-6},
                                 25_000)
    shapes: dict[str, Callable[[int], dict[str, Any]]] = {
        "256 small integers": lambda i: {"round": i, **{f"k{j}": 0 for j in range(255)}},
        "256 floats": lambda i: {"round": i, **{f"k{j}": 0.5 + j for j in range(255)}},
        "256 floats under 1,024 distinct keys": lambda i: {"round": i, **{f"{i % 4}_{j}": 0.5 for j in range(255)}},
        "256 distinct strings": lambda i: {"round": i, **{f"k{j}": f"{i}{j}" for j in range(255)}},
        "a row of its round alone": lambda i: {"round": i},
    }
    one = [chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"\\']  # one-character keys (a review's densest)
    keys = [k for k in one + [a + b for a in one for b in one] if k != "round"][:255]
    fill = [f"filler{i:05d}" for i in range(4096)]
    shapes.update({
        "one-character keys, floats": lambda i: {"round": i, **dict.fromkeys(keys, 10.0)},
        "one-character keys, distinct short strings": lambda i: {"round": i, **{
            k: one[j % 92] + one[(j // 92 + i) % 92] + str(i) for j, k in enumerate(keys)}},
        "the shared strings filled, then two-character ones": lambda i: {"round": i, **{
            k: (fill[i * 255 + j] if i * 255 + j < 4096 else "zz") if i < 16 else one[j % 92] + one[(j // 92 + i) % 92]
            for j, k in enumerate(keys)}},
    })
    for name, make in shapes.items():
        rows = 100_000 if name == "a row of its round alone" else 2_000
        cost, size = _kept_per_byte(tmp_path / name.replace(" ", "_"), make, rows)
        assert cost * size <= 4 * per_byte * size + 256 * rows + metric_rows.Interner.UNSHARED_MAX, (name, cost,
                                                                                                       per_byte)


def test_strings_beyond_the_shared_ones_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap on what unshared strings may take (here lowered to 64 KiB): one line naming the file past it."""
    monkeypatch.setattr(metric_rows.Interner, "UNSHARED_MAX", 64 << 10)
    monkeypatch.setattr(metric_rows.Interner, "LIMIT", 16)
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"round": i, **{f"k{j}": f"{i}-{j}" for j in range(100)}}) + "\n" for i in range(50)))
    with pytest.raises(ConfigError) as info:
        store.read_rows(tmp_path)
    _rundirs.one_line(info.value, "metrics.jsonl", "MiB of strings beyond the 16 a file shares")


def test_a_config_column_too_long_for_a_row_is_refused_when_the_run_is_built() -> None:
    """A review: a 40-stage chain (over the first limit of 256 characters) trained round 0 and died with a
    traceback at the first metric row. The limit is now 4,096 and a longer column is one line before the run."""
    from phalanx.experiments import make_config, specs

    chain = lambda k: ">".join(["bucketing(s=1)"] * k + ["cwtm"])  # noqa: E731
    base = {"dataset": "digits", "model": "logreg", "workers": 5, "byzantine": 1, "f": 1, "rounds": 2}
    assert specs.read(make_config({**base, "aggregator": chain(40)})).columns["aggregator"] == chain(40)
    with pytest.raises(ConfigError) as info:
        specs.read(make_config({**base, "aggregator": chain(300)}))
    _rundirs.one_line(info.value, "aggregator", "at most 4,096 characters")
