"""FedBuff's concurrency C on the simulated clock (issue 36; phalanx.training.algorithms.clock, docs/async.md
"Concurrency"): without the key, or at C = n, a run is what it was bit for bit; with K ≤ C < n exactly C workers
are in flight, sampled uniformly from the idle ones by a stream of the seed and the version, the clock never stalls
(a property over timings, n, K, C, b, S) and its staleness obeys Little's law with C in flight; a resumed run is
the uninterrupted one; the clock state's idle workers (+∞) are checked; bad values are refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests._interrupt import whole_and_resumed
from tests.test_async import experiment, run
from typer.testing import CliRunner

from phalanx import cli
from phalanx.errors import ConfigError
from phalanx.experiments import make_config
from phalanx.training.algorithms.basgd import BASGD
from phalanx.training.algorithms.clock import TIMINGS, Clock, Speeds
from phalanx.training.algorithms.fedbuff import FedBuff
from phalanx.training.algorithms.kardam import Kardam


def steps(clock: Clock, k: int, rounds: int, speeds: str = "lognormal(1.0)", seed: int = 0) -> dict[str, Any]:
    """``rounds`` steps of FedBuff(K = k) on ``clock``: what was in flight before each step, the steps, the end."""
    algo = FedBuff(buffer_size=k)
    state = clock.start(Speeds.parse(speeds).draw(clock.n, seed))
    flights, taken = [], []
    for t in range(rounds):
        clock.check_state(state)
        flights.append((np.flatnonzero(np.isfinite(state["arrival"].numpy())), state["version"].numpy().copy()))
        step = clock.collect(state, t, lambda o, ok: algo.full(clock.n, o, ok))
        taken.append(step)
        state = clock.advance(state, t, step, 0)
    return {"flights": flights, "steps": taken, "state": state}


def test_without_the_key_or_at_c_equal_n_a_run_is_unchanged_bit_for_bit() -> None:
    """FedBuff n = 10, K = 3, two always-first sign flippers, a bound that drops: the run with
    ``concurrency = 10`` has the metric rows and the final θ of the run without the key. The test is not vacuous:
    ``concurrency = 9`` changes them."""
    def once(c: int | None) -> tuple[list[dict[str, Any]], torch.Tensor]:
        algo = FedBuff(buffer_size=3, max_staleness=1, speeds="lognormal(1.5)", byzantine_timing="always_first",
                       concurrency=c)
        loop, rows = run(experiment(algo, "cwmed", 1, byzantine=2, attack="signflip", rounds=8))
        return rows, loop.state.theta

    rows, theta = once(None)
    same_rows, same_theta = once(10)
    assert rows == same_rows and torch.equal(theta, same_theta) and rows[-1]["dropped"] > 0
    other_rows, _ = once(9)
    assert other_rows != rows


def test_exactly_c_are_in_flight_sampled_uniformly_from_the_idle_ones() -> None:
    """n = 20, C = 5, K = 2, constant speeds, 400 steps: before every step exactly C workers are in flight, every
    delivery is one of them, the ones started on version t + 1 include none that is still in flight, and every
    worker is started about as often as the others (uniform sampling from all idle ones; each count within 6
    standard deviations of its mean — a fixed seed, so a fixed outcome). The mutant that starts the lowest-indexed
    idle workers never starts worker 19."""
    def counts(clock: Clock) -> np.ndarray:
        got = steps(clock, 2, 400, "constant")
        started = np.zeros(20, dtype=np.int64)
        for t, ((live, version), step) in enumerate(zip(got["flights"], got["steps"], strict=True)):
            assert live.size == 5 and set(step.ids.tolist()) | set(step.dropped.tolist()) <= set(live.tolist())
            started[live[version[live] == t]] += 1
        return started

    started = counts(Clock(workers=20, byzantine=0, max_staleness=4, timing="honest", concurrency=5, seed=1))
    mean = started.sum() / 20
    assert started.min() > 0 and np.abs(started - mean).max() <= 6 * np.sqrt(mean)

    class Lowest(Clock):
        def sample(self, idle: np.ndarray, need: int, version: int) -> np.ndarray:
            return idle[:need]

    assert counts(Lowest(workers=20, byzantine=0, max_staleness=4, timing="honest", concurrency=5))[19] == 0


def little(got: dict[str, Any], c: int, rounds: int) -> tuple[int, int]:
    """Little's law over a run, as an exact count: every step has C workers in flight, so Σ over deliveries of
    (s + 1) plus Σ over the workers still in flight at the end of (T − version) is C · T."""
    delivered = 0
    for t, s in enumerate(got["steps"]):  # the aggregated ones, and the dropped ones (staleness t − v > S)
        delivered += int((s.staleness + 1).sum()) + int((t - got["flights"][t][1][s.dropped.numpy()] + 1).sum())
    state = got["state"]
    live = np.isfinite(state["arrival"].numpy())
    pending = int((rounds - state["version"].numpy()[live]).sum())
    return delivered + pending, c * rounds


@pytest.mark.parametrize("c", [4, 8, 20, 40])
def test_the_staleness_is_about_c_over_k_by_littles_law(c: int) -> None:
    """n = 40, K = 4, S large (no drop), 200 steps: Σ(s + 1) over the aggregated updates plus the age of those still
    in flight is exactly C · T — so the mean staleness is C/K − 1 less a boundary term under C(s_max + 1)/(K T).
    The mutant clock that ignores C (every worker in flight) fails the count."""
    clock = Clock(workers=40, byzantine=0, max_staleness=10**6, timing="honest", concurrency=c, seed=2)
    got = steps(clock, 4, 200)
    lhs, rhs = little(got, c, 200)
    assert lhs == rhs
    s = torch.cat([x.staleness for x in got["steps"]]).double()
    assert 0 <= (c / 4 - 1) - float(s.mean()) <= c * (float(s.max()) + 1) / (4 * 200)
    if c < 40:
        every = Clock(workers=40, byzantine=0, max_staleness=10**6, timing="honest", seed=2)
        assert little(steps(every, 4, 200), c, 200)[0] != rhs


@settings(max_examples=40, deadline=None)
@given(timing=st.sampled_from(TIMINGS), n=st.integers(2, 24), data=st.data())
def test_the_clock_never_stalls(timing: str, n: int, data: Any) -> None:
    """Any timing, n, K ≤ C ≤ n, b < n, S ≥ 0, lognormal or constant speeds: 60 steps never raise; before every step
    exactly C are in flight and every delivery is one of them; Little's count holds."""
    k = data.draw(st.integers(1, n), label="K")
    c = data.draw(st.integers(k, n), label="C")
    b = data.draw(st.integers(0, n - 1), label="b")
    bound = data.draw(st.integers(0, 3), label="S")
    speeds = data.draw(st.sampled_from(["constant", "lognormal(1.0)", "lognormal(3.0)"]), label="speeds")
    clock = Clock(workers=n, byzantine=b, max_staleness=bound, timing=timing, concurrency=c, seed=n + b)
    got = steps(clock, k, 60, speeds, seed=c)
    for (live, _), step in zip(got["flights"], got["steps"], strict=True):
        assert live.size == c and int(step.ids.numel()) == k
        assert set(step.ids.tolist()) | set(step.dropped.tolist()) <= set(live.tolist())
    lhs, rhs = little(got, c, 60)
    assert lhs == rhs


def test_the_leading_part_never_takes_an_idle_worker() -> None:
    """The fast path (only a leading part of the order sorted first) with idle workers: for every length of that part
    (below C, at C, the whole order) the step is the whole order's, and no idle worker is ever taken. (An idle
    worker's +∞ sorts last and the C in flight always fill the buffer — the clock's docstring — so the order's
    truncation to C is defence in depth; the mutants of the leading part are
    tests/test_async_clock.py::test_the_comparison_catches_a_clock_that_is_not_the_torch_one's.)"""
    clock = Clock(workers=30, byzantine=3, max_staleness=2, timing="always_first", concurrency=9, seed=0)
    state = clock.start(Speeds.parse("lognormal(1.0)").draw(30, 0))
    algo = FedBuff(buffer_size=4)
    for t in range(30):
        idle = set(np.flatnonzero(np.isinf(state["arrival"].numpy())).tolist())
        outs = []
        for head in (1, 4, 8, 9, 30):
            clock._head = head
            outs.append(clock.collect(state, t, lambda o, ok: algo.full(30, o, ok)))
        assert all(torch.equal(o.ids, outs[0].ids) and o.time == outs[0].time for o in outs)
        assert not idle & (set(outs[0].ids.tolist()) | set(outs[0].dropped.tolist()))
        state = clock.advance(state, t, outs[0], 0)


def test_a_checkpoint_clock_with_idle_workers_is_checked() -> None:
    """A state's arrival may be +∞ (an idle worker) — exactly n − C of them — and nothing else non-finite: NaN, −∞,
    a wrong number of idle workers, or +∞ at all without concurrency are refused in one line. The mutant check of
    before (finite arrival times only) refuses every state of a run with C < n."""
    clock = Clock(workers=6, byzantine=1, max_staleness=1, timing="honest", concurrency=4, seed=0)
    state = clock.start(Speeds.parse("constant").draw(6, 0))
    clock.check_state(state)
    assert int(torch.isposinf(state["arrival"]).sum()) == 2
    every = Clock(workers=6, byzantine=1, max_staleness=1, timing="honest")
    for bad_clock, arrival in [(clock, [1.0, float("nan"), 1.0, 1.0, float("inf"), float("inf")]),
                               (clock, [1.0, -float("inf"), 1.0, 1.0, float("inf"), float("inf")]),
                               (clock, [1.0, 1.0, 1.0, float("inf"), float("inf"), float("inf")]),
                               (clock, [1.0] * 6), (every, [1.0, 1.0, 1.0, 1.0, 1.0, float("inf")])]:
        with pytest.raises(ConfigError, match=r"^start=") as info:
            bad_clock.check_state({**state, "arrival": torch.tensor(arrival, dtype=torch.float64)})
        assert "\n" not in str(info.value)
    assert not bool(torch.isfinite(state["arrival"]).all())  # the old check's test: it would refuse this state


def test_an_interrupted_run_with_concurrency_resumes_bit_for_bit(tmp_path: Path) -> None:
    """FedBuff with C = 4 of 8 workers, stopped after step 4 and resumed: the same final checkpoint key for key
    (idle workers' +∞ included) and the same metric rows — the sample is a function of the seed and the version."""
    cfg = make_config({"dataset": "digits", "model": "logreg", "workers": 8, "byzantine": 1, "f": 0,
                       "aggregator": "mean", "attack": "signflip", "algorithm": "fedbuff",
                       "algorithm_params": {"buffer_size": 2, "max_staleness": 2, "concurrency": 4,
                                            "byzantine_timing": "at_bound"},
                       "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "lr": 0.5, "seed": 4})
    a, b, part = whole_and_resumed(cfg, tmp_path, stop=4)
    assert set(a) == set(b) and int(torch.isposinf(a["algorithm.arrival"]).sum()) == 4
    for key in a:
        assert torch.equal(a[key], b[key]), key
    rows = [json.loads(line) for line in next((tmp_path / "whole").glob("**/metrics.jsonl")).read_text().splitlines()]
    resumed = [json.loads(line) for line in next(part.glob("**/metrics.jsonl")).read_text().splitlines()]
    assert rows == resumed


BASE = {"dataset": "digits", "model": "logreg", "workers": 6, "aggregator": "mean", "f": 0}


@pytest.mark.parametrize(("params", "algorithm", "extra", "says"), [
    ({"buffer_size": 3, "concurrency": 2}, "fedbuff", {}, r"in 3\.\.6"),
    ({"buffer_size": 3, "concurrency": 7}, "fedbuff", {}, r"in 3\.\.6"),
    ({"buffer_size": 3, "concurrency": 0}, "fedbuff", {}, r">= 1"),
    ({"buffer_size": 3, "concurrency": True}, "fedbuff", {}, "integer"),
    ({"buffer_size": 3, "concurrency": 6}, "fedbuff", {"engine": "torchrun"}, r"in 3\.\.5"),
    ({"buffer_size": 2, "concurrency": 2}, "fedbuff", {"engine": "torchrun", "f": 1}, r"in 3\.\.5.*never deliver"),
    ({"buffers": 3, "concurrency": 4}, "basgd", {}, "none"),
    ({"buffers": 3, "concurrency": 6}, "basgd", {}, "none"),
    ({"buffer_size": 2, "concurrency": 4}, "aflguard", {}, "none"),
])
def test_a_bad_concurrency_is_refused_in_one_line(params: dict[str, Any], algorithm: str, extra: dict[str, Any],
                                                   says: str) -> None:
    """K ≤ C ≤ n for FedBuff (n − 1 worker ranks on processes), an integer; BASGD and the filtering algorithms take
    no concurrency (fewer workers in flight could starve a buffer or a zero step)."""
    with pytest.raises(ConfigError, match=r"^algorithm_params\.concurrency=") as info:
        make_config({**BASE, "algorithm": algorithm, "algorithm_params": params, **extra})
    assert "\n" not in str(info.value) and re.search(says, str(info.value))


def test_on_processes_a_buffer_leaves_room_for_f_silent_ranks() -> None:
    """Without concurrency every worker rank holds a credit, so the server tolerates n − 1 − K silent ones: a
    buffer K > n − 1 − f is refused on processes (f Byzantine ranks with their own keys may never deliver; the
    server that needs every rank is stopped by one: ``tests/test_async_processes.py::
    test_the_same_faults_stop_a_server_that_waits_for_every_worker``); K = n − 1 − f is taken, and the simulator
    (no silent worker) keeps K ≤ n."""
    with pytest.raises(ConfigError, match=r"^algorithm_params\.buffer_size=5 .*<= workers - 1 - f = 4") as info:
        make_config({**BASE, "f": 1, "engine": "torchrun", "algorithm": "fedbuff",
                     "algorithm_params": {"buffer_size": 5}})
    assert "\n" not in str(info.value)
    make_config({**BASE, "f": 1, "engine": "torchrun", "algorithm": "fedbuff", "algorithm_params": {"buffer_size": 4}})
    make_config({**BASE, "f": 1, "algorithm": "fedbuff", "algorithm_params": {"buffer_size": 6}})


def test_the_api_refuses_what_the_config_does() -> None:
    for make in (lambda: experiment(FedBuff(buffer_size=3, concurrency=11)),
                 lambda: experiment(FedBuff(buffer_size=3, concurrency=2)),
                 lambda: experiment(BASGD(buffers=2, concurrency=5)),
                 lambda: experiment(Kardam(buffer_size=2, concurrency=5)),
                 lambda: FedBuff(concurrency=1.5)):
        with pytest.raises(ConfigError, match=r"^algorithm_params\.concurrency="):
            make()
    experiment(FedBuff(buffer_size=3, concurrency=3))


def test_the_cli_takes_it_and_lists_it(tmp_path: Path) -> None:
    """``--set algorithm_params.concurrency=4`` runs (the run's metrics show C/K-ish staleness), and ``phalanx list
    algorithms`` names the key in FedBuff's reference."""
    runner = CliRunner()
    res = runner.invoke(cli.app, ["list", "algorithms", "--format", "csv"])
    assert res.exit_code == 0 and "algorithm_params.concurrency" in res.output
    res = runner.invoke(cli.app, ["run", "--set", "dataset=digits", "--set", "model=logreg", "--set", "workers=8",
                                  "--set", "aggregator=mean", "--set", "f=0", "--set", "byzantine=0",
                                  "--set", "attack=none", "--set", "algorithm=fedbuff",
                                  "--set", "algorithm_params={buffer_size = 2}",
                                  "--set", "algorithm_params.concurrency=4", "--set", "rounds=3", "--set", "seed=0",
                                  "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    config = json.loads(next(tmp_path.glob("out/**/config.json")).read_text())
    assert config["algorithm_params"] == {"buffer_size": 2, "concurrency": 4}
