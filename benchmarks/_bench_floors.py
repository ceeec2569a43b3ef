"""Each rule's own floor: the least memory traffic (or arithmetic) its definition needs, timed in the worker.

A rule's ``× floor`` is its time over the time of the work its definition cannot avoid on an ``(n, d)`` float32
input, measured in the same process under the same load — in ``make bench``, each part a contender of the rule's
rotation, each of its calls and Phalanx's after the same cache scrub (``_bench_worker.floor_contenders``), so that
the rule and its floor start from the same state:

* ``pass`` — one streaming pass, ``x.sum(0)``: coordinate-wise rules (cwmed, cwtm, meamed, signmaj, rlr), norm
  rules (cge, signguard, fltrust), averaging pre-aggregators (bucketing), rules whose extra work is on a small
  subsample or history (dnc, fldetector), and the clipping pre-aggregators run in place (``clip in place``,
  ``arc in place``: ``mix_`` reads every row and rewrites only what it changes);
* ``copy`` — one read of ``x`` and one write of a fresh ``(n, d)`` output, ``new_rows(x.shape, x).copy_(x)``
  (``_rowops.new_rows``, the allocation the rules use): the clipping pre-aggregators called as ``pre(x)`` (clip,
  arc), which keep ``x`` and return ``n`` new rows. Writing fresh memory costs more than reading it (the kernel
  zeroes every new page before the rule writes it), so one pass is not a floor such a call can approach;
* ``passes(k)`` — ``k`` passes for ``k``-iteration rules: ``cc`` (``k`` = its ``iterations``) and ``geomed``
  (``k`` = the Weiszfeld iterations the call ran, counted once outside the timing: each iteration takes one
  ``torch.dot``, counted under a ``TorchFunctionMode``);
* ``gemm`` — the Gram matrix ``x·xᵀ`` (``torch.mm``), for rules defined on all pairwise distances or cosines
  (krum, multikrum, mda, bulyan, nnm, monna — a benchmark case shown when registered —, clippedclustering, flame,
  foolsgold, caf, smea).

A chain (``nnm>mean``) has the sum of its components' floors (``gemm+pass``). Each rule declares its kind on its
class (``floor``; one pass by default, so a new rule is still its one file); a case that is no registered rule gets
one pass and is labelled ``pass (undeclared)``. A floor is a declared lower bound of
the work, not a claim that the rule could reach it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from phalanx.aggregators import registry

KINDS = ("pass", "copy", "passes", "gemm")
"""The floor kinds a rule may declare (:attr:`phalanx.aggregators.base._Component.floor`)."""

PEERS: dict[str, str] = {"monna": "gemm"}
"""Floor kinds of the benchmark cases that are no Phalanx rule (``monna``: shown when registered)."""


def floor_kinds() -> dict[str, str]:
    """Floor kind of every registered rule and pre-aggregator, as its class declares it (its ``floor``: one pass
    unless the class says otherwise, so a new rule needs no entry here), and of :data:`PEERS`."""
    declared = {name: str(getattr(registry.get_class(name), "floor", UNDECLARED)) for name in registry.names()}
    return declared | PEERS


UNDECLARED = "pass (undeclared)"

FLOOR_KINDS: dict[str, str] = floor_kinds()
"""Floor kind of every registered rule and pre-aggregator (``tests/test_bench_floors.py`` checks each is one of
:data:`KINDS`)."""


class _CountDots(TorchFunctionMode):
    """Counts ``torch.dot`` calls (one per Weiszfeld iteration of ``geomed``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.dot:
            self.count += 1
        return func(*args, **(kwargs or {}))


def components(spec: str) -> list[str]:
    """Names of the components of a spec (``nnm>mean`` → ``["nnm", "mean"]``; parameters dropped)."""
    return [part.split("(")[0].split(":")[0].strip() for part in spec.split(">")]


def plan(spec: str, params: dict[str, Any], call: Callable[[], Any] | None = None,
         inplace: bool = False) -> list[tuple[str, int]]:
    """The floor of ``spec`` as ``[(kind, k), ...]`` (summed), ``k`` the number of passes of a ``passes`` kind.

    ``params`` are the rule's flattened parameters (``iterations`` of cc); ``call`` runs the rule once (untimed) to
    count geomed's iterations; ``inplace``: the case times ``mix_`` on rows the caller gives up, so a ``copy``
    floor is one ``pass`` (no fresh output).
    """
    out = []
    for name in components(spec):
        kind = FLOOR_KINDS.get(name, UNDECLARED)
        if inplace and kind == "copy":
            kind = "pass"
        k = 1
        if name == "cc":
            k = int(params.get("iterations", 1))
        elif name == "geomed" and call is not None:
            with _CountDots() as counter:
                call()
            k = max(1, counter.count)
        out.append((kind, k))
    return out


def label(floor_plan: list[tuple[str, int]]) -> str:
    """``pass``, ``passes(3)``, ``gemm+pass``, ``pass (undeclared)``."""
    return "+".join(f"passes({k})" if kind == "passes" else kind for kind, k in floor_plan)


def _nothing() -> None:
    pass


def _median_time(fn: Callable[[], Any], reps: int, sync: Callable[[], None] = _nothing) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(x: torch.Tensor, floor_plan: list[tuple[str, int]], reps: int = 10,
            sync: Callable[[], None] = _nothing) -> dict[str, float]:
    """Seconds of the floor of ``floor_plan`` on ``x``, with its parts: ``{"floor", "pass", "gemm"?, "copy"?}``.

    ``pass`` is the median of ``reps`` calls of ``x.sum(0)``; ``gemm`` the median of ``max(3, reps // 3)`` calls of
    ``torch.mm(x, x.T)`` and ``copy`` the median of ``reps`` fresh copies ``new_rows(x.shape, x).copy_(x)`` (each
    timed only when a component needs it); ``passes(k)`` is ``k`` × pass. ``sync`` ends every call
    (``torch.cuda.synchronize`` for a CUDA ``x``: the time is the kernel's, not its launch).
    """
    parts = {kind: _median_time(call, part_reps(kind, reps), sync) for kind, call in part_calls(x, floor_plan).items()}
    return {"floor": declared(floor_plan, parts), **parts}


def part_calls(x: torch.Tensor, floor_plan: list[tuple[str, int]]) -> dict[str, Callable[[], Any]]:
    """The calls that time the parts ``floor_plan`` needs: ``pass`` always (``x.sum(0)``), ``gemm``
    (``torch.mm(x, x.T)``) and ``copy`` (``new_rows(x.shape, x).copy_(x)``) where a component has that kind."""
    calls: dict[str, Callable[[], Any]] = {"pass": lambda: x.sum(0)}
    if any(kind == "gemm" for kind, _ in floor_plan):
        calls["gemm"] = lambda: torch.mm(x, x.T)
    if any(kind == "copy" for kind, _ in floor_plan):
        from phalanx.aggregators._rowops import new_rows

        calls["copy"] = lambda: new_rows(tuple(x.shape), x).copy_(x)
    return calls


def part_reps(kind: str, reps: int) -> int:
    """Timed calls of a part: ``reps``, but ``max(3, reps // 3)`` for the GEMM (seconds a call at n = 1,000)."""
    return max(3, reps // 3) if kind == "gemm" else reps


def declared(floor_plan: list[tuple[str, int]], parts: dict[str, float]) -> float:
    """Seconds of the floor of ``floor_plan`` from measured ``parts`` (``pass``, and ``gemm`` / ``copy`` where the
    plan has them): ``gemm`` and ``copy`` once, ``k`` passes for ``passes(k)``, one pass for any other kind."""
    return sum(parts[kind] if kind in ("gemm", "copy") else k * parts["pass"] for kind, k in floor_plan)
