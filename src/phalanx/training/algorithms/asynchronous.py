"""What every buffered asynchronous round algorithm shares (FedBuff, :mod:`~phalanx.training.algorithms.fedbuff`;
BASGD, :mod:`~phalanx.training.algorithms.basgd`; Kardam and Zeno++, :mod:`~phalanx.training.algorithms.kardam`,
:mod:`~phalanx.training.algorithms.zenopp`): the simulated clock as the algorithm's state, the versions of θ in
flight, the batched computation of each server step's arrivals, an optional filter on each update (:meth:`screen`)
and the stale-replay attacker (``byzantine_timing = "replay"``, :func:`replayed`).

The loop's round is a *server step*: one aggregation of a full buffer. Server step t (the loop's round t):

1. θₜ joins the ring of model versions in flight (θ_{t−S} … θₜ, S = ``max_staleness``; ring slot t mod (S + 1));
2. the clock (:mod:`~phalanx.training.algorithms.clock`) delivers the updates of the step in arrival order until
   the algorithm's buffer is full (:meth:`Asynchronous.full`); an update from version v with t − v > S is dropped
   (counted in the clock's stats, never aggregated);
3. every accepted update is computed in **one batched call** (:meth:`~phalanx.training.problem.Problem.grads_each`:
   row i is worker i's minibatch gradient at θ of the version it started from) — the honest workers' on their own
   batches; a data attack's Byzantine workers' on poisoned batches; a vector attack's Byzantine updates are what the
   attack makes of the step's honest updates (omniscient: it sees them, the server's rule and, with a filter, the
   filter as an oracle — :func:`screen_oracle`);
4. an algorithm that filters (``screens``: Kardam, Zeno++) judges each update; a rejected one becomes a zero row,
   counted in its statistics (:data:`SCREEN`);
5. the algorithm turns the updates into the rows its rule aggregates (:meth:`Asynchronous.assemble`: FedBuff's
   staleness-weighted updates, BASGD's buffer means) and the loop's server steps θ with the run's rule and ``lr``.

Staleness is measured by the server (it knows which version it sent each worker), never taken from an update: a
Byzantine worker cannot claim to be fresh. The state — the ring of versions, the clock's speeds, arrival times,
versions and statistics — is the algorithm's own (``RoundState.own``, checkpointed under ``algorithm.``): a resumed
run is the uninterrupted one bit for bit (tests/test_async.py). On real processes (``engine = "torchrun"``, all
four) the server step is :mod:`phalanx.distributed.async_server`'s, which reuses :meth:`Asynchronous.full`,
:meth:`Asynchronous.assemble` and, per update as it arrives, :meth:`Asynchronous.screen`
(:mod:`phalanx.distributed.async_filters`; docs/async.md).

The clock's statistics become metric columns through a stage the algorithm brings (:class:`AsyncClock`):
``sim_time``, ``staleness_mean``, ``staleness_max``, ``dropped``, ``byzantine_buffer_share`` … on every evaluation
row.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.attacks.base import Attack, DataAttack
from phalanx.errors import ConfigError
from phalanx.training.algorithms import availability as online
from phalanx.training.algorithms import traces
from phalanx.training.algorithms.base import RoundAlgorithm, Run
from phalanx.training.algorithms.clock import STATS, TIMINGS, Clock, Speeds, columns
from phalanx.training.algorithms.dsgd import poison_rows
from phalanx.training.algorithms.fedavg import attack_rows
from phalanx.training.server import RoundResult, Server, detection_auc, honest_error
from phalanx.training.shards import sample_batches_of
from phalanx.training.stages.base import Evaluation, Stage
from phalanx.training.state import Received
from phalanx.training.streams import restored
from phalanx.validate import check_int

CLOCK_KEYS = ("speed", "arrival", "version", "stats")
RING = "thetas"
REPLAY, REPLAY_AT = "replay", "replay_at"
"""The state keys of the stale-replay attacker (``byzantine_timing = "replay"``): the first honest update aggregated
in each of the last S + 1 steps, and the step each was stored at (−1: none)."""
SCREENED = "screened"
"""The algorithm's state key of a filter's statistics (:data:`SCREEN`)."""
SCREEN = ("rejected", "rejected_step", "byzantine_rejected", "honest_rejected")
"""A filter's statistics (Kardam, Zeno++): updates it rejected over the run and in the last step, and the run's
rejected Byzantine and honest updates."""
TOUCHED = "byzantine_rows"
"""The algorithm's state key of the last step's mask of rule rows a Byzantine update touched (the server measures
with it)."""


class AsyncClock(Stage):
    """The metric columns of an asynchronous run's clock (simulated time, staleness, drops, the Byzantine share of the
    buffer), and the holder of the run's clock state between server steps (one per run: the algorithm object may be
    shared by runs)."""

    name = "async_clock"
    side = "server"
    brought_by = "algorithm fedbuff, basgd, kardam or zenopp"
    reference = "the simulated clock of phalanx.training.algorithms.clock (docs/async.md)"

    def __init__(self) -> None:
        self.own: dict[str, Tensor] = {}
        self.made: dict[str, Tensor] | None = None
        """The state the run's last server step returned (identity: :meth:`Asynchronous.load_state` takes it
        unchecked)."""

    def column_names(self) -> tuple[str, ...]:
        return (*STATS, "byzantine_buffer_share_mean")

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        if "stats" not in self.own:
            return dict.fromkeys(self.column_names())
        return columns(self.own["stats"])


class ScreenedClock(AsyncClock):
    """:class:`AsyncClock` with a filter's columns (:data:`SCREEN`: what Kardam's or Zeno++'s test rejected)."""


    def column_names(self) -> tuple[str, ...]:
        return (*super().column_names(), *SCREEN)

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        out = super().columns(ev)
        screened = self.own.get(SCREENED)
        values = [None] * len(SCREEN) if screened is None else [int(v) for v in screened.tolist()]
        return {**out, **dict(zip(SCREEN, values))}


def clock_stage(run: Run) -> AsyncClock:
    """The run's :class:`AsyncClock` (every run of an asynchronous algorithm has one: the algorithm brings it)."""
    for stage in getattr(run, "stages", ()):
        if isinstance(stage, AsyncClock):
            return stage
    raise ConfigError("stages", "a run without its async_clock stage", "the stages an asynchronous algorithm brings")


def _dimension(run: Any) -> int:
    """The model's number of parameters, d: the run's problem's, or before it is built (the run's checks come first)
    its model's (a ``Problem`` or a module)."""
    problem: Any = getattr(run, "problem", None) or getattr(run, "model", None)
    dim = getattr(problem, "dim", None)
    if dim is None:
        dim = sum(p.numel() for p in problem.parameters()) if hasattr(problem, "parameters") else 0
    return int(dim)


@dataclass(frozen=True)
class Asynchronous(RoundAlgorithm):
    """The base of a buffered asynchronous algorithm (see the module's docstring). ``batch_size``: samples per
    update; ``max_staleness``: S, the oldest version an aggregated update may start from is t − S; ``speeds``: the
    workers' speed distribution (:class:`~phalanx.training.algorithms.clock.Speeds`); ``byzantine_timing``: the
    Byzantine workers' clock, ``"honest"`` or ``"always_first"``; ``concurrency``: C, how many workers compute at
    once (FedBuff's concurrency, Nguyen et al., AISTATS 2022, Alg. 1; None: every worker —
    :mod:`~phalanx.training.algorithms.clock`; on processes :mod:`phalanx.distributed.async_credit`);
    ``availability``: when each worker is online (``"always"``, or a FedScale client behaviour trace, with
    ``availability_scale`` trace seconds per simulated unit — :mod:`~phalanx.training.algorithms.availability`);
    ``trace_bandwidth``: with a device-capacity trace for ``speeds``, an update's time is FedScale's completion time,
    computation plus the model's upload and download over the client's bandwidth
    (:func:`~phalanx.training.algorithms.traces.load_with_bandwidth`; default: the computation alone)."""

    batch_size: int = 32
    max_staleness: int = 4
    speeds: Any = "lognormal(1.0)"
    byzantine_timing: str = "honest"
    concurrency: int | None = None
    availability: str = "always"
    availability_scale: float = online.SCALE
    trace_bandwidth: bool = False

    missing_word = "workers"
    knowledge: ClassVar[tuple[str, ...]] = ("omniscient",)
    topologies: ClassVar[tuple[str, ...]] = ("server",)
    lr_role = "server"
    reference: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_int("algorithm_params.batch_size", self.batch_size, low=1)
        check_int("algorithm_params.max_staleness", self.max_staleness, low=0)
        Speeds.parse(self.speeds)
        if isinstance(self.speeds, list):  # a config's list: kept as a tuple (the algorithm is frozen and hashable)
            object.__setattr__(self, "speeds", tuple(self.speeds))
        if self.byzantine_timing not in TIMINGS:
            raise ConfigError("algorithm_params.byzantine_timing", self.byzantine_timing,
                              "one of " + ", ".join(TIMINGS))
        if self.concurrency is not None:
            check_int("algorithm_params.concurrency", self.concurrency, low=1)
        online.check_spec(self.availability, self.availability_scale)
        if not isinstance(self.trace_bandwidth, bool):
            raise ConfigError("algorithm_params.trace_bandwidth", self.trace_bandwidth, "true or false")
        if self.trace_bandwidth and not (isinstance(self.speeds, str) and self.speeds.startswith(traces.PREFIX)):
            raise ConfigError("algorithm_params.trace_bandwidth", True, "true only with speeds = 'fedscale:PATH' (a "
                              "device-capacity trace holds the bandwidths)", f"speeds is {self.speeds!r}")

    def worker_speeds(self, workers: int, seed: int, dim: int) -> Tensor:
        """The n workers' speeds (float64): the ``speeds`` distribution's draw, or with ``trace_bandwidth`` the
        trace's completion-time speeds for a model of ``dim`` parameters and this ``batch_size``."""
        if self.trace_bandwidth:
            speeds = Speeds("trace", listed=traces.load_with_bandwidth(str(self.speeds), dim, self.batch_size))
            return speeds.draw(workers, seed)
        return Speeds.parse(self.speeds).draw(workers, seed)

    def online(self, workers: int, byzantine: int, seed: int, dim: int) -> online.Availability | None:
        """The workers' availability (None: always), refused in one line when the trace has fewer clients than
        workers, is defective, or leaves a worker no window long enough for its update (a time attacker's takes no
        time) — the clock would stall (:mod:`~phalanx.training.algorithms.availability`)."""
        avail = online.parse(self.availability, self.availability_scale, workers)
        if avail is not None:
            speed = self.worker_speeds(workers, seed, dim)
            instant = torch.arange(workers) >= workers - byzantine if self.byzantine_timing != "honest" else None
            d = 1.0 / speed
            avail.check((d if instant is None else d.masked_fill(instant, 0.0)).tolist())
        return avail

    # --- what an asynchronous algorithm declares -------------------------------------------------------------------

    @abstractmethod
    def full(self, workers: int, order: Tensor, accepted: Tensor) -> int:
        """How many of the deliveries, in delivery order (``order``: worker indices; ``accepted``: within the
        staleness bound), the step takes: the shortest prefix whose accepted updates fill the buffer, 0 when none
        does. A function of that prefix alone: the clock may pass only a leading part of the order first
        (:meth:`~phalanx.training.algorithms.clock.Clock.collect`)."""

    @abstractmethod
    def assemble(self, run: Run, ids: Tensor, updates: Tensor, staleness: Tensor) -> tuple[Tensor, list[int] | None,
                                                                                         Tensor]:
        """The step's rows for the rule from its accepted updates (row i: worker ``ids[i]``, staleness
        ``staleness[i]``): the rows, the worker each row is (None: not one worker's), and which rows a Byzantine
        update touched (``(m,)`` bool, on the CPU). ``updates`` is the caller's own, made for this call (every
        caller stacks or computes it afresh): an algorithm may return it scaled in place (FedBuff does — no second
        ``(m, d)`` tensor a step)."""

    def population(self, workers: int) -> str:
        return self.population_key

    concurrent: ClassVar[bool] = False
    """It takes ``concurrency`` (C workers in flight): FedBuff only, not a filtering subclass — BASGD's B buffers could
    each lack a worker in flight (a stall), and a filtering algorithm's zero step on processes waits for every live
    worker (:mod:`~phalanx.distributed.async_zero`), which fewer workers in flight never all send."""

    def check_concurrency(self, workers: int, where: str = "workers", silent: int = 0) -> None:
        """C in K + ``silent``..n (n: ``workers``, the computing workers — on processes n − 1), refused in one line
        otherwise; with an algorithm that is not :attr:`concurrent` (or filters) the key must be absent.

        ``silent``: how many credit holders may never deliver — on processes the configured f, since a Byzantine
        rank with its own valid key can take its credit and stay silent (so can a crashed one). A step needs K
        deliveries from the C credited workers, so with C < K + f the f silent ones stall it until
        ``round_timeout`` and stop the job (``tests/test_async_flow.py::
        test_f_silent_credit_holders_cannot_stop_the_server_when_c_leaves_them_room``)."""
        c = self.concurrency
        if c is None:
            return
        if not self.concurrent or self.screens:
            raise ConfigError("algorithm_params.concurrency", c, f"none (every worker) with algorithm {self.name!r} "
                              "(fewer workers in flight could starve its buffers or its zero step; fedbuff takes it)")
        k = self.per_round(workers)
        if not k + silent <= c <= workers:
            spare = (f" + f = {k + silent}: f = {silent} Byzantine or crashed ranks may hold a credit and never "
                     "deliver, and a step needs K deliveries") if silent else ""
            raise ConfigError("algorithm_params.concurrency", c, f"an integer in {k + silent}..{workers} (buffer_size "
                              f"K{spare} <= concurrency <= {where})")

    # --- an optional filter on each update (Kardam, Zeno++) -------------------------------------------------------

    screens: ClassVar[bool] = False
    """It filters each accepted update before its rule (:meth:`screen`): a rejected update's row is zero, and the
    ``screen`` statistics (:data:`SCREEN`) become metric columns."""

    def screen_state(self, run: Run, theta: Tensor) -> dict[str, Tensor]:
        """The filter's own state before the first step (checkpointed with the clock); none by default."""
        return {}

    def check_screen_state(self, run: Run, own: dict[str, Tensor]) -> None:
        """Refuse (one-line :class:`ConfigError` naming ``start``) a filter state this run cannot continue from."""

    def screen(self, run: Run, own: dict[str, Tensor], theta: Tensor, t: int, ids: Tensor, updates: Tensor,
               versions: Tensor, ring: Tensor, workers: int | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The step's updates as the filter passes them on (row i: worker ``ids[i]``, computed at
        ``ring[versions[i] % (S + 1)]``), which of them it accepts (``(m,)`` bool, CPU), and its new state. By
        default every update, unchanged. ``workers``: how many workers compute (default ``run.workers``; on real
        processes n − 1, rank 0 only serves: :mod:`phalanx.distributed.async_filters` calls it one update at a time,
        as each arrives)."""
        return updates, torch.ones(ids.numel(), dtype=torch.bool), {}

    # --- the seam --------------------------------------------------------------------------------------------------

    def stages(self, run: Run) -> tuple[Stage, ...]:
        """The clock's columns and state holder (:class:`AsyncClock`; :class:`ScreenedClock` with a filter)."""
        return (ScreenedClock(),) if self.screens else (AsyncClock(),)

    def clock(self, run: Run) -> Clock:
        return Clock(workers=run.workers, byzantine=run.byzantine, max_staleness=self.max_staleness,
                     timing=self.byzantine_timing, concurrency=self.concurrency, seed=run.seed,
                     availability=self.online(run.workers, run.byzantine, run.seed, run.problem.dim))

    def initial_state(self, run: Run, theta: Tensor) -> dict[str, Tensor]:
        """Time 0: every worker starts on θ₀; the ring holds θ₀ in every slot (only slot 0 is ever read before it is
        rewritten)."""
        speed = self.worker_speeds(run.workers, run.seed, run.problem.dim)
        ring = theta.detach().clone()[None].repeat(self.max_staleness + 1, 1)
        touched = torch.zeros(self.per_round(run.workers), dtype=torch.bool)
        extra = {SCREENED: torch.zeros(len(SCREEN), dtype=torch.float64), **self.screen_state(run, theta)} \
            if self.screens else {}
        if self.byzantine_timing == "replay":
            extra[REPLAY] = theta.new_zeros(self.max_staleness + 1, run.problem.dim)
            extra[REPLAY_AT] = torch.full((self.max_staleness + 1,), -1, dtype=torch.int64)
        return {RING: ring, TOUCHED: touched, **self.clock(run).start(speed), **extra}

    def load_state(self, run: Run, own: dict[str, Tensor]) -> None:
        """Take the clock and the ring (refusing one of another population, bound or model). The state the run's own
        last step returned (:attr:`AsyncClock.made`, the same object) is taken as it is: it was built from a state
        already checked, by this code — the checks are for states from elsewhere (a checkpoint)."""
        stage = clock_stage(run)
        if own is stage.made:
            stage.own = own
            return
        stats = own.get("stats")
        if stats is not None and tuple(stats.shape) == (len(STATS) - 1,):
            # written before the clock counted ``unavailable`` (its last entry): every worker was always available
            own = {**own, "stats": torch.cat([stats, stats.new_zeros(1)])}
        self.clock(run).check_state(own)
        ring = own.get(RING)
        shape = (self.max_staleness + 1, run.problem.dim)
        if ring is None or tuple(ring.shape) != shape:
            got = None if ring is None else tuple(ring.shape)
            raise ConfigError("start", f"a ring of model versions of shape {got}",
                              f"{shape} (max_staleness + 1 versions of θ)")
        if self.byzantine_timing == "replay":
            kept, at = own.get(REPLAY), own.get(REPLAY_AT)
            if kept is None or tuple(kept.shape) != shape or at is None or tuple(at.shape) != shape[:1]:
                raise ConfigError("start", "a checkpoint without the replay attacker's updates",
                                  f"{shape} past updates and their steps")
        if self.screens:
            screened = own.get(SCREENED)
            if screened is None or tuple(screened.shape) != (len(SCREEN),) or not bool(torch.isfinite(screened).all()):
                raise ConfigError("start", "a checkpoint without the filter's finite statistics",
                                  f"a {self.name} checkpoint ({len(SCREEN)} finite statistics)")
            self.check_screen_state(run, own)
        clock_stage(run).own = own

    def make_server(self, run: Run, generator: torch.Generator) -> BufferServer:
        """The standard server, its measurements taken over the rows a Byzantine update touched."""
        return BufferServer(run.rule, honest=run.honest, problem=run.problem, reference_batch=run.reference_batch,
                            generator=generator, rule_for=run.rule_for)

    def all_workers(self, run: Run, streams: dict[str, Tensor], carried: Tensor | None) -> AsyncWorkers:
        """Every worker in this process, driven by the clock."""
        return AsyncWorkers(self, run, streams)

    def one_worker(self, run: Run, rank: int, streams: dict[str, Tensor], carried: Tensor | None) -> Any:
        raise ConfigError("engine", "torchrun", f"'simulated' with algorithm {self.name} here (an asynchronous run has "
                          "no worker slot of a synchronous round: on real processes its workers are "
                          "phalanx.distributed.async_server's)")

    def check(self, run: Run) -> None:
        """The population fits (:meth:`per_round` refuses a buffer larger than it), the listed speeds are one per
        worker, and the attack is one an asynchronous worker can play."""
        self.per_round(run.workers)
        self.check_concurrency(run.workers)
        Speeds.parse(self.speeds).check(run.workers)
        dim = _dimension(run)
        self.online(run.workers, run.byzantine, run.seed, dim)
        self.worker_speeds(run.workers, run.seed, dim)  # a trace's bandwidths read (and checked) now
        check_attack(run.attack, self.name)
        if self.byzantine_timing != "honest" and run.byzantine and getattr(run.attack, "name", "") == "honest":
            raise ConfigError("algorithm_params.byzantine_timing", self.byzantine_timing, "'honest' with attack = "
                              "'honest' (the all-honest baseline: its workers must arrive as honest ones do, not "
                              "first or replayed)")

    def check_config(self, cfg: Any, rule: Aggregator, attack: Attack | DataAttack) -> None:
        """The seam's checks (f and the rule's requirement against :meth:`per_round`, named by
        :attr:`population_key`) after the population's and the attack's own."""
        if getattr(cfg, "engine", "simulated") != "simulated":
            self.check_processes(cfg, attack)
        self.per_round(cfg.workers)
        if getattr(cfg, "engine", "simulated") == "simulated":
            self.check_concurrency(cfg.workers)
        Speeds.parse(self.speeds).check(cfg.workers)
        if getattr(cfg, "engine", "simulated") == "simulated":  # the file and its clients (the windows' lengths
            online.parse(self.availability, self.availability_scale, cfg.workers)  # against the speeds: check(run))
        check_attack(attack, self.name)
        super().check_config(cfg, rule, attack)

    real_processes: ClassVar[bool] = False
    """It runs on real processes (``engine = "torchrun"``, :mod:`phalanx.distributed.async_server`): FedBuff, BASGD,
    Kardam, Zeno++ and AFLGuard."""
    screens_on_processes: ClassVar[bool] = False
    """Its filter (:meth:`screen`) is run, and tested, on real processes one update at a time
    (:mod:`phalanx.distributed.async_filters`): Kardam, Zeno++ and AFLGuard (a filtering algorithm without it is
    refused there)."""

    def check_processes(self, cfg: Any, attack: Attack | DataAttack) -> None:
        """What the asynchronous server on real processes runs, refused in one line otherwise: this algorithm, the
        server topology, honest timing, an attack one worker process can play on its own update or its own data
        (:func:`check_process_attack`), and a buffer the n − 1 worker ranks can fill (rank 0 only serves)."""
        if not self.real_processes or (self.screens and not self.screens_on_processes):
            raise ConfigError("engine", cfg.engine, f"'simulated' with algorithm {self.name!r} (real asynchronous "
                              "processes run fedbuff, basgd, kardam, zenopp and aflguard)")
        if self.byzantine_timing != "honest":
            raise ConfigError("algorithm_params.byzantine_timing", self.byzantine_timing, "'honest' with engine "
                              "'torchrun' (the processes' own pace is their timing)")
        check_process_attack(attack)
        if self.availability != "always":
            raise ConfigError("algorithm_params.availability", self.availability, "'always' with engine 'torchrun' "
                              "(a trace's availability is the simulated clock's; processes are online as they run)")
        if self.trace_bandwidth:
            raise ConfigError("algorithm_params.trace_bandwidth", True, "false with engine 'torchrun' (a trace's "
                              "bandwidth is the simulated clock's; processes send over their real links)")
        if getattr(cfg, "topology", "server") != "server":
            raise ConfigError("topology", cfg.topology, "'server' with an asynchronous algorithm")
        if cfg.workers < 2:
            raise ConfigError("workers", cfg.workers, ">= 2 with engine 'torchrun' (rank 0 serves, ranks 1 … n−1 "
                              "compute)")
        k = self.per_round(cfg.workers - 1)
        if self.concurrent and self.concurrency is None and k + int(cfg.f) > cfg.workers - 1:
            # every worker rank holds a credit: f silent ones (Byzantine with their own keys, or crashed) must leave K
            raise ConfigError(self.population_key, k, f"<= workers - 1 - f = {cfg.workers - 1 - int(cfg.f)} with "
                              "engine 'torchrun' (f Byzantine or crashed ranks may never deliver, and a step needs K "
                              "deliveries)")
        self.check_concurrency(cfg.workers - 1, "workers - 1, the worker ranks", silent=int(cfg.f))

    @classmethod
    def processes(cls, cfg: Any) -> int:
        """One process on the simulated clock; with ``engine = "torchrun"`` one per worker rank (rank 0 serves)."""
        return int(cfg.workers) if getattr(cfg, "engine", "simulated") == "torchrun" else 1


def check_process_attack(attack: Attack | DataAttack) -> None:
    """On real processes a Byzantine worker rank knows θ of its version, its own data and its own update, nothing
    else (no other worker's update, not the server's rule or context): it plays a data attack on its own batches
    (label flip, backdoor, edge case … — the simulator's attack objects,
    :class:`~phalanx.distributed.async_server.AsyncWorker`; one that shapes a federated client's update is refused
    by :func:`check_attack`) or a vector attack that one worker can run on its own update (``Attack.solo``: sign
    flip, IPM, noise, NaN …; the mean of one row is that row), refused in one line otherwise (ALIE, min-max, Fang,
    mimic, the optimal attacks)."""
    from phalanx.attacks import names

    if isinstance(attack, DataAttack):
        return
    if type(attack).needs_aggregator or not getattr(attack, "solo", False):
        solo = ", ".join(n for n in names("vector") if getattr(_attack_class(n), "solo", False))
        raise ConfigError("attack", attack.name, f"an attack one worker plays on its own update ({solo}) with an "
                          "asynchronous algorithm on engine 'torchrun' (a worker process sees no other update)")


def _attack_class(name: str) -> Any:
    from phalanx.attacks import get_class

    return get_class(name)


def check_attack(attack: Attack | DataAttack, name: str) -> None:
    """A boosted attack or one that shapes a federated client's update has no asynchronous worker to play it."""
    if float(attack.boost) != 1.0:
        raise ConfigError("attack_params.boost", float(attack.boost), f"1 with algorithm {name!r} (boosting scales a "
                          "federated client's update)")
    if isinstance(attack, DataAttack) and attack.shapes_update:
        raise ConfigError("attack", attack.name, f"an attack that does not shape a federated client's update with "
                          f"algorithm {name!r}")


class AsyncWorkers:
    """Every worker of an asynchronous run in this process: each server step, the clock's deliveries computed as one
    batched call (see the module's docstring)."""

    def __init__(self, algo: Asynchronous, run: Run, streams: dict[str, Tensor]) -> None:
        self.algo, self.run = algo, run
        self.n, self.b = run.workers, run.byzantine
        self.honest_n = self.n - self.b
        self.clock = algo.clock(run)
        self.data_attack = isinstance(run.attack, DataAttack)
        self.vector_attack = self.b > 0 and not self.data_attack
        self.batch_gen = restored(streams["batches"])
        self.attack_gen = restored(streams["attack"])
        self.stage = clock_stage(run)
        self.full = partial(algo.full, self.n)
        """The algorithm's :meth:`Asynchronous.full` for this population, as the clock calls it."""

    def streams(self) -> dict[str, Tensor]:
        return {"batches": self.batch_gen.get_state(), "attack": self.attack_gen.get_state()}

    def round(self, theta: Tensor, t: int, rule: Callable[[Tensor], Tensor]) -> Received:
        """Server step t: collect the step's deliveries, compute them in one batched call, assemble the rule's rows;
        the new clock and ring travel as the algorithm's state (``Received.own``)."""
        algo, run = self.algo, self.run
        own = self.stage.own
        slots = algo.max_staleness + 1
        ring = own[RING].clone()
        ring[t % slots] = theta.detach()
        step = self.clock.collect(own, t, self.full)  # the clock reads its own keys (CLOCK_KEYS) of the state
        byz_mask = step.ids >= self.honest_n if self.b else None
        if byz_mask is not None and bool(byz_mask.any()):  # the honest updates first, then the Byzantine ones
            honest, byz = step.ids[~byz_mask], step.ids[byz_mask]
            stale = torch.cat([step.staleness[~byz_mask], step.staleness[byz_mask]])
            versions = torch.cat([step.versions[~byz_mask], step.versions[byz_mask]])
        else:  # no Byzantine update in the step: the step's order as it is, no masked copies
            honest, byz, stale, versions = step.ids, step.ids[:0], step.staleness, step.versions
        ids = torch.cat([honest, byz]) if byz.numel() else honest
        computing = ids if self.data_attack else honest
        if computing.numel():
            xb, yb = sample_batches_of(run.data, computing, algo.batch_size, self.batch_gen)
            attack = run.attack
            if byz.numel() and isinstance(attack, DataAttack) and attack.active(t):
                xb, yb = poison_rows(attack, xb, yb, int(honest.numel()), run.data.num_classes, self.attack_gen,
                                     attackers=(byz - self.honest_n).tolist())
            # each update's θ from the ring: one index_select (the same rows as advanced indexing, cheaper)
            thetas = ring.index_select(0, (versions[: computing.numel()] % slots).to(ring.device))
            updates = run.problem.grads_each(thetas, xb, yb)
        else:
            updates = theta.new_zeros(0, run.problem.dim)
        if self.vector_attack and byz.numel():
            oracle = screen_oracle(algo, run, own, theta, t, ids, updates, versions, ring) if algo.screens else None
            rows = attack_rows(run, updates, int(byz.numel()), rule, self.attack_gen, t, screen=oracle)
            updates = torch.cat([updates, rows.to(updates)])
        extra: dict[str, Tensor] = {}
        if algo.byzantine_timing == "replay":
            updates, extra = replayed(own, updates, int(honest.numel()), int(byz.numel()), t, slots)
        if algo.screens:
            updates, keep, filtered = algo.screen(run, own, theta, t, ids, updates, versions, ring)
            updates = torch.where(keep.to(updates.device)[:, None], updates, updates.new_zeros(()))
            extra.update(filtered, **{SCREENED: screen_stats(own[SCREENED], keep, ids >= self.honest_n)})
        vectors, rows_of, touched = algo.assemble(run, ids, updates, stale)
        byzantine_rows = touched.tolist().count(True)  # (a few booleans: cheaper in Python than a tensor reduction)
        after = {RING: ring, TOUCHED: touched, **self.clock.advance(own, t, step, byzantine_rows), **extra}
        self.stage.made = after
        return Received(vectors, rows=rows_of, state_rows=False, own=after)


def screen_oracle(algo: Asynchronous, run: Run, own: dict[str, Tensor], theta: Tensor, t: int, ids: Tensor,
                  honest: Tensor, versions: Tensor, ring: Tensor) -> Callable[[Tensor], Tensor]:
    """The filter of step t as an oracle for an attack that adapts to it (``AttackContext.screen``): candidate
    Byzantine rows ``(b, d)`` → which of them :meth:`Asynchronous.screen` would accept, judged exactly as the step
    judges them — after the step's ``honest`` updates, from the state ``own`` — with nothing committed (``screen``
    returns a new state; ``own`` is not changed)."""
    h = int(honest.shape[0])

    def oracle(rows: Tensor) -> Tensor:
        _, keep, _ = algo.screen(run, own, theta, t, ids, torch.cat([honest, rows.to(honest)]), versions, ring)
        return keep[h:]

    return oracle


def replayed(own: dict[str, Tensor], updates: Tensor, honest: int, byz: int, t: int, slots: int
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """The stale replay (``byzantine_timing = "replay"``): the step's Byzantine rows (the last ``byz``) become the
    honest update stored S + 1 = ``slots`` steps earlier, when there is one (before: the attack's own rows); this
    step's first honest update is stored in its place."""
    store, at = own[REPLAY].clone(), own[REPLAY_AT].clone()
    slot = t % slots
    if byz and int(at[slot]) == t - slots:
        updates = torch.cat([updates[:honest], store[slot].to(updates)[None].expand(byz, -1)])
    if honest:
        store[slot], at[slot] = updates[0].to(store), t
    return updates, {REPLAY: store, REPLAY_AT: at}


def screen_stats(old: Tensor, keep: Tensor, byzantine: Tensor) -> Tensor:
    """A filter's statistics (:data:`SCREEN`) after a step that accepted ``keep`` of its updates."""
    out = ~keep
    return torch.tensor([float(old[0]) + int(out.sum()), float(out.sum()), float(old[2]) + int((out & byzantine).sum()),
                         float(old[3]) + int((out & ~byzantine).sum())], dtype=torch.float64)


class BufferServer(Server):
    """The standard :class:`~phalanx.training.server.Server` whose measurements (``agg_error``, ``byz_share``,
    ``detection_auc``) count a row as Byzantine when a Byzantine update touched it — a FedBuff row that is one, a
    BASGD buffer mean with one in it — read from the step's state (``Received.own``), not from worker indices."""

    def aggregate(self, got: Received, context: dict[str, Any], measure: bool) -> tuple[Tensor, RoundResult | None]:
        agg, result = super().aggregate(got, context, measure)
        if result is None or got.own is None or TOUCHED not in got.own:
            return agg, result
        byz = got.own[TOUCHED].cpu()
        contrib = result.contributions
        known = contrib is not None and bool(torch.isfinite(contrib).all())
        honest = got.vectors[~byz.to(got.vectors.device)] if bool(byz.any()) else got.vectors
        result = RoundResult(
            agg_error=honest_error(agg, honest),
            byz_share=(float(contrib.cpu()[byz].sum()) if known and contrib is not None else None),
            detection_auc=detection_auc(contrib.cpu(), byz) if known and contrib is not None else None,
            sampled_byzantine=int(byz.sum()), contributions=contrib)
        return agg, result
