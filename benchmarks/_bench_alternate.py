"""Time several implementations of one rule on the same input, call by call in turn, so that a change of the
machine's load lands on all of them alike.

``make bench`` timed Phalanx's calls, then each peer's in a block of its own: on a shared 2-core machine a load
swing between two blocks fell on one side only, and the same cell read 1.21×, 0.52× and 1.38× in three runs minutes
apart while the calls inside each block agreed to 2 % (issue 37, the shared rules at n = 10 … 1,000). Here every
contender is warmed up once, then called once per round, the order rotating by one each round; each keeps its own
repetition count (fewer for a slow call at d ≥ 10⁶) and stops after a call past the cap.

A contender that changes its input is timed after the others, alone, its input restored after every call (outside
the clock): alternating it would hand the next contender a changed input.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Contender:
    """One implementation: ``call`` on the argument ``arg(base)`` makes (before the clock), ``base`` from the first of
    ``prepares`` whose warm-up call succeeds (a peer's fallback input: ByzFL's numpy array where torch's quantile
    refuses the size)."""

    call: Callable[[Any], Any]
    arg: Callable[[Any], Any]
    prepares: list[Callable[[], Any]]
    fallback_note: str = ""
    base: Any = None
    warm: float = 0.0
    reps: int = 0
    times: list[float] = field(default_factory=list)
    output: Any = None
    error: BaseException | None = None
    notes: list[str] = field(default_factory=list)
    changed_input: bool = False
    note: str = ""
    """Why it was timed once (its warm-up, or its first timed call, took longer than the cap), else empty."""
    max_reps: int | None = None
    """At most this many timed calls (a floor's GEMM at large n: a few suffice), else the rotation's count."""
    before: Callable[[], Any] | None = None
    """Run untimed just before each timed call, after its argument is made (``make bench``: a cache scrub, so that
    every call of Phalanx, of its peers and of its floor starts from the same state)."""

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def single(self) -> bool:
        return bool(self.note)


Limited = Callable[[Callable[[Any], Any], Any, float], tuple[Any, float]]


def describe(exc: BaseException) -> str:
    """An error as a table cell or note says it: its type and the first line of its message, at most 300 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


def _warm_up(c: Contender, limited: Limited, limit: float, timeout: type[BaseException]) -> None:
    """Prepare ``c``'s input (its fallback when the first one's call raises, not when it times out) and call it
    once, untimed; an error is kept in ``c.error``."""
    for i, prepare in enumerate(c.prepares):
        try:
            c.base = prepare()
            c.output, c.warm = limited(c.call, c.arg(c.base), limit)
            return
        except timeout as exc:
            c.error = exc
            return
        except Exception as exc:
            if i + 1 == len(c.prepares):
                c.error = exc
                return
            c.notes.append(c.fallback_note.format(err=describe(exc)))


def measure_alternating(contenders: list[Contender], x: torch.Tensor, x_ref: torch.Tensor, reps: int, big: bool,
                        limit: float, cap: float, slow: float, limited: Limited,
                        timeout: type[BaseException]) -> None:
    """Warm each contender up, then time them in turn (module docstring): each gets ``reps`` calls (at most 3 when
    ``big`` and its warm-up took over ``slow`` s; none past a call over ``cap`` s). ``x`` is the shared input,
    ``x_ref`` its pristine copy: a contender that changed ``x`` is noted, ``x`` restored, and it is timed last."""
    alternating: list[Contender] = []
    alone: list[Contender] = []
    for c in contenders:
        _warm_up(c, limited, limit, timeout)
        if not torch.equal(x, x_ref):
            x.copy_(x_ref)
            c.changed_input = True
        if c.error is not None:
            continue
        if c.warm > cap:
            c.times, c.reps, c.note = [c.warm], 1, f"one call: the warm-up took > {cap:.0f} s"
            continue
        c.reps = min(reps, 3) if big and c.warm > slow else reps
        if c.max_reps is not None:
            c.reps = min(c.reps, c.max_reps)
        (alone if c.changed_input else alternating).append(c)

    def once(c: Contender) -> bool:
        arg = c.arg(c.base)
        if c.before is not None:
            c.before()
        try:
            c.output, dt = limited(c.call, arg, limit)
        except Exception as exc:
            c.error = exc
            return False
        del arg
        c.times.append(dt)
        return dt <= cap

    rounds = max((c.reps for c in alternating), default=0)
    live = list(alternating)
    for r in range(rounds):
        turn = live[r % len(live):] + live[:r % len(live)] if live else []
        for c in turn:
            if len(c.times) < c.reps and c.error is None and not once(c):
                live.remove(c)
        live = [c for c in live if len(c.times) < c.reps and c.error is None]
        if not live:
            break
    for c in alone:
        for _ in range(c.reps):
            ok = once(c)
            x.copy_(x_ref)
            if not ok:
                break
    for c in contenders:
        if not c.note and len(c.times) == 1 and c.reps > 1:
            c.note = f"one call: it took > {cap:.0f} s"
