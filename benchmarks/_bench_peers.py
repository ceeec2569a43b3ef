"""Adapters that run the peer libraries (ByzFL 0.0.11, ByzPy 0.1.4, Flower 1.42) on the benchmark's input.

Every adapter is a :class:`Peer`: ``prepare`` converts the benchmark's tensor into the peer's input format once,
outside the timed region; ``fresh`` (when the peer modifies or consumes its input) makes a new copy before every
repetition, also outside the timed region; ``call`` is the only thing that is timed. None of the peers' code is
copied here: the adapters call the installed packages.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

BYZFL = "ByzFL"
BYZPY = "ByzPy"
FLOWER_LEGACY = "Flower legacy"
FLOWER_MSG = "Flower msg"
PEER_COLUMNS = (BYZFL, BYZPY, FLOWER_LEGACY, FLOWER_MSG)

INPLACE = "{} in place"
"""The benchmark's name of a pre-aggregator's in-place case (``clip in place``: ``mix_`` on rows the caller gives
up, beside ByzFL's in-place rule on a copy made before the clock starts)."""

MDA_LIMIT = 10**6
"""ByzFL's MDA and SMEA enumerate all C(n, f) subsets in Python: above this many, they are not run."""


def rows_to_numpy(out: Any) -> np.ndarray:
    """A pre-aggregator's list of output rows (ByzPy's ``pre_aggregate``) as one float64 ``(n, d)`` ndarray."""
    return np.stack([np.asarray(o.detach().double().numpy() if isinstance(o, torch.Tensor) else o, np.float64)
                     for o in out])


def to_numpy(out: Any) -> np.ndarray:
    """A peer's output (tensor, ndarray or Flower's list of layers) as a float64 ndarray."""
    if isinstance(out, list):
        out = out[0]
    if isinstance(out, torch.Tensor):
        return out.detach().cpu().double().numpy()
    return np.asarray(out, dtype=np.float64)


@dataclass
class Peer:
    """One peer implementation of a rule, ready to be timed."""

    column: str
    """Which table column it belongs to (:data:`PEER_COLUMNS`)."""
    timed: str
    """The function (or expression) that is timed, as printed in the notes."""
    prepare: Callable[[], Any]
    """Builds the peer's input from the benchmark tensor (not timed)."""
    call: Callable[[Any], Any]
    """The timed call."""
    variant: str = ""
    fresh: Callable[[Any], Any] | None = None
    """Per-repetition copy of the prepared input (not timed), for peers that modify or consume their input."""
    fallback: Callable[[], Any] | None = None
    """Alternative input (ByzFL: a numpy array) when the first one raises, e.g. torch.quantile's size limit."""
    fallback_note: str = ""
    output: Callable[[Any], np.ndarray] = to_numpy
    compare: str = "output"
    """``output``: compare outputs directly; ``rowmean``: compare the mean over output rows (random bucketing)."""
    approx: bool = False
    """Not counted as the fastest peer unless it agrees with Phalanx (ByzFL GeometricMedian T=3)."""
    known: str = ""
    """Explanation printed when this peer disagrees with Phalanx."""
    skip: str | None = None
    """Why it is not run (infeasible, out of memory); the reason is printed in its cell."""
    notes: list[str] = field(default_factory=list)


@dataclass
class Setting:
    """The benchmark input of one setting, in every format the peers take."""

    n: int
    d: int
    f: int
    x: torch.Tensor
    """(n, d) float32, Gaussian rows (seeded); the same tensor for every library."""
    center: torch.Tensor
    """Centre for centered clipping (zeros: what a fresh ByzFL CenteredClipping starts from)."""
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def x_np(self) -> np.ndarray:
        """A numpy view of ``x`` (no copy)."""
        return self.x.numpy()

    def legacy_results(self) -> list[tuple[list[np.ndarray], int]]:
        """Flower legacy input: one ``([layer], num_examples)`` tuple per client (views of ``x``, no copy)."""
        if "legacy" not in self._cache:
            xn = self.x_np
            self._cache["legacy"] = [([xn[i]], 1) for i in range(self.n)]
        return self._cache["legacy"]

    def msg_contents(self) -> list[Any]:
        """Flower Message-API input: one RecordDict per client (ArrayRecord + num-examples), built once."""
        if "msg" not in self._cache:
            from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

            xn = self.x_np
            self._cache["msg"] = [
                RecordDict({
                    "arrays": ArrayRecord({"w": Array(np.ascontiguousarray(xn[i]))}),
                    "metrics": MetricRecord({"num-examples": 1}),
                })
                for i in range(self.n)
            ]
        return self._cache["msg"]


# ---------------------------------------------------------------------------------------------------------------
# Loading the peers
# ---------------------------------------------------------------------------------------------------------------

class _Anything:
    """Stands for any attribute of a stubbed module: callable, returns another stand-in."""

    def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
        return _Anything()

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()


def _stub_module(name: str) -> None:
    if name in sys.modules:
        return
    mod = types.ModuleType(name)
    mod.__dict__["__getattr__"] = lambda attr: _Anything()  # PEP 562: any attribute resolves
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)


STUBBED: list[str] = []


_BYZFL_IMPORT_ONLY = (
    ("torchvision", ("datasets", "transforms")),  # byzfl.benchmark.train builds transforms at import time
    ("seaborn", ()),  # heat maps in byzfl.benchmark.evaluate_results
    ("matplotlib", ("pyplot",)),  # plots in byzfl.benchmark.evaluate_results
    ("scipy", ("spatial", "spatial.distance")),  # byzfl.utils.misc: cdist for *numpy* inputs only
)


def load_byzfl() -> Any:
    """Import ByzFL with its import-time-only dependencies stubbed where they are not installed.

    ``import byzfl`` imports ``byzfl.benchmark``, which imports torchvision (transforms built at import time),
    seaborn and matplotlib (plots), and ``byzfl.utils.misc`` imports scipy (distances for numpy inputs). None of
    them is needed for the aggregators on torch tensors: each one that is absent is replaced in ``sys.modules`` by
    a module whose every attribute is a harmless stand-in (:data:`STUBBED` lists them) while byzfl imports, and
    removed from ``sys.modules`` again afterwards (byzfl keeps its references), so that code imported later — the
    test suite's other tests — never takes a stand-in for an installed module. torchvision must not be installed
    here (it would pull another torch).
    """
    import importlib.util

    for top, subs in _BYZFL_IMPORT_ONLY:
        if top in STUBBED or (top not in sys.modules and importlib.util.find_spec(top) is None):
            for name in (top, *(f"{top}.{sub}" for sub in subs)):
                _stub_module(name)
            if top not in STUBBED:
                STUBBED.append(top)
    try:
        import byzfl
    finally:  # also when byzfl is not installed: the stand-ins never outlive this call
        for name in [m for m in sys.modules if m.split(".")[0] in STUBBED]:  # byzfl keeps its references; nothing
            if isinstance(sys.modules[name], types.ModuleType) and "__getattr__" in vars(sys.modules[name]):  # else
                del sys.modules[name]  # imported later (torch, hypothesis) may find a stand-in for an absent module
    return byzfl


def load_byzpy() -> Any:
    """ByzPy's aggregators and pre-aggregators, as one namespace.

    ByzPy 0.1.4 is installed with ``--no-deps`` (its wheel pins torch < 2.6): its aggregator modules import numpy,
    torch and cloudpickle (its actor engine) and nothing else, so nothing is stubbed.
    """
    from byzpy.aggregators import coordinate_wise, geometric_wise, norm_wise
    from byzpy.pre_aggregators import ARC, Clipping

    return types.SimpleNamespace(
        Median=coordinate_wise.CoordinateWiseMedian, TrimmedMean=coordinate_wise.CoordinateWiseTrimmedMean,
        Krum=geometric_wise.Krum, MultiKrum=geometric_wise.MultiKrum, CGE=norm_wise.ComparativeGradientElimination,
        CenteredClipping=norm_wise.CenteredClipping, ARC=ARC, Clipping=Clipping,
    )


def peer_versions() -> dict[str, str]:
    """Installed versions of the peers (or why they are missing)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("byzfl", "byzpy", "flwr"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# ---------------------------------------------------------------------------------------------------------------
# Building the peers of each rule
# ---------------------------------------------------------------------------------------------------------------

def _byzfl(
    s: Setting, timed: str, make: Callable[[], Any], *, fresh: bool = False, variant: str = "",
    then: Callable[[Any], Any] | None = None, **kw: Any,
) -> Peer:
    """A ByzFL peer on the torch tensor (its framework's format), falling back to the numpy view if that raises."""

    def call(v: Any) -> Any:
        out = make()(v)
        return then(out) if then is not None else out

    def prep_torch() -> Any:
        return s.x

    def prep_np() -> Any:
        return s.x_np

    return Peer(
        column=BYZFL, timed=timed, prepare=prep_torch, call=call, variant=variant,
        fresh=(lambda v: v.clone() if isinstance(v, torch.Tensor) else v.copy()) if fresh else None,
        fallback=prep_np, fallback_note="numpy input (the torch input raised: {err})", **kw,
    )


def _copy(v: Any) -> Any:
    return v.clone() if isinstance(v, torch.Tensor) else v.copy()


def _byzfl_in_place(s: Setting, name: str, make: Callable[[], Any], *, copy: bool) -> Peer:
    """A ByzFL rule that overwrites its input (``Clipping``, ``ARC``), compared like with like.

    ``copy``: beside Phalanx's ``pre(x)``, which leaves ``x`` as it was, ByzFL clips a copy that it makes on the
    clock (what a caller who keeps its rows pays). Otherwise, beside Phalanx's ``mix_`` (in place), ByzFL clips a
    fresh copy made before the clock starts, as Phalanx's is.
    """
    if copy:
        return _byzfl(s, f"{name}(x.clone()) (the copy on the clock: ByzFL clips its input in place)",
                      lambda: lambda v: make()(_copy(v)))
    return _byzfl(s, f"{name}(copy of x) (clips in place; the copy made before the clock)", make, fresh=True)


def _byzpy_peer(s: Setting, timed: str, call: Callable[[Any], Any], *, pre: bool = False, **kw: Any) -> Peer:
    """A ByzPy peer on its own input format: a list of per-client tensors (views of ``x``, built before timing)."""
    return Peer(column=BYZPY, timed=timed, prepare=lambda: list(s.x.unbind(0)), call=call,
                output=rows_to_numpy if pre else to_numpy, **kw)


def byzpy_peers(rule: str, s: Setting, pparams: dict[str, Any]) -> list[Peer]:
    """ByzPy's implementation of ``rule`` (its direct API: ``aggregate(list)`` / ``pre_aggregate(list)``), if any."""
    try:
        bp = load_byzpy()
    except Exception as exc:
        return [Peer(column=BYZPY, timed="-", prepare=lambda: None, call=lambda v: None,
                     skip=f"not installed ({type(exc).__name__})")]
    f = s.f
    if rule == "cwmed":
        return [_byzpy_peer(s, "CoordinateWiseMedian().aggregate(list)", bp.Median().aggregate,
                            known="ByzPy's median is torch.median: for even n the lower of the two middle values "
                                  "(Phalanx: their mean)")]
    if rule == "cwtm":
        return [_byzpy_peer(s, f"CoordinateWiseTrimmedMean(f={f}).aggregate(list)", bp.TrimmedMean(f=f).aggregate)]
    if rule == "krum":
        return [_byzpy_peer(s, f"Krum(f={f}).aggregate(list)", bp.Krum(f=f).aggregate)]
    if rule == "multikrum":
        m = int(pparams.get("m") or (s.n - f))
        return [_byzpy_peer(s, f"MultiKrum(f={f}, q={m}).aggregate(list)", bp.MultiKrum(f=f, q=m).aggregate)]
    if rule == "cge":
        return [_byzpy_peer(s, f"ComparativeGradientElimination(f={f}).aggregate(list)", bp.CGE(f=f).aggregate)]
    if rule == "cc":
        tau, iters = float(pparams.get("tau", 100.0)), int(pparams.get("iterations", 1))
        agg = bp.CenteredClipping(c_tau=tau, M=iters, init="zero")
        return [_byzpy_peer(s, f"CenteredClipping(c_tau={tau:.6g}, M={iters}, init='zero').aggregate(list)",
                            agg.aggregate)]
    if rule == "clip":
        thr = next((float(pparams[k]) for k in ("threshold", "c", "tau", "max_norm") if k in pparams), 2.0)
        return [_byzpy_peer(s, f"Clipping(threshold={thr:.6g}).pre_aggregate(list)",
                            bp.Clipping(threshold=thr).pre_aggregate, pre=True)]
    if rule == "arc":
        return [_byzpy_peer(s, f"ARC(f={f}).pre_aggregate(list)", bp.ARC(f=f).pre_aggregate, pre=True)]
    return []


def _flower_trim_beta(n: int, f: int) -> tuple[float, int]:
    """Flower's trimming fraction for exactly f values cut per side, and the count Flower then cuts.

    Both Flower APIs cut ``int(beta * n)`` values per side. beta = f/n is used; if rounding made that cut f − 1,
    beta = (f + 0.5)/n is used instead.
    """
    beta = f / n
    if int(beta * n) != f:
        beta = (f + 0.5) / n
    return beta, int(beta * n)


def build_peers(rule: str, s: Setting, pparams: dict[str, Any]) -> list[Peer]:
    """The peer implementations of ``rule``, configured like the Phalanx rule (``pparams``: its ``params()``)."""
    n, d, f = s.n, s.d, s.f
    peers: list[Peer] = byzpy_peers(rule, s, pparams)
    try:
        bz = load_byzfl()
    except Exception as exc:
        bz = exc
    try:
        from flwr.server.strategy import aggregate as legacy
        from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
        from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
        from flwr.serverapp.strategy.multikrum import select_multikrum
        from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
        fl: Any = True
    except Exception as exc:
        fl = exc

    def unavailable(column: str, err: BaseException) -> Peer:
        return Peer(column=column, timed="-", prepare=lambda: None, call=lambda v: None,
                    skip=f"not installed ({type(err).__name__})")

    def has_bz() -> bool:
        if isinstance(bz, BaseException):
            peers.append(unavailable(BYZFL, bz))
            return False
        return True

    def has_fl() -> bool:
        if isinstance(fl, BaseException):
            peers.append(unavailable(FLOWER_LEGACY, fl))
            peers.append(unavailable(FLOWER_MSG, fl))
            return False
        return True

    def msg_mean(sel: list[Any]) -> np.ndarray:
        return aggregate_arrayrecords(sel, "num-examples")["w"].numpy()

    legacy_prep = s.legacy_results
    msg_prep = s.msg_contents

    if rule == "mean":
        if has_bz():
            peers.append(_byzfl(s, "byzfl.Average()(x)", lambda: bz.Average()))
        if has_fl():
            peers.append(Peer(FLOWER_LEGACY, "aggregate(results) (FedAvg, weights 1)", legacy_prep, legacy.aggregate))
            peers.append(Peer(FLOWER_MSG, "aggregate_arrayrecords(contents, 'num-examples') (FedAvg)", msg_prep,
                              msg_mean))
    elif rule == "cwmed":
        if has_bz():
            peers.append(_byzfl(s, "byzfl.Median()(x) (torch.quantile q=0.5; numpy: np.median)", lambda: bz.Median()))
        if has_fl():
            peers.append(Peer(FLOWER_LEGACY, "aggregate_median(results)", legacy_prep, legacy.aggregate_median))
            peers.append(Peer(
                FLOWER_MSG, "np.median(stacked, axis=0): FedMedian.aggregate_train's inline math (no helper)",
                lambda: s.x_np, lambda a: np.median(a, axis=0),
            ))
    elif rule == "cwtm":
        beta, cut = _flower_trim_beta(n, f)
        note = f"Flower beta={beta:.6g}: cuts int(beta*n)={cut} per side (f={f})"
        if has_bz():
            peers.append(_byzfl(s, f"byzfl.TrMean(f={f})(x) (torch.sort)", lambda: bz.TrMean(f=f)))
        if has_fl():
            peers.append(Peer(FLOWER_LEGACY, f"aggregate_trimmed_avg(results, proportiontocut={beta:.6g})",
                              legacy_prep, lambda r: legacy.aggregate_trimmed_avg(r, beta), notes=[note]))
            peers.append(Peer(FLOWER_MSG, f"fedtrimmedavg.trim_mean(stacked, {beta:.6g}) (np.partition)",
                              lambda: s.x_np, lambda a: trim_mean(a, beta), notes=[note]))
    elif rule == "meamed":
        if has_bz():
            peers.append(_byzfl(s, f"byzfl.Meamed(f={f})(x)", lambda: bz.Meamed(f=f)))
    elif rule == "krum":
        if has_bz():
            peers.append(_byzfl(
                s, f"byzfl.Krum(f={f})(x)", lambda: bz.Krum(f=f),
                known="ByzFL Krum scores each row by its n−f−1 nearest neighbours (Blanchard et al.: n−f−2), so it "
                      "may choose another row",
            ))
        if has_fl():
            peers.append(Peer(FLOWER_LEGACY, f"aggregate_krum(results, {f}, to_keep=0)", legacy_prep,
                              lambda r: legacy.aggregate_krum(r, f, 0)))
            peers.append(Peer(FLOWER_MSG, f"select_multikrum(contents, {f}, 1) + aggregate_arrayrecords", msg_prep,
                              lambda c: msg_mean(select_multikrum(c, f, 1))))
    elif rule == "multikrum":
        m = int(pparams.get("m") or (n - f))
        if has_bz():
            peers.append(_byzfl(
                s, f"byzfl.MultiKrum(f={f})(x) (averages n−f={n - f})", lambda: bz.MultiKrum(f=f),
                known="ByzFL MultiKrum scores with n−f−1 neighbours (paper: n−f−2) and always averages n−f rows"
                      + ("" if m == n - f else f" (Phalanx m={m})"),
            ))
        if has_fl():
            peers.append(Peer(FLOWER_LEGACY, f"aggregate_krum(results, {f}, to_keep={m})", legacy_prep,
                              lambda r: legacy.aggregate_krum(r, f, m)))
            peers.append(Peer(FLOWER_MSG, f"select_multikrum(contents, {f}, {m}) + aggregate_arrayrecords",
                              msg_prep, lambda c: msg_mean(select_multikrum(c, f, m))))
    elif rule == "geomed":
        nu = pparams.get("nu")
        nu = float(nu) if isinstance(nu, (int, float)) and not isinstance(nu, bool) and nu > 0 else 0.1
        if has_bz():
            peers.append(_byzfl(
                s, f"byzfl.GeometricMedian(nu={nu}, T=3)(x) (default T)", lambda: bz.GeometricMedian(nu=nu, T=3),
                variant="T=3", approx=True,
                known="ByzFL GeometricMedian's default T=3 Weiszfeld steps from 0 are not converged",
            ))
            peers.append(_byzfl(
                s, f"byzfl.GeometricMedian(nu={nu}, T=100)(x)", lambda: bz.GeometricMedian(nu=nu, T=100),
                variant="T=100",
                known="fixed T=100 smoothed-Weiszfeld steps vs Phalanx's own stopping rule",
            ))
    elif rule == "mda":
        if has_bz():
            subsets = math.comb(n, f)
            p = _byzfl(s, f"byzfl.MDA(f={f})(x) (enumerates C(n,f) subsets)", lambda: bz.MDA(f=f))
            if subsets > MDA_LIMIT:
                p.skip = f"infeasible (C({n},{f})={subsets:.3g})"
            peers.append(p)
    elif rule == "bulyan":
        if has_fl():
            theta = n - 2 * f
            beta = theta - 2 * f

            def msg_bulyan(c: list[Any]) -> np.ndarray:
                sel = select_multikrum(c, f, theta)
                arrays = [rec["arrays"].to_numpy_ndarrays() for rec in sel]
                med = [np.median(a, axis=0) for a in zip(*arrays)]
                return aggregate_n_closest_weights(med, arrays, beta)[0]

            peers.append(Peer(
                FLOWER_LEGACY, f"aggregate_bulyan(results, {f}, aggregate_krum, to_keep=0)",
                legacy_prep, lambda r: legacy.aggregate_bulyan(r, f, legacy.aggregate_krum, to_keep=0),
                fresh=lambda r: list(r),  # it pops the selected clients from the list it is given
            ))
            peers.append(Peer(
                FLOWER_MSG,
                f"Bulyan.aggregate_train's math: select_multikrum(contents, {f}, θ={theta}) + np.median + "
                f"aggregate_n_closest_weights(β={beta})",
                msg_prep, msg_bulyan,
                known="Flower's Message-API Bulyan selects its θ rows in one Multi-Krum pass; El Mhamdi et al. "
                      "select them by θ successive Krum rounds on the remaining rows",
            ))
    elif rule == "cc":
        tau = float(pparams.get("tau", 100.0))
        iters = int(pparams.get("iterations", 1))
        if has_bz():
            peers.append(_byzfl(
                s, f"byzfl.CenteredClipping(L={iters}, tau={tau:.6g})(x), fresh object per call (centre 0)",
                lambda: bz.CenteredClipping(L=iters, tau=tau),
            ))
    elif rule == "nnm>mean":
        if has_bz():
            need = n * (n - f) * d * 4
            p = _byzfl(s, f"byzfl.NNM(f={f})(x) then byzfl.Average() (NNM gathers an (n, n−f, d) tensor)",
                       lambda: bz.NNM(f=f), then=lambda y: bz.Average()(y))
            avail = _mem_available()
            if avail is not None and need > 0.6 * avail:
                p.skip = f"skipped: NNM allocates {need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB free"
            peers.append(p)
    elif rule == "bucketing":
        sz = int(pparams.get("s", 2))
        if has_bz():
            peers.append(_byzfl(
                s, f"byzfl.Bucketing(s={sz})(x)", lambda: bz.Bucketing(s=sz), compare="rowmean",
                known="random permutation: only the mean over buckets can agree",
            ))
    elif rule in ("clip", INPLACE.format("clip")):
        thr = next((float(pparams[k]) for k in ("threshold", "c", "tau", "max_norm") if k in pparams), None)
        if has_bz():
            c = thr if thr is not None else 2.0
            peers.append(_byzfl_in_place(s, f"byzfl.Clipping(c={c:.6g})", lambda: bz.Clipping(c=c),
                                         copy=rule == "clip"))
    elif rule in ("arc", INPLACE.format("arc")):
        if has_bz():
            peers.append(_byzfl_in_place(s, f"byzfl.ARC(f={f})", lambda: bz.ARC(f=f), copy=rule == "arc"))
    elif rule == "monna":
        idx = int(pparams.get("idx", 0))
        if has_bz():
            peers.append(_byzfl(s, f"byzfl.MoNNA(f={f}, idx={idx})(x)", lambda: bz.MoNNA(f=f, idx=idx)))
    elif rule == "caf":
        if has_bz():
            peers.append(_byzfl(s, f"byzfl.CAF(f={f})(x)", lambda: bz.CAF(f=f),
                                known="ByzFL's CAF takes one power-iteration step from a random start (Phalanx: the "
                                      "exact eigenpair) and its τ_max over all rows (Phalanx: the rows still "
                                      "weighted)"))
    elif rule == "smea":
        if has_bz():
            subsets = math.comb(n, f)
            p = _byzfl(s, f"byzfl.SMEA(f={f})(x) (enumerates C(n,f) subsets)", lambda: bz.SMEA(f=f),
                       known="ByzFL's SMEA scores each subset by one power-iteration step from a random start "
                             "(Phalanx: the exact top eigenvalue), so its choice of subset is random where d > 1")
            if subsets > MDA_LIMIT:
                p.skip = f"infeasible (C({n},{f})={subsets:.3g})"
            peers.append(p)
    return peers


def _mem_available() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
