"""examples/federated/local_steps_table.py, the tables of docs/federated.md on the price of robustness under local
steps: its 24 costs are one Holm family, a cost every seed gives alike reads "no verdict", and a raw-results file
must hold the config's runs.

The synthetic results use the real config's plan (its run ids; nothing trains): accuracies are counts over a test set
of 355, as the digits runs' are. Every cost is the null pattern (−1, 0, +1 test inputs over the seeds: p = 1) except
three cells — a strong one (29–31 inputs), a weak one (2, 3, 4 inputs: p ≈ 0.035, which its own interval calls a cost
but 23 comparisons do not) and one of 3 inputs in every seed (zero width)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from _scripts import ROOT, load_script
from phalanx.errors import ConfigError

t: Any = load_script("examples/federated/local_steps_table.py", "phalanx_local_steps_table")
CONFIG = str(ROOT / "examples/federated/local_steps.toml")
N = 355
BASE = (200, 222, 300)
"""The mean's correct test inputs per seed: chosen so that 100·(b − a)/355 for a 3-input cost is not the same float
for every seed (200 and 222 give different last bits) — the rounding to 1e-9 points must make them equal."""
STRONG = (0.1, 1, "cwtm", 3)
WEAK = (0.1, 5, "cwtm", 1)
FLAT = (1.0, 20, "cwtm", 1)
DIFF = {STRONG: (29, 30, 31), WEAK: (2, 3, 4), FLAT: (3, 3, 3)}


def _rows() -> dict[Any, tuple[str, float, float]]:
    rows = {}
    for key, run_id in t.planned(CONFIG).items():
        alpha, ls, agg, f, seed = key
        d = 0 if agg == "mean" else DIFF.get((alpha, ls, agg, f), (-1, 0, 1))[seed]
        rows[key] = (run_id, (BASE[seed] - d) / N, 0.01 * (f + seed))
    return rows


def _cell(table: str, alpha: str, k: int, rule: str, f: int) -> list[str]:
    for line in table.splitlines():
        cols = [c.strip() for c in line.strip("|").split("|")]
        if cols[:5] == [f"α = {alpha}", str(k), cols[2], rule, str(f)]:
            return cols
    raise AssertionError(f"no row for α = {alpha}, K = {k}, {rule}, f = {f}")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ls") / "runs.csv"
    path.write_text(t.write_csv(_rows()))
    return path


def test_the_table_is_read_from_a_results_file_with_holm_over_its_24_costs(
        results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert t.main([CONFIG, "--results", str(results)]) == 0
    table = capsys.readouterr().out
    body = [line for line in table.splitlines() if line.startswith("| α")]
    assert len(body) == 24
    strong = _cell(table, "0.1", 1, "cwtm", 3)
    assert strong[5].startswith("+8.5 [") and strong[7] == "costs accuracy"
    weak = _cell(table, "0.1", 5, "cwtm", 1)
    assert weak[5] == "+0.8 [+0.1, +1.5]"  # the per-comparison interval excludes 0 …
    assert float(weak[6]) > 0.05 and weak[7] == "no difference shown"  # … Holm over 23 does not
    assert "over the 23 costs" in table  # the zero-width cell is not counted in the family


def test_without_holm_the_weak_cell_would_be_called_a_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: no correction. The weak cell then reads as a cost — the check above is what tells them apart."""
    monkeypatch.setattr(t, "holm", lambda estimates: list(estimates))
    table = t.table(_rows())
    assert _cell(table, "0.1", 5, "cwtm", 1)[7] == "costs accuracy"


def test_a_cost_every_seed_gives_alike_reads_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    flat = _cell(t.table(_rows()), "1", 20, "cwtm", 1)
    assert flat[5] == "+0.8 [+0.8, +0.8]"
    assert flat[6] == "—" and flat[7].startswith("no verdict (zero width")
    # the mutant: costs not rounded — float rounding alone gives the seeds an interval, and a verdict
    assert len({100 * (b / N - (b - 3) / N) for b in BASE}) > 1  # the seeds' unrounded costs differ in last bits
    monkeypatch.setattr(t, "cost", lambda base, acc: 100 * (base - acc))
    assert not _cell(t.table(_rows()), "1", 20, "cwtm", 1)[7].startswith("no verdict")


def test_a_results_file_must_hold_the_configs_runs(results: Path, tmp_path: Path) -> None:
    rows = list(csv.reader(io.StringIO(results.read_text())))
    other = tmp_path / "other.csv"
    rows[1][0] = rows[1][0][:-1] + ("0" if rows[1][0][-1] != "0" else "1")  # another config's run id
    other.write_text("\n".join(",".join(r) for r in rows) + "\n")
    with pytest.raises(ConfigError, match="another config's run"):
        t.main([CONFIG, "--results", str(other)])
    short = tmp_path / "short.csv"
    short.write_text("\n".join(",".join(r) for r in rows[:-1]) + "\n")
    with pytest.raises(ConfigError, match="exactly the config's 108 runs"):
        t.main([CONFIG, "--results", str(short)])
    bad = tmp_path / "bad.csv"
    rows = list(csv.reader(io.StringIO(results.read_text())))
    rows[1][6] = "1.5"
    bad.write_text("\n".join(",".join(r) for r in rows) + "\n")
    with pytest.raises(ConfigError, match=r"accuracy in \[0, 1\]"):
        t.main([CONFIG, "--results", str(bad)])


def test_the_committed_results_are_the_configs_runs() -> None:
    """docs/results/local_steps*_runs.csv: each holds its config's 108 runs (the docs check rebuilds the tables)."""
    for name in ("local_steps", "local_steps_fixed"):
        rows = t.read_csv(ROOT / f"docs/results/{name}_runs.csv")
        t.check_plan(rows, t.planned(str(ROOT / f"examples/federated/{name}.toml")), name)
