"""``make bench`` times Phalanx and its peers call by call in turn (``benchmarks/_bench_alternate.py``): a load swing
between two blocks of calls fell on one side only (issue 37: one cell read 1.21×, 0.52×, 1.38× in three runs). No
timing is asserted: the order of the calls, the repetition counts, the fallback and the input checks are."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from _scripts import load_script

load_script("benchmarks/aggregators.py", "phalanx_bench_aggregators")  # puts benchmarks/ on sys.path

from _bench_alternate import Contender, measure_alternating  # noqa: E402


class Timeout(Exception):
    pass


def _run(contenders: list[Contender], x: torch.Tensor, reps: int = 4, clock: list[float] | None = None) -> list[str]:
    calls: list[str] = []

    def limited(fn: Any, arg: Any, limit: float) -> tuple[Any, float]:
        out = fn(arg)
        calls.append(out[0] if isinstance(out, tuple) else "?")
        return out, (clock.pop(0) if clock else 0.001)

    measure_alternating(contenders, x, x.clone(), reps, False, 60.0, 20.0, 1.0, limited, Timeout)
    return calls


def _named(name: str) -> Contender:
    return Contender(lambda arg: (name, arg), lambda base: base, [lambda: 0])


def test_calls_alternate_with_a_rotating_order() -> None:
    """Mutant: the block order (every call of one, then the next) gives a, a, a, a, a, b, … and fails."""
    x = torch.zeros(3, 4)
    calls = _run([_named("a"), _named("b"), _named("c")], x)
    assert calls[:3] == ["a", "b", "c"]  # the warm-ups
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]


def test_a_contender_that_changes_the_input_is_timed_alone_after_the_others() -> None:
    x = torch.zeros(3, 4)

    def writer(arg: Any) -> tuple[str, Any]:
        x.add_(1.0)
        return "w", arg

    w = Contender(writer, lambda base: base, [lambda: 0])
    a = _named("a")
    calls = _run([w, a], x, reps=2)
    assert calls == ["w", "a", "a", "a", "w", "w"] and w.changed_input and not a.changed_input
    assert torch.equal(x, torch.zeros(3, 4))  # restored after every call of the writer


def test_a_failing_first_input_falls_back_and_a_slow_call_stops_its_repetitions() -> None:
    x = torch.zeros(2, 2)

    def picky(arg: Any) -> tuple[str, Any]:
        if arg == "first":
            raise ValueError("too large for torch.quantile")
        return "p", arg

    p = Contender(picky, lambda base: base, [lambda: "first", lambda: "numpy"], fallback_note="fallback: {err}")
    slow = _named("s")
    # clock: p's warm-up, s's warm-up, then the timed calls: s's first over the cap (20 s) ends its timing
    calls = _run([p, slow], x, reps=3, clock=[0.1, 0.1, 0.1, 25.0, 0.1, 0.1])
    assert p.base == "numpy" and p.notes == ["fallback: ValueError: too large for torch.quantile"]
    assert len(p.times) == 3 and slow.times == [25.0] and slow.single and "took > 20 s" in slow.note
    assert calls.count("s") == 2  # its warm-up and one timed call


def test_an_error_is_kept_not_raised() -> None:
    def broken(arg: Any) -> Any:
        raise RuntimeError("boom")

    b = Contender(broken, lambda base: base, [lambda: 0])
    a = _named("a")
    _run([b, a], torch.zeros(1, 1), reps=2)
    assert isinstance(b.error, RuntimeError) and not b.times and len(a.times) == 2


def test_a_contender_with_max_reps_stops_there() -> None:
    """Mutant: ``max_reps`` ignored — the capped contender gets the rotation's 4 calls."""
    x = torch.zeros(3, 4)
    capped = Contender(lambda arg: ("g", arg), lambda base: base, [lambda: 0], max_reps=2)
    calls = _run([_named("a"), capped], x, reps=4)
    assert calls.count("g") == 1 + 2 and calls.count("a") == 1 + 4  # warm-ups and timed calls
    assert capped.reps == 2 and len(capped.times) == 2


def test_a_rules_floor_is_timed_between_the_same_calls_as_the_rule() -> None:
    """The floor's parts (one pass, the GEMM) join the rule's rotation, each timed call after the same cache scrub
    as the rule's, so that both start from the same state whatever call came before. Mutants: the floor timed
    alone after the rotation (the rule's calls all come first); the scrub left out before the floor's calls."""
    from _bench_worker import floor_contenders

    x = torch.randn(5, 8)
    order: list[str] = []
    floors = floor_contenders(x, [("gemm", 1), ("pass", 1)], reps=9, before=lambda: order.append("scrub"))
    assert set(floors) == {"gemm", "pass"} and floors["gemm"].max_reps == 3 and floors["pass"].max_reps == 9
    names = {id(floors["gemm"].call): "gemm", id(floors["pass"].call): "pass"}
    rule = Contender(lambda arg: ("rule", arg), lambda base: base, [lambda: 0], before=lambda: order.append("scrub"))

    def limited(fn: Any, arg: Any, limit: float) -> tuple[Any, float]:
        order.append(names.get(id(fn), "rule"))
        return fn(arg), 0.001

    measure_alternating([rule, *floors.values()], x, x.clone(), 9, False, 60.0, 20.0, 1.0, limited, Timeout)
    assert order[:3] == ["rule", "pass", "gemm"]  # the warm-ups, unscrubbed
    timed = order[3:]
    assert [c for c in timed if c != "scrub"][:6] == ["rule", "pass", "gemm", "pass", "gemm", "rule"]
    calls = [c for c in timed if c != "scrub"]
    assert calls.count("rule") == 9 and calls.count("pass") == 9 and calls.count("gemm") == 3
    assert all(timed[i - 1] == "scrub" for i, c in enumerate(timed) if c != "scrub")  # every timed call scrubbed
    assert torch.equal(floors["gemm"].output, x @ x.T) and torch.equal(floors["pass"].output, x.sum(0))


def test_every_timed_call_of_a_case_starts_after_the_scrub(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_case`` scrubs the caches before each timed call of Phalanx, of every peer and of every floor part, so
    that no contender reads x warm from the call before it. Mutant: the peers left unscrubbed (a peer then follows
    Phalanx's read of x)."""
    import _bench_worker
    from _bench_peers import Peer

    events: list[str] = []
    setting = _bench_worker.make_setting(6, 64, 1, seed=0)
    monkeypatch.setattr(_bench_worker, "cache_scrub", lambda s: lambda: events.append("scrub"))
    real_limited = _bench_worker._limited

    def limited(fn: Any, arg: Any, limit: float) -> tuple[Any, float]:
        events.append("call")  # any contender's call: Phalanx's, the peer's, a floor part's
        return real_limited(fn, arg, limit)

    monkeypatch.setattr(_bench_worker, "_limited", limited)
    peer = Peer(column="ByzFL", timed="fake", prepare=lambda: setting.x,
                call=lambda v: events.append("peer") or v.mean(0))
    monkeypatch.setattr(_bench_worker, "build_peers", lambda key, s, params: [peer])
    case = next(c for c in _bench_worker.CASES if c.key == "mean")
    rec = _bench_worker.run_case(case, setting, setting.x.clone(), 3, True, 60.0)
    assert rec["status"] == "ok" and set(rec["floor_parts"]) >= {"pass", "floor"}
    peer_calls = [i for i, e in enumerate(events) if e == "peer"]
    assert len(peer_calls) == 1 + 3  # its warm-up, then three timed calls
    assert all(events[i - 2 : i] == ["scrub", "call"] for i in peer_calls[1:])
    calls = [i for i, e in enumerate(events) if e == "call"]
    assert len(calls) == 3 * (1 + 3)  # Phalanx, the peer and the pass: a warm-up and three timed calls each
    assert all(events[i - 1] == "scrub" for i in calls[3:])
