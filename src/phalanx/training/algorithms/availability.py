"""Worker availability from a client behaviour trace in FedScale's format (Lai et al., "FedScale: Benchmarking Model
and System Performance of Federated Learning at Scale", ICML 2022), on the simulated clock
(:mod:`~phalanx.training.algorithms.clock`; ``algorithm_params.availability``).

FedScale's format (its ``benchmark/dataset/data/device_info/README.md``, the ``client_behave_trace`` file): a pickled
dict ``{client_id: {"duration": INT, "inactive": [INT], "finish_time": INT, "active": [INT], "model": STRING}}``,
times in seconds. FedScale's rule (``fedscale/cloud/internal/client_metadata.py``, ``ClientMetadata.is_active``,
called by ``ClientManager.isClientActive`` and ``getFeasibleClients``): with ``norm = cur_time % finish_time``, the
client is active iff ``active[j] <= norm <= inactive[j]`` for its current window j — closed windows, repeating with
period ``finish_time``. Here that is read as a *pure* function of (worker, time): active iff some j has
``active[j] <= norm <= inactive[j]`` (FedScale walks j with a stateful ``behavior_index`` that assumes increasing
query times; the pure reading is the same for those and needs no state — ours, so that a resumed run needs nothing
more than the clock's state). ``duration`` and ``model`` are not read. Client i of the trace in increasing client-id
order is worker i (FedScale's ``ClientManager.register_client`` maps a client to key ``client_id % len(trace)`` in
the file's key order — ours differs, like :mod:`~phalanx.training.algorithms.traces`).

A client that goes offline while training: FedScale's ``Aggregator.tictak_client_tasks``
(``fedscale/cloud/aggregation/aggregator.py``) drops a sampled client from the round when ``isClientActive(client,
round_duration + global_virtual_clock)`` is false — it checks the completion instant only. Ours is stricter, and
ours: an update is lost when its computation [start, start + 1/vᵢ] is not inside one availability window (it spans
an inactive time); it is never aggregated, counted in the clock's ``unavailable`` statistic, and the worker starts
again at the start of its next window, on the model version it was sent (it keeps the model it downloaded; the
staleness bound drops it if that grows too old). A worker starts only while available: one the clock would start at
an unavailable instant starts at its next available instant (FedScale samples only clients online at the round's
start; with ``concurrency`` ours samples among all idle workers and a sampled one starts when it comes online).

Time scale: trace time = simulated time × ``availability_scale`` (trace seconds per simulated time unit; default
:data:`SCALE` = 60 — a median-speed update takes one unit, a minute of device time; FedScale's own default task of
20 local steps of batch 20 at a median 100 ms/sample latency takes 3 × 400 × 0.1 s = 2 minutes).

Why the clock never stalls (:meth:`Availability.check`, before anything runs): every worker must have a window at
least as long as its update (time attackers take no time: any window). A worker's windows repeat every period, so
from any instant it reaches such a window within one period plus one window, and the retries of
:meth:`Availability.schedule` end there; every worker in flight therefore has a finite arrival, and the clock's own
argument (:mod:`~phalanx.training.algorithms.clock`: the ≥ K workers started on version t + 1 arrive in step t + 1
with staleness 0) holds unchanged — staleness is counted in server steps, not time, so waiting for a window delays
an arrival but never makes it unacceptable in the step after its start. A trace or a time scale under which some
worker never completes an update is refused in one line naming the worker and the file.

A trace is a hostile file until read, with :mod:`~phalanx.training.algorithms.traces`'s safety: at most
:data:`MAX_BYTES`, unpickled with no globals at all, checked entry by entry (non-empty lists of the same length of
finite non-negative times, ``active[0] <= inactive[0] <= active[1] <= …`` alternating and sorted, ``finish_time`` a
finite number > 0); any defect is one line naming the file. Windows beyond ``finish_time`` are never reached
(``norm < finish_time``) and are cut there. ``availability = "fedscale:sample"`` reads a small sample shipped with
Phalanx (32 clients, :func:`sample_table`, written by ``scripts/make_fedscale_availability_sample.py``): synthetic,
seeded, not measured devices.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError
from phalanx.training.algorithms import traces

PARAMETER = "algorithm_params.availability"
PREFIX = "fedscale:"
ALLOWED = ("'always' (every worker always available) or 'fedscale:PATH' ('fedscale:sample': the shipped one), a "
           "FedScale client behaviour trace")
MAX_BYTES = 64 * 2**20
"""The largest trace read (64 MiB)."""
SCALE = 60.0
"""The default ``availability_scale``: trace seconds per simulated time unit."""
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "_files" / "fedscale_client_behave_sample.pkl"


def trace_error(path: str | Path, problem: str) -> ConfigError:
    """A behaviour trace that cannot be read as FedScale's format: one line naming the file."""
    return ConfigError(PARAMETER, f"{PREFIX}{path}", f"a FedScale client behaviour trace ({problem})")


def check_spec(spec: Any, scale: Any) -> None:
    """The key's value and the scale, refused in one line (the file is read by :func:`load`)."""
    if not (spec == "always" or (isinstance(spec, str) and spec.startswith(PREFIX) and len(spec) > len(PREFIX))):
        raise ConfigError(PARAMETER, spec, ALLOWED)
    ok = isinstance(scale, int | float) and not isinstance(scale, bool) and math.isfinite(scale) and scale > 0
    if not ok:
        raise ConfigError("algorithm_params.availability_scale", scale, "a finite number > 0 (trace seconds per "
                          "simulated time unit)")


def sample_table(clients: int = 32, seed: int = 36) -> dict[int, dict[str, Any]]:
    """The shipped sample's table (its file is ``pickle.dumps(sample_table(), protocol=4)``): ``clients`` client ids
    from 0 … 99 999, a period (``finish_time``) of 6 hours, alternating online and offline spells with exponential
    lengths (means 40 and 20 minutes), every client online at least once for an hour; integer seconds, seeded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    period = 6 * 3600
    ids = sorted(int(x) for x in torch.randperm(100000, generator=g)[:clients])
    table: dict[int, dict[str, Any]] = {}
    for cid in ids:
        active: list[int] = []
        inactive: list[int] = []
        t = int(torch.randint(0, 1800, (1,), generator=g))
        long_one = int(torch.randint(0, 4, (1,), generator=g))
        while t < period:
            on = -2400 * math.log(float(torch.rand(1, generator=g, dtype=torch.float64)) + 1e-12)
            off = -1200 * math.log(float(torch.rand(1, generator=g, dtype=torch.float64)) + 1e-12)
            if len(active) == long_one:
                on = max(on, 3600.0)
            end = min(period, t + max(60, int(on)))
            active.append(t)
            inactive.append(end)
            t = end + max(60, int(off))
        table[cid] = {"duration": sum(e - a for a, e in zip(active, inactive)), "inactive": inactive,
                      "finish_time": period, "active": active, "model": "synthetic"}
    return table


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Windows:
    """One worker's availability, in simulated time: closed windows [starts[j], ends[j]] of one period (sorted,
    disjoint, not touching), repeating every ``period``; the last may end after the period (it runs on into the next
    one's start); ``always``: available at every instant."""

    starts: tuple[float, ...]
    ends: tuple[float, ...]
    period: float
    always: bool = False

    @classmethod
    def of(cls, active: list[float], inactive: list[float], finish: float, scale: float) -> Windows:
        """A client's windows: cut at ``finish``, touching ones merged, the last joined to the next period's first
        when one ends at the period's end and the other starts at 0."""
        merged: list[list[float]] = []
        for a, e in zip(active, inactive):
            if a >= finish:
                break
            e = min(e, finish)
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([a, e])
        period = finish / scale
        if len(merged) == 1 and merged[0] == [0, finish]:
            return cls((0.0,), (math.inf,), period, always=True)
        if len(merged) > 1 and merged[0][0] == 0 and merged[-1][1] == finish:
            first = merged.pop(0)
            merged[-1][1] = finish + first[1]
        return cls(tuple(a / scale for a, _ in merged), tuple(e / scale for _, e in merged), period)

    def longest(self) -> float:
        return math.inf if self.always else max((e - a for a, e in zip(self.starts, self.ends)), default=-math.inf)

    def available(self, t: float) -> bool:
        """Whether the worker is available at simulated time t ≥ 0 (a pure function of t)."""
        return self.always or (bool(self.starts) and self._locate(t)[2])

    def _locate(self, t: float) -> tuple[int, int, bool]:
        """(k, j, inside): t is in window j of period k when ``inside``, else window (k, j) is the next one."""
        p, w = self.period, len(self.starts)
        k = math.floor(t / p)
        u = t - k * p
        if self.ends[-1] > p and u <= self.ends[-1] - p:  # in the window that runs on from the previous period
            return k - 1, w - 1, True
        j = bisect.bisect_right(self.starts, u) - 1
        if j >= 0 and u <= self.ends[j]:
            return k, j, True
        return (k, j + 1, False) if j + 1 < w else (k + 1, 0, False)

    def schedule(self, now: float, d: float) -> tuple[float, int]:
        """When an update of length d asked for at ``now`` starts and how many attempts are lost before it: it starts
        at ``now`` if available, else at the next window's start; an attempt whose [start, start + d] leaves its
        window is lost and the next one starts at the next window's start (bounded: :meth:`Availability.check`
        guarantees a window of length ≥ d)."""
        if self.always:
            return now, 0
        k, j, inside = self._locate(now)
        lost = 0
        if inside:
            if d <= k * self.period + self.ends[j] - now:
                return now, 0
            lost = 1
            k, j = (k, j + 1) if j + 1 < len(self.starts) else (k + 1, 0)
        for _ in range(len(self.starts) + 1):
            if d <= self.ends[j] - self.starts[j]:
                return k * self.period + self.starts[j], lost
            lost += 1
            k, j = (k, j + 1) if j + 1 < len(self.starts) else (k + 1, 0)
        raise RuntimeError(f"no availability window of length {d} (Availability.check should have refused it)")


@dataclass(frozen=True)
class Availability:
    """The workers' availability (one :class:`Windows` per worker) read from the trace ``spec`` names."""

    spec: str
    windows: tuple[Windows, ...]

    def check(self, durations: list[float]) -> None:
        """Every worker has a window at least as long as its update (the module's docstring: the clock never
        stalls), refused in one line naming the worker and the file otherwise."""
        for i, (w, d) in enumerate(zip(self.windows, durations)):
            if w.longest() < d:
                raise ConfigError(PARAMETER, self.spec, f"a trace in which every worker can complete an update: "
                                  f"worker {i}'s longest online window is {max(w.longest(), 0.0):.6g} simulated units, "
                                  f"its update takes {d:.6g} (check algorithm_params.availability_scale)")

    def schedule(self, worker: int, now: float, d: float) -> tuple[float, int]:
        return self.windows[worker].schedule(now, d)


def parse(spec: str, scale: float, workers: int) -> Availability | None:
    """None for ``"always"``; else the first ``workers`` clients' windows, refused in one line (a trace of fewer
    clients, in which none of them is ever available, or with any defect)."""
    check_spec(spec, scale)
    if spec == "always":
        return None
    path = SAMPLE if spec == PREFIX + "sample" else Path(spec[len(PREFIX):])
    windows = _load(str(path), float(scale))
    if len(windows) < workers:
        raise ConfigError(PARAMETER, spec, f"a trace of at least as many clients as workers ({workers}); it has "
                          f"{len(windows)}")
    mine = windows[:workers]
    if not any(w.starts for w in mine):
        raise trace_error(path, f"none of its first {workers} clients is ever available")
    return Availability(spec, mine)


@functools.lru_cache(maxsize=8)
def _load(path: str, scale: float) -> tuple[Windows, ...]:
    """Every client's windows, in increasing client-id order (read once per file and scale)."""
    return tuple(Windows.of(a, e, f, scale) for a, e, f in read(Path(path)))


def read(path: Path) -> list[tuple[list[float], list[float], float]]:
    """Every client's (active, inactive, finish_time) of the trace at ``path``, checked (the module's docstring)."""
    table, ids = traces.read_table(path, MAX_BYTES, "{client_id: {'active': [...], 'inactive': [...], "
                                   "'finish_time': ...}}", trace_error)
    out = []
    for cid in ids:
        entry = table[cid]
        if not isinstance(entry, dict):
            raise trace_error(path, f"client {traces.shown(cid)}: not a dict")
        active, inactive, finish = entry.get("active"), entry.get("inactive"), entry.get("finish_time")
        if not (_number(finish) and finish > 0):  # type: ignore[operator]
            raise trace_error(path, f"client {traces.shown(cid)}: 'finish_time' must be a finite number > 0, got "
                              f"{traces.shown(finish)}")
        if not (isinstance(active, list) and isinstance(inactive, list) and len(active) == len(inactive)):
            raise trace_error(path, f"client {traces.shown(cid)}: 'active' and 'inactive' must be lists of the same "
                              "length")
        times = [x for pair in zip(active, inactive) for x in pair]
        if not all(_number(x) and x >= 0 for x in times):
            raise trace_error(path, f"client {traces.shown(cid)}: times must be finite numbers >= 0")
        if any(b < a for a, b in itertools.pairwise(times)):
            raise trace_error(path, f"client {traces.shown(cid)}: active/inactive times must alternate in "
                              "increasing order")
        out.append(([float(x) for x in active], [float(x) for x in inactive], float(finish)))  # type: ignore[arg-type]
    return out
