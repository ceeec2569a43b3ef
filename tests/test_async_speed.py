"""The cheaper simulated FedBuff step (issue 36: the asynchronous step no dearer per update than the synchronous
round) computes what the step computed before, bit for bit: the staleness weights from a cached table, FedBuff's
in-place scaling, the clock's restart of the delivered prefix and its durations kept per speed tensor, and a whole
server step against the step as it was written before (kept here, verbatim but for the clock, as the reference) —
each check with a mutant it rejects. The speed itself is measured, never asserted (benchmarks/asynchronous.py,
docs/async.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tests.test_async_clock import TorchClock, random_state
from tests.test_async_time import experiment
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.training import Loop
from phalanx.training.algorithms import availability as av
from phalanx.training.algorithms import fedbuff as fb
from phalanx.training.algorithms.asynchronous import RING, TOUCHED, Asynchronous, AsyncWorkers, replayed
from phalanx.training.algorithms.basgd import BASGD
from phalanx.training.algorithms.clock import TIMINGS, Clock, Step
from phalanx.training.algorithms.dsgd import poison_rows
from phalanx.training.algorithms.fedavg import attack_rows
from phalanx.training.algorithms.fedbuff import FedBuff, staleness_weight, staleness_weights
from phalanx.training.shards import sample_batches_of
from phalanx.training.state import Received

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
BOUND = 8
"""Large enough that a table computed in float32, float16 or bfloat16 differs from the float64 weights cast (at
s = 5, 6 in float32; 16 in float16; 10 in bfloat16 — the first mutant below)."""


def same(a: Tensor, b: Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and torch.equal(a, b)


def run_dtype_mutant(staleness: Tensor, bound: int, like: Tensor) -> Tensor:
    """Mutant: the weights computed in the run's dtype (not float64, then cast)."""
    return 1.0 / torch.sqrt(1.0 + staleness.to(like.dtype))


def clamped_mutant(staleness: Tensor, bound: int, like: Tensor) -> Tensor:
    """Mutant: a staleness beyond the table read as the bound's weight (no fallback to the formula)."""
    return fb.weight_table(bound, like.dtype).index_select(0, staleness.clamp(0, bound))


def weights_agree(weights: Callable[[Tensor, int, Tensor], Tensor]) -> bool:
    cases = [torch.arange(BOUND + 1), torch.tensor([3, 0, BOUND, 3]), torch.tensor([BOUND + 1, 0]),
             torch.tensor([40, 2]), torch.tensor([], dtype=torch.int64)]
    return all(same(weights(s, BOUND, torch.zeros(1, dtype=dt)), staleness_weight(s).to(dt))
               for dt in DTYPES for s in cases)


def test_the_weight_table_gives_the_formula_bit_for_bit() -> None:
    """w(s) = 1/√(1 + s) from the cached table is the float64 formula cast to the updates' dtype, bit for bit, for
    every staleness the bound allows and every float dtype; a staleness outside 0..S (an index the table lacks) is
    computed by the formula. Both mutants are caught."""
    assert weights_agree(staleness_weights)
    assert not weights_agree(run_dtype_mutant)
    assert not weights_agree(clamped_mutant)


def test_the_table_is_not_written_by_a_step() -> None:
    """The cached table is shared by every step of every run: a step's weights are a new tensor, scaled updates never
    write it."""
    table = fb.weight_table(BOUND, torch.float32).clone()
    w = staleness_weights(torch.tensor([0, 1, 2]), BOUND, torch.zeros(1))
    w.mul_(7.0)
    assert same(fb.weight_table(BOUND, torch.float32), table)


# --- the clock's restart of the delivered prefix, and its durations ---------------------------------------------------


def advance_agrees(clock: Clock, restarted: Callable[[Step], Tensor | None], trials: int = 30) -> bool:
    """Advancing with ``delivered = restarted(step)`` gives what advancing without it (the accepted then the dropped
    workers, concatenated) gives, on random states with drops, for every timing."""
    gen = torch.Generator().manual_seed(5)
    ok = []
    for trial in range(trials):
        t = trial % 7
        state = random_state(gen, clock.n, t, clock.bound)
        if clock.c < clock.n:  # n − C idle workers
            state["arrival"][torch.randperm(clock.n, generator=gen)[: clock.n - clock.c]] = float("inf")
        try:
            step = clock.collect(state, t, lambda o, a: FedBuff(buffer_size=3).full(clock.n, o, a))
        except RuntimeError:  # no full buffer in this made-up state
            continue
        got = clock.advance(state, t, dataclasses.replace(step, delivered=restarted(step)), 2)
        want = clock.advance(state, t, dataclasses.replace(step, delivered=None), 2)
        ok.append(all(same(got[k], want[k]) for k in want))
    return len(ok) >= trials // 2 and all(ok)  # (most made-up states fill the buffer: not a vacuous check)


@pytest.mark.parametrize("timing", TIMINGS)
def test_advance_restarts_the_delivered_prefix_as_the_concatenation_would(timing: str) -> None:
    """The step's delivered prefix (accepted and dropped workers in delivery order) restarts the workers the
    concatenation of the accepted and the dropped ones restarts — the same new arrival times, versions and
    statistics — with every worker computing, with C < n (the sampled restart) and with a trace's availability;
    a prefix without the dropped workers (mutant) is caught."""
    delivered: Callable[[Step], Tensor | None] = lambda step: step.delivered  # noqa: E731
    online = av.parse("fedscale:sample", 60.0, 12)
    for clock in (Clock(workers=12, byzantine=3, max_staleness=1, timing=timing),
                  Clock(workers=12, byzantine=3, max_staleness=1, timing=timing, concurrency=8),
                  Clock(workers=12, byzantine=3, max_staleness=1, timing=timing, availability=online)):
        assert advance_agrees(clock, delivered)
    assert not advance_agrees(Clock(workers=12, byzantine=3, max_staleness=1, timing=timing), lambda step: step.ids)


class NeverRefreshed(Clock):
    """Mutant: the durations of the first speed tensor kept for every later one (a resumed state's included)."""

    def _durations(self, speed: Tensor) -> Any:
        if self._speed is None:
            return super()._durations(speed)
        return self._d


@pytest.mark.parametrize(("kind", "caught"), [(Clock, False), (NeverRefreshed, True)])
def test_the_durations_follow_the_states_speeds(kind: type[Clock], caught: bool) -> None:
    """A clock that advanced states of one speed vector advances a state of another (a resumed run's, say) as a
    fresh clock does: the kept durations are the speed tensor's own (the mutant keeps the first ones)."""
    gen = torch.Generator().manual_seed(2)
    clock, fresh = kind(workers=10, byzantine=2, max_staleness=2, timing="always_first"), \
        Clock(workers=10, byzantine=2, max_staleness=2, timing="always_first")
    full = lambda o, a: FedBuff(buffer_size=3).full(10, o, a)  # noqa: E731
    first, second = random_state(gen, 10, 3, 2), random_state(gen, 10, 3, 2)
    clock.advance(first, 3, clock.collect(first, 3, full), 0)
    got = clock.advance(second, 3, clock.collect(second, 3, full), 0)
    want = fresh.advance(second, 3, fresh.collect(second, 3, full), 0)
    assert all(same(got[k], want[k]) for k in want) != caught


# --- a whole server step against the step as written before ---------------------------------------------------------


def reference_round(workers: AsyncWorkers, theta: Tensor, t: int, rule: Any) -> Received:
    """:meth:`AsyncWorkers.round` as written before the step was made cheaper (main at 44f577e), but for the clock
    (the torch clock of tests/test_async_clock.py) and the filter oracle (none of these runs filters): advanced
    indexing of the ring, an empty tensor made every step, FedBuff's weights by the formula, out of place."""
    algo, run = workers.algo, workers.run
    own = workers.stage.own
    slots = algo.max_staleness + 1
    ring = own[RING].clone()
    ring[t % slots] = theta.detach()
    clock = TorchClock(workers=workers.n, byzantine=workers.b, max_staleness=algo.max_staleness,
                       timing=algo.byzantine_timing)
    state = {k: own[k] for k in ("speed", "arrival", "version", "stats")}
    step = clock.collect(state, t, lambda order, ok: algo.full(workers.n, order, ok))
    byz_mask = step.ids >= workers.honest_n if workers.b else None
    if byz_mask is not None and bool(byz_mask.any()):
        honest, byz = step.ids[~byz_mask], step.ids[byz_mask]
        stale = torch.cat([step.staleness[~byz_mask], step.staleness[byz_mask]])
        versions = torch.cat([step.versions[~byz_mask], step.versions[byz_mask]])
    else:
        honest, byz, stale, versions = step.ids, step.ids[:0], step.staleness, step.versions
    computing = torch.cat([honest, byz]) if workers.data_attack else honest
    updates = theta.new_zeros(0, run.problem.dim)
    if computing.numel():
        xb, yb = sample_batches_of(run.data, computing, algo.batch_size, workers.batch_gen)
        attack = run.attack
        if isinstance(attack, DataAttack) and byz.numel() and attack.active(t):
            xb, yb = poison_rows(attack, xb, yb, int(honest.numel()), run.data.num_classes, workers.attack_gen,
                                 attackers=(byz - workers.honest_n).tolist())
        thetas = ring[(versions[: computing.numel()] % slots).to(ring.device)]
        updates = run.problem.grads_each(thetas, xb, yb)
    ids = torch.cat([honest, byz])
    if workers.vector_attack and byz.numel():
        rows = attack_rows(run, updates, int(byz.numel()), rule, workers.attack_gen, t)
        updates = torch.cat([updates, rows.to(updates)])
    extra: dict[str, Tensor] = {}
    if algo.byzantine_timing == "replay":
        updates, extra = replayed(own, updates, int(honest.numel()), int(byz.numel()), t, slots)
    if isinstance(algo, FedBuff):
        vectors, rows_of, touched = (updates * staleness_weight(stale).to(updates)[:, None], ids.tolist(),
                                     ids >= run.workers - run.byzantine)
    else:
        vectors, rows_of, touched = algo.assemble(run, ids, updates, stale)
    after = {RING: ring, TOUCHED: touched, **clock.advance(state, t, step, int(touched.sum())), **extra}
    return Received(vectors, rows=rows_of, state_rows=False, own=after)


def steps_agree(algo: Asynchronous, attack: str, steps: int = 12) -> bool:
    """Each server step of a run is the reference step from the same state and streams: its rows, their workers and
    the state after it, bit for bit."""
    loop = Loop(experiment(algo, attack=attack, rounds=steps, seed=4, workers=12, byzantine=3), callbacks=[])
    loop.open()
    workers = loop.transport.workers  # type: ignore[attr-defined]
    real = workers.round
    agreed: list[bool] = []

    def checked(theta: Tensor, t: int, rule: Any) -> Received:
        streams = workers.streams()
        want = reference_round(workers, theta, t, rule)
        workers.batch_gen.set_state(streams["batches"])
        workers.attack_gen.set_state(streams["attack"])
        got = real(theta, t, rule)
        agreed.append(same(got.vectors, want.vectors) and got.rows == want.rows and got.own is not None
                      and want.own is not None and set(got.own) == set(want.own)
                      and all(same(got.own[k], want.own[k]) for k in want.own))
        return got

    workers.round = checked
    while loop.state.round < steps:
        loop.step()
    return len(agreed) == steps and all(agreed)


class OffByOne(FedBuff):
    """Mutant FedBuff: each update scaled by w(s + 1)."""

    def assemble(self, run: Any, ids: Tensor, updates: Tensor, staleness: Tensor) -> Any:
        return super().assemble(run, ids, updates, staleness + 1)


class NewestOnly(FedBuff):
    """Mutant FedBuff: every update's staleness taken as 0 (computed at the newest θ: no scaling)."""

    def assemble(self, run: Any, ids: Tensor, updates: Tensor, staleness: Tensor) -> Any:
        return super().assemble(run, ids, updates, torch.zeros_like(staleness))


RUNS = [(FedBuff(buffer_size=4, max_staleness=1), "signflip"),
        (FedBuff(buffer_size=3, max_staleness=2, byzantine_timing="always_first"), "labelflip"),
        (FedBuff(buffer_size=4, max_staleness=2, byzantine_timing="last_slot"), "signflip"),
        (FedBuff(buffer_size=4, max_staleness=2, byzantine_timing="at_bound"), "alie"),
        (FedBuff(buffer_size=3, max_staleness=1, byzantine_timing="replay"), "signflip"),
        (BASGD(buffers=3, max_staleness=1), "signflip")]


@pytest.mark.parametrize(("algo", "attack"), RUNS)
def test_every_step_is_the_step_as_written_before(algo: Asynchronous, attack: str) -> None:
    """FedBuff under every time attack (a vector attack, a data attack), and BASGD: 12 server steps, each the
    reference step's rows, workers and state (ring, touched rows, clock), bit for bit."""
    assert steps_agree(algo, attack)


@pytest.mark.parametrize("mutant", [OffByOne(buffer_size=4, max_staleness=2), NewestOnly(buffer_size=4,
                                                                                         max_staleness=2)])
def test_the_step_comparison_catches_a_wrong_scaling(mutant: FedBuff) -> None:
    """The comparison can fail: a FedBuff whose weights are off by one version, or ignore staleness, is not the
    reference step."""
    assert not steps_agree(mutant, "signflip")
