"""Worker availability from a FedScale client behaviour trace on the simulated clock (issue 36;
phalanx.training.algorithms.availability, docs/async.md "Availability"): the format is read as FedScale's
``ClientMetadata.is_active`` reads it, a hostile file is refused in one line naming it, ``"always"`` is the clock of
before bit for bit, no delivered update was computed while its worker was offline (the clock that ignores the trace is
caught), the clock never stalls over random valid traces, a resumed run is the uninterrupted one, and the CLI takes
the key."""

from __future__ import annotations

import json
import math
import os
import pickle
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
from phalanx.training.algorithms import availability as av
from phalanx.training.algorithms.clock import TIMINGS, Clock, Speeds
from phalanx.training.algorithms.fedbuff import FedBuff


def fedscale_is_active(entry: dict[str, Any], trace_seconds: float) -> bool:
    """FedScale's rule read directly off a trace entry (``ClientMetadata.is_active`` without its walking index):
    active iff active[j] <= cur_time % finish_time <= inactive[j] for some j."""
    norm = trace_seconds % entry["finish_time"]
    return any(a <= norm <= e for a, e in zip(entry["active"], entry["inactive"]))


def write(tmp_path: Path, obj: Any, raw: bytes | None = None) -> str:
    path = tmp_path / "behave.pkl"
    path.write_bytes(pickle.dumps(obj) if raw is None else raw)
    return f"fedscale:{path}"


# --- the format ------------------------------------------------------------------------------------------------------


def test_the_sample_is_the_scripts_output_and_reads_as_fedscale_reads_it() -> None:
    """The shipped sample is ``pickle.dumps(sample_table(), protocol=4)``
    (scripts/make_fedscale_availability_sample.py), in FedScale's format; its windows say online exactly where
    FedScale's rule does, on a grid of 4001 instants over two periods (the wrap at ``finish_time`` included) for
    every client — away from the window edges by more than the float64 rounding of converting time units (at an edge
    itself either answer is a rounding's worth away)."""
    table = av.sample_table()
    assert av.SAMPLE.read_bytes() == pickle.dumps(table, protocol=4)
    ids = sorted(table)
    assert all(set(table[c]) == {"duration", "inactive", "finish_time", "active", "model"} for c in ids)
    got = av.parse("fedscale:sample", 60.0, len(ids))
    assert got is not None
    for w, cid in zip(got.windows, ids, strict=True):
        entry = table[cid]
        edges = np.array([*entry["active"], *entry["inactive"], entry["finish_time"]], dtype=np.float64)
        for u in np.linspace(0.0, 2 * entry["finish_time"], 4001):
            if np.abs(edges - u % entry["finish_time"]).min() < 1e-6 or u % entry["finish_time"] < 1e-6:
                continue
            assert w.available(u / 60.0) == fedscale_is_active(entry, u), (cid, u)


def test_fedscales_own_example_and_the_wrap() -> None:
    """FedScale's test_client_metadata.py example (active [1, 3, 6, 9], inactive [1, 4, 7, 10], finish 10): offline at
    2, 8, 10, 15, online at 6 and 9 — and a window ending at finish_time joins the next period's window from 0."""
    w = av.Windows.of([1, 3, 6, 9], [1, 4, 7, 10], 10, 1.0)
    assert [w.available(t) for t in (2, 6, 8, 9, 10, 15)] == [False, True, False, True, False, False]
    assert not fedscale_is_active({"active": [1, 3, 6, 9], "inactive": [1, 4, 7, 10], "finish_time": 10}, 10)
    wrap = av.Windows.of([0, 8], [2, 10], 10, 1.0)
    assert wrap.longest() == 4 and wrap.schedule(9.0, 3.0) == (9.0, 0) and wrap.schedule(3.0, 3.0) == (8.0, 0)
    assert av.Windows.of([0], [10], 10, 1.0).always


HOSTILE: list[tuple[str, Any, bytes | None, str]] = [
    ("globals", None, b"cos\nsystem\n(S'echo pwned'\ntR.", "not a pickle of plain data"),
    ("truncated", None, pickle.dumps({1: {"active": [0]}})[:-3], "not a pickle of plain data"),
    ("not a dict", [1, 2, 3], None, "non-empty dict"),
    ("empty", {}, None, "non-empty dict"),
    ("mixed ids", {1: {}, "a": {}}, None, "mixed types"),
    ("entry", {1: 5}, None, "not a dict"),
    ("finish 0", {1: {"active": [0], "inactive": [1], "finish_time": 0}}, None, "finish_time"),
    ("finish nan", {1: {"active": [0], "inactive": [1], "finish_time": float("nan")}}, None, "finish_time"),
    ("finish bool", {1: {"active": [0], "inactive": [1], "finish_time": True}}, None, "finish_time"),
    ("lengths", {1: {"active": [0, 5], "inactive": [1], "finish_time": 9}}, None, "same length"),
    ("negative", {1: {"active": [-1], "inactive": [1], "finish_time": 9}}, None, ">= 0"),
    ("inf", {1: {"active": [0], "inactive": [float("inf")], "finish_time": 9}}, None, ">= 0"),
    ("string time", {1: {"active": ["0"], "inactive": [1], "finish_time": 9}}, None, ">= 0"),
    ("unsorted", {1: {"active": [5, 1], "inactive": [6, 2], "finish_time": 9}}, None, "alternate"),
    ("not alternating", {1: {"active": [0, 2], "inactive": [3, 4], "finish_time": 9}}, None, "alternate"),
]


@pytest.mark.parametrize(("case", "obj", "raw", "says"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_trace_is_refused_in_one_line_naming_the_file(tmp_path: Path, case: str, obj: Any,
                                                                raw: bytes | None, says: str) -> None:
    """Each defect: one line, naming the parameter and the file, saying what is wrong — never a traceback, and the
    pickle that names a global (os.system) never runs it."""
    spec = write(tmp_path, obj, raw)
    av._load.cache_clear()
    with pytest.raises(ConfigError, match=r"^algorithm_params\.availability=") as info:
        av.parse(spec, 60.0, 1)
    assert "\n" not in str(info.value) and str(tmp_path / "behave.pkl") in str(info.value) and says in str(info.value)


def test_a_missing_or_too_large_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        av.parse(f"fedscale:{tmp_path / 'none.pkl'}", 60.0, 1)
    spec = write(tmp_path, {1: {"active": [0], "inactive": [5], "finish_time": 9}})
    monkeypatch.setattr(av, "MAX_BYTES", 8)
    av._load.cache_clear()
    with pytest.raises(ConfigError, match="more than the 8 "):
        av.parse(spec, 60.0, 1)


BASE = {"dataset": "digits", "model": "logreg", "workers": 6, "aggregator": "mean", "f": 0, "algorithm": "fedbuff"}


@pytest.mark.parametrize(("params", "key", "says"), [
    ({"availability": "sometimes"}, "availability", "'always'"),
    ({"availability": "fedscale:"}, "availability", "'always'"),
    ({"availability": 3}, "availability", "'always'"),
    ({"availability_scale": 0}, "availability_scale", "> 0"),
    ({"availability_scale": float("inf")}, "availability_scale", "> 0"),
    ({"availability_scale": True}, "availability_scale", "> 0"),
])
def test_a_bad_value_is_refused_in_one_line(params: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(ConfigError, match=rf"^algorithm_params\.{key}=") as info:
        make_config({**BASE, "algorithm_params": {"buffer_size": 2, **params}})
    assert "\n" not in str(info.value) and says in str(info.value)


def test_a_trace_that_cannot_run_is_refused_before_the_run(tmp_path: Path) -> None:
    """Fewer clients than workers; no worker ever online; a worker whose every window is shorter than its update
    (the clock would stall: every attempt lost) — each refused in one line, the last by the run's check before it
    trains. On processes the key is refused."""
    few = write(tmp_path, {c: {"active": [0], "inactive": [50], "finish_time": 100} for c in range(3)})
    with pytest.raises(ConfigError, match=r"at least as many clients as workers \(6\); it has 3"):
        make_config({**BASE, "algorithm_params": {"buffer_size": 2, "availability": few}})
    av._load.cache_clear()
    never = write(tmp_path, {c: {"active": [], "inactive": [], "finish_time": 100} for c in range(6)})
    with pytest.raises(ConfigError, match="none of its first 6 clients is ever available"):
        make_config({**BASE, "algorithm_params": {"buffer_size": 2, "availability": never}})
    av._load.cache_clear()
    short = write(tmp_path, {c: {"active": [0, 40], "inactive": [30, 70], "finish_time": 100} for c in range(6)})
    with pytest.raises(ConfigError, match=r"worker 0's longest online window is 0\.5 .* takes 1") as info:
        run(experiment(FedBuff(buffer_size=2, speeds="constant", availability=short), workers=6))
    assert "\n" not in str(info.value)
    run(experiment(FedBuff(buffer_size=2, speeds="constant", availability=short, availability_scale=30.0),
                   workers=6, rounds=2))  # windows of 1 unit: just long enough
    with pytest.raises(ConfigError, match=r"^algorithm_params\.availability=.*torchrun"):
        make_config({**BASE, "engine": "torchrun", "algorithm_params": {"buffer_size": 2, "availability": few}})


# --- the clock -------------------------------------------------------------------------------------------------------


def test_always_is_the_default_bit_for_bit() -> None:
    """FedBuff n = 10, K = 3, two always-first sign flippers, a bound that drops: ``availability = "always"`` gives
    the metric rows and the final θ of the run without the key; the sample's availability changes them (not
    vacuous)."""
    def once(**kw: Any) -> tuple[list[dict[str, Any]], torch.Tensor]:
        algo = FedBuff(buffer_size=3, max_staleness=1, speeds="lognormal(1.5)", byzantine_timing="always_first", **kw)
        loop, rows = run(experiment(algo, "cwmed", 1, byzantine=2, attack="signflip", rounds=8))
        return rows, loop.state.theta

    rows, theta = once()
    same_rows, same_theta = once(availability="always")
    assert rows == same_rows and torch.equal(theta, same_theta) and rows[-1]["dropped"] > 0
    assert rows[-1]["unavailable"] == 0
    other_rows, _ = once(availability="fedscale:sample")
    assert other_rows != rows


def deliveries(clock: Clock, k: int, rounds: int, speeds: str, seed: int = 0) -> list[tuple[int, float, float]]:
    """``rounds`` FedBuff(K = k) steps on ``clock``: every delivery (accepted or dropped) as (worker, start, end)."""
    algo = FedBuff(buffer_size=k)
    state = clock.start(Speeds.parse(speeds).draw(clock.n, seed))
    out = []
    for t in range(rounds):
        step = clock.collect(state, t, lambda o, ok: algo.full(clock.n, o, ok))
        arrival, d = state["arrival"].numpy(), clock.durations(state["speed"]).numpy()
        out += [(i, float(arrival[i] - d[i]), float(arrival[i])) for i in torch.cat([step.ids, step.dropped]).tolist()]
        state = clock.advance(state, t, step, 0)
    assert np.isfinite(state["stats"].numpy()).all()
    return out


def offline_inside(entry: dict[str, Any], start: float, end: float, scale: float) -> bool:
    """Whether the trace has the client offline somewhere in [start, end] (simulated units): at the ends (nudged in by
    a float64 rounding's worth, 8 ulp of the time) and at 64 instants between."""
    tol = 8 * np.finfo(np.float64).eps * max(1.0, end)
    points = [start + tol, *np.linspace(start, end, 66)[1:-1], end - tol] if end - start > 2 * tol else [start + tol]
    return not all(fedscale_is_active(entry, p * scale) for p in points)


@pytest.mark.parametrize("concurrency", [None, 8])
def test_no_delivered_update_was_computed_offline(concurrency: int | None) -> None:
    """The sample, n = 16 (C = 8 or every worker), K = 4, log-normal speeds, 600 steps: every delivered update's
    computation [arrival − 1/vᵢ, arrival] lies in one online window of the trace, checked against the trace's own
    lists (FedScale's rule); updates were lost to going offline (the statistic counts them). The mutant — the same
    clock ignoring the trace — delivers updates computed offline."""
    table = av.sample_table()
    entries = [table[c] for c in sorted(table)][:16]
    avail = av.parse("fedscale:sample", 60.0, 16)

    def bad(clock: Clock) -> int:
        got = deliveries(clock, 4, 600, "lognormal(1.0)")
        return sum(offline_inside(entries[i], s, e, 60.0) for i, s, e in got)

    clock = Clock(workers=16, byzantine=0, max_staleness=4, timing="honest", concurrency=concurrency,
                  availability=avail)
    assert bad(clock) == 0
    state = clock.start(Speeds.parse("lognormal(1.0)").draw(16, 0))
    algo = FedBuff(buffer_size=4)
    for t in range(600):
        state = clock.advance(state, t, clock.collect(state, t, lambda o, ok: algo.full(16, o, ok)), 0)
    assert state["stats"][-1] > 0
    ignores = Clock(workers=16, byzantine=0, max_staleness=4, timing="honest", concurrency=concurrency)
    assert bad(ignores) > 0


@st.composite
def traces(draw: Any, clients: int) -> dict[int, dict[str, Any]]:
    """Random valid traces: per client a period of 10–400 integer seconds and up to 5 windows, sorted, possibly
    touching, possibly zero-length, possibly wrapping at finish_time — at least one of positive length."""
    out = {}
    for c in range(clients):
        finish = draw(st.integers(10, 400))
        cuts = sorted(draw(st.lists(st.integers(0, finish), min_size=0, max_size=10)))
        cuts = cuts[: len(cuts) // 2 * 2]
        if not any(e > a for a, e in zip(cuts[0::2], cuts[1::2])):
            cuts = [0, finish // 2]
        out[c] = {"active": cuts[0::2], "inactive": cuts[1::2], "finish_time": finish}
    return out


@settings(max_examples=60, deadline=None)
@given(timing=st.sampled_from(TIMINGS), n=st.integers(2, 10), data=st.data())
def test_the_clock_never_stalls_over_random_traces(timing: str, n: int, data: Any) -> None:
    """Any timing, n, K ≤ C ≤ n, b < n, S, speeds and a random valid trace, at a time scale :meth:`Availability.check`
    accepts (the drawn one, or the largest under which every worker's longest window holds its update): 150 steps
    never raise, exactly C in flight with finite arrivals, each step takes K updates."""
    k = data.draw(st.integers(1, n), label="K")
    c = data.draw(st.integers(k, n), label="C")
    b = data.draw(st.integers(0, n - 1), label="b")
    bound = data.draw(st.integers(0, 3), label="S")
    table = data.draw(traces(n), label="trace")
    speed = Speeds.parse(data.draw(st.sampled_from(["constant", "lognormal(1.0)"]), label="speeds")).draw(n, n)
    clock = Clock(workers=n, byzantine=b, max_staleness=bound, timing=timing, concurrency=c, seed=n)
    d = clock.durations(speed).tolist()
    fits = min(max(e - a for a, e in zip(table[i]["active"], table[i]["inactive"])) / d[i]
               for i in range(n) if d[i] > 0) if any(x > 0 for x in d) else 1.0
    scale = min(data.draw(st.sampled_from([1.0, 10.0, 60.0]), label="scale"), 0.999 * fits)
    avail = av.Availability("test", tuple(av.Windows.of(e["active"], e["inactive"], e["finish_time"], scale)
                                          for e in (table[i] for i in range(n))))
    avail.check(d)
    clock.availability = avail
    state = clock.start(speed)
    algo = FedBuff(buffer_size=k)
    for t in range(150):
        arrival = state["arrival"].numpy()
        assert int(np.isfinite(arrival).sum()) == c and not np.isnan(arrival).any()
        step = clock.collect(state, t, lambda o, ok: algo.full(n, o, ok))
        assert int(step.ids.numel()) == k
        state = clock.advance(state, t, step, 0)
    assert math.isfinite(float(state["stats"][0])) and float(state["stats"][-1]) >= 0


def test_an_interrupted_run_with_availability_resumes_bit_for_bit(tmp_path: Path) -> None:
    """FedBuff with the sample's availability and C = 4 of 8, stopped after step 4 and resumed: the same final
    checkpoint key for key and the same metric rows (availability is a function of worker and time: no more
    state)."""
    cfg = make_config({"dataset": "digits", "model": "logreg", "workers": 8, "byzantine": 1, "f": 0,
                       "aggregator": "mean", "attack": "signflip", "algorithm": "fedbuff",
                       "algorithm_params": {"buffer_size": 2, "max_staleness": 2, "concurrency": 4,
                                            "availability": "fedscale:sample", "availability_scale": 600.0},
                       "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "lr": 0.5, "seed": 4})
    a, b, part = whole_and_resumed(cfg, tmp_path, stop=4)
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    rows = [json.loads(line) for line in next((tmp_path / "whole").glob("**/metrics.jsonl")).read_text().splitlines()]
    resumed = [json.loads(line) for line in next(part.glob("**/metrics.jsonl")).read_text().splitlines()]
    assert rows == resumed


def test_the_cli_takes_it(tmp_path: Path) -> None:
    """``--set algorithm_params.availability=fedscale:sample`` runs and its metrics carry ``unavailable``."""
    res = CliRunner().invoke(cli.app, ["run", "--set", "dataset=digits", "--set", "model=logreg", "--set", "workers=8",
                                       "--set", "aggregator=mean", "--set", "f=0", "--set", "byzantine=0",
                                       "--set", "attack=none", "--set", "algorithm=fedbuff",
                                       "--set", "algorithm_params={buffer_size = 2}",
                                       "--set", "algorithm_params.availability=fedscale:sample",
                                       "--set", "rounds=3", "--set", "seed=0", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    config = json.loads(next(tmp_path.glob("out/**/config.json")).read_text())
    assert config["algorithm_params"] == {"buffer_size": 2, "availability": "fedscale:sample"}
    rows = [json.loads(x) for x in next(tmp_path.glob("out/**/metrics.jsonl")).read_text().splitlines()]
    assert "unavailable" in rows[-1]
    assert os.path.exists(av.SAMPLE)
