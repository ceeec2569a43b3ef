"""Kardam's frequency filter, Phalanx's variant (phalanx.training.algorithms.kardam, docs/async.md): among the last
W updates the server accepted at most q are one worker's — its definition step by step, a worker faster than the
others throttled on the simulated clock and on the real server's filter (each with the mutant W = 0, the filter off,
which is not), the W < q · n check with the mutant that shows why, bad parameters and a hostile window refused in
one line, and a resumed run equal to the uninterrupted one."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from tests._interrupt import whole_and_resumed
from tests.test_async_filters import after_steps, experiment
from tests.test_async_process_filters import FILTERED

from phalanx.distributed.async_buffer import Buffer
from phalanx.distributed.async_filters import ProcessFilter
from phalanx.errors import ConfigError
from phalanx.experiments import make_config
from phalanx.experiments.build import from_config
from phalanx.training.algorithms.kardam import RECENT, Kardam
from phalanx.training.loop import Loop, fresh_start
from phalanx.training.shards import sample_batches_of

SCREEN = Kardam.screen
"""The filter itself (a test's spy wraps it; a second spy must not wrap the first)."""


def verdicts(algo: Kardam, workers: list[int], window: list[int] | None) -> list[bool]:
    """Kardam's verdicts on one update each of ``workers`` in turn, after 8 honest steps, with every Lipschitz
    coefficient known to be ∞ (so that the Lipschitz filter passes every finite update: only the frequency filter
    decides) and the window set to ``window``; the state advances from one verdict to the next."""
    loop, exp = after_steps(algo, 8)
    own = dict(loop.state.own)
    own["kardam_lip"] = torch.full_like(own["kardam_lip"], math.inf)
    if window is not None:
        own[RECENT] = torch.tensor(window, dtype=torch.int64)
    t, theta = loop.state.round, loop.state.theta
    ring = own["thetas"].clone()
    ring[t % (algo.max_staleness + 1)] = theta
    g = torch.ones(exp.problem.dim)
    out = []
    for w in workers:
        _, keep, state = algo.screen(exp, own, theta, t, torch.tensor([w]), g[None] * (1 + w), torch.tensor([t]),
                                     ring)
        own.update(state)
        own["kardam_lip"] = torch.full_like(own["kardam_lip"], math.inf)
        out.append(bool(keep[0]))
    return out


def test_kardams_frequency_filter_is_its_definition() -> None:
    """W = 3, q = 1, an empty window: worker 9 delivering every other update is accepted only when none of the last
    3 accepted updates is its own (the window slides on accepted updates only); the mutant W = 0 accepts all."""
    seq = [9, 9, 0, 9, 1, 9, 2, 9]
    on = Kardam(buffer_size=1, filter_f=2, speeds="constant", frequency_window=3, frequency_max=1)
    assert verdicts(on, seq, [-1, -1, -1]) == [True, False, True, False, True, False, True, True]
    two = Kardam(buffer_size=1, filter_f=2, speeds="constant", frequency_window=3, frequency_max=2)
    assert verdicts(two, [9, 9, 9, 0, 9], [-1, -1, -1]) == [True, True, False, True, False]
    off = Kardam(buffer_size=1, filter_f=2, speeds="constant")
    assert verdicts(off, seq, None) == [True] * len(seq)


def accepted_workers(algo: Kardam, monkeypatch: pytest.MonkeyPatch, rounds: int = 40) -> list[int]:
    """The workers of the updates Kardam accepted, in order, over a simulated run of 10 workers where worker 9 is 20
    times faster than the others (K = 4, no attack)."""
    seen: list[int] = []

    def spy(self: Kardam, run: Any, own: Any, theta: Any, t: int, ids: torch.Tensor, *a: Any, **k: Any) -> Any:
        out = SCREEN(self, run, own, theta, t, ids, *a, **k)
        seen.extend(int(w) for w, ok in zip(ids.tolist(), out[1].tolist(), strict=True) if ok)
        return out

    monkeypatch.setattr(Kardam, "screen", spy)
    Loop(experiment(algo, rounds=rounds, seed=0)).run()
    return seen


def most_in_a_window(seq: list[int], worker: int, window: int) -> int:
    return max(seq[i:i + window].count(worker) for i in range(max(1, len(seq) - window + 1)))


def test_a_worker_faster_than_the_others_is_throttled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 9 at speed 20 (the others 1), K = 4, 40 steps: worker 9 delivers in every step (a worker delivers at
    most once a step). With W = 8, q = 1 no 8 consecutive accepted updates hold two of worker 9's, so its share of the
    accepted ones is at most 1/8 (+ the first window); the mutant without the filter (W = 0) accepts more than twice as
    many of its updates, two of them within 8 accepted ones (measured, seed 0: 4 of 35 accepted with the filter, 19
    of 106 without; the filter also throttles honest workers that deliver in consecutive steps)."""
    speeds = [1.0] * 9 + [20.0]
    kw: dict[str, Any] = {"buffer_size": 4, "filter_f": 2, "speeds": speeds, "max_staleness": 10}
    on = accepted_workers(Kardam(**kw, frequency_window=8, frequency_max=1), monkeypatch)
    off = accepted_workers(Kardam(**kw), monkeypatch)
    assert most_in_a_window(on, 9, 8) == 1 and on.count(9) <= len(on) / 8 + 1
    assert most_in_a_window(off, 9, 8) > 1 and off.count(9) > 2 * on.count(9)


def test_the_frequency_filter_throttles_a_fast_rank_on_the_real_servers_filter() -> None:
    """The real server's buffer and filter in this process (ranks 0–4, K = 1, 30 steps, no attack), rank 4's update
    offered first at every step (the fastest worker): with W = 3, q = 1 (< q · 4 worker ranks) rank 4's updates are
    used in at most a third of the steps (+1), and in fewer than by the mutant without the filter, which the Lipschitz
    filter alone throttles less (measured: 8 and 14 of 30 steps)."""

    def used_by_rank_4(params: dict[str, Any]) -> int:
        exp = from_config(make_config({**FILTERED, "attack": "none", "attack_params": {}, "byzantine": 0,
                                       "algorithm": "kardam",
                                       "algorithm_params": {"buffer_size": 1, "filter_f": 1, "max_staleness": 3,
                                                            **params}}))
        start = fresh_start(exp)
        flt = ProcessFilter(exp, start.state.own)
        buf = Buffer(5, exp.problem.dim, torch.float32, 3, judge=flt.judge)
        theta, gen, used = start.state.theta.clone(), torch.Generator().manual_seed(0), 0
        for t in range(30):
            buf.publish(t)
            flt.publish(t, theta)
            for rank in (4, 1, 2, 3):
                xb, yb = sample_batches_of(exp.data, torch.tensor([rank]), 32, gen)
                buf.offer(rank, t, exp.problem.grads_each(theta[None], xb, yb)[0].numpy().tobytes())
            if not buf.step:
                continue
            u = buf.step[0]
            used += u.rank == 4
            theta = theta - 0.5 * u.row
        return used

    on, off = used_by_rank_4({"frequency_window": 3}), used_by_rank_4({})
    assert on <= 30 / 3 + 1 and off > on


def test_the_window_must_leave_a_worker_a_place() -> None:
    """W < q · n is checked (in simulation, and against the n − 1 worker ranks on processes); the mutant W = q · n —
    a full window of one place per worker — rejects every worker's update for ever, which is why."""
    base = {"dataset": "digits", "model": "logreg", "workers": 10, "aggregator": "mean", "f": 0, "algorithm": "kardam"}
    with pytest.raises(ConfigError, match=r"^algorithm_params.frequency_window=10") as info:
        make_config({**base, "algorithm_params": {"filter_f": 2, "frequency_window": 10}})
    assert "\n" not in str(info.value)
    make_config({**base, "algorithm_params": {"filter_f": 2, "frequency_window": 9}})  # simulated: 9 < 10
    with pytest.raises(ConfigError, match=r"^algorithm_params.frequency_window=9.*on processes"):
        from phalanx.experiments.config import validate

        validate(make_config({**FILTERED, "algorithm": "kardam", "workers": 10, "engine": "torchrun",
                              "algorithm_params": {"buffer_size": 1, "filter_f": 2, "frequency_window": 9}}))
    with pytest.raises(ConfigError, match=r"^algorithm_params.frequency_window=10"):
        experiment(Kardam(filter_f=2, frequency_window=10))
    full = Kardam(buffer_size=1, filter_f=2, speeds="constant", frequency_window=9)
    assert verdicts(full, list(range(10)), list(range(10))) == [False] * 10  # the mutant's window: W = 10 places


@pytest.mark.parametrize(("make", "parameter"), [
    (lambda: Kardam(frequency_window=-1), "algorithm_params.frequency_window"),
    (lambda: Kardam(frequency_max=0), "algorithm_params.frequency_max"),
    (lambda: Kardam(frequency_window=2.5), "algorithm_params.frequency_window"),
])
def test_bad_frequency_parameters_are_refused_in_one_line(make: Any, parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.parameter == parameter and "\n" not in str(info.value)


def test_a_hostile_frequency_window_is_refused() -> None:
    """A resumed state whose window has another length, names a worker outside the run or is not integral is refused
    in one line naming ``start``; a state without the window (the filter off) carries none."""
    algo = Kardam(buffer_size=2, frequency_window=3)
    exp = experiment(algo)
    own = algo.initial_state(exp, exp.problem.initial_theta())
    algo.load_state(exp, own)
    for window in (torch.tensor([-1, -1], dtype=torch.int64), torch.tensor([0, 99, -1], dtype=torch.int64),
                   torch.tensor([0.5, 1, 2])):
        with pytest.raises(ConfigError, match=r"^start=") as info:
            algo.load_state(exp, {**own, RECENT: window})
        assert "\n" not in str(info.value)
    off = Kardam(buffer_size=2)
    assert RECENT not in off.initial_state(exp, exp.problem.initial_theta())


def test_a_run_with_the_frequency_filter_resumes_bit_for_bit(tmp_path: Path) -> None:
    """The window is checkpointed with the filter: a run stopped after step 4 and resumed ends with the uninterrupted
    run's checkpoint, key for key (the window included)."""
    cfg = make_config({"dataset": "digits", "model": "logreg", "workers": 8, "byzantine": 2, "f": 0,
                       "aggregator": "mean", "attack": "signflip", "algorithm": "kardam",
                       "algorithm_params": {"buffer_size": 2, "filter_f": 2, "frequency_window": 3,
                                            "byzantine_timing": "always_first"},
                       "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "lr": 0.5, "seed": 4})
    a, b, _ = whole_and_resumed(cfg, tmp_path, stop=4)
    assert set(a) == set(b) and f"algorithm.{RECENT}" in a
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, equal_nan=True, msg=key)
