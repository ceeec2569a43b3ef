"""Flush-to-zero arithmetic in the components that multiply rows (``_subnormals``).

On x86 a Byzantine row of subnormal float32 values made Krum 33× slower, and normal rows of ±1.5e-38 (whose
products with honest values are subnormal) 10× slower (``benchmarks/subnormal_rules.py``). Tests never time
anything: they check the mechanism — a component that sets ``subnormals_as_zero`` computes with FTZ and DAZ on
every thread of the team its products run on, and leaves the modes as it found them — and its effect on values,
each with a mutant that fails.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import torch

from phalanx.aggregators import _rowops, _subnormals, _teams, registry
from phalanx.aggregators.base import Aggregator, PreAggregator

pytestmark = pytest.mark.skipif(_rowops._normkernel is None, reason="the C kernel is not built here")

FLAGGED = ["bulyan", "caf", "cc", "clippedclustering", "fldetector", "geomed", "krum", "mda", "multikrum", "nnm"]
"""The components that set the switch: those whose time on Byzantine rows of subnormal or near-subnormal values
measured 4-33x their time on honest rows (docs/aggregators.md, "Behaviour under attack")."""

TINY32 = torch.finfo(torch.float32).tiny
BIG = torch.empty(4, _teams.GRAIN)
"""An input large enough for torch to share its loops over the team (small ones stay on the calling thread)."""


def _subnormal_product() -> float:
    """1e-20 × 1e-20 in float32 on the calling thread: 1e-40 (subnormal) under IEEE gradual underflow, 0 under FTZ."""
    a = torch.tensor([1e-20], dtype=torch.float32)
    return float(a * a)


def _subnormal_operand() -> float:
    """A subnormal float32 times 1: itself under IEEE, 0 under DAZ."""
    return float(torch.tensor([TINY32 / 4], dtype=torch.float32) * 1.0)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_modes_reach_every_thread_of_the_team_and_come_back(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        assert _subnormals.denormals_zero_threads(threads) == 0
        assert _subnormal_product() > 0.0 and _subnormal_operand() > 0.0
        with _subnormals.denormals_are_zero(BIG):
            assert _subnormals.denormals_zero_threads(threads) == threads
            assert _subnormal_product() == 0.0 and _subnormal_operand() == 0.0
            with _subnormals.denormals_are_zero(BIG):  # nested (a chain): still on inside
                assert _subnormals.denormals_zero_threads(threads) == threads
            assert _subnormals.denormals_zero_threads(threads) == threads  # the outer block keeps them
        assert _subnormals.denormals_zero_threads(threads) == 0
        with pytest.raises(RuntimeError), _subnormals.denormals_are_zero(BIG):
            raise RuntimeError("a failing rule")
        assert _subnormals.denormals_zero_threads(threads) == 0 and _subnormal_product() > 0.0
    finally:
        torch.set_num_threads(1)


def test_mutant_without_the_team_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: set the modes on the calling thread only (``torch.set_flush_denormal``, what the fallback does). The
    count of team threads above sees the second thread without them."""
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(_rowops, "_normkernel", None)
        with _subnormals.denormals_are_zero(BIG):
            monkeypatch.undo()
            assert _subnormals.denormals_zero_threads(2) == 1  # the calling thread alone
        assert _subnormals.denormals_zero_threads(2) == 0
    finally:
        torch.set_num_threads(1)


def test_a_caller_with_the_modes_keeps_them_and_the_team_gets_its_own_back() -> None:
    """The calling thread had FTZ/DAZ (``torch.set_flush_denormal(True)``: that thread only), the pool threads did
    not: after a flagged rule each has what it had. Mutant (the first version): deciding from the calling thread
    alone left the pool threads flushing after the caller turned its mode off — half of every later 2-thread
    product flushed (found by an attacker's review)."""
    torch.set_num_threads(2)
    try:
        _subnormals.denormals_zero_threads(2)  # the pool exists
        torch.set_flush_denormal(True)
        assert _subnormals.denormals_zero_threads(2) == 1
        registry.make("krum", 2)(torch.randn(11, _teams.GRAIN))
        assert _subnormals.denormals_zero_threads(2) == 1 and _subnormal_product() == 0.0
        torch.set_flush_denormal(False)
        assert _subnormals.denormals_zero_threads(2) == 0
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(1)


def test_a_small_call_opens_no_team_so_a_fork_child_still_runs(tmp_path: Any) -> None:
    """GNU libgomp cannot use a thread team inherited through ``os.fork``: the child's first parallel region hangs.
    A flagged rule on a small input must not start a team where torch itself would not (it did, found by an
    attacker's review): in a fresh interpreter, Krum on 16 columns, then a fork whose child runs a 2-thread
    product. The parent waits for the child's exit (the alarm only ends a hung child)."""
    import subprocess
    import sys

    script = (
        "import os, signal, torch\n"
        "from phalanx.aggregators import registry\n"
        "torch.set_num_threads(2)\n"
        "registry.make('krum', 1)(torch.randn(5, 16))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.alarm(120)\n"
        "    x = torch.randn(4_000_000)\n"
        "    (x * x).sum()\n"
        "    os._exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "raise SystemExit(os.waitstatus_to_exitcode(status))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=600)
    assert done.returncode == 0


@pytest.mark.parametrize(("name", "columns"), [("krum", 3000), ("geomed", 300), ("cc", 300)])
def test_the_first_flagged_call_of_a_process_leaves_no_pool_thread_with_the_modes(name: str, columns: int) -> None:
    """A thread starts with its creator's floating-point state, and the first parallel region of a process creates
    the OpenMP team. Krum on 11 x 3,000 rows opens the team in ``denormals_zero`` itself (the caller used to set
    its modes before the region, so the new threads kept them as their "previous" bits); geomed and cc on 11 x 300
    rows (the single-thread path) open it inside their own arithmetic. Either way, afterwards no thread of the team
    may flush subnormals. Each case runs in a fresh process: in this one the team exists already."""
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "from phalanx.aggregators import _subnormals, registry\n"
        "from phalanx.aggregators.base import Aggregator\n"
        "torch.set_num_threads(2)\n"
        "g = torch.Generator().manual_seed(9)\n"
        f"x = torch.randn(11, {columns}, generator=g)\n"
        f"x[:2] = torch.rand(2, {columns}, generator=g) * torch.finfo(torch.float32).tiny\n"
        f"rule = registry.get_class({name!r})(f=2)\n"
        "rule.aggregate(x) if isinstance(rule, Aggregator) else rule.mix(x)\n"
        "y = torch.randn(4_000_000)\n"
        "(y * y).sum()\n"
        "print(_subnormals.denormals_zero_threads(2))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0"]


CHURN = (
    "import os, signal, sys, threading, time, torch\n"
    "from phalanx.aggregators import _subnormals, registry\n"
    "torch.set_num_threads(2)\n"
    "stop = threading.Event()\n"
    "def churn():\n"
    "    while not stop.is_set():\n"
    "        {start}\n"
    "worker = threading.Thread(target=churn, daemon=True)\n"
    "worker.start()\n"
    "time.sleep(0.05)\n"
)
"""A process in which another Python thread keeps starting threads while flagged rules run (a review of the first
fix: it read "the block started the team" from the number of the process's threads)."""


def _run_script(script: str) -> str:
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_team_started_in_a_small_call_is_restored_while_other_threads_come_and_go() -> None:
    """geomed on 11 x 300 rows (the single-thread path) opens the team in its own arithmetic, while another Python
    thread starts and joins short-lived threads: a thread that ended meanwhile hid the team's new one from a count
    (5 of 12 fresh processes kept FTZ/DAZ on pool thread 1). Thread ids see it: 0 threads with the modes, in each
    of three fresh processes."""
    script = CHURN.format(start="t = threading.Thread(target=lambda: None); t.start(); t.join()") + (
        "g = torch.Generator().manual_seed(9)\n"
        "x = torch.randn(11, 300, generator=g)\n"
        "x[:2] = torch.rand(2, 300, generator=g) * torch.finfo(torch.float32).tiny\n"
        "registry.get_class('geomed')(f=2).aggregate(x)\n"
        "stop.set()\n"
        "print(_subnormals.denormals_zero_threads(2))\n"
    )
    assert [_run_script(script).split() for _ in range(3)] == [["0"]] * 3


def test_small_calls_beside_python_threads_starting_open_no_team_so_a_fork_child_still_runs() -> None:
    """300 Krum calls on 5 x 16 rows (no team) while another Python thread starts a thread every half millisecond:
    those threads are Python's, not a team's, so no restore opens a region — the first fix opened one, and the
    forked child then hung in its first parallel region (libgomp), as the alarm shows (exit -14)."""
    script = CHURN.format(start="threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
                                "time.sleep(0.0005)") + (
        "krum = registry.make('krum', 1)\n"
        "x = torch.randn(5, 16)\n"
        "for _ in range(300):\n"
        "    krum(x)\n"
        "stop.set()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.alarm(60)\n"
        "    y = torch.randn(4_000_000)\n"
        "    (y * y).sum()\n"
        "    os._exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
        "os._exit(0)\n"
    )
    assert _run_script(script).split() == ["0"]


def test_a_python_thread_slow_to_record_its_id_is_not_taken_for_a_team_thread() -> None:
    """A Python thread whose OS thread runs but has not recorded its id yet (``native_id`` None, as on a loaded
    machine between its start and its registration), started by another thread, is waited for, not counted as
    native: the check before gave a new thread 11 ms, and a flaky-test review saw the restore then open a team under
    load (a forked child hung). Its registration is held until 0.2 s after the check began; the check must not
    answer before it."""
    release = threading.Event()

    class SlowToRegister(threading.Thread):
        def _set_native_id(self) -> None:
            release.wait()
            super()._set_native_id()  # type: ignore[misc]

    before = _subnormals._thread_ids()
    assert before is not None
    slow = SlowToRegister(target=time.sleep, args=(0.5,), daemon=True)
    starter = threading.Thread(target=slow.start, daemon=True)  # (start() returns once the thread registered)
    starter.start()
    while slow.ident is None:  # its OS thread runs (ident is set before native_id): an event, polled
        time.sleep(0.001)
    timer = threading.Timer(0.2, release.set)
    timer.start()
    try:
        assert not _subnormals._native_threads_started(before)
        assert release.is_set()  # (the answer came after the thread recorded its id)
    finally:
        release.set()
        timer.cancel()
        starter.join(10.0)
        slow.join(10.0)


def test_other_devices_are_left_as_they_are() -> None:
    with _subnormals.denormals_are_zero(torch.empty(4, 10**5, device="meta")):
        assert _subnormals.denormals_zero_threads(1) == 0


def _component(name: str, f: int) -> Aggregator | PreAggregator:
    comp: Any = registry.get_class(name)(f=f)
    return comp


def _modes_seen_by_run(name: str, x: torch.Tensor, threads: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many team threads had the modes on while a component's own arithmetic (its ``_run``) ran."""
    cls = registry.get_class(name)
    seen: list[int] = []
    real = cls._run  # type: ignore[attr-defined]

    def recording(self: Any, y: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(_subnormals.denormals_zero_threads(threads))
        return real(self, y, *args, **kwargs)

    monkeypatch.setattr(cls, "_run", recording)
    comp = _component(name, 2)
    comp.aggregate(x) if isinstance(comp, Aggregator) else comp.mix(x)
    return seen


def _byzantine_rows(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Nine honest rows and two Byzantine rows of subnormal values, 11 × 3,000 (above :data:`_teams.GRAIN`)."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(11, 3000, generator=g).to(dtype)
    x[:2] = (torch.rand(2, 3000, generator=g) * torch.finfo(dtype).tiny).to(dtype)
    return x


@pytest.mark.parametrize("name", FLAGGED)
def test_a_flagged_component_computes_with_the_modes_on_and_restores_them(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(2)
    try:
        seen = _modes_seen_by_run(name, _byzantine_rows(), 2, monkeypatch)
        assert seen and all(s == 2 for s in seen)
        assert _subnormals.denormals_zero_threads(2) == 0
    finally:
        torch.set_num_threads(1)


def test_mutant_component_without_the_switch_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: Krum with the switch off. The check above sees its arithmetic run without the modes."""
    monkeypatch.setattr(registry.get_class("krum"), "subnormals_as_zero", False)
    assert _modes_seen_by_run("krum", _byzantine_rows(), 1, monkeypatch) == [0]


@pytest.mark.parametrize("name", sorted(set(FLAGGED) - {"fldetector"}))
def test_a_flagged_component_takes_subnormal_rows_as_zeros(name: str) -> None:
    """Under DAZ a subnormal operand reads as 0, so the contributions are those on the input with those rows set to
    0, bit for bit, and so is the output up to subnormal entries (a rule that selects an input row returns its
    bits: Krum picks one of the two near-zero rows here). Float32 and float64. FLDetector keeps a history across
    calls: its first calls aggregate with its base rule, tested through that rule."""
    for dtype in (torch.float32, torch.float64):
        x = _byzantine_rows(dtype)
        zeroed = x.clone()
        zeroed[:2] = 0.0
        a, b = _component(name, 2), _component(name, 2)
        if isinstance(a, Aggregator):
            assert isinstance(b, Aggregator)
            (out, contrib), (ref, ref_contrib) = a.aggregate(x), b.aggregate(zeroed)
        else:
            assert isinstance(b, PreAggregator)
            (out, contrib), (ref, ref_contrib) = a.mix(x), b.mix(zeroed)
        assert torch.equal(_as_zero(out), _as_zero(ref)) and torch.equal(contrib, ref_contrib), (name, dtype)


def _as_zero(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t.abs() < torch.finfo(t.dtype).tiny, torch.zeros((), dtype=t.dtype), t)


def test_the_flagged_list_is_the_registry_s() -> None:
    flagged = sorted(n for n in registry.names() if registry.get_class(n).subnormals_as_zero)
    assert flagged == sorted(FLAGGED)


def test_the_caller_s_modes_and_input_are_left_alone() -> None:
    x = _byzantine_rows()
    before = x.clone()
    registry.make("nnm>krum", 2).aggregate(x)
    assert torch.equal(x, before)
    assert _subnormal_product() > 0.0  # gradual underflow again outside the rule
