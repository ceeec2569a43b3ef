"""Raw per-run results (``phalanx.studies.raw``): a study's ``runs.csv`` read back gives the same report, digit for
digit, and a hostile file is one typed error naming ``results`` — never a crash, never a cell it did not plan."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from phalanx.errors import ConfigError
from phalanx.studies import parallelism, raw, tension


def _tension() -> tuple[tension.Preset, list[tension.Cell], list[str], dict[tension.Cell, float]]:
    p = tension.preset("quick", seeds=(0, 1))
    cs, runs = tension.Tension().plan(p, {})
    return p, cs, raw.run_ids(runs), {c: 0.7 + 0.1 * c.lr / 3 + 0.001 * c.seed + 1e-9 * c.x for c in cs}


def test_a_report_from_the_raw_results_is_the_report_from_the_runs(tmp_path: Path) -> None:
    p, cs, ids, acc = _tension()
    path = tmp_path / "runs.csv"
    path.write_text(raw.write(cs, ids, acc, float))
    back = raw.read(path, cs, ids, float)
    assert back == acc  # repr round-trips every float exactly
    assert tension.cells_csv(tension.tabulate(cs, back, p.tuning_seeds)) == tension.cells_csv(
        tension.tabulate(cs, acc, p.tuning_seeds))
    pp = parallelism.preset("quick", nodes=(9,), graphs=("ring",), lrs={"gossip": (0.1,), "anytime": (0.01,)})
    pcs, pruns = parallelism.Parallelism().plan(pp, {})
    pids = raw.run_ids(pruns)
    finals = {c: parallelism.Final(0.1 * c.seed, 0.9, math.inf) for c in pcs}
    (tmp_path / "p.csv").write_text(raw.write(pcs, pids, finals, parallelism.Final))
    assert raw.read(tmp_path / "p.csv", pcs, pids, parallelism.Final) == finals


def _lines(tmp_path: Path) -> tuple[list[tension.Cell], list[str], list[str]]:
    _, cs, ids, acc = _tension()
    return cs, ids, raw.write(cs, ids, acc, float).splitlines()


@pytest.mark.parametrize("mutate, says", [
    (lambda ls: ls[:-1], "a row for every planned cell"),                      # a cell dropped
    (lambda ls: [*ls, ls[-1]], "one row per cell"),                             # a cell repeated
    (lambda ls: [*ls, "T9,1,0.1,0.1,0,r,0.5"], "rows of the planned cells only"),  # a cell the study never planned
    (lambda ls: [ls[0], ls[1].rsplit(",", 1)[0] + ",high", *ls[2:]], "a float in the column value"),  # not a number
    (lambda ls: [ls[0], ls[1] + ",0", *ls[2:]], "columns on every row"),
    (lambda ls: ["table,x,alpha,lr,seed,run,accuracy", *ls[1:]], "header"),
    (lambda ls: ["table,x,alpha,lr,seed,value", *(r.rsplit(",", 2)[0] + "," + r.rsplit(",", 1)[1] for r in ls[1:])],
     "header"),                                                                 # the format before run ids
    (lambda ls: [ls[0], ls[1].rsplit(",", 1)[0] + ",nan", *ls[2:]], "a number, not NaN"),      # NaN as a result
    (lambda ls: [ls[0], ls[1].replace("_s0_", "_s9_"), *ls[2:]], "run id of the planned configuration"),
    (lambda ls: ['"unterminated', *ls], "header"),
])
def test_a_hostile_raw_results_file_is_one_typed_error(tmp_path: Path, mutate: object, says: str) -> None:
    cs, ids, lines = _lines(tmp_path)
    path = tmp_path / "runs.csv"
    path.write_text("\n".join(mutate(lines)) + "\n")  # type: ignore[operator]
    with pytest.raises(ConfigError, match=says) as exc:
        raw.read(path, cs, ids, float)
    assert exc.value.parameter == "results" and str(path) in str(exc.value)


def test_a_huge_or_missing_or_binary_file_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cs, ids, lines = _lines(tmp_path)
    path = tmp_path / "runs.csv"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(raw, "MAX_BYTES", 100)
    with pytest.raises(ConfigError, match="at most 100 bytes"):
        raw.read(path, cs, ids, float)
    with pytest.raises(ConfigError, match="an existing file"):
        raw.read(tmp_path / "absent.csv", cs, ids, float)
    monkeypatch.setattr(raw, "MAX_BYTES", 1 << 20)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="UTF-8"):
        raw.read(path, cs, ids, float)
