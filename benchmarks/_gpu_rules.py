"""The ``rules`` workload of ``benchmarks/gpu.py``: every robust rule of the registry on one device, each beside that
device's bandwidth floor (issue 37, item 7).

Input: ``make_setting`` of ``benchmarks/_bench_worker.py`` (Gaussian rows around a random mean, float32, seeded, a
zero centre for cc and a reference row for FLTrust), built on the CPU and copied to the device once; n = 64,
d = 2²⁰, f = 12 (``--quick``: n = 11, d = 4,096, f = 2). The rules: every rule of ``phalanx.aggregators.names("rule")``
whose tags say ``robust`` (the mean is not), then every pre-aggregator of ``names("pre")`` chained before the trimmed
mean (``nnm>cwtm``, ``clip>cwtm``, ``arc>cwtm``, ``bucketing>cwtm``), with the parameters ``make bench`` gives them
(``_bench_worker.CASES``: multikrum's m = n − f, cc's τ and 3 iterations, clip's threshold, bucketing's s = 2,
FLDetector's 12 warm rounds on perturbed copies before it is timed).

Each rule: one warm-up call, then up to ``rounds`` timed calls (fewer once :data:`RULE_BUDGET_S` of timed calls is
spent; the record says how many), each ending with ``torch.cuda.synchronize`` on CUDA; the median is reported. A
call past ``limit`` seconds (SIGALRM, ``_bench_worker._limited``) or one that raises is reported as ``timeout`` or
the error's first line, and the next rule runs (on CUDA the allocator's cache is emptied first).

The floors, measured on the same device in the same process:

* **bandwidth floor** = B ÷ W with B = n·d·4 bytes (the input, which every rule reads at least once) and W the
  device's copy bandwidth: W = 2·S ÷ t, t the median time of ``dst.copy_(src)`` over S = max(B, 64 MiB) bytes (S read
  and S written). ``× floor`` = the rule's time ÷ B/W. It is a bound on no rule (a small input read from cache can
  beat a copy bandwidth measured over 64 MiB); it says how far a rule is from streaming its input once.
* **x.sum(0)** — one streaming pass on the device, the ``pass`` floor of ``benchmarks/_bench_floors.py``; and the
  rule's declared floor there (``pass``, ``passes(k)``, ``gemm``, ``copy``, sums along a chain), timed on the device.

:func:`check` recomputes every printed ratio from the recorded raw times (the copy's bytes and seconds, n, d, the
rule's median) with its own arithmetic: a floor computed against another byte count, or from a wrong bandwidth,
makes it fail (``tests/test_device.py``).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import _bench_floors
from _bench_common import fmt_time, md_row
from _bench_peers import Setting
from _bench_worker import CASES, Case, _err, _limited, build_phalanx, make_setting, phalanx_context

FULL = (64, 2**20, 12)
QUICK = (11, 4096, 2)
"""n = 11, not 10: Bulyan needs n ≥ 4f + 3 = 11 at f = 2, and the quick run is to print a ratio for every rule."""
ITEMSIZE = 4
"""Bytes of a float32 coordinate."""
COPY_MIN_BYTES = 2**26
RULE_BUDGET_S = 2.0
"""Timed calls of one rule stop once they add up to this (at least one is timed)."""
PRE_RULE = "cwtm"
"""The rule every pre-aggregator is chained before."""


def specs() -> list[str]:
    """Every robust rule of the registry, then every pre-aggregator chained before :data:`PRE_RULE`."""
    from phalanx.aggregators import get_tags, names

    return [r for r in names("rule") if get_tags(r).robust] + [f"{p}>{PRE_RULE}" for p in names("pre")]


def case_for(spec: str) -> Case:
    """The ``make bench`` case of ``spec`` (its parameters and warm rounds); a chain takes its pre-aggregator's
    parameters, addressed to that element (``clip__threshold``)."""
    known = {c.key: c for c in CASES if not c.inplace}
    if ">" not in spec:
        c = known.get(spec)
        return Case(spec, spec, params=c.params, warm_rounds=c.warm_rounds) if c else Case(spec, spec)
    pre = spec.split(">")[0]
    c = known.get(pre)
    if c is None:
        return Case(spec, spec)
    own = c.params
    return Case(spec, spec, params=lambda s: {f"{pre}__{k}": v for k, v in own(s).items()})


def sync_for(dev: torch.device) -> Callable[[], None]:
    """``torch.cuda.synchronize`` on ``dev`` for a CUDA device; nothing on the CPU."""
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


def bandwidth(copy_bytes: int, copy_s: float) -> float:
    """Bytes per second of a copy of ``copy_bytes`` that took ``copy_s``: read and written, 2·S ÷ t."""
    return 2 * copy_bytes / copy_s


def floor_s(n: int, d: int, bytes_per_s: float) -> float:
    """The bandwidth floor of an (n, d) float32 input: n·d·4 bytes ÷ the copy bandwidth (inf for a bandwidth ≤ 0)."""
    return n * d * ITEMSIZE / bytes_per_s if bytes_per_s > 0 else math.inf


def measure_copy(dev: torch.device, nbytes: int, reps: int, sync: Callable[[], None]) -> tuple[int, float]:
    """``(S, t)``: the bytes of one float32 ``dst.copy_(src)`` of at least ``nbytes`` (:data:`COPY_MIN_BYTES`) on
    ``dev`` and its median time over ``reps`` copies after one untimed."""
    numel = max(nbytes, COPY_MIN_BYTES) // ITEMSIZE
    src = torch.ones(numel, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - t0)
    return numel * ITEMSIZE, statistics.median(times)


def _on(s: Setting, dev: torch.device) -> Setting:
    out = Setting(n=s.n, d=s.d, f=s.f, x=s.x.to(dev), center=s.center.to(dev))
    out._cache["reference"] = s._cache["reference"].to(dev)
    return out


def _release(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def time_rule(spec: str, s: Setting, x_ref: torch.Tensor, rounds: int, limit: float,
              sync: Callable[[], None]) -> dict[str, Any]:
    """One rule on ``s`` (on its device): the record (status, median, times, declared floor)."""
    case = case_for(spec)
    rec: dict[str, Any] = {"spec": spec, "notes": []}
    try:
        obj, params, note = build_phalanx(case, s)
    except Exception as exc:
        return {**rec, "status": f"error building: {_err(exc)}"}
    if note:
        rec["notes"].append(note)
    ctx, cnote = phalanx_context(obj, s)
    if cnote:
        rec["notes"].append(cnote)

    def call(v: torch.Tensor) -> Any:
        out = obj(v, **ctx)
        sync()
        return out

    try:
        gen = torch.Generator().manual_seed(s.n)  # a stateful rule's warm rounds: perturbed copies, drawn on the CPU
        for _ in range(case.warm_rounds):
            _limited(call, s.x + 0.01 * torch.randn(s.x.shape, generator=gen).to(s.x.device), limit)
        out, warm = _limited(call, s.x, limit)
        times: list[float] = []
        while len(times) < rounds and (not times or sum(times) < RULE_BUDGET_S):
            out, dt = _limited(call, s.x, limit)
            times.append(dt)
        finite = bool(torch.isfinite(out).all())
        floor_plan = _bench_floors.plan(spec, params, lambda: call(s.x))
    except Exception as exc:
        return {**rec, "status": _err(exc)}
    if not torch.equal(s.x, x_ref):
        rec["notes"].append("the rule MODIFIED ITS INPUT (restored)")
        s.x.copy_(x_ref)
    if case.warm_rounds:
        rec["notes"].append(f"timed after {case.warm_rounds} rounds on perturbed copies (a full history)")
    return {**rec, "status": "ok" if finite else "non-finite output", "time_s": statistics.median(times),
            "times_s": times, "warmup_s": warm, "floor_plan": floor_plan,
            "floor_kind": _bench_floors.label(floor_plan)}


def run(device: str, quick: bool, rounds: int, limit: float, only: list[str] | None = None,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every rule of :func:`specs` (or ``only``) on ``device``, with the device's floors; one result."""
    from phalanx.training import devices

    n, d, f = QUICK if quick else FULL
    dev = devices.resolve(device)
    sync = sync_for(dev)
    cpu = make_setting(n, d, f, seed=0)
    s = _on(cpu, dev)
    del cpu
    x_ref = s.x.clone()
    copy_bytes, copy_s = measure_copy(dev, n * d * ITEMSIZE, 10, sync)
    parts = _bench_floors.measure(s.x, [("gemm", 1), ("copy", 1)], reps=10, sync=sync)
    bw = bandwidth(copy_bytes, copy_s)
    say(f"  rules on {dev}: copy {copy_bytes / 2**20:.0f} MiB in {fmt_time(copy_s)} = {bw / 1e9:.1f} GB/s; floor of "
        f"{n}×{d} float32 = {fmt_time(floor_s(n, d, bw))}; x.sum(0) {fmt_time(parts['pass'])}")
    recs = []
    for spec in only or specs():
        t0 = time.perf_counter()
        rec = time_rule(spec, s, x_ref, rounds, limit, sync)
        if rec["status"] == "ok":
            rec["declared_s"] = _bench_floors.declared(rec["floor_plan"], parts)
        recs.append(rec)
        _release(dev)
        say(f"    {spec}: {fmt_time(rec['time_s']) if 'time_s' in rec else rec['status']} "
            f"({time.perf_counter() - t0:.1f} s)")
    return {"device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
            "n": n, "d": d, "f": f, "itemsize": ITEMSIZE, "copy_bytes": copy_bytes, "copy_s": copy_s,
            "bandwidth_Bps": bw, "floor_s": floor_s(n, d, bw), "pass_s": parts["pass"], "gemm_s": parts["gemm"],
            "rules": recs}


def _ratio(x: float) -> str:
    return f"{x:.3g}×" if math.isfinite(x) else "inf×"


def table(results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: a header line per device (its copy bandwidth and floor), then one row per rule."""
    lines = [md_row(["rule", "device", "median", "calls", "floor n·d·4 ÷ BW", "× floor", "x.sum(0)", "× sum",
                     "declared", "× declared"]),
             md_row(["---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---", "---:"])]
    for res in results:
        dev = res["device"] + (f" ({res['gpu']})" if res["gpu"] else "")
        for r in res["rules"]:
            if r["status"] != "ok":
                lines.append(md_row([r["spec"], dev, r["status"], "—", fmt_time(res["floor_s"]), "—",
                                     fmt_time(res["pass_s"]), "—", "—", "—"]))
                continue
            t = r["time_s"]
            lines.append(md_row([r["spec"], dev, fmt_time(t), str(len(r["times_s"])), fmt_time(res["floor_s"]),
                                 _ratio(t / res["floor_s"]),
                                 fmt_time(res["pass_s"]), _ratio(t / res["pass_s"]), r["floor_kind"],
                                 _ratio(t / r["declared_s"])]))
    return lines


def notes(results: list[dict[str, Any]]) -> list[str]:
    """One line per device (bandwidth, sizes, timed calls) and per rule note."""
    out = []
    for res in results:
        out.append(f"rules on {res['device']}: n = {res['n']}, d = {res['d']:,}, f = {res['f']}, float32; copy "
                   f"bandwidth {res['bandwidth_Bps'] / 1e9:.1f} GB/s (dst.copy_(src) of "
                   f"{res['copy_bytes'] / 2**20:.0f} MiB, 2·S ÷ {fmt_time(res['copy_s'])}); median of 'calls' timed "
                   f"calls after one warm-up (up to --rounds, stopped after {RULE_BUDGET_S:g} s of them)")
        out += [f"  {r['spec']}: {'; '.join(r['notes'])}" for r in res["rules"] if r["notes"]]
    return out


def check(results: list[dict[str, Any]], lines: list[str]) -> list[str]:
    """Problems with the printed ``× floor`` column, recomputed from the raw records: time · (2·S/t) ÷ (n·d·4).

    Each printed ratio (3 significant digits) must be within half a unit of its last digit of the recomputed one;
    the copy must have moved bytes in a positive time.
    """
    problems = []
    at = [c.strip() for c in lines[0].strip().strip("|").split("|")].index("× floor")
    rows = lines[2:]
    k = 0
    for res in results:
        if not (res["copy_bytes"] > 0 and res["copy_s"] > 0):
            problems.append(f"{res['device']}: copy of {res['copy_bytes']} bytes in {res['copy_s']} s")
            continue
        per_byte_s = res["copy_s"] / (2.0 * res["copy_bytes"])
        floor = res["n"] * res["d"] * 4 * per_byte_s
        for r in res["rules"]:
            cells = [c.strip() for c in rows[k].strip("|").split("|")]
            k += 1
            if r["status"] != "ok":
                continue
            want = r["time_s"] / floor
            try:
                got = float(cells[at].rstrip("×"))
            except ValueError:
                problems.append(f"{r['spec']} on {res['device']}: × floor printed as {cells[at]!r}")
                continue
            if abs(got - want) > 0.5 * 10 ** (math.floor(math.log10(want)) - 2) * 1.0001:
                problems.append(f"{r['spec']} on {res['device']}: × floor printed {got:g}, recomputed {want:.4g}")
    return problems
