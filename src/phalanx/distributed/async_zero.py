"""The zero step of a filtered asynchronous server on real processes, and the keyed audit's check of it.

Why. On processes a worker computes one update per model version, and the filter (Kardam's, Zeno++'s, AFLGuard's:
:mod:`phalanx.distributed.async_filters`) drops a rejected update instead of keeping it as a zero row. When the
filter has rejected every live worker's update of the newest version t and the step holds no accepted update, no
further update can come: the step could only give up after ``round_timeout`` (measured: AFLGuard at λ = 1.5 stopped
2 seeds of 3, docs/async.md "Liveness"). The papers' servers do not wait there — a rejected update is ignored and the
server goes on (Fang et al., ACSAC 2022, AFLGuard's server; Damaskinos et al., ICML 2018, Kardam's; Xie et al.,
ICML 2020, Zeno++'s) — and Phalanx's simulated clock, where a rejected update is a zero row, publishes the next
version after such a step.

What the server does (:meth:`~phalanx.distributed.async_server.AsyncServer.exchange`). When the buffer has no update,
every *live* worker rank (the ranks that joined at the start) has delivered its update of version t, and the filter
rejected at least one of them (the others dropped as non-finite or malformed), the server takes a **zero step**:
the rows the rule aggregates are the algorithm's own :meth:`~phalanx.training.algorithms.asynchronous.Asynchronous.
assemble` of zero updates of the rejected ranks at staleness 0 — the simulated clock's step in which every delivery
was rejected — so the rule's result over them is 0 for a rule that maps zero rows to zero (mean, median, trimmed
mean, Krum …), and with the SGD server optimizer without momentum or weight decay and no server stage that moves θ
(:func:`holds_still`), θₜ₊₁ = θₜ − η·0 = θₜ bit for bit: version t + 1 is θₜ again, and every worker computes anew on
fresh samples. The step aggregates no update (``updates`` 0 in the metrics; its staleness statistics 0).

Bound. A zero step is one of the run's ``rounds`` steps, so a run whose every update is rejected ends after its
steps, exit status 0, with one line on rank 0's log (:func:`summary`): how many steps were zero steps. The first zero
step is said once; the others are counted.

Record (keyed runs). A zero step is a ``step`` line with no ``updates`` and two more fields
(:data:`ZERO_KEYS`)::

    {"type": "step", "round": t, "updates": [], "rows": [<hex 64>, …], "result": <hex 64>,
     "theta": <base64 of θₜ's d values>, "judged": [<update entry of version t>, …]}

``judged``: the updates of version t the filter rejected, each as the worker signed it (the entry of an aggregated
update: :func:`~phalanx.distributed.async_transcript.step_entry`); ``theta``: θₜ, the model they were computed and
judged at. Size: at most n − 1 entries and one more row of d values — within the step line's bound
(:func:`~phalanx.distributed.async_transcript.step_bytes` counts n bodies).

**What the audit checks** (:class:`ZeroCheck`): the algorithm filters (a FedBuff or BASGD server never takes a
zero step); no accepted update in the line; 1 … n − 1 judged updates, one per
worker rank, each of version t, signed by its own rank's key for (nonce, config, version) and its θ digest equal to
SHA-256(θₜ) as recorded (so rank 0 cannot record another θ than its workers computed at); each worker's version
newer than its last aggregated one (the server drops an older version after a newer one was judged, and an update
recorded rejected is never aggregated later: the audit's per-worker newest version moves to t); the rows are
``assemble`` of zero updates of those ranks and the result the rule over them (a rule without context or state);
for AFLGuard, whose filter is a function of θₜ alone, **the decision is recomputed**: every judged update must fail
‖g − g₀(θₜ)‖ ≤ λ‖g₀(θₜ)‖ (one that passes is an accepted update recorded as a zero step); and when the result is
the zero vector and :func:`holds_still`, every later update of version t + 1 must carry θₜ's digest (θ changed on a
zero step is refused). Kardam's and Zeno++'s decisions need their state (every worker's coefficient, the validation
gradient), which the transcript does not hold: their zero steps are counted ``filters_unchecked`` like every step.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from phalanx.distributed import wire

if TYPE_CHECKING:
    from phalanx.training.experiment import Experiment

ZERO_KEYS = ("theta", "judged")
"""The fields a zero step's line has besides a step line's (:data:`~phalanx.distributed.async_transcript.
STEP_KEYS`)."""
RECOMPUTED = ("aflguard",)
"""The algorithms whose filter decision the audit recomputes on a zero step (a function of θₜ alone)."""


def _digest(x: Tensor) -> str:
    return hashlib.sha256(wire.tensor_bytes(x)).hexdigest()


def holds_still(exp: Experiment) -> bool:
    """Whether a zero aggregate leaves θ as it is: the server optimizer is SGD without momentum or weight decay
    (:class:`~phalanx.training.optim.SGD`, or its clipped variant: the clip of 0 is 0) and no server stage changes
    the aggregate or θ (their hooks are the base class's)."""
    from phalanx.training.optim import SGD
    from phalanx.training.stages.base import ServerStage

    opt: Any = exp.optimizer
    if not isinstance(opt, SGD) or opt.momentum or opt.weight_decay:
        return False
    return all(type(s).aggregated is ServerStage.aggregated and type(s).stepped is ServerStage.stepped
               for s in exp.server_stages)


def zero_rows(exp: Experiment, ranks: list[int], theta: Tensor) -> tuple[Tensor, list[int] | None, Tensor]:
    """The rows of a zero step: ``assemble`` of zero updates of ``ranks`` at staleness 0 (the simulated clock's step
    whose every delivery was rejected); no row is an attacker's (``touched`` all False)."""
    algo: Any = exp.algorithm
    ids = torch.tensor(ranks, dtype=torch.int64)
    zeros = theta.new_zeros(len(ranks), exp.problem.dim)
    rows, named, touched = algo.assemble(exp, ids, zeros, torch.zeros(len(ranks), dtype=torch.int64))
    return rows, named, torch.zeros_like(touched)


def zero_fields(theta: Tensor, judged: list[Any], entry: Any) -> dict[str, Any]:
    """A zero step's fields (:data:`ZERO_KEYS`): θₜ and the rejected updates (the server's
    :class:`~phalanx.distributed.async_buffer.Update`, which imports this module), each as ``entry`` records one."""
    return {"theta": base64.b64encode(wire.tensor_bytes(theta)).decode(), "judged": entry(judged)}


def summary(zero: int, steps: int) -> str:
    """Rank 0's closing line on zero steps."""
    return (f"zero steps: {zero} of {steps} (every live worker's update of the newest version rejected by the filter: "
            "θ not moved, the next version published)")


class ZeroCheck:
    """The audit's check of a zero step's line (see the module's docstring), for a
    :class:`~phalanx.distributed.async_transcript.StepCheck` (its experiment, n, d, dtype, per-worker newest versions
    and θ digests per version)."""

    def __init__(self, steps: Any) -> None:
        self.steps = steps
        self.still = holds_still(steps.exp)
        self.recomputes = steps.exp.algorithm.name in RECOMPUTED
        rule: Any = steps.exp.rule
        self.results = not rule.context_keys and not getattr(rule, "stateful", False)
        """Whether a zero step's result is recomputed (a rule without context or state; the rows of a zero step are
        recomputable for every filter, Zeno++'s included: zero updates are not normalised)."""
        self.unchanged: dict[int, tuple[int, str]] = {}
        """Version v → (the zero step v − 1, SHA-256 of its θ): every update of v must carry it."""

    def theta_of(self, t: int, version: int, rank: int, theta: str) -> str | None:
        """Why rank's update of ``version`` at θ digest ``theta`` contradicts a zero step (None: it does not)."""
        got = self.unchanged.get(version)
        for v in [v for v in self.unchanged if v < t - self.steps.max_staleness]:
            del self.unchanged[v]
        if got is None or got[1] == theta:
            return None
        return (f"rank {rank}'s update of version {version} was computed at θ {theta[:12]}…, not at θ of zero step "
                f"{got[0]} ({got[1][:12]}…): θ changed on a zero step")

    def check(self, rec: dict[str, Any], t: int, verify: Any) -> list[str]:
        """The problems of zero step t's line; ``verify(entry, t)`` checks one update entry as an aggregated one is
        checked (its rank, signature, body, θ digest): ``(problems, rank, version, θ digest, row)``."""
        from phalanx.errors import PhalanxError

        steps, where = self.steps, f"step {t}"
        if not getattr(steps.algo, "screens", False):
            return [f"{where}: a zero step in a run of {steps.algo.name}, which filters nothing (its server never "
                    "takes one)"]
        updates = rec["updates"]
        if not isinstance(updates, list):  # (a hostile line: 1, true, …; len() of it raised)
            return [f"{where}: a zero step's 'updates' is not a list"]
        if updates:
            return [f"{where}: a zero step with {len(updates)} accepted update(s) (a zero step aggregates none)"]
        judged, raw = rec["judged"], rec["theta"]
        if not isinstance(judged, list) or not 1 <= len(judged) < steps.workers:
            return [f"{where}: a zero step's 'judged' is not 1 … n − 1 rejected updates"]
        try:
            body = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
        except (binascii.Error, ValueError):
            body = b""
        size = steps.dim * torch.empty((), dtype=steps.dtype).element_size()
        theta = wire.bytes_tensor(body, steps.dtype) if len(body) == size else None
        if theta is None or not bool(torch.isfinite(theta).all()):
            return [f"{where}: a zero step's θ is not d = {steps.dim} finite values"]
        sha = hashlib.sha256(body).hexdigest()
        problems: list[str] = []
        ranks: list[int] = []
        rows: list[Tensor] = []
        for u in judged:
            found, rank, version, digest, row = verify(u, t)
            problems += found
            if rank is None:
                continue
            if rank in ranks:
                problems.append(f"{where}: two rejected updates of rank {rank}")
            if version != t:
                problems.append(f"{where}: rank {rank}'s rejected update is of version {version}, not the newest "
                                f"({t}): a zero step follows the rejection of version {t}")
            if digest is not None and digest != sha:
                problems.append(f"{where}: rank {rank}'s rejected update was computed at θ {digest[:12]}…, not at the "
                                f"recorded θ ({sha[:12]}…)")
            ranks.append(rank)
            if row is not None:
                if not bool(torch.isfinite(row).all()):  # the server drops such a row before any filter judges it
                    problems.append(f"{where}: rank {rank}'s rejected update is not finite: the server drops such "
                                    "an update before its filter judges it, so it cannot make a zero step")
                rows.append(row)
        if problems:
            return problems
        if self.recomputes and len(rows) == len(ranks):
            algo: Any = steps.algo
            keep = algo.screen(steps.exp, {}, theta, t, torch.tensor(ranks), torch.stack(rows),
                               torch.full((len(ranks),), t), theta[None])[1]
            passed = [r for r, k in zip(ranks, keep.tolist()) if k]
            if passed:
                return [f"{where}: rank {passed[0]}'s update passes {algo.name}'s filter at the recorded θ: a zero "
                        "step recorded while an accepted update exists"]
        try:
            made, _, _ = zero_rows(steps.exp, ranks, theta)
            if [_digest(r) for r in made] != rec["rows"]:
                return [f"{where}: the recorded rows are not the algorithm's rows of a zero step"]
            result = steps.exp.rule(made) if self.results else None
        except (PhalanxError, ArithmeticError, LookupError, RuntimeError, TypeError, ValueError) as exc:
            return [f"{where}: {steps.exp.rule.name} cannot take a zero step's rows "
                    f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"]
        if result is not None and _digest(result) != rec["result"]:
            return [f"{where}: the recorded result is not {steps.exp.rule.name} over a zero step's rows"]
        if self.still and rec["result"] == _digest(theta.new_zeros(steps.dim)):
            self.unchanged[t + 1] = (t, sha)
        return []
