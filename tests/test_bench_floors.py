"""Each aggregator row of ``make bench`` is compared with its own floor (benchmarks/_bench_floors.py, issue 37).

No timing is asserted: the tests check which floor every rule gets and that the report prints it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _scripts import load_script

load_script("benchmarks/aggregators.py", "phalanx_bench_aggregators")  # puts benchmarks/ on sys.path

import _bench_floors  # noqa: E402
from _bench_report import build_rows  # noqa: E402
from _bench_worker import CASES  # noqa: E402
from phalanx.aggregators import make, registry  # noqa: E402


def unknown(kinds: dict[str, str]) -> list[str]:
    """Registered rules and pre-aggregators whose floor kind in ``kinds`` is missing or not one of ``KINDS``."""
    return [name for name in registry.names() if kinds.get(name) not in _bench_floors.KINDS]


def test_every_registered_rule_has_a_floor_kind() -> None:
    """Every rule's floor is the one its class declares (``floor``), one of the kinds the benchmark times — read from
    the classes, so a new rule needs no entry in a table; the kinds of docs/benchmarks.md's table are anchored."""
    assert unknown(_bench_floors.FLOOR_KINDS) == []
    assert {n: _bench_floors.FLOOR_KINDS[n] for n in ("mean", "cwtm", "krum", "nnm", "cc", "geomed", "clip")} == {
        "mean": "pass", "cwtm": "pass", "krum": "gemm", "nnm": "gemm", "cc": "passes", "geomed": "passes",
        "clip": "copy"}


def test_a_rule_without_a_floor_of_its_own_gets_one_pass_and_a_wrong_one_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A new rule that declares no floor inherits one pass (labelled ``pass``, a floor no rule can beat). Mutants:
    krum declaring a kind the benchmark does not know is named by the check; a case that is no registered rule is
    labelled undeclared (one pass) rather than silently compared with one pass."""
    krum = registry.get_class("krum")
    monkeypatch.delattr(krum, "floor")  # krum declares nothing of its own: the default of every rule
    assert _bench_floors.floor_kinds()["krum"] == "pass"
    monkeypatch.setattr(krum, "floor", "gem", raising=False)
    assert unknown(_bench_floors.floor_kinds()) == ["krum"]
    assert _bench_floors.label(_bench_floors.plan("not-a-rule", {})) == "pass (undeclared)"


def test_plans_of_the_benchmarked_cases() -> None:
    plans = {case.key: _bench_floors.label(_bench_floors.plan(case.spec, {"iterations": 3})) for case in CASES}
    assert plans["cwmed"] == "pass" and plans["signguard"] == "pass"
    assert plans["krum"] == plans["bulyan"] == plans["mda"] == "gemm"
    assert plans["cc"] == "passes(3)"
    assert plans["nnm>mean"] == "gemm+pass"
    assert not any("undeclared" in p for p in plans.values())
    inplace = {case.key: _bench_floors.label(_bench_floors.plan(case.spec, {}, inplace=case.inplace))
               for case in CASES}
    assert inplace["clip"] == inplace["arc"] == "copy"  # pre(x) keeps x and writes n fresh rows
    assert inplace["clip in place"] == inplace["arc in place"] == "pass"  # mix_ rewrites the rows it was given


def test_geomed_passes_are_its_weiszfeld_iterations() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 200, generator=g)
    short, long = make("geomed", 2, max_iter=2), make("geomed", 2, max_iter=50)
    assert _bench_floors.plan("geomed", {}, lambda: short(x)) == [("passes", 2)]
    k = _bench_floors.plan("geomed", {}, lambda: long(x))[0][1]
    assert 2 < k <= 50


def test_measure_sums_the_parts() -> None:
    x = torch.randn(4, 1000)
    m = _bench_floors.measure(x, [("gemm", 1), ("passes", 3)], reps=3)
    assert m["floor"] == m["gemm"] + 3 * m["pass"]
    assert "gemm" not in _bench_floors.measure(x, [("pass", 1)], reps=3)
    c = _bench_floors.measure(x, [("copy", 1)], reps=3)
    assert c["floor"] == c["copy"] and "gemm" not in c
    assert "copy" not in m


def test_the_copy_floor_times_a_fresh_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``copy`` floor allocates its output on every call, as ``pre(x)`` does (``_rowops.new_rows``); a mutant
    that copied into one buffer made once would time no allocation and understate the floor."""
    from phalanx.aggregators import _rowops

    made: list[tuple[int, ...]] = []
    real = _rowops.new_rows

    def counting(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        made.append(shape)
        return real(shape, like)

    monkeypatch.setattr(_rowops, "new_rows", counting)
    _bench_floors.measure(torch.randn(3, 50), [("copy", 1)], reps=4)
    assert made == [(3, 50)] * 5  # the warm-up and every timed call


def test_report_prints_the_floor_kind_beside_each_ratio() -> None:
    setting = {"n": 20, "d": 10**4, "f": 4, "threads": 1}
    cases = [{"rule": rule, "status": "ok", "phalanx": {"time": 2e-3}, "peers": [], "floor": 1e-3,
              "floor_kind": kind, "floor_parts": {"pass": 1e-3, "floor": 1e-3}}
             for rule, kind in [("krum", "gemm"), ("cc", "passes(3)"), ("plugin", "pass (undeclared)")]]
    rows = build_rows([(setting, cases)])[0]
    assert [r.floor for r in rows] == ["2.0× (gemm)", "2.0× (passes(3))", "2.0× (pass (undeclared))"]
    assert rows[0].setting.endswith("pass 1 ms")  # the one-pass time stays in the setting cell


@pytest.mark.parametrize(("n", "ratio", "met"), [(50, 2.9, True), (50, 4.0, False), (1000, 4.0, True),
                                                 (1000, 6.5, False)])
def test_coordinatewise_floor_target_is_issue_37s(n: int, ratio: float, met: bool) -> None:
    """Issue 37: coordinate-wise rules ≤ 3× one pass at n ≤ 64, ≤ 6× at n = 1,000. A single constant target (the
    former 5×) would pass n = 50 at 4× and fail n = 1,000 at 4× alike: the middle rows catch it."""
    setting = {"n": n, "d": 10**4, "f": n // 5, "threads": 1}
    cases = [{"rule": "cwtm", "status": "ok", "phalanx": {"time": ratio * 1e-3}, "peers": [], "floor": 1e-3,
              "floor_kind": "pass", "floor_parts": {"pass": 1e-3, "floor": 1e-3}, "coordinatewise": True}]
    row = build_rows([(setting, cases)])[0][0]
    assert row.target_ok is met
    assert row.target == ("yes" if met else "no") + " (floor only)"


NORM_ROWS = [("cge", "pass", 2.4, True), ("cge", "pass", 2.6, False), ("clip", "copy", 2.4, True),
             ("clip in place", "pass", 3.0, False)]


@pytest.mark.parametrize(("rule", "kind", "ratio", "met"), NORM_ROWS)
def test_norm_rules_floor_target_is_issue_37s(rule: str, kind: str, ratio: float, met: bool) -> None:
    """Issue 37: norm rules within 2.5× their own floor (a fresh copy for clip called as pre(x)). Mutant: a report
    that checks only the coordinate-wise rules' floor says "yes" at 2.6× (the speed-up alone passes)."""
    setting = {"n": 50, "d": 10**4, "f": 10, "threads": 1}
    peer = {"column": "ByzPy", "variant": "", "status": "ok", "time": 10 * ratio * 1e-3, "maxabs": 0.0}
    case = {"rule": rule, "status": "ok", "phalanx": {"time": ratio * 1e-3}, "peers": [peer], "floor": 1e-3,
            "floor_kind": kind, "floor_parts": {"pass": 1e-3, "floor": 1e-3}, "norm": True}
    row = build_rows([(setting, [case])])[0][0]
    assert row.target_ok is met and row.target == ("yes" if met else "no")
    assert build_rows([(setting, [{**case, "norm": False}])])[0][0].target == "yes"  # the mutant's verdict


def test_the_norm_floor_table_prints_each_ratio_from_the_json() -> None:
    """``benchmarks/norm_floor_table.py`` (docs/benchmarks.md's norm table): a copying clip against its copy floor,
    one pass and the pass timed alone; a rule without peers has no speed-up; medians of the setting's parts."""
    table = load_script("benchmarks/norm_floor_table.py", "phalanx_norm_floor_table").table
    parts = {"pass": 2e-3, "pass_alone": 1e-3, "copy": 5e-3}
    clip = {"rule": "clip", "status": "ok", "phalanx": {"time": 10e-3}, "floor": 5e-3, "floor_kind": "copy",
            "floor_parts": {**parts, "floor": 5e-3}, "peers": [{"status": "ok", "time": 30e-3},
                                                            {"status": "error"}]}
    cge = {"rule": "cge", "status": "ok", "phalanx": {"time": 4e-3}, "floor": 4e-3 / 1.5, "floor_kind": "pass",
           "floor_parts": {"pass": 4e-3 / 1.5, "pass_alone": 1e-3, "floor": 4e-3 / 1.5}, "peers": []}
    text = table([{"setting": {"n": 10, "d": 10**6, "threads": 1}, "cases": [clip, cge]}])
    row = text.splitlines()[2]
    assert row.startswith("| 10, 10⁶ | 1 | 2.33 ms · 1 ms · 5 ms |")
    assert "| 10 ms · 3.00× · 2.0 (copy) · 5.0 (pass) · 10.0 (pass alone) |" in row
    assert "| 4 ms · 1.5 (pass) · 4.0 (pass alone) |" in row
    assert row.count("| — ") == 4  # arc and the in-place rows were not run


def test_the_norm_floor_table_refuses_a_bad_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A missing file, one that is not JSON, and JSON of another shape: a one-line usage error naming the file."""
    main = load_script("benchmarks/norm_floor_table.py", "phalanx_norm_floor_table").main
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "other.json").write_text('{"setting": 1}')
    for name in ("missing.json", "text.json", "other.json"):
        with pytest.raises(SystemExit) as stop:
            main([str(tmp_path / name)])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert ": error: json: " in err and name in err
