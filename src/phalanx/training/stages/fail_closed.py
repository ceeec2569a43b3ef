"""Fail closed: a server stage that stops the run, before the round's aggregate is applied, when more workers look
Byzantine than the run assumes there are — the bound f its rule is configured for.

A robust rule's guarantee holds for at most f Byzantine workers among the vectors it aggregates (Blanchard et al.,
"Machine learning with adversaries: Byzantine tolerant gradient descent", NeurIPS 2017, and every rule since: the
threat model of docs/aggregators.md). Beyond f nothing is promised, and a run that goes on trains a model whose
robustness claim no longer holds. Failing closed is Saltzer & Schroeder's *fail-safe defaults* ("The protection of
information in computer systems", Proc. IEEE 63(9), 1975, §I.A.3): when the assumption is seen to be broken, stop
rather than go on.

**Flagged.** Row i of round t is *flagged* when the rule gave it at most ``share`` of its output — the rule's own
contributions (:meth:`phalanx.aggregators.base.Aggregator.contributions`, what the server already measures for the
Byzantine share), default ``share = 0``: no weight at all — or when it holds a non-finite value. A worker is
*suspected* when it was flagged in at least ``min_flags`` of the last ``window`` rounds (default 1 of 1: flagged
in this round). The run fails closed when more than ``bound`` workers are suspected (default: the rule's f): it
raises :class:`FailedClosed`, a one-line typed error naming the round, the suspected workers and the bound, which a
run directory records in ``FAILED`` (:mod:`phalanx.experiments.runstate`); the same command resumes from the last
checkpoint and fails closed again at the same round.

**What it does not detect.** A Byzantine worker the rule trusts (an attack that stays inside the honest spread,
ALIE say, gets a share like an honest worker's) is not flagged: the stage counts what the rule itself excluded,
nothing else. And it needs a rule that excludes at most f of m honest rows: a rule that keeps one row by design
(Krum) gives no weight to m − 1 honest ones and would stop every run, so :meth:`FailClosed.check` refuses a rule
that flags more than ``bound`` of m i.i.d. Gaussian rows, and a rule that reports no contributions.

State: the last ``window`` rounds' flags per worker (``stage.fail_closed.history``, ``(window, n)``), so a resumed
run sees the window an uninterrupted one would. Columns: ``fail_closed_flagged`` (rows flagged in the last round)
and ``fail_closed_suspected`` (workers suspected over the window).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.errors import ConfigError, PhalanxError
from phalanx.training.stages.base import Evaluation, Plan, ServerRound, ServerStage
from phalanx.validate import check_int, check_real

COLUMNS = ("fail_closed_flagged", "fail_closed_suspected")
CHECK_DIM = 16
"""The dimension of the i.i.d. Gaussian rows :meth:`FailClosed.check` calibrates the rule on."""


class FailedClosed(PhalanxError, RuntimeError):
    """More workers look Byzantine than the bound: the run stops before applying round ``round``'s aggregate."""

    def __init__(self, round: int, suspected: list[int], bound: int, window: int, min_flags: int) -> None:
        self.round = round
        self.suspected = suspected
        self.bound = bound
        shown = ", ".join(map(str, suspected[:10])) + (", …" if len(suspected) > 10 else "")
        over = "in this round" if window == 1 else f"in at least {min_flags} of the last {window} rounds"
        super().__init__(f"round {round}: {len(suspected)} workers flagged {over} (workers {shown}), more than the "
                         f"bound {bound}: the run fails closed (its rule's guarantee holds for at most {bound})")


class FailClosed(ServerStage):
    """Stop the run when more than ``bound`` workers are suspected (the module's docstring)."""

    name: ClassVar[str] = "fail_closed"
    reads_ids: ClassVar[bool] = True  # whether the run stops, and whom it names, depends on who was sampled
    reference: ClassVar[str] = ("Saltzer & Schroeder, 'The protection of information in computer systems', Proc. "
                                "IEEE 1975 (fail-safe defaults); flagged = the rule's contributions (Phalanx's "
                                "Aggregator.contributions)")
    parameters: ClassVar[Mapping[str, str]] = {
        "window": "W ≥ 1: rounds a worker's flags are remembered (default 1)",
        "min_flags": "1 ≤ k ≤ W: a worker flagged in at least k of the last W rounds is suspected (default 1)",
        "bound": "≥ 0: the run fails closed when more workers are suspected (default: the rule's f)",
        "share": "0 ≤ s < 1: a row is flagged when the rule gives it at most this share of its output (default 0)",
    }
    needs_contributions: ClassVar[bool] = True

    def __init__(self, window: int = 1, min_flags: int = 1, bound: int | None = None, share: float = 0.0) -> None:
        self.window = check_int("window", window, low=1)
        self.min_flags = check_int("min_flags", min_flags, low=1, high=self.window)
        self.bound = None if bound is None else check_int("bound", bound, low=0)
        self.share = check_real("share", share, low=0.0, high=1.0, high_open=True)
        self.history: Tensor | None = None
        self.last: tuple[int, int] | None = None

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "min_flags": self.min_flags, "bound": self.bound, "share": self.share}

    def limit(self, f: int) -> int:
        """The number of suspected workers the run tolerates: ``bound``, else the rule's f."""
        return f if self.bound is None else self.bound

    def flagged(self, contributions: Tensor, vectors: Tensor) -> Tensor:
        """Which rows are flagged, ``(m,)`` bool: a share of at most ``share`` (NaN counts: no share reported),
        or a non-finite value."""
        kept = contributions.detach().double().cpu() > self.share
        finite = torch.isfinite(vectors).all(dim=1).cpu()
        return ~(kept & finite)

    def check(self, plan: Plan) -> None:
        """One server, and a rule that reports its contributions and flags at most ``bound`` of m i.i.d. Gaussian
        rows (m the vectors it aggregates a round) — a copy of it, so that a rule's state is not touched."""
        key = self.parameter("stages.fail_closed")
        if plan.algorithm.decentralized:
            raise ConfigError(key, self.name, f"unset with algorithm = {plan.algorithm.name!r} (it watches the "
                              "server's rule; decentralized rounds have a rule per node and no server)")
        m, rule = plan.algorithm.per_round(plan.workers), copy.deepcopy(plan.rule)
        x = torch.randn(m, CHECK_DIM, generator=torch.Generator().manual_seed(0))
        context: dict[str, Any] = {"reference": x.mean(0), "generator": torch.Generator().manual_seed(0),
                                   "ids": torch.arange(m)}
        try:
            contrib = rule.contributions(x, **{k: v for k, v in context.items() if k in rule.context_keys})
        except PhalanxError as exc:
            raise ConfigError(key, self.name, f"a rule whose contributions can be computed ({exc})") from None
        if not bool(torch.isfinite(contrib).all()):
            raise ConfigError(key, self.name, f"a rule that reports its contributions ({rule!r} does not: nothing "
                              "would tell a flagged row from a trusted one)")
        count, bound = int(self.flagged(contrib, x).sum()), self.limit(plan.f)
        if count > bound:
            raise ConfigError(key, self.name, f"a rule that gives more than {self.share:g} of its output to all but "
                              f"at most {bound} of {m} honest rows ({rule!r} gives no more to {count} of {m} i.i.d. "
                              "Gaussian rows: the run would fail closed with nobody attacking)")

    def aggregated(self, agg: Tensor, r: ServerRound) -> Tensor:
        """Flag the round's rows, update the window, and stop the run (:class:`FailedClosed`) before the aggregate is
        applied when more than the bound are suspected."""
        assert r.result is not None and r.result.contributions is not None, "the loop measures for this stage"
        rows = self.flagged(r.result.contributions, r.received.vectors)
        now = torch.zeros(r.workers, dtype=torch.bool)
        now[r.ids()[rows]] = True
        if self.history is None:
            self.history = torch.zeros(self.window, r.workers, dtype=torch.bool)
        if self.history.shape[1] != r.workers:  # a checkpoint of another run
            raise ConfigError("stage.fail_closed.history", tuple(self.history.shape),
                              f"({self.window}, {r.workers}): a flag per worker of this run")
        self.history = torch.cat([self.history[1:], now[None]])
        suspected = (self.history.sum(dim=0) >= self.min_flags).nonzero().flatten().tolist()
        self.last = (int(rows.sum()), len(suspected))
        bound = self.limit(r.f)
        if len(suspected) > bound:
            raise FailedClosed(r.round + 1, suspected, bound, self.window, self.min_flags)
        return agg

    def column_names(self) -> tuple[str, ...]:
        return COLUMNS

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        """The last round's flagged rows and the workers suspected over the window (None before the first)."""
        return dict.fromkeys(COLUMNS) if self.last is None else dict(zip(COLUMNS, self.last))

    def state_dict(self) -> dict[str, Tensor]:
        return {} if self.history is None else {"history": self.history.clone()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """The window of a checkpoint: ``history``, ``(window, n)`` booleans (``{}``: fresh)."""
        self.last = None
        if not state:
            self.history = None
            return
        history = state.get("history")
        if set(state) != {"history"} or history is None or history.dim() != 2 or history.shape[0] != self.window \
                or history.dtype != torch.bool:
            shapes = {k: (tuple(v.shape), str(v.dtype)) for k, v in state.items()}
            raise ConfigError("stage.fail_closed", shapes, f"history, a ({self.window}, n) bool tensor (the window of "
                              "this stage)")
        self.history = history.cpu().clone()
