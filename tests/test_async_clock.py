"""The simulated clock's per-step work in NumPy (issue 36, the asynchronous step per processed update): every run is
bit for bit what the torch clock made it. Two ways: the clock against the torch computation it replaced (kept here,
verbatim, as the reference) on random states — ties, drops, Byzantine timings — with mutants the comparison must
catch; and the final θ and clock statistics of a few runs, pinned from the torch clock (main before the change)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tests.test_async_time import experiment
from torch import Tensor

from phalanx.training import Loop
from phalanx.training.algorithms.asynchronous import Asynchronous
from phalanx.training.algorithms.basgd import BASGD
from phalanx.training.algorithms.clock import STATS, TIMINGS, Clock, Step
from phalanx.training.algorithms.fedbuff import FedBuff
from phalanx.training.algorithms.kardam import Kardam
from phalanx.training.algorithms.zenopp import ZenoPP

# --- the torch clock it replaced (the reference) ---------------------------------------------------------------------


def ref_fedbuff_full(k: int) -> Callable[[Tensor, Tensor], int]:
    def full(order: Tensor, accepted: Tensor) -> int:
        reached = torch.nonzero(torch.cumsum(accepted.to(torch.int64), 0) >= k)
        return int(reached[0, 0]) + 1 if reached.numel() else 0
    return full


def ref_basgd_full(buffers: int) -> Callable[[Tensor, Tensor], int]:
    def full(order: Tensor, accepted: Tensor) -> int:
        pos = torch.arange(order.numel())
        first = torch.full((buffers,), order.numel(), dtype=torch.int64)
        first = first.scatter_reduce(0, order[accepted] % buffers, pos[accepted], "amin")
        end = int(first.max()) + 1
        return end if end <= order.numel() else 0
    return full


class TorchClock(Clock):
    """The clock's step as torch computed it before (``order``, ``collect``, ``before_last``, ``held``, ``advance``)."""

    def order(self, arrival: Tensor) -> Tensor:
        if not self.b or not bool(self.first.any()):
            return torch.argsort(arrival, stable=True)
        order = torch.argsort((~self.first).to(torch.int8), stable=True)
        return order[torch.argsort(arrival[order], stable=True)]

    def collect(self, state: dict[str, Tensor], t: int, full: Any) -> Step:
        order = self.order(state["arrival"])
        if self.timing == "last_slot":
            is_b = self.byz[order]
            honest, byz = order[~is_b], order[is_b]
            merged = torch.cat([honest, byz])
            end = int(full(merged, (t - state["version"])[merged] <= self.bound))
            order = merged if not byz.numel() or not 0 < end <= honest.numel() else \
                torch.cat([honest[: end - 1], byz, honest[end - 1:]])
        elif self.timing == "at_bound":
            is_b = self.byz[order]
            ready = is_b & ((t - state["version"])[order] >= self.bound)
            order = torch.cat([order[ready], order[~is_b], order[is_b & ~ready]])
        versions = state["version"][order]
        staleness = t - versions
        accepted = staleness <= self.bound
        end = int(full(order, accepted))
        assert 0 < end <= self.n
        taken, ok = order[:end], accepted[:end]
        time = max(float(state["stats"][0]), float(state["arrival"][taken].max()))  # (fixed with the clock: below)
        return Step(taken[ok], versions[:end][ok], staleness[:end][ok], taken[~ok], time)

    def advance(self, state: dict[str, Tensor], t: int, step: Step, byzantine_rows: int) -> dict[str, Tensor]:
        arrival, version = state["arrival"].clone(), state["version"].clone()
        went = torch.cat([step.ids, step.dropped])
        arrival[went] = step.time + self.durations(state["speed"])[went]
        version[went] = t + 1
        old = state["stats"].tolist()
        k = int(step.ids.numel())
        byz = int((step.ids >= self.n - self.b).sum()) if self.b else 0
        s = step.staleness.to(torch.float64)
        stats = torch.tensor([step.time, old[1] + step.dropped.numel(), old[2] + k, old[3] + byz,
                              float(s.mean()) if k else 0.0, float(s.max()) if k else 0.0, byz / k if k else 0.0,
                              float(step.dropped.numel()), float(byzantine_rows), old[9]], dtype=torch.float64)
        return {"speed": state["speed"], "arrival": arrival, "version": version, "stats": stats}


# --- random states ---------------------------------------------------------------------------------------------------


def random_state(gen: torch.Generator, n: int, t: int, bound: int) -> dict[str, Tensor]:
    """A state a run could be in, and some it could not quite: arrival times on a coarse grid (many ties, zeros),
    versions up to bound + 2 behind (drops), speeds log-normal."""
    speed = torch.exp(torch.randn(n, generator=gen, dtype=torch.float64))
    arrival = torch.randint(0, 6, (n,), generator=gen).to(torch.float64) / 4
    version = (t - torch.randint(0, bound + 3, (n,), generator=gen)).clamp(min=0)
    stats = torch.rand(len(STATS), generator=gen, dtype=torch.float64).round(decimals=3) * 10
    stats[0] = float(arrival.min())  # the last step's time: no later than the earliest pending delivery
    return {"speed": speed, "arrival": arrival, "version": version, "stats": stats}


def algorithms(n: int) -> list[tuple[Asynchronous, Callable[[Tensor, Tensor], int]]]:
    return [(FedBuff(buffer_size=k), ref_fedbuff_full(k)) for k in (1, 3, n)] + \
        [(BASGD(buffers=b), ref_basgd_full(b)) for b in (1, 4)]


def same(a: Tensor, b: Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def agree(clock: Clock, ref: Clock, state: dict[str, Tensor], t: int, algo: Asynchronous,
          ref_full: Callable[[Tensor, Tensor], int]) -> bool:
    """The step and the state after it, bit for bit (dtype, shape, every value), when the torch one has a step."""
    try:
        want = ref.collect(state, t, ref_full)
    except AssertionError:  # no full buffer in this made-up state: the clock must say so too
        try:
            clock.collect(state, t, lambda o, a: algo.full(clock.n, o, a))
        except RuntimeError as e:
            return "no full buffer" in str(e)
        return False
    got = clock.collect(state, t, lambda o, a: algo.full(clock.n, o, a))
    fields = ("ids", "versions", "staleness", "dropped")
    if got.time != want.time or not all(same(getattr(got, f), getattr(want, f)) for f in fields):
        return False
    after, ref_after = clock.advance(state, t, got, 3), ref.advance(state, t, want, 3)
    return set(after) == set(ref_after) and all(same(after[k], ref_after[k]) for k in after)


CASES = [(timing, b, bound) for timing in TIMINGS for b in (0, 1, 3) for bound in (0, 2)]


@pytest.mark.parametrize(("timing", "byzantine", "bound"), CASES)
def test_the_clock_is_the_torch_clock_on_random_states(timing: str, byzantine: int, bound: int) -> None:
    """Every timing, with and without Byzantine workers, a bound that drops: the NumPy step (order, the buffer's
    prefix, drops, the new arrival times and versions, the statistics) is the torch step's, bit for bit, and the
    NumPy ``full`` of FedBuff and BASGD is their torch one's, on 40 random states with ties."""
    gen = torch.Generator().manual_seed(hash((timing, byzantine, bound)) % 2**31)
    n = 12
    clock = Clock(workers=n, byzantine=byzantine, max_staleness=bound, timing=timing)
    ref = TorchClock(workers=n, byzantine=byzantine, max_staleness=bound, timing=timing)
    for trial in range(40):
        t = trial % 7
        state = random_state(gen, n, t, bound)
        for algo, ref_full in algorithms(n):
            order = torch.randperm(n, generator=gen)
            ok = torch.rand(n, generator=gen) < 0.7
            assert algo.full(n, order, ok) == ref_full(order, ok)
            clock._head = int(torch.randint(1, n + 1, (), generator=gen))  # a leading part of any length first
            assert agree(clock, ref, state, t, algo, ref_full), (timing, trial, algo)


def test_a_run_of_the_clock_is_the_torch_runs_at_scale() -> None:
    """n = 1,000, always-first Byzantine workers (ties every step), a bound that drops: 60 steps of FedBuff and BASGD,
    the states equal after every step."""
    n = 1000
    for algo, ref_full in [(FedBuff(buffer_size=10, max_staleness=1), ref_fedbuff_full(10)),
                           (BASGD(buffers=10, max_staleness=1), ref_basgd_full(10))]:
        clock = Clock(workers=n, byzantine=7, max_staleness=1, timing="always_first")
        ref = TorchClock(workers=n, byzantine=7, max_staleness=1, timing="always_first")
        speed = torch.exp(torch.randn(n, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
        state = clock.start(speed)
        dropped = 0
        for t in range(60):
            assert agree(clock, ref, state, t, algo, ref_full)
            step = clock.collect(state, t, algo_full(algo, n))
            dropped += int(step.dropped.numel())
            state = clock.advance(state, t, step, 0)
        assert dropped > 0  # the bound was played


def algo_full(algo: Asynchronous, n: int) -> Callable[[Tensor, Tensor], int]:
    return lambda o, a: algo.full(n, o, a)


class Unstable(Clock):
    """Mutant: ties broken by descending index (what an unstable sort may do), always-first ignored."""

    def _order(self, arrival: np.ndarray) -> np.ndarray:
        return self.n - 1 - np.argsort(arrival[::-1], kind="stable")


class NoTies(Clock):
    """Mutant: the leading part is exactly the m earliest (a partition), cutting through a tie at its boundary."""

    def _leading(self, arrival: np.ndarray, m: int) -> np.ndarray:
        due = np.argpartition(arrival, m - 1)[:m]
        return due[np.lexsort((due, arrival[due]))]


class StaleMean(Clock):
    """Mutant: the recorded staleness mean counts the dropped updates (as staleness 0)."""

    def advance(self, state: dict[str, Tensor], t: int, step: Step, byzantine_rows: int) -> dict[str, Tensor]:
        out = super().advance(state, t, step, byzantine_rows)
        k = step.ids.numel() + step.dropped.numel()
        out["stats"][4] = float(step.staleness.sum()) / k if k else 0.0
        return out


class LateArrival(Clock):
    """Mutant: a time attacker's next update takes 1/vᵢ like an honest one (its zero duration lost)."""

    def advance(self, state: dict[str, Tensor], t: int, step: Step, byzantine_rows: int) -> dict[str, Tensor]:
        out = super().advance(state, t, step, byzantine_rows)
        went = torch.cat([step.ids, step.dropped])
        out["arrival"][went] = step.time + 1.0 / state["speed"][went]
        return out


class FullCountsDrops(FedBuff):
    """Mutant FedBuff: its buffer counts dropped updates as places."""

    def full(self, workers: int, order: Tensor, accepted: Tensor) -> int:
        return min(self.buffer_size, order.numel())


@pytest.mark.parametrize(("mutant", "algo", "timing"), [
    (Unstable, FedBuff(buffer_size=3), "always_first"), (NoTies, FedBuff(buffer_size=3), "honest"),
    (StaleMean, FedBuff(buffer_size=3), "honest"),
    (LateArrival, BASGD(buffers=4), "last_slot"), (Clock, FullCountsDrops(buffer_size=3), "honest")])
def test_the_comparison_catches_a_clock_that_is_not_the_torch_one(mutant: type[Clock], algo: Asynchronous,
                                                                   timing: str) -> None:
    """The check above can fail: a mutant order, statistic, arrival time or buffer rule disagrees with the torch
    clock on some of the same random states."""
    gen = torch.Generator().manual_seed(11)
    n = 12
    clock = mutant(workers=n, byzantine=3, max_staleness=1, timing=timing)
    ref = TorchClock(workers=n, byzantine=3, max_staleness=1, timing=timing)
    ref_full = ref_fedbuff_full(3) if isinstance(algo, FedBuff) else ref_basgd_full(4)
    results = []
    for trial in range(40):
        clock._head = int(torch.randint(1, n + 1, (), generator=gen))
        results.append(agree(clock, ref, random_state(gen, n, trial % 7, 1), trial % 7, algo, ref_full))
    assert not all(results)


# --- runs pinned from the torch clock --------------------------------------------------------------------------------

PINNED: dict[str, tuple[Callable[[], Asynchronous], tuple[float, float], list[float]]] = {
    # name: (algorithm, the final θ's (‖θ‖, ⟨θ, r⟩) for a fixed Gaussian r, the final clock stats), from main's torch
    # clock: n = 10, b = 2 sign flippers, logistic regression on digits, 20 server steps, seed 3. θ was first pinned
    # by its bytes' SHA-256; the same code gives other last bits on another CPU (AVX-512 here, 2026-12-04), so θ is
    # now compared within float32's rounding over 20 steps (rtol 1e-4) — a changed tie, drop or arrival moves it by
    # far more (tests/test_async_clock.py::test_a_changed_arrival_moves_theta_beyond_the_tolerance) — and the clock's
    # statistics, which decide every arrival, stay exact.
    "fedbuff-honest": (lambda: FedBuff(buffer_size=4, max_staleness=1), (3.240532033421286, 5.75067632847996),
                       [7.884257367027846, 11.0, 80.0, 20.0, 0.5, 1.0, 0.25, 1.0, 1.0]),
    "fedbuff-always_first": (lambda: FedBuff(buffer_size=4, byzantine_timing="always_first"),
                             (3.6544712713875374, -4.144672395478575),
                             [3.4690510573178037, 2.0, 80.0, 40.0, 1.0, 3.0, 0.5, 0.0, 2.0]),
    "fedbuff-last_slot": (lambda: FedBuff(buffer_size=3, max_staleness=2, byzantine_timing="last_slot"),
                          (2.8432906527801975, 4.364115648755028),  # (re-pinned: time no longer runs back)
                          [5.131851740628985, 11.0, 60.0, 20.0, 1.0, 2.0, 0.3333333333333333, 0.0, 1.0]),
    "fedbuff-at_bound": (lambda: FedBuff(buffer_size=4, max_staleness=2, byzantine_timing="at_bound"),
                         (3.547904539226664, 6.0976422666519206),
                         [8.726729920134886, 1.0, 80.0, 12.0, 1.0, 2.0, 0.0, 0.0, 0.0]),
    "fedbuff-replay": (lambda: FedBuff(buffer_size=4, max_staleness=1, byzantine_timing="replay"),
                       (4.380296633275758, 7.885754302345489),
                       [5.366527229543737, 21.0, 80.0, 40.0, 0.0, 0.0, 0.5, 2.0, 2.0]),
    "basgd-always_first": (lambda: BASGD(buffers=5, max_staleness=1, byzantine_timing="always_first"),
                           (3.0155986836019104, 4.844302557643995),
                           [24.44462966018101, 1.0, 160.0, 40.0, 0.0, 0.0, 0.25, 0.0, 2.0]),
    "basgd-last_slot": (lambda: BASGD(buffers=3, byzantine_timing="last_slot"), (2.8400208600236962, 4.106283016541218),
                        [5.7092917863232495, 0.0, 94.0, 32.0, 1.25, 3.0, 0.25, 0.0, 1.0]),
    "fedbuff-constant": (lambda: FedBuff(buffer_size=3, max_staleness=1, speeds="constant",
                                         byzantine_timing="always_first"), (18.77156908741835, -21.482928378569568),
                         [10.0, 30.0, 60.0, 40.0, 0.3333333333333333, 1.0, 0.6666666666666666, 0.0, 2.0]),
    "kardam-honest": (lambda: Kardam(max_staleness=2), (3.2539909143357226, 5.756621917101008),
                      [2.2022346835538604, 14.0, 20.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]),
    "zenopp-at_bound": (lambda: ZenoPP(max_staleness=2, byzantine_timing="at_bound"),
                        (4.085248866273978, 6.01387984605622),
                        [1.5390573122828473, 10.0, 20.0, 11.0, 2.0, 2.0, 0.0, 3.0, 0.0]),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_runs_end_where_the_torch_clock_ended_them(name: str) -> None:
    """Each timing, FedBuff, BASGD, Kardam and Zeno++, a bound that drops: the final θ (its bytes) and the clock's
    statistics are the torch clock's. A changed tie, drop, arrival or statistic anywhere in the 20 steps changes
    them."""
    make, pinned, stats = PINNED[name]
    loop = Loop(experiment(make(), rounds=20, seed=3))
    loop.run()
    assert summary(loop.state.theta) == pytest.approx(pinned, rel=THETA_RTOL)
    assert loop.state.own["stats"].tolist() == [*stats, 0.0]  # (unavailable: none lost, every worker always online)


THETA_RTOL = 1e-4
"""About 1,700 times float32's unit roundoff (6e-8): room for another CPU's rounding over 20 steps of a 650-parameter
model, far below what one changed arrival moves (:func:`test_a_changed_arrival_moves_theta_beyond_the_tolerance`)."""


def summary(theta: Tensor) -> tuple[float, float]:
    """‖θ‖ and ⟨θ, r⟩ for a fixed Gaussian r (seed 0), in float64: two numbers a change of θ's size or direction
    moves."""
    th = theta.detach().double()
    r = torch.randn(th.numel(), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return float(th.norm()), float(th @ r)


def test_a_changed_arrival_moves_theta_beyond_the_tolerance() -> None:
    """The tolerance cannot hide a different run: the same FedBuff run with one server step more (one more buffer of
    arrivals aggregated), or from another seed's arrivals, is outside it."""
    make, pinned, _ = PINNED["fedbuff-honest"]
    for rounds, seed in ((21, 3), (20, 4)):
        loop = Loop(experiment(make(), rounds=rounds, seed=seed))
        loop.run()
        assert summary(loop.state.theta) != pytest.approx(pinned, rel=THETA_RTOL)


@pytest.mark.parametrize("timing", ["last_slot", "at_bound"])
def test_a_time_attackers_order_never_runs_the_clock_back(timing: str) -> None:
    """A step's time is its latest delivery: under ``last_slot`` an instant Byzantine update is served *after* honest
    ones that arrived later, and the clock once took the last in order — the attacker's instant — as the step's time,
    so simulated time stayed at 0 for a whole run while honest updates were taken before they arrived. Every update a
    step takes has arrived by the step's time, and time advances; the old rule (the mutant) runs it back here."""
    loop = Loop(experiment(FedBuff(buffer_size=3, max_staleness=2, byzantine_timing=timing), rounds=20, seed=3))
    loop.run()
    assert float(loop.state.own["stats"][0]) > 0.0
    n, algo = 10, FedBuff(buffer_size=3, max_staleness=2, byzantine_timing=timing)
    clock = Clock(workers=n, byzantine=2, max_staleness=2, timing=timing)
    state = clock.start(torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.5)
    mutant_ran_back = False
    for t in range(12):
        step = clock.collect(state, t, lambda order, ok: algo.full(n, order, ok))
        arrival = state["arrival"]
        assert bool((arrival[step.ids] <= step.time).all()), (t, step)
        mutant = max(float(state["stats"][0]), float(arrival[step.ids[-1]]))
        mutant_ran_back |= mutant < float(arrival[step.ids].max())
        state = clock.advance(state, t, step, int((step.ids >= n - 2).sum()))
    assert mutant_ran_back or timing == "at_bound"
