"""``make bench`` compares ``clip`` and ``arc`` like with like (issue 37): copy against copy, in place against in place.

ByzFL's ``Clipping`` and ``ARC`` overwrite their input. Beside Phalanx's ``pre(x)`` (x left as it was) ByzFL clips a
copy it makes on the clock; beside Phalanx's ``mix_`` (``… in place``) both clip a copy made before the clock. No
timing is asserted.
"""

from __future__ import annotations

import pytest
import torch

from _scripts import load_script

load_script("benchmarks/aggregators.py", "phalanx_bench_aggregators")  # puts benchmarks/ on sys.path

import _bench_peers  # noqa: E402
import _bench_worker  # noqa: E402
from _bench_worker import CASES, make_setting, run_case  # noqa: E402


def _case(key: str) -> _bench_worker.Case:
    return next(c for c in CASES if c.key == key)


@pytest.mark.parametrize("rule", ["clip", "arc"])
def test_both_forms_are_benchmarked(rule: str) -> None:
    plain, inplace = _case(rule), _case(_bench_peers.INPLACE.format(rule))
    assert not plain.inplace and inplace.inplace and plain.spec == inplace.spec == rule


@pytest.mark.parametrize("key", ["clip", "arc", "clip in place", "arc in place"])
def test_phalanx_never_touches_the_benchmark_input(key: str) -> None:
    s = make_setting(12, 300, 2, seed=0)
    x_ref = s.x.clone()
    rec = run_case(_case(key), s, x_ref, reps=2, peers_on=False, limit=60.0)
    assert rec["status"] == "ok"
    assert "Phalanx MODIFIED ITS INPUT" not in rec["notes"] and torch.equal(s.x, x_ref)


def test_mutant_in_place_case_on_the_shared_input_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that handed ``mix_`` the shared input instead of a copy would clip it: the check above reports it."""
    monkeypatch.setattr(_bench_worker, "phalanx_input", lambda case, setting: lambda: setting.x)
    s = make_setting(12, 300, 2, seed=0)
    s.x[0] *= 100  # one long row: arc clips it
    x_ref = s.x.clone()
    rec = run_case(_case("arc in place"), s, x_ref, reps=2, peers_on=False, limit=60.0)
    assert "Phalanx MODIFIED ITS INPUT" in rec["notes"]


@pytest.mark.parametrize("rule", ["clip", "arc"])
def test_byzfl_copies_on_the_clock_only_beside_the_copying_call(rule: str) -> None:
    try:
        _bench_peers.load_byzfl()
    except Exception:
        pytest.skip("ByzFL is not installed (a dev extra: make bench installs it)")
    s = make_setting(12, 300, 2, seed=0)
    params = {"threshold": 10.0} if rule == "clip" else {}
    (plain,) = [p for p in _bench_peers.build_peers(rule, s, params) if p.column == _bench_peers.BYZFL]
    (inplace,) = [p for p in _bench_peers.build_peers(_bench_peers.INPLACE.format(rule), s, params)
                  if p.column == _bench_peers.BYZFL]
    assert plain.fresh is None and "x.clone()" in plain.timed
    assert inplace.fresh is not None and "before the clock" in inplace.timed
    x = s.x.clone()
    plain.call(x)
    assert torch.equal(x, s.x)  # the timed call copies before it clips


def test_loading_byzfl_leaves_no_stand_in_behind() -> None:
    """``load_byzfl`` stubs ByzFL's import-time-only dependencies while it imports; the stand-ins are removed again
    even when ``import byzfl`` fails (not installed), so later tests never import a stand-in."""
    import sys

    try:
        _bench_peers.load_byzfl()
    except ImportError:
        pass
    left = [m for m in sys.modules if m.split(".")[0] in _bench_peers.STUBBED
            and "__getattr__" in vars(sys.modules[m])]
    assert left == []
