"""One benchmark setting (n, d, f, threads) in one process: build the input, time every rule, write JSON lines.

The parent process (``aggregators.py``) starts one worker per setting with the thread environment variables set
before anything is imported, then reads the JSON lines back. A worker that dies or runs out of time leaves the
lines it already wrote.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import pkgutil
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import _bench_floors
from _bench_alternate import Contender, describe, measure_alternating
from _bench_peers import INPLACE, Peer, Setting, build_peers, peer_versions

CAP_S = 20.0
"""A call (warm-up or first timed one) slower than this is reported alone, without further repetitions."""
SLOW_S = 1.0
"""At d ≥ 10⁶, a call slower than this gets 3 repetitions instead of 5."""
AGREE_REL = 1e-4
"""Relative max-abs difference above which a peer is flagged as disagreeing."""


@dataclass(frozen=True)
class Case:
    """A rule to benchmark: the Phalanx spec, how it is built, and which peers implement it."""

    key: str
    spec: str
    kind: str = "rule"
    """``rule`` (built with ``make``) or ``pre`` (a pre-aggregator timed alone, via its class)."""
    params: Callable[[Setting], dict[str, Any]] = lambda s: {}
    """Preferred parameters of the Phalanx rule (Phalanx defaults are used if the rule rejects them)."""
    coordinatewise: bool = False
    norm: bool = False
    """A norm rule (issue 37: within 2.5× its own floor: one pass, or a fresh copy for ``pre(x)``)."""
    optional: bool = False
    """Shown only when Phalanx registers it (ByzFL-only rules: MoNNA, CAF, SMEA)."""
    inplace: bool = False
    """Timed through ``mix_`` (a caller that owns its rows and gives them up) on a copy of the input made before the
    clock starts, beside the peers that also overwrite their input; the plain case (``clip``) is the copying call
    ``pre(x)``, beside peers that leave their input as it was (ByzFL's in-place rules then clip a copy, on the
    clock)."""
    warm_rounds: int = 0
    """A stateful rule is called this many times on perturbed copies of the input before it is timed, so that the
    timed calls are rounds with a full history (FLDetector: its window filled, every client predicted)."""


def _median_norm(s: Setting) -> float:
    return float(torch.linalg.vector_norm(s.x - s.center, dim=1).median())


CASES: list[Case] = [
    Case("mean", "mean"),
    Case("cwmed", "cwmed", coordinatewise=True),
    Case("cwtm", "cwtm", coordinatewise=True),
    Case("meamed", "meamed", coordinatewise=True),
    Case("krum", "krum"),
    Case("multikrum", "multikrum", params=lambda s: {"m": s.n - s.f}),
    Case("geomed", "geomed"),
    Case("mda", "mda"),
    Case("bulyan", "bulyan"),
    Case("cc", "cc", params=lambda s: {"tau": _median_norm(s), "iterations": 3}),
    Case("nnm>mean", "nnm>mean"),
    Case("bucketing", "bucketing", kind="pre", params=lambda s: {"s": 2}),
    Case("clip", "clip", kind="pre", params=lambda s: {"threshold": _median_norm(s)}, norm=True),
    Case("arc", "arc", kind="pre", norm=True),
    Case(INPLACE.format("clip"), "clip", kind="pre", params=lambda s: {"threshold": _median_norm(s)}, inplace=True,
         norm=True),
    Case(INPLACE.format("arc"), "arc", kind="pre", inplace=True, norm=True),
    Case("signmaj", "signmaj"),
    Case("fltrust", "fltrust"),
    Case("dnc", "dnc"),
    Case("signguard", "signguard"),
    Case("clippedclustering", "clippedclustering"),
    Case("monna", "monna", optional=True),
    Case("caf", "caf", optional=True),
    Case("smea", "smea", optional=True),
    Case("cge", "cge", optional=True, norm=True),
    Case("fldetector", "fldetector", optional=True, warm_rounds=12),
]


# ---------------------------------------------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------------------------------------------


_LIMITS: list[Any] = []


def set_threads(threads: int) -> dict[str, Any]:
    """Use ``threads`` threads in torch, numba and numpy's BLAS; return what each library reports."""
    torch.set_num_threads(threads)
    info: dict[str, Any] = {"torch": torch.get_num_threads()}
    try:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        info["numba"] = numba.get_num_threads()
    except ImportError:
        info["numba"] = "not installed"
    try:
        from threadpoolctl import threadpool_limits

        _LIMITS.append(threadpool_limits(threads))
        info["blas"] = f"threadpoolctl limit {threads}"
    except ImportError:
        info["blas"] = f"env {os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"
    return info


# ---------------------------------------------------------------------------------------------------------------
# Phalanx
# ---------------------------------------------------------------------------------------------------------------

def import_phalanx() -> list[str]:
    """Import phalanx.aggregators and every module under it (so rules not yet listed in __init__ register).

    Returns the import errors (module: message) of modules that are being written and do not import yet.
    """
    import phalanx.aggregators as pa

    errors = []
    for info in pkgutil.walk_packages(pa.__path__, prefix="phalanx.aggregators."):
        if info.name in sys.modules:
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            errors.append(f"{info.name}: {type(exc).__name__}: {exc}")
    return errors


def phalanx_known(spec: str) -> bool:
    """Whether every element of ``spec`` is registered."""
    from phalanx.aggregators import registry

    try:
        for name, _ in registry.parse_spec(spec):
            registry.get_class(name)
    except Exception:
        return False
    return True


def build_phalanx(case: Case, s: Setting) -> tuple[Any, dict[str, Any], str]:
    """The Phalanx rule or pre-aggregator of ``case``, its flattened parameters, and a note on how it was built."""
    from phalanx.aggregators import make, registry
    from phalanx.errors import ConfigError

    wanted = case.params(s)
    note = ""

    def construct(params: dict[str, Any]) -> Any:
        if case.kind == "pre":
            return registry.get_class(case.spec)(f=s.f, **params)
        return make(case.spec, s.f, **params)

    try:
        obj = construct(wanted)
    except (ConfigError, TypeError) as exc:
        if not wanted:
            raise
        obj = construct({})
        note = f"Phalanx defaults (it rejected {sorted(wanted)}: {exc})"
    params = obj.params()
    flat: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, dict):
            flat.update(v)
        else:
            flat[k] = v
    return obj, flat, note


def phalanx_context(obj: Any, s: Setting) -> tuple[dict[str, Any], str]:
    """Per-call keyword arguments for a Phalanx rule: a centre for ``cc``, a reference vector for FLTrust."""
    known = {
        "center": s.center, "centre": s.center,
        "reference": s._cache["reference"], "server_update": s._cache["reference"],
        "root_gradient": s._cache["reference"], "trusted": s._cache["reference"],
        "server_gradient": s._cache["reference"],
    }
    ctx, unknown = {}, []
    for k in sorted(getattr(obj, "context_keys", ())):
        if k in known:
            ctx[k] = known[k]
        else:
            unknown.append(k)
    return ctx, (f"context keywords not passed (left to the rule's defaults): {', '.join(unknown)}" if unknown else "")


# ---------------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------------

class CallTimeout(Exception):
    """A single call ran past the per-call limit."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CallTimeout()


def _limited(fn: Callable[[Any], Any], arg: Any, limit: float) -> tuple[Any, float]:
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        t0 = time.perf_counter()
        out = fn(arg)
        dt = time.perf_counter() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return out, dt


def agreement(ph: np.ndarray, peer: np.ndarray) -> tuple[float | None, float | None, str]:
    """Max abs difference and its size relative to max|Phalanx output|."""
    if ph.shape != peer.shape:
        return None, None, f"shape {peer.shape} vs Phalanx {ph.shape}"
    diff = np.abs(ph - peer)
    if not np.all(np.isfinite(diff)):
        return float("inf"), float("inf"), "non-finite difference"
    maxabs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(ph).max()) if ph.size else 0.0
    return maxabs, (maxabs / scale if scale > 0 else maxabs), ""


# ---------------------------------------------------------------------------------------------------------------
# One setting
# ---------------------------------------------------------------------------------------------------------------

def make_setting(n: int, d: int, f: int, seed: int) -> Setting:
    """Gaussian honest rows around a common (random) mean, float32, seeded; centre 0; a reference row."""
    gen = torch.Generator().manual_seed(seed)
    mu = torch.randn(d, generator=gen)
    x = torch.randn(n, d, generator=gen).add_(mu)
    s = Setting(n=n, d=d, f=f, x=x, center=torch.zeros(d))
    s._cache["reference"] = mu + torch.randn(d, generator=gen)
    return s


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _err(exc: BaseException) -> str:
    return "timeout" if isinstance(exc, CallTimeout) else describe(exc)


def phalanx_input(case: Case, s: Setting) -> Callable[[], torch.Tensor]:
    """Phalanx's argument per call: a copy of the input made before the clock for the in-place form (``mix_``
    gives its rows up), else the shared input itself."""
    return (lambda: s.x.clone()) if case.inplace else (lambda: s.x)


def run_case(case: Case, s: Setting, x_ref: torch.Tensor, reps: int, peers_on: bool, limit: float) -> dict[str, Any]:
    """Time one rule — Phalanx and its peers call by call in turn (:mod:`_bench_alternate`) — and compare outputs."""
    big = s.d >= 10**6
    rec: dict[str, Any] = {"rule": case.key, "spec": case.spec, "kind": case.kind,
                           "coordinatewise": case.coordinatewise, "norm": case.norm, "peers": [],
                           "notes": []}
    if not phalanx_known(case.spec):
        rec["status"] = "not implemented yet"
        return rec
    try:
        obj, pparams, note = build_phalanx(case, s)
    except Exception as exc:
        rec["status"] = f"error building: {_err(exc)}"
        return rec
    rec["phalanx_params"] = {k: (v if isinstance(v, (int, float, str, bool)) or v is None else repr(v))
                             for k, v in pparams.items()}
    if note:
        rec["notes"].append(note)
    ctx, cnote = phalanx_context(obj, s)
    if cnote:
        rec["notes"].append(cnote)
    make_arg = phalanx_input(case, s)

    if case.inplace:
        def ph_call(v: torch.Tensor) -> Any:
            return obj.mix_(v)[0]
    elif case.kind == "pre":
        def ph_call(v: torch.Tensor) -> Any:
            return obj(v)
    else:
        def ph_call(v: torch.Tensor) -> Any:
            return obj(v, **ctx)

    if case.warm_rounds:
        gen = torch.Generator().manual_seed(s.n)
        for _ in range(case.warm_rounds):
            obj(s.x + 0.01 * torch.randn(s.x.shape, generator=gen), **ctx)
        rec["notes"].append(f"timed after {case.warm_rounds} rounds on perturbed copies (a full history)")
    scrub = cache_scrub(s)
    mine = Contender(ph_call, lambda base: make_arg(), [lambda: None], before=scrub)
    peers: list[Peer] = []
    if peers_on:
        try:
            peers = build_peers(case.key, s, pparams)
        except Exception as exc:
            rec["notes"].append(f"peers could not be built: {_err(exc)}")
    theirs = {id(p): _contender(p, scrub) for p in peers if not p.skip}
    floors = floor_contenders(s.x, _bench_floors.plan(case.spec, pparams, None, case.inplace), reps, scrub)
    measure_alternating([mine, *theirs.values(), *floors.values()], s.x, x_ref, reps, big, limit, CAP_S, SLOW_S,
                        _limited, CallTimeout)
    if mine.error is not None:
        rec["status"] = f"error: {_err(mine.error)}"
        if not isinstance(mine.error, CallTimeout):
            rec["traceback"] = "".join(traceback.format_exception(mine.error, limit=4))
        return rec
    rec["status"] = "ok"
    rec["floor_plan"] = _bench_floors.plan(case.spec, pparams, lambda: ph_call(make_arg()), case.inplace)
    parts = {kind: c.median for kind, c in floors.items() if c.error is None and c.times}
    if set(parts) == set(floors):
        rec["floor_parts"] = {"floor": _bench_floors.declared(rec["floor_plan"], parts), **parts}
    rec["phalanx"] = {"time": mine.median, "times": mine.times, "single": mine.single, "warmup": mine.warm,
                      "note": mine.note}
    if mine.changed_input:
        rec["notes"].append("Phalanx MODIFIED ITS INPUT")
    ph_out = mine.output.detach().cpu().double().numpy()
    mine.output = None
    for p in peers:
        rec["peers"].append(peer_record(p, theirs.get(id(p)), ph_out))
        if big:
            gc.collect()  # peers' (n, d) temporaries; skipped on small inputs, where one collection costs ~0.1 s
    flagged = [r for r in rec["peers"] if r.get("flag") and r.get("compare") == "output" and "out64" in r]
    if flagged:
        float64_check(obj, case, ctx, s, ph_out, flagged)
    for r in rec["peers"]:
        r.pop("out64", None)
    return rec


def _contender(p: Peer, before: Callable[[], Any] | None = None) -> Contender:
    """A peer as a contender: its prepared input (its fallback after a failed first call), a fresh copy of it per
    call where the peer changes or consumes its input (``p.fresh``, made before the clock); ``before`` runs before
    each timed call (:func:`cache_scrub`, as for Phalanx and the floor)."""
    fresh = p.fresh
    return Contender(p.call, (lambda base: fresh(base)) if fresh else (lambda base: base),
                     [p.prepare] + ([p.fallback] if p.fallback is not None else []), fallback_note=p.fallback_note,
                     before=before)


def float64_check(
    obj: Any, case: Case, ctx: dict[str, Any], s: Setting, ph_out: np.ndarray, flagged: list[dict[str, Any]],
) -> None:
    """For a disagreement, run Phalanx in float64 and say which side matches the exact-arithmetic result.

    Selection rules (Krum, NNM, ...) can pick a different row when two float32 distances nearly tie; the float64
    result tells a rounding near-tie apart from a different definition.
    """
    try:
        x64 = s.x.double()
        ctx64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                 for k, v in ctx.items()}
        out = obj(x64) if case.kind == "pre" else obj(x64, **ctx64)
        ph64 = out.detach().cpu().double().numpy()
        del x64, out
    except Exception as exc:
        for r in flagged:
            r["f64"] = {"error": _err(exc)}
        return
    _, ph_rel, _ = agreement(ph64, ph_out)
    for r in flagged:
        _, peer_rel, _ = agreement(ph64, r["out64"])
        if ph_rel is None or peer_rel is None:
            continue
        if ph_rel <= AGREE_REL < peer_rel:
            verdict = "Phalanx matches its float64 result, the peer does not"
        elif peer_rel <= AGREE_REL < ph_rel:
            verdict = "the peer matches Phalanx's float64 result, Phalanx float32 does not (float32 near-tie)"
        elif peer_rel <= AGREE_REL and ph_rel <= AGREE_REL:
            verdict = "both match the float64 result within 1e-4"
        else:
            verdict = "neither matches Phalanx's float64 result"
        r["f64"] = {"phalanx_rel": ph_rel, "peer_rel": peer_rel, "verdict": verdict}


def peer_record(p: Peer, c: Contender | None, ph_out: np.ndarray) -> dict[str, Any]:
    """A peer's cell: its time (from its contender ``c``; None: skipped) and its output compared with Phalanx's."""
    r: dict[str, Any] = {"column": p.column, "variant": p.variant, "timed": p.timed, "approx": p.approx,
                         "known": p.known, "notes": list(p.notes)}
    if p.skip or c is None:
        r["status"] = p.skip
        return r
    r["notes"] += c.notes
    if c.changed_input:
        r["notes"].append("it modified its input (restored; timed after the others, alone)")
    if c.error is not None:
        r["status"] = f"error: {_err(c.error)}"
        return r
    r["status"] = "ok"
    r.update(time=c.median, times=c.times, single=c.single, warmup=c.warm, note=c.note)
    try:
        out = p.output(c.output)
        ph = ph_out
        if p.compare == "rowmean":
            out = out.mean(axis=0) if out.ndim == 2 else out
            ph = ph.mean(axis=0) if ph.ndim == 2 else ph
        maxabs, rel, why = agreement(ph, out)
        if rel is not None and rel > AGREE_REL and not why:
            scale = float(np.abs(ph).max())
            r["ndiff"] = int((np.abs(ph - out) > AGREE_REL * scale).sum())
            r["size"] = int(ph.size)
    except Exception as exc:
        maxabs, rel, why = None, None, f"comparison failed: {_err(exc)}"
    c.output = None
    flag = bool(why) or (rel is not None and rel > AGREE_REL)
    r.update(maxabs=maxabs, rel=rel, compare=p.compare, compare_note=why, flag=flag)
    if flag and p.compare == "output" and not why:
        r["out64"] = out  # kept until the float64 check of run_case, then dropped
    return r


SCRUB_MIN_BYTES = 64 << 20


def cache_scrub(s: Setting) -> Callable[[], Any]:
    """Overwrite a buffer of ``max(2·x.nbytes, 64 MiB)`` (made once per setting): run before each timed call of
    Phalanx, of its peers and of its floor's parts, it pushes x (and the peer's own copy of it) out of the caches and
    absorbs what the previous call left behind (a peer's freed gigabytes), so every call starts from the same state
    — not a peer from the warm x Phalanx's call just read, nor Phalanx from the floor's. A numpy fill, on the
    calling thread: torch's ``fill_`` ran on its OpenMP team, whose threads then spin for a while and, on 2 cores,
    slowed the BLAS call that came next (``multikrum`` at n = 20, d = 10⁵ on 2 threads: 40.7 ms against 4.6 ms on
    one)."""
    if "scrub" not in s._cache:
        nbytes = max(2 * s.x.numel() * s.x.element_size(), SCRUB_MIN_BYTES)
        s._cache["scrub"] = np.zeros(nbytes // 4, dtype=np.float32)
    buf = s._cache["scrub"]
    return lambda: buf.fill(1.0)


def floor_contenders(x: torch.Tensor, floor_plan: list[tuple[str, int]], reps: int,
                     before: Callable[[], Any] | None = None) -> dict[str, Contender]:
    """The parts of a rule's floor (``_bench_floors.part_calls``) as contenders of its rotation, each call after
    ``before`` (:func:`cache_scrub`, as Phalanx's calls). Timed alone after the rotation, a pass at n = 10, d = 10⁶
    read x from the last-level cache while Phalanx, called after a peer whose temporaries had pushed x out, read it
    from memory; timed in the rotation without the scrub, the pass followed the peers (and what their freed
    gigabytes cost) while Phalanx followed the pass and found x warm."""
    return {kind: Contender(lambda _arg, call=call: call(), lambda base: None, [lambda: None],
                            max_reps=_bench_floors.part_reps(kind, reps), before=before)
            for kind, call in _bench_floors.part_calls(x, floor_plan).items()}


def floor_time(s: Setting, reps: int = 20) -> float:
    """The streaming floor: median time of ``x.sum(0)`` (one pass over the input).

    It is measured again just before every rule, so that each ratio compares timings taken under the same machine
    load.
    """
    s.x.sum(0)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        s.x.sum(0)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_setting(
    n: int, d: int, f: int, threads: int, reps: int, seed: int, peers_on: bool, rules: list[str] | None,
    out_path: str, limit: float,
) -> None:
    """Run every case of one setting and append one JSON line per result to ``out_path``."""
    info = set_threads(threads)
    import_errors = import_phalanx()
    s = make_setting(n, d, f, seed)
    x_ref = s.x.clone()
    floor = floor_time(s)
    label = f"n={n} d={d:.0e} f={f} threads={threads}"

    def emit(obj: dict[str, Any]) -> None:
        with open(out_path, "a") as fh:
            fh.write(json.dumps(obj, default=_json_default) + "\n")

    emit({"type": "setting", "n": n, "d": d, "f": f, "threads": threads, "threads_info": info, "floor": floor,
          "reps": reps, "seed": seed, "import_errors": import_errors,
          "versions": {"torch": torch.__version__, "numpy": np.__version__, **(peer_versions() if peers_on else {})}})
    _log(f"[{label}] floor x.sum(0) = {floor * 1e3:.2f} ms")
    if peers_on:
        from _bench_peers import STUBBED, load_byzfl

        try:
            load_byzfl()
        except Exception as exc:
            _log(f"[{label}] ByzFL does not import: {_err(exc)}")
        emit({"type": "stubs", "stubbed": list(STUBBED)})
    for case in CASES:
        if rules and case.key not in rules:
            continue
        if case.optional and not phalanx_known(case.spec):
            continue
        t0 = time.perf_counter()
        rec = run_case(case, s, x_ref, reps, peers_on, limit)
        rec["type"] = "case"
        floor_plan = rec.get("floor_plan") or _bench_floors.plan(case.spec, {}, inplace=case.inplace)
        rec["floor_kind"] = _bench_floors.label(floor_plan)
        if "floor_parts" not in rec:  # the rule failed before its rotation: its floor alone, after it
            rec["floor_parts"] = _bench_floors.measure(s.x, floor_plan)
        else:  # for the record: one pass timed alone, just after the rotation (x then mostly in the caches)
            rec["floor_parts"]["pass_alone"] = _bench_floors.measure(s.x, [("pass", 1)])["pass"]
        rec["floor"] = rec["floor_parts"]["floor"]
        emit(rec)
        if s.n * s.d >= 10**7:
            gc.collect()
        _log(f"[{label}] {case.key}: {_summary(rec)} ({time.perf_counter() - t0:.1f} s)")


def _summary(rec: dict[str, Any]) -> str:
    if rec.get("status") != "ok":
        return str(rec.get("status"))
    parts = [f"Phalanx {rec['phalanx']['time'] * 1e3:.1f} ms"]
    for p in rec["peers"]:
        name = p["column"] + (f" {p['variant']}" if p["variant"] else "")
        parts.append(f"{name} {p['time'] * 1e3:.1f} ms" if p.get("status") == "ok" else f"{name} {p['status']}")
    return ", ".join(parts)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return repr(o)
