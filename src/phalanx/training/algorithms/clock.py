"""The simulated clock of an asynchronous run: who arrives when, on which model version, and which arrivals make a
server step — the state of an asynchronous round algorithm (:mod:`~phalanx.training.algorithms.asynchronous`).

The model. Worker i has a speed vᵢ > 0, drawn once from a declared distribution (``speeds``) with the run's seed;
each update it computes takes 1/vᵢ simulated time units. A worker starts an update on the model version the server
publishes (θ₀ at time 0), and delivers it at ``arrival = start + 1/vᵢ``. The server collects deliveries in time order
(ties: an always-first Byzantine worker first, then by worker index) into its buffer until the buffer is *full*
(the algorithm says when: K accepted updates for FedBuff, every buffer non-empty for BASGD), then steps: version
t → t + 1 at the time of the last delivery it took. An update that started from version v and arrives while the
server is at version t has staleness s = t − v; one with s > S (``max_staleness``) is dropped, counted and
recorded, never aggregated. Every worker that delivered in step t (accepted or dropped) starts its next update on
version t + 1 when it is published — so a worker delivers at most one update per server step, and a step never
waits on a worker whose update is already in it.

Why the steps never stall: the ≥ K workers that delivered in step t − 1 all start on version t and arrive with
s = 0 ≤ S, so FedBuff always finds K acceptable updates; for BASGD every buffer got an update in step t − 1, whose
worker starts on version t and arrives in step t with s = 0.

Concurrency (``concurrency`` C, FedBuff's "concurrency" — Nguyen et al., AISTATS 2022, Alg. 1 and §3: the server
keeps C clients training at once and starts a newly sampled one whenever an update comes back). Without it (C = n)
every worker is always computing, as above. With K ≤ C < n: at time 0, C workers sampled uniformly without
replacement start on θ₀ and the other n − C are *idle* (arrival = +∞: never in the delivery order). When step t
closes, every worker that delivered in it (accepted or dropped) becomes idle, and the server samples uniformly
without replacement, from all idle workers (those that just delivered included), as many as bring the number in
flight back to C; they start on version t + 1 at the step's time. The sample that starts workers on version v is
drawn from its own stream ``concurrency:<v>`` of the run's seed (:func:`~phalanx.training.streams.generator`: a
function of the seed and v alone, so a resumed run draws what the uninterrupted one drew, and no other stream moves).
Byzantine workers are sampled like everyone (a server admits only the clients it started); a time attack is played by
the Byzantine workers in flight. Staleness then scales like C/K rather than n/K (docs/async.md, "Concurrency").

Why the steps never stall, with C: exactly C workers are in flight after every step (at time 0 by construction;
after step t the d ≥ K that delivered leave, and d are started from the n − C + d idle ones). The d started on
version t + 1 are in step t + 1's delivery order with s = 0 ≤ S, so the order holds at least d ≥ K acceptable
updates and FedBuff's buffer fills. ``at_bound``'s held Byzantine workers do not change this: a held worker is still
in the order (after every honest delivery, :meth:`Clock.held`) and its update, held at s ≤ S, is acceptable — when the
honest ones in flight cannot fill the buffer, the held ones are taken (delivered before their bound: the attacker
loses its timing, the clock goes on); ``last_slot`` and ``always_first`` only reorder deliveries that exist. So no
configuration with K ≤ C ≤ n stalls, and none is refused beyond that range. BASGD (each of B buffers needs a worker
in flight hashed to it) and the filtering algorithms (whose zero step on processes waits for every live worker)
refuse the key: they always run every worker
(:meth:`~phalanx.training.algorithms.asynchronous.Asynchronous.check_concurrency`).

Availability (``availability``, :mod:`~phalanx.training.algorithms.availability`: FedScale's client behaviour
trace): a worker starts an update only while online — one asked to start (at time 0, after a step, or sampled under
concurrency) while offline starts at its next online instant — and an update whose computation leaves its online
window is lost (counted in ``unavailable``, never aggregated) and computed again from the next window's start on the
same version. Its arrival is the delivering attempt's end, so the clock's order and steps are as above; the
argument against a stall holds because every worker has a window long enough for its update (refused before the
run otherwise), so every arrival in flight is finite. Availability is a pure function of (worker, time): the state
holds nothing more, and ``"always"`` (the default) is the clock above, bit for bit.

Versions in flight: an update whose version is older than t − S will be dropped, so only versions t − S … t are
ever computed on — the algorithm keeps S + 1 model versions, a ring indexed by v mod (S + 1).

Time attacks (``byzantine_timing``): ``"honest"`` — Byzantine workers run at the speeds the distribution gave them;
``"always_first"`` — they take no time at all and are served before every honest delivery of the same instant: each
Byzantine worker delivers (on the freshest version, s = 0) at the start of every server step, so they fill the
first min(b, K) places of every FedBuff buffer, a share b/K > b/n when K < n (the threat model of docs/async.md);
``"last_slot"`` — they take no time and wait for the buffer's boundary: they deliver right before the honest
delivery that would have filled the buffer (the honest deliveries of the step but its last, then the Byzantine
ones, then the rest), so the buffer closes on a Byzantine update — FedBuff's last place, BASGD's last empty buffer
when it is one of theirs; ``"at_bound"`` — they take no time and hold each update until it is exactly as stale as
the bound allows: a Byzantine worker delivers (first) only at the step where its staleness is S, computed on the
oldest version the server still accepts (one held longer would be dropped, counted and recorded like any update);
``"replay"`` — always first, and what they send is a *stale replay*: the honest update the server aggregated S + 1
steps earlier (older than the bound), re-sent as the worker's fresh update
(:class:`~phalanx.training.algorithms.asynchronous.AsyncWorkers`). The staleness the server records is the version
it sent the worker, never a tag the update carries: the replay is recorded as fresh, and the bound does not see it.

Everything is tensors (checkpointed with the run, :meth:`Clock.state`): ``speed (n,)``, ``arrival (n,)`` float64
(+∞: an idle worker, only with C < n — exactly n − C of them),
``version (n,)`` int64, and ``stats`` float64 — a resumed run's clock is the uninterrupted one's, bit for bit. A
step's work on them runs in NumPy on zero-copy views (a few small operations on n entries cost less there than as
torch calls), the torch computation's result bit for bit (tests/test_async_clock.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.algorithms import traces
from phalanx.training.algorithms.availability import Availability
from phalanx.training.streams import generator

TIMINGS = ("honest", "always_first", "last_slot", "at_bound", "replay")
"""The values of ``byzantine_timing``: the Byzantine workers' clock (the module's docstring)."""

STATS = ("sim_time", "dropped", "updates", "byzantine_updates", "staleness_mean", "staleness_max",
         "byzantine_buffer_share", "dropped_step", "byzantine_rows", "unavailable")
"""The entries of the clock's ``stats`` vector: the simulated time of the last step; totals over the run (dropped,
aggregated and Byzantine aggregated updates); the last step's staleness mean and max over its aggregated updates,
the Byzantine share of its buffer, the updates it dropped, and how many rows of the rule's input a Byzantine update
touched (FedBuff: its Byzantine updates; BASGD: its Byzantine-touched buffers); and the total of updates lost to a
worker going offline while computing (:mod:`~phalanx.training.algorithms.availability`; counted when the worker is
started: the attempts it will lose before the update it delivers)."""

_SPEC = re.compile(r"^\s*(constant|lognormal)\s*(?:\(\s*([^)]*?)\s*\))?\s*$")
SPEEDS_ALLOWED = ("'constant', 'lognormal(sigma)' with sigma > 0 (speed = exp(sigma·z), z ~ N(0, 1)), "
                  "'fedscale:PATH' (a FedScale device-capacity trace; 'fedscale:sample' the shipped one), or a list "
                  "of one speed > 0 per worker")


@dataclass(frozen=True)
class Speeds:
    """A declared distribution of the workers' speeds: ``constant`` (all 1), ``lognormal`` (exp(σ z), z ~ N(0, 1),
    median 1), ``listed`` speeds, one per worker, or a ``trace``'s, the first n clients'
    (:mod:`~phalanx.training.algorithms.traces`)."""

    kind: str
    sigma: float = 0.0
    listed: tuple[float, ...] = ()

    @classmethod
    def parse(cls, spec: Any, parameter: str = "algorithm_params.speeds") -> Speeds:
        """The distribution ``spec`` names; a one-line :class:`ConfigError` naming ``parameter`` otherwise."""
        if isinstance(spec, Sequence) and not isinstance(spec, str):
            values = list(spec)
            ok = values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            if not ok or not all(math.isfinite(v) and v > 0 for v in values):
                raise ConfigError(parameter, spec, SPEEDS_ALLOWED)
            return cls("listed", listed=tuple(float(v) for v in values))
        if isinstance(spec, str) and spec.startswith(traces.PREFIX):
            return cls("trace", listed=traces.load(spec))
        m = _SPEC.match(spec) if isinstance(spec, str) else None
        if m is None:
            raise ConfigError(parameter, spec, SPEEDS_ALLOWED)
        kind, arg = m.group(1), m.group(2)
        if kind == "constant":
            if arg:
                raise ConfigError(parameter, spec, SPEEDS_ALLOWED)
            return cls("constant")
        try:
            sigma = float(arg or "")
        except ValueError:
            raise ConfigError(parameter, spec, SPEEDS_ALLOWED) from None
        if not (math.isfinite(sigma) and sigma > 0):
            raise ConfigError(parameter, spec, SPEEDS_ALLOWED)
        return cls("lognormal", sigma=sigma)

    def check(self, workers: int, parameter: str = "algorithm_params.speeds") -> None:
        """Listed speeds: exactly one per worker; a trace: at least one client per worker."""
        if self.kind == "listed" and len(self.listed) != workers:
            raise ConfigError(parameter, f"{len(self.listed)} speeds", f"one speed > 0 per worker ({workers})")
        if self.kind == "trace" and len(self.listed) < workers:
            raise ConfigError(parameter, f"a trace of {len(self.listed)} clients", f"a trace of at least as many "
                              f"clients as workers ({workers})")

    def draw(self, workers: int, seed: int) -> Tensor:
        """The n speeds, float64, from the run's ``clock`` stream (no round stream is touched)."""
        self.check(workers)
        if self.kind in ("listed", "trace"):
            return torch.tensor(self.listed[:workers], dtype=torch.float64)
        if self.kind == "constant":
            return torch.ones(workers, dtype=torch.float64)
        z = torch.randn(workers, generator=generator(seed, "clock"), dtype=torch.float64)
        return torch.exp(self.sigma * z)


@dataclass
class Step:
    """One server step's deliveries, in arrival order: the worker, the version its update started from and its
    staleness, for the accepted (``ids``) and the dropped (``dropped``) ones; ``time`` the step's simulated time;
    ``delivered`` (optional) every worker that delivered, accepted or dropped, in delivery order — the workers
    :meth:`Clock.advance` restarts, kept so that it need not concatenate ``ids`` and ``dropped`` again (None: it
    does)."""

    ids: Tensor
    versions: Tensor
    staleness: Tensor
    dropped: Tensor
    time: float
    delivered: Tensor | None = None


class Clock:
    """The simulated clock (see the module's docstring) of ``n`` workers, the last ``byzantine`` of them Byzantine,
    over the state tensors ``speed``, ``arrival``, ``version`` (never changed in place: :meth:`advance` returns new
    ones)."""

    def __init__(self, *, workers: int, byzantine: int, max_staleness: int, timing: str,
                 concurrency: int | None = None, seed: int = 0, availability: Availability | None = None) -> None:
        if timing not in TIMINGS:
            raise ConfigError("algorithm_params.byzantine_timing", timing, "one of " + ", ".join(TIMINGS))
        self.n, self.b, self.bound, self.timing = workers, byzantine, max_staleness, timing
        self.c = workers if concurrency is None else concurrency
        """C, the workers in flight at once (n: every worker, the clock without concurrency)."""
        if not 1 <= self.c <= workers:
            raise ConfigError("algorithm_params.concurrency", concurrency, f"an integer in 1..{workers} (workers)")
        self.seed = seed
        self.availability = availability
        """When each worker is online (None: always, :mod:`~phalanx.training.algorithms.availability`)."""
        self.byz = torch.zeros(workers, dtype=torch.bool)
        self.byz[workers - byzantine:] = byzantine > 0
        self.instant = self.byz & (timing != "honest")  # a time attacker takes no time: it chooses when to deliver
        self.first = self.byz & (timing in ("always_first", "replay"))  # served first at a tie
        # the per-step work runs in NumPy on zero-copy views of the state's tensors (a step's few small operations
        # on n entries cost less there than as torch calls); the masks as arrays, and the tie order of the
        # always-first workers (their indices, then the others', each ascending) computed once
        self._byz, self._instant = self.byz.numpy(), self.instant.numpy()
        self._first = self.first.numpy()
        self._ahead: np.ndarray | None = None
        self._head = 16
        """How much of the order :meth:`collect` sorts first (twice the last step's prefix; speed only, never the
        result)."""
        if byzantine and bool(self.first.any()):
            self._ahead = np.argsort((~self.first).numpy().astype(np.int8), kind="stable")
        self._speed: Tensor | None = None
        self._d = np.zeros(0)
        """The durations of :meth:`durations` for the state's ``speed`` tensor (the same object from step to step:
        :meth:`advance` passes it on), as an array — computed again for any other tensor (a resumed state)."""

    def durations(self, speed: Tensor) -> Tensor:
        """How long each worker's update takes: 1/vᵢ (0 for a Byzantine worker that attacks the clock)."""
        return torch.where(self.instant, torch.zeros_like(speed), 1.0 / speed)

    def start(self, speed: Tensor) -> dict[str, Tensor]:
        """Time 0: every worker starts on version 0 — with C < n, C of them sampled (:meth:`sample`), the rest idle
        (arrival +∞)."""
        stats = torch.zeros(len(STATS), dtype=torch.float64)
        arrival = self.durations(speed)
        idle = np.zeros(self.n, dtype=bool)
        if self.c < self.n:
            idle[:] = True
            idle[self.sample(np.arange(self.n), self.c, 0)] = False
            arrival = arrival.masked_fill(torch.from_numpy(idle), math.inf)
        if self.availability is not None:
            went = np.flatnonzero(~idle)
            times, lost = self.online(went, 0.0, as_numpy(arrival)[went])
            arrival = arrival.clone()
            arrival[torch.from_numpy(went)] = times
            stats[-1] = lost
        return {"speed": speed, "arrival": arrival, "version": torch.zeros(self.n, dtype=torch.int64), "stats": stats}

    def online(self, went: np.ndarray, now: float, d: np.ndarray) -> tuple[Tensor, int]:
        """The arrival times of the workers ``went`` asked to start at ``now`` on updates taking ``d``, each started
        at its next available instant and again after each attempt lost to going offline, and how many are lost
        (:meth:`~phalanx.training.algorithms.availability.Windows.schedule`)."""
        assert self.availability is not None
        out, lost = np.empty(went.size, dtype=np.float64), 0
        for m, (i, di) in enumerate(zip(went.tolist(), d.tolist())):
            s, gone = self.availability.schedule(i, now, di)
            out[m], lost = s + di, lost + gone
        return torch.from_numpy(out), lost

    def sample(self, idle: np.ndarray, need: int, version: int) -> np.ndarray:
        """``need`` of the ``idle`` workers (ascending indices), uniformly without replacement: the ones started on
        ``version``, drawn from the stream ``concurrency:<version>`` of the run's seed (the module's docstring)."""
        perm = torch.randperm(idle.size, generator=generator(self.seed, f"concurrency:{version}")).numpy()
        return np.asarray(idle[perm[:need]])

    def order(self, arrival: Tensor) -> Tensor:
        """The workers in delivery order: by arrival time, then always-first ones, then by index (a stable lexical
        sort, so the order is a function of the state alone; an idle worker's +∞ sorts last)."""
        return torch.from_numpy(self._order(as_numpy(arrival)))

    def _order(self, arrival: np.ndarray) -> np.ndarray:
        """:meth:`order` on a NumPy view: a stable sort is one permutation whatever sorts it (no NaN: a state's
        arrival times are finite or +∞, :meth:`check_state`)."""
        if self._ahead is None:  # nobody is served first at a tie: one sort, the same order
            return arrival.argsort(kind="stable")
        return self._ahead[arrival[self._ahead].argsort(kind="stable")]

    def collect(self, state: dict[str, Tensor], t: int, full: Any) -> Step:
        """The deliveries of server step t: in delivery order, up to the first prefix whose accepted updates make the
        buffer full — ``full(ids, accepted)`` returns that prefix's length, given the workers in delivery order and
        whether each update is within the staleness bound (CPU tensors), 0 when they do not fill it.

        Where the order is by arrival alone (every timing but ``last_slot`` and ``at_bound``, which reorder the whole
        of it), only its leading part is sorted first — the workers due no later than the m-th earliest arrival, m
        twice the last step's prefix — and ``full`` sees that part: the buffer's prefix is a function of the prefix
        alone (:meth:`~phalanx.training.algorithms.asynchronous.Asynchronous.full`), so a part that fills it gives
        the whole order's answer, and one that does not (0) is followed by the whole order."""
        arrival, version = as_numpy(state["arrival"]), as_numpy(state["version"])
        live = self.c  # in flight: the first C of the order (an idle worker's +∞ sorts last, never taken)
        oldest = t - self.bound  # accepted: staleness t − v <= S, i.e. v >= t − S (integers: the same test)
        order: np.ndarray | None = None
        by_arrival = self.timing not in ("last_slot", "at_bound")
        if self._head < live and by_arrival:
            order = self._leading(arrival, self._head)
            versions = version[order]
            accepted = versions >= oldest
            end = int(full(torch.from_numpy(order), torch.from_numpy(accepted)))
            if not 0 < end <= order.size:
                order = None
        if order is None:
            order = self._order(arrival)
            if live < self.n:
                order = order[:live]
            if self.timing == "last_slot":
                order = as_numpy(self.before_last(torch.from_numpy(order), torch.from_numpy(t - version), full))
            elif self.timing == "at_bound":
                order = as_numpy(self.held(torch.from_numpy(order), torch.from_numpy(t - version)))
            versions = version[order]
            accepted = versions >= oldest
            end = int(full(torch.from_numpy(order), torch.from_numpy(accepted)))
        if not 0 < end <= live:  # cannot happen (the module's docstring argues why): a defect, said so
            raise RuntimeError(f"the simulated clock found no full buffer at step {t}")
        self._head = max(16, 2 * end)
        taken, ok, versions = order[:end], accepted[:end], versions[:end]
        # The latest delivery taken, not the last in order: a time attacker's order (last_slot, at_bound) puts an
        # instant Byzantine delivery after honest ones that arrive later — time must not run back to it. In an
        # order by arrival alone the last one taken is the latest (ascending, ties equal).
        latest = float(arrival[taken[-1]]) if by_arrival else float(arrival[taken].max())
        time = max(float(as_numpy(state["stats"])[0]), latest)
        kept = ok.nonzero()[0]
        if kept.size == end:  # nothing dropped: the prefix as it is, no copies
            return Step(torch.from_numpy(taken), torch.from_numpy(versions), torch.from_numpy(t - versions),
                        torch.from_numpy(taken[:0]), time)
        versions = versions[kept]
        return Step(torch.from_numpy(taken[kept]), torch.from_numpy(versions), torch.from_numpy(t - versions),
                    torch.from_numpy(taken[~ok]), time, torch.from_numpy(taken))

    def _leading(self, arrival: np.ndarray, m: int) -> np.ndarray:
        """The leading part of :meth:`_order`: every worker due no later than the m-th earliest arrival (ties
        included, so it is a prefix of the whole order), in the same order. m < C: the m-th earliest is finite, so
        no idle worker (+∞) is in it."""
        due = (arrival <= np.partition(arrival, m - 1)[m - 1]).nonzero()[0]  # ascending index
        if self._ahead is not None:  # the always-first ones ahead, each side by index
            due = due[(~self._first[due]).argsort(kind="stable")]
        return due[arrival[due].argsort(kind="stable")]

    def before_last(self, order: Tensor, staleness: Tensor, full: Any) -> Tensor:
        """``last_slot``: the deliveries that fill the buffer with the Byzantine ones served last — the honest ones but
        the last, then the Byzantine ones, then the rest: the buffer's last place goes to a Byzantine update."""
        o = as_numpy(order)
        is_b = self._byz[o]
        honest, byz = o[~is_b], o[is_b]
        merged = np.concatenate([honest, byz])
        end = int(full(torch.from_numpy(merged), torch.from_numpy(as_numpy(staleness)[merged] <= self.bound)))
        if not byz.size or not 0 < end <= honest.size:  # the buffer needs them anyway (or cannot fill)
            return torch.from_numpy(merged)
        return torch.from_numpy(np.concatenate([honest[: end - 1], byz, honest[end - 1:]]))

    def held(self, order: Tensor, staleness: Tensor) -> Tensor:
        """``at_bound``: the Byzantine updates exactly S versions old (or older) first, then the honest deliveries,
        then the Byzantine updates still being held."""
        o = as_numpy(order)
        is_b = self._byz[o]
        ready = is_b & (as_numpy(staleness)[o] >= self.bound)
        return torch.from_numpy(np.concatenate([o[ready], o[~is_b], o[is_b & ~ready]]))

    def advance(self, state: dict[str, Tensor], t: int, step: Step, byzantine_rows: int) -> dict[str, Tensor]:
        """The state after step t: every worker that delivered starts on version t + 1 at the step's time, taking
        1/vᵢ (0 for a time attacker: :meth:`durations`) — with C < n, every worker that delivered becomes idle and
        as many as it took are sampled from all the idle ones (:meth:`sample`); the stats updated (the totals, and
        the step's own)."""
        arrival, version = as_numpy(state["arrival"]).copy(), as_numpy(state["version"]).copy()
        ids, dropped = as_numpy(step.ids), as_numpy(step.dropped)
        # (the order of the workers restarted does not matter: each one's new arrival is its own)
        went = ids if not dropped.size else np.concatenate([ids, dropped]) if step.delivered is None else \
            as_numpy(step.delivered)
        if self.c < self.n:
            arrival[went] = math.inf
            idle = np.flatnonzero(np.isinf(arrival))
            went = self.sample(idle, self.c - (self.n - idle.size), t + 1)
        d = self._durations(state["speed"])[went]
        old = state["stats"].tolist()
        lost = 0
        if self.availability is None:
            arrival[went] = step.time + d
        else:
            times, lost = self.online(went, step.time, d)
            arrival[went] = times.numpy()
        version[went] = t + 1
        k = int(ids.size)
        byz = int(np.count_nonzero(ids >= self.n - self.b)) if self.b else 0
        s = step.staleness.tolist()  # a step's few integers: Python's sum and max, exact
        # staleness is integral: its sum is exact, so sum / k is the float64 mean, correctly rounded
        stats = torch.from_numpy(np.array([step.time, old[1] + dropped.size, old[2] + k, old[3] + byz,
                                           sum(s) / k if k else 0.0, float(max(s)) if k else 0.0,
                                           byz / k if k else 0.0, float(dropped.size), float(byzantine_rows),
                                           old[9] + lost], dtype=np.float64))
        return {"speed": state["speed"], "arrival": torch.from_numpy(arrival), "version": torch.from_numpy(version),
                "stats": stats}

    def _durations(self, speed: Tensor) -> np.ndarray:
        """:meth:`durations` as an array, kept for the ``speed`` tensor it was computed for (elementwise: indexing it
        gives what computing the workers' own entries gives)."""
        if speed is not self._speed:
            self._d = np.where(self._instant, 0.0, 1.0 / as_numpy(speed))
            self._speed = speed
        return self._d

    def check_state(self, state: dict[str, Tensor]) -> None:
        """Refuse a clock state this clock cannot continue from (another population, a corrupted time)."""
        shapes = {"speed": (self.n,), "arrival": (self.n,), "version": (self.n,), "stats": (len(STATS),)}
        for key, shape in shapes.items():
            got = state.get(key)
            if got is None or tuple(got.shape) != shape:
                raise ConfigError("start", f"a clock state with {key} of shape "
                                  f"{None if got is None else tuple(got.shape)}", f"the clock of {self.n} workers, "
                                  f"{key} of shape {shape}")
        arrival = state["arrival"]
        idle = int(torch.isposinf(arrival).sum())
        if not (bool((torch.isfinite(arrival) | torch.isposinf(arrival)).all()) and bool((state["speed"] > 0).all())):
            raise ConfigError("start", "a clock state with a NaN or -inf arrival or a speed <= 0",
                              "finite arrival times (+inf: an idle worker) and speeds > 0")
        if idle != self.n - self.c:
            raise ConfigError("start", f"a clock state with {idle} idle workers (arrival +inf)",
                              f"n - concurrency = {self.n - self.c} idle workers (concurrency {self.c} of "
                              f"{self.n} workers)")


def as_numpy(x: Tensor) -> np.ndarray:
    """A CPU tensor's NumPy view (no copy); another device's, copied to the CPU."""
    try:
        return x.numpy()
    except (RuntimeError, TypeError):  # on another device, or part of a graph
        return x.detach().cpu().numpy()


def columns(stats: Tensor) -> dict[str, Any]:
    """The metric columns of a clock's ``stats``: its entries by name, and the run's Byzantine share of the
    aggregated updates so far (``byzantine_buffer_share_mean``)."""
    out: dict[str, Any] = {name: float(v) for name, v in zip(STATS, stats.tolist())}
    for name in ("dropped", "updates", "byzantine_updates", "staleness_max", "dropped_step", "byzantine_rows"):
        out[name] = int(out[name])
    out["byzantine_buffer_share_mean"] = out["byzantine_updates"] / out["updates"] if out["updates"] else None
    return out
