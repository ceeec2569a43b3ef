"""``benchmarks/gpu.py``'s aggregator and population workloads (issue 37, item 7), on the CPU and on the emulated CUDA
device of ``tests/test_device.py``.

No time is asserted: the tests check that every robust rule of the registry gets a row with its ratio to the
device's bandwidth floor, that the printed ratio is the one the raw measurements give (and that a wrong floor is
caught: two mutants), and that the million-client run reports its two ratios.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from _scripts import load_script

bench = load_script("benchmarks/gpu.py", "phalanx_bench_gpu_workloads")  # puts benchmarks/ on sys.path

import _gpu_population  # noqa: E402
import _gpu_rules  # noqa: E402
from test_device import fake_cuda  # noqa: E402


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_rules_and_population_run_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--quick --device cpu --workload rules population``: a row with a finite ``× floor`` for every robust rule
    and every pre-aggregator chain, the check of the printed ratios passes, and both populations with their ratios."""
    out = tmp_path / "gpu.json"
    assert bench.main(["--device", "cpu", "--quick", "--workload", "rules", "population", "--rounds", "2",
                       "--json", str(out)]) == 0
    text = capsys.readouterr().out
    got = json.loads(out.read_text())
    (res,) = got["rules"]
    specs = _gpu_rules.specs()
    assert "mean" not in specs and {"krum", "cwtm", "bulyan", "nnm>cwtm", "clip>cwtm", "arc>cwtm"} <= set(specs)
    assert [r["spec"] for r in res["rules"]] == specs and all(r["status"] == "ok" for r in res["rules"])
    rows = {_cells(line)[0]: _cells(line) for line in text.splitlines() if line.startswith("| ")}
    for spec in specs:
        ratio = rows[spec][5]
        assert ratio.endswith("×") and math.isfinite(float(ratio[:-1])) and float(ratio[:-1]) > 0, rows[spec]
    assert (res["n"], res["d"], res["f"]) == _gpu_rules.QUICK and res["bandwidth_Bps"] > 0
    assert "CHECK FAILED" not in text
    (pop,) = got["population"]
    assert [r["population"] for r in pop["records"]] == list(_gpu_population.QUICK.sizes)
    assert "| cpu | 100,000 ÷ 100 |" in text and "peak RSS" in text


def test_the_full_sizes_are_the_issues() -> None:
    """n = 64, d = 2²⁰, f = 12; 10³ and 10⁶ clients, 100 a round; every workload in the default run."""
    assert _gpu_rules.FULL == (64, 2**20, 12)
    assert (_gpu_population.FULL.sizes, _gpu_population.FULL.per_round) == ((1000, 1_000_000), 100)
    assert set(bench.parse_args([]).workload) == {"resnet20", "mlp1000", "rules", "population"}


def _wrong_bytes(n: int, d: int, bytes_per_s: float) -> float:
    return n * d / bytes_per_s  # the input's coordinates, not its bytes


def _no_bandwidth(copy_bytes: int, copy_s: float) -> float:
    return 0.0


@pytest.mark.parametrize("mutant", [None, ("floor_s", _wrong_bytes), ("bandwidth", _no_bandwidth)],
                         ids=["right", "floor-in-coordinates", "bandwidth-0"])
def test_the_check_catches_a_wrong_floor(mutant: tuple[str, Any] | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The printed ``× floor`` is recomputed from the raw copy and rule times: a floor against n·d bytes instead of
    n·d·4, or a bandwidth of 0, is reported; the right one is not."""
    if mutant is not None:
        monkeypatch.setattr(_gpu_rules, *mutant)
    res = _gpu_rules.run("cpu", True, 1, 60.0, only=["cwtm", "krum"], say=lambda m: None)
    problems = _gpu_rules.check([res], _gpu_rules.table([res]))
    if mutant is None:
        assert problems == []
    else:
        assert len(problems) == 2 and all("× floor printed" in p for p in problems)


def test_a_failing_rule_is_a_row_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule that raises, and one past the per-call limit, are reported as such; the next rule still runs."""
    import _bench_worker

    real = _bench_worker.build_phalanx

    def build(case: Any, s: Any) -> Any:
        obj, params, note = real(case, s)
        if case.spec == "krum":
            def boom(x: torch.Tensor, **kw: Any) -> torch.Tensor:
                raise RuntimeError("CUDA out of memory")
            return boom, params, note
        if case.spec == "cwmed":
            def stuck(x: torch.Tensor, **kw: Any) -> torch.Tensor:
                while True:
                    pass
            return stuck, params, note
        return obj, params, note

    monkeypatch.setattr(_gpu_rules, "build_phalanx", build)
    res = _gpu_rules.run("cpu", True, 1, 0.5, only=["krum", "cwmed", "cwtm"], say=lambda m: None)
    assert [r["status"] for r in res["rules"]] == ["RuntimeError: CUDA out of memory", "timeout", "ok"]
    lines = _gpu_rules.table([res])
    assert "| krum | cpu | RuntimeError: CUDA out of memory |" in lines[2] and _gpu_rules.check([res], lines) == []


def test_rules_on_the_emulated_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules workload with ``--device cuda`` on the emulated device: input, copy and floors on the device, every
    rule runs there without mixing devices, and the table names the GPU."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    with fake_cuda() as mode:
        res = _gpu_rules.run("cuda", True, 1, 60.0, say=lambda m: None)
    assert mode.problems() == {}
    assert (res["device"], res["gpu"]) == ("cuda:0", "Emulated GPU")
    assert {r["spec"]: r["status"] for r in res["rules"]} == dict.fromkeys(_gpu_rules.specs(), "ok")
    lines = _gpu_rules.table([res])
    assert "| cwtm | cuda:0 (Emulated GPU) |" in "\n".join(lines) and _gpu_rules.check([res], lines) == []


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status (Linux)")
def test_a_population_child_reports_its_own_peak_not_its_parents() -> None:
    """scale.py's child reads VmHWM, not ``ru_maxrss``: Linux carries the latter across fork and exec, so a child of a
    large parent (gpu.py after its rules workload) reported the parent's peak. Mutant: ``ru_maxrss`` read in the same
    child, which the bound rejects."""
    big = torch.ones(2**26)  # 256 MiB resident in this (the parent) process before the child starts
    code = ("import resource, scale; print(scale.peak_rss(), "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    env = {**os.environ, "PYTHONPATH": str(Path(_gpu_rules.__file__).parent)}
    own, inherited = map(int, subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                             check=True, timeout=120).stdout.split())
    assert own < 2**27 <= big.numel() * 4 <= inherited  # the child holds no torch: far below 128 MiB
