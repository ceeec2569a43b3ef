"""Coordinate-wise rules: median, trimmed mean and MeaMed.

All three sort each coordinate's ``n`` values and average a window of the sorted values (see
:mod:`phalanx.aggregators._sortnet`). On CPU with float32/float64 the C sorting-network kernel (``_cwkernel.c``)
does it; on other devices or dtypes a ``torch.sort`` along dim 0 gives the same result. For float32 with many rows the
median, the trimmed mean and MeaMed select their window instead of sorting (``_cwselect.c``, issue 37), with the same
bits: columns that selection cannot prove equal are handed to the network.
"""

from __future__ import annotations

import functools
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from phalanx.aggregators import _sortnet
from phalanx.aggregators._rowops import kernel_readable
from phalanx.aggregators._teams import team_threads
from phalanx.aggregators.base import Aggregator, as_compute_dtype
from phalanx.aggregators.registry import register
from phalanx.errors import ConfigError

Mode = Literal["trimmed", "median", "meamed"]
_MODES: dict[str, int] = {
    "trimmed": _sortnet.MODE_TRIMMED, "median": _sortnet.MODE_MEDIAN, "meamed": _sortnet.MODE_MEAMED,
}

__all__ = ["CoordinateWiseMedian", "CoordinateWiseTrimmedMean", "MeaMed", "coordinate_window_mean"]


try:  # the optional C kernel (setup.py); without it the torch.sort path gives the same values on the CPU, slower.
    from phalanx.aggregators import _cwkernel  # type: ignore[attr-defined]

    HAVE_KERNEL = os.environ.get("PHALANX_NO_KERNEL", "") == ""
    # Built with OpenMP (setup.py), the kernel splits the columns over torch's own intra-op thread team.
    _KERNEL_ONE_CALL = hasattr(_cwkernel, "window_parallel")
    _KERNEL_OPENMP = _KERNEL_ONE_CALL and bool(_cwkernel.has_openmp())
except ImportError:  # pragma: no cover - exercised only where the extension could not be built
    _cwkernel = None
    HAVE_KERNEL = _KERNEL_ONE_CALL = _KERNEL_OPENMP = False

try:  # selection for the median, the trimmed mean and MeaMed of float32 columns (setup.py; x86-64 with AVX2)
    from phalanx.aggregators import _cwselect  # type: ignore[attr-defined]

    HAVE_SELECT = HAVE_KERNEL and bool(_cwselect.available())
except ImportError:  # pragma: no cover - exercised only where the extension could not be built
    _cwselect = None
    HAVE_SELECT = False

_BLOCK = 128  # columns per block in the C kernel; thread chunks are multiples of it
# Rows from which selection beats the network (float32, 1 thread, benchmarks/cw_select.py: at n = 500 the network
# is faster for the trimmed mean and MeaMed -- 512 rows suit Batcher's network --, from 600 on selection for all
# three; docs/benchmarks.md "Selection at large n" and "MeaMed by selection").
SELECT_MIN_ROWS = 600
_GATHER_FLOATS = 1 << 22  # flagged columns are copied for the network at most this many values at a time (16 MB)
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="phalanx-cw")
    return _POOL


@functools.lru_cache(maxsize=1)
def _load_sort_nets() -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """The networks the kernel runs on groups of rows as it loads them, ``(rows, pairs)`` for 128, 64, 32, 16 and 8
    rows (its plan arguments' order, ``_cwkernel.load_sort_sizes``); fewer, or none, in older builds."""
    return _sortnet.load_sort_nets(_cwkernel)


@functools.lru_cache(maxsize=64)
def _program(n: int, window: tuple[int, int] | None, tile: int) -> tuple[tuple[int, ...], Tensor]:
    """:func:`_sortnet.kernel_program` for this build's load sorts, cached on small keys: its own cache's key holds
    the load sorts' 2,287 pairs, which a tuple hashes anew on every call (about 70 µs a call, an attacker's review
    measured; a pass over n = 16, d = 65,536 takes 0.17 ms)."""
    return _sortnet.kernel_program(n, window, tile, _load_sort_nets())


def _use_kernel(x: Tensor) -> bool:
    return (
        HAVE_KERNEL and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.shape[0] > 1
        and kernel_readable(x)  # a negative-bit view (``z.conj().imag``) reads negated memory: torch's path
    )


def _team(n: int, d: int) -> int:
    """Threads for a call over ``d`` columns of ``n`` rows: torch's from its grain on, at most one per block."""
    return max(1, min(team_threads(n * d), (d + _BLOCK - 1) // _BLOCK))


def _column_ranges(d: int, threads: int) -> list[tuple[int, int]]:
    """``d`` columns cut into ``threads`` ranges of whole blocks (the last one shorter)."""
    chunk = ((d + threads - 1) // threads + _BLOCK - 1) // _BLOCK * _BLOCK
    return [(s, min(d, s + chunk)) for s in range(0, d, chunk)]


def _use_select(x: Tensor, mode: int, length: int, want: bool) -> bool:
    """Selection for the float32 median and MeaMed (n > 2 trim), and the trimmed mean whose window is at least a quarter
    of the rows (shorter windows' two rank brackets would always meet, leaving every column to whole-column
    quickselect), from
    :data:`SELECT_MIN_ROWS` rows (and 64, the kernel's sample); contributions need the sorted order."""
    n = x.shape[0]
    return (
        HAVE_SELECT and not want and x.dtype == torch.float32 and max(SELECT_MIN_ROWS, 64) <= n <= 2**24
        and (
            mode == _sortnet.MODE_MEDIAN
            or (mode == _sortnet.MODE_TRIMMED and 4 * length >= n)
            or (mode == _sortnet.MODE_MEAMED and 2 * (n - length) <= n - 1)
        )
    )


def _flagged_runs(flags: Tensor) -> tuple[list[tuple[int, int]], Tensor]:
    """The flagged columns split into runs of at least :data:`_BLOCK` consecutive columns ``[(start, end), ...]``
    (the network recomputes them in place) and the other flagged columns' indices (gathered: the network pads a
    range to its block, so scattered columns in place would cost it whole blocks)."""
    idx = flags.nonzero().flatten()
    if idx.numel() == 0:
        return [], idx
    starts = torch.ones(idx.numel(), dtype=torch.bool)
    starts[1:] = idx[1:] != idx[:-1] + 1
    run = starts.cumsum(0) - 1
    length = torch.bincount(run)[run]  # each flagged column's run length
    long = length >= _BLOCK
    first = starts & long
    return list(zip(idx[first].tolist(), (idx[first] + length[first]).tolist())), idx[~long]


def _network_in_place(x: Tensor, mode: int, trim: int, length: int, runs: list[tuple[int, int]], out: Tensor) -> None:
    """The network on column ranges of ``x``, written into ``out`` (long ranges cut for the threads)."""
    n, d = x.shape
    load, pairs = _program(n, _sortnet.network_window(n, mode, trim, length), int(_cwkernel.tile_rows(n, False)))
    total = sum(j1 - j0 for j0, j1 in runs)
    threads = team_threads(n * total)
    cut = max(_BLOCK, (total + threads - 1) // threads)
    pieces = [(s, min(j1, s + cut)) for j0, j1 in runs for s in range(j0, j1, cut)]

    def work(k: int) -> None:
        j0, j1 = pieces[k]
        _cwkernel.window(
            x.data_ptr(), n, d, j0, j1, pairs.data_ptr(), pairs.shape[0], mode, trim, length, out.data_ptr(), 0,
            False, *load,
        )

    list(_pool().map(work, range(len(pieces))))


def _network_on_flagged(x: Tensor, mode: int, trim: int, length: int, flags: Tensor, out: Tensor) -> None:
    """The network on the columns selection flagged: long runs in place, the rest gathered :data:`_GATHER_FLOATS`
    values at a time (the extra memory is bounded whatever an attacker flags)."""
    runs, scattered = _flagged_runs(flags)
    if runs:
        _network_in_place(x, mode, trim, length, runs, out)
    step = max(_BLOCK, _GATHER_FLOATS // x.shape[0])
    for s in range(0, scattered.numel(), step):
        cols = scattered[s : s + step]
        out[cols] = _cw_kernel(x.index_select(1, cols), mode, trim, False, select=False)[0]


def _cw_select(x: Tensor, mode: int, trim: int, length: int) -> Tensor:
    """Selection over column ranges in parallel threads (GIL released inside), then the network on the columns it
    flagged (a sum it cannot prove equal to the network's, a zero median among zeros of both signs, a quickselect
    that gave up, a block in back-off): the same bits. A fresh seed per call draws the sampled rows and the pivots,
    so rows cannot be crafted against them; the values do not depend on it."""
    n, d = x.shape
    out = torch.empty(d, dtype=x.dtype)
    flags = torch.zeros(d, dtype=torch.uint8)
    seed = secrets.randbits(64)
    ranges = _column_ranges(d, _team(n, d))

    def work(k: int) -> None:
        j0, j1 = ranges[k]
        _cwselect.select(x.data_ptr(), n, d, j0, j1, mode, trim, length, out.data_ptr(), flags.data_ptr(), seed)

    if len(ranges) == 1:
        work(0)
    else:
        list(_pool().map(work, range(len(ranges))))
    if bool(flags.any()):
        _network_on_flagged(x, mode, trim, length, flags, out)
    return out


def _cw_kernel(x: Tensor, mode: int, trim: int, want: bool, select: bool = True) -> tuple[Tensor, Tensor | None]:
    """Run the C kernel over column ranges in parallel threads (GIL released inside)."""
    x = x.contiguous()
    n, d = x.shape
    trim_, length = _sortnet.window_params(n, mode, trim)
    if d == 0:
        return torch.empty(0, dtype=x.dtype), (torch.zeros(n, dtype=torch.float64) if want else None)
    if select and _use_select(x, mode, length, want):
        return _cw_select(x, mode, trim_, length), None
    is_double = x.dtype == torch.float64
    # the order of the compare-exchanges for the kernel's L1 tiles (the same values: _sortnet.cache_order)
    tile = int(_cwkernel.tile_rows(n, is_double)) if hasattr(_cwkernel, "tile_rows") else 0
    # the median reads one or two positions: the pruned network; the trimmed mean and MeaMed add their window in
    # sorted order, and contributions read every position: the whole network (_sortnet.network_window)
    window = None if want else _sortnet.network_window(n, mode, trim_, length)
    # leading groups of rows sorted as the kernel loads them, the rest of the network after (same values)
    load, pairs = _program(n, window, tile)
    out = torch.empty(d, dtype=x.dtype)
    threads = _team(n, d)  # no team below torch's grain
    if _KERNEL_ONE_CALL and (_KERNEL_OPENMP or threads == 1):
        # one call; with OpenMP the columns are cut into `threads` fixed chunks shared out over torch's own thread
        # team inside the kernel: the result does not depend on how many threads the team actually has
        contrib = torch.zeros((threads, n), dtype=torch.float64) if want else None
        _cwkernel.window_parallel(
            x.data_ptr(), n, d, pairs.data_ptr(), pairs.shape[0], mode, trim_, length, out.data_ptr(),
            contrib.data_ptr() if contrib is not None else 0, is_double, threads, *load,
        )
        return out, (contrib.sum(dim=0) / d if contrib is not None else None)
    # no OpenMP in the build: split the columns between Python threads (the GIL is released inside)
    ranges = _column_ranges(d, threads)
    contrib = torch.zeros((len(ranges), n), dtype=torch.float64) if want else None

    def work(k: int) -> None:
        j0, j1 = ranges[k]
        cptr = contrib[k].data_ptr() if contrib is not None else 0
        _cwkernel.window(
            x.data_ptr(), n, d, j0, j1, pairs.data_ptr(), pairs.shape[0], mode, trim_, length, out.data_ptr(),
            cptr, is_double, *load,
        )

    list(_pool().map(work, range(len(ranges))))
    return out, (contrib.sum(dim=0) / d if contrib is not None else None)


def _median_of_sorted(xs: Tensor) -> Tensor:
    """The median of sorted columns as the kernel computes it, float64 ``(d,)``: the halves of the two middle values
    (the one middle value twice for odd n) added in float64."""
    n = xs.shape[0]
    return 0.5 * xs[(n - 1) // 2].double() + 0.5 * xs[n // 2].double()


def _window_start_torch(xs: Tensor, mode: int, trim: int, length: int) -> Tensor:
    n, d = xs.shape
    if mode == _sortnet.MODE_TRIMMED:
        return torch.full((d,), trim, dtype=torch.long, device=xs.device)
    if mode == _sortnet.MODE_MEDIAN:
        return torch.full((d,), (n - 1) // 2, dtype=torch.long, device=xs.device)
    # MeaMed: of the trim + 1 windows of `length` sorted values, the one whose farthest value from the median is
    # nearest — the C kernel's rule (window_starts_), infinities included: the median's halves added in float64,
    # cost = a > b ? a : b (NaN, from inf − inf, compares false), and a window replaces the best so far only on a
    # strictly smaller cost, the best starting at +inf. So the start is the first window of least cost among the
    # costs that are not NaN, and 0 when that least cost is +inf (no window ever replaced the first).
    med = _median_of_sorted(xs).to(xs.dtype)
    a, b = med[None] - xs[: trim + 1], xs[length - 1 : length + trim] - med[None]
    cost = torch.where(a > b, a, b)
    key = torch.where(cost.isnan(), torch.full_like(cost, float("inf")), cost)
    least, first = key.min(dim=0)  # the first index of the least value (torch.min's ties: the first)
    return torch.where(least == float("inf"), torch.zeros_like(first), first)


def _window_mean_torch(xs: Tensor, mode: int, start: Tensor, length: int) -> Tensor:
    """The kernel's ``finish_`` on sorted columns, float64 ``(d,)``: the median's halves added in float64, or the
    window's values added one sorted position after another from +0.0 and multiplied by ``1/length`` — on the CPU
    the same additions in the same order as the kernel, bit for bit (a cascade sum cancels −3e38 and 3e38 before it
    adds 1 and 2.5, where the kernel's sequential sum has lost them: ``tests/test_cw_fallback.py``)."""
    if mode == _sortnet.MODE_MEDIAN:
        return _median_of_sorted(xs)
    if xs.device.type != "cpu":  # on a device, one gather and one reduction (a cascade: last bits may differ)
        rows = start[None, :] + torch.arange(length, device=xs.device)[:, None]
        return xs.gather(0, rows).sum(dim=0, dtype=torch.float64) * (1.0 / length)
    acc = torch.zeros(xs.shape[1], dtype=torch.float64)
    for r in range(length):
        acc += xs.gather(0, (start + r)[None])[0]
    return acc * (1.0 / length)


def _cw_torch(x: Tensor, mode: int, trim: int, want: bool) -> tuple[Tensor, Tensor | None]:
    """Reference implementation with ``torch.sort`` along dim 0 (any device)."""
    n, d = x.shape
    trim_, length = _sortnet.window_params(n, mode, trim)
    clean = torch.where(torch.isnan(x), torch.full((), float("inf"), dtype=x.dtype, device=x.device), x)
    xs, order = torch.sort(clean, dim=0, stable=True)
    start = _window_start_torch(xs, mode, trim_, length)
    out = _window_mean_torch(xs, mode, start, length).to(x.dtype)
    if not want:
        return out, None
    # Weight of each sorted slot: 1/length inside the window; ties share their slots' weights equally.
    pos = torch.arange(n, device=x.device)[:, None]
    slot_w = ((pos >= start[None]) & (pos < start[None] + length)).to(torch.float64) / length
    new_group = torch.ones_like(xs, dtype=torch.long)
    new_group[1:] = (xs[1:] != xs[:-1]).long()
    gid = new_group.cumsum(dim=0) - 1
    sums = torch.zeros_like(slot_w).scatter_add_(0, gid, slot_w)
    counts = torch.zeros_like(slot_w).scatter_add_(0, gid, torch.ones_like(slot_w))
    shared = (sums / counts.clamp_min(1)).gather(0, gid)
    per_row = torch.zeros_like(shared).scatter_add_(0, order, shared)
    if d == 0:  # no coordinates: no share for anyone, as the kernel answers (not 0 / 0)
        return out, torch.zeros(n, dtype=torch.float64, device=x.device)
    return out, per_row.sum(dim=1) / d


def coordinate_window_mean(x: Tensor, mode: Mode, trim: int, want_contributions: bool) -> tuple[Tensor, Tensor | None]:
    """Per coordinate, sort the ``n`` values and average a window of them.

    ``mode="trimmed"``: drop the ``trim`` smallest and ``trim`` largest, average the rest.
    ``mode="median"``: the middle value (odd n) or the mean of the two middle values (even n); ``trim`` ignored.
    ``mode="meamed"``: average the ``n − trim`` values closest to the median.
    NaN counts as +∞. Returns ``(out (d,), contributions (n,) float64 or None)``; ``x`` is not modified.
    """
    if mode not in _MODES:
        raise ConfigError("mode", mode, "'trimmed', 'median' or 'meamed'")
    code = _MODES[mode]
    compute = as_compute_dtype(x.detach())
    if _use_kernel(compute):
        out, contrib = _cw_kernel(compute, code, trim, want_contributions)
    else:
        out, contrib = _cw_torch(compute, code, trim, want_contributions)
    return out.to(x.dtype), contrib


def trimmed_mean_epsilon(n: int, f: int) -> float:
    """ε of the f-trimmed mean, ``f/(n − f)`` (Yang, Shi & Li, ICML 2025; tight)."""
    return f / (n - f)


@register
class CoordinateWiseTrimmedMean(Aggregator):
    r"""Coordinate-wise trimmed mean, ``cwtm``.

    For each coordinate k, sort :math:`x_{1k},\dots,x_{nk}`, drop the f smallest and the f largest and average the
    remaining n − 2f: :math:`\mathrm{TM}_f(x)_k = \frac{1}{n-2f}\sum_{i=f+1}^{n-f} x_{(i)k}`.

    Reference: Yin, Chen, Ramchandran, Bartlett, "Byzantine-robust distributed learning: towards optimal statistical
    rates", ICML 2018, Definition 2 (trimmed mean). Requirement n > 2f. With f = 0 it is the mean.

    No-attack error ε = f/(n − f), tight (Yang, Shi & Li, ICML 2025: the worst input has, per coordinate, f equal
    values and n − f other equal values). κ = (6f/(n−2f))·(1 + f/(n−2f)) (Allouah et al., AISTATS 2023,
    Proposition 2 / Table 1).
    """

    name: ClassVar[str] = "cwtm"
    reference: ClassVar[str] = (
        "Yin, Chen, Ramchandran & Bartlett, Byzantine-robust distributed learning: towards optimal statistical "
        "rates, ICML 2018 (Definition 2)"
    )
    requirement = "n > 2f"
    epsilon_source = ("Yang, Shi & Li, ICML 2025, Theorem 3.6 (TM is f/(n−f)-accurate for f < n/2; tight: f equal "
                      "values and n − f other equal values per coordinate, Section 3.4, Table 2)")
    kappa_source = "Allouah, Farhadkhani, Guerraoui, Gupta, Pinot & Stephan, Fixing by Mixing, AISTATS 2023, Table 1"

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        return coordinate_window_mean(x, "trimmed", self.f, want_contributions)

    def epsilon(self, n: int) -> float | None:
        return trimmed_mean_epsilon(n, self.f) if n > 2 * self.f else None

    def kappa(self, n: int) -> float | None:
        if n <= 2 * self.f:
            return None
        r = self.f / (n - 2 * self.f)
        return 6.0 * r * (1.0 + r)


@register
class CoordinateWiseMedian(Aggregator):
    r"""Coordinate-wise median, ``cwmed``.

    :math:`\mathrm{Med}(x)_k = \mathrm{median}(x_{1k},\dots,x_{nk})`; for even n the midpoint of the two middle
    values (as every peer library does).

    Reference: Yin, Chen, Ramchandran, Bartlett, ICML 2018, Definition 1 (coordinate-wise median).
    Requirement n > 2f (the median tolerates up to ⌈n/2⌉ − 1 Byzantine rows whatever f is configured).

    No-attack error ε = ⌊(n−1)/2⌋ / (n − ⌊(n−1)/2⌋) — the median is the trimmed mean with the largest trim
    (Yang, Shi & Li, ICML 2025). κ = 4(1 + f/(n−2f))² (Allouah et al., AISTATS 2023, Table 1).
    """

    name: ClassVar[str] = "cwmed"
    reference: ClassVar[str] = (
        "Yin, Chen, Ramchandran & Bartlett, Byzantine-robust distributed learning: towards optimal statistical "
        "rates, ICML 2018 (Definition 1)"
    )
    requirement = "n > 2f"
    epsilon_source = ("Yang, Shi & Li, ICML 2025, Table 2 (the median is the trimmed mean with f = ⌊(n−1)/2⌋, "
                      "Theorem 3.6; tight)")
    kappa_source = "Allouah, Farhadkhani, Guerraoui, Gupta, Pinot & Stephan, Fixing by Mixing, AISTATS 2023, Table 1"

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        return coordinate_window_mean(x, "median", 0, want_contributions)

    def epsilon(self, n: int) -> float | None:
        return trimmed_mean_epsilon(n, (n - 1) // 2) if n >= self.min_workers() else None  # (undefined below it)

    def kappa(self, n: int) -> float | None:
        if n <= 2 * self.f:
            return None
        return 4.0 * (1.0 + self.f / (n - 2 * self.f)) ** 2


@register
class MeaMed(Aggregator):
    r"""Mean around the median, ``meamed``.

    For each coordinate k, the mean of the n − f values closest to the coordinate's median:
    :math:`\mathrm{MeaMed}(x)_k = \frac{1}{n-f}\sum_{i \in N_k} x_{ik}`, where :math:`N_k` holds the n − f indices
    with the smallest :math:`|x_{ik} - \mathrm{med}_k|`.

    Reference: Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD", arXiv:1802.10116 (2018), Definition 5
    (mean-around-median). Requirement n > 2f. ε and κ: not given in the literature (``None``).

    With at most f Byzantine values per coordinate the output is finite, but unlike the median and the trimmed
    mean it can leave the honest values' range (by less than its width): a Byzantine value near the median is
    kept. Honest {1, 2} and a Byzantine 0 (n = 3, f = 1) give 0.5.
    """

    name: ClassVar[str] = "meamed"
    reference: ClassVar[str] = (
        "Xie, Koyejo & Gupta, Generalized Byzantine-tolerant SGD, arXiv:1802.10116, 2018 (Definition 5)"
    )
    requirement = "n > 2f"

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        return coordinate_window_mean(x, "meamed", self.f, want_contributions)
