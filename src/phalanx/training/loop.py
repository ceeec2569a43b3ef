"""The training loop — the one loop every engine and topology runs.

Round t (any algorithm, any transport, any stages)::

    context  = server.context(θ, previous)               # centre, reference gradient, generator
    received = transport.exchange(θ, t, rule ∘ context)  # the workers' vectors (attack, worker stages included)
    a        = server.aggregate(received, context)       # the robust rule (for f − m if m workers are missing)
    a        = stage.aggregated(a, round)                # every server stage, in order
    θ        = optimizer.step(θ, a, ηₜ)                  # the server optimizer
    θ        = stage.stepped(θ, round)                   # every server stage, in order (CRFL's clip and noise)

The loop and the evaluation iterate over the experiment's stages (:mod:`phalanx.training.stages`) — their hooks,
states, streams and columns — and never name one. Everything else — evaluation, metric rows, checkpoints,
progress, logs — is a :class:`Callback`; the loop itself reads and writes no file. A run starts from a
:class:`~phalanx.training.state.Snapshot` (fresh, or resumed from a checkpoint by a run-directory callback's owner)
and the transport may replace it (a process that holds no run directory receives its start from the one that
does). When the transport or the server gives a round up
(:class:`~phalanx.training.state.RoundAborted`), the callbacks are handed the snapshot of the start of that round
(to checkpoint it) and :class:`~phalanx.errors.WorkersLostError` is raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.errors import ConfigError, WorkersLostError
from phalanx.training import metric_rows
from phalanx.training.experiment import Experiment
from phalanx.training.server import BoundRule, RoundResult, Server
from phalanx.training.stages.base import STATE_PREFIX, Evaluation, ServerRound
from phalanx.training.state import Received, RoundAborted, RoundState, Snapshot
from phalanx.training.streams import ROUND_STREAMS, generator
from phalanx.training.threads import pin_threads
from phalanx.training.transport import InProcess, Transport

Progress = Callable[[int, int, "dict[str, Any] | None"], None]
"""``progress(round, rounds, row_or_None)``, called after every round."""


@dataclass
class RoundInfo:
    """What one round did, for the callbacks: its index, whether it was measured, its learning rate and
    measurements, the missing workers, payload bytes moved, wall time (transport + aggregation + step), and the
    metric row once an evaluation callback has made one."""

    round: int
    measure: bool
    lr: float
    result: RoundResult | None
    aggregated: int
    missing: list[int] = field(default_factory=list)
    sent: int = 0
    received: int = 0
    seconds: float = 0.0
    row: dict[str, Any] | None = None


class Callback:
    """Hooks the loop calls; every method is optional. ``loop.state`` is the state after the round,
    ``loop.rows`` the metric rows, ``loop.snapshot()`` what a checkpoint would hold now."""

    def on_start(self, loop: Loop) -> None:
        """The run is about to start its first round (``loop.resumed`` says whether it resumed)."""

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        """Round ``info.round`` is finished."""

    def on_abort(self, loop: Loop, snapshot: Snapshot) -> str | None:
        """The run stops at the start of round ``snapshot.state.round``; return a checkpoint's path if one is
        written."""
        return None

    def on_finish(self, loop: Loop) -> None:
        """Every round is done."""


class Evaluate(Callback):
    """Test accuracy and loss of θ (and the round's measurements) as a metric row: at round 0 and at every round the
    experiment measures. The rows carry every stage's columns (client-level differential privacy's budget ε, CRFL's
    certificate on the final row) and the experiment's ``columns``."""

    def on_start(self, loop: Loop) -> None:
        if loop.state.round == 0:
            loop.rows[:] = [self.row(loop, None)]

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        if info.measure:
            info.row = self.row(loop, info.result)
            loop.rows.append(info.row)

    @staticmethod
    def row(loop: Loop, result: RoundResult | None) -> dict[str, Any]:
        """One metric row of the current state: the round algorithm's own measurements when it has them (a model
        per node or per client), else the model's test accuracy and loss at θ and the attack's own measure."""
        exp = loop.experiment
        theta = loop.state.theta
        own = exp.algorithm.evaluate(exp, loop.state)
        attack: dict[str, Any] = {}
        global_model = own is None  # one model θ to evaluate (not a model per node or per client)
        if own is None:
            own = {}
            acc, loss = exp.problem.evaluate(theta, exp.test_x, exp.test_y)
            extra = getattr(exp.attack, "metrics", None)  # an attack's own measure (a backdoor's success rate)
            if callable(extra):
                ok = bool(torch.isfinite(theta).all())
                measured = extra(lambda x: exp.problem.predict(theta, x), exp.test_x, exp.test_y)
                attack = {k: (v if ok else None) for k, v in measured.items()}
        else:
            own = dict(own)
            acc, loss = own.pop("test_accuracy"), own.pop("test_loss")
        row: dict[str, Any] = {
            "round": loop.state.round, "test_accuracy": acc, "test_loss": loss, **own,
            "agg_error": result.agg_error if result is not None else None,
            "byz_share": result.byz_share if result is not None else None,
            "detection_auc": result.detection_auc if result is not None else None,
        }
        if result is not None and result.sampled_byzantine is not None:  # a federated round: who was sampled
            row["byzantine_sampled"] = result.sampled_byzantine
        row.update(attack)
        ev = Evaluation(exp, loop.state.round, theta, global_model)
        claimed = {**dict.fromkeys(exp.columns, "the config"), **dict.fromkeys(metric_rows.CORE, "the loop"),
                   **{c: f"stage {stage.name!r}" for stage in exp.stages for c in stage.column_names()}}
        for stage in exp.stages:  # a stage's columns may overwrite none of the row's (metric_rows.stage_columns)
            declared = stage.column_names()
            taken = {**dict.fromkeys(row, "the algorithm, the attack or an earlier stage"),
                     **{k: who for k, who in claimed.items() if k not in declared}}
            row.update(metric_rows.stage_columns(stage.name, declared, stage.columns(ev), taken))
        stop = exp.attack.stop_round if isinstance(exp.attack, DataAttack) else None
        if stop is not None:  # durability: attack_success k rounds after the attackers stopped (docs/attacks.md)
            row["rounds_since_stop"] = loop.state.round - stop if loop.state.round >= stop else None
        row.update(exp.columns)
        return metric_rows.written(row)


class OnRound(Callback):
    """Calls ``fn(round, rounds, row_or_None)`` after every round (a progress bar, a queue to a parent process)."""

    def __init__(self, fn: Progress) -> None:
        self.fn = fn

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        self.fn(loop.state.round, loop.experiment.rounds, info.row)


def fresh_start(exp: Experiment) -> Snapshot:
    """Round 0: θ₀ from the model, the per-round streams (the stages' own too, but their secret ones: each worker side
    draws those itself) seeded from the experiment's seed; the stages' fresh states (none: each keeps what it starts
    with)."""
    theta = exp.problem.initial_theta()
    state = RoundState(theta=theta, momentum=None, previous=None, round=0, own=exp.algorithm.initial_state(exp, theta))
    names = (*ROUND_STREAMS, *(name for stage in exp.stages for name in stage.streams
                               if name not in stage.secret_streams()))
    streams = {name: generator(exp.seed, name).get_state() for name in names}
    return Snapshot(state, streams)


class Loop:
    """Runs an experiment's rounds over a transport, calling the callbacks (see the module's docstring)."""

    def __init__(
        self, experiment: Experiment, transport: Transport | None = None, callbacks: Sequence[Callback] = (),
        start: Snapshot | None = None,
    ) -> None:
        self.experiment = experiment
        self.transport = transport if transport is not None else InProcess()
        self.callbacks = list(callbacks)
        self.start = start
        self.server: Server | Any = experiment.algorithm.make_server(experiment, generator(experiment.seed,
                                                                                            "aggregator"))
        self.stage_streams = {name: generator(experiment.seed, name)
                              for stage in experiment.server_stages for name in stage.streams}
        """The server-side stages' streams (CRFL's noise), by name; checkpointed with the run's."""
        self.server_stages = experiment.server_stages
        self.contributions = any(stage.needs_contributions for stage in self.server_stages)
        """Whether a stage reads the rule's contributions every round (the server then measures every round)."""
        self.state = RoundState(experiment.problem.initial_theta(), None, None, 0)
        self.rows: list[dict[str, Any]] = []
        self.resumed = False
        self._opened = False

    def open(self) -> None:
        """Start the transport from the start snapshot (fresh unless given) on the experiment's device (a checkpoint's
        CPU tensors, or what another rank sent, are moved there); call ``on_start``. The intra-op thread team is
        pinned to its count first (:func:`~phalanx.training.threads.pin_threads`: no team shrunk by the load)."""
        pin_threads()
        exp = self.experiment
        start = self.start if self.start is not None else fresh_start(exp)
        start = self.transport.open(exp, start.to(exp.device)).to(exp.device)
        self.state, self.rows, self.resumed = start.state, list(start.rows), start.resumed
        unclaimed = {k for k in start.stages if k.startswith(STATE_PREFIX)}  # another run's stage; other keys: ignored
        for stage in exp.stages:  # fresh: {} (as the stage starts); resumed: where the checkpoint left it
            prefix = stage.prefix()
            mine = {k: v for k, v in start.stages.items() if k.startswith(prefix)}
            unclaimed -= set(mine)
            stage.load_state_dict({k.removeprefix(prefix): v for k, v in mine.items()})
        if unclaimed:
            raise ConfigError("start", sorted(unclaimed), "the states of this run's stages only ("
                              + (", ".join(repr(s) for s in exp.stages) or "it has none") + ")")
        exp.algorithm.load_state(exp, self.state.own)
        if getattr(exp.rule, "stateful", False):  # fresh: {} resets it; resumed: where the checkpoint left it
            exp.rule.load_state_dict(start.rule)
        if "aggregator" in start.streams:
            self.server.generator.set_state(start.streams["aggregator"])
        for name, gen in self.stage_streams.items():
            if name in start.streams:
                gen.set_state(start.streams[name])
        # moved to θ's device, not cast to its dtype: an optimizer may keep float64 state (robust-online does)
        exp.optimizer.load_state_dict({k: v.to(self.state.theta.device) for k, v in start.optimizer.items()})
        self._opened = True
        for cb in self.callbacks:
            cb.on_start(self)

    def snapshot(self) -> Snapshot:
        """What a checkpoint of the current state holds."""
        exp = self.experiment
        streams = {**self.transport.streams(), "aggregator": self.server.generator.get_state(),
                   **{name: gen.get_state() for name, gen in self.stage_streams.items()}}
        rule = dict(exp.rule.state_dict()) if getattr(exp.rule, "stateful", False) else {}
        stages = {stage.prefix() + k: v for stage in exp.stages for k, v in stage.state_dict().items()}
        return Snapshot(self.state, streams, exp.optimizer.state_dict(), list(self.rows), self.resumed, rule, stages)

    def step(self) -> RoundInfo:
        """Run round ``state.round``; return what it did (after the callbacks saw it)."""
        if not self._opened:
            self.open()
        exp, state = self.experiment, self.state
        t = state.round
        measure = exp.evaluates(t)
        lr = exp.learning_rate(t)
        t0 = time.perf_counter()
        context = self.server.context(state.theta, state.previous)
        streams = self.transport.streams()  # the worker side's streams at the start of the round (for an abort)
        try:
            got = self.transport.exchange(state.theta, t, BoundRule(exp.rule, context, state.previous))
            agg, result = self.server.aggregate(got, context, measure or self.contributions)
        except RoundAborted as exc:
            self._abort(exc, streams)
        here = ServerRound(t, exp.rounds, got, result, exp.f, exp.workers, self.stage_streams)
        for stage in self.server_stages:
            agg = stage.aggregated(agg, here)
        theta = exp.optimizer.step(state.theta, agg, lr)
        for stage in self.server_stages:
            theta = stage.stepped(theta, here)
        if not measure:  # the round's measurements were made for a stage; the rows are made at evaluations only
            result = None
        after = RoundState(theta=theta, momentum=self._rows(got), previous=agg, round=t + 1, own=state.own)
        own = exp.algorithm.next_state(exp, after, got)
        if own is not state.own:
            exp.algorithm.load_state(exp, own)
            after.own = own
        self.state = after
        info = RoundInfo(t, measure, lr, result, got.vectors.shape[0], got.missing, got.sent, got.received,
                         time.perf_counter() - t0)
        for cb in self.callbacks:
            cb.on_round(self, info)
        return info

    def run(self) -> list[dict[str, Any]]:
        """Every remaining round, then ``on_finish``; the metric rows."""
        error: BaseException | None = None
        try:
            if not self._opened:
                self.open()
            while self.state.round < self.experiment.rounds:
                self.step()
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.transport.close(error)
        for cb in self.callbacks:
            cb.on_finish(self)
        return self.rows

    def _rows(self, got: Received) -> Tensor | None:
        """Every worker's last vector, ``(n, d)``: the received matrix itself when all n arrived in order, else the
        previous matrix with the received rows written in."""
        if got.carry is not None:
            return got.carry
        if not got.state_rows:
            return self.state.momentum
        if got.rows is None:
            return got.vectors
        rows = self.state.momentum
        if rows is None:
            rows = got.vectors.new_zeros(self.experiment.workers, got.vectors.shape[1])
        rows[got.rows] = got.vectors
        return rows

    def _abort(self, exc: RoundAborted, streams: dict[str, Tensor]) -> NoReturn:
        """Hand the snapshot of the start of this round to the callbacks, then raise :class:`WorkersLostError`."""
        t = self.state.round
        snap = self.snapshot()
        snap.streams.update(streams)
        snap.rows = [r for r in snap.rows if r["round"] <= t]
        path = None
        for cb in self.callbacks:
            path = cb.on_abort(self, snap) or path
        raise WorkersLostError(t, exc.missing, self.experiment.f, self.transport.round_timeout or 0.0, path,
                               exc.detail, self.experiment.algorithm.missing_word) from None


def run(
    experiment: Experiment, transport: Transport | None = None, callbacks: Sequence[Callback] | None = None,
    start: Snapshot | None = None,
) -> list[dict[str, Any]]:
    """Train ``experiment`` over ``transport`` (default: every worker in this process); the metric rows.

    ``callbacks`` default to ``[Evaluate()]`` (a metric row at round 0 and at every evaluation round).
    """
    cbs = [Evaluate()] if callbacks is None else list(callbacks)
    return Loop(experiment, transport, cbs, start).run()


